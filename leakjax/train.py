"""The training loop of the library, with optax.

The attacks need models trained on private text (FILM, the differential
score, GBoard's θ0) and models trained to attack (Embed Parrot), so there is
one loop for all of them:

* :func:`fit_step` -- one pure optimizer step on any :class:`LossFn`
  `(params, frozen, batch, key) -> (loss, metrics)`;
* :func:`fit` -- the loop: epochs of batches in an order fixed by the seed,
  one jitted step per loss function, optimizer settings and step count (new
  params never recompile), a tqdm bar and log lines, evaluation with early
  stopping (keeping the best parameters), NaN checks, orbax checkpoints
  under `workdir/checkpoint/` and a resume with the same final parameters
  as an uninterrupted run;
* :class:`LanguageModelLoss`, :func:`train_step`, :func:`evaluate` and
  :func:`train` -- language-model fine-tuning of any leakjax
  :class:`~leakjax.models.Model` on texts: tokenizes with
  `model.tokenizer`, cuts the corpus into fixed-shape batches (one
  compilation), evaluates the token-weighted loss and perplexity, and
  calls :func:`fit`.

The defaults follow FILM (Gupta et al. 2022) Sec. 6.1: initial learning rate
1e-5, linearly decayed, early stopping when the eval loss goes up:

>>> model, params = leakjax.models.load('smollm2-135m')  # doctest: +SKIP
>>> config = TrainConfig(num_epochs=3, early_stopping_patience=1)
>>> result = train(model, params, train_texts, eval_texts,  # doctest: +SKIP
...                config, workdir='/tmp/run')
>>> result.params, result.best_eval['perplexity']  # doctest: +SKIP

`workdir/checkpoint/` is an orbax `CheckpointManager` folder holding the
last checkpointed step: items `params`, `opt_state`, `state` (JSON: step,
key, history, best eval, config and data fingerprint) and, when the best
evaluated parameters differ from the last ones, `best`. Orbax writes each
step asynchronously (training goes on while it is written) and commits it
atomically, on local disks and object stores (`gs://`) alike, so a run
killed at any moment resumes from its last committed step
(:func:`checkpoint_state` reads it). :func:`train` also writes
`workdir/model/`, the model it returns, in Hugging Face's safetensors
layout (:func:`leakjax.models.save`), which :func:`leakjax.models.load`
reads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from leakjax import data as data_lib
from leakjax import io as io_lib
from leakjax.errors import LeakjaxError, check_token_ids
from leakjax.models.protocol import Model, PyTree, lm_loss

log = logging.getLogger(__name__)

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('linear', 'constant', 'cosine')
# Fields that change nothing about the trained parameters: a resumed run may
# use other values.
_RESUME_FREE_FIELDS = ('log_every', 'checkpoint_every')
_STATE_VERSION = 3


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


# ---------------------------------------------------------------- optimizer
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


def make_optimizer(
  config: TrainConfig, total_steps: int
) -> optax.GradientTransformation:
  """The optax optimizer of `config`: clip, then SGD/Adam/AdamW + schedule."""
  schedule = learning_rate_schedule(config, total_steps)
  parts = []
  if config.grad_clip_norm is not None:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
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


# ------------------------------------------------------------------ kernels
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


@dataclasses.dataclass(frozen=True)
class LanguageModelLoss:
  """Mean next-token cross-entropy of a :class:`Model` on `(ids, mask)`.

  A :class:`LossFn` (hashes by value); its metrics hold `tokens`, the
  number of real target tokens.

  With a client `defense` (:class:`leakjax.fl.Defense`) the step's gradient
  is the one a defended federated client sends: DP-SGD's clipped,
  noised per-example mean, GBoard's local noise, pruning of the smallest
  entries (see :func:`leakjax.fl.client_gradient`). Training with it
  measures what the defense costs in utility (FILM Tables 4 and 5). Frozen
  parameters are not trained at all: the params are then the `partition`'s
  trainable tree (None at frozen leaves) and `frozen` its frozen leaves.

  Attributes:
    model: the model (dropout, if it has any, is on).
    defense: the client defense applied to every step's gradient; None:
      the plain gradient.
    partition: with a defense, the
      :class:`leakjax.fl.client.Partition` of the full params into
      trainable and frozen.
  """

  model: Model
  defense: Any = None
  partition: Any = None

  def full_params(self, params: PyTree, frozen: PyTree) -> PyTree:
    """The model's params from the trained and frozen parts."""
    if self.partition is None:
      return params
    return self.partition.merge(params, frozen)

  def __call__(self, params, frozen, batch: Batch, key):
    ids, mask = batch
    logits = self.model.train_logits(
      self.full_params(params, frozen), ids, mask, key=key
    )
    tokens = mask[:, 1:].sum().astype(jnp.float32)
    return lm_loss(logits, ids, mask), {'tokens': tokens}

  def value_and_grad(self, params, frozen, batch: Batch, key):
    if self.defense is None:
      return jax.value_and_grad(self, has_aux=True)(params, frozen, batch, key)
    from leakjax.fl import client  # pylint: disable=g-import-not-at-top

    ids, mask = batch
    step_key, transmit_key = jax.random.split(key)
    weights = (mask.sum(axis=1) > 0).astype(jnp.float32)  # filler rows: 0
    loss, grads = client.defended_gradient(
      self.model,
      self.defense,
      True,
      self.partition,
      params,
      frozen,
      ids,
      mask,
      weights,
      key=step_key,
    )
    grads = client.transmit(grads, self.defense, key=transmit_key)
    tokens = mask[:, 1:].sum().astype(jnp.float32)
    return (loss, {'tokens': tokens}), grads


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


