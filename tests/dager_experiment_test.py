"""experiments.dager: flags, configs, metrics and a run on a small GPT-2."""

import dataclasses
import json
import logging
import pathlib

import jax
import numpy as np
import pytest

from experiments import common
from experiments import dager as dager_exp
from leakjax import io
from leakjax.attacks.dager import client as dager_client
from leakjax.attacks.dager import hybrid, presets, runner
from leakjax.errors import LeakjaxError
from leakjax.models import get_path
from leakjax.tokenization import gpt2_tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]


HYBRID_FIELDS = {f.name for f in dataclasses.fields(hybrid.HybridConfig)}
# Flagfiles that set a setting that left the library (their headers say
# where its evidence is): they record what ran and parse no more.
REMOVED = 'This setting left the library'


def tiny_hybrid(**changes) -> runner.DagerConfig:
  """The hybrid on the small GPT-2 (20 tokens, 8 shortlisted), with
  `changes` (`hybrid_<field>` for the hybrid's own)."""
  inner = {'shortlist': 8}
  for key in list(changes):
    name = key.removeprefix('hybrid_')
    if key.startswith('hybrid_') and name in HYBRID_FIELDS:
      inner[name] = changes.pop(key)
  return runner.DagerConfig(
    model='gpt2-tiny',
    max_tokens=20,
    attacks=('hybrid',),
    hybrid=hybrid.HybridConfig(**inner),
    **changes,
  )


def parsed(values, argv) -> runner.DagerConfig:
  """The experiment's config of `argv`, parsed afresh into `values`."""
  values.unparse_flags()
  values(argv)
  return dager_exp.config_from_flags()


def committed_flagfiles() -> list[str]:
  """The dager flagfiles that still parse (not those of removed settings)."""
  return sorted(
    str(p.relative_to(REPO))
    for folder in ('experiments/configs', 'studies/dager/configs')
    for p in (REPO / folder).glob('dager*.flags')
    if REMOVED not in p.read_text()
  )


def test_flags_are_the_config_fields(fresh_flags):
  dager_exp.define_flags()
  fields = {f.name for f in dataclasses.fields(runner.DagerConfig)} - {'hybrid'}
  fields |= {
    f'hybrid_{name}' for name in HYBRID_FIELDS - {'span', 'max_length'}
  }
  common_flags = {
    'workdir',
    'data',
    'data_column',
    'data_label',
    'seed',
    'mesh',
    *common.RUN_FLAGS,
  }
  assert set(fresh_flags) - common_flags == fields - {
    'data',
    'data_column',
    'data_label',
    'seed',
  }
  cfg = parsed(fresh_flags, ['prog', '--preset=paper'])
  assert cfg == runner.DagerConfig(preset='paper')
  # The nested config's flags keep their names and rebuild it.
  cfg = parsed(
    fresh_flags, ['prog', '--preset=paper', '--hybrid_beams=4', '--hybrid_cuts']
  )
  assert cfg.hybrid == hybrid.HybridConfig(beams=4, cuts=True)


@pytest.mark.parametrize('path', committed_flagfiles())
def test_committed_flagfiles_parse(fresh_flags, path):
  dager_exp.define_flags()
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={REPO / path}'])
  assert cfg.model == 'smollm2-135m'
  # The report's batch sizes, each flagfile its own workdir.
  assert cfg.batch_sizes and set(cfg.batch_sizes) <= {1, 4, 16, 32, 64, 128}
  assert cfg.num_batches >= 1


@pytest.mark.parametrize(
  'spec', ['noise', 'noise:-1', 'fedavg:2', 'fedavg:0:4', 'prune:0.9', 'x']
)
def test_bad_defenses_are_refused(spec):
  with pytest.raises(LeakjaxError, match='bad defense'):
    dager_client.parse_defense(spec)


def test_split_is_a_record_of_the_batches():
  cfg = runner.DagerConfig(split='test', first_batch=3)
  assert cfg == dataclasses.replace(cfg, split='dev')  # computes the same
  assert io.jsonable(cfg)['split'] == 'test'  # config.json says it
  with pytest.raises(LeakjaxError, match='unknown --split'):
    runner.DagerConfig(split='heldout')


def test_defenses_parse():
  assert dager_client.parse_defense('none') == ('none', ())
  assert dager_client.parse_defense('noise:0.01') == ('noise', (0.01,))
  assert dager_client.parse_defense('fedavg:2:4') == ('fedavg', (2.0, 4.0))


def test_consecutive_batches_and_too_little_data():
  sents = [f's{i}' for i in range(10)]
  got = dager_client.consecutive_batches(sents, 3, 2, first=1)
  assert got == [(1, ['s3', 's4', 's5']), (2, ['s6', 's7', 's8'])]
  with pytest.raises(LeakjaxError, match='no batch 3'):
    dager_client.consecutive_batches(sents, 3, 2, first=2)


