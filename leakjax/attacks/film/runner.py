r"""FILM experiment runner: the threat model of Sec. 3.3 and the attack of Sec. 4.

Read top-down from :func:`run`:

1. The private corpus (:func:`load_texts`: `--data`, or the embedded
   quickstart sentences) is preprocessed as in Appendix B.1
   (:func:`private_sentences`: sentence split, fewer than `max_tokens`
   tokens, at least one named entity of the B.1 types, optional perplexity
   filter on the initial model).
2. The model (:func:`leakjax.models.load_model`: SmolLM2-135M from its
   GGUF, a GPT-2 HF directory, or a small GPT-2 from scratch) is fine-tuned
   on the training sentences for `train_steps` steps -- FILM's
   single-client FL setting (Sec. 6.1, footnote 7) -- giving θ^t
   (:func:`leakjax.attacks.film.training.fine_tune`). The attacked batches
   come from these training sentences, so the model has seen them, as in
   the paper.
3. For each point of the sweep (:func:`sweep_points`), `num_batches` client
   batches are drawn (:func:`leakjax.attacks.film.client.draw_batch`); the
   client's gradient at θ^t (FedSGD, optionally with a defense,
   :func:`leakjax.attacks.film.client.make_defense`) is what the
   eavesdropper sees. :func:`attack_batch` recovers a bag of words (never
   the true token set), beam-searches sentences and reorders them
   (:func:`leakjax.attacks.film.recover`); `--mode=bag` only extracts bags
   (Table 4, :mod:`leakjax.attacks.film.bag_only`); `--mode=utility`
   measures what each defense costs instead
   (:func:`leakjax.attacks.film.training.utility`).
4. Each batch gives one row of metrics (FILM Sec. 6.1): ROUGE-1/2/L F and
   NERR of the recovered sentence against its best match in the batch, bag
   precision and recall; with `repetitions` > 1 also the multi-sentence
   recall and precision of Table 3.

The runner contract (shared with the other papers' runners):
`run(config, writer)`. The rows go to the caller's
:class:`leakjax.io.ExperimentWriter` (:func:`writer_inputs`; results.jsonl,
so a re-run resumes); tables and plots are `experiments/film_report.py`'s.
The kernels are jitted here with the model static: each compiles once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import io, metrics, models, runtime
from leakjax import presets as presets_lib
from leakjax import train as train_lib
from leakjax._jit import jitted
from leakjax.attacks.film import bag_only, client, pipeline, training
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError, check_positive
from leakjax.recovery import bag as bow
from leakjax.recovery.corpus import load_texts, writer_inputs

MODES = ('attack', 'bag', 'utility')
# FILM Table 3: the repetition counts k after which the multi-sentence
# recall/precision is reported (and after all repetitions).
MULTI_SENTENCE_COUNTS = (1, 5, 10, 20, 50, 100)


@dataclasses.dataclass(frozen=True)
class FilmConfig:
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
    dtype: float32 or bfloat16: the client's gradient and the attack run on
      the fine-tuned model cast to it (:func:`leakjax.models.cast`); the
      perplexity filter, fine-tuning and utility runs stay float32.
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
    first_batch: Index of the first attacked batch: batches `first_batch`
      to `first_batch + num_batches - 1` of each b (each index draws its own
      batch, :func:`client.draw_batch`), so a run with `first_batch=20`
      attacks 20 batches none of the first 20 runs saw.
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
    sentence_ends: When the search adds the vocabulary's sentence ends to
      the bag: silent (the embedding gradient is zero, as under frozen
      embeddings), always or never (:class:`pipeline.FilmAttackConfig`).
    seed: Random seed (data split, batch draws, reordering keys).
    preset: the named preset the config started from
      (:mod:`leakjax.attacks.film.presets`), recorded; None: none. Not
      compared: two configs whose other fields agree give the same run.
    split: which split the attacked batches are, recorded
      (:func:`leakjax.presets.split_record`): dev (a setting was chosen on
      them), test (nothing was) or None.
  """

  mode: str = 'attack'
  model: str = models.SMOLLM2_ALIAS
  init: str = 'pretrained'
  dtype: str = 'float32'
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
  first_batch: int = 0
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
  sentence_ends: str = 'silent'
  seed: int = 0
  preset: str | None = dataclasses.field(default=None, compare=False)
  split: str | None = presets_lib.split_record()

  def __post_init__(self):
    presets_lib.check_split(self.split)
    if self.sentence_ends not in pipeline.SENTENCE_ENDS:
      raise LeakjaxError(
        f'unknown --sentence_ends {self.sentence_ends!r}',
        f'use one of {", ".join(pipeline.SENTENCE_ENDS)}',
      )
    if self.mode not in MODES:
      raise LeakjaxError(
        f'unknown --mode {self.mode!r}', f'use one of {", ".join(MODES)}'
      )
    if self.init not in models.INITS:
      raise LeakjaxError(
        f'unknown --init {self.init!r}', 'use pretrained or random'
      )
    models.parameter_dtype(self.dtype)
    if not self.batch_sizes or min(self.batch_sizes) < 1:
      raise LeakjaxError(f'batch sizes must be positive: {self.batch_sizes}')
    if self.num_batches < 1 or self.repetitions < 1:
      raise LeakjaxError('num_batches and repetitions must be >= 1')
    if self.first_batch < 0:
      raise LeakjaxError(
        f'--first_batch={self.first_batch} must be >= 0', 'pass e.g. 0 or 20'
      )
    for d in self.defenses:
      client.parse_defense(d)
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


