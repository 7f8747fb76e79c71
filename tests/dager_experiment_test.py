"""experiments.dager: flags, configs, metrics and a run on a small GPT-2."""

import dataclasses
import json
import pathlib

import jax
import numpy as np
import pytest

from experiments import common
from experiments import dager as dager_exp
from leakjax.attacks.dager import runner
from leakjax.errors import LeakjaxError
from leakjax.models import get_path

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_hybrid(**changes) -> runner.DagerExperimentConfig:
  """The hybrid on the small GPT-2 (20 tokens, 8 shortlisted), with
  `changes`."""
  return runner.DagerExperimentConfig(
    model='gpt2-tiny',
    max_tokens=20,
    attacks=('hybrid',),
    hybrid_shortlist=8,
    **changes,
  )


def test_flags_are_the_config_fields(fresh_flags):
  dager_exp.define_flags()
  fields = {f.name for f in dataclasses.fields(runner.DagerExperimentConfig)}
  common_flags = {
    'workdir',
    'data',
    'data_column',
    'data_label',
    'seed',
    'mesh',
    *common.DISTRIBUTED_FLAGS,
  }
  assert set(fresh_flags) - common_flags == fields - {
    'data',
    'data_column',
    'data_label',
    'seed',
  }
  fresh_flags(['prog'])
  cfg = common.config_from_flags(runner.DagerExperimentConfig)
  assert cfg == runner.DagerExperimentConfig()


@pytest.mark.parametrize(
  'name', sorted(p.stem for p in (REPO / 'experiments/configs').glob('dager*'))
)
def test_committed_flagfiles_parse(fresh_flags, name):
  dager_exp.define_flags()
  fresh_flags(['prog', f'--flagfile={REPO}/experiments/configs/{name}.flags'])
  cfg = common.config_from_flags(runner.DagerExperimentConfig)
  assert cfg.model == 'smollm2-135m'
  # The report's batch sizes, each flagfile its own workdir.
  assert cfg.batch_sizes and set(cfg.batch_sizes) <= {1, 4, 16, 32, 64, 128}
  assert cfg.num_batches >= 1


@pytest.mark.parametrize(
  'spec', ['noise', 'noise:-1', 'fedavg:2', 'fedavg:0:4', 'prune:0.9', 'x']
)
def test_bad_defenses_are_refused(spec):
  with pytest.raises(LeakjaxError, match='bad defense'):
    runner.parse_defense(spec)


def test_defenses_parse():
  assert runner.parse_defense('none') == ('none', ())
  assert runner.parse_defense('noise:0.01') == ('noise', (0.01,))
  assert runner.parse_defense('fedavg:2:4') == ('fedavg', (2.0, 4.0))


def test_consecutive_batches_and_too_little_data():
  sents = [f's{i}' for i in range(10)]
  got = runner.consecutive_batches(sents, 3, 2, first=1)
  assert got == [(1, ['s3', 's4', 's5']), (2, ['s6', 's7', 's8'])]
  with pytest.raises(LeakjaxError, match='no batch 3'):
    runner.consecutive_batches(sents, 3, 2, first=2)


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


