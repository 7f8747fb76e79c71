"""Language-model fine-tuning of any leakjax model on texts: :func:`train`.

:class:`LanguageModelLoss`, :func:`train_step`, :func:`eval_step` and
:func:`evaluate` are its pure pieces; :func:`train` tokenizes, batches and
calls :func:`leakjax.train.fit`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import math
import os
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from leakjax import data as data_lib
from leakjax import io as io_lib
from leakjax import runtime
from leakjax._jit import jitted
from leakjax.errors import LeakjaxError, check_token_ids
from leakjax.models.protocol import Model, PyTree, lm_loss
from leakjax.train.checkpoint import (
  _is_complete,
  _save_directory,
  data_fingerprint,
)
from leakjax.train.config import TrainConfig
from leakjax.train.loop import FitResult, fit
from leakjax.train.steps import (
  _FIT_STEP_JIT,
  Batch,
  _settings_fit_step,
  fit_step,
)

log = logging.getLogger(__name__)


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


def train(
  model: Model,
  params: PyTree,
  train_texts: Sequence[str] | tuple[np.ndarray, np.ndarray],
  eval_texts: Sequence[str] | tuple[np.ndarray, np.ndarray] | None = None,
  config: TrainConfig = TrainConfig(),  # noqa: B008 (frozen)
  *,
  workdir: str | os.PathLike | None = None,
  progress: bool = True,
  defense: Any = None,
  donate: bool = False,
) -> TrainResult:
  """Fine-tunes `params` of `model` on `train_texts`.

  :func:`fit` with :class:`LanguageModelLoss`, fixed-width token batches
  and the token-weighted eval loss.

  Args:
    model: any leakjax Model; texts are tokenized with `model.tokenizer`.
    params: the starting parameters (not modified, unless `donate`; training
      works on a copy).
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
    donate: hand `params` over to training (:func:`fit`'s `donate`): they
      are deleted, and the model holds one copy of the weights less while
      it trains.

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
    eval_fn = functools.partial(jitted(_model_eval_step, **_EVAL_JIT), model)

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
    donate=donate,
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
  step = functools.partial(jitted(_model_eval_step, **_EVAL_JIT), model)
  return _evaluate(step, params, batches)


# How `fit_language_model` and `evaluate` jit `_model_eval_step`.
_EVAL_JIT = dict(static_argnames=('model',))


def _model_eval_step(model: Model, params: PyTree, batch: Batch):
  # `eval_step` is looked up when tracing, so tests can wrap it.
  return eval_step(model, params, batch)


def release_programs() -> None:
  """Drops the compiled training and evaluation steps, nothing else.

  :func:`fit`'s step and :func:`evaluate`'s hold a model's gradient and
  optimizer programs (tens of MB of host memory for a 135M-parameter
  model). A runner calls this when training is over and those programs
  will not run again, so that they do not add up under the next stage's
  peak. Unlike :func:`leakjax.runtime.release_programs` it leaves every
  other jitted function's programs in place: a caller's own, and the
  attacks' of an earlier run in the same process, which would otherwise
  be traced again (and compiled again, or read back from the persistent
  cache).
  """
  jitted(_settings_fit_step, **_FIT_STEP_JIT).clear_cache()
  jitted(_model_eval_step, **_EVAL_JIT).clear_cache()
  runtime.return_freed_memory()


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