def run(
  config: FilmConfig,
  writer: io.ExperimentWriter,
  *,
  texts: Sequence[str] | None = None,
  progress: bool = True,
  mesh=None,
  microbatch: int | None = None,
) -> FilmRun:
  """Runs (or resumes) the experiment.

  Args:
    config: the experiment.
    writer: where the rows go (opened on the workdir with `config` and
      :func:`writer_inputs`); rows it already holds are not recomputed.
    texts: `load_texts(config)`, when the caller has read them already
      (for :func:`writer_inputs`); None: read here.
    progress: show the fine-tuning progress bar.
    mesh: `--mesh`: splits the beams and reorder candidates over devices.
    microbatch: `--grad_microbatch`: the client gradient that many
      sentences at a time (bounded memory).

  Neither `mesh` nor `microbatch` changes the results (up to float
  rounding), so they are not part of `config`.

  Returns:
    The rows and the facts the report needs.
  """
  with runtime.Heartbeat() as beat:
    return _run(
      config,
      writer,
      beat,
      texts=texts,
      progress=progress,
      mesh=mesh,
      microbatch=microbatch,
    )


def _run(config, writer, beat, *, texts, progress, mesh, microbatch):
  """:func:`run`, naming each stage to `beat` (a
  :class:`~leakjax.runtime.Heartbeat`)."""
  cfg = config
  texts = load_texts(cfg) if texts is None else texts
  start = time.perf_counter()
  beat.stage = f'loading {cfg.model}'
  model, params = models.load_model(cfg.model, init=cfg.init, seed=cfg.seed)
  beat.stage = 'preprocessing the sentences'
  logging.info(
    'model %s loaded in %.1f s', cfg.model, time.perf_counter() - start
  )
  ppl_fn = lambda ts: perplexities(model, params, ts)
  sentences = private_sentences(cfg, texts, model.tokenizer, ppl_fn)
  train_texts, eval_texts = (
    data_lib.train_eval_split(sentences, cfg.eval_fraction, seed=cfg.seed)
    if cfg.eval_fraction
    else (sentences, [])
  )
  extra: dict[str, Any] = {
    'num_train': len(train_texts),
    'hidden_size': model.hidden_size,
  }
  runtime.return_freed_memory()
  if cfg.mode == 'utility':
    beat.stage = 'fine-tuning under each defense'
    training.utility(
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
    beat.stage = 'fine-tuning'
    params, trained = training.fine_tune(
      model,
      params,
      train_texts,
      eval_texts,
      cfg,
      writer.workdir / 'train',
      progress=progress,
    )
    extra.update(trained)
    # The fine-tuning's programs do not run again.
    train_lib.release_programs()
  model, params = models.cast(model, params, cfg.dtype)
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
  for i, point in enumerate(points):
    if i and point['b'] != points[i - 1]['b']:
      # The last batch size's gradient does not run again; the searches'
      # programs serve the next size too.
      client.release_gradient_programs()
    for index in range(cfg.first_batch, cfg.first_batch + cfg.num_batches):
      match = {**point['key'], 'batch': index}
      if cfg.mode == 'bag':
        match['method'] = 'tied' if model.paths.lm_head is None else 'nonzero'
        match['defense'] = cfg.defenses[0]
      if writer.done(**match) is not None:
        counter.skipped()
        continue
      beat.stage = (
        f'[{counter.done + 1}/{counter.total}] b={point["b"]} batch {index}'
      )
      rows_idx = client.draw_batch(
        len(train_texts), point['b'], index, cfg.seed
      )
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
        rows = bag_only.bag_batch(
          model, params, batch, point['b'], cfg, **common, microbatch=microbatch
        )
      for row in rows:
        writer.add_result(row)
      runtime.return_freed_memory()
      counter.computed()
      _log_rows(counter, point['b'], index, rows, cfg.mode)
  return FilmRun(results=writer.results, extra=extra)


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


# ------------------------------------------------------------------- data
def private_sentences(
  config: FilmConfig,
  texts: Sequence[str],
  tokenizer,
  perplexity_fn: Callable[[list[str]], Sequence[float]] | None = None,
) -> list[str]:
  """Appendix B.1 with `config`'s settings
  (:func:`leakjax.data.preprocess_sentences`): at least the largest batch
  size of sentences, or LeakjaxError."""
  return data_lib.preprocess_sentences(
    texts,
    tokenizer,
    max_tokens=config.max_tokens,
    require_entity=config.require_entity,
    max_perplexity=config.max_perplexity,
    perplexity_fn=perplexity_fn,
    max_sentences=config.max_sentences,
    min_sentences=max(config.batch_sizes),
  )


def _token_log_probs(model, params, ids, mask):
  return model.token_log_probs(params, ids, mask)


def perplexities(model, params, texts: Sequence[str], batch: int = 32):
  """Each text's perplexity under `params` (BOS added, mean over tokens)."""
  log_probs = jitted(_token_log_probs, static_argnames=('model',))
  out = []
  for i in range(0, len(texts), batch):
    ids, mask = model.tokenizer.encode_batch(
      list(texts[i : i + batch]), add_bos=True
    )
    lp = np.asarray(
      log_probs(model, params, jnp.asarray(ids), jnp.asarray(mask))
    )
    m = mask[:, 1:]
    out.extend(np.exp(-(lp * m).sum(1) / np.maximum(m.sum(1), 1)))
  return np.asarray(out)


# ------------------------------------------------------------------ attack
def attack_config(
  cfg: FilmConfig, num_beams: int, ngram: int, beta: float
) -> pipeline.FilmAttackConfig:
  """FILM's attack settings (:func:`leakjax.attacks.film.recover`) at one
  point of the sweep: `num_beams` beams, n-gram size `ngram`, β = `beta`."""
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
  return pipeline.FilmAttackConfig(
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
    sentence_ends=cfg.sentence_ends,
  )


def _grad_paths(cfg):
  if not cfg.grad_paths:
    return None
  return tuple(tuple(p.split('/')) for p in cfg.grad_paths.split(','))


def sweep_points(cfg: FilmConfig) -> list[dict[str, Any]]:
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
    **bag_only.span_fields(bag),
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
  defense, noise = client.make_defense(
    model, point.get('defense', 'none'), cfg, num_train=num_train, b=b
  )
  start = time.perf_counter()
  grads, ids, mask = client.client_gradient(
    model, params, texts, defense, key, microbatch
  )
  # Dispatch is asynchronous: wait, so that grad_s is the gradient's time.
  grads = jax.block_until_ready(grads)
  grad_s = time.perf_counter() - start
  logging.info('b=%d batch %d: client gradient in %.1f s', b, index, grad_s)
  fcfg = attack_config(cfg, point['beams'], point['ngram'], point['beta'])
  start = time.perf_counter()
  bag = bow.extract_bag(
    model,
    params,
    grads,
    method=fcfg.bag_method,
    noise_std=noise,
    config=fcfg.tied,
  )
  bag_s = time.perf_counter() - start
  truth = client.true_tokens(ids, mask)
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
    'stage_seconds': {'bag': bag_s, **result.seconds},
  }
  if result.sentence_ends:  # searched beside a bag from a silent head
    row['sentence_ends_added'] = len(result.sentence_ends)
  row.update(bag_only.span_fields(result.bag))
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


__all__ = [
  'MODES',
  'MULTI_SENTENCE_COUNTS',
  'FilmConfig',
  'FilmRun',
  'attack_batch',
  'attack_config',
  'load_texts',
  'perplexities',
  'private_sentences',
  'run',
  'sweep_points',
  'writer_inputs',
]
