r"""Embedding inversion of SmolLM2: BEI, HEI, Embed Parrot, DCT defense.

Reproduces Wan et al. 2024 (Tables 2-6) on a real pretrained model:

1. per-layer BEI/HEI (Sec. 4.1-4.2) on held-out text of every corpus
   (Tables 2-3);
2. Embed Parrot (Sec. 4.3) trained on the hidden states of one deep layer
   of one corpus (Enron by default, the analogue of fingpt-sentiment) and
   tested on the held-out part of that corpus and on the others (Table 4),
   by sequence-length bucket (Table 5);
3. the DCT/overlap defense (Sec. 5.3.1) at layer 0 and at the deep layer:
   attack scores on defended states and the target's perplexity with and
   without the defense (Table 6).

`--ep_variants` picks the Embed Parrot variants: `ep` (the paper's
architecture) and `ep_skip` (plus a ridge-initialised linear skip, ours).
Summary keys: `f1|rouge1|rougeL|sbert@data=...,layer=...,method=...` with
method in {bei, hei, ep, ep_bei, ep_skip, ep_skip_bei}; `...@bucket=lo-hi,...`
(Table 5); `...@data=...,defense=dct,layer=...,method=...,subsets=k` and
`ppl@defense=dct,layer=...,subsets=k` / `ppl@defense=none` (Table 6).

The target's hidden states are computed once and cached (`--cache_dir`);
a re-run with the same `--workdir` resumes from `results.jsonl` and the
Embed Parrot checkpoint.

  python -m experiments.embed_parrot \
      --flagfile=experiments/configs/embed_parrot_smollm2.flags
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from experiments import common
from leakjax import data as data_lib
from leakjax import io, models, sharding
from leakjax.attacks import embed_parrot as ep
from leakjax.attacks import embedding_inversion as ei
from leakjax.attacks import text_metrics
from leakjax.errors import LeakjaxError
from leakjax.models import Model

FLAGS = flags.FLAGS
METRICS = ('f1', 'rouge1', 'rougeL', 'sbert')
# Table 5 / Table 8 token-length buckets, [lo, hi).
BUCKETS = ((1, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 256))

# ---------------------------------------------------------- paper numbers
# Wan et al. 2024, Llama2-7B (32 layers), in %. Table 2: BEI/HEI by layer.
PAPER_LAYERS = ('0', '5', '10', '15', '20', '25', '30', 'last')
PAPER_TABLE2 = {
  'bei': {
    'f1': (0.17, 1.98, 2.46, 3.25, 13.10, 18.10, 20.41, 23.01),
    'rouge1': (0.33, 1.71, 1.75, 3.20, 9.33, 13.34, 16.66, 18.23),
    'rougeL': (0.33, 1.68, 1.69, 3.04, 8.57, 12.19, 15.69, 17.59),
    'sbert': (3.00, 2.31, 2.99, 6.62, 22.61, 30.95, 22.30, 32.41),
  },
  'hei': {
    'f1': (85.07, 73.44, 65.39, 61.73, 53.50, 39.30, 26.08, 16.67),
    'rouge1': (65.22, 58.93, 53.09, 50.11, 44.38, 34.39, 26.02, 19.51),
    'rougeL': (65.23, 58.95, 53.07, 50.04, 44.40, 34.37, 25.95, 19.13),
    'sbert': (90.15, 84.19, 80.27, 77.75, 72.65, 61.01, 50.48, 25.11),
  },
}
# Table 4, Llama2-7B layer 30, EP trained on fingpt-sentiment.
PAPER_TABLE4 = {
  'fingpt-sentiment (train distribution)': {
    'ep': dict(rouge1=67.30, rougeL=67.23, f1=61.69, sbert=71.47),
    'ep+ppl': dict(rouge1=66.28, rougeL=66.21, f1=60.73, sbert=70.91),
  },
  'fingpt-fiqa_qa': {
    'ep': dict(rouge1=65.99, rougeL=65.97, f1=62.48, sbert=68.85),
    'ep+ppl': dict(rouge1=64.98, rougeL=64.96, f1=61.42, sbert=67.70),
  },
  'wikitext': {
    'ep': dict(rouge1=66.03, rougeL=65.84, f1=63.55, sbert=60.46),
    'ep+ppl': dict(rouge1=65.45, rougeL=65.24, f1=62.93, sbert=60.26),
  },
}
# Table 5 (fingpt-sentiment) and Table 8 (wikitext): Llama2-7B EP by length.
PAPER_TABLE5 = {
  '1-8': dict(rouge1=67.23, rougeL=67.23, f1=66.49, sbert=74.28),
  '8-16': dict(rouge1=68.57, rougeL=68.55, f1=65.64, sbert=71.29),
  '16-32': dict(rouge1=66.78, rougeL=66.74, f1=61.80, sbert=70.91),
  '32-64': dict(rouge1=67.33, rougeL=67.25, f1=60.18, sbert=71.52),
  '64-128': dict(rouge1=68.59, rougeL=68.39, f1=63.07, sbert=75.07),
  '128-256': dict(rouge1=64.81, rougeL=64.24, f1=59.32, sbert=74.86),
}
PAPER_TABLE8 = {
  '1-8': dict(rouge1=98.58, rougeL=98.58, f1=98.58, sbert=98.87),
  '8-16': dict(rouge1=47.69, rougeL=47.69, f1=47.11, sbert=52.53),
  '16-32': dict(rouge1=49.78, rougeL=49.71, f1=47.40, sbert=48.19),
  '32-64': dict(rouge1=50.66, rougeL=50.61, f1=46.26, sbert=40.90),
  '64-128': dict(rouge1=48.29, rougeL=48.00, f1=43.16, sbert=33.84),
  '128-256': dict(rouge1=49.35, rougeL=48.86, f1=43.91, sbert=33.14),
}
# Table 6: EP on defended Llama2-7B hidden states; PPL origin/defense.
PAPER_TABLE6 = {
  '0': dict(rouge1=8.96, rougeL=8.93, f1=3.21, sbert=11.62, ppl=(5.44, 8.85)),
  '30': dict(
    rouge1=16.48, rougeL=16.00, f1=10.19, sbert=23.51, ppl=(5.44, 9.13)
  ),
}

EP_VARIANTS = ('ep', 'ep_skip')
DEFAULT_CORPORA = (
  'enron=../shared/data/enron_film/dataset.json,'
  'wikitext=../shared/data/wikitext-2/valid.txt,'
  'sms=../shared/data/sms_spam/SMSSpamCollection.tsv'
)


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
  """The experiment's own flags (common ones: experiments.common)."""
  define = dict(flag_values=fv)
  flags.DEFINE_string(
    'model',
    models.SMOLLM2_ALIAS,
    'Target: checkpoint dir, .gguf, or smollm2-135m.',
    **define,
  )
  flags.DEFINE_string(
    'corpora',
    DEFAULT_CORPORA,
    'name=path,... of the test corpora (.txt/.json/.tsv).'
    ' Ignored when --data is given.',
    **define,
  )
  flags.DEFINE_string(
    'train_corpus',
    'enron',
    'Corpus whose training split trains Embed Parrot.',
    **define,
  )
  flags.DEFINE_list(
    'sentence_split',
    ['wikitext'],
    'Corpora whose lines are paragraphs: drop "= heading ="'
    ' lines and split into sentences.',
    **define,
  )
  flags.DEFINE_list(
    'layers',
    ['0', '5', '10', '15', '20', '25', '30', 'last'],
    'Layers for BEI/HEI.',
    **define,
  )
  flags.DEFINE_integer(
    'deep_layer', 25, 'Layer attacked by Embed Parrot.', **define
  )
  flags.DEFINE_integer('num_test', 100, 'Held-out texts per corpus.', **define)
  flags.DEFINE_integer(
    'num_train', 2000, 'Training texts for Embed Parrot.', **define
  )
  flags.DEFINE_float(
    'test_fraction',
    0.2,
    'Held-out share of every corpus (Sec. 5.1.1: 20%).',
    **define,
  )
  flags.DEFINE_integer('max_length', 64, 'Tokens kept per text.', **define)
  flags.DEFINE_bool(
    'add_bos', False, 'Prefix the BOS token (not scored).', **define
  )
  flags.DEFINE_integer('batch_size', 16, 'Target-model batch size.', **define)
  flags.DEFINE_integer('ep_width', 256, 'Embed Parrot decoder width.', **define)
  flags.DEFINE_integer('ep_layers', 4, 'Embed Parrot decoder blocks.', **define)
  flags.DEFINE_integer('ep_heads', 4, 'Embed Parrot attention heads.', **define)
  flags.DEFINE_integer(
    'ep_steps', 1500, 'Embed Parrot training steps.', **define
  )
  flags.DEFINE_integer(
    'ep_batch_size', 32, 'Embed Parrot batch size.', **define
  )
  flags.DEFINE_float(
    'ep_lr', 1e-3, 'Embed Parrot peak learning rate.', **define
  )
  flags.DEFINE_list(
    'ep_variants',
    ['ep'],
    "Embed Parrot variants: ep (the paper's architecture), ep_skip (plus"
    ' a ridge-initialised linear skip from input to output).',
    **define,
  )
  flags.DEFINE_integer(
    'ep_ppl_steps', 0, 'Fine-tune steps of EP+PPL after EP (0: skip).', **define
  )
  flags.DEFINE_float('ep_ppl_weight', 0.1, 'Weight of the PPL term.', **define)
  flags.DEFINE_list(
    'defense_layers',
    ['0', '25'],
    'Layers where the DCT defense is applied.',
    **define,
  )
  flags.DEFINE_list(
    'defense_subsets',
    ['1', '4'],
    'Numbers of subsets k of the overlap matrices.',
    **define,
  )
  flags.DEFINE_integer(
    'ppl_texts', 32, 'Texts per corpus for the perplexity of Table 6.', **define
  )
  flags.DEFINE_bool('sbert', True, 'Score Sentence-BERT similarity.', **define)
  flags.DEFINE_integer(
    'sbert_limit',
    50,
    'Texts per row scored with Sentence-BERT (the rest'
    ' only with F1/ROUGE: SBERT is the slow metric).',
    **define,
  )
  flags.DEFINE_string(
    'cache_dir',
    '/tmp/leakjax_embed_parrot_cache',
    'Hidden-state caches and the Embed Parrot checkpoint.',
    **define,
  )


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything that determines the results (written to config.json)."""

  model: str
  corpora: tuple[tuple[str, str], ...]
  train_corpus: str
  sentence_split: tuple[str, ...]
  layers: tuple[str, ...]
  deep_layer: int
  num_test: int
  num_train: int
  test_fraction: float
  max_length: int
  add_bos: bool
  batch_size: int
  ep_width: int
  ep_layers: int
  ep_heads: int
  ep_steps: int
  ep_batch_size: int
  ep_lr: float
  ep_variants: tuple[str, ...]
  ep_ppl_steps: int
  ep_ppl_weight: float
  defense_layers: tuple[str, ...]
  defense_subsets: tuple[int, ...]
  ppl_texts: int
  sbert: bool
  sbert_limit: int
  seed: int
  mesh: str | None = None


def _parse_corpora(spec: str) -> tuple[tuple[str, str], ...]:
  out = []
  for item in spec.split(','):
    if not item.strip():
      continue
    if '=' not in item:
      raise LeakjaxError(
        f'--corpora item {item!r} is not name=path',
        'write e.g. enron=path/to/dataset.json',
      )
    name, path = item.split('=', 1)
    out.append((name.strip(), path.strip()))
  if not out:
    raise LeakjaxError('--corpora is empty', 'name at least one corpus')
  return tuple(out)


def config_from_flags(fv: flags.FlagValues = FLAGS) -> Config:
  """Builds the frozen config from parsed flags."""
  if fv.data:
    corpora = (('data', fv.data),)
    train_corpus = 'data'
  else:
    corpora = _parse_corpora(fv.corpora)
    train_corpus = fv.train_corpus
  if train_corpus not in dict(corpora):
    raise LeakjaxError(
      f'--train_corpus={train_corpus} is not one of the'
      f' corpora ({", ".join(n for n, _ in corpora)})'
    )
  try:
    subsets = tuple(int(k) for k in fv.defense_subsets)
  except ValueError:
    raise LeakjaxError(
      f'--defense_subsets={fv.defense_subsets} must be integers'
    ) from None
  return Config(
    model=fv.model,
    corpora=corpora,
    train_corpus=train_corpus,
    sentence_split=tuple(fv.sentence_split),
    layers=tuple(fv.layers),
    deep_layer=fv.deep_layer,
    num_test=fv.num_test,
    num_train=fv.num_train,
    test_fraction=fv.test_fraction,
    max_length=fv.max_length,
    add_bos=fv.add_bos,
    batch_size=fv.batch_size,
    ep_width=fv.ep_width,
    ep_layers=fv.ep_layers,
    ep_heads=fv.ep_heads,
    ep_steps=fv.ep_steps,
    ep_batch_size=fv.ep_batch_size,
    ep_lr=fv.ep_lr,
    ep_variants=tuple(fv.ep_variants),
    ep_ppl_steps=fv.ep_ppl_steps,
    ep_ppl_weight=fv.ep_ppl_weight,
    defense_layers=tuple(fv.defense_layers),
    defense_subsets=subsets,
    ppl_texts=fv.ppl_texts,
    sbert=fv.sbert,
    sbert_limit=fv.sbert_limit,
    seed=fv.seed,
    mesh=fv.mesh,
  )


# ------------------------------------------------------------------ data
@dataclasses.dataclass
class Split:
  """Tokenized texts of one corpus split.

  Attributes:
    texts: the raw texts.
    ids: int32 `[N, T]`, right-padded.
    mask: int32 `[N, T]`, 1 for real tokens (BOS included).
    score_mask: int32 `[N, T]`, the positions that are reconstructed and
      scored (BOS excluded).
    references: the decoded real tokens (the text the attack must recover).
  """

  texts: list[str]
  ids: np.ndarray
  mask: np.ndarray
  score_mask: np.ndarray
  references: list[str]

  @property
  def lengths(self) -> np.ndarray:
    return self.score_mask.sum(1)


def load_texts(name: str, path: str, split_sentences: bool) -> list[str]:
  """A corpus' texts, deduplicated in file order."""
  texts = data_lib.load_corpus(path)
  if split_sentences:
    texts = [
      s
      for t in texts
      if not t.startswith('=')
      for s in data_lib.split_sentences(t)
      if len(s.split()) >= 4
    ]
  texts = list(dict.fromkeys(texts))
  if len(texts) < 2:
    raise LeakjaxError(
      f'corpus {name} ({path}) has {len(texts)} distinct texts',
      'use a larger corpus',
    )
  return texts