def test_batch_scores_best_prediction_per_original():
  originals = ['the cat sat on the mat', 'a dog ran far away']
  predictions = ['the cat sat on the mat', 'a dog ran']
  true_ids = [[1, 2, 3], [1, 4, 5]]
  scores = runner.batch_scores(
    originals, predictions, true_ids, [[1, 2, 3], [1, 4, 6]]
  )
  assert scores['rouge1'] == pytest.approx((1.0 + 0.75) / 2)
  assert scores['exact'] == 0.5
  assert scores['exact_prefix'] == 1.0  # [1, 4] == [1, 4, 6] without its last
  empty = runner.batch_scores(originals, [], true_ids, [])
  assert empty['rougeL'] == 0.0 and empty['exact'] == 0.0


@pytest.mark.slow
def test_run_on_small_gpt2_recovers_batches_and_survives_frozen_embeddings(
  tmp_path,
):
  # A small random GPT-2 (learned positions, BOS): the span tests need no
  # training. With frozen (tied) embeddings the client sends no embedding
  # gradient: the span search still recovers every sentence but its last
  # token, which is read off that gradient.
  cfg = runner.DagerConfig(
    model='gpt2-tiny',
    max_tokens=20,
    batch_sizes=(1, 2),
    num_batches=1,
    defenses=('none', 'freeze'),
  )
  summary = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  for b in (1, 2):
    assert summary[f'rouge1@b={b}'] == 1.0
    assert summary[f'exact@b={b}'] == 1.0
    assert summary[f'exact_prefix@b={b},defense=freeze'] == 1.0
    assert summary[f'exact@b={b},defense=freeze'] < 1.0
  rows = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert len(rows) == 4
  assert all(not r['rank_limited'] and r['rank2'] > 0 for r in rows)
  assert (tmp_path / 'dager_vs_tokens.png').stat().st_size > 0
  assert 'rank-limited' in (tmp_path / 'summary.md').read_text()


@pytest.mark.slow
def test_hybrid_attack_runs_through_the_experiment(tmp_path, caplog):
  # Below the rank limit the span term picks each sentence's first word
  # (scored over every candidate); the small GPT-2's LM is random, so where
  # a sentence ends is its call and is not checked here
  # (dager_hybrid_test.py checks the search token by token).
  cfg = tiny_hybrid(
    batch_sizes=(1,),
    num_batches=2,
  )
  # absl's own logger too: a test before this one in the same process may
  # have left it above INFO.
  with caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, 'absl'):
    summary = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  # The searches say where they are (the last one always).
  assert caplog.text.count('hybrid: search 1/1 done') == 2
  rows = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert [r['attack'] for r in rows] == ['hybrid', 'hybrid']
  for r in rows:
    assert r['num_recovered'] == len(r['recovered']) == 1
    first = r['recovered'][0].split()[0]
    assert r['originals'][0].split()[0].startswith(first)
  assert 0 < summary['rouge1@attack=hybrid,b=1'] <= 1


@pytest.mark.slow
def test_hybrid_start_allocation_runs_through_the_experiment(tmp_path):
  # With --hybrid_start_dims each search starts with the first token
  # allocated to it, and the row records both; --hybrid_prior_start and
  # --hybrid_weight_evidence reach the search's config.
  cfg = tiny_hybrid(
    batch_sizes=(2,),
    num_batches=1,
    hybrid_start_dims=4,
    hybrid_prior_start=0,
    hybrid_weight_evidence=30.0,
  )
  assert runner.hybrid_config(cfg).prior_start == 0
  assert runner.hybrid_config(cfg).weight_evidence == 30.0
  assert runner.hybrid_config(tiny_hybrid()).prior_start is None
  dager_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert len(row['start_ids']) == len(row['searched_ids']) == 2
  for seq, first in zip(row['searched_ids'], row['start_ids']):
    assert seq[1] == first
  with pytest.raises(LeakjaxError, match='start_dims'):
    tiny_hybrid(hybrid_start_dims=-1)
  with pytest.raises(LeakjaxError, match='weight_evidence'):
    tiny_hybrid(hybrid_weight_evidence=-1.0)


