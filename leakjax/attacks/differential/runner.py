r"""The canary experiment of Zanella-Beguelin et al. (CCS 2020), Sec. 4.

Read top-down: :class:`DifferentialConfig` (everything that determines the
results), then :func:`run`, the loop over every (M, M') pair:

1. Split a corpus into sentences: the training set D, a held-out set (the
   perplexity column of Table 1) and a pool D_extra (RQ1)
   (:mod:`~leakjax.attacks.differential.corpus`).
2. Build 5-word canaries whose word frequencies follow the paper's profiles
   (:mod:`leakjax.attacks.differential.canaries`) and check that they never
   occur in D.
3. Train M on D; for every insertion count k make M' by
   * retraining: a fresh model trained on D' = D + k copies of the canary
     (Sec. 4.2, "Retraining");
   * continued training: M trained further on D' \ D, the k copies
     (Sec. 4.2, "Continued Training"), optionally mixed with D_extra (RQ1)
   (:mod:`~leakjax.attacks.differential.training`).
4. For each (M, M') compute the canary's DS and relative DS (Definition
   3.1), run Algorithm 1 over the whole vocabulary with the width halved at
   each step, and bound the canary's differential rank (Prop. 3.3); with
   `prefix_lengths` also with the canary's first words given (RQ3)
   (:mod:`~leakjax.attacks.differential.evaluation`).

In retraining, the four canary types share one D' per k (each canary
inserted k times), which quarters the training cost; ranks are reported
both counting every found sequence (`dr`) and ignoring sequences within
Hamming distance 2 of another planted canary (`dr_own`).

The runner contract (shared with the FILM and DAGER runners):
`run(config, writer)`. The workdir is the writer's (`writer.workdir`), not
a config field: config.json holds only what determines the results, so the
same config in another folder is the same run. M and every M' are trained
under `<workdir>/models`. The caller opens the writer (config.json,
results.jsonl; a re-run resumes), best after
:func:`~leakjax.attacks.differential.corpus.prepare_corpus` has checked the
corpus, so that a bad corpus never touches the workdir; tables and plots
are the caller's (`experiments/differential_report.py`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from absl import logging

from leakjax import io, models
from leakjax import presets as presets_lib
from leakjax import train as train_lib
from leakjax.attacks.differential.canaries import (
  CANARY_LENGTH,
  PROFILES,
  Canary,
  make_canaries,
)
from leakjax.attacks.differential.corpus import PreparedCorpus, prepare_corpus
from leakjax.attacks.differential.evaluation import Attack, evaluate_pair
from leakjax.attacks.differential.score import SCORES
from leakjax.attacks.differential.training import Trainer, plan_snapshots
from leakjax.errors import LeakjaxError, check_positive
from leakjax.models import num_params as count_params

METHODS = ('retrain', 'continued', 'continued_extra')
MODELS = ('ptb_small', 'medium_512', 'wikitext_512')


@dataclasses.dataclass(frozen=True)
class DifferentialConfig:
  r"""Everything that determines the experiment's results.

  Attributes:
    data: the corpus (a named data set such as wikitext-2-valid, a .txt
      with one paragraph per line, or any corpus `leakjax.data.load_corpus`
      reads; WikiText headings ` = Title = ` are dropped).
    data_column: the text field of the corpus's rows (.json objects, .tsv,
      hub rows); None: the default field (see `leakjax.data.load_corpus`).
    data_label: keep only the rows with FIELD=VALUE[,VALUE...], e.g.
      `Label=ham`; None: every row.
    max_sentences: use at most this many sentences (after shuffling); None
      for all.
    eval_fraction: fraction of the sentences held out for perplexity.
    extra_fraction: fraction of the sentences set aside as the D_extra pool
      (RQ1).
    vocab_size: words in the vocabulary (specials included), = |T|.
    model: LSTM shape: 'ptb_small' (Sec. 4.1 PTB), 'medium_512',
      'wikitext_512'.
    dtype: float32 or bfloat16: the differential score and rank search run
      on both snapshots cast to it (:func:`leakjax.models.cast`), as a
      provider serving them in it would. Decision: M and every M' are
      trained in float32 (the setup, not the attack). bfloat16 is for accelerators (`reports/dtype/`).
    embed_dim: if > 0, overrides the model's embedding width.
    hidden_size: if > 0, overrides the model's LSTM width.
    num_layers: if > 0, overrides the model's layer count.
    row_width: training rows hold whole sentences packed up to this width.
    batch_size: rows per step of Adam training of M and the retrained M'.
    learning_rate: Adam peak rate of M and the retrained M'.
    epochs: epochs of M and the retrained M'.
    continue_optimizer: optimizer of continued training on D' \ D (one of
      leakjax.train.OPTIMIZERS), at a constant rate, one sentence per row,
      so that k sets the number of update steps (a batch of k identical rows
      would give the gradient of one row, whatever k). Default: plain SGD
      at 0.1. (Adam at M's peak rate hardly moves the canary's rare words;
      SGD at 1, Zaremba et al.'s PTB rate, memorizes it but ruins the
      snapshot's perplexity: see reports/differential/README.md.)
    continue_epochs: epochs of continued training on D' \ D.
    continue_learning_rate: the constant rate of continued training.
    continue_batch_size: sentences per step of continued training.
    extra_sentences: size of D_extra mixed into 'continued_extra' (RQ1).
    canary_types: which profiles to insert (keys of canaries.PROFILES).
    canaries: explicit phrases, one per canary type, checked against the
      profile; empty: words drawn at random from the quintiles.
    insertions: the k values.
    retrain_insertions: the k values retrained (the costly part); empty:
      all of `insertions`.
    methods: subset of METHODS (retrain, continued, continued_extra).
    prefix_lengths: RQ3, canary words given to the adversary (0 = none).
    min_width: smallest beam width (the final width; > 1000 so that
      DR > 1000, a gray cell of Table 1, can be certified).
    num_groups: group beam search groups (Sec. 3.2).
    score: what the beam search ranks by, 'ds' or 'rel_ds'.
    top: found sequences stored per search.
    seed: data split, canary words, initializations, data order.
    preset: the named preset the config started from
      (:mod:`leakjax.attacks.differential.presets`), recorded; None: none. Not
      compared: two configs whose other fields agree give the same run.
    split: which split the canaries are, recorded
      (:func:`leakjax.presets.split_record`): dev (a setting was chosen
      with them), test (written before any run, nothing chosen with them)
      or None.
  """

  data: str
  data_column: str | None = None
  data_label: str | None = None
  max_sentences: int | None = None
  eval_fraction: float = 0.1
  extra_fraction: float = 0.1
  vocab_size: int = 10_000
  model: str = 'ptb_small'
  dtype: str = 'float32'
  embed_dim: int = 0
  hidden_size: int = 0
  num_layers: int = 0
  row_width: int = 64
  batch_size: int = 20
  learning_rate: float = 3e-3
  epochs: int = 4
  continue_optimizer: str = 'sgd'
  continue_epochs: int = 2
  continue_learning_rate: float = 0.1
  continue_batch_size: int = 4
  extra_sentences: int = 500
  canary_types: tuple[str, ...] = tuple(PROFILES)
  canaries: tuple[str, ...] = ()
  insertions: tuple[int, ...] = (2, 8, 16)
  retrain_insertions: tuple[int, ...] = ()
  methods: tuple[str, ...] = ('retrain', 'continued')
  prefix_lengths: tuple[int, ...] = (0, 2)
  min_width: int = 1024
  num_groups: int = 1
  score: str = 'ds'
  top: int = 10
  seed: int = 0
  preset: str | None = dataclasses.field(default=None, compare=False)
  split: str | None = presets_lib.split_record()

  def __post_init__(self):
    models.parameter_dtype(self.dtype)
    presets_lib.check_split(self.split)
    unknown = [c for c in self.canary_types if c not in PROFILES]
    if unknown or not self.canary_types:
      raise LeakjaxError(
        f'unknown canary types {unknown}', f'use some of {", ".join(PROFILES)}'
      )
    if self.canaries and len(self.canaries) != len(self.canary_types):
      raise LeakjaxError(
        f'{len(self.canaries)} canary phrases for'
        f' {len(self.canary_types)} canary types',
        'give one phrase per --canary_types entry, in the same order',
      )
    bad = [m for m in self.methods if m not in METHODS]
    if bad or not self.methods:
      raise LeakjaxError(
        f'unknown methods {bad}', f'use some of {", ".join(METHODS)}'
      )
    if self.model not in MODELS:
      raise LeakjaxError(
        f'unknown model {self.model!r}', f'use one of {", ".join(MODELS)}'
      )
    if self.continue_optimizer not in train_lib.OPTIMIZERS:
      raise LeakjaxError(
        f'unknown continue_optimizer {self.continue_optimizer!r}',
        f'use one of {", ".join(train_lib.OPTIMIZERS)}',
      )
    if any(k < 1 for k in self.insertions) or not self.insertions:
      raise LeakjaxError(f'insertions must be positive, got {self.insertions}')
    if any(not 0 <= p < CANARY_LENGTH for p in self.prefix_lengths):
      raise LeakjaxError(
        f'prefix lengths must be in [0, {CANARY_LENGTH}),'
        f' got {self.prefix_lengths}'
      )
    if not set(self.retrain_insertions) <= set(self.insertions):
      raise LeakjaxError('retrain_insertions must be some of insertions')
    if self.score not in SCORES:
      raise LeakjaxError(f'score must be one of {SCORES}')
    if not 0 <= self.eval_fraction + self.extra_fraction < 1:
      raise LeakjaxError('eval_fraction + extra_fraction must be in [0, 1)')
    # <UNK> and <S> take two ids: three is the smallest vocabulary with a word.
    check_positive(self, 'vocab_size', minimum=3)
    check_positive(
      self,
      'row_width',
      'batch_size',
      'epochs',
      'continue_epochs',
      'continue_batch_size',
      'min_width',
      'num_groups',
      'top',
    )
    # 0 = the --model preset's size.
    check_positive(
      self,
      'embed_dim',
      'hidden_size',
      'num_layers',
      'extra_sentences',
      'seed',
      minimum=0,
    )
    if self.max_sentences is not None:
      check_positive(self, 'max_sentences')


def run(
  config: DifferentialConfig,
  writer: io.ExperimentWriter,
  *,
  corpus: PreparedCorpus | None = None,
  progress: bool = True,
  mesh=None,
) -> DifferentialRun:
  """Runs everything (resuming from the writer's rows); returns the results.

  Writes one results.jsonl row per (M', canary, prefix); the summary and
  tables are the caller's.

  Args:
    config: the experiment.
    writer: the run's writer (opened on the workdir with `config` and
      :func:`writer_inputs`); rows it already holds are not recomputed,
      and M and every M' are trained under `writer.workdir / 'models'`.
    corpus: `prepare_corpus(config)`, when the caller has it already
      (it read the corpus to check it before opening the writer); None:
      read here.
    progress: show the training progress bars.
    mesh: `--mesh` (see :func:`leakjax.sharding.data_mesh`): shards DS
      scoring and the DR search; it does not change the results, so it is
      not part of `config`.

  Returns:
    The rows (`writer.results`) and the facts the report needs.
  """
  data = corpus if corpus is not None else prepare_corpus(config)
  canaries = make_canaries(
    data.tokenizer,
    data.corpus.train,
    canary_types=config.canary_types,
    phrases=config.canaries,
    seed=config.seed,
  )
  for c in canaries:
    logging.info(
      'canary %s: %r quintiles %s counts in D %s',
      c.kind,
      c.text,
      c.quintiles,
      c.counts,
    )
  train_words = sum(len(data.tokenizer.split(s)) for s in data.corpus.train)
  trainer = Trainer.create(
    config, data, writer.workdir / 'models', progress=progress
  )
  start = time.perf_counter()
  params, base_ppl = trainer.train_base()
  base_seconds = time.perf_counter() - start
  served, served_params = models.cast(trainer.model, params, config.dtype)
  attack = Attack(served, config, mesh)
  logging.info(
    'M: perplexity %.1f (%d parameters), %.0f s',
    base_ppl,
    count_params(params),
    base_seconds,
  )
  plan = list(plan_snapshots(config, canaries))
  counter = io.Progress(len(plan))
  for method, k, group in plan:
    key = dict(method=method, k=k, planted=[c.kind for c in group])
    if all(
      writer.done(**key, canary=c.kind, prefix=p)
      for c in group
      for p in config.prefix_lengths
    ):
      counter.skipped()
      continue
    start = time.perf_counter()
    params_prime, ppl = trainer.train_prime(params, method, k, group)
    train_s = time.perf_counter() - start
    rows = evaluate_pair(
      attack,
      served_params,
      models.cast(trainer.model, params_prime, config.dtype)[1],
      group,
      group,
      config.prefix_lengths,
      data.tokenizer,
      config.top,
    )
    counter.computed()
    for row in rows:
      writer.add_result(
        {**key, **row, 'perplexity': ppl, 'train_seconds': train_s}
      )
      logging.info(
        '[%s] %s k=%d %s prefix=%d: DS %.3f rel %.3g DR >= %d%s',
        counter.describe(),
        method,
        k,
        row['canary'],
        row['prefix'],
        row['ds'],
        row['rel_ds'],
        row['dr'],
        ' (found)' if row.get('found') else '',
      )

  return DifferentialRun(
    writer=writer,
    canaries=canaries,
    base_ppl=base_ppl,
    train_words=train_words,
    num_params=count_params(params),
  )


@dataclasses.dataclass
class DifferentialRun:
  """What :func:`run` leaves for the report."""

  writer: io.ExperimentWriter  # the workdir's writer; `.results`: all rows
  canaries: list[Canary]  # the planted canaries, one per canary type
  base_ppl: float  # M's held-out perplexity
  train_words: int  # words in D
  num_params: int  # parameters of the LSTM

  @property
  def results(self) -> list[dict[str, Any]]:
    """One row per (method, k, canary, prefix), as in results.jsonl."""
    return self.writer.results


def writer_inputs(
  config: DifferentialConfig, corpus: PreparedCorpus
) -> dict[str, Any]:
  """The run's inputs by name, for :class:`leakjax.io.ExperimentWriter`:
  the corpus path and its sentences (their sha256 go to provenance.json)."""
  return {'data': config.data, 'texts': list(corpus.sentences)}


__all__ = [
  'METHODS',
  'MODELS',
  'DifferentialConfig',
  'DifferentialRun',
  'run',
  'writer_inputs',
]
