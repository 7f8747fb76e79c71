"""The training loop of the library: :func:`fit`."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import data as data_lib
from leakjax import io as io_lib
from leakjax import runtime
from leakjax._jit import jitted
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import PyTree
from leakjax.train.checkpoint import (
  _STATE_VERSION,
  _checkpoint_manager,
  _config_dict,
  _read_checkpoint,
  _write_checkpoint,
)
from leakjax.train.config import TrainConfig
from leakjax.train.optimizer import learning_rate_schedule, make_optimizer
from leakjax.train.steps import (
  _FIT_STEP_JIT,
  LossFn,
  _optimizer_settings,
  _settings_fit_step,
)

log = logging.getLogger(__name__)


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


def fit(
  loss_fn: LossFn,
  params: PyTree,
  make_batch: Callable[[np.ndarray], Any],
  num_examples: int,
  config: TrainConfig = TrainConfig(),  # noqa: B008 (frozen)
  *,
  frozen: PyTree = None,
  evaluate: Callable[[PyTree], dict[str, float]] | None = None,
  workdir: str | os.PathLike | None = None,
  fingerprint: str = '',
  progress: bool = True,
  desc: str = 'train',
  donate: bool = False,
) -> FitResult:
  """Minimises `loss_fn` over `params`: the training loop of the library.

  Language-model fine-tuning (:func:`train`) and Embed Parrot
  (:func:`leakjax.attacks.inversion.embed_parrot.train`) both run here; so
  can any other loss.

  Args:
    loss_fn: a :class:`LossFn`.
    params: the starting parameters (not modified, unless `donate`; training
      works on a copy).
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
      `workdir/checkpoint/` holds orbax checkpoints (see
      :mod:`leakjax.train`). If it holds a checkpoint of the same config and
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
    donate: let the first step take over `params`' buffers instead of a
      copy of them (one model's worth of memory less while training); the
      caller's `params` are then deleted and must not be used again.

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
    if not donate:
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
    jitted(_settings_fit_step, **_FIT_STEP_JIT),
    loss_fn,
    _optimizer_settings(config),
    total_steps,
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
      if step == start_step:
        log.info(
          '%s: compiling the step (%d steps to go)', desc, total_steps - step
        )
        compiling = time.perf_counter()
      params, opt_state, metrics = step_fn(
        params, frozen, opt_state, batch, key, np.int32(step)
      )
      if step == start_step:
        log.info(
          '%s: step compiled in %.1f s', desc, time.perf_counter() - compiling
        )
        # The compiler's freed memory, before the steps' own buffers peak.
        runtime.return_freed_memory()
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
  opt_state = None  # freed: a finished run's checkpoint does not hold it
  if manager is not None:
    if ran:
      log.info('%s: writing the checkpoint of step %d', desc, state['step'])
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