def train_step(
  model: Model,
  optimizer: optax.GradientTransformation,
  params: PyTree,
  opt_state: optax.OptState,
  batch: Batch,
  key: jax.Array,
) -> tuple[PyTree, optax.OptState, dict[str, jax.Array]]:
  """One optimizer step on the mean next-token loss of `batch`.

  :func:`fit_step` with :class:`LanguageModelLoss`. Pure; jit it with the
  model and the optimizer static, e.g.
  `step = jax.jit(train_step, static_argnames=('model', 'optimizer'))`.

  Args:
    model: supplies `train_logits` (dropout uses `key`).
    optimizer: an optax transformation, e.g. from :func:`make_optimizer`.
    params: the parameters.
    opt_state: `optimizer.init(params)` or a later state.
    batch: `(ids, mask)`, int32 `[batch, time]`; fully masked rows are
      ignored.
    key: this step's dropout key.

  Returns:
    `(params, opt_state, metrics)`; metrics holds float32 scalars `loss`
    (mean over real target tokens, before the update), `grad_norm` (before
    clipping) and `tokens` (real target tokens).
  """
  return fit_step(
    LanguageModelLoss(model), optimizer, params, None, opt_state, batch, key
  )


def eval_step(
  model: Model, params: PyTree, batch: Batch
) -> tuple[jax.Array, jax.Array]:
  """Summed next-token NLL over real targets of `batch`, and their count."""
  ids, mask = batch
  logits = model.logits(params, ids, mask)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  weights = mask[:, 1:].astype(jnp.float32)
  return (nll * weights).sum(), weights.sum()


def evaluate(
  model: Model, params: PyTree, batches: Iterable[Batch]
) -> dict[str, float]:
  """Token-weighted loss and perplexity of `params` over `batches`.

  Padding (mask 0) is excluded, so fully masked filler rows change nothing.
  Use batches of one shape (e.g. :func:`leakjax.data.batches`) to compile
  once.

  Returns:
    `{'loss', 'perplexity', 'tokens'}` (Python floats).
  """
  return _evaluate(functools.partial(_jitted_eval_step, model), params, batches)


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


