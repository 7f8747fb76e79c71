r"""FILM: recover private sentences from federated gradients (Gupta et al. 2022).

Simulates the threat model of FILM Sec. 3.3 and runs the attack of Sec. 4:

1. The private corpus is preprocessed as in Appendix B.1 (sentence split,
   fewer than `max_tokens` tokens, at least one named entity of the B.1
   types, optional perplexity filter on the initial model).
2. The model (SmolLM2-135M from its GGUF, a GPT-2 HF directory, or a small
   GPT-2 from scratch) is fine-tuned on the training sentences for
   `train_steps` steps -- FILM's single-client FL setting (Sec. 6.1,
   footnote 7) -- giving θ^t. The attacked batches come from these
   training sentences, so the model has seen them, as in the paper.
3. For each batch size b, `num_batches` client batches are drawn; the
   client's gradient at θ^t (FedSGD, optionally with a defense) is what the
   eavesdropper sees. The attack recovers a bag of words (never the true
   token set), beam-searches sentences and reorders them.
4. Metrics per batch (FILM Sec. 6.1): ROUGE-1/2/L F and NERR of the
   recovered sentence against its best match in the batch, bag precision
   and recall; with `--repetitions` > 1 also the multi-sentence recall and
   precision of Table 3.

`--mode=bag` only extracts bags: it compares the tied-embedding method
with the norm-threshold baseline and reproduces the precision/recall
columns of Table 4 under gradient pruning and DP-SGD (`--defenses`).

  python -m experiments.film --flagfile=experiments/configs/film_quickstart.flags
  python -m experiments.film --flagfile=experiments/configs/film_enron.flags
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from experiments import common, film_data
from leakjax import data as data_lib
from leakjax import fl, io, models, sharding
from leakjax import train as train_lib
from leakjax.attacks import bag_of_words as bow
from leakjax.attacks import beam_search as bs
from leakjax.attacks import film, metrics
from leakjax.attacks import reorder as ro
from leakjax.errors import LeakjaxError

MODES = ('attack', 'bag')
INITS = ('pretrained', 'random')
# FILM Table 10, Enron Email rows: mean over 20 batches (best in brackets
# in the paper): b -> (ROUGE-1, ROUGE-2, ROUGE-L, NERR).
PAPER_TABLE10_ENRON = {
  1: (0.73, 0.45, 0.61, 0.34),
  16: (0.41, 0.20, 0.31, 0.40),
  64: (0.37, 0.18, 0.29, 0.35),
  128: (0.37, 0.19, 0.29, 0.38),
}
# FILM Table 9 (Enron, FILM row) adds b = 4: (R-1, R-2, R-L, NERR).
PAPER_TABLE9_ENRON = {4: (0.54, 0.32, 0.44, 0.66)}
# FILM Table 4 (GPT-2, WikiText-103, b = 16): defense -> (precision, recall).
PAPER_TABLE4 = {
  'none': (1.00, 1.00),
  'prune:0.9': (1.00, 1.00),
  'prune:0.99': (1.00, 1.00),
  'prune:0.999': (1.00, 0.98),
  'prune:0.9999': (1.00, 0.90),
  'dp:15': (0.97, 0.49),
  'dp:10': (0.88, 0.17),
  'dp:5': (0.29, 0.01),
  'dp:1': (0.00, 0.00),
}
# FILM Table 3 (GPT-2, WikiText-103, b = 16): repetitions of the beam
# search -> (recall, precision) of ROUGE-L > 0.25, means over batches.
PAPER_TABLE3 = {
  1: (0.03, 0.50),
  5: (0.13, 0.36),
  10: (0.19, 0.28),
  20: (0.25, 0.21),
  50: (0.30, 0.12),
  100: (0.34, 0.07),
}
GPT2_TINY = 'gpt2-tiny'  # --model value: a small GPT-2 trained from scratch


# ------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class FilmExperimentConfig:
  """Everything that determines the experiment's results.

  Attributes:
    mode: 'attack' (the whole pipeline) or 'bag' (bags only, Table 4).
    model: 'smollm2-135m', an HF/GGUF checkpoint, or 'gpt2-tiny' (a
      2-layer GPT-2 with the GPT-2 tokenizer, for tests).
    init: 'pretrained', or 'random' (same architecture, re-initialised;
      FILM Sec. 6.2 "pretrained vs randomly-initialized").
    data: private corpus file; None uses the embedded quickstart corpus.
    max_sentences: keep at most this many preprocessed sentences.
    max_tokens: Appendix B.1: fewer than 40 tokens.
    require_entity: Appendix B.1: at least one named entity (spaCy).
    max_perplexity: Appendix B.1 perplexity filter on the initial model
      (the paper: 50 on GPT-2); None skips it.
    eval_fraction: held-out sentences for early stopping/perplexity.
    train_steps: t, fine-tuning steps before the attack (0: attack θ^0).
    train_batch_size, learning_rate: fine-tuning (FILM Sec. 6.1: lr 1e-5,
      linear decay).
    eval_every: evaluate the held-out loss every this many steps (0: four
      times over `train_steps`).
    early_stopping_patience: FILM Sec. 6.1 trains "until the loss of the
      model on the evaluation set increased": stop after this many
      evaluations in a row without a lower eval loss (1 is the paper's
      rule; 0: train all `train_steps`). `train_steps` is then the cap (and
      the length of the linear decay). Decision: the attacked model is the
      one at which training stopped (the first whose eval loss went up),
      not the best one; the paper attacks the model it trained, and
      "trained until the loss increased" names that model.
      `attack_best=True` attacks the lowest-eval-loss parameters instead
      (a sensitivity check of this decision).
    batch_sizes: the client batch sizes b.
    num_batches: attacked batches per b (FILM: 20).
    defenses: client defenses: 'none', 'prune:<ratio>', 'dp:<epsilon>'
      (DP-SGD at that ε for the whole training run), 'freeze'.
    dp_clip: DP-SGD clip norm C.
    dp_delta: δ of the DP-SGD guarantee.
    dp_steps: training steps the DP-SGD ε covers (σ is calibrated for
      them at sampling rate b/N); 0: `train_steps` (at least 1).
    bag_method: bag-of-words method ('auto', 'tied', 'norm', ...).
    norm_z: robust z of the tied method's norm test (test 3).
    num_beams, num_groups, diversity_penalty, ngram_size, ngram_penalty,
      length: beam search (Sec. 4.3; lists are swept).
    max_prompts: start prompts kept per batch.
    prompts_per_search: 0 = one pool (Alg. 1), 1 = a search per prompt.
    beta, phrase_steps, token_steps, reorder_candidates: reordering
      (Sec. 4.4); phrase_steps = token_steps = 0 keeps only the truncation.
    truncate: try cutting after the first sentence end (Sec. 4.4 footnote
      6); with phrase_steps = token_steps = 0 and truncate=False the
      reordering stage is skipped.
    grad_paths: parameter subset of the reorder gradient norm ('' =
      default: last block + final norm).
    repetitions: beam searches per batch (Sec. 4.5).
    seed: data split, batch draws, reordering keys.
  """

  mode: str = 'attack'
  model: str = models.SMOLLM2_ALIAS
  init: str = 'pretrained'
  data: str | None = None
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


def client_gradient(
  model, params, texts: Sequence[str], defense, key, microbatch=None
):
  """The client's FedSGD gradient of `texts`, `microbatch` rows at a time."""
  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
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
) -> film.FilmConfig:
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
  return film.FilmConfig(
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
  """The product of swept values; keys only for dimensions with > 1 value."""
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
      k: v for k, v in point.items() if k == 'b' or len(dims[k]) > 1
    }
    points.append(point)
  return points


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
  result = film.recover(
    model,
    params,
    grads,
    config=fcfg,
    key=jax.random.fold_in(key, 1),
    noise_std=noise,
    mesh=mesh,
  )
  attack_s = time.perf_counter() - start
  truth = true_tokens(ids, mask)
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
  if cfg.repetitions > 1:
    # Table 3: recall/precision after the first k repetitions, and all.
    reps = len(result.sentences)
    by_count = metrics.sentence_matching_by_count(
      texts,
      result.sentences,
      sorted({k for k in PAPER_TABLE3 if k < reps} | {reps}),
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
  order = np.argsort(-norms, kind='stable')
  lab = np.zeros(len(norms), bool)
  lab[list(truth)] = True
  hits = np.cumsum(lab[order])
  k = np.arange(1, len(order) + 1)
  prec, rec = hits / k, hits / max(len(truth), 1)
  f1 = 2 * prec * rec / np.maximum(prec + rec, 1e-12)
  i = int(np.argmax(f1))
  return float(prec[i]), float(rec[i])


# ----------------------------------------------------------------- summary
def _values(rows, field):
  # NERR is None for batches whose sentences have no named entity.
  return [
    r[field]
    for r in rows
    if r.get(field) is not None
    and not (isinstance(r[field], float) and math.isnan(r[field]))
  ]


def _mean_std(rows, field):
  vals = _values(rows, field)
  if not vals:
    return float('nan'), float('nan')
  return float(np.mean(vals)), float(np.std(vals))


def _best(rows, field):
  vals = _values(rows, field)
  return float(np.max(vals)) if vals else float('nan')


def summarize(
  cfg: FilmExperimentConfig, rows: list[dict], extra: dict
) -> tuple[dict[str, float], str, list]:
  summary: dict[str, float] = {}
  figures = []
  if cfg.mode == 'bag':
    groups = {}
    for r in rows:
      groups.setdefault((r['b'], r['defense'], r['method']), []).append(r)
    table = []
    for (b, d, m), rs in sorted(groups.items()):
      params = {'b': b, 'method': m}
      if len(cfg.defenses) > 1 or d != 'none':
        params['defense'] = d
      for f in ('bag_precision', 'bag_recall'):
        summary[io.summary_key(f, **params)] = _mean_std(rs, f)[0]
      paper = PAPER_TABLE4.get(d) if b == 16 else None
      if d == 'none' and m in ('norm', 'norm_oracle'):
        paper = None
      pm, ps = _mean_std(rs, 'bag_precision')
      rm, rsd = _mean_std(rs, 'bag_recall')
      table.append(
        [
          b,
          d,
          m,
          len(rs),
          f'{pm:.3f} ± {ps:.3f}',
          f'{rm:.3f} ± {rsd:.3f}',
          f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else '–',
          _mean_std(rs, 'true_bag_size')[0],
        ]
      )
    md = (
      '# FILM bag of words from gradients\n\n'
      f'Model `{cfg.model}` ({cfg.init}), t = {cfg.train_steps} steps.'
      " `tied` is leakjax's method for tied embeddings (input span +"
      ' target sign + norm outliers, no oracle); `norm` the norm'
      f' threshold at robust z > 8; `norm_oracle` the norm'
      ' threshold at its best F1 *given the true bag* (an upper bound'
      ' of the baseline). Mean ± std over batches. "paper P / R" is'
      ' FILM Table 4 (GPT-2 on WikiText-103, b = 16; its defense rows'
      ' use the non-zero-rows and DP-threshold attacks).\n\n'
      + io.markdown_table(
        [
          'b',
          'defense',
          'method',
          'batches',
          'precision',
          'recall',
          'paper P / R',
          'true bag size',
        ],
        table,
      )
    )
    return summary, md, figures
  groups = {}
  for r in rows:
    key = tuple(
      sorted(
        (k, r[k]) for k in r if k in ('b', 'beams', 'ngram', 'beta', 'defense')
      )
    )
    groups.setdefault(key, []).append(r)
  table = []
  for key, rs in sorted(groups.items()):
    params = dict(key)
    for f in (
      'rouge1',
      'rouge2',
      'rougeL',
      'nerr',
      'bag_precision',
      'bag_recall',
      'multi_recall',
      'multi_precision',
    ):
      mean, std = _mean_std(rs, f)
      if f.startswith('multi') and math.isnan(mean):
        continue
      summary[io.summary_key(f, **params)] = mean
      if f in ('rouge1', 'rouge2', 'rougeL', 'nerr'):
        summary[io.summary_key(f + '_std', **params)] = std
        summary[io.summary_key(f + '_best', **params)] = _best(rs, f)
    b = params['b']
    paper = PAPER_TABLE10_ENRON.get(b) or PAPER_TABLE9_ENRON.get(b)
    cells = []
    for i, f in enumerate(('rouge1', 'rouge2', 'rougeL', 'nerr')):
      mean, std = _mean_std(rs, f)
      best = _best(rs, f)
      ours = f'{mean:.2f} ± {std:.2f} ({best:.2f})'
      counted = len(_values(rs, f))
      if counted < len(rs):  # NERR: only batches with a named entity
        ours += f' [{counted}]'
      cells += [ours, f'{paper[i]:.2f}' if paper else '–']
    label = ', '.join(f'{k}={v}' for k, v in params.items())
    table.append(
      [label, len(rs)]
      + cells
      + [
        f'{_mean_std(rs, "bag_precision")[0]:.3f} /'
        f' {_mean_std(rs, "bag_recall")[0]:.3f}'
      ]
    )
  header = [
    'setting',
    'batches',
    'ROUGE-1',
    'paper',
    'ROUGE-2',
    'paper',
    'ROUGE-L',
    'paper',
    'NERR',
    'paper',
    'bag P / R',
  ]
  md = (
    '# FILM: sentences recovered from client gradients\n\n'
    f'Model `{cfg.model}` ({cfg.init}), fine-tuned for t ='
    f' {extra.get("trained_steps", cfg.train_steps)} steps'
    + (' (early stopping)' if extra.get('stopped_early') else '')
    + (
      f', attacked at step {extra["attacked_step"]} (lowest eval loss)'
      if 'attacked_step' in extra
      else ''
    )
    + f' on {extra.get("num_train", "?")} private sentences'
    + (
      f' (eval perplexity {extra["eval_ppl"]:.2f})'
      if extra.get('eval_ppl')
      else ''
    )
    + '. Mean ± std over batches (best in brackets), as in FILM Table'
    ' 10; "paper" is the Enron Email row of Table 10 (b = 4: Table 9),'
    ' GPT-2 fine-tuned on 31,797 sentences for up to 90k iterations.'
    ' Bags come from the gradient, never from the true tokens.'
    ' [n]: batches with a named entity, when not all (NERR is undefined'
    ' without one).\n\n' + io.markdown_table(header, table)
  )
  md += _multi_sentence_table(rows, summary)
  examples = [r for r in rows if r.get('batch') == 0][:4]
  if examples:
    md += '\n## Examples (batch 0)\n\n'
    for r in examples:
      orig = r['originals'][r['match']]
      md += (
        f'- b={r["b"]}: original: *{orig}*  \n  recovered:'
        f' **{r["recovered"][0]}** (ROUGE-L {r["rougeL"]:.2f})\n'
      )
  figures.append(_plot(rows))
  md += '\n![ROUGE and NERR vs batch size](film_vs_batch_size.png)\n'
  return summary, md, figures


def _multi_sentence_table(rows: list[dict], summary: dict) -> str:
  """Table 3 layout: multi-sentence recall/precision per repetition count.

  Adds `multi_recall@b=B,iter=K` / `multi_precision@...` to `summary`.
  """
  by = {}
  for r in rows:
    for k, m in r.get('multi_by_iter', {}).items():
      by.setdefault((r['b'], int(k)), []).append(m)
  if not by:
    return ''
  table = []
  for (b, k), ms in sorted(by.items()):
    rec = np.array([m['recall'] for m in ms])
    prec = np.array([m['precision'] for m in ms])
    summary[io.summary_key('multi_recall', b=b, iter=k)] = float(rec.mean())
    summary[io.summary_key('multi_precision', b=b, iter=k)] = float(prec.mean())
    paper = PAPER_TABLE3.get(k) if b == 16 else None
    table.append(
      [
        b,
        k,
        len(ms),
        f'{rec.mean():.2f} ± {rec.std():.2f}',
        f'{prec.mean():.2f} ± {prec.std():.2f}',
        f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else '–',
      ]
    )
  return (
    '\n## Multi-sentence recovery (Sec. 4.5, Table 3 layout)\n\n'
    'Recall: fraction of the batch with a recovered sentence of ROUGE-L >'
    ' 0.25; precision: fraction of the recovered sentences with ROUGE-L >'
    ' 0.25 against some sentence of the batch, after the first k beam'
    ' searches. "paper": Table 3 (GPT-2, WikiText-103, b = 16).\n\n'
    + io.markdown_table(
      ['b', 'repetitions k', 'batches', 'recall', 'precision', 'paper R / P'],
      table,
    )
  )


def _plot(rows):
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.5))
  bs_ = sorted({r['b'] for r in rows})
  for f, label in (
    ('rouge1', 'ROUGE-1'),
    ('rouge2', 'ROUGE-2'),
    ('rougeL', 'ROUGE-L'),
    ('nerr', 'NERR'),
  ):
    means = [_mean_std([r for r in rows if r['b'] == b], f)[0] for b in bs_]
    ax.plot(bs_, means, marker='o', label=label)
  paper_b = sorted(PAPER_TABLE10_ENRON)
  ax.plot(
    paper_b,
    [PAPER_TABLE10_ENRON[b][2] for b in paper_b],
    'k--',
    label='ROUGE-L (paper, Enron)',
  )
  ax.set_xscale('log', base=2)
  ax.set_xlabel('batch size b')
  ax.set_ylabel('score')
  ax.set_ylim(0, 1)
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  return fig, 'film_vs_batch_size.png'


