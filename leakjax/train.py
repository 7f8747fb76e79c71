"""Fine-tuning any leakjax :class:`~leakjax.models.Model` with optax.

The attacks need models that were trained on private text, so this is the
one training loop of the library:

* :func:`train_step` -- one pure optimizer step (the runner jits it once per
  model, optimizer settings and step count: new params never recompile);
* :func:`evaluate` -- token-weighted loss and perplexity over padded batches;
* :func:`train` -- the runner: tokenizes with `model.tokenizer`, cuts the
  corpus into fixed-shape batches (one compilation), shows a tqdm bar,
  evaluates, stops early on the eval loss (keeping the best parameters),
  checkpoints atomically under `workdir/checkpoint` and resumes from it with
  the same final parameters as an uninterrupted run.

The defaults follow FILM (Gupta et al. 2022) Sec. 6.1: initial learning rate
1e-5, linearly decayed, early stopping when the eval loss goes up:

>>> model, params = leakjax.models.load('smollm2-135m')  # doctest: +SKIP
>>> config = TrainConfig(num_epochs=3, early_stopping_patience=1)
>>> result = train(model, params, train_texts, eval_texts,  # doctest: +SKIP
...                config, workdir='/tmp/run')
>>> result.params, result.best_eval['perplexity']  # doctest: +SKIP

`workdir/checkpoint/` holds the model at the last checkpointed step (an HF
directory that :func:`leakjax.models.load` reads), `optimizer.safetensors`,
`train_state.json` and, when the best evaluated parameters differ from the
last ones, `best/` (another HF directory). `workdir/model/` is the model
that :func:`train` returns.
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
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from leakjax import data as data_lib
from leakjax.errors import LeakjaxError, check_token_ids
from leakjax.io import (
  atomic_write_text,
  flatten_pytree,
  load_pytree,
  save_pytree,
  unflatten_pytree,
)
from leakjax.models.protocol import Model, PyTree, lm_loss

log = logging.getLogger(__name__)

OPTIMIZERS = ('adamw', 'adam', 'sgd')
SCHEDULES = ('linear', 'constant')
# Fields that change nothing about the trained parameters: a resumed run may
# use other values.
_RESUME_FREE_FIELDS = ('log_every', 'checkpoint_every')
_STATE_VERSION = 1


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
      linearly decayed learning rate scheduler"); 'constant' keeps it.
    batch_size: examples per step.
    max_length: tokens per example (BOS/EOS included), at most the model's
      context; longer examples are cut (or rejected, see `truncate`).
      None: the longest example, capped at the context.
    num_epochs: passes over the training set (ignored if `num_steps`).
    num_steps: optimizer steps; overrides `num_epochs`.
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
      num_steps=self.num_steps,
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
    if self.warmup_steps < 0 or self.weight_decay < 0:
      raise LeakjaxError('warmup_steps and weight_decay must be >= 0')


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  Attributes:
    model: the input model (it holds no parameters).
    params: the trained parameters (the best evaluated ones if
      `config.restore_best` and there was an eval set).
    history: one dict per logged step (`step`, `epoch`, `loss`, `grad_norm`,
      `learning_rate`, `steps_per_second`) or evaluation (`step`, `epoch`,
      `eval_loss`, `eval_perplexity`), in order; `step` counts updates done.
    best_eval: `{'step', 'loss', 'perplexity'}` of the lowest eval loss, or
      None without an eval set.
    step: optimizer updates done.
    start_step: the step this call started at (> 0 when it resumed).
    stopped_early: whether early stopping ended training.
    num_truncated: training + eval examples cut to `max_length`.
  """

  model: Model
  params: PyTree
  history: list[dict[str, Any]]
  best_eval: dict[str, float] | None
  step: int
  start_step: int = 0
  stopped_early: bool = False
  num_truncated: int = 0


# ---------------------------------------------------------------- optimizer
def learning_rate_schedule(
  config: TrainConfig, total_steps: int
) -> optax.Schedule:
  """Step -> learning rate: linear warmup, then linear decay or constant.

  `linear` is `lr * step / warmup` during warmup, then
  `lr * (total - step) / (total - warmup)`, reaching 0 at `total_steps`
  (as transformers' `get_linear_schedule_with_warmup`).
  """
  lr, warmup = config.learning_rate, config.warmup_steps
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