@pytest.mark.slow
def test_fedavg_view_of_one_full_batch_step_is_the_fedsgd_gradient():
  # One local epoch of one full-batch step: θ1 = θ0 − η g, so what the
  # attacker reconstructs, −Δ / (η · steps), is the FedSGD gradient g.
  from tests.dager_test import BATCHES, gradient, pad, tiny

  model, params = tiny('gpt2')
  ids, mask = pad(BATCHES['equal'])
  cfg = runner.DagerConfig(fedavg_lr=1e-3)
  got = dager_client.client_view(
    model, params, ids, mask, 'fedavg:1:2', cfg, key=jax.random.key(0)
  )
  want = gradient('gpt2', 'equal')
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-4)
  frozen = dager_client.client_view(
    model, params, ids, mask, 'freeze', cfg, key=jax.random.key(0)
  )
  emb = model.paths.word_embeddings
  assert not np.any(np.asarray(get_path(frozen, emb)))


@pytest.mark.slow
def test_data_column_and_label_choose_the_private_rows(tmp_path):
  # A .tsv with two text columns and a label: only the `Body` of the rows
  # labelled private may reach the client batches.
  corpus = tmp_path / 'mail.tsv'
  rows = [
    ('private', 'Please send the contract to Houston tonight.', 'x'),
    ('public', 'The weather service expects rain.', 'y'),
    ('private', 'Call Maria about the budget review.', 'z'),
  ]
  corpus.write_text(
    'Kind\tBody\tSubject\n' + ''.join('\t'.join(r) + '\n' for r in rows)
  )
  cfg = runner.DagerConfig(
    model='gpt2-tiny',
    data=str(corpus),
    data_column='Body',
    data_label='Kind=private',
    max_tokens=20,
    batch_sizes=(1,),
    num_batches=2,
  )
  dager_exp.run_experiment(cfg, tmp_path / 'run', progress=False)
  got = [
    json.loads(x)['originals'][0]
    for x in (tmp_path / 'run' / 'results.jsonl').open()
  ]
  assert sorted(got) == sorted(r[1] for r in rows if r[0] == 'private')


def test_hybrid_settings_are_checked():
  with pytest.raises(LeakjaxError, match='oversample'):
    tiny_hybrid(hybrid_oversample=0.5)
  with pytest.raises(LeakjaxError, match='select_weight'):
    tiny_hybrid(hybrid_select_weight=-1.0)
  with pytest.raises(LeakjaxError, match='pool_beams'):
    tiny_hybrid(hybrid_beams=4, hybrid_pool_beams=5)
  with pytest.raises(LeakjaxError, match='weight_start'):
    tiny_hybrid(hybrid_weight_start=-1.0)


def test_config_json_of_the_committed_reports_loads():
  # Flat `hybrid_<field>` keys (as the committed reports wrote them) and
  # the nested dict that config.json now holds give the same config.
  old = json.loads(
    (REPO / 'reports/dager/hybrid_evidence_oversample/config.json').read_text()
  )
  cfg = runner.config_from_json(old)
  assert cfg.hybrid.oversample == 1.5 and cfg.hybrid.prior_start == 0
  nested = json.loads(json.dumps(io.jsonable(cfg)))
  assert runner.config_from_json(nested) == cfg
  with pytest.raises(LeakjaxError, match='left the library'):
    runner.config_from_json(dict(old, hybrid_head_explain=True))


def test_presets_fill_the_config_and_explicit_flags_override(fresh_flags):
  dager_exp.define_flags()
  strongest = parsed(fresh_flags, ['prog'])
  assert strongest == presets.config('strongest')
  assert strongest.preset == 'strongest' and strongest.hybrid_past_limit
  assert strongest.attacks == ('dager', 'hybrid')
  assert (
    strongest.hybrid.start_dims,
    strongest.hybrid.prior_start,
    strongest.hybrid.weight_evidence,
    strongest.hybrid.oversample,
    strongest.hybrid.cuts,
    strongest.hybrid.select_weight,
    strongest.hybrid.select_whiten,
  ) == (64, 0, 30.0, 1.5, True, 1.0, True)
  paper = parsed(fresh_flags, ['prog', '--preset=paper'])
  assert paper == presets.config('paper') == runner.DagerConfig(preset='paper')
  differ = {
    f.name
    for f in dataclasses.fields(runner.DagerConfig)
    if getattr(paper, f.name) != getattr(strongest, f.name)
  }
  assert differ == {'attacks', 'hybrid', 'hybrid_past_limit', 'preset'}
  cfg = parsed(
    fresh_flags, ['prog', '--hybrid_oversample=2', '--attacks=hybrid']
  )
  assert cfg.hybrid.oversample == 2.0 and cfg.attacks == ('hybrid',)
  assert cfg.hybrid.start_dims == 64  # the preset's, not overridden
  with pytest.raises(LeakjaxError, match='unknown preset'):
    presets.config('best')


