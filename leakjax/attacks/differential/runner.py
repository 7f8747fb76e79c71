r"""The canary experiment of Zanella-Beguelin et al. (CCS 2020), Sec. 4.

Read top-down: :class:`DifferentialConfig` (everything that determines the
results), the corpus (sentences, the train/held-out/D_extra split, packed
training rows), the LSTM snapshots, the attack (:class:`Attack`: the jitted
DS scoring and Algorithm 1 search, optionally sharded), the Prop. 3.3 bounds
(:func:`dr_bounds`) and :func:`run`, the loop over every (M, M') pair:

1. Split a corpus into sentences: the training set D, a held-out set (the
   perplexity column of Table 1) and a pool D_extra (RQ1).
2. Build 5-word canaries whose word frequencies follow the paper's profiles
   (:mod:`leakjax.attacks.differential.canaries`) and check that they never
   occur in D.
3. Train M on D; for every insertion count k make M' by
   * retraining: a fresh model trained on D' = D + k copies of the canary
     (Sec. 4.2, "Retraining");
   * continued training: M trained further on D' \ D, the k copies
     (Sec. 4.2, "Continued Training"), optionally mixed with D_extra (RQ1).
4. For each (M, M') compute the canary's DS and relative DS (Definition
   3.1), run Algorithm 1 over the whole vocabulary with the width halved at
   each step, and bound the canary's differential rank (Prop. 3.3); with
   `prefix_lengths` also with the canary's first words given (RQ3).

In retraining, the four canary types share one D' per k (each canary
inserted k times), which quarters the training cost; ranks are reported
both counting every found sequence (`dr`) and ignoring sequences within
Hamming distance 2 of another planted canary (`dr_own`).

Results go to `workdir` through one :class:`leakjax.io.ExperimentWriter`
(config.json, results.jsonl; a re-run resumes); tables and plots are the
caller's (`experiments/differential_report.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import io, sharding
from leakjax import train as train_lib
from leakjax.attacks.differential.canaries import (
  CANARY_LENGTH,
  PROFILES,
  Canary,
  canary_copies,
  hamming_close,
  make_canaries,
)
from leakjax.attacks.differential.rank_search import (
  SearchResult,
  halving_widths,
  rank_beam_search,
  ranked,
)
from leakjax.attacks.differential.score import (
  SCORES,
  differential_rank_lower_bound,
  differential_score,
)
from leakjax.errors import LeakjaxError, check_positive
from leakjax.models import lstm
from leakjax.models import num_params as count_params
from leakjax.tokenization import WordTokenizer

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
      SGD at 1, Zaremba et al.'s PTB rate, memorizes it but multiplies M's
      perplexity by 30 or more.)
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
  """

  data: str
  data_column: str | None = None
  data_label: str | None = None
  max_sentences: int | None = None
  eval_fraction: float = 0.1
  extra_fraction: float = 0.1
  vocab_size: int = 10_000
  model: str = 'ptb_small'
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

  def __post_init__(self):
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


# ------------------------------------------------------------------- data
@dataclasses.dataclass
class Corpus:
  """The sentences of one run, split once."""

  train: list[str]  # D
  eval: list[str]  # held out, for perplexity
  extra: list[str]  # the D_extra pool (RQ1)


def read_sentences(
  path: str,
  *,
  max_sentences: int | None,
  seed: int,
  column: str | None = None,
  label: str | None = None,
) -> list[str]:
  """Sentences of a paragraph-per-line corpus, shuffled (seeded).

  WikiText headings (` = Title = `) are dropped and its `<unk>` marker
  becomes the word `unk` (a word of the vocabulary like any other).
  """
  paragraphs = data_lib.load_corpus(path, column=column, label=label)
  sentences = []
  for p in paragraphs:
    if re.fullmatch(r'=.*=', p):  # WikiText heading
      continue
    sentences.extend(
      s.replace('<unk>', 'unk') for s in data_lib.split_sentences(p)
    )
  if not sentences:
    raise LeakjaxError(f'{path} has no sentences', 'pass a text corpus')
  order = np.random.default_rng([seed, 1]).permutation(len(sentences))
  sentences = [sentences[i] for i in order]
  return sentences[:max_sentences] if max_sentences else sentences


def split_corpus(sentences: Sequence[str], cfg: DifferentialConfig) -> Corpus:
  """Held-out sentences first, then D_extra, the rest is D."""
  n = len(sentences)
  num_eval = max(1, round(n * cfg.eval_fraction))
  num_extra = round(n * cfg.extra_fraction)
  return Corpus(
    eval=list(sentences[:num_eval]),
    extra=list(sentences[num_eval : num_eval + num_extra]),
    train=list(sentences[num_eval + num_extra :]),
  )