def make_split(tokenizer, texts: Sequence[str], cfg: Config) -> Split:
  ids, mask, _ = data_lib.encode_corpus(
    tokenizer, texts, cfg.max_length, add_bos=cfg.add_bos, truncate=True
  )
  score_mask = mask.copy()
  if cfg.add_bos and tokenizer.bos_id is not None:
    score_mask[:, 0] = 0
  keep = score_mask.sum(1) > 0
  ids, mask, score_mask = ids[keep], mask[keep], score_mask[keep]
  texts = [t for t, k in zip(texts, keep) if k]
  refs = ei.decode_ids(tokenizer, ids, score_mask)
  return Split(list(texts), ids, mask, score_mask, refs)


def _sample(items: list[str], n: int, rng: np.random.Generator) -> list[str]:
  if n >= len(items):
    return list(items)
  return [items[i] for i in sorted(rng.choice(len(items), n, replace=False))]


# --------------------------------------------------------- target passes
def _width_batches(
  lengths: np.ndarray, batch_size: int, full: int, multiple: int = 16
):
  """Length-sorted batches `(rows, width)`; rows padded by repetition."""
  order = np.argsort(lengths, kind='stable')
  for start in range(0, len(order), batch_size):
    rows = order[start : start + batch_size]
    real = len(rows)
    rows = np.concatenate([rows, np.full(batch_size - real, rows[0])])
    width = min(
      full, multiple * math.ceil(max(lengths[rows].max(), 1) / multiple)
    )
    yield rows, real, width


