"""Client-side defenses, as a declarative spec plus pure pytree transforms.

A :class:`Defense` says what a client does to protect what it sends; the
client computations in :mod:`leakjax.fl.client` apply it, so every defense
works the same way for FedSGD (:func:`~leakjax.fl.client_gradient`) and
FedAvg (:func:`~leakjax.fl.client_update`). Defenses combine with
:func:`combine` (or `|`):

>>> d = freeze_embeddings(model) | gradient_pruning(0.9)     # doctest: +SKIP

Where each one acts, in the order applied:

1. At every local step, on the gradient of the trainable parameters:
   - `frozen` (FILM Sec. 5): frozen parameters get no gradient, no optimizer
     state and no update; the transmitted gradient/update is exactly zero on
     them (same pytree structure, so servers can still average).
   - DP-SGD (Abadi et al. 2016; FILM Table 4b): per-example gradients (vmap),
     each clipped to global L2 norm `clip_norm` C, summed, plus N(0, σ²C²)
     per coordinate, divided by the number of real examples in the batch.
   - "DPSGD-like" local noise (GBoard Algorithm 3): N(0, step_noise_std²)
     added to the step's gradient, no clipping. With SGD this is exactly
     θ ← θ − η∇ℓ + η·N(0, σ) of Algorithm 3 (the sign of the noise is
     irrelevant); with another optax optimizer the noise enters through it.
2. Once, on what the client transmits (the gradient g for FedSGD, the
   update Δ = θ1 − θ0 for FedAvg):
   - "single noise" (GBoard Algorithm 4): N(0, update_noise_std²) added once;
     for FedAvg this is θ1 + N(0, σ) exactly.
   - gradient pruning (Zhu et al. 2019; FILM Table 4a): zero the fraction p
     of smallest-magnitude entries. It runs after the noise, so it is
     post-processing and never weakens a DP guarantee.

Noise is never added to frozen parameters: they are not sent at all.

Pruning scope. Zhu et al. "prune gradients with small magnitudes to zero"
without fixing the set over which magnitudes are ranked. `scope='tensor'`
(default) ranks entries within each parameter tensor and keeps each
tensor's top (1 − p) fraction, like the layer-wise thresholds of gradient
sparsification (Deep Gradient Compression, Lin et al. 2018); it keeps
tensors with small gradients (LayerNorm, biases) from being wiped out
wholesale by large ones. `scope='global'` ranks all
transmitted entries together. Either way exactly `floor(p * n + 1/2)`
entries are zeroed (ties broken by position), n counting the entries of
the tensor (or of all trainable tensors).

Frozen embeddings and tied heads. GPT-2 (and GBoard's CIFG-LSTM) tie the
output projection to the word-embedding matrix W. :func:`freeze_embeddings`
freezes the shared matrix for both of its uses, as freezing the one shared
weight does in PyTorch/HF. Freezing only the input lookup would still train
and transmit W through the head, and the head's gradient rows for the
tokens of the batch stand out (its target-token rows get the −h pull; the
GBoard attack reads words from exactly this output-layer signal), so the
bag of words would leak again. With the shared matrix frozen, the
transmitted update has no embedding rows at all: FILM Sec. 5's point,
"once we prevent the transmission of gradients of word embeddings ... it is
no longer possible to recover the bag-of-words". For an untied head
(`Model.paths.lm_head` set, e.g. Llama) FILM's defense freezes only the
input embeddings; pass `head=True` to also freeze the head (and output
bias), which the GBoard attack would otherwise read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, ParamPath

PyTree = Any

PRUNE_SCOPES = ('tensor', 'global')


@dataclasses.dataclass(frozen=True)
class Defense:
  """What a client does to protect what it sends; `Defense()` does nothing.

  Build one with :func:`freeze_embeddings`, :func:`dp_sgd`,
  :func:`dpsgd_like_noise`, :func:`single_noise`, :func:`gradient_pruning`
  and :func:`combine`. Hashable, so it can be a static jit argument.

  Attributes:
    frozen: parameter paths (prefixes of dict keys into `params`) that are
      not trained and not sent (FILM Sec. 5).
    clip_norm: DP-SGD per-example L2 clip C; None disables DP-SGD.
    noise_multiplier: DP-SGD σ; N(0, σ²C²) is added to the clipped sum.
    dp_microbatch: compute per-example gradients this many examples at a
      time (bounds memory to microbatch × params); None: the whole batch.
    step_noise_std: std of the noise added to every local step's gradient
      (GBoard Algorithm 3, "DPSGD-like").
    update_noise_std: std of the noise added once to what is transmitted
      (GBoard Algorithm 4, "single noise").
    prune_fraction: fraction p of smallest-magnitude transmitted entries set
      to zero (Zhu et al. 2019).
    prune_scope: 'tensor' (per parameter tensor) or 'global'.
  """

  frozen: tuple[ParamPath, ...] = ()
  clip_norm: float | None = None
  noise_multiplier: float = 0.0
  dp_microbatch: int | None = None
  step_noise_std: float = 0.0
  update_noise_std: float = 0.0
  prune_fraction: float = 0.0
  prune_scope: str = 'tensor'

  def __post_init__(self):
    object.__setattr__(self, 'frozen', tuple(tuple(p) for p in self.frozen))
    if self.clip_norm is not None and not self.clip_norm > 0:
      raise LeakjaxError(
        f'DP-SGD clip_norm must be > 0, got {self.clip_norm}',
        'pass a positive clipping norm C',
      )
    for name in ('noise_multiplier', 'step_noise_std', 'update_noise_std'):
      value = getattr(self, name)
      if not (value >= 0 and math.isfinite(value)):
        raise LeakjaxError(
          f'{name} must be finite and >= 0, got {value}',
          'pass a non-negative noise scale',
        )
    if self.noise_multiplier > 0 and self.clip_norm is None:
      raise LeakjaxError(
        'noise_multiplier is set but clip_norm is not',
        'build DP-SGD with dp_sgd(clip_norm, sigma)',
      )
    if self.dp_microbatch is not None and self.dp_microbatch < 1:
      raise LeakjaxError(
        f'dp_microbatch must be >= 1, got {self.dp_microbatch}',
        'pass None or a positive int',
      )
    if not 0.0 <= self.prune_fraction < 1.0:
      raise LeakjaxError(
        f'prune_fraction must be in [0, 1), got {self.prune_fraction}',
        'pass the fraction of entries to zero, e.g. 0.99',
      )
    if self.prune_scope not in PRUNE_SCOPES:
      raise LeakjaxError(
        f'prune_scope {self.prune_scope!r} is not one of {PRUNE_SCOPES}',
        "use 'tensor' or 'global'",
      )

  @property
  def uses_dp_sgd(self) -> bool:
    return self.clip_norm is not None

  @property
  def needs_key(self) -> bool:
    """Whether applying this defense draws random numbers."""
    return (
      self.noise_multiplier > 0
      or self.step_noise_std > 0
      or self.update_noise_std > 0
    )

  def __or__(self, other: Defense) -> Defense:
    return combine(self, other)


def combine(*defenses: Defense) -> Defense:
  """Merges defenses; frozen paths are united, other settings may be set once.

  Raises:
    LeakjaxError: if two defenses set the same non-frozen setting.
  """
  default = Defense()
  merged: dict[str, Any] = {}
  frozen: list[ParamPath] = []
  for d in defenses:
    frozen.extend(p for p in d.frozen if p not in frozen)
    for field in dataclasses.fields(Defense):
      if field.name == 'frozen':
        continue
      value = getattr(d, field.name)
      if value == getattr(default, field.name):
        continue
      if field.name in merged and merged[field.name] != value:
        raise LeakjaxError(
          f'two defenses set {field.name} ({merged[field.name]} and {value})',
          'set each defense once',
        )
      merged[field.name] = value
  return Defense(frozen=tuple(frozen), **merged)


# ------------------------------------------------------------ constructors
def freeze_embeddings(
  model: Model, *, positions: bool = False, head: bool = False
) -> Defense:
  """FILM Sec. 5: train without updating the word embeddings.

  With a tied head (`model.paths.lm_head is None`) the shared matrix is
  frozen for both uses, so nothing about it is sent (module docstring).

  Args:
    model: the model whose `paths` name the embedding parameters.
    positions: also freeze learned position embeddings (GPT-2's `wpe`, whose
      gradient rows reveal the longest sentence length, FILM Sec. 4.2).
    head: also freeze an untied LM head and the output bias (read by the
      GBoard attack); no-op for parts the family lacks.

  Returns:
    A Defense with `frozen` set.
  """
  paths = [model.paths.word_embeddings]
  if positions and model.paths.position_embeddings is not None:
    paths.append(model.paths.position_embeddings)
  if head:
    paths.extend(
      p for p in (model.paths.lm_head, model.paths.output_bias) if p is not None
    )
  return Defense(frozen=tuple(paths))


def freeze(*paths: ParamPath) -> Defense:
  """Freezes arbitrary parameter paths (prefixes of dict keys)."""
  return Defense(frozen=tuple(paths))


def dp_sgd(
  clip_norm: float, noise_multiplier: float, *, microbatch: int | None = None
) -> Defense:
  """DP-SGD (Abadi et al. 2016): clip per-example gradients, add N(0, σ²C²).

  Choose `noise_multiplier` for a target ε with
  :func:`leakjax.fl.sigma_for_epsilon`.
  """
  return Defense(
    clip_norm=clip_norm,
    noise_multiplier=noise_multiplier,
    dp_microbatch=microbatch,
  )


def dpsgd_like_noise(std: float) -> Defense:
  """GBoard Algorithm 3: N(0, std²) on every local step's gradient, no clip."""
  return Defense(step_noise_std=std)


