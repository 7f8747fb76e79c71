r"""The exact-inversion experiment: every token back from a layer's states?

Nikolaou et al. ("Language Models are Injective and Hence Invertible",
arXiv 2510.15511) show that a decoder-only LM maps distinct prompts to
distinct hidden states and recover prompts exactly by checking candidate
tokens one position at a time (SipIt; ours: :mod:`.exact`). This runner
measures that attack on the user's sentences beside Wan et al.'s one-shot
reads (BEI, HEI, Sec. 4.1-4.2) and a ridge inverse of the layer; read it
top-down from :func:`run`:

1. texts (:func:`draw_texts`): per corpus, disjoint `test` and `dev`
   splits drawn with the seed; the attacker's own text (the ridge
   inverse's) from `attacker_corpus`, disjoint from both. Every setting of
   :class:`.exact.ExactConfig` is chosen on `dev`; the runner attacks the
   splits of `splits` (`--splits=dev` while choosing);
2. per (split, corpus, layer, perturbation) cell (:func:`cells`): the
   provider observes the layer's states of the texts, perturbed
   (:mod:`.exact_perturb`); six attacks read them: `bei`, `hei`, `ridge`
   (HEI on the ridge inverse's `H^0`), `softmax` (HEI on the softmax
   inverse's, :mod:`.softmax_inverse`: the ridge map trained further to
   rank the true token first), `ep_skip` (HEI on Embed Parrot's, Wan et
   al. Sec. 4.3, with the ridge-initialised skip of :mod:`.embed_parrot`)
   and `exact` (:func:`.exact.invert` with the softmax inverse's
   proposals, :func:`.exact.proposal_scores`); every learned inverse is
   fitted on the attacker's clean states of the layer;
   `rule='tolerance'` on unperturbed states, `noise_rule` on noise:S,
   `'nearest'` on the others;
3. one results row per (cell, attack), scored as Wan et al. score (Sec.
   5.1.3: ROUGE-1/L of each text against its own reconstruction, BOS not
   scored) plus `exact`, the fraction of texts recovered token for token;
   exact rows add the candidates checked per scored token (median, mean,
   max), seconds per sentence and the undecided fraction (near-ties).

Summary keys (:func:`summarize`): `exact|rouge1|rougeL@attack=A,data=C,
layer=L,split=S` and, for `attack=exact`, `candidates_per_token@...`,
`seconds_per_sentence@...` and `undecided@...`; a perturbed cell adds
`noise=S`, `rounding=bf16|int8` or `defense=dct:K`; `num_texts@data=C,
split=S` and `num_attacker`. `seconds_per_sentence` keys are wall-clock
seconds (the attack's cost is a reported goal) and vary run to run and
device to device; every other key is deterministic. A short warm-up
inversion per layer compiles the checks before the timed sentences.

The runner contract: `run(config, writer)`; rows already in the writer's
results.jsonl are not recomputed (a finished row is skipped on rerun).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from leakjax import io, models, provenance, sharding
from leakjax._jit import jitted
from leakjax.attacks.inversion import (
  bei_hei,
  embed_parrot,
  exact,
  softmax_inverse,
)
from leakjax.attacks.inversion import exact_perturb as perturb
from leakjax.attacks.inversion import texts as texts_lib
from leakjax.attacks.inversion.exact_summary import (
  SHOWN,
  key_params,
  score,
  search_facts,
  summarize,
)
from leakjax.attacks.inversion.runner import DEFAULT_CORPORA, parse_corpora
from leakjax.errors import LeakjaxError, check_positive

ATTACKS = ('bei', 'hei', 'ridge', 'softmax', 'ep_skip', 'exact')
SPLITS = ('dev', 'test')
BATCH = 16  # texts per forward pass of the target
# Embed Parrot beside the search: the `ep_skip` variant at the architecture
# of experiments/configs/embed_parrot_smollm2.flags (a 256-wide decoder of
# 2 blocks, 4 heads; 32 texts a step at learning rate 1e-3). Decision: the
# small decoder, not the paper's GPT-2 XL (Wan et al. Sec. 4.3), which this
# runner cannot train beside every layer on a CPU.
EP_ARCH = dict(width=256, num_layers=2, num_heads=4, linear_skip=True)
EP_BATCH, EP_LR = 32, 1e-3


@dataclasses.dataclass(frozen=True)
class ExactRunConfig:
  """Everything that determines the results (written to config.json).

  Attributes:
    model: Target: checkpoint dir, .gguf, or smollm2-135m.
    dtype: float32 or bfloat16: the attack runs on the target's parameters
      cast to it (:func:`leakjax.models.cast`): the artefact is computed and
      attacked in it. Decision: loading, preprocessing and any fine-tuning
      of the target stay float32 (how the victim was trained is the setup,
      not the attack). bfloat16 is for accelerators (`reports/dtype/`).
    corpora: name=path,... of the corpora whose texts are attacked
      (.txt/.json/.tsv or a named data set). Ignored when --data is given.
    sentence_split: Corpora whose lines are paragraphs: drop "= heading ="
      lines and split into sentences.
    max_length: Tokens kept per text (the BOS token, added when the
      tokenizer has one, comes on top and is not scored).
    attacker_corpus: Corpus whose texts the attacker fits the ridge
      inverse on (disjoint from every attacked text).
    num_attacker: Texts the ridge inverse is fitted on.
    num_dev: Texts per corpus in the dev split (where every setting of the
      exact search is chosen).
    num_test: Texts per corpus in the test split (disjoint from dev).
    splits: Splits attacked: test, or dev while choosing settings.
    layers: Layers whose states are sent (0 = the embedding output, last
      = the final-normed output).
    max_candidates: Candidates the exact search checks per position before
      giving up (absent: the whole vocabulary).
    noise_rule: The exact search's acceptance rule on noise:S states:
      calibrated (the tolerance read off the residuals of the BOS and
      the positions accepted before) or nearest
      (the gap rule); :mod:`.exact`. Other perturbations use nearest.
    ep_steps: Training steps of Embed Parrot (`ep_skip`) per layer.
    perturbations: What happens to the states on the way: none, noise:S
      (Gaussian, std S x the layer's rms coordinate), bf16, int8 (absmax
      per position) or dct:K (Wan et al.'s DCT defense, K subsets).
    seed: Random seed (text splits, noise, DCT defenses).
  """

  model: str = models.SMOLLM2_ALIAS
  dtype: str = 'float32'
  corpora: tuple[str, ...] = DEFAULT_CORPORA
  sentence_split: tuple[str, ...] = ('wikitext',)
  max_length: int = 32
  attacker_corpus: str = 'enron'
  num_attacker: int = 400
  num_dev: int = 16
  num_test: int = 32
  splits: tuple[str, ...] = ('test',)
  layers: tuple[str, ...] = ('0', '10', '20', '25', 'last')
  max_candidates: int | None = None
  # Runs made before the field used the nearest rule on noise.
  noise_rule: str = dataclasses.field(
    default='calibrated', metadata={'before': 'nearest'}
  )
  ep_steps: int = 1000
  perturbations: tuple[str, ...] = ('none',)
  seed: int = 0

  def __post_init__(self):
    models.parameter_dtype(self.dtype)
    check_positive(self, 'max_length', 'num_attacker', 'ep_steps')
    check_positive(self, 'num_dev', 'num_test', 'seed', minimum=0)
    names = [name for name, _ in self.corpus_paths()]
    if len(set(names)) < len(names):
      raise LeakjaxError(f'--corpora names a corpus twice ({names})')
    if self.attacker_corpus not in names:
      raise LeakjaxError(
        f'--attacker_corpus={self.attacker_corpus} is not one of the'
        f' corpora ({", ".join(names)})'
      )
    _check_names('splits', self.splits, lambda s: s in SPLITS, 'dev, test')
    for split in self.splits:
      if self.split_size(split) < 1:
        raise LeakjaxError(
          f'--splits={split} needs --num_{split} of at least 1'
        )
    _check_names(
      'layers',
      self.layers,
      lambda x: x == bei_hei.LAST or re.fullmatch(r'\d+', x) is not None,
      'integers or last, e.g. 0,10,25,last',
    )
    if self.noise_rule not in ('calibrated', 'nearest'):
      raise LeakjaxError(
        f'--noise_rule={self.noise_rule} is not calibrated or nearest'
      )
    if self.max_candidates is not None and self.max_candidates < 1:
      raise LeakjaxError(
        f'--max_candidates={self.max_candidates} must be at least 1',
        'leave it out to search the whole vocabulary',
      )
    self.perturbation_specs()

  def corpus_paths(self) -> tuple[tuple[str, str], ...]:
    """`corpora` as `(name, path)` pairs."""
    return parse_corpora(self.corpora)

  def perturbation_specs(self) -> tuple[perturb.Perturbation, ...]:
    """`perturbations` parsed (LeakjaxError for a bad entry)."""
    return perturb.parse_all(self.perturbations)

  def split_size(self, split: str) -> int:
    return self.num_dev if split == 'dev' else self.num_test

  def exact_config(self, p: perturb.Perturbation) -> exact.ExactConfig:
    """The search's settings on states perturbed by `p`."""
    rule = self.noise_rule if p.kind == 'noise' else p.rule
    if rule == 'tolerance':
      rule = exact.own_states_rule(self.dtype)
    return exact.ExactConfig(rule=rule, max_candidates=self.max_candidates)


def _check_names(field: str, values, ok: Callable[[str], bool], hint: str):
  if not values:
    raise LeakjaxError(f'--{field} is empty', f'use {hint}')
  for v in values:
    if not ok(v):
      raise LeakjaxError(f'bad --{field} entry {v!r}', f'use {hint}')
  if len(set(values)) < len(values):
    raise LeakjaxError(f'--{field} names an entry twice', f'use {hint}')


# ------------------------------------------------------------------ texts
@dataclasses.dataclass
class Texts:
  """The tokenized texts of a run.

  Attributes:
    splits: split -> corpus -> its :class:`.texts.Split` (every text
      padded to one width: BOS + `max_length`).
    attacker: the ridge inverse's texts.
  """

  splits: dict[str, dict[str, texts_lib.Split]]
  attacker: texts_lib.Split


def load_corpora(cfg: ExactRunConfig) -> dict[str, list[str]]:
  """Every corpus's distinct texts, in file order."""
  return {
    name: texts_lib.load_texts(name, path, name in cfg.sentence_split)
    for name, path in cfg.corpus_paths()
  }


def draw_texts(
  cfg: ExactRunConfig, tokenizer, corpora: Mapping[str, Sequence[str]]
) -> Texts:
  """The splits of every corpus and the attacker's texts.

  Each corpus is walked in a permutation drawn from the seed and the
  corpus's name (not on the other corpora or their order): its first
  `num_test` usable texts are the test split, the next `num_dev` the dev
  split, and, for `attacker_corpus`, the next `num_attacker` the
  attacker's. A text is usable when it has a token and its first
  `max_length` tokens are not those of a text taken already (of any
  corpus), so no two splits share a scored sequence. Test comes first so
  that choosing `num_dev` or `num_attacker` never changes the test texts.
  """
  seen: set[tuple[int, ...]] = set()
  picked: dict[str, dict[str, texts_lib.Split]] = {s: {} for s in SPLITS}
  walks = {}
  for name, items in corpora.items():
    rng = np.random.default_rng([cfg.seed, zlib.crc32(name.encode())])
    walks[name] = iter(rng.permutation(len(items)).tolist())
    for split in ('test', 'dev'):
      chosen = _take(cfg, tokenizer, name, items, walks[name], split, seen)
      picked[split][name] = _tokenized(cfg, tokenizer, chosen)
  name = cfg.attacker_corpus
  attacker = _take(
    cfg, tokenizer, name, corpora[name], walks[name], 'attacker', seen
  )
  return Texts(picked, _tokenized(cfg, tokenizer, attacker))


def _take(cfg, tokenizer, name, items, walk, split, seen) -> list[str]:
  n = {'test': cfg.num_test, 'dev': cfg.num_dev}.get(split, cfg.num_attacker)
  out = []
  while len(out) < n:
    index = next(walk, None)
    if index is None:
      raise LeakjaxError(
        f'corpus {name} has too few usable texts: its {split} split gets'
        f' {len(out)} of {n} (splits are disjoint; test, dev, then the'
        " attacker's)",
        'use a larger corpus or smaller --num_test/--num_dev/--num_attacker',
      )
    key = tuple(tokenizer.encode(items[index])[: cfg.max_length])
    if key and key not in seen:
      seen.add(key)
      out.append(items[index])
  return out


def _tokenized(cfg, tokenizer, chosen: Sequence[str]) -> texts_lib.Split:
  """`chosen` as ids `[N, W]` (BOS first when the tokenizer has one), W =
  BOS + `max_length` for every split: one compile per layer."""
  bos = tokenizer.bos_id
  width = cfg.max_length + (bos is not None)
  pad = getattr(tokenizer, 'pad_id', None) or 0
  ids = np.full((len(chosen), width), pad, np.int32)
  mask = np.zeros((len(chosen), width), np.int32)
  for r, text in enumerate(chosen):
    row = ([bos] if bos is not None else []) + tokenizer.encode(text)
    row = row[:width]
    ids[r, : len(row)], mask[r, : len(row)] = row, 1
  score_mask = mask.copy()
  if bos is not None:
    score_mask[:, 0] = 0
  refs = bei_hei.decode_ids(tokenizer, ids, score_mask)
  return texts_lib.Split(list(chosen), ids, mask, score_mask, refs)


# ------------------------------------------------------------------ cells
def cells(cfg: ExactRunConfig) -> list[tuple[str, str, str, Any]]:
  """`(split, corpus, layer, perturbation)` in the order they run: every
  unperturbed cell first (a run cut short still has the headline)."""
  return [
    (split, name, layer, p)
    for split in cfg.splits
    for p in cfg.perturbation_specs()
    for name, _ in cfg.corpus_paths()
    for layer in cfg.layers
  ]


def _layer(layer: str):
  return layer if layer == bei_hei.LAST else int(layer)


def check_model(cfg: ExactRunConfig, model) -> None:
  """LeakjaxError when the model cannot give a layer of `cfg`."""
  if model.hidden_fn is None:
    raise LeakjaxError(
      'the model declares no hidden states',
      'pass hidden_states= to models.from_functions',
    )
  if getattr(model, 'tokenizer', None) is None:
    raise LeakjaxError('the model has no tokenizer', 'load it with one')
  for layer in cfg.layers:
    bei_hei.parse_layer(model, layer)
  noisy = any(p.kind == 'noise' for p in cfg.perturbation_specs())
  if (
    noisy and cfg.noise_rule == 'calibrated' and model.tokenizer.bos_id is None
  ):
    raise LeakjaxError(
      'the calibrated rule reads the noise off the BOS state, and the'
      " model's tokenizer has no BOS",
      'pass --noise_rule=nearest',
    )


class Attacks:
  """The states, inverses and attacks of one run (computed on demand; the
  noise-levels study reads its inverters through it)."""

  def __init__(self, cfg, model, params, drawn: Texts, mesh=None):
    self.cfg, self.model, self.params, self.drawn = cfg, model, params, drawn
    self.mesh = mesh
    # The exact search's copy, on every device of the mesh (once).
    self.search_params = sharding.replicate(params, mesh)
    self.states: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    self.inverses: dict[str, dict[str, np.ndarray]] = {}
    self.parrots: dict[str, tuple[embed_parrot.EmbedParrotConfig, Any]] = {}
    self.warm: set[str] = set()
    self.embeddings = model.word_embeddings(params)
    # The calibrated rule's first-position tables, and their seconds.
    self.firsts: dict[str, np.ndarray] = {}
    self.first_seconds: dict[str, float] = {}

  def first_table(self, layer: str, config, describe=None) -> np.ndarray | None:
    """:func:`.exact.first_states` at `layer` for the calibrated rule,
    once per run (None for the other rules)."""
    if config.rule != 'calibrated':
      return None
    if layer not in self.firsts:
      start = time.perf_counter()
      self.firsts[layer] = exact.first_states(
        self.model,
        self.search_params,
        _layer(layer),
        mesh=self.mesh,
        progress=describe
        and (lambda done, total: describe(f'first position {done}/{total}')),
      )
      self.first_seconds[layer] = time.perf_counter() - start
    return self.firsts[layer]

  def layer_states(self, ids, mask, layers: Sequence[str]) -> list[np.ndarray]:
    """`H^layer` of every text, float32 `[N, W, D]` per layer."""
    both = bei_hei.layer_states_of_many(
      self.model, self.params, ids, mask, layers, batch=BATCH
    )
    return [both[i] for i in range(len(layers))]

  def cell_states(self, split: str, name: str) -> dict[str, np.ndarray]:
    if (split, name) not in self.states:
      data = self.drawn.splits[split][name]
      got = self.layer_states(data.ids, data.mask, self.cfg.layers)
      self.states[(split, name)] = dict(zip(self.cfg.layers, got))
    return self.states[(split, name)]

  def inverse(self, layer: str) -> dict[str, np.ndarray]:
    """The ridge inverse `H^layer -> H^0` fitted on the attacker's texts
    (every layer's from one pass over them) and the softmax inverse
    trained from it (`softmax_kernel`, `softmax_bias`)."""
    if layer not in self.inverses:
      data = self.drawn.attacker
      todo = [x for x in self.cfg.layers if x not in self.inverses]
      got = self.layer_states(data.ids, data.mask, (*todo, '0'))
      for x, hidden in zip(todo, got):
        stats = embed_parrot.feature_stats(hidden, data.mask)
        ridge = embed_parrot.ridge_solution(hidden, got[-1], data.mask, stats)
        soft = softmax_inverse.fit(
          hidden, data.ids, data.score_mask, stats, ridge, self.embeddings
        )
        self.inverses[x] = dict(
          stats,
          kernel=ridge[0],
          bias=ridge[1],
          softmax_kernel=soft[0],
          softmax_bias=soft[1],
        )
    return self.inverses[layer]

  def parrot(self, layer: str) -> tuple[embed_parrot.EmbedParrotConfig, Any]:
    """Embed Parrot (`EP_ARCH`) trained on the attacker's `H^layer ->
    H^0`, as the embedding-inversion runner trains it (scored positions,
    `cfg.ep_steps` steps, no checkpoint)."""
    if layer not in self.parrots:
      data = self.drawn.attacker
      hidden, h0 = self.layer_states(data.ids, data.mask, (layer, '0'))
      config = embed_parrot.EmbedParrotConfig(
        input_dim=hidden.shape[-1], output_dim=h0.shape[-1], **EP_ARCH
      )
      steps = self.cfg.ep_steps
      train_cfg = embed_parrot.train_config(
        steps,
        min(EP_BATCH, len(data.ids)),
        learning_rate=EP_LR,
        warmup_steps=max(steps // 20, 1),
        log_every=max(steps // 10, 1),
        checkpoint_every=steps,
        seed=self.cfg.seed,
      )
      variables, _ = embed_parrot.train(
        config,
        hidden,
        h0,
        data.score_mask,
        train_cfg,
        key=jax.random.key(self.cfg.seed),
      )
      self.parrots[layer] = (config, variables)
    return self.parrots[layer]

  def one_shot(self, attack: str, observed, mask, layer: str) -> np.ndarray:
    """Ids `[N, W]` BEI, HEI, the ridge or softmax inverse, or Embed
    Parrot read from the states."""
    if attack == 'ep_skip':
      config, variables = self.parrot(layer)
      observed = embed_parrot.predict_batches(
        config, variables, observed, mask, batch_size=BATCH
      )
      attack = 'hei'
    hidden = jnp.asarray(observed)
    if attack == 'bei':
      fn = jitted(bei_hei.bei_ids, static_argnames=('model',))
      return np.asarray(fn(self.model, self.params, hidden))
    if attack in ('ridge', 'softmax'):
      inv = self.inverse(layer)
      pre = '' if attack == 'ridge' else 'softmax_'
      x = (hidden - inv['input_shift']) / inv['input_scale']
      hidden = x @ inv[pre + 'kernel'] + inv[pre + 'bias']
    return np.asarray(jitted(bei_hei.hei_ids)(hidden, self.embeddings))

  def exact_attack(self, observed, data, layer, config, tick, describe=None):
    """:func:`.exact.invert` sentence by sentence (`tick(i)` after each;
    `describe(text)` while the calibrated rule's table is built)."""
    inv = self.inverse(layer)
    first = self.first_table(layer, config, describe)
    propose = jitted(exact.proposal_scores)
    lengths = data.mask.sum(1)

    def scores(i):
      return np.asarray(
        propose(
          jnp.asarray(observed[i]),
          self.embeddings,
          inv['softmax_kernel'],
          inv['softmax_bias'],
          inv['input_shift'],
          inv['input_scale'],
        )
      )

    if layer not in self.warm:  # compile the checks before timing
      self.warm.add(layer)
      short = np.minimum(lengths[:1], 3)
      exact.invert(
        self.model,
        self.search_params,
        observed[:1],
        short,
        layer=_layer(layer),
        scores=scores(0)[None],
        config=config,
        mesh=self.mesh,
        first=first,
      )
    out = []
    for i in range(len(observed)):
      out += exact.invert(
        self.model,
        self.params,
        observed[i : i + 1],
        lengths[i : i + 1],
        layer=_layer(layer),
        scores=scores(i)[None],
        config=config,
        mesh=self.mesh,
        first=first,
      )
      tick(i + 1)
    return out

  def cell(self, split, name, layer, p, done, describe) -> list[dict]:
    """The rows of one cell (those `done` holds are not recomputed)."""
    base = dict(
      kind='attack', split=split, data=name, layer=layer, perturbation=p.spec
    )
    todo = [a for a in ATTACKS if done(**base, attack=a) is None]
    if not todo:
      return []
    data = self.drawn.splits[split][name]
    states = self.cell_states(split, name)[layer]
    key = perturb.cell_key(self.cfg.seed, split, name, layer, p.spec)
    observed, facts = perturb.apply(
      p, states, data.score_mask, key=key, seed=self.cfg.seed
    )
    rows = []
    for attack in todo:
      start = time.perf_counter()
      row = {**base, 'attack': attack, **facts}
      if attack == 'exact':
        tick = lambda i: describe(f'exact {i}/{len(observed)}')
        found = self.exact_attack(
          observed, data, layer, self.cfg.exact_config(p), tick, describe
        )
        predicted = np.zeros_like(data.ids)
        for r, inv in enumerate(found):
          predicted[r, : len(inv.ids)] = inv.ids
        row.update(search_facts(found, data.score_mask))
        row['references'] = data.references[:SHOWN]
      else:
        predicted = self.one_shot(attack, observed, data.mask, layer)
      row.update(score(self.model.tokenizer, data, predicted))
      row['seconds'] = time.perf_counter() - start
      rows.append(row)
    return rows


# -------------------------------------------------------------------- run
@dataclasses.dataclass
class ExactRun:
  """What :func:`run` leaves for the report.

  Attributes:
    results: every results row (this run's and earlier ones).
    facts: the run's inputs and machine (model shape, texts per split,
      device, seconds over every invocation), also in facts.json.
  """

  results: list[dict[str, Any]]
  facts: dict[str, Any]


def writer_inputs(
  cfg: ExactRunConfig, *, model: models.Model | None = None
) -> dict[str, str | None]:
  """The run's input files by name (sha256 in provenance.json)."""
  return {
    **{f'corpus:{name}': path for name, path in cfg.corpus_paths()},
    'model': models.source_path(cfg.model) if model is None else None,
  }


def run(
  config: ExactRunConfig,
  writer: io.ExperimentWriter,
  *,
  corpora: Mapping[str, Sequence[str]] | None = None,
  model: models.Model | None = None,
  params=None,
  progress: bool = True,
  mesh=None,
) -> ExactRun:
  """Runs (or resumes) the experiment into `writer`.

  Args:
    config: the experiment.
    writer: where the rows go (opened with :func:`writer_inputs`); rows it
      holds already are not recomputed.
    corpora: `load_corpora(config)` when the caller read them already.
    model: the target (replaces loading `config.model`), with `params`.
    params: its parameters (both or neither).
    progress: one progress bar over the cells.
    mesh: a mesh with a `'data'` axis: the exact search's candidates of
      each check are split over it (None: one device).
  """
  cfg = config
  if (model is None) != (params is None):
    raise LeakjaxError('run takes model and params together')
  start = time.perf_counter()
  resumed = bool(writer.results)
  corpora = load_corpora(cfg) if corpora is None else corpora
  if model is None:
    model, params = models.load_model(cfg.model, seed=cfg.seed)
  model, params = models.cast(model, params, cfg.dtype)
  check_model(cfg, model)
  drawn = draw_texts(cfg, model.tokenizer, corpora)
  sharding.check_data_axis(mesh)
  attacks = Attacks(cfg, model, params, drawn, mesh)
  work = cells(cfg)
  bar = tqdm.tqdm(
    total=len(work),
    desc='exact inversion',
    disable=not progress or not io.is_primary(),
  )
  for split, name, layer, p in work:
    where = f'{split} {name} layer {layer} {p.spec}'
    bar.set_postfix_str(where, refresh=True)
    describe = lambda s, w=where: bar.set_postfix_str(f'{w}: {s}', refresh=True)
    for row in attacks.cell(split, name, layer, p, writer.done, describe):
      writer.add_result(row)
    bar.update(1)
  bar.close()
  facts = run_facts(cfg, model, drawn)
  # Once per layer, shared by its sentences (not in seconds_per_sentence).
  facts['first_table_seconds'] = attacks.first_seconds
  facts['seconds'] = _earlier_seconds(writer, resumed) + (
    time.perf_counter() - start
  )
  if writer.enabled:
    io.atomic_write_text(
      writer.workdir / 'facts.json',
      json.dumps(io.jsonable(facts), indent=2, sort_keys=True),
    )
  return ExactRun(results=writer.results, facts=facts)


def _earlier_seconds(writer: io.ExperimentWriter, resumed: bool) -> float:
  """The seconds of the invocations before this one, when it resumed a
  run: facts.json's `seconds` is the run's wall time over every invocation
  (an invocation cut short before it wrote facts.json is not counted)."""
  path = writer.workdir / 'facts.json'
  if not (resumed and writer.enabled and path.exists()):
    return 0.0
  return float(json.loads(path.read_text()).get('seconds', 0.0))


def run_facts(cfg: ExactRunConfig, model, drawn: Texts) -> dict[str, Any]:
  """What the report says of the run's inputs and machine."""
  env = provenance.environment()
  return {
    'model': cfg.model,
    'num_layers': model.num_layers,
    'hidden_size': model.hidden_size,
    'vocab_size': model.vocab_size,
    'num_texts': {
      split: {name: len(s.texts) for name, s in drawn.splits[split].items()}
      for split in cfg.splits
    },
    'num_attacker': len(drawn.attacker.texts),
    'device': jax.devices()[0].device_kind,
    'devices': env['devices'],
  }


__all__ = [
  'ATTACKS',
  'Attacks',
  'ExactRun',
  'ExactRunConfig',
  'Texts',
  'cells',
  'check_model',
  'draw_texts',
  'key_params',
  'load_corpora',
  'run',
  'score',
  'search_facts',
  'summarize',
  'writer_inputs',
]
