"""One pure optimizer step on any loss function, and its jitted form.

:func:`fit_step` differentiates a :class:`LossFn`; `_settings_fit_step`
is the step :func:`leakjax.train.fit` runs, jitted there (with
`_FIT_STEP_JIT`) once per loss function, optimizer settings and step count.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import optax

from leakjax.models.protocol import PyTree
from leakjax.train.config import TrainConfig
from leakjax.train.optimizer import make_optimizer

Batch = tuple[jax.Array, jax.Array]  # (ids, mask), int32 [batch, time] each


class LossFn(Protocol):
  """What :func:`fit_step` differentiates.

  `loss_fn(params, frozen, batch, key) -> (loss, metrics)`: a float32
  scalar and a dict of float32 scalars. `frozen` is a pytree of arrays the
  loss reads but does not train (None if none), `key` the step's
  randomness (dropout). A `tokens` metric, if present, weights the other
  metrics when :func:`fit` averages them over logged steps.

  A loss function may also define `value_and_grad(params, frozen, batch,
  key) -> ((loss, metrics), grads)` to supply its own gradient (e.g.
  DP-SGD's clipped and noised per-example sum); :func:`fit_step` then uses
  it instead of differentiating the call.

  :func:`fit` jits the step with the loss function as a static argument, so
  it must hash by value for two equal losses to share one compilation: a
  module-level function, or a frozen dataclass with a `__call__` such as
  :class:`LanguageModelLoss`. Never close over arrays (they would be baked
  into the program): pass them in `frozen`.
  """

  def __call__(
    self, params: PyTree, frozen: PyTree, batch: Any, key: jax.Array
  ) -> tuple[jax.Array, dict[str, jax.Array]]: ...


def fit_step(
  loss_fn: LossFn,
  optimizer: optax.GradientTransformation,
  params: PyTree,
  frozen: PyTree,
  opt_state: optax.OptState,
  batch: Any,
  key: jax.Array,
) -> tuple[PyTree, optax.OptState, dict[str, jax.Array]]:
  """One optimizer step on `loss_fn(params, frozen, batch, key)`.

  Pure; jit it with `loss_fn` and `optimizer` static (:func:`fit` jits it
  with the optimizer's settings static instead, so that equal settings
  share one compilation).

  Returns:
    `(params, opt_state, metrics)`: the loss function's metrics plus
    `loss` (before the update) and `grad_norm` (before clipping).
  """
  grad_fn = getattr(loss_fn, 'value_and_grad', None)
  if grad_fn is None:
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  (loss, metrics), grads = grad_fn(params, frozen, batch, key)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  metrics = {**metrics, 'loss': loss, 'grad_norm': optax.global_norm(grads)}
  return params, opt_state, metrics


# Fields that make_optimizer reads besides the step count.
_OPTIMIZER_FIELDS = (
  'optimizer',
  'learning_rate',
  'weight_decay',
  'warmup_steps',
  'schedule',
  'final_learning_rate_fraction',
  'grad_clip_norm',
  'adam_b1',
  'adam_b2',
  'adam_eps',
  'momentum',
)


def _optimizer_settings(config: TrainConfig) -> TrainConfig:
  """`config` with every field but the optimizer's at its default, so that
  runs differing only in data order, logging or evaluation share the jitted
  step (its static arguments)."""
  return TrainConfig(**{f: getattr(config, f) for f in _OPTIMIZER_FIELDS})


# How `fit` jits `_settings_fit_step`.
_FIT_STEP_JIT = dict(
  static_argnames=('loss_fn', 'settings', 'total_steps'),
  donate_argnames=('params', 'opt_state'),
)


def _settings_fit_step(
  loss_fn: LossFn,
  settings: TrainConfig,
  total_steps: int,
  params: PyTree,
  frozen: PyTree,
  opt_state: optax.OptState,
  batch: Any,
  key: jax.Array,
  step: jax.Array,
):
  """:func:`fit_step` with the optimizer of `settings` and the key of
  `step`; donates params and opt_state."""
  optimizer = make_optimizer(settings, total_steps)
  # `fit_step` is looked up when tracing, so tests can wrap it.
  return fit_step(
    loss_fn,
    optimizer,
    params,
    frozen,
    opt_state,
    batch,
    jax.random.fold_in(key, step),
  )
