"""The optax optimizer and learning-rate schedule of a :class:`TrainConfig`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from leakjax.models.protocol import PyTree
from leakjax.train.config import TrainConfig


def learning_rate_schedule(
  config: TrainConfig, total_steps: int
) -> optax.Schedule:
  """Step -> learning rate: linear warmup, then linear/cosine decay or constant.

  `linear` is `lr * step / warmup` during warmup, then
  `lr * (total - step) / (total - warmup)`, reaching 0 at `total_steps`
  (as transformers' `get_linear_schedule_with_warmup`). `cosine` is optax's
  warmup + cosine decay to `final_learning_rate_fraction * lr` at
  `total_steps`.
  """
  lr, warmup = config.learning_rate, config.warmup_steps
  if config.schedule == 'cosine':
    end = config.final_learning_rate_fraction * lr
    if warmup == 0:
      return optax.cosine_decay_schedule(
        lr, max(total_steps, 1), alpha=config.final_learning_rate_fraction
      )
    return optax.warmup_cosine_decay_schedule(
      0.0, lr, warmup, max(total_steps, warmup + 1), end_value=end
    )
  decay_steps = max(total_steps - warmup, 1)

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    if config.schedule == 'linear':
      value = lr * jnp.clip((total_steps - count) / decay_steps, 0.0, 1.0)
    else:
      value = jnp.full_like(count, lr)
    if warmup > 0:
      value = jnp.where(count < warmup, lr * count / warmup, value)
    return value

  return schedule


def _decay_mask(params: PyTree) -> PyTree:
  # Decay matrices and embeddings, not biases or norm scales (transformers'
  # Trainer excludes bias and LayerNorm weights the same way).
  return jax.tree.map(lambda x: jnp.ndim(x) >= 2, params)


def _clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales the gradients by `min(1, max_norm / ||g||)`, `||g||` their
  global norm: torch's `clip_grad_norm_` without its 1e-6 in the divisor.

  The same clip as `optax.clip_by_global_norm`, written as one scalar
  factor: optax's `select(||g|| < max_norm, g, g / ||g|| * max_norm)` feeds
  both the raw and the divided gradients to Adam's two moment updates, and
  XLA keeps the divided ones as a second copy of every gradient, a model's
  worth of memory more in the training step
  (`test_the_step_holds_one_copy_of_the_gradients`). A multiply by a
  scalar fuses into its consumers. Gradients under the bound pass
  unchanged (times exactly 1); clipped ones differ from optax's by float
  rounding, which moves a trained model in its last bits.
  """

  def update(updates, state, params=None):
    del params
    norm = optax.global_norm(updates)
    scale = jnp.where(norm < max_norm, 1.0, max_norm / norm)
    return jax.tree.map(lambda t: t * scale.astype(t.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(
  config: TrainConfig, total_steps: int
) -> optax.GradientTransformation:
  """The optax optimizer of `config`: clip, then SGD/Adam/AdamW + schedule."""
  schedule = learning_rate_schedule(config, total_steps)
  parts = []
  if config.grad_clip_norm is not None:
    parts.append(_clip_by_global_norm(config.grad_clip_norm))
  if config.optimizer == 'adamw':
    parts.append(
      optax.adamw(
        schedule,
        b1=config.adam_b1,
        b2=config.adam_b2,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        mask=_decay_mask,
      )
    )
  else:
    if config.weight_decay > 0:  # coupled L2, as torch's Adam/SGD do
      parts.append(
        optax.add_decayed_weights(config.weight_decay, mask=_decay_mask)
      )
    if config.optimizer == 'adam':
      parts.append(
        optax.adam(
          schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps
        )
      )
    else:
      parts.append(optax.sgd(schedule, momentum=config.momentum))
  return parts[0] if len(parts) == 1 else optax.chain(*parts)
