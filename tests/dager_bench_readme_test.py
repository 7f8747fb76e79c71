"""benchmarks/README.md quotes the DAGER peer runs
(`benchmarks/results/dager_vs_reference*.json`): every table line and
aggregate, rendered here from the committed files."""

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / 'benchmarks' / 'results'


def load(name):
  return json.loads((RESULTS / name).read_text())


def batch_lines(run) -> list[str]:
  """One line per batch: both sides' seconds, ratios and outputs."""
  lines = []
  for r in run['rows']:
    o, ref = r['ours'], r['reference']
    lines.append(
      f'| {r["b"]} | {r["batch"]} | {r["num_tokens"]}'
      f' | {o["seconds"]:.1f} / {o["seconds_cold"]:.1f}'
      f' | {o["seconds_without_last_token"]:.1f} | {ref["seconds"]:.1f}'
      f' | {r["speed_ratio"]:.1f}x ({r["speed_ratio_without_last_token"]:.1f}x)'
      f' | {100 * o["search_fraction_of_peak"]:.0f}'
      f' | {round(r["b"] * o["exact"])} / {round(r["b"] * ref["exact"])}'
      f' | {round(r["b"] * o["exact_prefix"])}'
      f' / {round(r["b"] * ref["exact_prefix"])}'
      f' | {o["rougeL"]:.2f} / {ref["rougeL"]:.2f} |'
    )
  return lines


def totals(run, b) -> str:
  """Seconds and ratios summed over a run's batches of size b."""
  rows = [r for r in run['rows'] if r['b'] == b]
  ours = sum(r['ours']['seconds'] for r in rows)
  last = sum(r['ours']['seconds_without_last_token'] for r in rows)
  ref = sum(r['reference']['seconds'] for r in rows)
  ratios = [r['speed_ratio'] for r in rows]
  return (
    f'b = {b}: {ref:.1f} s against {ours:.1f} s over its {len(rows)}'
    f' batches, {ref / ours:.1f}x ({ref / last:.1f}x without our'
    f' last-token step; per batch {min(ratios):.1f}-{max(ratios):.1f}x)'
  )


def _span(values, fmt):
  lo, hi = fmt.format(min(values)), fmt.format(max(values))
  return lo if lo == hi else f'{lo}-{hi}'


def where_the_time_goes(run) -> list[str]:
  """The paragraph's figures: each side's stages, from the default run."""
  big = [r for r in run['rows'] if r['b'] == 16]
  small = [r for r in run['rows'] if r['b'] <= 4]
  stage = lambda r, k: r['ours']['stage_seconds_warm'][k]  # noqa: E731
  decoder = [r['reference']['stage_seconds']['filter_decoder'] for r in big]
  return [
    f'`filter_decoder` takes {_span(decoder, "{:.0f}")} s of its'
    f' {_span([r["reference"]["seconds"] for r in big], "{:.0f}")} s at'
    ' b = 16',
    f'{_span([r["ours"]["search"]["pairs"] for r in big], "{:,}")} pairs at'
    f' b = 16 ({_span([stage(r, "search") for r in big], "{:.1f}")} s), at'
    f' {_span([100 * r["ours"]["search_fraction_of_peak"] for r in big], "{:.0f}")}'
    ' % of the peak',
    'the vocabulary filter'
    f' ({_span([stage(r, "filter") for r in run["rows"]], "{:.1f}")} s,',
    'the last-token completion'
    f' ({_span([stage(r, "last_token") for r in small], "{:.1f}")} s at'
    f' b = 1 and 4, {_span([stage(r, "last_token") for r in big], "{:.1f}")}'
    ' s at b = 16:',
  ]


def readme():
  return ' '.join((ROOT / 'benchmarks/README.md').read_text().split())


def test_default_flags_run_is_quoted():
  run = load('dager_vs_reference_default_l1.json')
  assert run['reference']['extra_args'] == ''
  assert run['threads']['requested'] == 1
  assert sorted({(r['b'], r['batch']) for r in run['rows']}) == [
    (b, k) for b in (1, 4, 16) for k in range(3)
  ]
  text = readme()
  for line in batch_lines(run):
    assert line in text, line
  for b in (4, 16):
    assert totals(run, b) in text, totals(run, b)
  for fragment in where_the_time_goes(run):
    assert fragment in text, fragment
  peaks = [run['peak_gflops'], load('dager_vs_reference.json')['peak_gflops']]
  assert f'fp32 matmul peak {_span(peaks, "{:.0f}")} GFLOP/s' in text


def test_loose_threshold_run_is_quoted():
  run = load('dager_vs_reference.json')
  assert run['reference']['extra_args'] == '--l1_span_thresh=1e-4'
  assert sorted(r['b'] for r in run['rows']) == [1, 4, 16]
  text = readme()
  for line in batch_lines(run):
    assert line in text, line