def train_step(
  model: Model,
  optimizer: optax.GradientTransformation,
  params: PyTree,
  opt_state: optax.OptState,
  batch: Batch,
  key: jax.Array,
) -> tuple[PyTree, optax.OptState, dict[str, jax.Array]]:
  """One optimizer step on the mean next-token loss of `batch`.

  Pure; jit it with the model and the optimizer static, e.g.
  `step = jax.jit(train_step, static_argnames=('model', 'optimizer'))`, then
  `step(model, optimizer, params, opt_state, batch, jax.random.fold_in(key, i))`
  (:func:`train` jits it with the optimizer's settings static instead, so
  that equal settings share one compilation).

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
  ids, mask = batch

  def loss_fn(p):
    return lm_loss(model.train_logits(p, ids, mask, key=key), ids, mask)

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  params = optax.apply_updates(params, updates)
  metrics = {
    'loss': loss,
    'grad_norm': optax.global_norm(grads),
    'tokens': mask[:, 1:].sum().astype(jnp.float32),
  }
  return params, opt_state, metrics


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
  'grad_clip_norm',
  'adam_b1',
  'adam_b2',
  'adam_eps',
  'momentum',
)


def _optimizer_settings(config: TrainConfig) -> TrainConfig:
  """`config` with every field but the optimizer's at its default, so that
  runs differing only in data order, logging or evaluation share the jitted
  train step (its static arguments)."""
  return TrainConfig(**{f: getattr(config, f) for f in _OPTIMIZER_FIELDS})


@functools.partial(
  jax.jit,
  static_argnames=('model', 'settings', 'total_steps'),
  donate_argnames=('params', 'opt_state'),
)
def _jitted_train_step(
  model: Model,
  settings: TrainConfig,
  total_steps: int,
  params: PyTree,
  opt_state: optax.OptState,
  batch: Batch,
  key: jax.Array,
  step: jax.Array,
):
  """:func:`train_step` with the optimizer of `settings` and the key of
  `step`; donates params and opt_state."""
  optimizer = make_optimizer(settings, total_steps)
  # `train_step` is looked up when tracing, so tests can wrap it.
  return train_step(
    model, optimizer, params, opt_state, batch, jax.random.fold_in(key, step)
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
) -> TrainResult:
  """Fine-tunes `params` of `model` on `train_texts`.

  Args:
    model: any leakjax Model; texts are tokenized with `model.tokenizer`.
    params: the starting parameters (not modified; training works on a
      copy).
    train_texts: the training examples, or pre-tokenized `(ids, mask)`
      int `[num_examples, time]` arrays (right-padded).
    eval_texts: evaluation examples (or arrays); None: no evaluation, no
      early stopping.
    config: hyperparameters.
    workdir: checkpoint folder. If it holds a checkpoint of the same config
      and data, training resumes from it and ends with the same parameters
      as an uninterrupted run; a finished run returns at once. In a
      multi-process run only JAX process 0 reads and writes it: the others
      train without checkpoints (no host reads what another wrote; the
      steps are deterministic, so all end with the same parameters).
    progress: show a tqdm bar.

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
  num_truncated = cut
  evals = None
  if eval_texts is not None:
    eval_ids, eval_mask, cut = _prepare(
      model, eval_texts, config, context, 'eval set'
    )
    num_truncated += cut
    eval_rows = data_lib.batch_indices(
      len(eval_ids),
      config.eval_batch_size or config.batch_size,
      seed=0,
      shuffle=False,
    )
    evals = [data_lib.take_batch(eval_ids, eval_mask, r) for r in eval_rows]
  if num_truncated:
    log.warning(
      '%d examples were longer than %d tokens and were cut',
      num_truncated,
      train_ids.shape[1],
    )

  steps_per_epoch = data_lib.num_batches(
    len(train_ids), config.batch_size, drop_remainder=config.drop_remainder
  )
  if steps_per_epoch == 0:
    raise LeakjaxError(
      f'the training set has {len(train_ids)} examples, fewer than one'
      f' batch of {config.batch_size} with drop_remainder',
      'lower batch_size or set drop_remainder=False',
    )
  total_steps = config.num_steps or config.num_epochs * steps_per_epoch
  optimizer = make_optimizer(config, total_steps)
  schedule = learning_rate_schedule(config, total_steps)
  fingerprint = _fingerprint(
    train_ids,
    train_mask,
    *([eval_ids, eval_mask] if eval_texts is not None else []),
  )

  if jax.process_index() != 0:
    workdir = None  # only process 0 checkpoints (see the docstring)
  workdir = Path(workdir) if workdir is not None else None
  checkpoint = _find_checkpoint(workdir) if workdir is not None else None
  key = jax.random.key(config.seed)
  if checkpoint is not None:
    params, opt_state, best_params, state = _read_checkpoint(
      checkpoint, params, optimizer, config, fingerprint
    )
    key = jax.random.wrap_key_data(np.asarray(state['rng'], np.uint32))
    log.info('resuming from %s at step %d', checkpoint, state['step'])
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
    _jitted_train_step, model, _optimizer_settings(config), total_steps
  )
  eval_fn = functools.partial(_jitted_eval_step, model)
  keep_best = evals is not None and config.restore_best

  def run_eval():
    """Evaluates `params`; updates best / patience; True if stopping."""
    nonlocal best_params
    metrics = _evaluate(eval_fn, params, evals)
    step = state['step']
    state['history'].append(
      {
        'step': step,
        'epoch': step / steps_per_epoch,
        'eval_loss': metrics['loss'],
        'eval_perplexity': metrics['perplexity'],
      }
    )
    best = state['best']
    if best is None or metrics['loss'] < best['loss']:
      state['best'] = {
        'step': step,
        'loss': metrics['loss'],
        'perplexity': metrics['perplexity'],
      }
      state['evals_without_improvement'] = 0
      if keep_best:  # a copy: the next step donates `params`
        best_params = jax.tree.map(jnp.copy, params)
    else:
      state['evals_without_improvement'] += 1
    patience = config.early_stopping_patience
    return bool(patience) and state['evals_without_improvement'] >= patience

  if evals is not None and checkpoint is None:
    run_eval()  # the starting point, which early stopping may keep

  window = _Window(schedule)
  bar = _progress_bar(progress, total_steps, start_step)
  epoch_rows, epoch_of_rows = [], -1
  pending = None  # the previous step's metrics, read one step late
  try:
    while state['step'] < total_steps and not state['finished']:
      step = state['step']
      epoch, offset = divmod(step, steps_per_epoch)
      if epoch != epoch_of_rows:
        epoch_rows = data_lib.batch_indices(
          len(train_ids),
          config.batch_size,
          seed=config.seed,
          epoch=epoch,
          shuffle=config.shuffle,
          drop_remainder=config.drop_remainder,
        )
        epoch_of_rows = epoch
      batch = data_lib.take_batch(train_ids, train_mask, epoch_rows[offset])
      params, opt_state, metrics = step_fn(
        params, opt_state, batch, key, np.int32(step)
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
      do_eval = evals is not None and (do_eval or done)
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
        row = window.row(step, steps_per_epoch)
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
            'early stopping at step %d; the best eval loss was at step %d',
            step,
            state['best']['step'],
          )
        ppl = state['history'][-1]['eval_perplexity']
        bar.set_postfix(
          loss=f'{window.last_loss:.4f}', eval_ppl=f'{ppl:.4g}', refresh=False
        )
      if do_checkpoint and not state['finished']:
        _write_checkpoint(workdir, model, params, opt_state, best_params, state)
  finally:
    bar.close()
  if pending is not None:
    window.add(*pending)

  ran = state['step'] > start_step
  state['finished'] = True
  if workdir is not None and ran:
    _write_checkpoint(workdir, model, params, opt_state, best_params, state)
  final = best_params if keep_best and best_params is not None else params
  if workdir is not None and (ran or not (workdir / 'model').is_dir()):
    _save_directory(model, final, workdir / 'model')
  return TrainResult(
    model=model,
    params=final,
    history=list(state['history']),
    best_eval=state['best'],
    step=state['step'],
    start_step=start_step,
    stopped_early=state['stopped_early'],
    num_truncated=num_truncated,
  )


