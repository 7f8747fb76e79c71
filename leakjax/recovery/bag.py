"""Bag of words from an observed gradient (FILM Sec. 4.2, 6.3).

The first stage of FILM reads which tokens a private batch contains off the
gradient of the word-embedding matrix `∇W` (`[vocab, dim]`):

* untied embeddings: token v is in the batch iff row v of `∇W` is non-zero
  (Melis et al. 2019) -- :func:`nonzero_rows`, exact;
* gradient pruning (Zhu et al. 2019): still the non-zero rows (Sec. 6.3);
* DP-SGD: a row belongs to the batch if its largest magnitude exceeds
  τ = σ√(2 log d), σ the per-coordinate noise std (Sec. 6.3) --
  :func:`dp_rows`;
* the longest sentence: the last non-zero row of the position-embedding
  gradient (Sec. 4.2, GPT-2) -- :func:`max_length_from_positions`.

Tied embeddings (GPT-2, SmolLM2: the LM head is `W`) make every row dense:

    ∇W[v] = Σ_{n: x_n = v} ∂L/∂e_n  +  1/N Σ_n (p_n(v) − 1[y_n = v]) h̃_n

(input side + output side; h̃_n the final normalised hidden states, N the
number of target tokens). :func:`tied_bag` separates the batch from the
dense output side with three tests, each with (near) zero false positives:

1. input span (:func:`leakjax.recovery.span.span_residuals`; the
   low-rank idea of DAGER,
   Petrov et al. 2024): the first layer's input projection gradient is
   `Σ_n x̂_n δ_nᵀ`, x̂_n the normalised input embedding, so its column space
   is spanned by the inputs of the batch. A token is an input iff its x̂
   lies in that span. Exact while the number of distinct inputs (Llama) or
   input positions (GPT-2, whose inputs add position embeddings) is below
   the width d; the rank is read from the largest gap of the spectrum.
2. target sign (:func:`target_scores`): for a token absent from the batch
   the output side is Σ_n p_n(v) h̃_n with p ≥ 0, and h̃_n·(w_v − w̄) is the
   centred logit of v, large where p_n(v) is not negligible, so
   t_v = −∇W[v]·(w_v − w̄) ≤ 0. A target contributes −(1 − p)·h̃_n at the
   positions where it is the next token, with a large centred logit, which
   makes t_v > 0 unless the model already predicts v there.
3. when test 1 is invalid (more distinct inputs than d): rows with a
   large norm (robust z of log ‖∇W[v]‖ against the background) that are
   not aligned with their own centred logit. The tokens that fail test 2
   are the frequent ones, with large rows; so are the absent tokens the
   model predicts often, but their rows point along +(w_v − w̄).

:func:`norm_scores` is the baseline (breaching's norm threshold).

The tests read only the model's declared facts (`paths.attention_inputs`,
`first_layer_inputs`), never its family. :func:`bag_mask` is the pure,
jit-able kernel (a bool mask over the vocabulary); :func:`extract_bag`
is its host wrapper (NumPy ids, the longest sentence, the evidence).

Why here and not in `leakjax.attacks.film`: two attacks read the bag. FILM
searches sentences inside it (:func:`leakjax.attacks.film.recover`, its
first stage) and DAGER's hybrid takes it as candidate tokens
(:mod:`leakjax.attacks.dager.hybrid`); the rules are Melis et al.'s,
FILM's and DAGER's together (test 1 is DAGER's span). A paper package never
imports another, so the bag, its container :class:`Bag` and both entry
points (:func:`bag_mask`, :func:`extract_bag`) live in this neutral
package; what FILM does with the bag stays in `film`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from leakjax import checks
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, get_path
from leakjax.recovery.span import span_residuals

PyTree = Any


# ------------------------------------------------------- untied / defended
def nonzero_rows(
  grad_rows: Float[Array, 'V d'], atol: float = 0.0
) -> Bool[Array, ' V']:
  """Rows with an entry of magnitude > atol (FILM Sec. 4.2; pruning 6.3)."""
  return jnp.any(jnp.abs(grad_rows) > atol, axis=-1)


def dp_threshold(noise_std: float, dim: int) -> float:
  """τ = σ√(2 log d) (FILM Sec. 6.3): the max of d N(0, σ²) rarely exceeds it."""
  return float(noise_std) * math.sqrt(2.0 * math.log(dim))


def dp_rows(
  grad_rows: Float[Array, 'V d'], noise_std: float
) -> Bool[Array, ' V']:
  """Rows whose max |entry| exceeds τ = σ√(2 log d) (FILM Sec. 6.3).

  Args:
    grad_rows: the noisy embedding gradient.
    noise_std: σ, the per-coordinate noise std of the observed gradient;
      for DP-SGD with clip C and noise multiplier z averaged over b
      sentences (:func:`leakjax.fl.dp_sgd`), σ = z·C/b. A Python number
      or a (traced) scalar.
  """
  dim = grad_rows.shape[-1]
  if isinstance(noise_std, jax.core.Tracer):  # under jit: no float()
    tau = noise_std * math.sqrt(2.0 * math.log(dim))
  else:
    tau = dp_threshold(noise_std, dim)
  return jnp.max(jnp.abs(grad_rows), axis=-1) > tau


def max_length_from_positions(
  grad_positions: Float[Array, 'P d'], atol: float = 0.0
) -> Int[Array, '']:
  """Longest sentence, in tokens with BOS, from position gradients (Sec. 4.2).

  Positions past the longest sentence only see padding, whose loss is
  masked, so their rows are exactly zero; so is the row of the longest
  sentence's last position, whose output predicts nothing. The length is
  therefore the last non-zero row + 2 (0 if every row is zero).
  """
  nonzero = nonzero_rows(grad_positions, atol)
  idx = jnp.arange(grad_positions.shape[0])
  return jnp.max(jnp.where(nonzero, idx + 2, 0))


# -------------------------------------------------------------- tied tests
def norm_scores(grad_rows: Float[Array, 'V d']) -> Float[Array, ' V']:
  """‖∇W[v]‖: the norm-threshold baseline's score."""
  return jnp.linalg.norm(grad_rows.astype(jnp.float32), axis=-1)


