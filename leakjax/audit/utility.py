"""What a defense costs: held-out perplexity after the same fine-tuning with
and without it.

Every defense fine-tunes the same model on the same sentences for the same
steps (AdamW, linear decay, FILM Sec. 6.1), its defense on every step's
gradient as a defended federated client's would be
(:func:`leakjax.train.train`'s `defense`), once per seed; the held-out
sentences (never attacked nor trained on) give the perplexity before and
after. The cost of a defense is its perplexity after over the undefended
one's, seed by seed.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from leakjax import train as train_lib
from leakjax.audit import client
from leakjax.audit.config import AuditConfig


def train_config(cfg: AuditConfig, seed: int) -> train_lib.TrainConfig:
  """The fine-tuning of every defense: `finetune_steps` steps, evaluated
  at the start and the end, the last parameters kept."""
  steps = cfg.finetune_steps
  return train_lib.TrainConfig(
    learning_rate=cfg.finetune_learning_rate,
    batch_size=cfg.finetune_batch_size,
    num_steps=steps,
    max_length=cfg.max_tokens + 1,
    seed=seed,
    log_every=max(1, steps),
    eval_every=max(1, steps),
    early_stopping_patience=None,
    restore_best=False,
  )


def fine_tune(
  model,
  params,
  train_texts: Sequence[str],
  heldout_texts: Sequence[str],
  defense_spec: str,
  cfg: AuditConfig,
  seed: int,
) -> tuple[Any, dict[str, Any]]:
  """One fine-tuning run under `defense_spec`: `(params, row)`, the row
  holding the held-out perplexity before and after."""
  defense, sigma = client.make_defense(
    model, defense_spec, cfg, num_train=len(train_texts)
  )
  start = time.perf_counter()
  result = train_lib.train(
    model,
    params,
    list(train_texts),
    list(heldout_texts),
    train_config(cfg, seed),
    progress=False,
    defense=None if defense_spec == 'none' else defense,
  )
  evals = [h for h in result.history if 'eval_perplexity' in h]
  row = {
    'kind': 'utility',
    'defense': defense_spec,
    'seed': seed,
    'ppl_before': float(evals[0]['eval_perplexity']),
    'ppl_after': float(evals[-1]['eval_perplexity']),
    'steps': int(result.step),
    'sigma': sigma,
    'seconds': time.perf_counter() - start,
  }
  return result.params, row


__all__ = ['fine_tune', 'train_config']
