"""studies.dager: the studies of a hybrid run, on runs of the small GPT-2."""

import dataclasses
import json

import numpy as np
import pytest

from experiments import dager as dager_exp
from leakjax import models
from leakjax.attacks.dager import runner
from leakjax.errors import LeakjaxError
from studies.dager import beams, refine, searched, selection
from studies.dager.head_ranks import ranks_of
from studies.dager.study import load_run
from tests.dager_experiment_test import tiny_hybrid


def test_selection_searched_and_refine_studies_of_an_oversampled_run(
  tmp_path, fresh_flags
):
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
  model, params = models.load_model(cfg.model, seed=cfg.seed)
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
  owners = searched.kept_searches(model, runner.hybrid_config(cfg), row)
  assert len(set(owners)) == 2 and all(0 <= o < 4 for o in owners)
  for o, text in zip(owners, row['recovered']):
    first = model.tokenizer.decode(
      row['searched_ids'][o][:2], skip_special=True
    )
    assert text.startswith(first.strip())
  # The same through the command line: the run's config and model from
  # its folder, searched.json beside its results.
  searched.define_flags()
  fresh_flags(['prog', f'--results={tmp_path / "results.jsonl"}'])
  searched.main([])
  got = json.loads((tmp_path / 'searched.json').read_text())
  (batch,) = got['batches']
  assert batch['kept']['rougeL'] == pytest.approx(row['rougeL'])
  assert batch['kept']['kept_beyond_b'] == sum(o >= 2 for o in owners)
  assert got['mean']['kept']['rougeL'] == pytest.approx(row['rougeL'])
  # Refinement starts from the run's kept sentences and never lowers the
  # objective it climbs.
  edited = refine.study(
    model,
    params,
    cfg,
    row,
    refine.RefineSettings(sweeps=1, proposals=2, whiten=False),
  )
  assert edited['before']['rougeL'] == pytest.approx(row['rougeL'])
  objective = edited['objective']
  assert len(objective) == 2 and objective[1] >= objective[0]
  assert len(edited['recovered']) == 2
  # A run that matched whitened rows is recomputed by the whitened study
  # only.
  cfg_w = dataclasses.replace(cfg, hybrid_select_whiten=True)
  dager_exp.run_experiment(cfg_w, tmp_path / 'w', progress=False)
  (row_w,) = [json.loads(x) for x in (tmp_path / 'w/results.jsonl').open()]
  out_w = selection.study(model, params, cfg_w, row_w, whiten=True)
  assert out_w['q=1']['cuts_oversample']['matches_run'] is True
  raw = selection.study(model, params, cfg_w, row_w)
  assert all('matches_run' not in c for c in raw['q=1'].values())


def test_studies_refuse_a_run_without_its_searches(tmp_path):
  # A hybrid run made before the searched sentences were recorded (or a
  # run of other attacks) has nothing to study: a clear error, before the
  # model is loaded.
  rows = [
    {'attack': 'hybrid', 'b': 2, 'batch': 0, 'recovered': ['a']},
    {'attack': 'dager', 'b': 2, 'batch': 0, 'searched_ids': [[1, 2]]},
  ]
  path = tmp_path / 'results.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  with pytest.raises(LeakjaxError, match='searched_ids'):
    load_run(path)


def test_beams_study_repeats_the_runs_searches_and_beams(tmp_path):
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
  pool, alternatives = row['searched_ids'], row['alternative_ids']
  assert len(pool) == len(alternatives) == 2
  assert any(alternatives) and all(len(a) <= 2 for a in alternatives)
  for seq, others in zip(pool, alternatives):
    assert seq not in others
  assert 'select' in row['stage_seconds']
  assert row['num_recovered'] == 2
  # The beams study repeats the run's searches and beams.
  model, params = models.load_model(cfg.model, seed=cfg.seed)
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


def test_head_ranks_count_near_ties_against_the_true_token():
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