def test_strongest_runs_the_hybrid_only_past_the_rank_limit(fresh_flags):
  # The quick run (b = 1, 4, 16, no --attacks) under the default preset:
  # its batches stay below the rank limit, so no hybrid row is written
  # and its summary is DAGER's alone. SmolLM2's width is 576; the
  # committed quick batches hold at most 386 input positions, the b = 64
  # ones at least 1,341.
  dager_exp.define_flags()
  cfg = parsed(
    fresh_flags,
    ['prog', f'--flagfile={REPO / "experiments/configs/dager_quick.flags"}'],
  )
  assert cfg.hybrid_past_limit and 'hybrid' in cfg.attacks
  rows = [
    json.loads(x) for x in (REPO / 'reports/dager/quick/results.jsonl').open()
  ]
  assert {r['b'] for r in rows} == set(cfg.batch_sizes)
  span = runner.hybrid_config(cfg).span
  for r in rows:
    assert not runner.past_rank_limit(r['num_tokens'], 576, span)
  # A full-width batch (b = 16 sentences of the longest, 41 tokens) is
  # past it; so is every b = 64 batch.
  assert runner.past_rank_limit(16 * 41, 576, span)
  held = REPO / 'reports/dager/hybrid_evidence_oversample_heldout'
  for line in (held / 'results.jsonl').open():
    assert runner.past_rank_limit(json.loads(line)['num_tokens'], 576, span)
  assert not runner.past_rank_limit(558, 576) and runner.past_rank_limit(
    559, 576
  )


def test_the_strongest_flagfile_is_the_preset(fresh_flags):
  # dager_hybrid_evidence_oversample.flags names the preset in place of
  # its 7 hybrid flags; the config is the same field for field.
  dager_exp.define_flags()
  path = REPO / 'experiments/configs/dager_hybrid_evidence_oversample.flags'
  short = parsed(fresh_flags, ['prog', f'--flagfile={path}'])
  assert (
    parsed(
      fresh_flags,
      [
        'prog',
        f'--flagfile={path}',
        '--hybrid_start_dims=64',
        '--hybrid_prior_start=0',
        '--hybrid_weight_evidence=30',
        '--hybrid_oversample=1.5',
        '--hybrid_cuts',
        '--hybrid_select_weight=1',
        '--hybrid_select_whiten',
      ],
    )
    == short
  )
  assert short.attacks == ('hybrid',) and short.batch_sizes == (64,)


@pytest.mark.slow
def test_film_attack_runs_through_the_experiment(tmp_path):
  # FILM on the same client gradient as DAGER: it draws with the batch's
  # own key (dager_client.batch_key), so two runs recover the same sentences.
  cfg = runner.DagerConfig(
    model='gpt2-tiny',
    max_tokens=12,
    batch_sizes=(1,),
    num_batches=1,
    attacks=('film',),
    film_beams=2,
    film_steps=1,
  )
  recovered = []
  for run in ('a', 'b'):
    summary = dager_exp.run_experiment(cfg, tmp_path / run, progress=False)
    (row,) = [json.loads(x) for x in (tmp_path / run / 'results.jsonl').open()]
    assert row['attack'] == 'film' and row['num_recovered'] >= 1
    assert 0 <= summary['rougeL@attack=film,b=1'] <= 1
    recovered.append(row['recovered'])
  assert recovered[0] == recovered[1]
  assert dager_client.batch_key(cfg, 4, 2) == dager_client.batch_key(cfg, 4, 2)


@pytest.mark.slow
def test_baselines_come_from_the_caller(tmp_path):
  # The runner imports no other paper: 'film' is whatever the caller
  # passes, scored on the same gradient, and refused when none is passed.
  cfg = runner.DagerConfig(
    model='gpt2-tiny',
    max_tokens=12,
    batch_sizes=(1,),
    num_batches=1,
    attacks=('dager', 'film'),
  )
  with pytest.raises(LeakjaxError, match="'film' attack"):
    runner.run(cfg, io.ExperimentWriter(tmp_path / 'none', cfg))
  # A baseline that "recovers" the batch's one sentence scores 1.
  first = runner.private_sentences(
    cfg, runner.load_texts(cfg), gpt2_tokenizer()
  )[0]
  seen = []

  def echo(model, params, grads, *, key, mesh=None):
    seen.append((key, mesh))
    return [first]

  writer = io.ExperimentWriter(tmp_path / 'echo', cfg)
  run = runner.run(cfg, writer, baselines={'film': echo}, progress=False)
  (row,) = [r for r in run.results if r['attack'] == 'film']
  assert len(seen) == 1 and seen[0][1] is None
  assert seen[0][0] == dager_client.batch_key(cfg, 1, 0)
  assert row['originals'] == row['recovered'] == [first]
  assert row['rougeL'] == row['exact'] == 1.0