@functools.partial(
  jax.jit, static_argnames=('model', 'decode_layers', 'keep_layers')
)
def _target_pass(
  params, ids, mask, *, model: Model, decode_layers: tuple, keep_layers: tuple
):
  """`(bei, hei, keep)` of one batch: BEI/HEI ids of `decode_layers` (int32
  `[layers, B, T]`, None if there are none) and the float16 states of
  `keep_layers`. Params are arguments, not closed-over constants: XLA would
  otherwise constant-fold the `[V, D]` embedding for tens of seconds."""
  states = ei.layer_states(
    model, params, ids, mask, list(decode_layers) + list(keep_layers)
  )
  bei, hei = [], []
  for h in states[: len(decode_layers)]:
    b, e = ei.bei_hei_ids(model, params, h)
    bei.append(b)
    hei.append(e)
  keep = states[len(decode_layers) :].astype(jnp.float16)
  if not decode_layers:
    return None, None, keep
  return jnp.stack(bei), jnp.stack(hei), keep


# BEI and HEI ids of given states `[B, T, D]`, the DCT defense and the
# perplexity with it: one compile per model (and layer), not per call.
_invert = jax.jit(ei.bei_hei_ids, static_argnames=('model',))
_apply_dct_defense = jax.jit(ei.apply_dct_defense)
_defended_nll = jax.jit(ei.defended_nll, static_argnames=('model', 'layer'))


