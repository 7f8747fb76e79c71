r"""The embedding-inversion experiment of Wan et al. 2024, as one runner.

:func:`run_experiment` reproduces Tables 2-6 on a real pretrained model:

1. per-layer BEI/HEI (Sec. 4.1-4.2) on held-out text of every corpus
   (Tables 2-3);
2. Embed Parrot (Sec. 4.3) trained on the hidden states of one deep layer
   of one corpus (Enron by default, the analogue of fingpt-sentiment) and
   tested on the held-out part of that corpus and on the others (Table 4),
   by sequence-length bucket (Table 5);
3. the DCT/overlap defense (Sec. 5.3.1) at layer 0 and at the deep layer:
   attack scores on defended states and the target's perplexity with and
   without the defense (Table 6).

Summary keys: `f1|rouge1|rougeL|sbert@data=...,layer=...,method=...` with
method in {bei, hei, ep, ep_bei, ep_skip, ep_skip_bei, ep_pretrained,
ep_pretrained_bei} (and `<variant>_ppl` with EP+PPL); `...@bucket=lo-hi,...`
(Table 5); `...@data=...,defense=dct,layer=...,method=...,subsets=k` and
`ppl@defense=dct,layer=...,subsets=k` / `ppl@defense=none` (Table 6).

The runner owns the host side: the compiled target pass (built once per
model and layer set), length-sorted padded batches, the hidden-state `.npz`
cache, scoring and the resumable `results.jsonl` (one
:class:`leakjax.io.ExperimentWriter`). Wall-clock timings go to
`timings.json`, never into the summary, so equal runs give equal
summaries. Tables and plots are the caller's (`experiments/
embed_parrot_report.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io as _io
import json
import math
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import io, metrics, models, provenance, sharding
from leakjax.attacks.inversion import bei_hei, dct
from leakjax.attacks.inversion import embed_parrot as ep
from leakjax.errors import LeakjaxError, check_positive
from leakjax.models import Model, sampling

METRICS = ('f1', 'rouge1', 'rougeL', 'sbert')
# Table 5 / Table 8 token-length buckets, [lo, hi).
BUCKETS = ((1, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 256))
EP_VARIANTS = ('ep', 'ep_skip', 'ep_pretrained')
DEFAULT_CORPORA = (
  'enron=film-enron',
  'wikitext=wikitext-2-valid',
  'sms=sms-spam',
)


# ------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class InversionExperimentConfig:
  """Everything that determines the results (written to config.json).

  Attributes:
    model: Target: checkpoint dir, .gguf, or smollm2-135m.
    corpora: name=path,... of the test corpora (.txt/.json/.tsv). Ignored
      when --data is given.
    train_corpus: Corpus whose training split trains Embed Parrot.
    sentence_split: Corpora whose lines are paragraphs: drop "= heading ="
      lines and split into sentences.
    layers: Layers for BEI/HEI.
    deep_layer: Layer attacked by Embed Parrot.
    num_test: Held-out texts per corpus.
    num_train: Training texts for Embed Parrot.
    train_samples: Sentences sampled from the target itself and added to
      Embed Parrot's training texts (0: none). Data-free augmentation (ours;
      the paper trains on one corpus, Sec. 5.1.1): the attacker holds the
      model, so its samples cost no data. :func:`model_samples` says how
      they are drawn and cut.
    sample_start_id: Token every sample starts from; -1: the tokenizer's
      BOS (an instruct model's BOS may open a chat turn: SmolLM2-Instruct's
      `<|endoftext|>`, id 0, starts a document).
    sample_temperature: Sampling temperature (> 0).
    sample_top_p: Nucleus mass of the samples, in (0, 1].
    test_fraction: Held-out share of every corpus (Sec. 5.1.1: 20%).
    max_length: Tokens kept per text.
    add_bos: Prefix the BOS token (not scored).
    batch_size: Target-model batch size.
    ep_width: Embed Parrot decoder width.
    ep_layers: Embed Parrot decoder blocks.
    ep_heads: Embed Parrot attention heads.
    ep_steps: Embed Parrot training steps.
    ep_batch_size: Embed Parrot batch size.
    ep_lr: Embed Parrot peak learning rate.
    ep_variants: Embed Parrot variants: ep (the paper's architecture with
      a small decoder trained from scratch), ep_skip (plus a
      ridge-initialised linear skip from input to output), ep_pretrained
      (the paper's architecture with the pretrained `ep_decoder` as Decode
      Model, all of it fine-tuned, the Input-Adapter started at the ridge
      map). The first variant is the one EP+PPL fine-tunes.
    ep_decoder: the pretrained Decode Model of ep_pretrained (alias, .gguf
      or checkpoint dir, as `model`); the paper's is GPT-2 XL.
    ep_decoder_lr: peak learning rate of ep_pretrained (a pretrained
      decoder is fine-tuned, so lower than ep_lr).
    ep_ppl_steps: Fine-tune steps of EP+PPL after EP (0: skip).
    ep_ppl_weight: Weight of the PPL term.
    defense_layers: Layers where the DCT defense is applied.
    defense_subsets: Numbers of subsets k of the overlap matrices.
    ppl_texts: Texts per corpus for the perplexity of Table 6.
    sbert: Score Sentence-BERT similarity.
    sbert_limit: Texts per row scored with Sentence-BERT (the rest only
      with F1/ROUGE: SBERT is the slow metric).
    seed: Random seed (data sample, Embed Parrot, DCT defenses).
    mesh: Device mesh of the target passes, e.g. "data:8"; None: one
      device.
  """

  model: str = models.SMOLLM2_ALIAS
  corpora: tuple[str, ...] = DEFAULT_CORPORA
  train_corpus: str = 'enron'
  sentence_split: tuple[str, ...] = ('wikitext',)
  layers: tuple[str, ...] = ('0', '5', '10', '15', '20', '25', '30', 'last')
  deep_layer: int = 25
  num_test: int = 100
  num_train: int = 2000
  train_samples: int = 0
  sample_start_id: int = -1
  sample_temperature: float = 1.0
  sample_top_p: float = 0.95
  test_fraction: float = 0.2
  max_length: int = 64
  add_bos: bool = False
  batch_size: int = 16
  ep_width: int = 256
  ep_layers: int = 4
  ep_heads: int = 4
  ep_steps: int = 1500
  ep_batch_size: int = 32
  ep_lr: float = 1e-3
  ep_variants: tuple[str, ...] = ('ep',)
  ep_decoder: str = ''
  ep_decoder_lr: float = 1e-4
  ep_ppl_steps: int = 0
  ep_ppl_weight: float = 0.1
  defense_layers: tuple[str, ...] = ('0', '25')
  defense_subsets: tuple[int, ...] = (1, 4)
  ppl_texts: int = 32
  sbert: bool = True
  sbert_limit: int = 50
  seed: int = 0
  mesh: str | None = None

  def __post_init__(self):
    check_positive(
      self,
      'num_test',
      'num_train',
      'max_length',
      'batch_size',
      'ep_width',
      'ep_layers',
      'ep_heads',
      'ep_batch_size',
    )
    check_positive(
      self,
      'ep_steps',
      'ep_ppl_steps',
      'sbert_limit',
      'ppl_texts',
      'train_samples',
      minimum=0,
    )
    if not self.sample_temperature > 0:
      raise LeakjaxError(
        f'--sample_temperature={self.sample_temperature} must be positive'
      )
    if not 0 < self.sample_top_p <= 1:
      raise LeakjaxError(
        f'--sample_top_p={self.sample_top_p} must be in (0, 1]',
        'pass e.g. --sample_top_p=0.95 (1: no truncation)',
      )
    if self.defense_subsets:
      check_positive(self, 'defense_subsets')
    check_positive(self, 'deep_layer', 'seed', minimum=0)
    if not 0 < self.test_fraction < 1:
      raise LeakjaxError(
        f'--test_fraction={self.test_fraction} must be in (0, 1)',
        'pass e.g. --test_fraction=0.2 (Sec. 5.1.1)',
      )
    names = [name for name, _ in self.corpus_paths()]
    if self.train_corpus not in names:
      raise LeakjaxError(
        f'--train_corpus={self.train_corpus} is not one of the'
        f' corpora ({", ".join(names)})'
      )
    for variant in self.ep_variants:
      if variant not in EP_VARIANTS:
        raise LeakjaxError(
          f'unknown --ep_variants entry {variant!r}',
          f'use some of {", ".join(EP_VARIANTS)}',
        )
    if 'ep_pretrained' in self.ep_variants and not self.ep_decoder:
      raise LeakjaxError(
        '--ep_variants=ep_pretrained needs a pretrained Decode Model',
        'pass --ep_decoder=smollm2-135m (or a .gguf / checkpoint dir)',
      )
    if not self.ep_decoder_lr > 0:
      raise LeakjaxError(
        f'--ep_decoder_lr={self.ep_decoder_lr} must be positive'
      )

  def corpus_paths(self) -> tuple[tuple[str, str], ...]:
    """`corpora` as `(name, path)` pairs."""
    return parse_corpora(self.corpora)


def parse_corpora(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
  """`('name=path', ...)` -> `((name, path), ...)`, empty items skipped.

  >>> parse_corpora(['a=x.txt', ' b = y.json'])
  (('a', 'x.txt'), ('b', 'y.json'))
  """
  out = []
  for item in items:
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

  def first(self, n: int) -> Split:
    """The split's first `n` texts."""
    return Split(
      self.texts[:n],
      self.ids[:n],
      self.mask[:n],
      self.score_mask[:n],
      self.references[:n],
    )


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


