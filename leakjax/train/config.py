"""How to fine-tune a model: :class:`TrainConfig`."""

from __future__ import annotations

import dataclasses
import math

from leakjax.errors import LeakjaxError

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('linear', 'constant', 'cosine')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """How to fine-tune a model.

  Attributes:
    optimizer: 'adamw' (decoupled weight decay), 'adam' (weight decay as an
      L2 term on the gradient) or 'sgd' (optionally with `momentum`).
    learning_rate: the peak learning rate; FILM Sec. 6.1 uses 1e-5.
    weight_decay: decay of matrices and embeddings (leaves with >= 2 axes);
      biases and norm scales are never decayed.
    warmup_steps: steps of linear warmup from 0 to `learning_rate`.
    schedule: 'linear' decays to 0 at the last step (FILM Sec. 6.1, "a
      linearly decayed learning rate scheduler"); 'constant' keeps it;
      'cosine' decays along a half cosine to
      `final_learning_rate_fraction * learning_rate` (optax's
      `warmup_cosine_decay_schedule`).
    final_learning_rate_fraction: the end of the 'cosine' schedule, as a
      fraction of `learning_rate`.
    batch_size: examples per step.
    max_length: tokens per example (BOS/EOS included), at most the model's
      context; longer examples are cut (or rejected, see `truncate`).
      None: the longest example, capped at the context.
    num_epochs: passes over the training set (ignored if `num_steps`).
    num_steps: optimizer steps; overrides `num_epochs` (0: no step, the
      starting parameters come back).
    grad_clip_norm: clip the global gradient norm to this; None: no clip.
    eval_every: evaluate every this many steps; None: after every epoch.
      The initial model and the last step are always evaluated.
    early_stopping_patience: stop after this many evaluations in a row
      without a lower eval loss; None: never stop early. FILM Sec. 6.1
      trains "until the loss of the model on the evaluation set increased",
      i.e. patience 1.
    restore_best: return the parameters with the lowest eval loss instead
      of the last ones (when there is an eval set).
    seed: data order and dropout keys.
    log_every: add a training-loss row to the history every this many steps.
    checkpoint_every: with a workdir, checkpoint every this many steps (and
      always at the end); None: only at the end.
    add_bos: start every example with the tokenizer's BOS token (if any), so
      that the model learns how sentences start.
    add_eos: end every example with the EOS token (if any).
    truncate: cut examples longer than `max_length` (counted in
      `TrainResult.num_truncated` and logged); False raises LeakjaxError.
    shuffle: reshuffle the training set every epoch.
    drop_remainder: drop the last partial batch of an epoch instead of
      filling it with fully masked rows.
    eval_batch_size: batch size of evaluation; None: `batch_size`.
    adam_b1, adam_b2, adam_eps: Adam(W) hyperparameters (PyTorch defaults).
    momentum: SGD momentum; None: plain SGD.
  """

  optimizer: str = 'adamw'
  learning_rate: float = 1e-5  # FILM Sec. 6.1
  weight_decay: float = 0.0
  warmup_steps: int = 0
  schedule: str = 'linear'  # FILM Sec. 6.1
  final_learning_rate_fraction: float = 0.0
  batch_size: int = 16
  max_length: int | None = 128
  num_epochs: int = 1
  num_steps: int | None = None
  grad_clip_norm: float | None = 1.0
  eval_every: int | None = None
  early_stopping_patience: int | None = None
  restore_best: bool = True
  seed: int = 0
  log_every: int = 50
  checkpoint_every: int | None = None
  add_bos: bool = True
  add_eos: bool = False
  truncate: bool = True
  shuffle: bool = True
  drop_remainder: bool = False
  eval_batch_size: int | None = None
  adam_b1: float = 0.9
  adam_b2: float = 0.999
  adam_eps: float = 1e-8
  momentum: float | None = None

  def __post_init__(self):
    if self.optimizer not in OPTIMIZERS:
      raise LeakjaxError(
        f'unknown optimizer {self.optimizer!r}',
        f'use one of {", ".join(OPTIMIZERS)}',
      )
    if self.schedule not in SCHEDULES:
      raise LeakjaxError(
        f'unknown learning-rate schedule {self.schedule!r}',
        f'use one of {", ".join(SCHEDULES)}',
      )
    if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
      raise LeakjaxError(
        f'learning_rate must be positive, got {self.learning_rate}'
      )
    positive = dict(
      batch_size=self.batch_size,
      num_epochs=self.num_epochs,
      max_length=self.max_length,
      eval_every=self.eval_every,
      log_every=self.log_every,
      checkpoint_every=self.checkpoint_every,
      early_stopping_patience=self.early_stopping_patience,
      eval_batch_size=self.eval_batch_size,
      grad_clip_norm=self.grad_clip_norm,
    )
    for name, value in positive.items():
      if value is not None and not value > 0:
        raise LeakjaxError(f'{name} must be positive, got {value}')
    if self.num_steps is not None and self.num_steps < 0:
      raise LeakjaxError(f'num_steps must be >= 0, got {self.num_steps}')
    if self.warmup_steps < 0 or self.weight_decay < 0:
      raise LeakjaxError('warmup_steps and weight_decay must be >= 0')
    if not 0 <= self.final_learning_rate_fraction <= 1:
      raise LeakjaxError(
        'final_learning_rate_fraction must be in [0, 1], got'
        f' {self.final_learning_rate_fraction}'
      )