class _Window:
  """Training metrics since the last history row; checks them for NaN."""

  def __init__(self, schedule):
    self._schedule = schedule
    self._rows: list[tuple[int, float, float, float]] = []
    self._since = time.perf_counter()
    self.last_loss = math.nan

  def add(self, step: int, metrics) -> None:
    m = jax.device_get(metrics)
    loss, grad_norm = float(m['loss']), float(m['grad_norm'])
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      what = 'loss' if not math.isfinite(loss) else 'gradient norm'
      value = loss if what == 'loss' else grad_norm
      raise LeakjaxError(
        f'the training {what} is {value} at step {step} (learning rate'
        f' {float(self._schedule(step - 1)):.3g})',
        'lower the learning rate (or set grad_clip_norm) and restart',
      )
    self._rows.append((step, loss, grad_norm, float(m['tokens'])))
    self.last_loss = loss

  def row(self, step: int, steps_per_epoch: int) -> dict[str, float]:
    """The history row of the steps added since the last call."""
    _, losses, norms, tokens = (
      np.asarray(c, np.float64) for c in zip(*self._rows, strict=True)
    )
    now = time.perf_counter()
    row = {
      'step': step,
      'epoch': step / steps_per_epoch,
      # Token-weighted, like the loss of one big batch.
      'loss': float((losses * tokens).sum() / max(tokens.sum(), 1.0)),
      'grad_norm': float(norms.mean()),
      'learning_rate': float(self._schedule(step - 1)),
      'steps_per_second': len(self._rows) / max(now - self._since, 1e-9),
    }
    self._rows, self._since = [], now
    return row