def run_target(
  model: Model,
  params,
  split: Split,
  cfg: Config,
  *,
  decode_layers,
  keep_layers,
  mesh=None,
) -> dict[str, np.ndarray]:
  """One pass of the target over `split`.

  Returns:
    `bei`, `hei`: int32 `[len(decode_layers), N, T]` BEI/HEI ids;
    `keep`: float16 `[len(keep_layers), N, T, D]` hidden states.
  """
  fn = functools.partial(
    _target_pass,
    model=model,
    decode_layers=tuple(decode_layers),
    keep_layers=tuple(keep_layers),
  )
  n, full = split.ids.shape
  d = model.hidden_size
  out_bei = np.zeros((len(decode_layers), n, full), np.int32)
  out_hei = np.zeros((len(decode_layers), n, full), np.int32)
  out_keep = np.zeros((len(keep_layers), n, full, d), np.float16)
  started, done = time.time(), 0
  # Widths in multiples of 32: few shapes, so few compiles of the target.
  for rows, real, width in _width_batches(
    split.mask.sum(1), cfg.batch_size, full, multiple=32
  ):
    bei, hei, keep = fn(
      params,
      sharding.shard_batch(split.ids[rows, :width], mesh),
      sharding.shard_batch(split.mask[rows, :width], mesh),
    )
    r = rows[:real]
    if decode_layers:
      out_bei[:, r, :width] = np.asarray(bei)[:, :real]
      out_hei[:, r, :width] = np.asarray(hei)[:, :real]
    out_keep[:, r, :width] = np.asarray(keep)[:, :real]
    done += real
    rate = done / (time.time() - started)
    logging.info(
      'target pass: %d/%d texts (%.1f texts/s, ETA %.0f s)',
      done,
      n,
      rate,
      (n - done) / max(rate, 1e-9),
    )
  return {'bei': out_bei, 'hei': out_hei, 'keep': out_keep}


def _cache_key(*parts: Any) -> str:
  blob = json.dumps(parts, sort_keys=True, default=str).encode()
  return hashlib.sha1(blob).hexdigest()[:16]


def cached(path: Path, compute) -> dict[str, np.ndarray]:
  """Loads `path` (.npz) or computes, saves atomically and returns it."""
  if path.exists():
    with np.load(path) as f:
      return dict(f)
  arrays = compute()
  import io as _io  # pylint: disable=g-import-not-at-top

  buf = _io.BytesIO()
  np.savez(buf, **arrays)
  io.atomic_write_bytes(path, buf.getvalue())
  return arrays


# --------------------------------------------------------------- scoring
class Scorer:
  """Per-text metrics, with Sentence-BERT on the first `sbert_limit` texts."""

  def __init__(self, cfg: Config):
    self.embedder = text_metrics.SentenceEmbedder() if cfg.sbert else None
    self.limit = cfg.sbert_limit

  def __call__(
    self, preds: Sequence[str], refs: Sequence[str]
  ) -> dict[str, np.ndarray]:
    scores = text_metrics.score_texts(preds, refs)
    sb = np.full(len(preds), np.nan)
    if self.embedder is not None:
      k = min(self.limit, len(preds))
      sb[:k] = self.embedder.similarity(list(preds[:k]), list(refs[:k]))
    scores['sbert'] = sb
    return scores


def _mean(x: np.ndarray) -> float:
  x = x[~np.isnan(x)]
  return float(x.mean()) if len(x) else float('nan')


def _row_summary(scores: dict[str, np.ndarray]) -> dict[str, float]:
  return {m: _mean(scores[m]) for m in METRICS}


def _bucket_name(lo: int, hi: int) -> str:
  return f'{lo}-{hi}'


