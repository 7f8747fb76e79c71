"""studies.dager: the studies of a hybrid run, on runs of the small GPT-2."""

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import hybrid_select
from experiments import dager as dager_exp
from leakjax import models
from leakjax.attacks.dager import hybrid, runner
from leakjax.errors import LeakjaxError
from studies.dager import beams, refine, searched, selection
from studies.dager.head_ranks import ranks_of
from studies.dager.study import load_run
from tests.dager_experiment_test import tiny_hybrid
from tests.dager_hybrid_test import (
  _PERM,
  CONFIG,
  END,
  ROWS,
  D,
  V,
  gradient,
  tiny,
)


@pytest.mark.slow
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
  # The selection benchmark rebuilds the same pool: the bucketed rows and
  # the full-width ones make the same Gram to float rounding, both pick
  # the run's sentences.
  bench = hybrid_select.run(str(tmp_path / 'results.jsonl'), [0])
  (cell,) = bench['rows']
  assert cell['variants'] == out['variants']
  assert cell['gram_max_relative_difference'] < 1e-4
  assert cell['same_picks'] and cell['full_width_picks_equal_run']
  assert cell['rouge']['bucketed']['rougeL'] == pytest.approx(row['rougeL'])
  assert min(cell['seconds'].values()) > 0
  assert 0 < cell['buffer_tokens_ratio'] <= 1
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
  cfg_w = dataclasses.replace(
    cfg, hybrid=dataclasses.replace(cfg.hybrid, select_whiten=True)
  )
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


@pytest.mark.slow
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


# The refinement (left the library: it does not help; the study keeps it).
def test_match_gradient_is_the_objective_and_its_gradient():
  # m(S) = <S, T>² / <S, S> in the w²-weighted inner product, and its
  # gradient against central differences in float64.
  rng = np.random.default_rng(3)
  total = rng.normal(size=(5, 4))
  target = total + 0.5 * rng.normal(size=(5, 4))
  w = rng.uniform(0.5, 2.0, size=5)

  def m(s):
    a, b = s * w[:, None], target * w[:, None]
    return (a * b).sum() ** 2 / (a * a).sum()

  value, grad = refine.match_gradient(
    jnp.asarray(total, jnp.float32),
    jnp.asarray(target, jnp.float32),
    jnp.asarray(w, jnp.float32),
  )
  np.testing.assert_allclose(float(value), m(total), rtol=1e-5)
  eps = 1e-6
  numeric = np.zeros_like(total)
  for i in np.ndindex(total.shape):
    up, down = total.copy(), total.copy()
    up[i] += eps
    down[i] -= eps
    numeric[i] = (m(up) - m(down)) / (2 * eps)
  np.testing.assert_allclose(np.asarray(grad), numeric, rtol=1e-3, atol=1e-5)
  many = np.stack([total, target, -target])
  got = refine.match_values(
    jnp.asarray(many, jnp.float32),
    jnp.asarray(target, jnp.float32),
    jnp.asarray(w, jnp.float32),
  )
  np.testing.assert_allclose(
    np.asarray(got)[:2], [m(total), m(target)], rtol=1e-5
  )
  assert np.asarray(got)[2] == -np.inf  # pointing away: no match


@pytest.mark.slow
def test_edit_gains_match_numpy():
  model, params = tiny('llama')
  seq = ROWS[0]
  width = CONFIG.max_length
  tokens = np.zeros(width, np.int32)
  tokens[: len(seq)] = seq
  cands = np.asarray(
    sorted({v for r in ROWS for v in r[1:]}) + [0, 0], np.int32
  )
  valid = np.arange(len(cands)) < len(cands) - 2
  is_end = (cands == END) & valid
  slot = np.full(V, -1, np.int32)
  slot[cands[valid]] = np.flatnonzero(valid)
  readout = hybrid.head_readout(model, params)
  direction = np.random.default_rng(0).normal(size=(len(cands), D))
  sub, dele = refine.edit_gains(
    model,
    params,
    jnp.asarray(tokens),
    jnp.asarray(len(seq), jnp.int32),
    jnp.asarray(cands),
    jnp.asarray(valid),
    jnp.asarray(is_end),
    jnp.asarray(slot),
    readout,
    jnp.asarray(direction, jnp.float32),
  )
  mask = (np.arange(width) < len(seq)).astype(np.int32)
  z = np.asarray(model.logits(params, tokens[None], mask[None])[0], np.float64)
  s = z @ np.asarray(readout, np.float64) @ direction.T

  def at(i, token):
    return s[i, slot[token]] if slot[token] >= 0 else 0.0

  n = len(seq)
  want = np.full((width, len(cands)), -np.inf)
  for j in range(1, n):
    for c in range(len(cands)):
      end_ok = is_end[c] if j == n - 1 else not is_end[c]
      if valid[c] and end_ok and cands[c] != seq[j]:
        want[j, c] = s[j - 1, c] - at(j - 1, seq[j])
  want_del = np.full(width, -np.inf)
  for j in range(1, n - 1):
    want_del[j] = at(j - 1, seq[j + 1]) - at(j - 1, seq[j]) - at(j, seq[j + 1])
  np.testing.assert_allclose(np.asarray(sub), want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(np.asarray(dele), want_del, rtol=1e-4, atol=1e-4)
  # The edits, best first, as sequences: the top one is the largest gain.
  edits = refine.sentence_edits(
    seq, np.asarray(sub), np.asarray(dele), cands, 3, min_length=3
  )
  j, c = np.unravel_index(np.argmax(want), want.shape)
  if want.max() >= want_del.max():
    assert edits[0] == seq[:j] + [int(cands[c])] + seq[j + 1 :]
  assert len(edits) == 3


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_refine_repairs_a_substituted_and_an_inserted_token(family):
  # From the batch with one token of sentence 0 replaced and a token
  # inserted into sentence 1, the exact gradient match leads back to the
  # batch itself, and the objective rises with every sweep.
  model, params = tiny(family)
  grads = gradient(family)
  cands = np.asarray(
    sorted({v for r in ROWS for v in r[1:]} | set(_PERM[20:23]))
  )
  cands = np.concatenate([cands, np.zeros(-len(cands) % 8, cands.dtype)])
  valid = cands != 0  # token 0 is in no sentence: padding
  ends = np.zeros(V, bool)
  ends[END] = True
  broken = [
    ROWS[0][:3] + [_PERM[21]] + ROWS[0][4:],
    ROWS[1][:2] + [_PERM[20]] + ROWS[1][2:],
  ]
  got, info = refine.refine(
    model,
    params,
    grads,
    broken,
    padded=cands.astype(np.int32),
    valid=valid,
    config=CONFIG,
    sweeps=3,
    proposals=24,
    ends=ends,
  )
  assert got == ROWS
  objective = info['objective']
  assert all(b > a for a, b in zip(objective, objective[1:-1]))
  assert info['edits'][0] >= 1 and info['edits'][-1] == 0
