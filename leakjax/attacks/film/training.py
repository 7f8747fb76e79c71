"""FILM's training runs: θ^t for the attack, and what each defense costs.

* :func:`fine_tune` -- `train_steps` steps of fine-tuning on the client's
  training sentences (FILM Sec. 6.1: AdamW, linear decay, early stopping
  on the held-out loss), giving the attacked θ^t;
* :func:`utility` -- the utility side of Tables 4-5: one training run per
  defense and the held-out perplexity of each (`--mode=utility`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

from absl import logging

from leakjax import data as data_lib
from leakjax import io
from leakjax import train as train_lib
from leakjax.attacks.film import client

if TYPE_CHECKING:
  from leakjax.attacks.film.runner import FilmConfig


def train_config(cfg: FilmConfig, **fields) -> train_lib.TrainConfig:
  """The fine-tuning settings of `cfg` (FILM Sec. 6.1: AdamW, linear decay
  from `learning_rate`), with `fields` added."""
  return train_lib.TrainConfig(
    learning_rate=cfg.learning_rate,
    batch_size=cfg.train_batch_size,
    num_steps=cfg.train_steps,
    max_length=cfg.max_tokens + 1,
    seed=cfg.seed,
    log_every=max(1, cfg.train_steps // 10),
    **fields,
  )


# Fine-tuning runs of fewer steps write no checkpoint (see fine_tune).
CHECKPOINT_MIN_STEPS = 100


def fine_tune(
  model,
  params,
  train_texts,
  eval_texts,
  cfg: FilmConfig,
  workdir,
  *,
  progress: bool = True,
) -> tuple[Any, dict[str, Any]]:
  """θ^t: `cfg.train_steps` fine-tuning steps; returns `(params, extra)`.

  Runs of at least CHECKPOINT_MIN_STEPS steps leave θ^t in
  `workdir/checkpoint/` (:func:`leakjax.train.train`), which a resumed run
  reads back instead of training again. Shorter runs write nothing: a
  resumed run trains again, and as the steps are deterministic it attacks
  the same θ^t; redoing a few dozen steps costs less than writing and
  keeping a copy of the model (reports/film_quickstart/README.md).
  """
  if cfg.train_steps < CHECKPOINT_MIN_STEPS:
    workdir = None
  tcfg = train_config(
    cfg,
    eval_every=cfg.eval_every or max(1, cfg.train_steps // 4),
    early_stopping_patience=cfg.early_stopping_patience or None,
    restore_best=cfg.attack_best,
  )
  result = train_lib.train(
    model,
    params,
    train_texts,
    eval_texts or None,
    tcfg,
    workdir=workdir,
    progress=progress,
    donate=True,  # θ^0 is not needed again: one model less in memory
  )
  extra: dict[str, Any] = {
    'trained_steps': result.step,
    'stopped_early': result.stopped_early,
  }
  if cfg.attack_best and result.best_eval:
    extra['attacked_step'] = int(result.best_eval['step'])
  if 'attacked_step' in extra:
    extra['eval_ppl'] = result.best_eval['perplexity']
  elif result.best_eval:
    evals = [h for h in result.history if 'eval_perplexity' in h]
    extra['eval_ppl'] = evals[-1]['eval_perplexity'] if evals else None
  return result.params, extra


def utility(
  model,
  params,
  train_texts: Sequence[str],
  test_texts: Sequence[str],
  cfg: FilmConfig,
  writer: io.ExperimentWriter,
  *,
  progress: bool = True,
) -> None:
  """FILM Tables 4-5, the utility side: one training run per defense.

  For each of `cfg.defenses`, θ^0 is fine-tuned for `cfg.train_steps` steps
  of `cfg.train_batch_size` sentences with every step's gradient under the
  defense (:func:`leakjax.train.train` with `defense=`; DP-SGD's σ is
  calibrated for those steps at sampling rate b/N with b the training
  batch), and the held-out split's token-weighted perplexity is recorded
  (`kind='utility'` rows), beside that of θ^0 (`defense='start'`).

  Decisions where the paper is silent (FILM Sec. 6.3 gives only "the
  average perplexity of the model across the test set"): every defense
  trains the same fixed number of steps with the same learning rate and
  data order, without early stopping, so the rows differ only by the
  defense; the held-out split is never used for model selection.
  """
  eval_batches = list(
    data_lib.batches(
      model.tokenizer,
      test_texts,
      16,
      cfg.max_tokens + 1,
      shuffle=False,
    )
  )
  if writer.done(kind='utility', defense='start') is None:
    metrics = train_lib.evaluate(model, params, eval_batches)
    writer.add_result(
      {
        'kind': 'utility',
        'defense': 'start',
        'perplexity': metrics['perplexity'],
        'test_tokens': metrics['tokens'],
      }
    )
  tcfg = train_config(cfg, checkpoint_every=max(1, cfg.train_steps // 4))
  counter = io.Progress(len(cfg.defenses))
  for spec in cfg.defenses:
    if writer.done(kind='utility', defense=spec) is not None:
      counter.skipped()
      continue
    defense, _ = client.make_defense(
      model,
      spec,
      cfg,
      num_train=len(train_texts),
      b=cfg.train_batch_size,
    )
    start = time.perf_counter()
    result = train_lib.train(
      model,
      params,
      train_texts,
      None,
      tcfg,
      workdir=writer.workdir / 'utility' / spec.replace(':', '_'),
      progress=progress,
      defense=defense,
    )
    metrics = train_lib.evaluate(model, result.params, eval_batches)
    train_loss = [h['loss'] for h in result.history if 'loss' in h]
    writer.add_result(
      {
        'kind': 'utility',
        'defense': spec,
        'perplexity': metrics['perplexity'],
        'test_tokens': metrics['tokens'],
        'steps': result.step,
        'final_train_loss': train_loss[-1] if train_loss else None,
        'noise_multiplier': defense.noise_multiplier,
        'seconds': time.perf_counter() - start,
      }
    )
    counter.computed()
    logging.info(
      '[%s] utility %s: test perplexity %.3f',
      counter.describe(),
      spec,
      metrics['perplexity'],
    )


__all__ = ['CHECKPOINT_MIN_STEPS', 'fine_tune', 'train_config', 'utility']
