"""`python -m benchmarks.exact_checks` on a tiny random Llama: the three
sides agree, the true token is the nearest, and the FLOP model of one
check against XLA's own count."""

import json
import pathlib

import jax
import jax.numpy as jnp
import pytest

from benchmarks import beam_search_vs_hf, exact_checks
from tests import inversion_exact_test


def _tiny():
  """The exact-inversion tests' tiny Llama (3 blocks, 200 tokens)."""
  return inversion_exact_test.tiny_llama()


@pytest.mark.slow
def test_the_three_sides_agree(tmp_path):
  model, params = _tiny()
  hf = beam_search_vs_hf.to_torch(model, params, tmp_path)
  row = exact_checks.bench(
    model, params, hf, layer=2, chunk=16, prefix=5, reps=1
  )
  assert row['agree'] and row['true_token_nearest']
  for side in exact_checks.SIDES:
    assert row[f'{side}_seconds'] > 0
  assert row['speedup_vs_transformers'] > 0


def test_check_flops_match_xla_cost_analysis():
  # One candidate through `layer` blocks after a cached prefix: our matmul
  # count sits a little below XLA's (which adds the elementwise ops).
  model, params = _tiny()
  cache = model.init_stream_cache(params, 1, 16, layer=3)
  ids = jnp.zeros((64,), jnp.int32)
  fn = jax.jit(model.stream_candidates, static_argnames='layer')
  cost = fn.lower(params, cache, ids, layer=3).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  ratio = 64 * exact_checks.check_flops(model, 3, 16) / cost['flops']
  assert 0.7 < ratio <= 1.05


def test_the_readme_quotes_the_committed_run():
  root = pathlib.Path(__file__).resolve().parents[1]
  got = json.loads((root / 'benchmarks/results/exact_checks.json').read_text())
  rows = got['rows']
  assert got['model'] == 'smollm2-135m' and all(r['agree'] for r in rows)
  speed = [r['speedup_vs_transformers'] for r in rows]
  ours = [100 * r['ours_fraction_of_peak'] for r in rows]
  peer = [100 * r['transformers_fraction_of_peak'] for r in rows]
  text = ' '.join((root / 'benchmarks/README.md').read_text().split())
  assert (
    f'ours {min(speed):.2f}-{max(speed):.2f}x transformers, at'
    f' {min(ours):.0f}-{max(ours):.0f} % of the measured fp32 matmul peak'
    f' ({got["matmul_peak_flops_per_second"] / 1e9:.0f} GFLOP/s) against'
    f" transformers' {min(peer):.0f}-{max(peer):.0f} %"
  ) in text