def single_noise(std: float) -> Defense:
  """GBoard Algorithm 4: N(0, std²) added once to what the client sends."""
  return Defense(update_noise_std=std)


def gradient_pruning(fraction: float, *, scope: str = 'tensor') -> Defense:
  """Zhu et al. 2019: zero the `fraction` smallest-magnitude sent entries."""
  return Defense(prune_fraction=fraction, prune_scope=scope)


# ------------------------------------------------------- pure transforms
def is_frozen(key_path: Sequence[str], frozen: Sequence[ParamPath]) -> bool:
  """Whether a leaf at dict-key path `key_path` lies under a frozen path."""
  key_path = tuple(key_path)
  return any(key_path[: len(p)] == tuple(p) for p in frozen)


def leaf_key_paths(tree: PyTree) -> list[tuple[str, ...]]:
  """The dict-key path of every leaf of a nested-dict pytree, in leaf order."""
  paths = []
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    paths.append(
      tuple(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)
    )
  return paths


def check_frozen_paths(params: PyTree, frozen: Sequence[ParamPath]) -> None:
  """Raises LeakjaxError if a frozen path names nothing in `params`."""
  leaf_paths = leaf_key_paths(params)
  for p in frozen:
    if not any(lp[: len(p)] == tuple(p) for lp in leaf_paths):
      raise LeakjaxError(
        f'frozen path {"/".join(p)} is not in the model parameters',
        'use paths from Model.paths',
      )


