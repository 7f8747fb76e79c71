r"""Differential score and rank of canaries between two LSTM snapshots.

Reproduces the canary experiments of Zanella-Beguelin et al., "Analyzing
Information Leakage of Updates to Natural Language Models" (CCS 2020),
Sec. 4.4 and Table 1, with the word-level LSTM of Sec. 4.1 (2 layers,
200-dim embeddings and states):

1. Split a corpus into sentences: the training set D, a held-out set (the
   perplexity column of Table 1) and a pool D_extra (RQ1).
2. Build 5-word canaries whose word frequencies follow the paper's profiles
   (all low, low to high, mixed, high to low) over quintiles of D's
   vocabulary, and check that they never occur in D.
3. Train M on D; for every insertion count k make M' by
   * retraining: a fresh model trained on D' = D + k copies of the canary
     (Sec. 4.2, "Retraining");
   * continued training: M trained further on D' \ D, the k copies
     (Sec. 4.2, "Continued Training"), optionally mixed with D_extra (RQ1).
4. For each (M, M') compute the canary's DS and relative DS (Definition
   3.1), run Algorithm 1 over the whole vocabulary with the width halved at
   each step, and bound the canary's differential rank (Prop. 3.3); with
   `--prefix_lengths` also with the canary's first words given (RQ3).

Which data stands in for the paper's: only WikiText-2 is available here
(its validation split, ~180k words), so it plays PTB, the paper's low-data
set (~900k words, 10k vocabulary, the same 2x200 LSTM). Insertion counts are
chosen to match PTB's canary rates (1 canary word in 18K, 3.6K and 1.8K
training words for k = 10, 50, 100) rather than PTB's absolute counts.
Reddit (20M words) and WikiText-103 (103M words) are out of reach on a
2-core CPU; their larger models (`LSTMConfig.medium_512`, `wikitext_512`)
run through the same code with `--model`.

In retraining, the four canary types share one D' per k (each canary
inserted k times), which quarters the training cost; ranks are reported
both counting every found sequence (`dr`) and ignoring sequences within
Hamming distance 2 of another planted canary (`dr_own`).

  python -m experiments.differential \
      --flagfile=experiments/configs/differential_wikitext.flags
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
from absl import flags, logging

from experiments import common
from leakjax import data as data_lib
from leakjax import io, sharding
from leakjax import train as train_lib
from leakjax.attacks import differential as dlib
from leakjax.errors import LeakjaxError
from leakjax.models import lstm
from leakjax.models import num_params as count_params
from leakjax.tokenization import WordTokenizer

# Quintiles of D's vocabulary by frequency, 0 = most frequent fifth
# (Sec. 4.4: "all tokens are from the least frequent quintile").
PROFILES = {
  'all_low': (4, 4, 4, 4, 4),
  'low_to_high': (4, 3, 2, 1, 0),
  'mixed': (2, 0, 4, 1, 3),  # one word from each quintile
  'high_to_low': (0, 1, 2, 3, 4),
}
METHODS = ('retrain', 'continued', 'continued_extra')
MODELS = ('ptb_small', 'medium_512', 'wikitext_512')
CANARY_LENGTH = 5  # Sec. 4.4: "we fix the length of the canary phrase to 5"
# DR > 1000 is a gray cell of Table 1.
DR_GRAY = 1000


@dataclasses.dataclass(frozen=True)
class DifferentialConfig:
  r"""Everything that determines the experiment's results.

  Attributes:
    data: the corpus (.txt, one paragraph per line; WikiText headings
      ` = Title = ` are dropped).
    max_sentences: use at most this many sentences (after shuffling); None
      for all.
    eval_fraction / extra_fraction: sentences held out for perplexity / for
      the D_extra pool.
    vocab_size: words in the vocabulary (specials included), = |T|.
    model: LSTM shape: 'ptb_small' (Sec. 4.1 PTB), 'medium_512',
      'wikitext_512'; embed_dim/hidden_size/num_layers > 0 override it.
    row_width: training rows hold whole sentences packed up to this width.
    batch_size, learning_rate, epochs: Adam training of M and retrained M'.
    continue_optimizer, continue_epochs, continue_learning_rate,
      continue_batch_size: continued training on D' \ D at a constant
      rate, one sentence per row, so that k sets the number of update steps
      (a batch of k identical rows would give the gradient of one row,
      whatever k). Default: plain SGD at 0.1. (Adam at M's peak rate
      hardly moves the canary's rare words; SGD at 1, Zaremba et al.'s PTB
      rate, memorizes it but multiplies M's perplexity by 30 or more.)
    extra_sentences: size of D_extra mixed into 'continued_extra'.
    canary_types: which profiles to insert.
    canaries: explicit phrases, one per canary type, checked against the
      profile; empty: words drawn at random from the quintiles.
    insertions: the k values.
    retrain_insertions: the k values retrained (the costly part); empty:
      all of `insertions`.
    methods: subset of METHODS.
    prefix_lengths: RQ3, canary words given to the adversary (0 = none).
    min_width: smallest beam width (the final width; > DR_GRAY so that
      DR > 1000 can be certified).
    num_groups: group beam search groups (Sec. 3.2).
    score: what the beam search ranks by, 'ds' or 'rel_ds'.
    top: found sequences stored per search.
    seed: data split, canary words, initializations, data order.
  """

  data: str
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
    if any(k < 1 for k in self.insertions) or not self.insertions:
      raise LeakjaxError(f'insertions must be positive, got {self.insertions}')
    if any(not 0 <= p < CANARY_LENGTH for p in self.prefix_lengths):
      raise LeakjaxError(
        f'prefix lengths must be in [0, {CANARY_LENGTH}),'
        f' got {self.prefix_lengths}'
      )
    if not set(self.retrain_insertions) <= set(self.insertions):
      raise LeakjaxError('retrain_insertions must be some of insertions')
    if self.score not in dlib.SCORES:
      raise LeakjaxError(f'score must be one of {dlib.SCORES}')
    if not 0 <= self.eval_fraction + self.extra_fraction < 1:
      raise LeakjaxError('eval_fraction + extra_fraction must be in [0, 1)')


# ------------------------------------------------------------------- data
@dataclasses.dataclass
class Corpus:
  train: list[str]  # D
  eval: list[str]  # held out, for perplexity
  extra: list[str]  # the D_extra pool (RQ1)


def read_sentences(
  path: str, *, max_sentences: int | None, seed: int
) -> list[str]:
  """Sentences of a paragraph-per-line corpus, shuffled (seeded).

  WikiText headings (` = Title = `) are dropped and its `<unk>` marker
  becomes the word `unk` (a word of the vocabulary like any other).
  """
  paragraphs = data_lib.load_corpus(path)
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


# ---------------------------------------------------------------- canaries
@dataclasses.dataclass(frozen=True)
class Canary:
  kind: str  # a key of PROFILES
  text: str  # five words
  ids: tuple[int, ...]  # their ids
  quintiles: tuple[int, ...]  # measured quintile of each word
  counts: tuple[int, ...]  # each word's count in D


def word_quintile(tokenizer: WordTokenizer, word_id: int) -> int:
  """0 (most frequent fifth of the vocabulary) .. 4 (least frequent)."""
  num_words = tokenizer.vocab_size - 2  # words are ranked after 2 specials
  return min(4, (word_id - 2) * 5 // num_words)


def make_canaries(
  cfg: DifferentialConfig, tokenizer: WordTokenizer, train: Sequence[str]
) -> list[Canary]:
  """The canaries: given phrases (checked) or random words per quintile."""
  counts = getattr(tokenizer, 'counts', {})
  rng = np.random.default_rng([cfg.seed, 2])
  text_d = ' ' + ' '.join(' '.join(tokenizer.split(s)) for s in train) + ' '
  canaries = []
  for n, kind in enumerate(cfg.canary_types):
    profile = PROFILES[kind]
    if cfg.canaries:
      words = tokenizer.split(cfg.canaries[n])
    else:  # random words, distinct, not `unk`
      words = []
      for q in profile:
        pool = [
          i
          for i in range(2, tokenizer.vocab_size)
          if word_quintile(tokenizer, i) == q
          and tokenizer.words[i] != 'unk'
          and tokenizer.words[i] not in words
        ]
        words.append(tokenizer.words[int(rng.choice(pool))])
    if len(words) != CANARY_LENGTH:
      raise LeakjaxError(
        f'canary {cfg.canaries[n]!r} has {len(words)} words',
        f'use {CANARY_LENGTH} words',
      )
    ids = tuple(tokenizer.encode(' '.join(words)))
    if tokenizer.unk_id in ids:
      missing = [w for w, i in zip(words, ids) if i == tokenizer.unk_id]
      raise LeakjaxError(
        f'canary words {missing} are not in the vocabulary',
        'pick words that occur in the training set',
      )
    quintiles = tuple(word_quintile(tokenizer, i) for i in ids)
    if quintiles != profile:
      raise LeakjaxError(
        f'canary {" ".join(words)!r} has word quintiles {quintiles}, but'
        f' {kind} needs {profile} (0 = most frequent)',
        'pick words of the right frequency, or omit --canaries',
      )
    text = ' '.join(words)
    if f' {text} ' in text_d:
      raise LeakjaxError(
        f'canary {text!r} occurs in the training set', 'pick another phrase'
      )
    canaries.append(
      Canary(
        kind=kind,
        text=text,
        ids=ids,
        quintiles=quintiles,
        counts=tuple(int(counts.get(w, 0)) for w in words),
      )
    )
  return canaries


# ------------------------------------------------------------------ models
def lstm_config(cfg: DifferentialConfig) -> lstm.LSTMConfig:
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
  return dlib.differential_score(
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
) -> dlib.SearchResult:
  """Algorithm 1 over the whole vocabulary for M (`params`) against M'."""
  return dlib.rank_beam_search(
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
  (`dlib.rank_beam_search(mesh=...)`), and the parameters of M and M' are
  replicated. Results equal the unsharded ones up to float32 rounding.
  """

  def __init__(self, model, cfg: DifferentialConfig, mesh=None):
    self.model = model
    self.cfg = cfg
    self.mesh = mesh
    self.bos = model.tokenizer.bos_id
    self.widths = {
      n: dlib.halving_widths(
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
    return jax.tree.map(lambda x: x[:num], jax.device_get(s))

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
  ) -> dlib.SearchResult:
    result = search_sequences(
      self.model,
      *sharding.replicate((params, params_prime), self.mesh),
      jnp.asarray(context, jnp.int32),
      **self.search_options(length),
    )
    return jax.device_get(dlib.ranked(result, self.cfg.score))


def hamming_close(
  found: np.ndarray, others: Sequence[Sequence[int]], max_distance: int = 2
) -> np.ndarray:
  """bool [S]: found sequences within `max_distance` of any of `others`."""
  close = np.zeros(len(found), bool)
  for o in others:
    close |= (found != np.asarray(o)[None]).sum(-1) <= max_distance
  return close


def dr_bounds(
  found: dlib.SearchResult,
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
  dr = dlib.differential_rank_lower_bound(
    found, target[None], value, score=score
  )
  # Not own: scored -inf, so never higher.
  masked = jnp.where(own[None], getattr(found, score), -jnp.inf)
  dr_own = dlib.differential_rank_lower_bound(
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


def fmt_ds(value: float) -> str:
  if abs(value) >= 1000:
    return f'{value:.3g}'
  return f'{value:.3f}' if abs(value) >= 0.01 else f'{value:.1e}'


def dr_cell(dr: int, num_found: int | None) -> str:
  """Table 1's shading as text: DR 0, DR > 1000, or the bound."""
  if num_found is None:  # not searched: 0 without the prefix
    return 'DR 0*'
  if dr == 0:
    return 'DR 0'
  if dr > DR_GRAY:
    return 'DR >1000'
  return f'DR >={dr}' if dr < num_found else f'DR >={num_found}'


# --------------------------------------------------------------- experiment
def run_experiment(
  cfg: DifferentialConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
) -> dict[str, float]:
  """Runs everything (resuming from `workdir`); returns the summary.

  `mesh` (see :func:`data_mesh`) shards DS scoring and the DR search; it
  does not change the results, so it is not part of `cfg`.
  """
  workdir = Path(workdir)
  writer = io.ExperimentWriter(workdir, cfg)
  sentences = read_sentences(
    cfg.data, max_sentences=cfg.max_sentences, seed=cfg.seed
  )
  corpus = split_corpus(sentences, cfg)
  tokenizer = WordTokenizer.build(corpus.train, cfg.vocab_size)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise LeakjaxError(
      f'the training set has only {tokenizer.vocab_size - 2} distinct'
      f' words, fewer than vocab_size={cfg.vocab_size} - 2',
      'lower --vocab_size',
    )
  canaries = make_canaries(cfg, tokenizer, corpus.train)
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

  def canary_rows(group: Sequence[Canary], k: int) -> list[str]:
    return [c.text for c in group for _ in range(k)]

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
        corpus.train + canary_rows(group, k),
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
    update = canary_rows(group, k)
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

  for method, k, group in snapshots():
    key = dict(method=method, k=k, planted=[c.kind for c in group])
    if all(
      writer.done(**key, canary=c.kind, prefix=p)
      for c in group
      for p in cfg.prefix_lengths
    ):
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
    for row in rows:
      writer.add_result(
        {**key, **row, 'perplexity': ppl, 'train_seconds': train_s}
      )
      logging.info(
        '%s k=%d %s prefix=%d: DS %.3f rel %.3g DR >= %d%s',
        method,
        k,
        row['canary'],
        row['prefix'],
        row['ds'],
        row['rel_ds'],
        row['dr'],
        ' (found)' if row.get('found') else '',
      )

  summary = summarize(writer.results, cfg, base_ppl)
  summary['ppl@model=M'] = base_ppl
  summary['train_words'] = float(train_words)
  markdown = report(
    writer,
    writer.results,
    cfg,
    canaries,
    base_ppl,
    train_words,
    count_params(params),
  )
  writer.write_summary(summary, markdown)
  return summary


def _key_params(row) -> dict[str, Any]:
  params = dict(canary=row['canary'], k=row['k'], method=row['method'])
  if row['prefix']:
    params['prefix'] = row['prefix']
  return params


def summarize(
  results, cfg: DifferentialConfig, base_ppl: float
) -> dict[str, float]:
  del base_ppl
  summary = {}
  for row in results:
    params = _key_params(row)
    summary[io.summary_key('ds', **params)] = row['ds']
    summary[io.summary_key('rel_ds', **params)] = row['rel_ds']
    summary[io.summary_key('dr', **params)] = row['dr']
    if row['searched']:
      summary[io.summary_key('found', **params)] = int(row['found'])
      summary[io.summary_key('top_match', **params)] = top_match(row)
    if row['method'] == 'retrain':
      summary[io.summary_key('dr_own', **params)] = row['dr_own']
    if not row['prefix'] and row['method'] == 'retrain':
      summary[io.summary_key('ppl', k=row['k'], method='retrain')] = row[
        'perplexity'
      ]
    elif not row['prefix']:
      summary[io.summary_key('ppl', **params)] = row['perplexity']
  # Headline: fraction of (canary, k) cells at DR 0 without background
  # knowledge, per method (retraining: not counting the other planted
  # canaries, `dr_own`).
  for method in cfg.methods:
    cells = [r for r in results if r['method'] == method and not r['prefix']]
    if cells:
      field = 'dr_own' if method == 'retrain' else 'dr'
      summary[io.summary_key('dr0_fraction', method=method)] = float(
        np.mean([r[field] == 0 for r in cells])
      )
  return summary


def top_match(row) -> int:
  """Most canary words, in place, in one of the top found sequences.

  Counts only the words the adversary did not know (after the prefix): 5
  means the canary itself is among the stored top sequences, 4 a sequence
  that differs from it in one word.
  """
  words = row['text'].split()[row['prefix'] :]
  best = 0
  for t in row.get('top', []):
    found = t['text'].split()[row['prefix'] :]
    best = max(best, sum(a == b for a, b in zip(words, found)))
  return best


def report(
  writer, results, cfg, canaries, base_ppl, train_words, num_params
) -> str:
  """summary.md: Table 1 per method, RQ3, plots, top extracted sequences."""
  ks = sorted(cfg.insertions)
  name = {'ds': 'DS', 'rel_ds': 'relative DS'}[cfg.score]
  rate = lambda k: f'1 in {train_words / (k * CANARY_LENGTH) / 1000:.1f}K'
  lines = [
    '# Differential score and rank of canaries (Zanella-Beguelin et al.'
    ' 2020, Table 1)\n',
    f'Corpus `{cfg.data}`: {train_words:,} training'
    f' words (D), vocabulary {cfg.vocab_size:,} (= |T|). Model'
    f' `{cfg.model}` LSTM, {num_params:,} parameters, M perplexity'
    f' **{base_ppl:.1f}** on held-out sentences. Beam search over all of'
    f' T, widths {"/".join(str(w) for w in dlib.halving_widths(cfg.vocab_size, CANARY_LENGTH, min_width=cfg.min_width, num_groups=cfg.num_groups))},'
    f' {cfg.num_groups} group(s), ranked by `{cfg.score}`.\n',
    'Canaries (word quintiles, 0 = most frequent; counts in D):\n',
  ]
  for c in canaries:
    lines.append(
      f'- {c.kind}: "{c.text}" quintiles {list(c.quintiles)},'
      f' counts {list(c.counts)}'
    )
  lines.append('')
  for method in cfg.methods:
    lines.append(
      f'## {method}: {name} of the canary (DR bound), no background knowledge\n'
    )
    header = ['canary'] + [f'k={k} ({rate(k)})' for k in ks]
    table = []
    for c in canaries:
      cells = [c.kind]
      for k in ks:
        row = next(
          (
            r
            for r in results
            if r['method'] == method
            and r['k'] == k
            and r['canary'] == c.kind
            and not r['prefix']
          ),
          None,
        )
        if row is None:
          cells.append('-')
          continue
        cell = f'{fmt_ds(row[cfg.score])} ({dr_cell(row["dr"], row.get("num_found"))}'
        if method == 'retrain' and row['dr_own'] != row['dr']:
          cell += f'; own {dr_cell(row["dr_own"], row["num_found"])}'
        cells.append(cell + f'; top {top_match(row)}/5)')
      table.append(cells)
    lines.append(io.markdown_table(header, table))
    ppls = {
      k: [
        r['perplexity']
        for r in results
        if r['method'] == method and r['k'] == k and not r['prefix']
      ]
      for k in ks
    }
    lines.append(
      "Perplexity of M' (median over its snapshots): "
      + ', '.join(f'k={k}: {np.median(ppls[k]):.1f}' for k in ks if ppls[k])
      + '\n'
    )
  prefixes = sorted({r['prefix'] for r in results if r['prefix']})
  for p in prefixes:
    lines.append(
      f'## RQ3: the first {p} canary words given ({name} of the rest,'
      ' DR bound)\n'
    )
    header = ['method', 'canary'] + [f'k={k}' for k in ks]
    table = []
    for method in cfg.methods:
      for c in canaries:
        cells = [method, c.kind]
        for k in ks:
          row = next(
            (
              r
              for r in results
              if r['method'] == method
              and r['k'] == k
              and r['canary'] == c.kind
              and r['prefix'] == p
            ),
            None,
          )
          cells.append(
            '-'
            if row is None
            else f'{fmt_ds(row[cfg.score])} ({dr_cell(row["dr"], row.get("num_found"))})'
          )
        table.append(cells)
    lines.append(io.markdown_table(header, table))
    lines.append(
      '\\* not searched: DR 0 without the prefix implies DR 0'
      ' with it (the prefix adds the same DS to every'
      ' candidate).\n'
    )
  plot = _plot(writer, results, cfg, canaries)
  if plot:
    lines.append(f'![DS and DR against k]({plot})\n')
  lines.append('## Top extracted sequences (no background knowledge)\n')
  for method in cfg.methods:
    for k in sorted({min(ks), max(ks)}):
      for c in canaries:
        row = next(
          (
            r
            for r in results
            if r['method'] == method
            and r['k'] == k
            and r['canary'] == c.kind
            and not r['prefix']
          ),
          None,
        )
        if row is None or (method == 'retrain' and c is not canaries[0]):
          continue
        title = (
          f'{method}, k={k}, all canaries planted'
          if method == 'retrain'
          else f'{method}, k={k}, {c.kind} "{c.text}"'
          f' ({name} {fmt_ds(row[cfg.score])})'
        )
        lines.append(f'**{title}**\n')
        lines.append(
          io.markdown_table(
            ['rank', 'sequence', 'DS', 'rel DS'],
            [
              [i, t['text'], f'{t["ds"]:.4g}', f'{t["rel_ds"]:.4g}']
              for i, t in enumerate(row['top'][:5])
            ],
          )
        )
  return '\n'.join(lines)


def _plot(writer, results, cfg, canaries) -> str | None:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  ks = sorted(cfg.insertions)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for method, style in zip(cfg.methods, ('-', '--', ':')):
    for c, color in zip(canaries, ('C0', 'C1', 'C2', 'C3')):
      pts = [
        (r['k'], r[cfg.score], r['dr'])
        for r in results
        if r['method'] == method and r['canary'] == c.kind and not r['prefix']
      ]
      pts.sort()
      if not pts:
        continue
      x = [p[0] for p in pts]
      axes[0].plot(
        x,
        [p[1] for p in pts],
        style,
        color=color,
        marker='o',
        label=f'{method} {c.kind}',
      )
      axes[1].plot(x, [p[2] for p in pts], style, color=color, marker='o')
  axes[0].set_yscale('symlog', linthresh=1e-3)
  axes[0].set(
    xscale='log',
    xlabel='insertions k',
    ylabel=f'{cfg.score} of the canary',
    title='Differential score (Def. 3.1)',
  )
  axes[1].set_yscale('symlog', linthresh=1)
  axes[1].set(
    xscale='log',
    xlabel='insertions k',
    ylim=(-0.3, 5000),
    ylabel='DR lower bound (beam search)',
    title='Differential rank (Prop. 3.3)',
  )
  axes[1].axhline(DR_GRAY, color='gray', lw=0.8, ls=':')
  for ax in axes:
    ax.minorticks_off()
    ax.set_xticks(ks, [str(k) for k in ks])
  axes[0].legend(fontsize=7)
  name = writer.save_figure(fig, 'ds_dr.png')
  plt.close(fig)
  return name


# ------------------------------------------------------------------- flags
def define_flags() -> None:
  d = DifferentialConfig(data='')
  flags.DEFINE_integer('max_sentences', None, 'Use at most this many.')
  flags.DEFINE_float('eval_fraction', d.eval_fraction, 'Held-out fraction.')
  flags.DEFINE_float('extra_fraction', d.extra_fraction, 'D_extra pool.')
  flags.DEFINE_integer('vocab_size', d.vocab_size, 'Vocabulary = |T|.')
  flags.DEFINE_enum('model', d.model, MODELS, 'LSTM configuration.')
  flags.DEFINE_integer('embed_dim', 0, 'Override the embedding width.')
  flags.DEFINE_integer('hidden_size', 0, 'Override the LSTM width.')
  flags.DEFINE_integer('num_layers', 0, 'Override the layer count.')
  flags.DEFINE_integer('row_width', d.row_width, 'Packed row width.')
  flags.DEFINE_integer('batch_size', d.batch_size, 'Rows per step.')
  flags.DEFINE_float('learning_rate', d.learning_rate, 'Adam, M and retrain.')
  flags.DEFINE_integer('epochs', d.epochs, 'Epochs of M and retraining.')
  flags.DEFINE_enum(
    'continue_optimizer',
    d.continue_optimizer,
    train_lib.OPTIMIZERS,
    'Continued training optimizer.',
  )
  flags.DEFINE_integer(
    'continue_epochs',
    d.continue_epochs,
    "Epochs of continued training on D' \\ D.",
  )
  flags.DEFINE_float(
    'continue_learning_rate',
    d.continue_learning_rate,
    'Adam, continued training.',
  )
  flags.DEFINE_integer(
    'continue_batch_size',
    d.continue_batch_size,
    'Sentences per step of continued training.',
  )
  flags.DEFINE_integer(
    'extra_sentences',
    d.extra_sentences,
    'D_extra sentences for continued_extra (RQ1).',
  )
  flags.DEFINE_list('canary_types', list(d.canary_types), 'Profiles.')
  flags.DEFINE_string(
    'canaries',
    '',
    'Semicolon-separated phrases, one'
    ' per canary type; empty: random words per quintile.',
  )
  flags.DEFINE_list('insertions', [str(k) for k in d.insertions], 'k values.')
  flags.DEFINE_list(
    'retrain_insertions', [], 'k values to retrain (default: all --insertions).'
  )
  flags.DEFINE_list('methods', list(d.methods), f'Some of {METHODS}.')
  flags.DEFINE_list(
    'prefix_lengths',
    [str(p) for p in d.prefix_lengths],
    'RQ3: canary words given to the adversary.',
  )
  flags.DEFINE_integer('min_width', d.min_width, 'Smallest beam width.')
  flags.DEFINE_integer('num_groups', d.num_groups, 'Beam groups.')
  flags.DEFINE_enum('score', d.score, dlib.SCORES, 'Search ranking.')
  flags.DEFINE_integer('top', d.top, 'Found sequences stored per search.')


def config_from_flags() -> DifferentialConfig:
  f = flags.FLAGS
  if not f.data:
    raise LeakjaxError(
      '--data is required', 'pass e.g. ../shared/data/wikitext-2/valid.txt'
    )
  return DifferentialConfig(
    data=f.data,
    max_sentences=f.max_sentences,
    eval_fraction=f.eval_fraction,
    extra_fraction=f.extra_fraction,
    vocab_size=f.vocab_size,
    model=f.model,
    embed_dim=f.embed_dim,
    hidden_size=f.hidden_size,
    num_layers=f.num_layers,
    row_width=f.row_width,
    batch_size=f.batch_size,
    learning_rate=f.learning_rate,
    epochs=f.epochs,
    continue_optimizer=f.continue_optimizer,
    continue_epochs=f.continue_epochs,
    continue_learning_rate=f.continue_learning_rate,
    continue_batch_size=f.continue_batch_size,
    extra_sentences=f.extra_sentences,
    canary_types=tuple(f.canary_types),
    canaries=tuple(p.strip() for p in f.canaries.split(';') if p.strip()),
    insertions=tuple(int(k) for k in f.insertions),
    retrain_insertions=tuple(int(k) for k in f.retrain_insertions),
    methods=tuple(f.methods),
    prefix_lengths=tuple(int(p) for p in f.prefix_lengths),
    min_width=f.min_width,
    num_groups=f.num_groups,
    score=f.score,
    top=f.top,
    seed=f.seed,
  )


data_mesh = sharding.data_mesh  # `--mesh`; kept as this module's name


def main(argv):
  del argv
  mesh = data_mesh(flags.FLAGS.mesh)
  if mesh is not None:
    logging.info('DS scoring and DR search sharded over %s', dict(mesh.shape))
  cfg = config_from_flags()
  start = time.perf_counter()
  summary = run_experiment(cfg, flags.FLAGS.workdir, mesh=mesh)
  print((Path(flags.FLAGS.workdir) / 'summary.md').read_text())
  print(
    f'Wrote {flags.FLAGS.workdir}/summary.json ({len(summary)} keys) in'
    f' {time.perf_counter() - start:.0f} s'
  )


if __name__ == '__main__':
  define_flags()
  common.define_common_flags('/tmp/leakjax_differential')
  common.run(main)