def _progress_bar(enabled: bool, total: int, initial: int):
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

  return tqdm(
    total=total,
    initial=initial,
    disable=not enabled,
    unit='step',
    desc='train',
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


def _fingerprint(*arrays: np.ndarray) -> str:
  digest = hashlib.sha256()
  for a in arrays:
    digest.update(str(a.shape).encode())
    digest.update(np.ascontiguousarray(a).tobytes())
  return digest.hexdigest()[:32]


def _config_dict(config: TrainConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


# -------------------------------------------------------------- checkpoints
_CHECKPOINT, _NEW, _OLD = 'checkpoint', 'checkpoint.new', 'checkpoint.old'
_STATE_FILE, _OPT_FILE, _BEST_DIR = (
  'train_state.json',
  'optimizer.safetensors',
  'best',
)


def _find_checkpoint(workdir: Path) -> Path | None:
  """The newest complete checkpoint folder (train_state.json comes last)."""
  for name in (_CHECKPOINT, _NEW, _OLD):  # see _write_checkpoint
    if (workdir / name / _STATE_FILE).is_file():
      return workdir / name
  return None


def _save_directory(
  model: Model, params: PyTree, directory: Path, extra=None
) -> None:
  """`leakjax.models.save` into `directory`, replacing it atomically.

  Writes a sibling `<name>.new` folder, then swaps it in with two renames;
  a crash between them leaves `<name>.old` (read by `_find_checkpoint`).
  """
  from leakjax import models  # pylint: disable=g-import-not-at-top

  new = directory.with_name(directory.name + '.new')
  old = directory.with_name(directory.name + '.old')
  shutil.rmtree(new, ignore_errors=True)
  new.mkdir(parents=True)
  models.save(model, params, new)
  if extra is not None:
    extra(new)
  shutil.rmtree(old, ignore_errors=True)
  if directory.exists():
    os.replace(directory, old)
  os.replace(new, directory)
  shutil.rmtree(old, ignore_errors=True)


def _write_checkpoint(
  workdir: Path,
  model: Model,
  params,
  opt_state,
  best_params,
  state: dict[str, Any],
) -> None:
  def write_rest(folder: Path) -> None:
    best = state['best']
    if (
      best_params is not None
      and best is not None
      and (best['step'] != state['step'])
    ):
      from leakjax import models  # pylint: disable=g-import-not-at-top

      models.save(model, best_params, folder / _BEST_DIR)
    save_pytree(folder / _OPT_FILE, opt_state)
    # Last: its presence marks the folder complete.
    atomic_write_text(folder / _STATE_FILE, json.dumps(state, indent=1))

  _save_directory(model, params, workdir / _CHECKPOINT, extra=write_rest)


def _read_params(directory: Path, template: PyTree, what: str) -> PyTree:
  """The params saved in `directory`, in the structure and dtypes of
  `template`."""
  from leakjax import models  # pylint: disable=g-import-not-at-top

  _, loaded = models.load(directory, dtype=_params_dtype(template))
  return unflatten_pytree(flatten_pytree(loaded), template, what)


def _params_dtype(params):
  leaves = [
    x for x in jax.tree.leaves(params) if jnp.issubdtype(x.dtype, jnp.floating)
  ]
  return leaves[0].dtype if leaves else None


def _read_checkpoint(
  folder: Path,
  template: PyTree,
  optimizer,
  config: TrainConfig,
  fingerprint: str,
):
  """(params, opt_state, best_params, state) of a checkpoint folder; params
  take the structure and dtypes of `template`."""
  try:
    state = json.loads((folder / _STATE_FILE).read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise LeakjaxError(
      f'cannot read {folder / _STATE_FILE}: {e}',
      'delete the checkpoint folder to start over',
    ) from None
  if state.get('version') != _STATE_VERSION:
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
      f'{folder} holds a run on different data',
      'use a new workdir or delete the old one',
    )
  params = _read_params(folder, template, f'checkpoint {folder}')
  opt_state = load_pytree(
    folder / _OPT_FILE,
    jax.eval_shape(optimizer.init, params),
    what=f'optimizer state {folder / _OPT_FILE}',
  )
  best_params = None
  best = state['best']
  if best is not None and config.restore_best:
    if best['step'] == state['step']:
      best_params = jax.tree.map(jnp.copy, params)
    else:
      best_params = _read_params(
        folder / _BEST_DIR, template, f'checkpoint {folder / _BEST_DIR}'
      )
  return params, opt_state, best_params, state


__all__ = [
  'TrainConfig',
  'TrainResult',
  'make_optimizer',
  'learning_rate_schedule',
  'train_step',
  'eval_step',
  'evaluate',
  'train',
  'OPTIMIZERS',
  'SCHEDULES',
]
