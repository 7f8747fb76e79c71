"""`python -m benchmarks.small_dot` on a small matrix, and the paragraph of
benchmarks/README.md that quotes its committed run."""

import json
import pathlib

import pytest

from benchmarks import small_dot

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_side_at_every_row_count():
  got = small_dot.run(rows=(1, 3), repeats=1, k=16, n=256)
  assert {(r['side'], r['rows']) for r in got['rows']} == {
    (side, m) for side in ('jax', 'jax_out_in', 'torch') for m in (1, 3)
  }
  assert got['shape'] == {'K': 16, 'N': 256, 'weight_bytes': 16 * 256 * 4}
  for r in got['rows']:
    assert r['seconds'] > 0
    assert r['weight_gb_per_s'] == 16 * 256 * 4 / r['seconds'] / 1e9
    assert r['fraction_of_peak'] > 0
  assert got['read_gb_per_s'] > 0 and got['matmul_peak_flops_per_second'] > 0


def test_the_readme_quotes_the_committed_run():
  got = json.loads((ROOT / 'benchmarks/results/small_dot.json').read_text())
  r = {(x['side'], x['rows']): x for x in got['rows']}

  def ms(side, m):
    return f'{1000 * r[side, m]["seconds"]:.1f} ms'

  def pct(side, m):
    return f'{100 * r[side, m]["fraction_of_peak"]:.0f} %'

  text = ' '.join((ROOT / 'benchmarks/README.md').read_text().split())
  one, eight = r['jax', 1], r['jax', 8]
  quoted = [
    f'{one["weight_gb_per_s"]:.1f} GB/s for one row ({ms("jax", 1)})',
    f'takes {ms("jax", 8)} for 8 rows ({eight["weight_gb_per_s"]:.1f} GB/s,'
    f' {pct("jax", 8)} of the fp32 peak)',
    f'{ms("jax", 16)} for 16 and {ms("jax", 32)} for 32, then'
    f' {ms("jax", 64)} for 64 rows ({pct("jax", 64)} of the peak)',
    f'torch is no better ({ms("torch", 8)} for 8 rows, {ms("torch", 16)}'
    ' for 16)',
    f'stored `[out, in]` takes {ms("jax_out_in", 8)} for 8 rows and'
    f' {ms("jax_out_in", 16)} for 16'
    f' ({eight["seconds"] / r["jax_out_in", 8]["seconds"]:.1f}x and'
    f' {r["jax", 16]["seconds"] / r["jax_out_in", 16]["seconds"]:.1f}x)',
    f'{eight["seconds"] / one["seconds"]:.1f}x the time of one row',
  ]
  for phrase in quoted:
    assert phrase in text, phrase
  assert got['shape']['weight_bytes'] == 576 * 98_304 * 4
