r"""M and its snapshots M' in the canary experiment (Sec. 4.2).

M is the LSTM of :func:`lstm_config` trained on D with Adam
(:func:`train_config`); every M' is one of

* retraining: a fresh model trained on D' = D + k copies of the canaries
  (Sec. 4.2, "Retraining"); the canary types share one D' per k;
* continued training: M trained further on D' \ D, the k copies
  (Sec. 4.2, "Continued Training"), optionally mixed with D_extra (RQ1).

:func:`plan_snapshots` lists them, cheapest first; a :class:`Trainer`
trains them, each in its own resumable folder under `<workdir>/models`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import jax
import numpy as np

from leakjax import data as data_lib
from leakjax import models
from leakjax import train as train_lib
from leakjax.attacks.differential.canaries import Canary, canary_copies
from leakjax.attacks.differential.corpus import PreparedCorpus, pack_rows
from leakjax.models import lstm

if TYPE_CHECKING:
  from leakjax.attacks.differential.runner import DifferentialConfig


def lstm_config(cfg: DifferentialConfig) -> lstm.LSTMConfig:
  """The LSTM of `cfg.model`, with any nonzero width/depth override."""
  base = getattr(lstm.LSTMConfig, cfg.model)(cfg.vocab_size)
  changes = {
    k: v
    for k, v in dict(
      embed_dim=cfg.embed_dim,
      hidden_size=cfg.hidden_size,
      num_layers=cfg.num_layers,
    ).items()
    if v
  }
  return dataclasses.replace(base, **changes)


def train_config(
  cfg: DifferentialConfig,
  *,
  epochs: int,
  learning_rate: float,
  seed: int,
  batch_size: int | None = None,
  optimizer: str = 'adam',
  schedule: str = 'linear',
) -> train_lib.TrainConfig:
  """The trainer's config: clipped, best-on-held-out, resumable."""
  return train_lib.TrainConfig(
    optimizer=optimizer,
    learning_rate=learning_rate,
    schedule=schedule,
    batch_size=batch_size or cfg.batch_size,
    max_length=None,
    num_epochs=epochs,
    grad_clip_norm=5.0,  # Zaremba et al.: clip 5
    restore_best=True,
    seed=seed,
    log_every=50,
    checkpoint_every=50,
  )


def fit(
  model,
  params,
  rows,
  eval_rows,
  config: train_lib.TrainConfig,
  workdir: Path,
  *,
  progress: bool,
):
  """train() with a resumable workdir; returns (params, best eval ppl)."""
  result = train_lib.train(
    model, params, rows, eval_rows, config, workdir=workdir, progress=progress
  )
  ppl = result.best_eval['perplexity'] if result.best_eval else math.nan
  return result.params, float(ppl)


def plan_snapshots(
  cfg: DifferentialConfig, canaries: Sequence[Canary]
) -> Iterator[tuple[str, int, list[Canary]]]:
  """`(method, k, canaries planted)` for every M', cheapest first.

  Retraining plants every canary type in one D' per k (and only for the k
  of `retrain_insertions`); continued training plants one canary per M'.
  """
  for method in sorted(cfg.methods, key=lambda m: m == 'retrain'):
    for k in cfg.insertions:
      if method == 'retrain':
        if k in (cfg.retrain_insertions or cfg.insertions):
          yield method, k, list(canaries)
      else:
        for c in canaries:
          yield method, k, [c]


@dataclasses.dataclass(frozen=True, eq=False)
class Trainer:
  """Trains M and every M' of one run.

  Every snapshot is the one `model` with its own params; each is trained
  in its own folder under `models_dir`, so an interrupted run resumes.
  """

  cfg: DifferentialConfig
  model: models.Model  # the LSTM (no weights), with the tokenizer of D
  model_config: lstm.LSTMConfig
  data: PreparedCorpus
  rows_eval: tuple[np.ndarray, np.ndarray]  # the packed held-out rows
  models_dir: Path
  progress: bool = True

  @classmethod
  def create(
    cls,
    cfg: DifferentialConfig,
    data: PreparedCorpus,
    models_dir: Path,
    *,
    progress: bool = True,
  ) -> Trainer:
    """The trainer of `cfg`'s LSTM on `data`."""
    model_config = lstm_config(cfg)
    return cls(
      cfg=cfg,
      model=lstm.make_model(model_config, data.tokenizer),
      model_config=model_config,
      data=data,
      rows_eval=pack_rows(
        data.tokenizer, data.corpus.eval, cfg.row_width, seed=cfg.seed
      ),
      models_dir=models_dir,
      progress=progress,
    )

  def fresh(self, seed: int):
    """Freshly initialised parameters."""
    return lstm.init_model(
      self.model_config, key=jax.random.key(seed), tokenizer=self.data.tokenizer
    )[1]

  def train_base(self) -> tuple[object, float]:
    """M on D: `(params, held-out perplexity)`."""
    cfg = self.cfg
    rows_d = pack_rows(
      self.data.tokenizer, self.data.corpus.train, cfg.row_width, seed=cfg.seed
    )
    base_cfg = train_config(
      cfg, epochs=cfg.epochs, learning_rate=cfg.learning_rate, seed=cfg.seed
    )
    return fit(
      self.model,
      self.fresh(cfg.seed),
      rows_d,
      self.rows_eval,
      base_cfg,
      self.models_dir / 'base',
      progress=self.progress,
    )

  def train_prime(
    self, params, method: str, k: int, group: Sequence[Canary]
  ) -> tuple[object, float]:
    """M' of `method` with `k` copies of each canary of `group`.

    Args:
      params: M's parameters (continued training starts from them).
      method: one of METHODS.
      k: the insertion count.
      group: the canaries planted.

    Returns:
      `(params_prime, held-out perplexity of M')`.
    """
    cfg, tokenizer, corpus = self.cfg, self.data.tokenizer, self.data.corpus
    name = f'{method}_k{k}' + (
      '' if method == 'retrain' else f'_{group[0].kind}'
    )
    if method == 'retrain':  # fresh init and data order on D'
      seed = cfg.seed + 1000 + k
      rows = pack_rows(
        tokenizer,
        corpus.train + canary_copies(group, k),
        cfg.row_width,
        seed=seed,
      )
      tc = train_config(
        cfg, epochs=cfg.epochs, learning_rate=cfg.learning_rate, seed=seed
      )
      return fit(
        self.model,
        self.fresh(seed),
        rows,
        self.rows_eval,
        tc,
        self.models_dir / name,
        progress=self.progress,
      )
    update = canary_copies(group, k)
    if method == 'continued_extra':
      update += corpus.extra[: cfg.extra_sentences]
    ids, mask, _ = data_lib.encode_corpus(
      tokenizer, update, cfg.row_width, add_bos=True
    )
    tc = train_config(
      cfg,
      epochs=cfg.continue_epochs,
      learning_rate=cfg.continue_learning_rate,
      optimizer=cfg.continue_optimizer,
      schedule='constant',
      seed=cfg.seed + k,
      batch_size=min(cfg.continue_batch_size, len(ids)),
    )
    rows = (ids, mask)
    params_prime, _ = fit(
      self.model,
      params,
      rows,
      None,
      tc,
      self.models_dir / name,
      progress=self.progress,
    )
    ppl = train_lib.evaluate(
      self.model,
      params_prime,
      [
        data_lib.take_batch(*self.rows_eval, r)
        for r in data_lib.batch_indices(
          len(self.rows_eval[0]), cfg.batch_size, seed=0, shuffle=False
        )
      ],
    )
    return params_prime, float(ppl['perplexity'])