def target_scores(
  grad_rows: Float[Array, 'V d'], embeddings: Float[Array, 'V d']
) -> Float[Array, ' V']:
  """t_v = −∇W[v]·(w_v − w̄): ≤ 0 for tokens absent from the batch.

  See the module docstring (test 2). With a tied head the logit of v at
  position n is w_v·h̃_n, so (w_v − w̄)·h̃_n is v's logit minus the mean
  logit, positive wherever p_n(v) is not negligible.
  """
  w = embeddings.astype(jnp.float32)
  centred = w - w.mean(0, keepdims=True)
  return -jnp.sum(grad_rows.astype(jnp.float32) * centred, axis=-1)


def robust_z(x: Float[Array, ' V']) -> Float[Array, ' V']:
  """(x − median) / MAD, the background being the bulk of the rows."""
  med = jnp.median(x)
  mad = jnp.median(jnp.abs(x - med)) + 1e-30
  return (x - med) / mad


@dataclasses.dataclass(frozen=True)
class TiedBagConfig:
  """Thresholds of :func:`tied_bag` (hashable, static).

  Attributes:
    span_tolerance: relative residual below which a token is an input.
    target_tolerance: t_v must exceed this fraction of max|t| (rounding
      makes background t_v ~1e-7 relative).
    target_z: and its robust z-score against all rows must exceed this
      (guards models whose output is nearly uniform, e.g. untrained ones,
      where test 2's premise fails and background t_v scatter widely).
    norm_z: test 3 (only when the span test is invalid): robust z-score of
      log ‖∇W[v]‖ above which ...
    min_alignment: ... a row is taken if its centred-logit alignment
      t_v / (‖∇W[v]‖ ‖w_v − w̄‖) also exceeds this. Absent tokens with big
      rows are the ones the model predicts often, whose rows point along
      +(w_v − w̄) (alignment clearly negative); a batch token's target term
      cancels part of that. inf for `norm_z` disables test 3.
    min_gap_decades / max_rank_fraction: validity of the span test.
  """

  span_tolerance: float = 0.05
  target_tolerance: float = 1e-5
  target_z: float = 10.0
  norm_z: float = 4.0
  min_alignment: float = -0.05
  min_gap_decades: float = 1.0
  max_rank_fraction: float = 0.9


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class BagEvidence:
  """Per-token scores of the tied tests, for diagnostics and sweeps.

  Attributes:
    span_residual: float `[V]` (1 where the span test is unavailable).
    span_rank: int `[]`, rank of the first-layer gradient.
    span_valid: bool `[]`.
    target: float `[V]`, t_v of test 2.
    norm_z: float `[V]`, robust z of log-norms.
  """

  span_residual: jax.Array
  span_rank: jax.Array
  span_valid: jax.Array
  target: jax.Array
  norm_z: jax.Array


