r"""FILM experiment runner: the threat model of Sec. 3.3 and the attack of Sec. 4.

Read top-down from :func:`run`:

1. The private corpus is preprocessed as in Appendix B.1 (:func:`preprocess`:
   sentence split, fewer than `max_tokens` tokens, at least one named entity
   of the B.1 types, optional perplexity filter on the initial model).
2. The model (:func:`load_model`: SmolLM2-135M from its GGUF, a GPT-2 HF
   directory, or a small GPT-2 from scratch) is fine-tuned on the training
   sentences for `train_steps` steps -- FILM's single-client FL setting
   (Sec. 6.1, footnote 7) -- giving θ^t. The attacked batches come from these
   training sentences, so the model has seen them, as in the paper.
3. For each point of the sweep (:func:`sweep_points`), `num_batches` client
   batches are drawn (:func:`draw_batch`); the client's gradient at θ^t
   (FedSGD, optionally with a defense, :func:`make_defense`) is what the
   eavesdropper sees. :func:`attack_batch` recovers a bag of words (never
   the true token set), beam-searches sentences and reorders them
   (:func:`leakjax.attacks.film.recover`); :func:`bag_batch` only extracts
   bags (Table 4).
4. Each batch gives one row of metrics (FILM Sec. 6.1): ROUGE-1/2/L F and
   NERR of the recovered sentence against its best match in the batch, bag
   precision and recall; with `repetitions` > 1 also the multi-sentence
   recall and precision of Table 3.

The rows go to an :class:`leakjax.io.ExperimentWriter` (results.jsonl, so a
re-run resumes); the tables and plots are the caller's
(`experiments/film_report.py`). The compiled functions are module-level
`jax.jit`s with the model static, so the whole sweep compiles each once.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import fl, io, metrics, models
from leakjax import train as train_lib
from leakjax.attacks.film import bag as bow
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import pipeline
from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError, check_positive

MODES = ('attack', 'bag', 'utility')
INITS = ('pretrained', 'random')
GPT2_TINY = 'gpt2-tiny'  # --model value: a small GPT-2 trained from scratch
# FILM Table 3: the repetition counts k after which the multi-sentence
# recall/precision is reported (and after all repetitions).
MULTI_SENTENCE_COUNTS = (1, 5, 10, 20, 50, 100)


@dataclasses.dataclass(frozen=True)
class FilmExperimentConfig:
  """Everything that determines the experiment's results.

  Attributes:
    mode: attack: the FILM pipeline; bag: bag-of-words precision/recall only
      (Table 4); utility: what each defense costs (the perplexity columns of
      Tables 4 and 5): fine-tune for `train_steps` with every step's gradient
      under the defense, then the perplexity of the held-out split.
    model: smollm2-135m, an HF/GGUF checkpoint dir or .gguf, or 'gpt2-tiny'
      (a 2-layer GPT-2 with the GPT-2 tokenizer, for tests).
    init: pretrained or random weights (same architecture, re-initialised;
      FILM Sec. 6.2 "pretrained vs randomly-initialized").
    data: Corpus: a named data set (`python -m leakjax.data list`), a local
      .txt (one example per line), .json (list of strings) or .tsv file, or
      hub:NAME[@REVISION][:CONFIG[:SPLIT]]; None: the embedded quickstart corpus.
    data_column: the text field of the corpus's rows (.json objects, .tsv,
      hub rows); None: the default field (see `leakjax.data.load_corpus`).
    data_label: keep only the rows with FIELD=VALUE[,VALUE...], e.g.
      `Label=ham`; None: every row.
    max_sentences: Keep at most this many sentences after preprocessing.
    max_tokens: Sentences must have fewer tokens (Appendix B.1: 40).
    require_entity: Keep only sentences with a named entity (Appendix B.1;
      needs spaCy).
    max_perplexity: Perplexity filter on the initial model (Appendix B.1: 50
      on GPT-2); None skips it.
    eval_fraction: Held-out fraction (early stopping, eval perplexity).
    train_steps: t: fine-tuning steps before the attack (0: attack θ^0).
    train_batch_size: Fine-tuning batch size.
    learning_rate: Fine-tuning peak learning rate (FILM Sec. 6.1: 1e-5,
      linear decay).
    eval_every: Evaluate the held-out loss every this many steps (0: four
      times over train_steps).
    early_stopping_patience: Stop after this many evaluations in a row
      without a lower eval loss (FILM Sec. 6.1 trains "until the loss of the
      model on the evaluation set increased": 1); 0: train all train_steps.
      train_steps is then the cap (and the length of the linear decay).
      Decision: the attacked model is the one at which training stopped
      (the first whose eval loss went up), not the best one; the paper
      attacks the model it trained.
    attack_best: Attack the parameters with the lowest eval loss instead of
      the last (a sensitivity check of the decision above).
    batch_sizes: Client batch sizes b.
    num_batches: Attacked batches per b (FILM: 20).
    defenses: Client defenses: none, freeze, prune:<ratio>, dp:<epsilon>
      (DP-SGD at that ε for the whole training run).
    dp_clip: DP-SGD clip norm C.
    dp_delta: DP-SGD δ.
    dp_steps: Training steps the DP-SGD ε covers (σ is calibrated for them
      at sampling rate b/N); 0: train_steps (at least 1).
    bag_method: Bag-of-words method: auto, tied, norm, nonzero, dp.
    norm_z: Robust z of the tied method's norm test (test 3; inf: off).
    num_beams: Beam sizes k (Sec. 4.3; swept).
    num_groups: Diverse beam groups.
    diversity_penalty: λ of diverse beam search.
    ngram_size: n of the repeated n-gram penalty (0: none; swept).
    ngram_penalty: ρ of the n-gram penalty (inf: ban).
    length: Tokens generated per sentence when the gradient gives no
      maximum length.
    max_prompts: Start prompts kept per batch.
    prompts_per_search: 0: one pool (Alg. 1); 1: k beams per prompt.
    beta: β of Eq. 4 (reordering, Sec. 4.4; swept).
    phrase_steps: Phrase-wise reordering steps (Sec. 4.4: 200).
    token_steps: Token-wise reordering steps (Sec. 4.4: 200);
      phrase_steps = token_steps = 0 keeps only the truncation.
    truncate: Cut after the first sentence end when it lowers S (Sec. 4.4,
      footnote 6); with phrase_steps = token_steps = 0 and truncate=False
      the reordering stage is skipped.
    reorder_candidates: Candidates per reordering step.
    grad_paths: Comma-separated parameter paths (a/b/c) for the reorder
      gradient norm; empty: last block + final norm.
    repetitions: Beam searches per batch (multi-sentence recovery, Sec.
      4.5).
    seed: Random seed (data split, batch draws, reordering keys).
  """

  mode: str = 'attack'
  model: str = models.SMOLLM2_ALIAS
  init: str = 'pretrained'
  data: str | None = None
  data_column: str | None = None
  data_label: str | None = None
  max_sentences: int | None = None
  max_tokens: int = 40
  require_entity: bool = True
  max_perplexity: float | None = None
  eval_fraction: float = 0.1
  train_steps: int = 0
  train_batch_size: int = 16
  learning_rate: float = 1e-5
  eval_every: int = 0
  early_stopping_patience: int = 0
  attack_best: bool = False
  batch_sizes: tuple[int, ...] = (1, 16, 64, 128)
  num_batches: int = 20
  defenses: tuple[str, ...] = ('none',)
  dp_clip: float = 1.0
  dp_delta: float = 1e-5
  dp_steps: int = 0
  bag_method: str = 'auto'
  norm_z: float = 4.0
  num_beams: tuple[int, ...] = (32,)
  num_groups: int = 1
  diversity_penalty: float = 0.0
  ngram_size: tuple[int, ...] = (2,)
  ngram_penalty: float = math.inf
  length: int = 40
  max_prompts: int = 64
  prompts_per_search: int = 0
  beta: tuple[float, ...] = (1.0,)
  phrase_steps: int = 200
  token_steps: int = 200
  truncate: bool = True
  reorder_candidates: int = 16
  grad_paths: str = ''
  repetitions: int = 1
  seed: int = 0

  def __post_init__(self):
    if self.mode not in MODES:
      raise LeakjaxError(
        f'unknown --mode {self.mode!r}', f'use one of {", ".join(MODES)}'
      )
    if self.init not in INITS:
      raise LeakjaxError(
        f'unknown --init {self.init!r}', 'use pretrained or random'
      )
    if not self.batch_sizes or min(self.batch_sizes) < 1:
      raise LeakjaxError(
        f'batch sizes must be positive, got {self.batch_sizes}'
      )
    if self.num_batches < 1 or self.repetitions < 1:
      raise LeakjaxError('num_batches and repetitions must be >= 1')
    for d in self.defenses:
      parse_defense(d)
    check_positive(
      self,
      'max_tokens',
      'train_batch_size',
      'num_beams',
      'num_groups',
      'length',
      'max_prompts',
      'reorder_candidates',
    )
    check_positive(
      self,
      'train_steps',
      'eval_every',
      'early_stopping_patience',
      'dp_steps',
      'ngram_size',
      'prompts_per_search',
      'phrase_steps',
      'token_steps',
      'seed',
      minimum=0,
    )
    if self.max_sentences is not None:
      check_positive(self, 'max_sentences')
    if not 0 <= self.eval_fraction < 1:
      raise LeakjaxError(
        f'--eval_fraction={self.eval_fraction} must be in [0, 1)'
      )
    if self.mode == 'utility' and not (self.eval_fraction and self.train_steps):
      raise LeakjaxError(
        '--mode=utility measures the held-out perplexity after training',
        'set --eval_fraction > 0 and --train_steps > 0',
      )


def parse_defense(spec: str) -> tuple[str, float]:
  """'none' | 'freeze' | 'prune:<ratio>' | 'dp:<epsilon>' -> (kind, value)."""
  kind, _, value = spec.partition(':')
  if kind in ('none', 'freeze') and not value:
    return kind, 0.0
  if kind in ('prune', 'dp'):
    try:
      v = float(value)
    except ValueError:
      v = float('nan')
    if (kind == 'prune' and 0 <= v < 1) or (kind == 'dp' and v > 0):
      return kind, v
  raise LeakjaxError(
    f'bad defense {spec!r}',
    'use none, freeze, prune:<ratio in [0,1)> or dp:<eps>',
  )


# ------------------------------------------------------------------- data
def preprocess(
  texts: Sequence[str], tokenizer, cfg: FilmExperimentConfig, perplexity_fn=None
) -> list[str]:
  """Appendix B.1: sentences, < max_tokens tokens, a named entity, ppl."""
  sentences = []
  for t in texts:
    sentences.extend(data_lib.split_sentences(t))
  seen, kept = set(), []
  for s in sentences:
    if s in seen or len(tokenizer.encode(s)) >= cfg.max_tokens:
      continue
    seen.add(s)
    kept.append(s)
  if cfg.require_entity:
    ents = metrics.named_entities(kept)
    kept = [s for s, e in zip(kept, ents, strict=True) if e]
  if cfg.max_perplexity is not None and perplexity_fn is not None and kept:
    ppl = perplexity_fn(kept)
    kept = [s for s, p in zip(kept, ppl, strict=True) if p < cfg.max_perplexity]
  if cfg.max_sentences is not None:
    kept = kept[: cfg.max_sentences]
  if len(kept) < max(cfg.batch_sizes):
    raise LeakjaxError(
      f'only {len(kept)} sentences survive preprocessing (Appendix B.1),'
      f' fewer than the largest batch size {max(cfg.batch_sizes)}',
      'use more data, smaller --batch_sizes or relax --require_entity',
    )
  return kept


def load_model(cfg: FilmExperimentConfig):
  """`(model, params)` of `--model` (re-initialised with `--init=random`)."""
  if cfg.model == GPT2_TINY:
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top
    from leakjax.tokenization import gpt2_tokenizer  # pylint: disable=g-import-not-at-top

    config = gpt2.GPT2Config.tiny(vocab_size=50257, n_positions=64)
    return gpt2.init_model(
      config, key=jax.random.key(cfg.seed), tokenizer=gpt2_tokenizer()
    )
  model, params = models.load(cfg.model)
  if cfg.init == 'random':
    # Which initialiser to call is a converter-level choice, not an attack's.
    family = model.family
    if family == 'gpt2':
      from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

      model, params = gpt2.init_model(
        model.config, key=jax.random.key(cfg.seed), tokenizer=model.tokenizer
      )
    elif family == 'llama':
      from leakjax.models import llama  # pylint: disable=g-import-not-at-top

      model, params = llama.init_model(
        model.config, key=jax.random.key(cfg.seed), tokenizer=model.tokenizer
      )
    else:
      raise LeakjaxError(f'--init=random is not supported for {family}')
  return model, params


@functools.partial(jax.jit, static_argnames=('model',))
def _token_log_probs(model, params, ids, mask):
  return model.token_log_probs(params, ids, mask)


def perplexities(model, params, texts: Sequence[str], batch: int = 32):
  out = []
  for i in range(0, len(texts), batch):
    ids, mask = model.tokenizer.encode_batch(
      list(texts[i : i + batch]), add_bos=True
    )
    lp = np.asarray(
      _token_log_probs(model, params, jnp.asarray(ids), jnp.asarray(mask))
    )
    m = mask[:, 1:]
    out.extend(np.exp(-(lp * m).sum(1) / np.maximum(m.sum(1), 1)))
  return np.asarray(out)


def draw_batch(num: int, b: int, index: int, seed: int) -> list[int]:
  """The `index`-th client batch of size b (deterministic)."""
  rng = np.random.default_rng([seed, b, index])
  return sorted(rng.choice(num, size=b, replace=False).tolist())


# ------------------------------------------------------------------ attack
def make_defense(
  model, spec: str, cfg: FilmExperimentConfig, *, num_train: int, b: int
) -> tuple[fl.Defense, float | None]:
  """The client's defense and the per-coordinate noise std it adds."""
  kind, value = parse_defense(spec)
  if kind == 'none':
    return fl.Defense(), None
  if kind == 'freeze':
    return fl.freeze_embeddings(model), None
  if kind == 'prune':
    return fl.gradient_pruning(value), None
  # DP-SGD calibrated for `train_steps` steps at sampling rate b/N.
  steps = cfg.dp_steps or max(1, cfg.train_steps)
  sigma = fl.sigma_for_epsilon(
    value, min(1.0, b / num_train), steps, cfg.dp_delta
  )
  # Per-example gradients 4 at a time: memory of 4 copies of the model.
  defense = fl.dp_sgd(cfg.dp_clip, sigma, microbatch=min(b, 4))
  return defense, sigma * cfg.dp_clip / b


# One jitted client step for the whole run (a fresh `jax.jit` per batch
# would re-trace the model every time).
_CLIENT_GRADIENT = jax.jit(
  fl.client_gradient, static_argnames=('model', 'defense', 'microbatch')
)


# Client batches are padded to a multiple of this many tokens, so that
# batches of different lengths share one compiled gradient.
_TOKEN_BUCKET = 8


def client_gradient(
  model, params, texts: Sequence[str], defense, key, microbatch=None
):
  """The client's FedSGD gradient of `texts`, `microbatch` rows at a time.

  The batch is right-padded (mask 0) to a multiple of _TOKEN_BUCKET tokens
  within the model's longest sequence. Padding is invisible to the loss:
  masked positions carry no loss and, the models being causal, feed no
  valid position, so the gradient equals the unpadded one up to float32
  rounding of the longer sums over positions.
  """
  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
  width = -(-ids.shape[1] // _TOKEN_BUCKET) * _TOKEN_BUCKET
  if model.max_length is not None:
    width = min(width, max(ids.shape[1], model.max_length))
  if width > ids.shape[1]:
    extra = ((0, 0), (0, width - ids.shape[1]))
    ids = np.pad(ids, extra, constant_values=model.tokenizer.pad_id)
    mask = np.pad(mask, extra)
  return (
    _CLIENT_GRADIENT(
      model,
      params,
      jnp.asarray(ids),
      jnp.asarray(mask),
      defense=defense,
      key=key,
      microbatch=microbatch,
    ),
    ids,
    mask,
  )


def true_tokens(ids: np.ndarray, mask: np.ndarray) -> set[int]:
  return set(ids[mask > 0].tolist())


def film_config(
  cfg: FilmExperimentConfig, num_beams: int, ngram: int, beta: float
) -> pipeline.FilmConfig:
  reorder = None
  if cfg.phrase_steps or cfg.token_steps or cfg.truncate:
    # With 0 + 0 steps only step 0 runs: the truncation after the first
    # sentence end, kept when it lowers S (Sec. 4.4, footnote 6).
    reorder = ro.ReorderConfig(
      beta=beta,
      phrase_steps=cfg.phrase_steps,
      token_steps=cfg.token_steps,
      num_candidates=cfg.reorder_candidates,
      truncate=cfg.truncate,
    )
  groups = cfg.num_groups if num_beams % cfg.num_groups == 0 else 1
  return pipeline.FilmConfig(
    bag_method=cfg.bag_method,
    tied=bow.TiedBagConfig(norm_z=cfg.norm_z),
    beam=bs.BeamSearchConfig(
      num_beams=num_beams,
      num_groups=groups,
      diversity_penalty=cfg.diversity_penalty,
      ngram_size=ngram,
      ngram_penalty=cfg.ngram_penalty,
      length=cfg.length,
    ),
    reorder=reorder,
    max_prompts=cfg.max_prompts,
    prompts_per_search=cfg.prompts_per_search,
    repetitions=cfg.repetitions,
    grad_paths=_grad_paths(cfg),
  )


def _grad_paths(cfg):
  if not cfg.grad_paths:
    return None
  return tuple(tuple(p.split('/')) for p in cfg.grad_paths.split(','))


def sweep_points(cfg: FilmExperimentConfig) -> list[dict[str, Any]]:
  """The product of swept values; keys only for dimensions with > 1 value
  (and for a defense other than 'none', so its results say so)."""
  dims = {
    'b': cfg.batch_sizes,
    'beams': cfg.num_beams,
    'ngram': cfg.ngram_size,
    'beta': cfg.beta,
  }
  if cfg.mode == 'attack':
    dims['defense'] = cfg.defenses
  points = []
  for values in itertools.product(*dims.values()):
    point = dict(zip(dims, values, strict=True))
    point['key'] = {
      k: v
      for k, v in point.items()
      if k == 'b' or len(dims[k]) > 1 or (k == 'defense' and v != 'none')
    }
    points.append(point)
  return points


def _span_fields(bag) -> dict[str, Any]:
  """The span test's rank and validity (all the bag has to go on when the
  embeddings are frozen)."""
  if bag.evidence is None:
    return {}
  return {
    'span_rank': int(bag.evidence.span_rank),
    'span_valid': bool(bag.evidence.span_valid),
  }


def _empty_bag_row(point, index, texts, bag, truth, grad_s, start):
  """The row of a batch whose gradient gave an empty bag: all scores 0."""
  ents = metrics.named_entities(texts)
  best = metrics.best_of_batch(texts, '', entities=ents)
  return {
    **point['key'],
    'batch': index,
    'originals': list(texts),
    'recovered': [''],
    'beam_sentence': '',
    'rouge1': best['rouge1'],
    'rouge2': best['rouge2'],
    'rougeL': best['rougeL'],
    'nerr': best['nerr'],
    'match': best['match'],
    'bag_precision': 0.0,
    'bag_recall': 0.0,
    'bag_size': 0,
    'true_bag_size': len(truth),
    'num_prompts': 0,
    'grad_seconds': grad_s,
    'attack_seconds': time.perf_counter() - start,
    'empty_bag': True,
    **_span_fields(bag),
  }


def attack_batch(
  model,
  params,
  texts,
  point,
  cfg,
  *,
  num_train,
  index,
  mesh=None,
  microbatch=None,
):
  """One attacked batch -> a results row."""
  b = point['b']
  key = jax.random.key(cfg.seed)
  key = jax.random.fold_in(jax.random.fold_in(key, b), index)
  defense, noise = make_defense(
    model, point.get('defense', 'none'), cfg, num_train=num_train, b=b
  )
  start = time.perf_counter()
  grads, ids, mask = client_gradient(
    model, params, texts, defense, key, microbatch
  )
  grad_s = time.perf_counter() - start
  fcfg = film_config(cfg, point['beams'], point['ngram'], point['beta'])
  start = time.perf_counter()
  bag = bow.extract_bag(
    model,
    params,
    grads,
    method=fcfg.bag_method,
    noise_std=noise,
    config=fcfg.tied,
  )
  truth = true_tokens(ids, mask)
  if not any(i != model.tokenizer.bos_id for i in bag.ids.tolist()):
    # Nothing to search (e.g. frozen embeddings past the span test's rank
    # limit): the batch counts as recovering nothing.
    return _empty_bag_row(point, index, texts, bag, truth, grad_s, start)
  result = pipeline.recover(
    model,
    params,
    grads,
    config=fcfg,
    key=jax.random.fold_in(key, 1),
    noise_std=noise,
    bag=bag,
    mesh=mesh,
  )
  attack_s = time.perf_counter() - start
  prec, rec = metrics.bag_precision_recall(result.bag.ids, truth)
  ents = metrics.named_entities(texts)
  best = metrics.best_of_batch(texts, result.sentences[0], entities=ents)
  row = {
    **point['key'],
    'batch': index,
    'originals': list(texts),
    'recovered': result.sentences,
    'beam_sentence': result.recoveries[0].beam_text,
    'rouge1': best['rouge1'],
    'rouge2': best['rouge2'],
    'rougeL': best['rougeL'],
    'nerr': best['nerr'],
    'match': best['match'],
    'bag_precision': prec,
    'bag_recall': rec,
    'bag_size': int(len(result.bag.ids)),
    'true_bag_size': len(truth),
    'num_prompts': result.num_prompts,
    'grad_seconds': grad_s,
    'attack_seconds': attack_s,
  }
  if result.sentence_ends:  # searched beside a bag from a silent head
    row['sentence_ends_added'] = len(result.sentence_ends)
  row.update(_span_fields(result.bag))
  if cfg.repetitions > 1:
    # Table 3: recall/precision after the first k repetitions, and all.
    reps = len(result.sentences)
    by_count = metrics.sentence_matching_by_count(
      texts,
      result.sentences,
      sorted({k for k in MULTI_SENTENCE_COUNTS if k < reps} | {reps}),
    )
    row['multi_recall'] = by_count[reps]['recall']
    row['multi_precision'] = by_count[reps]['precision']
    row['multi_by_iter'] = {str(k): m for k, m in by_count.items()}
  return row


def bag_batch(
  model, params, texts, b, cfg, *, num_train, index, microbatch=None
):
  """Bag-only rows (one per defense x method) for one batch."""
  rows = []
  key = jax.random.fold_in(
    jax.random.fold_in(jax.random.key(cfg.seed), b), index
  )
  for spec in cfg.defenses:
    defense, noise = make_defense(model, spec, cfg, num_train=num_train, b=b)
    start = time.perf_counter()
    grads, ids, mask = client_gradient(
      model, params, texts, defense, key, microbatch
    )
    grad_s = time.perf_counter() - start
    truth = true_tokens(ids, mask)
    kind, _ = parse_defense(spec)
    tied = model.paths.lm_head is None
    if kind == 'dp':
      methods = ['dp']
    elif kind == 'prune':
      methods = ['nonzero'] + (['tied'] if tied else [])
    else:
      methods = ['tied', 'norm'] if tied else ['nonzero']
    rows_grad = jax.device_get(
      models.get_path(grads, model.paths.word_embeddings)
    )
    for method in methods:
      start = time.perf_counter()
      bag = bow.extract_bag(
        model,
        params,
        grads,
        method=method,
        noise_std=noise,
        config=bow.TiedBagConfig(norm_z=cfg.norm_z),
      )
      p, r = metrics.bag_precision_recall(bag.ids, truth)
      row = {
        'b': b,
        'batch': index,
        'defense': spec,
        'method': method,
        'bag_precision': p,
        'bag_recall': r,
        'bag_size': len(bag.ids),
        'true_bag_size': len(truth),
        'grad_seconds': grad_s,
        'bag_seconds': time.perf_counter() - start,
      }
      if bag.evidence is not None:
        row['span_rank'] = int(bag.evidence.span_rank)
        row['span_valid'] = bool(bag.evidence.span_valid)
      rows.append(row)
    if kind == 'none' and tied:
      # The baseline at its best threshold (an oracle: it knows the truth).
      p, r = oracle_norm_threshold(np.asarray(rows_grad), truth)
      rows.append(
        {
          'b': b,
          'batch': index,
          'defense': spec,
          'method': 'norm_oracle',
          'bag_precision': p,
          'bag_recall': r,
          'true_bag_size': len(truth),
        }
      )
  return rows


def oracle_norm_threshold(
  grad_rows: np.ndarray, truth: set[int]
) -> tuple[float, float]:
  """Precision/recall of the norm threshold with the best F1 (oracle)."""
  norms = np.linalg.norm(grad_rows.astype(np.float64), axis=1)
  labels = np.zeros(len(norms), bool)
  labels[list(truth)] = True
  cut = metrics.oracle_f1_cut(norms, labels, num_true=len(truth))
  return cut.precision, cut.recall


@dataclasses.dataclass
class FilmRun:
  """What :func:`run` leaves for the report.

  Attributes:
    results: every results row (the writer's, resumed ones included).
    extra: facts about the run for the report: `num_train`, and after
      fine-tuning `trained_steps`, `stopped_early`, `eval_ppl`,
      `attacked_step` (with `attack_best`).
  """

  results: list[dict[str, Any]]
  extra: dict[str, Any]


def train_config(cfg: FilmExperimentConfig, **fields) -> train_lib.TrainConfig:
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


def fine_tune(
  model,
  params,
  train_texts,
  eval_texts,
  cfg: FilmExperimentConfig,
  workdir,
  *,
  progress: bool = True,
) -> tuple[Any, dict[str, Any]]:
  """θ^t: `cfg.train_steps` fine-tuning steps; returns `(params, extra)`."""
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
  cfg: FilmExperimentConfig,
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
    defense, _ = make_defense(
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


def _log_rows(progress, b, index, rows, mode):
  head = rows[0]
  logging.info(
    '[%s] b=%d batch %d: %s',
    progress.describe(),
    b,
    index,
    (
      f'ROUGE-L {head["rougeL"]:.2f} bag P/R {head["bag_precision"]:.3f}'
      f'/{head["bag_recall"]:.3f}: {head["recovered"][0][:70]!r}'
      if mode == 'attack'
      else ' '.join(
        f'{r["method"]}:{r["bag_precision"]:.3f}/{r["bag_recall"]:.3f}'
        for r in rows
      )
    ),
  )


def run(
  cfg: FilmExperimentConfig,
  texts: Sequence[str],
  writer: io.ExperimentWriter,
  *,
  progress: bool = True,
  mesh=None,
  microbatch: int | None = None,
) -> FilmRun:
  """Runs (or resumes) the experiment on the private corpus `texts`.

  Args:
    cfg: the experiment.
    texts: the private corpus (documents; :func:`preprocess` splits them).
    writer: where the rows go; rows it already holds are not recomputed.
    progress: show the fine-tuning progress bar.
    mesh: `--mesh`: splits the beams and reorder candidates over devices.
    microbatch: `--grad_microbatch`: the client gradient that many
      sentences at a time (bounded memory).

  Neither `mesh` nor `microbatch` changes the results (up to float
  rounding), so they are not part of `cfg`.

  Returns:
    The rows and the facts the report needs.
  """
  start = time.perf_counter()
  model, params = load_model(cfg)
  logging.info('model %s loaded in %.1f s', model, time.perf_counter() - start)
  ppl_fn = lambda ts: (
    perplexities(model, params, ts) if cfg.max_perplexity is not None else None
  )
  sentences = preprocess(texts, model.tokenizer, cfg, ppl_fn)
  train_texts, eval_texts = (
    data_lib.train_eval_split(sentences, cfg.eval_fraction, seed=cfg.seed)
    if cfg.eval_fraction
    else (sentences, [])
  )
  extra: dict[str, Any] = {
    'num_train': len(train_texts),
    'hidden_size': model.hidden_size,
  }
  if cfg.mode == 'utility':
    utility(
      model,
      params,
      train_texts,
      eval_texts,
      cfg,
      writer,
      progress=progress,
    )
    return FilmRun(results=writer.results, extra=extra)
  if cfg.train_steps:
    params, trained = fine_tune(
      model,
      params,
      train_texts,
      eval_texts,
      cfg,
      writer.workdir / 'train',
      progress=progress,
    )
    extra.update(trained)
  if len(train_texts) < max(cfg.batch_sizes):
    raise LeakjaxError(
      f'{len(train_texts)} training sentences, fewer than'
      f' b = {max(cfg.batch_sizes)}',
      'use more data',
    )
  points = (
    sweep_points(cfg)
    if cfg.mode == 'attack'
    else [{'b': b, 'key': {'b': b}} for b in cfg.batch_sizes]
  )
  counter = io.Progress(len(points) * cfg.num_batches)
  for point in points:
    for index in range(cfg.num_batches):
      match = {**point['key'], 'batch': index}
      if cfg.mode == 'bag':
        match['method'] = 'tied' if model.paths.lm_head is None else 'nonzero'
        match['defense'] = cfg.defenses[0]
      if writer.done(**match) is not None:
        counter.skipped()
        continue
      rows_idx = draw_batch(len(train_texts), point['b'], index, cfg.seed)
      batch = [train_texts[i] for i in rows_idx]
      common = dict(num_train=len(train_texts), index=index)
      if cfg.mode == 'attack':
        rows = [
          attack_batch(
            model,
            params,
            batch,
            point,
            cfg,
            **common,
            mesh=mesh,
            microbatch=microbatch,
          )
        ]
      else:
        rows = bag_batch(
          model, params, batch, point['b'], cfg, **common, microbatch=microbatch
        )
      for row in rows:
        writer.add_result(row)
      counter.computed()
      _log_rows(counter, point['b'], index, rows, cfg.mode)
  return FilmRun(results=writer.results, extra=extra)
