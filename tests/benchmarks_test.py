"""Smoke test of the peer benchmarks (`python -m benchmarks.run`).

Runs our two peer benchmarks end to end on a tiny random GPT-2 (2 layers,
64 wide, 512 tokens) through `benchmarks.run.run_all`, the code path of
`python -m benchmarks.run --quick`, and checks the files, the summary keys,
that our beam search returns HF's best sentences, that the gradient norms
agree with torch, and that every ratio is a positive number. The sibling
benchmarks (dr_search, client_update) have their own quick modes, too slow
for this test; their summary extraction is tested on their result shapes.
"""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')

from benchmarks import (  # noqa: E402
  beam_search_vs_hf,
  grad_norms_vs_torch,
  peak,
)
from benchmarks import dager_vs_reference as dvr  # noqa: E402
from benchmarks import run as run_lib  # noqa: E402
from leakjax.attacks.dager import DagerAttackConfig  # noqa: E402


@pytest.fixture
def one_torch_thread():
  before = torch.get_num_threads()
  torch.set_num_threads(1)  # see benchmarks/run.py: shared CPUs
  yield
  torch.set_num_threads(before)


@pytest.mark.slow
def test_quick_suite_on_tiny_gpt2(tmp_path, one_torch_thread):
  del one_torch_thread
  result = run_lib.run_all(
    True,
    tmp_path,
    names=['beam_search', 'grad_norms'],
    settings={
      'beam_search': beam_search_vs_hf.TINY,
      'grad_norms': grad_norms_vs_torch.TINY,
    },
    peak_n=256,
    log=lambda s: None,
  )
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary == pytest.approx(result['summary'])
  for key in (
    'speedup@beam=32,bench=beam_search',
    'speedup@bench=beam_search,beam=32',
    'match@bench=beam_search,beam=32',
    'speedup@bench=grad_norms',
    'match@bench=grad_norms',
  ):
    assert key in summary, key
  assert summary['match@bench=beam_search,beam=32'] == 1
  assert summary['match@bench=grad_norms'] == 1
  speedups = {k: v for k, v in summary.items() if k.startswith('speedup@')}
  assert len(speedups) >= 4
  assert all(math.isfinite(v) and v > 0 for v in speedups.values())
  for name in ('beam_search', 'grad_norms', 'run'):
    assert (tmp_path / f'{name}.json').is_file()
  md = (tmp_path / 'summary.md').read_text()
  assert '| beam_search (beam 32) |' in md and 'GFLOP/s' in md
  rows = json.loads((tmp_path / 'beam_search.json').read_text())['rows']
  assert [(r['b'], r['beam']) for r in rows] == [(16, 32)]
  for r in rows:  # ties would be excused, but the tiny model has none
    assert r['same_best'] == r['searches'] and r['mismatches'] == 0
    np.testing.assert_allclose(
      r['best_score_ours'], r['best_score_hf'], atol=1e-3
    )
    assert r['candidates_per_s_ours'] > 0 and r['flops'] > 0


def test_missing_benchmark_is_skipped_not_faked(tmp_path, monkeypatch):
  monkeypatch.setitem(
    run_lib.BENCHMARKS, 'nothing_here', 'benchmarks.no_such_benchmark'
  )
  result = run_lib.run_all(
    True, tmp_path, names=['nothing_here'], peak_n=128, log=lambda s: None
  )
  assert result['status']['nothing_here']['status'] == 'skipped'
  assert 'does not exist' in result['status']['nothing_here']['reason']
  assert result['summary']['skipped@bench=nothing_here'] == 1
  assert not any(k.startswith('speedup@') for k in result['summary'])
  assert 'skipped' in (tmp_path / 'summary.md').read_text()


def test_headline_reads_sibling_result_shapes():
  dr = {'speedup': 12.5, 'agreement': {'top_match': True, 'overlap': 0.99}}
  assert run_lib.headline('dr_search', dr) == {
    'speedup@bench=dr_search': 12.5,
    'match@bench=dr_search': 1,
    'overlap@bench=dr_search': 0.99,
  }
  cu = {
    'results': [
      {'loop_over_scan': 3.0, 'max_abs_diff_scan_vs_loop': 0.0},
      {'loop_over_scan': 1.5, 'max_abs_diff_scan_vs_loop': 0.0},
    ]
  }
  assert run_lib.headline('client_update', cu) == {
    'speedup@bench=client_update': 3.0,
    'match@bench=client_update': 1,
  }
  assert run_lib.headline('x', {'summary': {'speedup@bench=x': 2.0}}) == {
    'speedup@bench=x': 2.0
  }


def test_flop_counts_match_xla():
  model, params, _ = beam_search_vs_hf.load_pair('gpt2-tiny')  # cached above
  ids = jnp.zeros((1, 32), jnp.int32)
  ours = peak.forward_flops(peak.shape_of(model), 32)
  xla = peak.xla_flops(lambda p, i: model.logits(p, i), params, ids)
  if xla is None:
    pytest.skip('XLA cost analysis unavailable')
  # XLA also counts the masked half of attention, norms and softmax.
  assert 0.8 * xla <= ours <= xla
  # Backward through the last block is cheaper than through all of them.
  shape = peak.shape_of(model)
  assert peak.backward_flops(shape, 32, last_layers=1) < peak.backward_flops(
    shape, 32
  )
  assert peak.decode_step_flops(shape, 10) < peak.forward_flops(shape, 2)


def test_measure_peak_and_interleaved_timing():
  result = peak.measure_peak(128, repeats=2)
  assert result['peak_flops'] >= result['median_flops'] > 0
  calls = []
  times = peak.time_interleaved(
    {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')},
    repeats=3,
    warmup=1,
  )
  assert calls == ['a', 'b'] * 4
  assert len(times['a']) == len(times['b']) == 3


def test_dager_search_passes_count_live_prefixes_by_candidates():
  config = DagerAttackConfig(max_live=6, max_done=10, max_length=41, chunk=8)
  prefixes = [[1, 5, 6, 7], [1, 5, 6, 8, 9], [1, 2]]
  got = dvr.search_passes(prefixes, 10, config)
  # Live prefixes of length 1..5: {1}, {15, 12}, {156}, {1567, 1568},
  # {15689}; each step decodes live x 10 pairs in passes of 8.
  assert got['steps'] == 5 and got['live_prefixes'] == 7
  assert got['pairs'] == 70
  assert got['passes'] == 16 + 24 + 16 + 24 + 16
  rates = dvr.search_rates(got, 1e6, 0.5, 1.0, 1e9)
  assert rates['search_flops'] == 96e6
  assert rates['search_fraction_of_peak'] == pytest.approx(0.192)
  assert rates['total_fraction_of_peak'] == pytest.approx(0.096)