def zero_frozen(tree: PyTree, frozen: Sequence[ParamPath]) -> PyTree:
  """`tree` with every leaf under a frozen path replaced by zeros."""
  leaves, treedef = jax.tree.flatten(tree)
  paths = leaf_key_paths(tree)
  return jax.tree.unflatten(
    treedef,
    [
      jnp.zeros_like(x) if is_frozen(p, frozen) else x
      for p, x in zip(paths, leaves)
    ],
  )


def gaussian_noise_like(tree: PyTree, std, *, key: jax.Array) -> PyTree:
  """Independent N(0, std²) noise with the structure, shapes and dtypes of
  `tree`.

  One normal draw of all entries, split into the leaves: a single PRNG call
  site compiles much faster than one per leaf.
  """
  leaves, treedef = jax.tree.flatten(tree)
  if not leaves:
    return tree
  sizes = [x.size for x in leaves]
  flat = std * jax.random.normal(key, (sum(sizes),), jnp.float32)
  out, start = [], 0
  for x, size in zip(leaves, sizes):
    out.append(flat[start : start + size].reshape(x.shape).astype(x.dtype))
    start += size
  return jax.tree.unflatten(treedef, out)


def global_norms(per_example: PyTree) -> jax.Array:
  """L2 norm over all leaves per example: leaves `[batch, ...]` -> `[batch]`."""
  leaves = jax.tree.leaves(per_example)
  squares = [
    jnp.sum(jnp.square(x.reshape(x.shape[0], -1).astype(jnp.float32)), axis=1)
    for x in leaves
  ]
  return jnp.sqrt(sum(squares))


def clip_per_example(
  per_example: PyTree, clip_norm
) -> tuple[PyTree, jax.Array]:
  """Scales each example's gradient to global L2 norm at most `clip_norm`.

  Args:
    per_example: gradients whose every leaf has a leading batch axis.
    clip_norm: C > 0.

  Returns:
    `(clipped, norms)`: example i is multiplied by min(1, C / ‖g_i‖);
    `norms [batch]` are the norms before clipping.
  """
  norms = global_norms(per_example)
  # min(1, C/‖g‖), written so that ‖g‖ = 0 gives 1 instead of inf * 0.
  scale = clip_norm / jnp.maximum(norms, clip_norm)  # [batch]

  def apply(x):
    return x * scale.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)

  return jax.tree.map(apply, per_example), norms