def tied_bag(
  grad_rows: Float[Array, 'V d'],
  embeddings: Float[Array, 'V d'],
  span_residual: Float[Array, ' V'] | None = None,
  span_valid: Bool[Array, ''] | None = None,
  span_rank: Int[Array, ''] | None = None,
  *,
  config: TiedBagConfig = TiedBagConfig(),
) -> Bool[Array, ' V']:
  """The bag for a tied embedding (module docstring, tests 1-3).

  bag = target-sign ∪ (input span if the span test is valid, else norm
  outliers that are not aligned with their own centred logit). With ∇W
  zero everywhere (frozen embeddings) there are neither target signs nor
  outliers, and the input span is used whenever its rank is at most
  `max_rank_fraction` of the width, gap or no gap.

  Args:
    grad_rows: `∇W`, the gradient of the shared embedding/head matrix.
    embeddings: W at the attacked iteration.
    span_residual: from :func:`input_span_residuals` or
      :func:`layer_norm_span_residuals`; None skips test 1.
    span_valid: whether test 1 applies.
    span_rank: the span's dimension, the number of distinct inputs: at
      most this many tokens (those closest to the span) pass test 1, which
      keeps out tokens whose embeddings nearly coincide with an input's.
    config: thresholds.

  Returns:
    bool `[V]`.
  """
  t = target_scores(grad_rows, embeddings)
  bag = (t > config.target_tolerance * jnp.max(jnp.abs(t))) & (
    robust_z(t) > config.target_z
  )
  norms = norm_scores(grad_rows)
  w = embeddings.astype(jnp.float32)
  alignment = t / (norms * jnp.linalg.norm(w - w.mean(0), axis=-1) + 1e-30)
  outliers = (robust_z(jnp.log(norms + 1e-30)) > config.norm_z) & (
    alignment > config.min_alignment
  )
  if span_residual is None:
    return bag | outliers
  span = span_residual < config.span_tolerance
  use_span = span_valid
  if span_rank is not None:
    order = jnp.argsort(span_residual)
    closest = (
      jnp.zeros(span.shape, bool)
      .at[order]
      .set(jnp.arange(span.shape[0]) < span_rank)
    )
    span &= closest
    # A silent ∇W (frozen embeddings) leaves tests 2 and 3 nothing to
    # read: then the span's closest tokens are taken even without a clear
    # spectral gap, as long as the rank leaves room (a span of nearly all
    # of R^d is close to every token and says nothing).
    silent = jnp.all(norms == 0)
    room = span_rank <= config.max_rank_fraction * embeddings.shape[-1]
    use_span = use_span | (silent & room)
  return bag | jnp.where(use_span, span, outliers)