def make_split(
  tokenizer, texts: Sequence[str], cfg: InversionExperimentConfig
) -> Split:
  ids, mask, _ = data_lib.encode_corpus(
    tokenizer, texts, cfg.max_length, add_bos=cfg.add_bos, truncate=True
  )
  score_mask = mask.copy()
  if cfg.add_bos and tokenizer.bos_id is not None:
    score_mask[:, 0] = 0
  keep = score_mask.sum(1) > 0
  ids, mask, score_mask = ids[keep], mask[keep], score_mask[keep]
  texts = [t for t, k in zip(texts, keep) if k]
  refs = bei_hei.decode_ids(tokenizer, ids, score_mask)
  return Split(list(texts), ids, mask, score_mask, refs)


def _sample(items: list[str], n: int, rng: np.random.Generator) -> list[str]:
  if n >= len(items):
    return list(items)
  return [items[i] for i in sorted(rng.choice(len(items), n, replace=False))]


def model_samples(
  model: Model,
  params,
  cfg: InversionExperimentConfig,
  *,
  key: jax.Array,
  batch_size: int = 64,
) -> list[str]:
  """`cfg.train_samples` distinct sentences sampled from the target.

  Rows of `cfg.max_length` tokens are drawn from `cfg.sample_start_id`
  (:func:`leakjax.models.sampling.sample`, temperature and top-p from the
  config), `batch_size` at a time, decoded and cut into sentences
  (:func:`leakjax.data.split_sentences`). A row's last piece is dropped
  (the row's length, not the model, ended it), and so are pieces of fewer
  than 4 words (the rule the sentence-split corpora follow) and repeats.
  Rows are drawn until enough sentences are kept; the first
  `cfg.train_samples` are returned, in order of drawing.
  """
  tok = model.tokenizer
  start = cfg.sample_start_id if cfg.sample_start_id >= 0 else tok.bos_id
  if start is None or not 0 <= start < model.vocab_size:
    raise LeakjaxError(
      f'no valid token to start the samples from (got {start})',
      'pass --sample_start_id=ID, e.g. the end-of-text id',
    )
  prompt = jnp.full((batch_size, 1), start, jnp.int32)
  kept: dict[str, None] = {}
  started, rows = time.time(), 0
  while len(kept) < cfg.train_samples:
    ids = sampling.sample(
      model,
      params,
      jax.random.fold_in(key, rows),
      prompt,
      num_tokens=cfg.max_length,
      temperature=cfg.sample_temperature,
      top_p=cfg.sample_top_p,
    )
    before = len(kept)
    for row in np.asarray(ids)[:, 1:]:
      text = tok.decode([int(t) for t in row])
      for sentence in data_lib.split_sentences(text)[:-1]:
        sentence = sentence.strip()
        if len(sentence.split()) >= 4:
          kept.setdefault(sentence)
    rows += batch_size
    if len(kept) == before:
      raise LeakjaxError(
        f'{batch_size} samples gave no new sentence of >= 4 words',
        'raise --max_length or --sample_temperature',
      )
    logging.info(
      'model samples: %d/%d sentences from %d rows (%.0f s)',
      min(len(kept), cfg.train_samples),
      cfg.train_samples,
      rows,
      time.time() - started,
    )
  return list(kept)[: cfg.train_samples]