def test_run_on_small_gpt2_recovers_batches_and_survives_frozen_embeddings(
  tmp_path,
):
  # A small random GPT-2 (learned positions, BOS): the span tests need no
  # training. With frozen (tied) embeddings the client sends no embedding
  # gradient: the span search still recovers every sentence but its last
  # token, which is read off that gradient.
  cfg = runner.DagerExperimentConfig(
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


def test_hybrid_attack_runs_through_the_experiment(tmp_path):
  # Below the rank limit the span term picks each sentence's first word
  # (scored over every candidate); the small GPT-2's LM is random, so where
  # a sentence ends is its call and is not checked here
  # (dager_hybrid_test.py checks the search token by token).
  cfg = tiny_hybrid(
    batch_sizes=(1,),
    num_batches=2,
  )
  summary = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  rows = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert [r['attack'] for r in rows] == ['hybrid', 'hybrid']
  for r in rows:
    assert r['num_recovered'] == len(r['recovered']) == 1
    first = r['recovered'][0].split()[0]
    assert r['originals'][0].split()[0].startswith(first)
  assert 0 < summary['rouge1@attack=hybrid,b=1'] <= 1


def test_hybrid_explaining_away_runs_through_the_experiment(tmp_path):
  # Two searches: the second reads head rows with the first sentence's
  # share subtracted (dager_hybrid_test.py checks the shares).
  cfg = tiny_hybrid(
    batch_sizes=(2,),
    num_batches=1,
    hybrid_head_explain=True,
  )
  summary = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert row['num_recovered'] == len(row['recovered']) == 2
  assert 0 < summary['rouge1@attack=hybrid,b=2'] <= 1


def test_hybrid_oversampling_runs_through_the_experiment(tmp_path):
  # Four searches for a 2-sentence batch and their cuts, two kept by
  # weighted gradient matching, one per search at most (dager_hybrid_test.py
  # checks the selection, the cuts and the pool's gradients).
  cfg = tiny_hybrid(
    batch_sizes=(2,),
    num_batches=1,
    hybrid_oversample=2.0,
    hybrid_cuts=True,
    hybrid_select_weight=1.0,
  )
  summary = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert row['num_searched'] == len(row['searched_ids']) == 4
  assert row['num_recovered'] == len(row['recovered']) == 2
  assert 'select' in row['stage_seconds']
  assert 0 < summary['rouge1@attack=hybrid,b=2'] <= 1
  # The selection study recomputes the run's own choice from its pool.
  from leakjax.attacks.film import runner as film_runner
  from reports.dager import selection

  model, params = film_runner.load_model(runner.film_experiment_config(cfg))
  out = selection.study(model, params, cfg, row)
  assert out['q=1']['cuts_oversample']['matches_run'] is True
  assert out['q=1']['cuts_oversample']['rougeL'] == pytest.approx(row['rougeL'])
  cells = [
    c['rougeL'] for q in ('0', '0.5', '1') for c in out[f'q={q}'].values()
  ]
  assert max(cells) <= out['ceiling_variants_rougeL'] + 1e-9
  assert out['ceiling_searched_rougeL'] <= out['ceiling_variants_rougeL']
  assert out['searched'] == 4 and out['variants'] >= 4
  # Each kept sentence is traced to one search, the variant of it.
  from reports.dager.searched import kept_searches

  owners = kept_searches(model, runner.hybrid_config(cfg), row)
  assert len(set(owners)) == 2 and all(0 <= o < 4 for o in owners)
  for o, text in zip(owners, row['recovered']):
    first = model.tokenizer.decode(
      row['searched_ids'][o][:2], skip_special=True
    )
    assert text.startswith(first.strip())
  # A run that matched whitened rows is recomputed by the whitened study
  # only.
  cfg_w = dataclasses.replace(cfg, hybrid_select_whiten=True)
  dager_exp.run_experiment(cfg_w, tmp_path / 'w', progress=False)
  (row_w,) = [json.loads(x) for x in (tmp_path / 'w/results.jsonl').open()]
  out_w = selection.study(model, params, cfg_w, row_w, whiten=True)
  assert out_w['q=1']['cuts_oversample']['matches_run'] is True
  raw = selection.study(model, params, cfg_w, row_w)
  assert all('matches_run' not in c for c in raw['q=1'].values())
  with pytest.raises(LeakjaxError, match='hybrid_oversample'):
    runner.DagerExperimentConfig(hybrid_oversample=0.5)
  with pytest.raises(LeakjaxError, match='hybrid_select_weight'):
    runner.DagerExperimentConfig(hybrid_select_weight=-1.0)


def test_studies_refuse_a_run_without_its_searches(tmp_path):
  # A hybrid run made before the searched sentences were recorded (or a
  # run of other attacks) has nothing to study: a clear error, before the
  # model is loaded.
  from reports.dager.study import load_run

  rows = [
    {'attack': 'hybrid', 'b': 2, 'batch': 0, 'recovered': ['a']},
    {'attack': 'dager', 'b': 2, 'batch': 0, 'searched_ids': [[1, 2]]},
  ]
  path = tmp_path / 'results.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  with pytest.raises(LeakjaxError, match='searched_ids'):
    load_run(path)


def test_hybrid_pool_beams_run_through_the_experiment(tmp_path):
  # Each search's next beams join the selection's pool; the row records
  # them, and the selection keeps one sentence per search.
  cfg = tiny_hybrid(
    batch_sizes=(2,),
    num_batches=1,
    hybrid_beams=4,
    hybrid_pool_beams=3,
  )
  dager_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  searched, alternatives = row['searched_ids'], row['alternative_ids']
  assert len(searched) == len(alternatives) == 2
  assert any(alternatives) and all(len(a) <= 2 for a in alternatives)
  for seq, others in zip(searched, alternatives):
    assert seq not in others
  assert 'select' in row['stage_seconds']
  assert row['num_recovered'] == 2
  # The beams study repeats the run's searches and beams.
  from leakjax.attacks.film import runner as film_runner
  from reports.dager import beams

  model, params = film_runner.load_model(runner.film_experiment_config(cfg))
  out = beams.study(model, params, cfg, row)
  assert out['matches_run'] is True
  assert out['beams_cuts']['upper'] >= out['cuts']['upper']
  assert out['beams_cuts']['candidates'] >= out['cuts']['candidates']
  for k in ('searched', 'cuts', 'beams_cuts'):
    assert out[k]['assigned'] <= out[k]['upper'] + 1e-12
  # Ceilings by hand: one search cannot serve two originals.
  got = beams.ceilings(
    ['alpha beta gamma', 'delta epsilon zeta'],
    ['alpha beta gamma', 'delta epsilon zeta', 'alpha beta'],
    [0, 0, 1],
    2,
  )
  assert got['upper'] == pytest.approx(1.0)
  assert got['assigned'] == pytest.approx((1.0 + 0.8) / 2)
  with pytest.raises(LeakjaxError, match='hybrid_pool_beams'):
    runner.DagerExperimentConfig(hybrid_beams=4, hybrid_pool_beams=5)


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
    runner.DagerExperimentConfig(hybrid_start_dims=-1)
  with pytest.raises(LeakjaxError, match='hybrid_weight_evidence'):
    runner.DagerExperimentConfig(hybrid_weight_evidence=-1.0)


def test_hybrid_refinement_runs_through_the_experiment(tmp_path):
  # The cuts chosen and one sweep of single-token edits made on whitened
  # rows (dager_hybrid_test.py checks that the edits repair a broken
  # batch): the objective never falls, and the row records it.
  cfg = tiny_hybrid(
    batch_sizes=(2,),
    num_batches=1,
    hybrid_refine=1,
    hybrid_refine_proposals=4,
    hybrid_cuts=True,
    hybrid_select_whiten=True,
  )
  dager_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert row['num_recovered'] == len(row['recovered']) == 2
  objective = row['refined']['objective']
  assert len(objective) == 2 and objective[1] >= objective[0]
  assert {'select', 'refine'} <= set(row['stage_seconds'])
  with pytest.raises(LeakjaxError, match='hybrid_refine_proposals'):
    runner.DagerExperimentConfig(hybrid_refine_proposals=0)
  with pytest.raises(LeakjaxError, match='hybrid_refine_lm'):
    runner.DagerExperimentConfig(hybrid_refine_lm=-1.0)


def test_fedavg_view_of_one_full_batch_step_is_the_fedsgd_gradient():
  # One local epoch of one full-batch step: θ1 = θ0 − η g, so what the
  # attacker reconstructs, −Δ / (η · steps), is the FedSGD gradient g.
  from tests.dager_test import BATCHES, gradient, pad, tiny

  model, params = tiny('gpt2')
  ids, mask = pad(BATCHES['equal'])
  cfg = runner.DagerExperimentConfig(fedavg_lr=1e-3)
  got = runner.client_view(
    model, params, ids, mask, 'fedavg:1:2', cfg, key=jax.random.key(0)
  )
  want = gradient('gpt2', 'equal')
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=2e-2, atol=2e-4)
  frozen = runner.client_view(
    model, params, ids, mask, 'freeze', cfg, key=jax.random.key(0)
  )
  emb = model.paths.word_embeddings
  assert not np.any(np.asarray(get_path(frozen, emb)))


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
  cfg = runner.DagerExperimentConfig(
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
  with pytest.raises(LeakjaxError, match='hybrid_end_head_quantile'):
    runner.DagerExperimentConfig(hybrid_end_head_quantile=1.5)
  with pytest.raises(LeakjaxError, match='hybrid_head_norm_power'):
    runner.DagerExperimentConfig(hybrid_head_norm_power=-0.5)
  with pytest.raises(LeakjaxError, match='hybrid_weight_start'):
    runner.DagerExperimentConfig(hybrid_weight_start=-1.0)


def test_film_attack_runs_through_the_experiment(tmp_path):
  # FILM on the same client gradient as DAGER: it draws with the batch's
  # own key (runner.batch_key), so two runs recover the same sentences.
  cfg = runner.DagerExperimentConfig(
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
  assert runner.batch_key(cfg, 4, 2) == runner.batch_key(cfg, 4, 2)


def test_head_ranks_count_near_ties_against_the_true_token():
  from reports.dager.head_ranks import ranks_of

  scores = np.array(
    [
      [0.5, 0.9, 0.1],  # true 0: one ahead
      [0.3, 0.3 + 1e-7, 0.2],  # true 0: a rounding-level tie counts against
      [0.3, 0.3, 0.2],  # true 1: an exact tie counts against
      [0.8, 0.1, 0.2],  # true 0: first
    ]
  )
  np.testing.assert_array_equal(
    ranks_of(scores, np.array([0, 0, 1, 0])), [1, 1, 1, 0]
  )