def _tied_head(model: Model) -> bool:
  return model.paths.lm_head is None and bool(model.tie_word_embeddings)


def _noise_given(noise_std) -> bool:
  """Whether a DP noise std is given (a traced one always counts)."""
  if noise_std is None:
    return False
  if isinstance(noise_std, jax.core.Tracer):
    return True
  return bool(noise_std)


METHODS = ('auto', 'nonzero', 'dp', 'tied', 'norm')


def resolve_method(model: Model, method: str, noise_std=None) -> str:
  """The rule `method='auto'` stands for (other methods pass through).

  'dp' if a DP noise std is given (not None, non-zero), else 'tied' when
  the head is tied to the input embedding, else 'nonzero'.
  """
  if method not in METHODS:
    raise LeakjaxError(
      f'unknown bag-of-words method {method!r}',
      "use 'auto', 'nonzero', 'dp', 'tied' or 'norm'",
    )
  if method != 'auto':
    return method
  if _noise_given(noise_std):
    return 'dp'
  return 'tied' if _tied_head(model) else 'nonzero'


def _bag_arrays(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  method: str,
  noise_std,
  config: TiedBagConfig,
  baseline_z,
  max_positions: int | None,
  with_evidence: bool,
) -> tuple[Bool[Array, ' V'], BagEvidence | None]:
  """`(mask, evidence)` of a resolved method: pure, shapes static.

  `max_positions` (a concrete int) slices the position embeddings of the
  span test (the host wrapper, as before); None reads the longest sentence
  off the position gradient as a traced scalar and masks instead.
  """
  rows = get_path(grads, model.paths.word_embeddings)
  if method == 'nonzero':
    return nonzero_rows(rows), None
  if method == 'dp':
    if noise_std is None:
      raise LeakjaxError(
        "method='dp' needs noise_std", 'pass the DP noise std of the gradient'
      )
    return dp_rows(rows, noise_std), None
  if method == 'norm':
    z = robust_z(jnp.log(norm_scores(rows) + 1e-30))
    return z > baseline_z, None
  if method != 'tied':
    raise LeakjaxError(
      f'unknown bag-of-words method {method!r}',
      "use 'auto', 'nonzero', 'dp', 'tied' or 'norm'",
    )
  w = model.word_embeddings(params)
  num_positions = None
  if max_positions is None and model.paths.position_embeddings is not None:
    num_positions = max_length_from_positions(
      get_path(grads, model.paths.position_embeddings)
    )
  span = span_residuals(
    model, params, grads, max_positions, num_positions=num_positions
  )
  if span is None:
    res, rank, valid = (
      jnp.ones(rows.shape[:1]),
      jnp.array(0),
      jnp.array(False),
    )
  else:
    res, rank, valid = span
  mask = tied_bag(rows, w, res, valid, rank, config=config)
  if not with_evidence:
    return mask, None
  evidence = BagEvidence(
    span_residual=res,
    span_rank=rank,
    span_valid=valid,
    target=target_scores(rows, w),
    norm_z=robust_z(jnp.log(norm_scores(rows) + 1e-30)),
  )
  return mask, evidence


def bag_mask(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  method: str,
  noise_std: float | Float[Array, ''] | None = None,
  config: TiedBagConfig = TiedBagConfig(),
  baseline_z: float = 8.0,
) -> Bool[Array, ' V']:
  """The bag of words as a bool mask over the vocabulary: the pure kernel.

  No host transfer and fixed shapes, so it runs under `jax.jit` with
  `model`, `method` and `config` static (and `vmap` over gradients):

  >>> fn = jax.jit(bag_mask, static_argnames=('model', 'method', 'config'))
  >>> mask = fn(model, params, grads, method='tied')       # doctest: +SKIP

  `noise_std` may be static or traced; `baseline_z` too. With learned
  position embeddings the tied method's span test only considers positions
  below the longest sentence (:func:`max_length_from_positions`, read here
  as a traced scalar and masked).

  Args: see :func:`extract_bag` (method 'auto' resolves with
    :func:`resolve_method`).

  Returns:
    bool `[V]`, True for the tokens found in the batch.
  """
  mask, _ = _bag_arrays(
    model,
    params,
    grads,
    method=resolve_method(model, method, noise_std),
    noise_std=noise_std,
    config=config,
    baseline_z=baseline_z,
    max_positions=None,
    with_evidence=False,
  )
  return mask


