"""benchmarks/hybrid_search.py: the committed before/after runs and the
benchmarks/README.md section that quotes them."""

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _text() -> str:
  return ' '.join((ROOT / 'benchmarks/README.md').read_text('utf-8').split())


def _row(r) -> str:
  s = r['step_seconds']
  return (
    f'| {r["label"]} | {r["seconds"]["timed_search"]:.1f} s |'
    f' {r["search_seconds_per_search"]:.2f} s | {s["step"]:.3f} s |'
    f' {s["decode_8_rows"]:.3f} / {s["decode_16_rows"]:.3f} s |'
    f' {s["block_decode_256_rows"]:.3f} s | {s["head_readout"]:.3f} s |'
    f' {r["step_fraction_of_peak"] * 100:.0f} % |'
  )


def test_committed_runs_and_their_readme_section():
  doc = json.loads((ROOT / 'benchmarks/results/hybrid_search.json').read_text())
  runs = {r['label']: r for r in doc['runs']}
  before, after = runs['before'], runs['after']
  assert before['contexts'] == after['contexts'] == 2
  assert before['searches'] == after['searches'] == 12
  # The after run searched what the before run did.
  assert after['reference'] == 'before' and after['same_sequences']
  assert after['sequences'] == before['sequences']
  assert after['max_score_difference'] < 1e-4
  assert after['search_speedup'] == (
    before['seconds']['timed_search'] / after['seconds']['timed_search']
  )
  text = _text()
  for r in (before, after):
    assert _row(r) in text
  s = after['step_seconds']
  assert (
    f'the search for {after["sentences"]} sentences ({after["searches"]}'
    f' searches)' in text
  )
  assert (
    f'scores within {after["max_score_difference"]:.1e} (float rounding' in text
  )
  assert f'the search {after["search_speedup"]:.2f}x faster' in text
  assert (
    f'8 rows read every weight ({after["decode_weight_bytes"] / 1e6:.0f} MB),'
    f' and 16 rows cost {s["decode_16_rows"] / s["decode_8_rows"]:.2f}x as'
    f' much as 8, so the step sits at'
    f' {after["step_fraction_of_peak"] * 100:.0f} % of the fp32 matmul peak'
    f' ({after["matmul_peak_flops_per_second"] / 1e9:.1f} GFLOP/s)' in text
  )