# ------------------------------------------------------------------ main
def run_experiment(
  cfg: Config,
  workdir: str | Path,
  cache_dir: str | Path,
  *,
  model: Model | None = None,
  params=None,
) -> dict[str, float]:
  """Runs everything; returns the summary dict (also written to workdir).

  `model` and `params` (both or neither) replace loading `cfg.model`.
  """
  if (model is None) != (params is None):
    raise LeakjaxError(
      'run_experiment takes model and params together',
      'pass both (e.g. from models.load) or neither',
    )
  writer = io.ExperimentWriter(workdir, cfg)
  cache_dir = Path(cache_dir)
  mesh = sharding.data_mesh(cfg.mesh)
  key = jax.random.key(cfg.seed)
  t_start = time.time()
  if model is None:
    model, params = models.load(cfg.model)
  tok = model.tokenizer
  if tok is None:
    raise LeakjaxError('the target model has no tokenizer')
  layers = [ei.parse_layer(model, x) for x in cfg.layers]
  deep = ei.parse_layer(model, cfg.deep_layer)
  if deep not in layers:
    layers.append(deep)
  defense_layers = [ei.parse_layer(model, x) for x in cfg.defense_layers]
  keep_layers = list(dict.fromkeys([0, deep] + defense_layers))
  layer_names = [str(x) for x in layers]

  # Data: held-out test texts of every corpus, training texts of one.
  rng = np.random.default_rng(cfg.seed)
  tests: dict[str, Split] = {}
  train_split = None
  for name, path in cfg.corpora:
    texts = load_texts(name, path, name in cfg.sentence_split)
    train_texts, test_texts = data_lib.train_eval_split(
      texts, cfg.test_fraction, seed=cfg.seed
    )
    tests[name] = make_split(tok, _sample(test_texts, cfg.num_test, rng), cfg)
    if name == cfg.train_corpus:
      train_split = make_split(
        tok, _sample(train_texts, cfg.num_train, rng), cfg
      )
  logging.info(
    'data: %s; train %d texts',
    {k: len(v.texts) for k, v in tests.items()},
    len(train_split.texts),
  )

  # Target hidden states, cached on disk.
  model_key = _cache_key(cfg.model, model, cfg.max_length, cfg.add_bos)
  passes = {}
  for name, split in tests.items():
    k = _cache_key(model_key, split.texts, layer_names, keep_layers)
    passes[name] = cached(
      cache_dir / f'test_{name}_{k}.npz',
      lambda split=split: run_target(
        model,
        params,
        split,
        cfg,
        decode_layers=layers,
        keep_layers=keep_layers,
        mesh=mesh,
      ),
    )
  k = _cache_key(model_key, train_split.texts, deep)
  train_pass = cached(
    cache_dir / f'train_{cfg.train_corpus}_{k}.npz',
    lambda: run_target(
      model,
      params,
      train_split,
      cfg,
      decode_layers=[],
      keep_layers=[0, deep],
      mesh=mesh,
    ),
  )
  t_states = time.time() - t_start
  scorer = Scorer(cfg)
  summary: dict[str, float] = {}

  def record(kind: str, scores: dict[str, np.ndarray], **params):
    row = writer.done(kind=kind, **params)
    if row is None:
      writer.add_result(
        {
          'kind': kind,
          **params,
          **_row_summary(scores),
          'n': int(len(scores['f1'])),
        }
      )
      row = writer.results[-1]  # as stored: NaN (no SBERT) became None
    for m in METRICS:
      if row.get(m) is not None:
        summary[io.summary_key(m, **params)] = float(row[m])
    return row

  def all_done(rows: Sequence[dict[str, Any]]) -> bool:
    """True (and summary filled) if every row in `rows` was recorded."""
    if any(writer.done(**r) is None for r in rows):
      return False
    for r in rows:
      record(r['kind'], {}, **{k: v for k, v in r.items() if k != 'kind'})
    return True

  def score_ids(pred_ids, split: Split, kind: str, **params):
    if writer.done(kind=kind, **params) is not None:
      return record(kind, {}, **params), None
    preds = ei.decode_ids(tok, pred_ids, split.score_mask)
    scores = scorer(preds, split.references)
    return record(kind, scores, **params), (preds, scores)

  # 1. Per-layer BEI/HEI (Tables 2-3).
  for name, split in tests.items():
    for li, layer in enumerate(layers):
      for method in ('bei', 'hei'):
        score_ids(
          passes[name][method][li],
          split,
          'inversion',
          data=name,
          layer=str(layer),
          method=method,
        )
  logging.info('per-layer BEI/HEI scored')

  # 2. Embed Parrot at the deep layer (Tables 1, 4, 5).
  d = model.hidden_size
  train_cfg = ep.TrainConfig(
    steps=cfg.ep_steps,
    batch_size=min(cfg.ep_batch_size, len(train_split.texts)),
    learning_rate=cfg.ep_lr,
    warmup_steps=max(cfg.ep_steps // 20, 1),
    log_every=max(cfg.ep_steps // 30, 1),
    checkpoint_every=max(cfg.ep_steps // 6, 1),
    seed=cfg.seed,
  )
  variants: dict[str, tuple[ep.EmbedParrotConfig, Any]] = {}
  histories: dict[str, list[dict[str, float]]] = {}
  t0 = time.time()
  for variant in cfg.ep_variants:
    if variant not in EP_VARIANTS:
      raise LeakjaxError(
        f'unknown --ep_variants entry {variant!r}',
        f'use some of {", ".join(EP_VARIANTS)}',
      )
    ep_config = ep.EmbedParrotConfig(
      input_dim=d,
      output_dim=d,
      width=cfg.ep_width,
      num_layers=cfg.ep_layers,
      num_heads=cfg.ep_heads,
      linear_skip=variant == 'ep_skip',
    )
    ep_key = _cache_key(k, ep_config, train_cfg)
    variables, history = ep.train(
      ep_config,
      train_pass['keep'][1],
      train_pass['keep'][0],
      train_split.score_mask,
      train_cfg,
      key=jax.random.fold_in(key, 1),
      checkpoint=cache_dir / f'{variant}_{ep_key}.ckpt',
    )
    history_path = Path(workdir) / f'{variant}_history.json'
    if history:
      io.atomic_write_text(history_path, json.dumps(history, indent=1))
    elif history_path.exists():  # resumed after training finished
      history = json.loads(history_path.read_text())
    variants[variant] = (ep_config, variables)
    histories[variant] = history
  t_ep = time.time() - t0
  if cfg.ep_ppl_steps > 0:
    base = cfg.ep_variants[0]
    ep_config, variables = variants[base]
    ppl_cfg = dataclasses.replace(
      train_cfg,
      steps=cfg.ep_ppl_steps,
      ppl_weight=cfg.ep_ppl_weight,
      learning_rate=cfg.ep_lr / 3,
      warmup_steps=1,
      batch_size=min(8, train_cfg.batch_size),
      log_every=max(cfg.ep_ppl_steps // 10, 1),
      checkpoint_every=max(cfg.ep_ppl_steps // 4, 1),
    )
    ppl_vars, _ = ep.train(
      ep_config,
      train_pass['keep'][1],
      train_pass['keep'][0],
      train_split.score_mask,
      ppl_cfg,
      key=jax.random.fold_in(key, 2),
      checkpoint=cache_dir
      / f'{base}_ppl_{_cache_key(k, ep_config, train_cfg, ppl_cfg)}.ckpt',
      target_model=model,
      target_params=params,
      init=variables,
    )
    variants[f'{base}_ppl'] = (ep_config, ppl_vars)

  def invert_np(hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(BEI, HEI) ids of host states `[N, T, D]`, in fixed-shape chunks."""
    bei, hei = [], []
    n, bs = len(hidden), cfg.batch_size
    for s in range(0, n, bs):
      rows = np.minimum(np.arange(s, s + bs), n - 1)  # repeat-pad the tail
      b, e = _invert(model, params, jnp.asarray(hidden[rows], jnp.float32))
      bei.append(np.asarray(b)[: min(bs, n - s)])
      hei.append(np.asarray(e)[: min(bs, n - s)])
    return np.concatenate(bei), np.concatenate(hei)

  deep_index = keep_layers.index(deep)
  for variant, (ep_config, variables) in variants.items():
    for name, split in tests.items():
      lengths = split.lengths
      buckets = [
        (lo, hi)
        for lo, hi in BUCKETS
        if ((lengths >= lo) & (lengths < hi)).any()
      ]
      rows = [
        dict(kind='inversion', data=name, layer=str(deep), method=m)
        for m in (variant, f'{variant}_bei')
      ] + [
        dict(
          kind='bucket',
          data=name,
          layer=str(deep),
          method=variant,
          bucket=_bucket_name(lo, hi),
        )
        for lo, hi in buckets
      ]
      if all_done(rows):
        continue
      pred = ep.predict_batches(
        ep_config,
        variables,
        passes[name]['keep'][deep_index],
        split.mask,
        batch_size=cfg.batch_size,
      )
      bei_ids, hei_ids = invert_np(pred)
      preds = ei.decode_ids(tok, hei_ids, split.score_mask)
      scores = scorer(preds, split.references)
      record('inversion', scores, data=name, layer=str(deep), method=variant)
      score_ids(
        bei_ids,
        split,
        'inversion',
        data=name,
        layer=str(deep),
        method=f'{variant}_bei',
      )
      # Table 5: by sequence-length bucket (HEI on the predicted H^0).
      for lo, hi in buckets:
        sel = (lengths >= lo) & (lengths < hi)
        record(
          'bucket',
          {m: v[sel] for m, v in scores.items()},
          data=name,
          layer=str(deep),
          method=variant,
          bucket=_bucket_name(lo, hi),
        )
  logging.info('Embed Parrot scored')

  # 3. DCT defense (Table 6).
  ppl_splits = {
    name: Split(
      s.texts[: cfg.ppl_texts],
      s.ids[: cfg.ppl_texts],
      s.mask[: cfg.ppl_texts],
      s.score_mask[: cfg.ppl_texts],
      s.references[: cfg.ppl_texts],
    )
    for name, s in tests.items()
  }

  def corpus_ppl(layer, overlap) -> float:
    # One compile per layer, not per defense: the overlap is an argument.
    fn = functools.partial(_defended_nll, model, layer=layer)
    total, count = 0.0, 0.0
    for split in ppl_splits.values():
      for rows, real, width in _width_batches(
        split.mask.sum(1), cfg.batch_size, split.ids.shape[1], multiple=32
      ):
        nll, cnt = fn(
          params,
          jnp.asarray(split.ids[rows, :width]),
          jnp.asarray(split.mask[rows, :width]),
          overlap=overlap,
        )
        total += float(np.asarray(nll)[:real].sum())
        count += float(np.asarray(cnt)[:real].sum())
    return math.exp(total / max(count, 1.0))

  row = writer.done(kind='ppl', defense='none')
  if row is None:
    writer.add_result(
      {'kind': 'ppl', 'defense': 'none', 'ppl': corpus_ppl(None, None)}
    )
    row = writer.results[-1]
  summary[io.summary_key('ppl', defense='none')] = row['ppl']
  for layer in defense_layers:
    li = keep_layers.index(layer)
    for subsets in cfg.defense_subsets:
      defense = ei.make_dct_defense(
        d, subsets, key=jax.random.fold_in(key, 1000 + subsets)
      )
      tag = dict(defense='dct', layer=str(layer), subsets=subsets)
      row = writer.done(kind='ppl', **tag)
      if row is None:
        writer.add_result(
          {'kind': 'ppl', **tag, 'ppl': corpus_ppl(layer, defense.overlap)}
        )
        row = writer.results[-1]
      summary[io.summary_key('ppl', **tag)] = row['ppl']
      methods = ('hei', 'bei') + (tuple(variants) if layer == deep else ())
      for name, split in tests.items():
        if all_done(
          [dict(kind='defense', data=name, method=m, **tag) for m in methods]
        ):
          continue
        states = passes[name]['keep'][li]
        defended = np.concatenate(
          [
            np.asarray(
              _apply_dct_defense(
                jnp.asarray(states[s : s + cfg.batch_size], jnp.float32),
                defense.overlap,
              )
            )
            for s in range(0, len(states), cfg.batch_size)
          ]
        )
        bei_ids, hei_ids = invert_np(defended)
        score_ids(hei_ids, split, 'defense', data=name, method='hei', **tag)
        score_ids(bei_ids, split, 'defense', data=name, method='bei', **tag)
        for variant, (ep_config, variables) in variants.items():
          if variant not in methods:
            continue
          pred = ep.predict_batches(
            ep_config,
            variables,
            defended,
            split.mask,
            batch_size=cfg.batch_size,
          )
          score_ids(
            invert_np(pred)[1],
            split,
            'defense',
            data=name,
            method=variant,
            **tag,
          )
  logging.info('defense scored')

  summary['seconds_hidden_states'] = t_states
  summary['seconds_ep_train'] = t_ep
  summary['seconds_total'] = time.time() - t_start
  for variant, history in histories.items():
    if history:
      summary[io.summary_key('final_cos_loss', method=variant)] = history[-1][
        'cos_loss'
      ]
  summary['num_train_texts'] = len(train_split.texts)
  for name, split in tests.items():
    summary[io.summary_key('num_test_texts', data=name)] = len(split.texts)
  md = render_markdown(
    cfg,
    summary,
    tests,
    layers,
    deep,
    model,
    models.num_params(params),
    writer,
    histories,
    list(variants),
  )
  writer.write_summary(summary, md)
  return summary


# ---------------------------------------------------------------- report
def _pct(x) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '-'
  return f'{100 * x:.1f}'


def render_markdown(
  cfg: Config,
  summary,
  tests,
  layers,
  deep,
  model,
  num_params,
  writer,
  histories,
  variants,
) -> str:
  names = list(tests)
  get = lambda m, **p: summary.get(io.summary_key(m, **p))
  lines = [
    f'# Embedding inversion (Wan et al. 2024) on `{cfg.model}`\n',
    f'Target: {model.family}, {model.num_layers} blocks, hidden'
    f' {model.hidden_size}, {num_params:,} parameters.'
    f' Test texts per corpus: {", ".join(f"{n} {len(tests[n].texts)}" for n in names)}'
    f' (held out, at most {cfg.max_length} tokens).'
    f' Embed Parrot: layer {deep}, trained on {summary["num_train_texts"]}'
    f' `{cfg.train_corpus}` texts for {cfg.ep_steps} steps. Scores in %;'
    ' "paper" = Llama2-7B (32 layers) from the paper.'
    f' Sentence-BERT on the first {cfg.sbert_limit} texts of each row.\n',
    '## BEI / HEI by layer (Table 2 analogue)\n',
    'BEI = LM head without the final norm (Sec. 4.1, Eq. 8); layer'
    ' "last" = final-normed output of the last block (as HF'
    ' `hidden_states[-1]`).\n',
  ]
  for metric in ('f1', 'rouge1', 'rougeL', 'sbert'):
    header = ['method', 'data'] + [str(x) for x in layers]
    rows = []
    for method in ('bei', 'hei'):
      for name in names:
        rows.append(
          [method, name]
          + [
            _pct(get(metric, data=name, layer=str(x), method=method))
            for x in layers
          ]
        )
      paper = PAPER_TABLE2[method][metric]
      rows.append(
        [method, 'paper']
        + [
          f'{paper[PAPER_LAYERS.index(str(x))]:.1f}'
          if str(x) in PAPER_LAYERS
          else '-'
          for x in layers
        ]
      )
    lines.append(f'\n**{metric}**\n\n' + io.markdown_table(header, rows))

  lines.append(
    f'\n## Embed Parrot vs BEI/HEI at layer {deep} (Tables 1, 4)'
    "\n\n`ep` = Embed Parrot with the paper's architecture (Input-Adapter,"
    ' decoder, Output-Adapter; cosine loss), decoded with HEI; `ep_skip` ='
    ' the same plus a ridge-initialised linear skip from input to output'
    ' (ours, not in the paper); `*_bei` = BEI on the predicted H^0.\n'
  )
  header = ['data', 'method', 'ROUGE-1', 'ROUGE-L', 'F1', 'SBERT']
  rows = []
  methods = ['bei', 'hei'] + [m for v in variants for m in (v, f'{v}_bei')]
  for name in names:
    for method in methods:
      rows.append(
        [name, method]
        + [
          _pct(get(m, data=name, layer=str(deep), method=method))
          for m in ('rouge1', 'rougeL', 'f1', 'sbert')
        ]
      )
  for pname, prow in PAPER_TABLE4.items():
    for method, vals in prow.items():
      rows.append(
        [f'paper: {pname}', method]
        + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      )
  lines.append(io.markdown_table(header, rows))

  lines.append('\n## Embed Parrot by token length (Tables 5, 8)\n')
  header = [
    'method',
    'data',
    'bucket',
    'n',
    'ROUGE-1',
    'ROUGE-L',
    'F1',
    'SBERT',
  ]
  rows = []
  bucket_rows = {
    (r['method'], r['data'], r['bucket']): r
    for r in writer.results
    if r.get('kind') == 'bucket'
  }
  for variant in variants:
    for name in names:
      for lo, hi in BUCKETS:
        r = bucket_rows.get((variant, name, _bucket_name(lo, hi)))
        if r is not None:
          rows.append(
            [variant, name, _bucket_name(lo, hi), r['n']]
            + [_pct(r.get(m)) for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
          )
  for pname, table in (
    ('paper: fingpt-sentiment (T5)', PAPER_TABLE5),
    ('paper: wikitext (T8)', PAPER_TABLE8),
  ):
    for bucket, vals in table.items():
      rows.append(
        ['ep', pname, bucket, '-']
        + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      )
  lines.append(io.markdown_table(header, rows))

  lines.append(
    '\n## DCT defense (Table 6 analogue)\n\n'
    '`E_trans = IDCT(DCT(E) O_s)` along the feature axis (orthonormal'
    ' DCT-II), `O_s` one of k overlap matrices built from a random'
    ' permutation of the d features split into k subsets (Sec. 5.3.1).'
    ' Attacks run on the defended hidden states (EP is the one trained'
    ' on undefended states); perplexity of the target with the'
    ' defense applied at that layer, on'
    f' {cfg.ppl_texts} texts per corpus.\n'
  )
  header = [
    'layer',
    'k subsets',
    'method',
    'data',
    'ROUGE-1',
    'ROUGE-L',
    'F1',
    'SBERT',
    'PPL origin/defense',
  ]
  rows = []
  base = summary.get(io.summary_key('ppl', defense='none'))
  for layer in cfg.defense_layers:
    for subsets in cfg.defense_subsets:
      tag = dict(defense='dct', layer=str(layer), subsets=subsets)
      ppl = summary.get(io.summary_key('ppl', **tag))
      for method in ['bei', 'hei'] + list(variants):
        for name in names:
          vals = [
            get(m, data=name, method=method, **tag)
            for m in ('rouge1', 'rougeL', 'f1', 'sbert')
          ]
          if all(v is None for v in vals):
            continue
          rows.append(
            [layer, subsets, method, name]
            + [_pct(v) for v in vals]
            + [f'{base:.2f}/{ppl:.2f}']
          )
  for layer, vals in PAPER_TABLE6.items():
    rows.append(
      [f'paper {layer}', '?', 'ep', 'fingpt']
      + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      + [f'{vals["ppl"][0]}/{vals["ppl"][1]}']
    )
  lines.append(io.markdown_table(header, rows))

  plots = _plots(summary, names, layers, deep, writer, histories, variants)
  if plots:
    lines.append('\n## Plots\n')
    lines.extend(f'![{p}]({p})\n' for p in plots)
  lines.append(
    f'\nTimings of this invocation (cached hidden states and checkpoints'
    f' count ~0): hidden states {summary["seconds_hidden_states"]:.0f}'
    f' s, Embed Parrot training {summary["seconds_ep_train"]:.0f} s,'
    f' total {summary["seconds_total"]:.0f} s.\n'
  )
  return '\n'.join(lines)


def _plots(
  summary, names, layers, deep, writer, histories, variants
) -> list[str]:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  out = []
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  xs = np.arange(len(layers))
  for ax, metric in zip(axes, ('rouge1', 'f1')):
    for method, style in (('bei', '--'), ('hei', '-')):
      for name in names:
        ys = [
          summary.get(
            io.summary_key(metric, data=name, layer=str(x), method=method),
            np.nan,
          )
          for x in layers
        ]
        ax.plot(
          xs,
          100 * np.array(ys, float),
          style,
          marker='o',
          label=f'{method} {name}',
        )
      paper = [
        PAPER_TABLE2[method][metric][PAPER_LAYERS.index(str(x))]
        if str(x) in PAPER_LAYERS
        else np.nan
        for x in layers
      ]
      ax.plot(
        xs,
        paper,
        style,
        color='gray',
        alpha=0.6,
        label=f'{method} paper Llama2-7B',
      )
    for variant, marker in zip(variants, '*Pxd'):
      for name in names:
        v = summary.get(
          io.summary_key(metric, data=name, layer=str(deep), method=variant)
        )
        if v is not None:
          ax.plot(
            [layers.index(deep)],
            [100 * v],
            marker=marker,
            markersize=12,
            linestyle='none',
            label=f'{variant} {name}',
          )
    ax.set_xticks(xs, [str(x) for x in layers])
    ax.set_xlabel('layer')
    ax.set_ylabel(f'{metric} (%)')
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=7, ncol=2)
  fig.suptitle('Reconstruction from hidden states by layer')
  out.append(writer.save_figure(fig, 'layers.png'))
  plt.close(fig)
  if any(histories.values()):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for variant, history in histories.items():
      ax.plot(
        [h['step'] for h in history],
        [h['cos_loss'] for h in history],
        label=variant,
      )
    ax.legend()
    ax.set_xlabel('step')
    ax.set_ylabel('1 - cos (train)')
    ax.set_yscale('log')
    ax.grid(alpha=0.3)
    ax.set_title(f'Embed Parrot training, layer {deep}')
    out.append(writer.save_figure(fig, 'ep_training.png'))
    plt.close(fig)
  return out


def main(argv):
  del argv
  cfg = config_from_flags(FLAGS)
  summary = run_experiment(cfg, FLAGS.workdir, FLAGS.cache_dir)
  keys = [k for k in summary if 'method=ep,' in k or k.endswith('method=ep')]
  for k in sorted(keys)[:12]:
    print(f'{k}: {summary[k]:.3f}')
  print(f'Wrote {FLAGS.workdir}/summary.json')


if __name__ == '__main__':
  define_flags()
  common.define_common_flags('/tmp/leakjax_embed_parrot')
  common.run(main)