# -------------------------------------------------------------------- run
def run_experiment(
  cfg: FilmExperimentConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
  microbatch: int | None = None,
) -> dict[str, float]:
  """Runs (or resumes) the experiment; returns the summary.

  `mesh` (`--mesh`) splits the beams and reorder candidates over devices;
  `microbatch` (`--grad_microbatch`) computes the client gradient that many
  sentences at a time (bounded memory). Neither changes the results (up to
  float rounding), so they are not part of `cfg`.
  """
  workdir = Path(workdir)
  writer = io.ExperimentWriter(workdir, cfg)
  start = time.perf_counter()
  model, params = load_model(cfg)
  logging.info('model %s loaded in %.1f s', model, time.perf_counter() - start)
  texts = (
    data_lib.load_corpus(cfg.data) if cfg.data else list(film_data.SENTENCES)
  )
  ppl_fn = lambda ts: (
    perplexities(model, params, ts) if cfg.max_perplexity is not None else None
  )
  sentences = preprocess(texts, model.tokenizer, cfg, ppl_fn)
  train_texts, eval_texts = (
    data_lib.train_eval_split(sentences, cfg.eval_fraction, seed=cfg.seed)
    if cfg.eval_fraction
    else (sentences, [])
  )
  extra = {'num_train': len(train_texts)}
  if cfg.train_steps:
    tcfg = train_lib.TrainConfig(
      learning_rate=cfg.learning_rate,
      batch_size=cfg.train_batch_size,
      num_steps=cfg.train_steps,
      max_length=cfg.max_tokens + 1,
      seed=cfg.seed,
      eval_every=cfg.eval_every or max(1, cfg.train_steps // 4),
      early_stopping_patience=cfg.early_stopping_patience or None,
      restore_best=cfg.attack_best,
      log_every=max(1, cfg.train_steps // 10),
    )
    result = train_lib.train(
      model,
      params,
      train_texts,
      eval_texts or None,
      tcfg,
      workdir=workdir / 'train',
      progress=progress,
    )
    params = result.params
    extra['trained_steps'] = result.step
    extra['stopped_early'] = result.stopped_early
    if cfg.attack_best and result.best_eval:
      extra['attacked_step'] = int(result.best_eval['step'])
    if 'attacked_step' in extra:
      extra['eval_ppl'] = result.best_eval['perplexity']
    elif result.best_eval:
      evals = [h for h in result.history if 'eval_perplexity' in h]
      extra['eval_ppl'] = evals[-1]['eval_perplexity'] if evals else None
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
  total = len(points) * cfg.num_batches
  done = 0
  t0 = time.perf_counter()
  for point in points:
    for index in range(cfg.num_batches):
      done += 1
      match = {**point['key'], 'batch': index}
      if cfg.mode == 'bag':
        match['method'] = 'tied' if model.paths.lm_head is None else 'nonzero'
        match['defense'] = cfg.defenses[0]
      if writer.done(**match) is not None:
        continue
      rows_idx = draw_batch(len(train_texts), point['b'], index, cfg.seed)
      batch = [train_texts[i] for i in rows_idx]
      if cfg.mode == 'attack':
        rows = [
          attack_batch(
            model,
            params,
            batch,
            point,
            cfg,
            num_train=len(train_texts),
            index=index,
            mesh=mesh,
            microbatch=microbatch,
          )
        ]
      else:
        rows = bag_batch(
          model,
          params,
          batch,
          point['b'],
          cfg,
          num_train=len(train_texts),
          index=index,
          microbatch=microbatch,
        )
      for row in rows:
        writer.add_result(row)
      elapsed = time.perf_counter() - t0
      head = rows[0]
      logging.info(
        '[%d/%d] b=%d batch %d: %s (%.0f s elapsed)',
        done,
        total,
        point['b'],
        index,
        (
          f'ROUGE-L {head["rougeL"]:.2f} bag P/R {head["bag_precision"]:.3f}'
          f'/{head["bag_recall"]:.3f}: {head["recovered"][0][:70]!r}'
          if cfg.mode == 'attack'
          else ' '.join(
            f'{r["method"]}:{r["bag_precision"]:.3f}/{r["bag_recall"]:.3f}'
            for r in rows
          )
        ),
        elapsed,
      )
  summary, md, figures = summarize(cfg, writer.results, extra)
  for fig, name in figures:
    writer.save_figure(fig, name)
  writer.write_summary(summary, md)
  return summary


# ------------------------------------------------------------------ flags
def define_flags() -> None:
  d = FilmExperimentConfig
  flags.DEFINE_enum(
    'mode',
    d.mode,
    MODES,
    'attack: the FILM pipeline; bag:'
    ' bag-of-words precision/recall only (Table 4).',
  )
  flags.DEFINE_string(
    'model', d.model, f"smollm2-135m, a checkpoint dir/.gguf, or '{GPT2_TINY}'."
  )
  flags.DEFINE_enum('init', d.init, INITS, 'pretrained or random weights.')
  flags.DEFINE_integer(
    'max_sentences',
    None,
    'Keep at most this many sentences after preprocessing.',
  )
  flags.DEFINE_integer(
    'max_tokens',
    d.max_tokens,
    'Sentences must have fewer tokens (Appendix B.1).',
  )
  flags.DEFINE_bool(
    'require_entity',
    d.require_entity,
    'Keep only sentences with a named entity (Appendix B.1; needs spaCy).',
  )
  flags.DEFINE_float(
    'max_perplexity',
    None,
    'Perplexity filter on the initial model (Appendix B.1: 50).',
  )
  flags.DEFINE_float('eval_fraction', d.eval_fraction, 'Held-out fraction.')
  flags.DEFINE_integer(
    'train_steps', d.train_steps, 't: fine-tuning steps before the attack.'
  )
  flags.DEFINE_integer(
    'train_batch_size', d.train_batch_size, 'Fine-tuning batch size.'
  )
  flags.DEFINE_float(
    'learning_rate',
    d.learning_rate,
    'Fine-tuning peak learning rate (FILM Sec. 6.1: 1e-5, linear decay).',
  )
  flags.DEFINE_integer(
    'eval_every',
    d.eval_every,
    'Evaluate the held-out loss every this many steps (0: 4 times).',
  )
  flags.DEFINE_integer(
    'early_stopping_patience',
    d.early_stopping_patience,
    'Stop after this many evaluations without a lower eval loss (FILM Sec.'
    ' 6.1: 1); 0: train all train_steps.',
  )
  flags.DEFINE_integer(
    'grad_microbatch',
    32,
    'Compute the client gradient this many sentences at a time (memory of'
    ' one chunk: SmolLM2 at b = 128 needs ~16 GB in one pass); 0: one pass.'
    ' Same gradient up to float rounding; not part of the config.',
  )
  flags.DEFINE_bool(
    'attack_best',
    d.attack_best,
    'Attack the parameters with the lowest eval loss instead of the last.',
  )
  flags.DEFINE_list(
    'batch_sizes', list(map(str, d.batch_sizes)), 'Client batch sizes b.'
  )
  flags.DEFINE_integer(
    'num_batches', d.num_batches, 'Batches per b (FILM: 20).'
  )
  flags.DEFINE_list(
    'defenses', list(d.defenses), 'none, freeze, prune:<ratio>, dp:<epsilon>.'
  )
  flags.DEFINE_float('dp_clip', d.dp_clip, 'DP-SGD clip norm.')
  flags.DEFINE_float('dp_delta', d.dp_delta, 'DP-SGD delta.')
  flags.DEFINE_integer(
    'dp_steps', d.dp_steps, 'Steps the DP-SGD epsilon covers (0: train_steps).'
  )
  flags.DEFINE_string(
    'bag_method', d.bag_method, 'auto, tied, norm, nonzero, dp.'
  )
  flags.DEFINE_float(
    'norm_z', d.norm_z, "Robust z of the tied method's norm test (inf: off)."
  )
  flags.DEFINE_list('num_beams', list(map(str, d.num_beams)), 'Beam sizes k.')
  flags.DEFINE_integer('num_groups', d.num_groups, 'Diverse beam groups.')
  flags.DEFINE_float(
    'diversity_penalty', d.diversity_penalty, 'λ of diverse beam search.'
  )
  flags.DEFINE_list(
    'ngram_size',
    list(map(str, d.ngram_size)),
    'n of the repeated n-gram penalty (0: none).',
  )
  flags.DEFINE_float('ngram_penalty', d.ngram_penalty, 'ρ (inf: ban).')
  flags.DEFINE_integer(
    'length',
    d.length,
    'Tokens generated per sentence when the gradient gives no maximum length.',
  )
  flags.DEFINE_integer('max_prompts', d.max_prompts, 'Start prompts per batch.')
  flags.DEFINE_integer(
    'prompts_per_search',
    d.prompts_per_search,
    '0: one pool (Alg. 1); 1: k beams per prompt.',
  )
  flags.DEFINE_list('beta', list(map(str, d.beta)), 'β of Eq. 4.')
  flags.DEFINE_integer(
    'phrase_steps',
    d.phrase_steps,
    'Phrase-wise reordering steps (Sec. 4.4: 200).',
  )
  flags.DEFINE_integer(
    'token_steps', d.token_steps, 'Token-wise reordering steps (Sec. 4.4: 200).'
  )
  flags.DEFINE_bool(
    'truncate',
    d.truncate,
    'Cut after the first sentence end when it lowers S (Sec. 4.4, fn. 6).',
  )
  flags.DEFINE_integer(
    'reorder_candidates',
    d.reorder_candidates,
    'Candidates per reordering step.',
  )
  flags.DEFINE_string(
    'grad_paths',
    d.grad_paths,
    'Comma-separated parameter'
    ' paths (a/b/c) for the gradient norm; empty: last block'
    ' + final norm.',
  )
  flags.DEFINE_integer(
    'repetitions',
    d.repetitions,
    'Beam searches per batch (multi-sentence recovery, Sec. 4.5).',
  )


def config_from_flags() -> FilmExperimentConfig:
  f = flags.FLAGS
  return FilmExperimentConfig(
    mode=f.mode,
    model=f.model,
    init=f.init,
    data=f.data,
    max_sentences=f.max_sentences,
    max_tokens=f.max_tokens,
    require_entity=f.require_entity,
    max_perplexity=f.max_perplexity,
    eval_fraction=f.eval_fraction,
    train_steps=f.train_steps,
    train_batch_size=f.train_batch_size,
    learning_rate=f.learning_rate,
    eval_every=f.eval_every,
    early_stopping_patience=f.early_stopping_patience,
    attack_best=f.attack_best,
    batch_sizes=tuple(int(b) for b in f.batch_sizes),
    num_batches=f.num_batches,
    defenses=tuple(f.defenses),
    dp_clip=f.dp_clip,
    dp_delta=f.dp_delta,
    dp_steps=f.dp_steps,
    bag_method=f.bag_method,
    norm_z=f.norm_z,
    num_beams=tuple(int(k) for k in f.num_beams),
    num_groups=f.num_groups,
    diversity_penalty=f.diversity_penalty,
    ngram_size=tuple(int(n) for n in f.ngram_size),
    ngram_penalty=f.ngram_penalty,
    length=f.length,
    max_prompts=f.max_prompts,
    prompts_per_search=f.prompts_per_search,
    beta=tuple(float(x) for x in f.beta),
    phrase_steps=f.phrase_steps,
    token_steps=f.token_steps,
    truncate=f.truncate,
    reorder_candidates=f.reorder_candidates,
    grad_paths=f.grad_paths,
    repetitions=f.repetitions,
    seed=f.seed,
  )


def main(argv):
  del argv
  mesh = sharding.data_mesh(flags.FLAGS.mesh)
  cfg = config_from_flags()
  start = time.perf_counter()
  summary = run_experiment(
    cfg,
    flags.FLAGS.workdir,
    mesh=mesh,
    microbatch=flags.FLAGS.grad_microbatch or None,
  )
  print((Path(flags.FLAGS.workdir) / 'summary.md').read_text())
  print(
    f'Wrote {flags.FLAGS.workdir}/summary.json ({len(summary)} keys) in'
    f' {time.perf_counter() - start:.0f} s'
  )


if __name__ == '__main__':
  define_flags()
  common.define_common_flags('/tmp/leakjax_film')
  common.run(main)
