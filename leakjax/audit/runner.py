r"""The audit: every artefact under every defense, the strongest attack on
each, and what each defense costs.

Read top-down from :func:`run`:

1. The user's corpus becomes FILM's sentences (Appendix B.1, no entity
   filter) and splits (:func:`split_sentences`): the attacked batches
   (the first ones, consecutive, as DAGER's experiment), the held-out
   sentences (the last `heldout_fraction`: never attacked nor trained
   on) and the fine-tuning text (everything not held out).
2. Work units (:func:`units`), one progress bar over all of them:
   * `gradient` / `update` cells: the client of one batch sends its
     defended FedSGD gradient or FedAvg update; the attacks run strongest
     first -- DAGER's exact span recovery, the hybrid past DAGER's rank
     limit, FILM where the embedding rows carry a gradient (DAGER's
     `strongest` preset, :mod:`leakjax.attacks.dager.presets`) -- and
     stop at the first that reads every sentence back verbatim;
   * `hidden:<layer>` cells: the provider inverts the states (BEI, HEI,
     a ridge inverse, then the exact search, :mod:`leakjax.audit.hidden`);
   * `snapshot` cells: the differential rank search between the model
     before and after fine-tuning (:mod:`leakjax.audit.snapshot`);
   * utility runs: the same fine-tuning under each defense and seed
     (:mod:`leakjax.audit.utility`).
3. Every attack is one results row naming its attack; the report keeps,
   per cell, the strongest (`experiments/audit_report.py`).

Work units split over the processes of a multi-host run (unit i on
process i mod P); process 0 gathers every row and writes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import resource
import time
from typing import Any, Sequence

import jax
import numpy as np
import tqdm
from absl import logging

from leakjax import data as data_lib
from leakjax import io, models, provenance, runtime
from leakjax.attacks import film
from leakjax.attacks.dager import client as dager_client
from leakjax.attacks.dager import presets as dager_presets
from leakjax.attacks.dager import runner as dager_runner
from leakjax.audit import client, hidden, scoring, snapshot, utility
from leakjax.audit.config import AuditConfig, parse_defense
from leakjax.audit.summary import THREAT_MODELS
from leakjax.errors import LeakjaxError
from leakjax.recovery.corpus import load_texts, writer_inputs


@dataclasses.dataclass
class AuditRun:
  """What :func:`run` leaves for the report.

  Attributes:
    results: every row (attack rows and utility rows).
    extra: facts for the report (model, split sizes, DP noise, runtime,
      peak memory, data fingerprint, versions, threat models).
  """

  results: list[dict[str, Any]]
  extra: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Splits:
  """The sentences of an audit.

  Attributes:
    sentences: every preprocessed sentence.
    train: the fine-tuning text (all but the held-out ones).
    heldout: the held-out sentences (the perplexity's text).
    attacker: the fine-tuning sentences no batch attacks (the hidden-state
      attacker's own text).
  """

  sentences: list[str]
  train: list[str]
  heldout: list[str]
  attacker: list[str]


def sentences_needed(cfg: AuditConfig) -> int:
  """Sentences the attacked batches take (consecutive, from the first)."""
  return cfg.num_batches * max(cfg.batch_sizes)


def split_sentences(cfg: AuditConfig, sentences: Sequence[str]) -> Splits:
  """The splits of `sentences`; LeakjaxError when they are too few."""
  n = len(sentences)
  heldout = max(1, math.ceil(cfg.heldout_fraction * n))
  needed = sentences_needed(cfg)
  if n - heldout < needed:
    raise LeakjaxError(
      f'the corpus has {n} sentences after preprocessing (fewer than'
      f' {cfg.max_tokens} tokens each); the batches need {needed}'
      f' ({cfg.num_batches} x b = {max(cfg.batch_sizes)}) and'
      f' {heldout} more are held out',
      'use more data, smaller --batch_sizes or fewer --num_batches',
    )
  train = list(sentences[: n - heldout])
  return Splits(
    sentences=list(sentences),
    train=train,
    heldout=list(sentences[n - heldout :]),
    attacker=train[needed:],
  )


def splits_of(cfg: AuditConfig, texts: Sequence[str], tokenizer) -> Splits:
  """The audit's splits of the raw `texts`
  (:func:`leakjax.data.preprocess_sentences` at `max_tokens` and
  `max_sentences`, then :func:`split_sentences`)."""
  sentences = data_lib.preprocess_sentences(
    texts,
    tokenizer,
    max_tokens=cfg.max_tokens,
    max_sentences=cfg.max_sentences,
  )
  return split_sentences(cfg, sentences)


def check_model(cfg: AuditConfig, model) -> None:
  """LeakjaxError when the model cannot give an artefact of `cfg`."""
  gives_spans = bool(model.paths.attention_inputs)
  for artefact in cfg.artefacts:
    if artefact in ('gradient', 'update') and not gives_spans:
      raise LeakjaxError(
        f'the {artefact} artefact needs a transformer whose attention'
        ' inputs the model declares (DAGER reads their gradients); this'
        ' model declares none',
        'declare paths.attention_inputs, or audit --artefacts=hidden,snapshot',
      )
    if artefact == 'hidden' and model.hidden_fn is None:
      raise LeakjaxError(
        'the hidden artefact needs the model to declare its hidden states',
        'pass hidden_states= to models.from_functions, or leave out hidden',
      )
    if artefact == 'hidden':
      for layer in cfg.layers:
        if layer != 'last' and int(layer) > model.num_layers:
          raise LeakjaxError(
            f"layer {layer} is past the model's {model.num_layers} blocks",
            f'use --layers within 0..{model.num_layers} or last',
          )


def dager_config(cfg: AuditConfig) -> dager_runner.DagerConfig:
  """DAGER's `strongest` preset on the audit's sentences and batches."""
  return dager_presets.config(
    'strongest',
    model=cfg.model,
    data=cfg.data,
    data_column=cfg.data_column,
    data_label=cfg.data_label,
    max_sentences=cfg.max_sentences,
    max_tokens=cfg.max_tokens,
    batch_sizes=cfg.batch_sizes,
    num_batches=cfg.num_batches,
    film_beams=cfg.film_beams,
    film_steps=cfg.film_steps,
    attacks=('dager', 'hybrid', 'film'),
    seed=cfg.seed,
  )


def units(cfg: AuditConfig) -> list[tuple]:
  """The work, in order: attack cells per batch and the utility runs."""
  attacks: list[tuple] = []
  for artefact, b, defense in cfg.cells():
    batches = 1 if artefact == 'snapshot' else cfg.num_batches
    attacks.extend(('attack', artefact, b, k, defense) for k in range(batches))
  runs = [
    ('utility', defense, cfg.seed + s)
    for defense in cfg.defenses
    for s in range(cfg.utility_seeds)
  ]
  # A snapshot pair is the first seed's fine-tuning: it runs first.
  return runs + attacks if 'snapshot' in cfg.artefacts else attacks + runs


def gradient_attacks(defense: str) -> tuple[str, ...]:
  """Strongest first. FILM reads its bag off the embedding rows' gradient,
  which frozen embeddings do not have."""
  if parse_defense(defense)[0] == 'freeze':
    return ('dager', 'hybrid')
  return ('dager', 'hybrid', 'film')


_DROPPED = ('searched_ids', 'start_ids', 'alternative_ids', 'num_tokens')


class _Cells:
  """Computes the rows of one work unit (the model, splits and caches of
  one audit)."""

  def __init__(self, cfg, model, params, splits, mesh=None):
    self.cfg, self.model, self.params = cfg, model, params
    # What the attacks read: the model as it serves in `cfg.dtype` (the
    # fine-tuning runs and the attacker's own samples stay float32).
    self.served, self.served_params = models.cast(model, params, cfg.dtype)
    self.splits, self.mesh = splits, mesh
    self.dager = dager_config(cfg)
    self.baselines = {'film': film.baseline(cfg.film_beams, cfg.film_steps)}
    self.inverses: dict[str, hidden.Inverse] = {}
    self.samples: list[str] | None = None
    self.entities: dict[tuple[int, int], list[set[str]]] = {}
    self.tuned: dict[str, Any] = {}
    self.sigmas: dict[str, float] = {}
    self.width = cfg.max_tokens + 1

  def batch(self, b: int, index: int) -> list[str]:
    return self.splits.sentences[index * b : (index + 1) * b]

  def attack(self, artefact, b, index, defense, done) -> list[dict]:
    if artefact == 'snapshot':
      return self.snapshot(defense, done)
    texts = self.batch(b, index)
    ids, mask = dager_client.padded_batch(self.served, texts, self.width)
    key = dager_client.batch_key(self.dager, b, index)
    if (b, index) not in self.entities:  # one NER pass per batch
      self.entities[(b, index)] = scoring.entities_of(texts)
    ents = self.entities[(b, index)]
    base = {'kind': 'attack', 'artefact': artefact, 'b': b, 'batch': index}
    base['defense'] = defense
    if artefact.startswith('hidden:'):
      return self.hidden(
        artefact, texts, ids, mask, defense, key, ents, base, done
      )
    defended, sigma = client.make_defense(
      self.served, defense, self.cfg, num_train=len(self.splits.train)
    )
    if sigma is not None:
      self.sigmas[defense] = sigma
    grads = None
    rows = []
    for name in gradient_attacks(defense):
      row = done(attack=name)
      if row is None:
        if grads is None:
          grads = client.sent_gradient(
            self.served,
            self.served_params,
            ids,
            mask,
            artefact,
            defended,
            self.cfg,
            key=key,
          )
        row = dager_runner.attack_gradient(
          self.served,
          self.served_params,
          grads,
          texts,
          ids,
          mask,
          name,
          self.dager,
          key=key,
          baselines=self.baselines,
          mesh=self.mesh,
        )
        if row is None:  # the hybrid below the rank limit: DAGER's batch
          continue
        row = {k: v for k, v in row.items() if k not in _DROPPED}
        row.update(scoring.describe(texts, row['recovered'], ents))
        row['note'] = 'rank-limited' if row.get('rank_limited') else ''
        row = {**base, **row}
      rows.append(row)
      if row['exact'] == 1.0:
        break
    return rows

  def hidden(self, artefact, texts, ids, mask, defense, key, ents, base, done):
    layer = artefact.partition(':')[2]
    kind, value = parse_defense(defense)
    states = hidden.states(self.served, self.served_params, ids, mask, layer)
    if kind == 'noise':
      states = hidden.noisy(states, value, key)
    rows = []
    for name in hidden.ATTACKS:
      row = done(attack=name)
      if row is None:
        start = time.perf_counter()
        inverse = None
        if name in ('ridge', 'exact'):
          inverse = self.inverse(layer)
          if inverse.kernel is None:
            logging.info(
              '%s at layer %s skipped: %s', name, layer, inverse.note
            )
            continue
        if name == 'exact':
          predicted = hidden.invert_exactly(
            self.served,
            self.served_params,
            states,
            mask,
            layer,
            inverse,
            noisy=kind == 'noise',
          )
        else:
          predicted = hidden.invert(
            self.served, self.served_params, states, name, inverse
          )
        row = {**base, 'attack': name}
        row.update(hidden.score(self.served, texts, ids, mask, predicted))
        described = scoring.describe(texts, row['recovered'], ents)
        described.pop('matched')
        described.pop('exact_each')
        row.update(described, originals=list(texts), note='')
        row['seconds'] = time.perf_counter() - start
      rows.append(row)
      if row['exact'] == 1.0:
        break
    return rows

  def attacker_text(self) -> list[str]:
    """The user's unattacked sentences and the model's samples (drawn
    once, at the first hidden-state cell)."""
    if self.samples is None:
      self.samples = hidden.attacker_samples(
        self.model,
        self.params,
        self.cfg.attacker_samples,
        self.cfg.max_tokens,
        self.cfg.seed,
      )
    return [*self.splits.attacker, *self.samples]

  def inverse(self, layer: str) -> hidden.Inverse:
    if layer not in self.inverses:
      self.inverses[layer] = hidden.fit_inverse(
        self.served,
        self.served_params,
        self.attacker_text(),
        layer,
        self.width,
      )
    return self.inverses[layer]

  def fine_tuned(self, defense: str, seed: int):
    params, row = utility.fine_tune(
      self.model,
      self.params,
      self.splits.train,
      self.splits.heldout,
      defense,
      self.cfg,
      seed,
    )
    if row['sigma'] is not None:
      self.sigmas[defense] = row['sigma']
    return params, row

  def utility(self, defense: str, seed: int) -> dict:
    params, row = self.fine_tuned(defense, seed)
    if seed == self.cfg.seed and 'snapshot' in self.cfg.artefacts:
      self.tuned[defense] = params
    return row

  def snapshot(self, defense: str, done) -> list[dict]:
    row = done(attack='differential')
    if row is not None:
      return [row]
    if defense not in self.tuned:
      self.tuned[defense], _ = self.fine_tuned(defense, self.cfg.seed)
    row = snapshot.attack(
      self.served,
      self.served_params,
      models.cast(self.model, self.tuned[defense], self.cfg.dtype)[1],
      self.splits.train,
      self.cfg,
    )
    return [
      {
        'kind': 'attack',
        'artefact': 'snapshot',
        'b': 0,
        'batch': 0,
        'defense': defense,
        **row,
      }
    ]


def run(
  config: AuditConfig,
  writer: io.ExperimentWriter,
  *,
  texts: Sequence[str] | None = None,
  progress: bool = True,
  mesh=None,
) -> AuditRun:
  """Runs (or resumes) the audit into `writer`; returns its rows and facts.

  Args:
    config: the audit.
    writer: where the rows go (opened with :func:`writer_inputs`); rows it
      holds already are not recomputed.
    texts: `load_texts(config)` when the caller read them already.
    progress: one progress bar, with the time left, over the whole audit.
    mesh: `--mesh`: DAGER's search and FILM's beams split over its devices
      (no result depends on it).
  """
  cfg = config
  start = time.perf_counter()
  texts = load_texts(cfg) if texts is None else texts
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  check_model(cfg, model)
  splits = splits_of(cfg, texts, model.tokenizer)
  scoring.entities_of(splits.sentences[:1])  # spaCy is there, before work
  cells = _Cells(cfg, model, params, splits, mesh)
  work = units(cfg)
  mine = [
    u
    for i, u in enumerate(work)
    if i % jax.process_count() == jax.process_index()
  ]
  bar = tqdm.tqdm(
    total=len(mine), desc='audit', disable=not progress or not io.is_primary()
  )
  fresh: list[dict] = []
  with runtime.Heartbeat() as beat:
    for unit in mine:
      beat.stage = _describe(unit)
      bar.set_postfix_str(beat.stage, refresh=True)
      fresh.extend(_run_unit(cells, writer, unit))
      bar.update(1)
      # A unit's gradients, fine-tuned weights and compiled programs are
      # freed; glibc keeps their pages unless given back.
      runtime.return_freed_memory()
  bar.close()
  if jax.process_count() > 1:
    for row in _gather_rows(fresh):
      if writer.done(**_row_key(row)) is None:
        writer.add_result(row)
  extra = facts(cfg, model, splits, cells.sigmas, texts)
  if cells.samples is not None:
    extra['num_attacker_samples'] = len(cells.samples)
  extra['seconds'] = time.perf_counter() - start
  extra['peak_memory_mib'] = (
    resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  )
  if writer.enabled:
    io.atomic_write_text(
      writer.workdir / 'facts.json',
      json.dumps(io.jsonable(extra), indent=2, sort_keys=True),
    )
  return AuditRun(results=writer.results, extra=extra)


def _run_unit(cells: _Cells, writer: io.ExperimentWriter, unit) -> list[dict]:
  """The rows one work unit adds to `writer` (none when all were there)."""
  fresh = []
  if unit[0] == 'utility':
    _, defense, seed = unit
    if writer.done(kind='utility', defense=defense, seed=seed) is None:
      row = cells.utility(defense, seed)
      writer.add_result(row)
      fresh.append(row)
    return fresh
  _, artefact, b, index, defense = unit
  match = dict(
    kind='attack', artefact=artefact, b=b, batch=index, defense=defense
  )
  done = functools.partial(writer.done, **match)
  for row in cells.attack(artefact, b, index, defense, done):
    if writer.done(**match, attack=row['attack']) is None:
      writer.add_result(row)
      fresh.append(row)
  return fresh


def _describe(unit) -> str:
  if unit[0] == 'utility':
    return f'fine-tune {unit[1]} seed {unit[2]}'
  _, artefact, b, index, defense = unit
  return f'{artefact} b={b} batch {index} {defense}'


def _row_key(row: dict) -> dict:
  if row['kind'] == 'utility':
    return dict(kind='utility', defense=row['defense'], seed=row['seed'])
  return {
    k: row[k] for k in ('kind', 'artefact', 'b', 'batch', 'defense', 'attack')
  }


def _gather_rows(rows: list[dict]) -> list[dict]:
  """Every process's rows on every process (a collective: all call it)."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  blob = np.frombuffer(json.dumps(io.jsonable(rows)).encode(), np.uint8)
  sizes = multihost_utils.process_allgather(np.array([blob.size]))
  width = int(np.max(sizes))
  padded = np.zeros(width, np.uint8)
  padded[: blob.size] = blob
  every = multihost_utils.process_allgather(padded[None], tiled=True)
  out = []
  for size, data in zip(np.ravel(sizes), every):
    out.extend(json.loads(bytes(data[: int(size)]).decode()))
  return out


def facts(cfg, model, splits: Splits, sigmas, texts) -> dict[str, Any]:
  """What the report says of the audit's inputs."""
  env = provenance.environment()
  return {
    'model': cfg.model,
    'num_sentences': len(splits.sentences),
    'num_train': len(splits.train),
    'num_heldout': len(splits.heldout),
    'num_attacker': len(splits.attacker),
    'hidden_size': model.hidden_size,
    'num_layers': model.num_layers,
    'sigma': dict(sigmas),
    'data_fingerprint': provenance.texts_sha256(list(texts))[:16],
    'versions': {'leakjax': env['leakjax'], **env['packages']},
    'devices': env['devices'],
    'threat_models': dict(THREAT_MODELS),
  }


__all__ = [
  'AuditRun',
  'Splits',
  'THREAT_MODELS',
  'check_model',
  'dager_config',
  'facts',
  'load_texts',
  'run',
  'sentences_needed',
  'split_sentences',
  'splits_of',
  'units',
  'writer_inputs',
]
