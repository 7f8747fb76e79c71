r"""The embedding-inversion experiment of Wan et al. 2024, as one runner.

:func:`run` reproduces Tables 2-6 on a real pretrained model; read it
top-down:

0. the target and its hidden states (:mod:`.hidden_states`) of the
   held-out text of every corpus and of Embed Parrot's training text
   (:mod:`.texts`), cached on disk;
1. per-layer BEI/HEI (Sec. 4.1-4.2) on held-out text of every corpus
   (Tables 2-3; :func:`.sweeps.score_layers`);
2. Embed Parrot (Sec. 4.3) trained on the hidden states of one deep layer
   of one corpus (Enron by default, the analogue of fingpt-sentiment) and
   tested on the held-out part of that corpus and on the others (Table 4),
   by sequence-length bucket (Table 5) (:mod:`.parrot_runs`);
3. the DCT/overlap defense (Sec. 5.3.1) at layer 0 and at the deep layer:
   attack scores on defended states and the target's perplexity with and
   without the defense (Table 6; :func:`.sweeps.score_defenses`).

Summary keys: `f1|rouge1|rougeL|sbert@data=...,layer=...,method=...` with
method in {bei, hei, ep, ep_bei, ep_skip, ep_skip_bei, ep_pretrained,
ep_pretrained_bei} (and `<variant>_ppl` with EP+PPL); `...@bucket=lo-hi,...`
(Table 5); `...@data=...,defense=dct,layer=...,method=...,subsets=k` and
`ppl@defense=dct,layer=...,subsets=k` / `ppl@defense=none` (Table 6).

The runner contract (shared with the FILM and DAGER runners):
`run(config, writer)`. The workdir is the writer's (`writer.workdir`):
`results.jsonl` (resumable, one :class:`leakjax.io.ExperimentWriter`),
`<variant>_history.json` and `timings.json` go there. The cache folder of
the hidden states and Embed Parrot checkpoints is a keyword argument of
:func:`run` (default `<workdir>/cache`), not a config field: neither
folder changes a result, and config.json holds only what does, so the same
config with another folder is the same run (and runs share one cache).
Wall-clock timings go to `timings.json`, never into the summary, so equal
runs give equal summaries. Tables and plots are the caller's
(`experiments/embed_parrot_report.py`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import jax

from leakjax import io, models, sharding
from leakjax import presets as presets_lib
from leakjax.attacks.inversion import (
  hidden_states,
  parrot_runs,
  scoring,
  sweeps,
  texts,
)
from leakjax.errors import LeakjaxError, check_positive

EP_VARIANTS = ('ep', 'ep_skip', 'ep_pretrained')
DEFAULT_CORPORA = (
  'enron=film-enron',
  'wikitext=wikitext-2-valid',
  'sms=sms-spam',
)


# ------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class InversionConfig:
  """Everything that determines the results (written to config.json).

  Attributes:
    model: Target: checkpoint dir, .gguf, or smollm2-135m.
    dtype: float32 or bfloat16: the attack runs on the target's parameters
      cast to it (:func:`leakjax.models.cast`): the artefact is computed and
      attacked in it. Decision: loading, preprocessing and any fine-tuning
      of the target stay float32 (how the victim was trained is the setup,
      not the attack). bfloat16 is for accelerators (`reports/dtype/`).
    corpora: name=path,... of the test corpora (.txt/.json/.tsv). Ignored
      when --data is given.
    train_corpus: Corpus whose training split trains Embed Parrot.
    sentence_split: Corpora whose lines are paragraphs: drop "= heading ="
      lines and split into sentences.
    layers: Layers for BEI/HEI.
    deep_layer: Layer attacked by Embed Parrot.
    num_test: Held-out texts per corpus.
    split: Which held-out texts are scored: dev (the first draw of num_test
      per corpus, where Embed Parrot's settings were chosen) or test (a
      second draw of num_test from the same held-out share, sharing no text
      with dev; nothing was chosen on it). The training texts are the same
      for both (:func:`texts.load_splits`).
    num_train: Training texts for Embed Parrot.
    train_samples: Sentences sampled from the target itself and added to
      Embed Parrot's training texts (0: none). Data-free augmentation (ours;
      the paper trains on one corpus, Sec. 5.1.1): the attacker holds the
      model, so its samples cost no data. :func:`texts.model_samples`
      says how they are drawn and cut.
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
    preset: the named preset the config started from
      (:mod:`leakjax.attacks.inversion.presets`), recorded; None: none. Not
      compared: two configs whose other fields agree give the same run.
  """

  model: str = models.SMOLLM2_ALIAS
  dtype: str = 'float32'
  corpora: tuple[str, ...] = DEFAULT_CORPORA
  train_corpus: str = 'enron'
  sentence_split: tuple[str, ...] = ('wikitext',)
  layers: tuple[str, ...] = ('0', '5', '10', '15', '20', '25', '30', 'last')
  deep_layer: int = 25
  num_test: int = 100
  split: str = 'dev'
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
  preset: str | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    models.parameter_dtype(self.dtype)
    if self.split not in presets_lib.SPLITS:
      raise LeakjaxError(
        f'unknown --split {self.split!r}',
        f'use one of {", ".join(presets_lib.SPLITS)}',
      )
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


def run(
  config: InversionConfig,
  writer: io.ExperimentWriter,
  *,
  cache_dir: str | Path | None = None,
  model: models.Model | None = None,
  params=None,
) -> InversionRun:
  """Runs the whole experiment (resumable); returns what the report needs.

  Writes `results.jsonl`, `<variant>_history.json` (and
  `<variant>_ppl_history.json` for EP+PPL), `train_samples.json` (with
  model samples) and `timings.json` to the writer's workdir (not the
  summary: see :class:`InversionRun`), hidden-state caches and Embed
  Parrot checkpoints to `cache_dir`.

  Args:
    config: the experiment's config.
    writer: the run's writer (opened on the workdir with `config` and
      :func:`writer_inputs`); cells it already holds are not recomputed.
    cache_dir: folder of the `.npz` hidden-state caches and the
      `.safetensors` Embed Parrot checkpoints; None: `<workdir>/cache`.
    model: the target (replaces loading `config.model`), with `params`.
    params: its parameters (both or neither).
  """
  if (model is None) != (params is None):
    raise LeakjaxError(
      'run takes model and params together',
      'pass both (e.g. from models.load) or neither',
    )
  workdir = writer.workdir
  cache_dir = workdir / 'cache' if cache_dir is None else io.as_path(cache_dir)
  mesh = sharding.data_mesh(config.mesh)
  key = jax.random.key(config.seed)
  t_start = time.time()
  target = hidden_states.load_target(config, model, params)
  tests, train_split = texts.load_splits(config, target.model.tokenizer)
  states = hidden_states.compute_states(
    config,
    target,
    tests,
    train_split,
    cache_dir=cache_dir,
    workdir=workdir,
    key=key,
    mesh=mesh,
  )
  t_states = time.time() - t_start
  recorder = scoring.Recorder(
    writer, scoring.Scorer(config), target.model.tokenizer
  )

  # 1. Per-layer BEI/HEI (Tables 2-3).
  sweeps.score_layers(recorder, target, states)

  # 2. Embed Parrot at the deep layer (Tables 1, 4, 5).
  t0 = time.time()
  variants, histories = parrot_runs.train_variants(
    config, target, states, key=key, cache_dir=cache_dir, workdir=workdir
  )
  t_ep = time.time() - t0
  if config.ep_ppl_steps > 0:
    variants.update(
      parrot_runs.train_ppl(
        config,
        target,
        states,
        variants,
        key=key,
        cache_dir=cache_dir,
        workdir=workdir,
      )
    )
  parrot_runs.score_variants(config, recorder, target, states, variants)

  # 3. DCT defense (Table 6).
  sweeps.score_defenses(config, recorder, target, states, variants, key=key)

  timings = {
    'seconds_hidden_states': t_states,
    'seconds_ep_train': t_ep,
    'seconds_total': time.time() - t_start,
  }
  if writer.enabled:
    io.atomic_write_text(
      workdir / 'timings.json', json.dumps(timings, indent=2)
    )
  summary = recorder.summary
  summary.update(run_facts(config, states, histories))
  return InversionRun(
    summary=summary,
    timings=timings,
    writer=writer,
    tests=states.tests,
    layers=target.layers,
    deep=target.deep,
    variants=list(variants),
    histories=histories,
    model_family=target.model.family,
    model_num_layers=target.model.num_layers,
    model_hidden_size=target.model.hidden_size,
    model_num_params=models.num_params(target.params),
  )


def run_facts(
  config: InversionConfig,
  states: hidden_states.States,
  histories: dict[str, list[dict[str, float]]],
) -> dict[str, float]:
  """The summary's facts besides the scores: each variant's final cosine
  loss and how many texts the run trained and tested on."""
  facts: dict[str, float] = {}
  for variant, history in histories.items():
    if history:
      facts[io.summary_key('final_cos_loss', method=variant)] = history[-1][
        'cos_loss'
      ]
  facts['num_train_texts'] = len(states.train.texts)
  if config.train_samples:
    facts['num_train_samples'] = len(states.samples.texts)
  for name, split in states.tests.items():
    facts[io.summary_key('num_test_texts', data=name)] = len(split.texts)
  return facts


@dataclasses.dataclass
class InversionRun:
  """What :func:`run` returns: the numbers and what a report needs.

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
  tests: dict[str, texts.Split]
  layers: list[Any]
  deep: int
  variants: list[str]
  histories: dict[str, list[dict[str, float]]]
  model_family: str | None
  model_num_layers: int
  model_num_params: int
  model_hidden_size: int


def writer_inputs(
  config: InversionConfig, *, model: models.Model | None = None
) -> dict[str, str | None]:
  """The run's input files by name, for :class:`leakjax.io.ExperimentWriter`
  (their sha256 go to provenance.json): every corpus and, unless `model`
  is given in memory, the target's weights."""
  return {
    **{f'corpus:{name}': path for name, path in config.corpus_paths()},
    'model': models.source_path(config.model) if model is None else None,
  }


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