def pack_rows(
  tokenizer: WordTokenizer, sentences: Sequence[str], width: int, *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Packs whole sentences (`<S>` + words) into rows of `width` tokens.

  Best-fit decreasing: each sentence goes to the fullest row it fits, so
  rows are ~all real tokens (an LSTM reads rows left to right, so a packed
  sentence sees the previous one as context, as in PTB-style training on a
  continuous stream). Sentences longer than `width` are cut.

  Returns:
    `(ids, mask)` int32 `[rows, width]`, rows shuffled with `seed`.
  """
  seqs = [([tokenizer.bos_id] + tokenizer.encode(s))[:width] for s in sentences]
  seqs = [s for s in seqs if len(s) >= 2]
  if not seqs:
    raise LeakjaxError('no sentence has a word', 'check the corpus')
  seqs.sort(key=len, reverse=True)
  rows: list[list[int]] = []
  by_room: list[list[int]] = [[] for _ in range(width + 1)]  # room -> rows
  for s in seqs:
    room = next((r for r in range(len(s), width + 1) if by_room[r]), None)
    if room is None:
      rows.append(list(s))
      by_room[width - len(s)].append(len(rows) - 1)
    else:
      row = by_room[room].pop()
      rows[row].extend(s)
      by_room[room - len(s)].append(row)
  order = np.random.default_rng(seed).permutation(len(rows))
  ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(order):
    ids[i, : len(rows[r])] = rows[r]
    mask[i, : len(rows[r])] = 1
  return ids, mask


# ------------------------------------------------------------------ models
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


# ----------------------------------------------------------------- attacks
@functools.partial(jax.jit, static_argnames=('model', 'num_context'))
def score_sequences(model, params, params_prime, ids, *, num_context: int):
  """DS and relative DS of `ids` on M (`params`) and M' (`params_prime`).

  M and M' are snapshots of one model, so `model` serves both.
  """
  return differential_score(
    model, model, params, params_prime, ids, num_context=num_context
  )


@functools.partial(
  jax.jit,
  static_argnames=('model', 'widths', 'length', 'num_groups', 'score', 'mesh'),
)
def search_sequences(
  model,
  params,
  params_prime,
  context,
  *,
  widths: tuple[int, ...],
  length: int,
  num_groups: int,
  score: str,
  mesh=None,
) -> SearchResult:
  """Algorithm 1 over the whole vocabulary for M (`params`) against M'."""
  return rank_beam_search(
    model,
    model,
    params,
    params_prime,
    context,
    widths=widths,
    length=length,
    num_groups=num_groups,
    score=score,
    mesh=mesh,
  )


class Attack:
  """DS scoring and DR searches for one M against many M'.

  Both run the module's jitted kernels (:func:`score_sequences`,
  :func:`search_sequences`), which compile once per shape for the model and
  never again for new parameters. With a `mesh` both are data-parallel over
  its `'data'` axis: the DS batch is padded to a multiple of the
  axis size and split over it, the search splits its beam rows
  (`rank_beam_search(mesh=...)`), and the parameters of M and M' are
  replicated. Results equal the unsharded ones up to float32 rounding.
  """

  def __init__(self, model, cfg: DifferentialConfig, mesh=None):
    self.model = model
    self.cfg = cfg
    self.mesh = mesh
    self.bos = model.tokenizer.bos_id
    self.widths = {
      n: halving_widths(
        model.vocab_size, n, min_width=cfg.min_width, num_groups=cfg.num_groups
      )
      for n in range(1, CANARY_LENGTH + 1)
    }

  def scores(self, params, params_prime, ids: np.ndarray, num_context: int):
    ids, num = sharding.pad_to_multiple(
      np.asarray(ids, np.int32), sharding.data_size(self.mesh)
    )
    s = score_sequences(
      self.model,
      *sharding.replicate((params, params_prime), self.mesh),
      sharding.shard_batch(jnp.asarray(ids), self.mesh),
      num_context=num_context,
    )
    return jax.tree.map(lambda x: x[:num], sharding.to_host(s))

  def search_options(self, length: int) -> dict[str, Any]:
    """The static arguments of :func:`search_sequences` for `length`."""
    return dict(
      widths=self.widths[length],
      length=length,
      num_groups=self.cfg.num_groups,
      score=self.cfg.score,
      mesh=self.mesh,
    )

  def search(
    self, params, params_prime, context: Sequence[int], length: int
  ) -> SearchResult:
    result = search_sequences(
      self.model,
      *sharding.replicate((params, params_prime), self.mesh),
      jnp.asarray(context, jnp.int32),
      **self.search_options(length),
    )
    return sharding.to_host(ranked(result, self.cfg.score))


def dr_bounds(
  found: SearchResult,
  target: np.ndarray,
  value: np.ndarray,
  own: np.ndarray,
  score: str,
) -> tuple[int, int]:
  """Prop. 3.3 bounds on the DR of `target [n]` scoring `value [1]`.

  Returns:
    `(dr, dr_own)`: found sequences other than `target` that score higher,
    all of them / only those marked `own [S]` (`found` holds one list).
  """
  dr = differential_rank_lower_bound(found, target[None], value, score=score)
  # Not own: scored -inf, so never higher.
  masked = jnp.where(own[None], getattr(found, score), -jnp.inf)
  dr_own = differential_rank_lower_bound(
    found.replace(**{score: masked}), target[None], value, score=score
  )
  return int(dr[0]), int(dr_own[0])


def evaluate_pair(
  attack: Attack,
  params,
  params_prime,
  canaries: Sequence[Canary],
  planted: Sequence[Canary],
  prefix_lengths: Sequence[int],
  tokenizer,
  top: int,
) -> list[dict[str, Any]]:
  """DS, relative DS and DR bounds of each canary for one (M, M').

  With a known prefix (RQ3) a canary is searched again only if its bound
  without the prefix is above 0: if no sequence of T^5 scores above the
  canary, none with the canary's prefix does either (the prefix's own DS is
  common to all of them), so its rank given the prefix is 0 as well, as far
  as the search can tell. Such rows carry `searched: False`.
  """
  cfg = attack.cfg
  rows = []
  ranked_at_zero = set()
  for p in sorted(prefix_lengths):
    # The adversary knows the canary's first p words (RQ3), so each canary
    # has its own context; without a prefix one search serves all canaries.
    todo = [c for c in canaries if c.text not in ranked_at_zero]
    groups = [list(canaries)] if p == 0 else [[c] for c in todo]
    for c in canaries:
      if p and c.text in ranked_at_zero:
        context = [attack.bos] + list(c.ids[:p])
        s = attack.scores(
          params,
          params_prime,
          np.asarray([context + list(c.ids[p:])], np.int32),
          len(context),
        )
        rows.append(
          {
            'canary': c.kind,
            'text': c.text,
            'prefix': p,
            'ds': float(s.ds[0]),
            'rel_ds': float(s.rel_ds[0]),
            'dr': 0,
            'dr_own': 0,
            'searched': False,
          }
        )
    for group in groups:
      context = [attack.bos] + list(group[0].ids[:p])
      start = time.perf_counter()
      found = attack.search(params, params_prime, context, CANARY_LENGTH - p)
      search_s = time.perf_counter() - start
      seqs = np.asarray(found.sequences[0])  # [S, n - p]
      found_scores = np.asarray(getattr(found, cfg.score)[0])
      for c in group:
        ids = np.asarray([context + list(c.ids[p:])], np.int32)
        s = attack.scores(params, params_prime, ids, len(context))
        target = np.asarray(c.ids[p:])
        others = [o.ids[p:] for o in planted if o.text != c.text]
        own = ~hamming_close(seqs, others)
        dr, dr_own = dr_bounds(
          found, target, getattr(s, cfg.score)[:1], own, cfg.score
        )
        if p == 0 and dr_own == 0:
          ranked_at_zero.add(c.text)
        same = np.all(seqs == target[None], -1)
        is_found = bool(np.any(same))
        token_ds = np.asarray(s.token_ds[0, len(context) - 1 :])
        rows.append(
          {
            'canary': c.kind,
            'text': c.text,
            'prefix': p,
            'searched': True,
            'ds': float(s.ds[0]),
            'rel_ds': float(s.rel_ds[0]),
            'token_ds': token_ds.tolist(),
            'dr': dr,
            'dr_own': dr_own,
            'found': is_found,
            'found_rank': (int(np.argmax(same)) if is_found else None),
            'num_found': int(len(seqs)),
            'min_found_score': float(found_scores.min()),
            'search_seconds': search_s,
            'top': [
              {
                'text': tokenizer.decode(
                  context[1:] + list(q), skip_special=False
                ),
                'ds': float(d),
                'rel_ds': float(r),
              }
              for q, d, r in zip(
                seqs[:top], found.ds[0][:top], found.rel_ds[0][:top]
              )
            ],
          }
        )
  return rows


# --------------------------------------------------------------- experiment
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


def run(
  cfg: DifferentialConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
) -> DifferentialRun:
  """Runs everything (resuming from `workdir`); returns the results.

  Writes config.json and one results.jsonl row per (M', canary, prefix);
  the summary and tables are the caller's. `mesh` (see
  :func:`leakjax.sharding.data_mesh`) shards DS scoring and the DR search;
  it does not change the results, so it is not part of `cfg`.
  """
  workdir = io.as_path(workdir)
  io.check_workdir(workdir)
  # The corpus is read and checked before the workdir is touched.
  sentences = read_sentences(
    cfg.data,
    max_sentences=cfg.max_sentences,
    seed=cfg.seed,
    column=cfg.data_column,
    label=cfg.data_label,
  )
  corpus = split_corpus(sentences, cfg)
  tokenizer = WordTokenizer.build(corpus.train, cfg.vocab_size)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise LeakjaxError(
      f'the training set has only {tokenizer.vocab_size - 2} distinct'
      f' words, fewer than vocab_size={cfg.vocab_size} - 2',
      'lower --vocab_size',
    )
  writer = io.ExperimentWriter(
    workdir, cfg, inputs={'data': cfg.data, 'texts': list(sentences)}
  )
  canaries = make_canaries(
    tokenizer,
    corpus.train,
    canary_types=cfg.canary_types,
    phrases=cfg.canaries,
    seed=cfg.seed,
  )
  for c in canaries:
    logging.info(
      'canary %s: %r quintiles %s counts in D %s',
      c.kind,
      c.text,
      c.quintiles,
      c.counts,
    )
  train_words = sum(len(tokenizer.split(s)) for s in corpus.train)
  rows_d = pack_rows(tokenizer, corpus.train, cfg.row_width, seed=cfg.seed)
  rows_eval = pack_rows(tokenizer, corpus.eval, cfg.row_width, seed=cfg.seed)
  mconfig = lstm_config(cfg)
  models_dir = workdir / 'models'

  # M on D. Every snapshot is the one `model` with its own params.
  model = lstm.make_model(mconfig, tokenizer)
  fresh = lambda seed: lstm.init_model(
    mconfig, key=jax.random.key(seed), tokenizer=tokenizer
  )[1]
  base_cfg = train_config(
    cfg, epochs=cfg.epochs, learning_rate=cfg.learning_rate, seed=cfg.seed
  )
  start = time.perf_counter()
  params, base_ppl = fit(
    model,
    fresh(cfg.seed),
    rows_d,
    rows_eval,
    base_cfg,
    models_dir / 'base',
    progress=progress,
  )
  base_seconds = time.perf_counter() - start
  attack = Attack(model, cfg, mesh)
  logging.info(
    'M: perplexity %.1f (%d parameters), %.0f s',
    base_ppl,
    count_params(params),
    base_seconds,
  )

  def snapshots():
    """(method, k, canaries planted) for every M', cheapest first."""
    for method in sorted(cfg.methods, key=lambda m: m == 'retrain'):
      for k in cfg.insertions:
        if method == 'retrain':
          if k in (cfg.retrain_insertions or cfg.insertions):
            yield method, k, list(canaries)
        else:
          for c in canaries:
            yield method, k, [c]

  def make_prime(method: str, k: int, group: Sequence[Canary]):
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
        model,
        fresh(seed),
        rows,
        rows_eval,
        tc,
        models_dir / name,
        progress=progress,
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
      model, params, rows, None, tc, models_dir / name, progress=progress
    )
    ppl = train_lib.evaluate(
      model,
      params_prime,
      [
        data_lib.take_batch(*rows_eval, r)
        for r in data_lib.batch_indices(
          len(rows_eval[0]), cfg.batch_size, seed=0, shuffle=False
        )
      ],
    )
    return params_prime, float(ppl['perplexity'])

  plan = list(snapshots())
  counter = io.Progress(len(plan))
  for method, k, group in plan:
    key = dict(method=method, k=k, planted=[c.kind for c in group])
    if all(
      writer.done(**key, canary=c.kind, prefix=p)
      for c in group
      for p in cfg.prefix_lengths
    ):
      counter.skipped()
      continue
    start = time.perf_counter()
    params_prime, ppl = make_prime(method, k, group)
    train_s = time.perf_counter() - start
    rows = evaluate_pair(
      attack,
      params,
      params_prime,
      group,
      group,
      cfg.prefix_lengths,
      tokenizer,
      cfg.top,
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


__all__ = [
  'METHODS',
  'MODELS',
  'Attack',
  'Corpus',
  'DifferentialConfig',
  'DifferentialRun',
  'dr_bounds',
  'evaluate_pair',
  'fit',
  'lstm_config',
  'pack_rows',
  'read_sentences',
  'run',
  'score_sequences',
  'search_sequences',
  'split_corpus',
  'train_config',
]