def _pad_to(x: np.ndarray, width: int, axis: int) -> np.ndarray:
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, width - x.shape[axis])
  return np.pad(x, pad)


def concat_splits(a: Split, b: Split) -> Split:
  """The texts of `a`, then those of `b`, right-padded to the wider one."""
  width = max(a.ids.shape[1], b.ids.shape[1])
  cat = lambda x, y: np.concatenate(
    [_pad_to(x, width, 1), _pad_to(y, width, 1)]
  )
  return Split(
    a.texts + b.texts,
    cat(a.ids, b.ids),
    cat(a.mask, b.mask),
    cat(a.score_mask, b.score_mask),
    a.references + b.references,
  )


# --------------------------------------------------------- target passes
def width_batches(
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
  states = bei_hei.layer_states(
    model, params, ids, mask, list(decode_layers) + list(keep_layers)
  )
  bei, hei = [], []
  for h in states[: len(decode_layers)]:
    b, e = bei_hei.bei_hei_ids(model, params, h)
    bei.append(b)
    hei.append(e)
  keep = states[len(decode_layers) :].astype(jnp.float16)
  if not decode_layers:
    return None, None, keep
  return jnp.stack(bei), jnp.stack(hei), keep


# BEI and HEI ids of given states `[B, T, D]`, the DCT defense and the
# perplexity with it: one compile per model (and layer), not per call.
_invert = jax.jit(bei_hei.bei_hei_ids, static_argnames=('model',))
_apply_dct_defense = jax.jit(dct.apply_dct_defense)
_defended_nll = jax.jit(dct.defended_nll, static_argnames=('model', 'layer'))


def run_target(
  model: Model,
  params,
  split: Split,
  cfg: InversionExperimentConfig,
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
  for rows, real, width in width_batches(
    split.mask.sum(1), cfg.batch_size, full, multiple=32
  ):
    bei, hei, keep = fn(
      params,
      sharding.shard_batch(split.ids[rows, :width], mesh),
      sharding.shard_batch(split.mask[rows, :width], mesh),
    )
    r = rows[:real]
    bei, hei, keep = sharding.to_host((bei, hei, keep))
    if decode_layers:
      out_bei[:, r, :width] = bei[:, :real]
      out_hei[:, r, :width] = hei[:, :real]
    out_keep[:, r, :width] = keep[:, :real]
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
    return io.load_npy(path)
  arrays = compute()
  if io.is_primary():
    buf = _io.BytesIO()
    np.savez(buf, **arrays)
    io.atomic_write_bytes(path, buf.getvalue())
  return arrays


# --------------------------------------------------------------- scoring
def score_texts(
  predictions: Sequence[str],
  references: Sequence[str],
  embedder: metrics.SentenceEmbedder | None = None,
) -> dict[str, np.ndarray]:
  """Every metric of Sec. 5.1.3 per pair: `{'f1', 'rouge1', 'rougeL'[, 'sbert']}`.

  The SQuAD token F1, ROUGE-1 and ROUGE-L F-measures (rouge-score's
  default tokenizer, no stemming) and the Sentence-BERT cosine.

  Args:
    predictions: reconstructed texts.
    references: the original texts, same length.
    embedder: a :class:`leakjax.metrics.SentenceEmbedder`; None skips the
      'sbert' entry.

  Returns:
    A dict of float64 arrays `[len(predictions)]`.
  """
  if len(predictions) != len(references):
    raise LeakjaxError(
      f'{len(predictions)} predictions but {len(references)} references'
    )
  pairs = list(zip(predictions, references))
  rouge = [
    metrics.rouge_scores(p, r, stemmer=False, types=('rouge1', 'rougeL'))
    for p, r in pairs
  ]
  out = {
    'f1': np.array([metrics.token_f1(p, r) for p, r in pairs]),
    'rouge1': np.array([s['rouge1'] for s in rouge]),
    'rougeL': np.array([s['rougeL'] for s in rouge]),
  }
  if embedder is not None:
    out['sbert'] = embedder.similarity(predictions, references).astype(
      np.float64
    )
  return out


class Scorer:
  """Per-text metrics, with Sentence-BERT on the first `sbert_limit` texts."""

  def __init__(self, cfg: InversionExperimentConfig):
    self.embedder = metrics.SentenceEmbedder() if cfg.sbert else None
    self.limit = cfg.sbert_limit

  def __call__(
    self, preds: Sequence[str], refs: Sequence[str]
  ) -> dict[str, np.ndarray]:
    scores = score_texts(preds, refs)
    sb = np.full(len(preds), np.nan)
    if self.embedder is not None:
      k = min(self.limit, len(preds))
      sb[:k] = self.embedder.similarity(list(preds[:k]), list(refs[:k]))
    scores['sbert'] = sb
    return scores


def _mean(x: np.ndarray) -> float:
  x = x[~np.isnan(x)]
  return float(x.mean()) if len(x) else float('nan')


def row_summary(scores: dict[str, np.ndarray]) -> dict[str, float]:
  return {m: _mean(scores[m]) for m in METRICS}


def bucket_name(lo: int, hi: int) -> str:
  return f'{lo}-{hi}'


@dataclasses.dataclass
class InversionRun:
  """What :func:`run_experiment` returns: the numbers and what a report needs.

  Attributes:
    summary: `metric@key=value,...` -> number (deterministic: no timings);
      the caller writes it with `writer.write_summary`.
    timings: wall-clock seconds of this invocation (`timings.json`).
    writer: the workdir's writer (`results` holds every results.jsonl row).
    tests: the held-out split of every corpus.
    layers: the BEI/HEI layers (ints, or 'last').
    deep: the layer Embed Parrot attacks.
    variants: the Embed Parrot variants that were trained.
    histories: variant -> logged training metrics.
    model_family, model_num_layers, model_hidden_size, model_num_params:
      facts about the target, for the report.
  """

  summary: dict[str, float]
  timings: dict[str, float]
  writer: io.ExperimentWriter
  tests: dict[str, Split]
  layers: list[Any]
  deep: int
  variants: list[str]
  histories: dict[str, list[dict[str, float]]]
  model_family: str | None
  model_num_layers: int
  model_num_params: int
  model_hidden_size: int


def _load_decoder(cfg, model, params, source, weights):
  """`(decoder, its params, its weights' sha256)` of `cfg.ep_decoder`; the
  target itself (no second load) when both name the same file."""
  path = models.source_path(cfg.ep_decoder)
  if source is not None and path is not None and Path(path) == Path(source):
    return model, params, weights
  decoder, decoder_params = models.load(cfg.ep_decoder)
  digest = (
    provenance.file_sha256(path)
    if path is not None
    else provenance.pytree_sha256(decoder_params)
  )
  return decoder, decoder_params, digest


# ------------------------------------------------------------------ main
def run_experiment(
  cfg: InversionExperimentConfig,
  workdir: str | Path,
  cache_dir: str | Path,
  *,
  model: Model | None = None,
  params=None,
) -> InversionRun:
  """Runs the whole experiment (resumable); returns what the report needs.

  Writes `config.json`, `results.jsonl`, `<variant>_history.json` (and
  `<variant>_ppl_history.json` for EP+PPL) and `timings.json` to `workdir` (not the summary: see :class:`InversionRun`),
  hidden-state caches and Embed Parrot checkpoints to `cache_dir`.

  Args:
    cfg: the experiment's config.
    workdir: output folder; re-running with the same one resumes.
    cache_dir: folder of the `.npz` hidden-state caches and the
      `.safetensors` Embed Parrot checkpoints.
    model: the target (replaces loading `cfg.model`), with `params`.
    params: its parameters (both or neither).
  """
  if (model is None) != (params is None):
    raise LeakjaxError(
      'run_experiment takes model and params together',
      'pass both (e.g. from models.load) or neither',
    )
  source = models.source_path(cfg.model) if model is None else None
  writer = io.ExperimentWriter(
    workdir,
    cfg,
    inputs={
      **{f'corpus:{name}': path for name, path in cfg.corpus_paths()},
      'model': source,
    },
  )
  cache_dir = io.as_path(cache_dir)
  mesh = sharding.data_mesh(cfg.mesh)
  key = jax.random.key(cfg.seed)
  t_start = time.time()
  if model is None:
    model, params = models.load(cfg.model)
  tok = model.tokenizer
  if tok is None:
    raise LeakjaxError('the target model has no tokenizer')
  layers = [bei_hei.parse_layer(model, x) for x in cfg.layers]
  deep = bei_hei.parse_layer(model, cfg.deep_layer)
  if deep not in layers:
    layers.append(deep)
  defense_layers = [bei_hei.parse_layer(model, x) for x in cfg.defense_layers]
  keep_layers = list(dict.fromkeys([0, deep] + defense_layers))
  layer_names = [str(x) for x in layers]

  # Data: held-out test texts of every corpus, training texts of one.
  rng = np.random.default_rng(cfg.seed)
  tests: dict[str, Split] = {}
  train_split = None
  for name, path in cfg.corpus_paths():
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
  # The weights' own fingerprint: new weights at the same path (or passed
  # in memory) never read the old weights' cached states.
  weights = (
    provenance.file_sha256(source)
    if source is not None
    else provenance.pytree_sha256(params)
  )
  model_key = _cache_key(cfg.model, model, weights, cfg.max_length, cfg.add_bos)
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
  if cfg.train_samples:
    # The target's own samples join the training texts (cached: drawing
    # them takes minutes on a CPU); the corpus' cached states are reused.
    sample_key = _cache_key(
      model_key,
      cfg.train_samples,
      cfg.sample_start_id,
      cfg.sample_temperature,
      cfg.sample_top_p,
      cfg.seed,
    )
    texts_path = cache_dir / f'samples_{sample_key}.json'
    if texts_path.exists():
      sample_texts = json.loads(texts_path.read_text())
    else:
      sample_texts = model_samples(
        model, params, cfg, key=jax.random.fold_in(key, 3)
      )
      if io.is_primary():
        io.atomic_write_text(texts_path, json.dumps(sample_texts, indent=0))
    sample_split = make_split(tok, sample_texts, cfg)
    sample_pass = cached(
      cache_dir
      / f'train_samples_{_cache_key(model_key, sample_split.texts, deep)}.npz',
      lambda: run_target(
        model,
        params,
        sample_split,
        cfg,
        decode_layers=[],
        keep_layers=[0, deep],
        mesh=mesh,
      ),
    )
    train_split = concat_splits(train_split, sample_split)
    width = train_split.ids.shape[1]
    train_pass = {
      'keep': np.concatenate(
        [
          _pad_to(train_pass['keep'], width, 2),
          _pad_to(sample_pass['keep'], width, 2),
        ],
        1,
      )
    }
    k = _cache_key(k, sample_key)
    if io.is_primary():
      io.atomic_write_text(
        io.as_path(workdir) / 'train_samples.json',
        json.dumps(sample_split.texts, indent=0),
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
          **row_summary(scores),
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
    preds = bei_hei.decode_ids(tok, pred_ids, split.score_mask)
    scores = scorer(preds, split.references)
    return record(kind, scores, **params), (preds, scores)

  # 1. Per-layer BEI/HEI (Tables 2-3).
  counter = io.Progress(len(tests) * len(layers) * 2)
  for name, split in tests.items():
    for li, layer in enumerate(layers):
      for method in ('bei', 'hei'):
        _, fresh = score_ids(
          passes[name][method][li],
          split,
          'inversion',
          data=name,
          layer=str(layer),
          method=method,
        )
        if fresh is None:
          counter.skipped()
          continue
        counter.computed()
        logging.info(
          '[%s] %s layer %s %s scored', counter.describe(), name, layer, method
        )
  logging.info('per-layer BEI/HEI scored')

  # 2. Embed Parrot at the deep layer (Tables 1, 4, 5).
  d = model.hidden_size
  train_cfg = ep.train_config(
    cfg.ep_steps,
    min(cfg.ep_batch_size, len(train_split.texts)),
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
    variant_cfg, decoder_params, decoder_weights = train_cfg, None, None
    if variant == 'ep_pretrained':
      decoder, decoder_params, decoder_weights = _load_decoder(
        cfg, model, params, source, weights
      )
      ep_config = ep.EmbedParrotConfig(
        input_dim=d,
        output_dim=d,
        decoder=decoder,
        ridge_input_adapter=decoder.hidden_size == d,
      )
      # Two checkpoints, not six: each holds the whole decoder and its
      # optimiser state (1.6 GB for SmolLM2-135M).
      variant_cfg = dataclasses.replace(
        train_cfg,
        learning_rate=cfg.ep_decoder_lr,
        checkpoint_every=max(cfg.ep_steps // 2, 1),
      )
    else:
      ep_config = ep.EmbedParrotConfig(
        input_dim=d,
        output_dim=d,
        width=cfg.ep_width,
        num_layers=cfg.ep_layers,
        num_heads=cfg.ep_heads,
        linear_skip=variant == 'ep_skip',
      )
    ep_key = (
      _cache_key(k, ep_config, variant_cfg)
      if decoder_weights is None
      else _cache_key(k, ep_config, variant_cfg, decoder_weights)
    )
    variables, history = ep.train(
      ep_config,
      train_pass['keep'][1],
      train_pass['keep'][0],
      train_split.score_mask,
      variant_cfg,
      key=jax.random.fold_in(key, 1),
      workdir=cache_dir / f'{variant}_{ep_key}',
      decoder_params=decoder_params,
      progress=True,
    )
    if io.is_primary():
      history_path = io.as_path(workdir) / f'{variant}_history.json'
      io.atomic_write_text(history_path, json.dumps(history, indent=1))
    variants[variant] = (ep_config, variables)
    histories[variant] = history
  t_ep = time.time() - t0
  if cfg.ep_ppl_steps > 0:
    base = cfg.ep_variants[0]
    ep_config, variables = variants[base]
    ppl_cfg = dataclasses.replace(
      train_cfg,
      num_steps=cfg.ep_ppl_steps,
      learning_rate=(
        cfg.ep_decoder_lr if base == 'ep_pretrained' else cfg.ep_lr
      )
      / 3,
      warmup_steps=1,
      batch_size=min(8, train_cfg.batch_size),
      log_every=max(cfg.ep_ppl_steps // 10, 1),
      # A pretrained decoder's checkpoint is 1.6 GB: two, not four.
      checkpoint_every=max(
        cfg.ep_ppl_steps // (2 if base == 'ep_pretrained' else 4), 1
      ),
    )
    ppl_vars, ppl_history = ep.train(
      ep_config,
      train_pass['keep'][1],
      train_pass['keep'][0],
      train_split.score_mask,
      ppl_cfg,
      key=jax.random.fold_in(key, 2),
      ppl_weight=cfg.ep_ppl_weight,
      workdir=cache_dir
      / f'{base}_ppl_{_cache_key(k, ep_config, train_cfg, ppl_cfg, cfg.ep_ppl_weight)}',
      target_model=model,
      target_params=params,
      init=variables,
    )
    variants[f'{base}_ppl'] = (ep_config, ppl_vars)
    if io.is_primary():
      io.atomic_write_text(
        io.as_path(workdir) / f'{base}_ppl_history.json',
        json.dumps(ppl_history, indent=1),
      )

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
          bucket=bucket_name(lo, hi),
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
      preds = bei_hei.decode_ids(tok, hei_ids, split.score_mask)
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
          bucket=bucket_name(lo, hi),
        )
  logging.info('Embed Parrot scored')

  # 3. DCT defense (Table 6).
  ppl_splits = {name: s.first(cfg.ppl_texts) for name, s in tests.items()}

  def corpus_ppl(layer, overlap) -> float:
    # One compile per layer, not per defense: the overlap is an argument.
    fn = functools.partial(_defended_nll, model, layer=layer)
    total, count = 0.0, 0.0
    for split in ppl_splits.values():
      for rows, real, width in width_batches(
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
      defense = dct.make_dct_defense(
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

  timings = {
    'seconds_hidden_states': t_states,
    'seconds_ep_train': t_ep,
    'seconds_total': time.time() - t_start,
  }
  if writer.enabled:
    io.atomic_write_text(
      io.as_path(workdir) / 'timings.json', json.dumps(timings, indent=2)
    )
  for variant, history in histories.items():
    if history:
      summary[io.summary_key('final_cos_loss', method=variant)] = history[-1][
        'cos_loss'
      ]
  summary['num_train_texts'] = len(train_split.texts)
  if cfg.train_samples:
    summary['num_train_samples'] = len(sample_split.texts)
  for name, split in tests.items():
    summary[io.summary_key('num_test_texts', data=name)] = len(split.texts)
  return InversionRun(
    summary=summary,
    timings=timings,
    writer=writer,
    tests=tests,
    layers=layers,
    deep=deep,
    variants=list(variants),
    histories=histories,
    model_family=model.family,
    model_num_layers=model.num_layers,
    model_hidden_size=model.hidden_size,
    model_num_params=models.num_params(params),
  )
