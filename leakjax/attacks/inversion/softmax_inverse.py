r"""A linear inverse of a layer trained to rank the true token first (ours).

The ridge inverse (Embed Parrot's linear skip,
:func:`.embed_parrot.ridge_solution`) maps the standardised states `H^l`
to `H^0` by least squares, and HEI's cosine (Wan et al. 2024, Eq. 9)
reads a token off its output. The exact search
(:mod:`.exact`) checks candidates in the order of that cosine, so what
matters is the rank of the true token, not the squared error: the
regression spends its fit on the common tokens and leaves rare ones far
down. Here the same affine map `x = A ((h - mu) / sigma) + c` is trained as
a classifier over the vocabulary,

    p(v | h) = softmax_v(s cos(x, E_v)),

with the cross-entropy of the attacker's own tokens, starting from the
ridge solution and pulled back to it by `pull * |A - A_ridge|^2` (the
attacker has a few thousand tokens for `D x D0` weights). The scale `s` is
learned with it and only sharpens the softmax: the order of the tokens at a
position is the cosine's, so :func:`.exact.proposal_scores` reads the
trained `(A, c)` exactly as it reads the ridge's.

How far up it puts the true token, against the ridge, on texts no test
number comes from: `studies/inversion_exact/proposals.py`
(`reports/inversion_exact/README.md`).

>>> kernel, bias = fit(states, ids, mask, stats, ridge, emb)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, Float, Int

from leakjax import train as train_lib
from leakjax.errors import LeakjaxError, check_positive


@dataclasses.dataclass(frozen=True)
class SoftmaxInverseConfig:
  """How the softmax inverse is trained.

  Attributes:
    steps: optimizer steps (Adam, constant learning rate).
    batch_size: the attacker's tokens per step.
    learning_rate: Adam's step size.
    pull: weight of `|A - A_ridge|^2`, which keeps the map near the ridge
      solution it starts from.
    scale: the softmax's starting scale `s` (cosines lie in [-1, 1]).
    seed: the order of the batches.
  """

  steps: int = 150
  batch_size: int = 512
  learning_rate: float = 1e-3
  pull: float = 1e-2
  scale: float = 30.0
  seed: int = 0

  def __post_init__(self):
    check_positive(self, 'steps', 'batch_size')
    check_positive(self, 'seed', minimum=0)
    if not (self.learning_rate > 0 and self.scale > 0 and self.pull >= 0):
      raise LeakjaxError('learning_rate and scale must be > 0, pull >= 0')


@dataclasses.dataclass(frozen=True)
class SoftmaxInverseLoss:
  """The cross-entropy of the true tokens (:class:`leakjax.train.LossFn`).

  `frozen` is `{'unit': embeddings / |embeddings| [V, D0], 'anchor': the
  ridge kernel}`; the batch is `(inputs [B, D] standardised, ids [B],
  weight [B])` (weight 0: a filler row).
  """

  pull: float

  def __call__(self, params, frozen, batch, key):
    del key
    inputs, ids, weight = batch
    x = inputs @ params['kernel'] + params['bias']
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-8)
    logits = jnp.exp(params['log_scale']) * (x @ frozen['unit'].T)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
    ce = jnp.sum(ce * weight) / jnp.maximum(jnp.sum(weight), 1.0)
    anchor = jnp.sum(jnp.square(params['kernel'] - frozen['anchor']))
    return ce + self.pull * anchor, {'cross_entropy': ce}


def fit(
  inputs: Float[np.ndarray, 'n t d'],
  ids: Int[np.ndarray, 'n t'],
  mask: Int[np.ndarray, 'n t'],
  stats: dict[str, np.ndarray],
  ridge: tuple[np.ndarray, np.ndarray],
  embeddings: Float[Array, 'V d0'],
  config: SoftmaxInverseConfig = SoftmaxInverseConfig(),  # noqa: B008
  *,
  progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Trains the inverse on the attacker's states; returns `(kernel, bias)`.

  Args:
    inputs: the attacker's `H^l`, float `[N, T, D]`.
    ids: their tokens `[N, T]`.
    mask: 1 where a token is trained on (its real, scored positions).
    stats: the standardisation (:func:`.embed_parrot.feature_stats`).
    ridge: the ridge solution `(kernel [D, D0], bias [D0])` it starts from.
    embeddings: the target's input embeddings `[V, D0]`.
    config: the training.
    progress: show a progress bar.
  """
  real = np.asarray(mask).astype(bool)
  if not real.any():
    raise LeakjaxError('the softmax inverse has no token to train on')
  x = (np.asarray(inputs, np.float32)[real] - stats['input_shift']) / stats[
    'input_scale'
  ]
  y = np.asarray(ids)[real].astype(np.int32)
  kernel, bias = (np.asarray(a, np.float32) for a in ridge)
  unit = jnp.asarray(embeddings, jnp.float32)
  unit = unit / jnp.maximum(jnp.linalg.norm(unit, axis=-1, keepdims=True), 1e-8)

  def make_batch(rows: np.ndarray):
    used = rows >= 0
    rows = np.where(used, rows, 0)
    return (
      jnp.asarray(x[rows]),
      jnp.asarray(y[rows]),
      jnp.asarray(used, jnp.float32),
    )

  params = {
    'kernel': jnp.asarray(kernel),
    'bias': jnp.asarray(bias),
    'log_scale': jnp.asarray(np.log(config.scale), jnp.float32),
  }
  result = train_lib.fit(
    SoftmaxInverseLoss(config.pull),
    params,
    make_batch,
    len(y),
    train_lib.TrainConfig(
      optimizer='adam',
      learning_rate=config.learning_rate,
      schedule='constant',
      grad_clip_norm=None,
      batch_size=min(config.batch_size, len(y)),
      num_steps=config.steps,
      seed=config.seed,
      log_every=max(1, config.steps // 3),
    ),
    frozen={'unit': unit, 'anchor': jnp.asarray(kernel)},
    progress=progress,
    desc='softmax inverse',
  )
  return (
    np.asarray(result.params['kernel']),
    np.asarray(result.params['bias']),
  )


__all__ = ['SoftmaxInverseConfig', 'SoftmaxInverseLoss', 'fit']