@dataclasses.dataclass
class Bag:
  """What :func:`extract_bag` found.

  Attributes:
    ids: sorted recovered token ids (numpy int64).
    mask: numpy bool `[V]`.
    max_length: longest sentence in tokens (BOS included) from the
      position-embedding gradient, or None (no position embeddings).
    method: which rule produced it.
    evidence: :class:`BagEvidence` for the tied method, else None.
    missing_facts: the declared facts that would have made the tied method
      exact but are missing ('attention_inputs', 'first_layer_inputs'; a
      warning says so too); empty when none is.
  """

  ids: np.ndarray
  mask: np.ndarray
  max_length: int | None
  method: str
  evidence: BagEvidence | None = None
  missing_facts: tuple[str, ...] = ()


def extract_bag(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  method: str = 'auto',
  noise_std: float | None = None,
  config: TiedBagConfig = TiedBagConfig(),
  baseline_z: float = 8.0,
) -> Bag:
  """The bag of words of a batch from its gradient (FILM Sec. 4.2).

  The host wrapper of :func:`bag_mask` (same rules, same numbers): it
  runs the kernel eagerly and hands back NumPy ids, the longest sentence
  read off the position gradient (a host int, which also bounds the span
  test's positions by slicing) and the tied method's evidence. Inside
  `jax.jit` use :func:`bag_mask`.

  Args:
    model: the attacked model (its `paths` locate the embeddings).
    params: θ^t, the parameters the gradient was taken at.
    grads: the observed gradient, a pytree like `params`.
    method: 'nonzero' (untied, pruning), 'dp' (needs `noise_std`), 'tied',
      'norm' (the baseline: rows whose log-norm has a robust z-score above
      `baseline_z`), or 'auto': 'dp' if noise_std is given, 'tied' if the
      head is tied, else 'nonzero' (:func:`resolve_method`).
    noise_std: DP-SGD per-coordinate noise std of `grads` (see
      :func:`dp_rows`).
    config: thresholds of the tied method.
    baseline_z: threshold of the 'norm' baseline.

  Returns:
    A :class:`Bag`.

  Raises:
    LeakjaxError: `grads` holds NaN/inf or is zero everywhere, is not
      shaped like `params`, or `params` do not fit the model's facts.
  """
  checks.check_inputs(model, params, grads, attack='the bag of words')
  method = resolve_method(model, method, noise_std)
  missing = checks.missing_span_facts(model, method)
  max_len = None
  if model.paths.position_embeddings is not None:
    pos_grad = get_path(grads, model.paths.position_embeddings)
    max_len = int(max_length_from_positions(pos_grad))
  mask, evidence = _bag_arrays(
    model,
    params,
    grads,
    method=method,
    noise_std=noise_std,
    config=config,
    baseline_z=baseline_z,
    max_positions=max_len,
    with_evidence=True,
  )
  mask = np.asarray(mask)
  return Bag(
    ids=np.flatnonzero(mask),
    mask=mask,
    max_length=max_len,
    method=method,
    evidence=evidence,
    missing_facts=missing,
  )


__all__ = [
  'Bag',
  'BagEvidence',
  'TiedBagConfig',
  'bag_mask',
  'extract_bag',
  'dp_rows',
  'dp_threshold',
  'max_length_from_positions',
  'nonzero_rows',
  'norm_scores',
  'resolve_method',
  'robust_z',
  'target_scores',
  'tied_bag',
]