@functools.partial(
  jax.jit,
  static_argnames=('loss_fn', 'settings', 'total_steps'),
  donate_argnames=('params', 'opt_state'),
)
def _jitted_fit_step(
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


@functools.partial(jax.jit, static_argnames=('model',))
def _jitted_eval_step(model: Model, params: PyTree, batch: Batch):
  return eval_step(model, params, batch)


def _evaluate(step, params, batches) -> dict[str, float]:
  sums = [step(params, (ids, mask)) for ids, mask in batches]
  if not sums:
    raise LeakjaxError('nothing to evaluate: no batches')
  nll, count = (
    np.asarray(x, np.float64) for x in zip(*jax.device_get(sums), strict=True)
  )
  tokens = float(count.sum())
  if tokens == 0:
    raise LeakjaxError(
      'nothing to evaluate: the eval batches have no target tokens',
      'use examples of at least 2 tokens',
    )
  loss = float(nll.sum() / tokens)
  return {'loss': loss, 'perplexity': _perplexity(loss), 'tokens': tokens}


def _perplexity(loss: float) -> float:
  return math.exp(loss) if loss < 700 else math.inf


# ------------------------------------------------------------ generic loop
@dataclasses.dataclass
class FitResult:
  """What :func:`fit` returns.

  Attributes:
    params: the trained parameters (the best evaluated ones if
      `config.restore_best` and there was an evaluation).
    history: one dict per logged step (`step`, `epoch`, `loss`, `grad_norm`,
      `learning_rate`, `steps_per_second` and the loss function's other
      metrics) or evaluation (`step`, `epoch` and `eval_<name>` for each
      metric of the evaluation), in order; `step` counts updates done. A
      resumed run returns the whole history, from step 0.
    best_eval: `{'step', <the evaluation's metrics>}` of the lowest eval
      loss, or None without an evaluation.
    step: optimizer updates done.
    start_step: the step this call started at (> 0 when it resumed).
    stopped_early: whether early stopping ended training.
  """

  params: PyTree
  history: list[dict[str, Any]]
  best_eval: dict[str, float] | None
  step: int
  start_step: int = 0
  stopped_early: bool = False


@dataclasses.dataclass
class TrainResult(FitResult):
  """What :func:`train` returns: a :class:`FitResult` (whose evaluation
  metrics are `loss` and `perplexity`, so eval rows hold `eval_loss` and
  `eval_perplexity`) and

  Attributes:
    model: the input model (it holds no parameters).
    num_truncated: training + eval examples cut to `max_length`.
  """

  model: Model | None = None
  num_truncated: int = 0


def fit(
  loss_fn: LossFn,
  params: PyTree,
  make_batch: Callable[[np.ndarray], Any],
  num_examples: int,
  config: TrainConfig = TrainConfig(),
  *,
  frozen: PyTree = None,
  evaluate: Callable[[PyTree], dict[str, float]] | None = None,
  workdir: str | os.PathLike | None = None,
  fingerprint: str = '',
  progress: bool = True,
  desc: str = 'train',
) -> FitResult:
  """Minimises `loss_fn` over `params`: the training loop of the library.

  Language-model fine-tuning (:func:`train`) and Embed Parrot
  (:func:`leakjax.attacks.inversion.embed_parrot.train`) both run here; so
  can any other loss.

  Args:
    loss_fn: a :class:`LossFn`.
    params: the starting parameters (not modified; training works on a
      copy).
    make_batch: the batch of an array of example indices, `[batch_size]`
      int, where -1 marks a filler row of the last partial batch (see
      :func:`leakjax.data.take_batch`). Batches of one shape compile once.
    num_examples: the training set's size; the order of each epoch depends
      only on `(config.seed, epoch)` (:func:`leakjax.data.batch_indices`).
    config: optimisation, schedule, evaluation and checkpoint settings (the
      fields that only :func:`train` reads, such as `max_length`, are
      ignored).
    frozen: arrays `loss_fn` reads but does not train.
    evaluate: `params -> {'loss': ..., ...}` (Python floats); called before
      the first step, every `config.eval_every` steps (default: every
      epoch) and after the last; drives early stopping and `restore_best`.
    workdir: checkpoint folder, local or a URL (`gs://...`);
      `workdir/checkpoint/` holds orbax checkpoints (module docstring). If
      it holds a checkpoint of the same config and
      fingerprint, training resumes from it and ends with the same
      parameters as an uninterrupted run; a finished run returns at once.
      In a multi-process run only JAX process 0 reads and writes it: the
      others train without checkpoints (the steps are deterministic, so
      all end with the same parameters).
    fingerprint: identifies the data (and whatever else a resumed run must
      share, such as a random initialisation); a checkpoint with another
      fingerprint is refused.
    progress: show a tqdm bar.
    desc: the bar's and the log lines' label.

  Raises:
    LeakjaxError: no full batch with `drop_remainder`, a NaN/inf loss or
      gradient (names the step), or a workdir that holds a different run.
  """
  steps_per_epoch = data_lib.num_batches(
    num_examples, config.batch_size, drop_remainder=config.drop_remainder
  )
  if steps_per_epoch == 0:
    raise LeakjaxError(
      f'the training set has {num_examples} examples, fewer than one'
      f' batch of {config.batch_size} with drop_remainder',
      'lower batch_size or set drop_remainder=False',
    )
  total_steps = (
    config.num_steps
    if config.num_steps is not None
    else config.num_epochs * steps_per_epoch
  )
  optimizer = make_optimizer(config, total_steps)
  schedule = learning_rate_schedule(config, total_steps)

  if jax.process_index() != 0:
    workdir = None  # only process 0 checkpoints (see the docstring)
  workdir = io_lib.as_path(workdir) if workdir is not None else None
  manager = _checkpoint_manager(workdir) if workdir is not None else None
  restored = (
    _read_checkpoint(manager, params, optimizer, config, fingerprint)
    if manager is not None
    else None
  )
  key = jax.random.key(config.seed)
  if restored is not None:
    params, opt_state, best_params, state = restored
    key = jax.random.wrap_key_data(np.asarray(state['rng'], np.uint32))
    log.info(
      '%s: resuming from %s at step %d', desc, manager.directory, state['step']
    )
  else:
    # Copies: the step donates its buffers, the caller keeps `params`.
    params = jax.tree.map(jnp.array, params)
    opt_state = optimizer.init(params)
    best_params = None
    state = {
      'version': _STATE_VERSION,
      'step': 0,
      'epoch': 0,
      'rng': np.asarray(jax.random.key_data(key)).tolist(),
      'best': None,
      'evals_without_improvement': 0,
      'finished': False,
      'stopped_early': False,
      'history': [],
      'total_steps': total_steps,
      'fingerprint': fingerprint,
      'config': _config_dict(config),
    }
  start_step = state['step']

  step_fn = functools.partial(
    _jitted_fit_step, loss_fn, _optimizer_settings(config), total_steps
  )
  keep_best = evaluate is not None and config.restore_best

  def run_eval():
    """Evaluates `params`; updates best / patience; True if stopping."""
    nonlocal best_params
    metrics = {k: float(v) for k, v in evaluate(params).items()}
    step = state['step']
    state['history'].append(
      {
        'step': step,
        'epoch': step / steps_per_epoch,
        **{f'eval_{k}': v for k, v in metrics.items()},
      }
    )
    best = state['best']
    if best is None or metrics['loss'] < best['loss']:
      state['best'] = {'step': step, **metrics}
      state['evals_without_improvement'] = 0
      if keep_best:  # a copy: the next step donates `params`
        best_params = jax.tree.map(jnp.copy, params)
    else:
      state['evals_without_improvement'] += 1
    patience = config.early_stopping_patience
    return bool(patience) and state['evals_without_improvement'] >= patience

  if evaluate is not None and restored is None:
    run_eval()  # the starting point, which early stopping may keep

  window = _Window(schedule, desc)
  bar = _progress_bar(progress, total_steps, start_step, desc)
  epoch_rows, epoch_of_rows = [], -1
  pending = None  # the previous step's metrics, read one step late
  try:
    while state['step'] < total_steps and not state['finished']:
      step = state['step']
      epoch, offset = divmod(step, steps_per_epoch)
      if epoch != epoch_of_rows:
        epoch_rows = data_lib.batch_indices(
          num_examples,
          config.batch_size,
          seed=config.seed,
          epoch=epoch,
          shuffle=config.shuffle,
          drop_remainder=config.drop_remainder,
        )
        epoch_of_rows = epoch
      batch = make_batch(epoch_rows[offset])
      params, opt_state, metrics = step_fn(
        params, frozen, opt_state, batch, key, np.int32(step)
      )
      # Reading the previous step's metrics only now keeps the device busy.
      if pending is not None:
        window.add(*pending)
      pending = (step + 1, metrics)
      state['step'] = step = step + 1
      state['epoch'] = step // steps_per_epoch
      bar.update(1)

      done = step == total_steps
      do_log = step % config.log_every == 0 or done
      if config.eval_every:
        do_eval = step % config.eval_every == 0
      else:
        do_eval = step % steps_per_epoch == 0
      do_eval = evaluate is not None and (do_eval or done)
      do_checkpoint = (
        workdir is not None
        and not done
        and config.checkpoint_every is not None
        and step % config.checkpoint_every == 0
      )
      if not (do_log or do_eval or do_checkpoint):
        continue
      window.add(*pending)
      pending = None
      if do_log:
        row = window.row(step, steps_per_epoch, total_steps)
        state['history'].append(row)
        bar.set_postfix(
          loss=f'{row["loss"]:.4f}',
          lr=f'{row["learning_rate"]:.2e}',
          refresh=False,
        )
      if do_eval:
        if run_eval():
          state['finished'] = state['stopped_early'] = True
          log.info(
            '%s: early stopping at step %d; the best eval loss was at step %d',
            desc,
            step,
            state['best']['step'],
          )
        loss = state['history'][-1]['eval_loss']
        bar.set_postfix(
          loss=f'{window.last_loss:.4f}', eval_loss=f'{loss:.4g}', refresh=False
        )
      if do_checkpoint and not state['finished']:
        _write_checkpoint(manager, params, opt_state, best_params, state)
  finally:
    bar.close()
    if manager is not None:
      manager.wait_until_finished()  # a step being written is committed
  if pending is not None:
    window.add(*pending)

  ran = state['step'] > start_step
  state['finished'] = True
  if manager is not None:
    if ran:
      _write_checkpoint(manager, params, opt_state, best_params, state)
    manager.close()
  final = best_params if keep_best and best_params is not None else params
  return FitResult(
    params=final,
    history=list(state['history']),
    best_eval=state['best'],
    step=state['step'],
    start_step=start_step,
    stopped_early=state['stopped_early'],
  )


# ------------------------------------------------------------------- runner
def train(
  model: Model,
  params: PyTree,
  train_texts: Sequence[str] | tuple[np.ndarray, np.ndarray],
  eval_texts: Sequence[str] | tuple[np.ndarray, np.ndarray] | None = None,
  config: TrainConfig = TrainConfig(),
  *,
  workdir: str | os.PathLike | None = None,
  progress: bool = True,
  defense: Any = None,
) -> TrainResult:
  """Fine-tunes `params` of `model` on `train_texts`.

  :func:`fit` with :class:`LanguageModelLoss`, fixed-width token batches
  and the token-weighted eval loss.

  Args:
    model: any leakjax Model; texts are tokenized with `model.tokenizer`.
    params: the starting parameters (not modified; training works on a
      copy).
    train_texts: the training examples, or pre-tokenized `(ids, mask)`
      int `[num_examples, time]` arrays (right-padded).
    eval_texts: evaluation examples (or arrays); None: no evaluation, no
      early stopping.
    config: hyperparameters.
    workdir: checkpoint folder (see :func:`fit`); `workdir/model/` also
      receives the returned model as a directory that
      :func:`leakjax.models.load` reads.
    progress: show a tqdm bar.
    defense: a :class:`leakjax.fl.Defense` every step's gradient goes
      through, as a defended federated client's would (frozen parameters
      stay as they are); None: plain fine-tuning. See
      :class:`LanguageModelLoss`.

  Returns:
    A :class:`TrainResult`.

  Raises:
    LeakjaxError: empty training set, examples longer than the context with
      `truncate=False`, a NaN/inf loss or gradient (names the step), or a
      workdir that holds a different run.
  """
  context = model.max_length
  train_ids, train_mask, cut = _prepare(
    model, train_texts, config, context, 'training set'
  )
  loss, start, frozen = LanguageModelLoss(model), params, None
  if defense is not None:
    from leakjax.fl import client  # pylint: disable=g-import-not-at-top

    partition = client.Partition.of(params, defense.frozen)
    start, frozen = partition.split(params)
    loss = LanguageModelLoss(model, defense, partition)
  num_truncated = cut
  run_eval = None
  fingerprinted = [train_ids, train_mask]
  if eval_texts is not None:
    eval_ids, eval_mask, cut = _prepare(
      model, eval_texts, config, context, 'eval set'
    )
    num_truncated += cut
    fingerprinted += [eval_ids, eval_mask]
    eval_rows = data_lib.batch_indices(
      len(eval_ids),
      config.eval_batch_size or config.batch_size,
      seed=0,
      shuffle=False,
    )
    evals = [data_lib.take_batch(eval_ids, eval_mask, r) for r in eval_rows]
    eval_fn = functools.partial(_jitted_eval_step, model)

    def run_eval(p):
      metrics = _evaluate(eval_fn, loss.full_params(p, frozen), evals)
      return {'loss': metrics['loss'], 'perplexity': metrics['perplexity']}

  if num_truncated:
    log.warning(
      '%d examples were longer than %d tokens and were cut',
      num_truncated,
      train_ids.shape[1],
    )
  fingerprint = data_fingerprint(*fingerprinted)
  if defense is not None:
    fingerprint += '+' + hashlib.sha256(repr(defense).encode()).hexdigest()[:8]
  result = fit(
    loss,
    start,
    lambda rows: data_lib.take_batch(train_ids, train_mask, rows),
    len(train_ids),
    config,
    frozen=frozen,
    evaluate=run_eval,
    workdir=workdir,
    fingerprint=fingerprint,
    progress=progress,
  )
  trained = loss.full_params(result.params, frozen)
  if jax.process_index() != 0:
    workdir = None
  if workdir is not None:
    target = io_lib.as_path(workdir) / 'model'
    if result.step > result.start_step or not _is_complete(target):
      _save_directory(model, trained, target)
  return TrainResult(
    model=model,
    params=trained,
    history=result.history,
    best_eval=result.best_eval,
    step=result.step,
    start_step=result.start_step,
    stopped_early=result.stopped_early,
    num_truncated=num_truncated,
  )


class _Window:
  """Training metrics since the last history row; checks them for NaN."""

  def __init__(self, schedule, desc: str):
    self._schedule = schedule
    self._desc = desc
    self._rows: list[dict[str, float]] = []
    self._since = self._start = time.perf_counter()
    self._steps = 0
    self.last_loss = math.nan

  def add(self, step: int, metrics) -> None:
    m = {k: float(v) for k, v in jax.device_get(metrics).items()}
    loss, grad_norm = m['loss'], m['grad_norm']
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      what = 'loss' if not math.isfinite(loss) else 'gradient norm'
      value = loss if what == 'loss' else grad_norm
      raise LeakjaxError(
        f'{self._desc}: the training {what} is {value} at step {step}'
        f' (learning rate {float(self._schedule(step - 1)):.3g})',
        'lower the learning rate (or set grad_clip_norm) and restart',
      )
    self._rows.append(m)
    self.last_loss = loss

  def row(
    self, step: int, steps_per_epoch: int, total_steps: int
  ) -> dict[str, float]:
    """The history row of the steps added since the last call.

    `grad_norm` is the mean over the steps; the loss and the other metrics
    are weighted by `tokens` where the loss function reports it (the loss
    of one big batch), else plain means.
    """
    rows, self._rows = self._rows, []
    weights = np.asarray([r.get('tokens', 1.0) for r in rows], np.float64)
    names = [k for k in rows[0] if k not in ('tokens', 'grad_norm', 'loss')]
    now = time.perf_counter()
    self._steps += len(rows)
    rate = len(rows) / max(now - self._since, 1e-9)

    def mean(name):
      values = np.asarray([r[name] for r in rows], np.float64)
      if 'tokens' not in rows[0]:
        return float(values.mean())
      return float((values * weights).sum() / max(weights.sum(), 1.0))

    out = {
      'step': step,
      'epoch': step / steps_per_epoch,
      'loss': mean('loss'),
      **{k: mean(k) for k in names},
      'grad_norm': float(np.mean([r['grad_norm'] for r in rows])),
      'learning_rate': float(self._schedule(step - 1)),
      'steps_per_second': rate,
    }
    overall = self._steps / max(now - self._start, 1e-9)
    log.info(
      '%s: step %d/%d loss %.4f (%.2f steps/s, %.0f s to go)',
      self._desc,
      step,
      total_steps,
      out['loss'],
      rate,
      (total_steps - step) / max(overall, 1e-9),
    )
    self._since = now
    return out


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm(
    total=total,
    initial=initial,
    disable=not enabled,
    unit='step',
    desc=desc,
    dynamic_ncols=True,
  )


# --------------------------------------------------------------- input data
def _prepare(
  model: Model, texts, config: TrainConfig, context: int | None, what: str
) -> tuple[np.ndarray, np.ndarray, int]:
  """Texts or (ids, mask) -> fixed-width int32 arrays + examples cut."""
  max_length = config.max_length
  if context is not None:
    max_length = context if max_length is None else min(max_length, context)
  if _is_arrays(texts):
    ids, mask = (np.asarray(x) for x in texts)
    if ids.ndim != 2 or ids.shape != mask.shape:
      raise LeakjaxError(
        f'the {what} arrays have shapes {ids.shape} and {mask.shape}',
        'pass (ids, mask) of one shape [num_examples, time]',
      )
    if len(ids) == 0:
      raise LeakjaxError(f'the {what} is empty', 'pass at least one example')
    ids, mask = ids.astype(np.int32), (mask != 0).astype(np.int32)
    num_truncated = 0
    if max_length is not None and ids.shape[1] > max_length:
      lengths = mask.sum(axis=1)
      num_truncated = int((lengths > max_length).sum())
      if num_truncated and not config.truncate:
        raise LeakjaxError(
          f'{num_truncated} examples of the {what} are longer than'
          f' {max_length} tokens (the model context or max_length)',
          'shorten them or set truncate=True',
        )
      ids, mask = ids[:, :max_length], mask[:, :max_length]
  else:
    texts = list(texts)
    if not texts:
      raise LeakjaxError(f'the {what} is empty', 'pass at least one example')
    if model.tokenizer is None:
      raise LeakjaxError(
        'the model has no tokenizer',
        'attach one or pass pre-tokenized (ids, mask)',
      )
    ids, mask, num_truncated = data_lib.encode_corpus(
      model.tokenizer,
      texts,
      max_length,
      add_bos=config.add_bos,
      add_eos=config.add_eos,
      truncate=config.truncate,
    )
  check_token_ids(ids[mask != 0], model.vocab_size, f'the {what} token ids')
  if mask[:, 1:].sum() == 0:
    raise LeakjaxError(
      f'the {what} has no example of 2 or more tokens, so nothing to predict',
      'pass longer examples',
    )
  return ids, mask, num_truncated


def _is_arrays(x) -> bool:
  return (
    isinstance(x, tuple) and len(x) == 2 and all(hasattr(a, 'shape') for a in x)
  )


def data_fingerprint(*arrays) -> str:
  """A short hash of arrays' shapes and bytes (for `fit(fingerprint=...)`)."""
  digest = hashlib.sha256()
  for a in arrays:
    digest.update(str(a.shape).encode())
    digest.update(np.ascontiguousarray(a).tobytes())
  return digest.hexdigest()[:32]


def _config_dict(config: TrainConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


# -------------------------------------------------------------- checkpoints
_CHECKPOINT = 'checkpoint'
# The marker written last into a directory on an object store, where
# directories cannot be renamed atomically (see _replace_directory).
_COMPLETE = '.complete'


def _checkpoint_manager(workdir):
  """The orbax manager of `workdir/checkpoint/`. Only JAX process 0 gets
  here (see :func:`fit`), so it is the manager's one active process."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = workdir / _CHECKPOINT
  if (directory / 'train_state.json').exists():
    raise LeakjaxError(
      f'{directory} holds a checkpoint of an earlier leakjax version',
      'use a new workdir or delete the old checkpoint folder',
    )
  # orbax refuses to create the folder when only some processes take part.
  directory.mkdir(parents=True, exist_ok=True)
  return ocp.CheckpointManager(
    directory,
    options=ocp.CheckpointManagerOptions(
      max_to_keep=1,
      enable_async_checkpointing=True,
      create=False,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=0,
        active_processes={0} if jax.process_count() > 1 else None,
      ),
    ),
  )


def _host_tree(tree: PyTree) -> PyTree:
  """NumPy copies of `tree`'s leaves: what orbax writes in the background
  while the step donates the device buffers."""
  return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


def _write_checkpoint(
  manager, params, opt_state, best_params, state: dict[str, Any]
) -> None:
  """Saves step `state['step']` (asynchronously; one step is kept)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  items = {
    'params': ocp.args.PyTreeSave(_host_tree(params)),
    'opt_state': ocp.args.PyTreeSave(_host_tree(opt_state)),
    'state': ocp.args.JsonSave(json.loads(json.dumps(state))),
  }
  best = state['best']
  if best_params is not None and best is not None:
    if best['step'] != state['step']:
      items['best'] = ocp.args.PyTreeSave(_host_tree(best_params))
  manager.save(state['step'], args=ocp.args.Composite(**items), force=True)


def _restore_tree(manager, step: int, name: str, template: PyTree) -> PyTree:
  """Item `name` of checkpoint `step`, in the structure and dtypes of
  `template` (`jax.ShapeDtypeStruct`s), as `jax.Array`s."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  flat, treedef = jax.tree.flatten(template)
  like = jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), template)
  try:
    restored = manager.restore(
      step, args=ocp.args.Composite(**{name: ocp.args.PyTreeRestore(like)})
    )[name]
    leaves = jax.tree.leaves(restored)
    if len(leaves) != len(flat):
      raise ValueError(f'{len(leaves)} arrays, expected {len(flat)}')
    for leaf, t in zip(leaves, flat):
      if tuple(np.shape(leaf)) != tuple(t.shape):
        raise ValueError(f'shape {np.shape(leaf)}, expected {t.shape}')
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    raise LeakjaxError(
      f'cannot read {name} of checkpoint {manager.directory} step {step}: {e}',
      'it was written for another model; use a new workdir',
    ) from None
  return jax.tree.unflatten(
    treedef, [jnp.asarray(v, dtype=t.dtype) for v, t in zip(leaves, flat)]
  )


def checkpoint_state(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The training state (step, history, best eval, config, fingerprint,
  finished) of the last checkpoint under `workdir`, or None."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  workdir = io_lib.as_path(workdir)
  if not (workdir / _CHECKPOINT).exists():
    return None
  manager = _checkpoint_manager(workdir)
  try:
    step = manager.latest_step()
    if step is None:
      return None
    return manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.JsonRestore())
    )['state']
  finally:
    manager.close()


def checkpoint_params(workdir: str | os.PathLike, like: PyTree) -> PyTree:
  """The parameters of the last checkpoint under `workdir`, in the
  structure and dtypes of `like` (arrays or `jax.ShapeDtypeStruct`s)."""
  workdir = io_lib.as_path(workdir)
  if not (workdir / _CHECKPOINT).exists():
    raise LeakjaxError(f'{workdir} holds no checkpoint')
  manager = _checkpoint_manager(workdir)
  try:
    step = manager.latest_step()
    if step is None:
      raise LeakjaxError(f'{manager.directory} holds no checkpoint')
    return _restore_tree(
      manager, step, 'params', jax.eval_shape(lambda p: p, like)
    )
  finally:
    manager.close()


def _is_complete(directory) -> bool:
  """Whether `_replace_directory` finished writing `directory`."""
  if io_lib.is_local(directory):
    return directory.is_dir()
  return (directory / _COMPLETE).exists()


def _replace_directory(directory, write: Callable[[Any], None]) -> None:
  """Fills a new `directory` with `write(folder)`, replacing it atomically.

  Locally: writes a sibling `<name>.new` folder, then swaps it in with two
  renames. Object stores rename a folder by copying each file, so there the
  old folder is deleted, `write` fills `directory` itself and a `.complete`
  marker is written last (:func:`_is_complete`).
  """
  if not io_lib.is_local(directory):
    if directory.exists():
      directory.rmtree()
    directory.mkdir(parents=True, exist_ok=True)
    write(directory)
    io_lib.atomic_write_text(directory / _COMPLETE, '')
    return
  directory = Path(directory)
  new = directory.with_name(directory.name + '.new')
  old = directory.with_name(directory.name + '.old')
  shutil.rmtree(new, ignore_errors=True)
  new.mkdir(parents=True)
  write(new)
  shutil.rmtree(old, ignore_errors=True)
  if directory.exists():
    os.replace(directory, old)
  os.replace(new, directory)
  shutil.rmtree(old, ignore_errors=True)


def _save_directory(model: Model, params: PyTree, directory) -> None:
  """`leakjax.models.save` into `directory`, replacing it atomically."""
  from leakjax import models  # pylint: disable=g-import-not-at-top

  _replace_directory(
    directory, lambda folder: models.save(model, params, folder)
  )


def _read_checkpoint(
  manager,
  template: PyTree,
  optimizer,
  config: TrainConfig,
  fingerprint: str,
):
  """(params, opt_state, best_params, state) of the manager's last step,
  or None without one; params take the structure and dtypes of
  `template`."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  step = manager.latest_step()
  if step is None:
    return None
  folder = manager.directory
  try:
    state = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.JsonRestore())
    )['state']
  except (OSError, ValueError, KeyError) as e:
    raise LeakjaxError(
      f'cannot read the state of {folder} step {step}: {e}',
      'delete the checkpoint folder to start over',
    ) from None
  if not isinstance(state, dict) or state.get('version') != _STATE_VERSION:
    raise LeakjaxError(
      f'{folder} was written by another leakjax version', 'use a new workdir'
    )
  old, new = state['config'], _config_dict(config)
  changed = sorted(
    k
    for k in set(old) | set(new)
    if k not in _RESUME_FREE_FIELDS and old.get(k) != new.get(k)
  )
  if changed:
    raise LeakjaxError(
      f'{folder} holds a run with a different config (changed:'
      f' {", ".join(changed)})',
      'use a new workdir or delete the old one',
    )
  if state['fingerprint'] != fingerprint:
    raise LeakjaxError(
      f'{folder} holds a run with another fingerprint (other data or'
      ' another starting point)',
      'use a new workdir or delete the old one',
    )
  template = jax.eval_shape(lambda p: p, template)
  params = _restore_tree(manager, step, 'params', template)
  opt_state = _restore_tree(
    manager, step, 'opt_state', jax.eval_shape(optimizer.init, template)
  )
  best_params = None
  best = state['best']
  if best is not None and config.restore_best:
    if best['step'] == state['step']:
      best_params = jax.tree.map(jnp.copy, params)
    else:
      best_params = _restore_tree(manager, step, 'best', template)
  return params, opt_state, best_params, state


__all__ = [
  'FitResult',
  'checkpoint_params',
  'checkpoint_state',
  'LanguageModelLoss',
  'LossFn',
  'TrainConfig',
  'TrainResult',
  'fit',
  'data_fingerprint',
  'fit_step',
  'make_optimizer',
  'learning_rate_schedule',
  'train_step',
  'eval_step',
  'evaluate',
  'train',
  'OPTIMIZERS',
  'SCHEDULES',
]