def prune_by_magnitude(
  tree: PyTree, fraction: float, *, scope: str = 'tensor'
) -> PyTree:
  """Zeros the `fraction` of entries with the smallest magnitude.

  Exactly `num_pruned(n, fraction)` = floor(fraction * n + 1/2) entries
  are zeroed and the others are kept unchanged, n being the size of each
  leaf (`scope='tensor'`) or of all leaves together (`scope='global'`); ties
  are broken by position.

  >>> prune_by_magnitude({'w': jnp.array([3., -1., 0.5, -4.])}, 0.5)['w']
  Array([ 3.,  0.,  0., -4.], dtype=float32)

  Args:
    tree: a pytree of arrays (a gradient or an update).
    fraction: p in [0, 1).
    scope: 'tensor' or 'global' (see the module docstring).

  Returns:
    The pruned pytree.
  """
  if scope not in PRUNE_SCOPES:
    raise LeakjaxError(
      f'prune scope {scope!r} is not one of {PRUNE_SCOPES}',
      "use 'tensor' or 'global'",
    )
  leaves, treedef = jax.tree.flatten(tree)
  if fraction <= 0 or not leaves:
    return tree
  bits = [_magnitude_bits(x) for x in leaves]
  if scope == 'global':
    total = sum(x.size for x in leaves)
    keep = _keep_largest(jnp.concatenate(bits), num_pruned(total, fraction))
    keeps, start = [], 0
    for x in leaves:
      keeps.append(keep[start : start + x.size])
      start += x.size
  else:
    keeps = [
      _keep_largest(b, num_pruned(x.size, fraction))
      for b, x in zip(bits, leaves, strict=True)
    ]
  out = [
    jnp.where(k.reshape(x.shape), x, jnp.zeros_like(x))
    for k, x in zip(keeps, leaves, strict=True)
  ]
  return jax.tree.unflatten(treedef, out)


def num_pruned(n: int, fraction: float) -> int:
  """floor(p * n + 1/2): how many of n entries pruning zeroes."""
  return min(int(math.floor(fraction * n + 0.5)), n)


def _magnitude_bits(x: jax.Array) -> jax.Array:
  """|x| as float32 bit patterns, int32 `[x.size]`: for non-negative
  floats the integer order is the value order."""
  magnitude = jnp.abs(x.ravel()).astype(jnp.float32)
  return lax.bitcast_convert_type(magnitude, jnp.int32)


_INF_BITS = 0x7F800000  # float32 +inf


def _keep_largest(bits: jax.Array, num_zeroed: int) -> jax.Array:
  """Bool mask `[n]`: False for the `num_zeroed` smallest of `bits`.

  Selection without a sort: a bisection over the bit patterns finds the
  `num_zeroed`-th smallest value t (32 counting passes over the entries);
  everything below t is zeroed, and of the entries equal to t the first
  ones by position until `num_zeroed` are (ties, e.g. the all-zero rows of
  unused words, break exactly as a stable sort would). Linear passes
  instead of a sort of every entry of the gradient keep pruning a whole
  model's gradient cheap on CPU.
  """
  n = bits.shape[0]
  if num_zeroed <= 0:
    return jnp.ones((n,), bool)
  if num_zeroed >= n:
    return jnp.zeros((n,), bool)

  def bisect(_, bounds):
    lo, hi = bounds  # the answer lies in [lo, hi]
    mid = lo + (hi - lo) // 2
    enough = jnp.sum(bits <= mid, dtype=jnp.int32) >= num_zeroed
    return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

  threshold, _ = lax.fori_loop(
    0, 32, bisect, (jnp.int32(0), jnp.int32(_INF_BITS))
  )
  below = bits < threshold
  tied = bits == threshold
  still = num_zeroed - jnp.sum(below, dtype=jnp.int32)
  zeroed = below | (tied & (jnp.cumsum(tied, dtype=jnp.int32) <= still))
  return ~zeroed


__all__ = [
  'Defense',
  'combine',
  'freeze_embeddings',
  'freeze',
  'dp_sgd',
  'dpsgd_like_noise',
  'single_noise',
  'gradient_pruning',
  'prune_by_magnitude',
  'clip_per_example',
  'gaussian_noise_like',
  'zero_frozen',
  'global_norms',
  'num_pruned',
]
