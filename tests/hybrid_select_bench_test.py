"""benchmarks/README.md quotes `benchmarks/results/hybrid_select.json` (the
benchmark's code path runs in `studies_dager_test.py`, on a tiny run)."""

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _span(values, fmt):
  lo, hi = fmt.format(min(values)), fmt.format(max(values))
  return lo if lo == hi else f'{lo}-{hi}'


def quoted(got: dict) -> str:
  """The README's sentence, from the committed run."""
  rows = got['rows']
  seconds = [r['seconds'] for r in rows]
  same = sum(r['same_picks'] for r in rows)
  text = (
    f'{_span([r["variants"] for r in rows], "{:,}")} pool rows'
    f' ({_span([r["mean_length"] for r in rows], "{:.1f}")} of'
    f' {rows[0]["width"]} tokens on average): the selection in'
    f' {_span([s["bucketed"] for s in seconds], "{:.1f}")} s a pool against'
    f' {_span([s["full_width"] for s in seconds], "{:.1f}")} s as it ran'
    f' before ({_span([r["speedup"] for r in rows], "{:.2f}")}x), of which'
    f' the old Gram took'
    f' {_span([s["full_width_gram"] for s in seconds], "{:.1f}")} s; the'
    f' Grams agree to'
    f' {max(r["gram_max_relative_difference"] for r in rows):.1e} (largest'
    f' relative difference); the picks are the same in {same} of'
    f' {len(rows)} pools'
  )
  differ = [r for r in rows if not r['same_picks']]
  if differ:
    text += (
      f', and where not ({", ".join(str(r["picks_differing"] // 2) for r in differ)}'
      f' of {rows[0]["b"]} sentences) ROUGE-L is'
      f' {", ".join(format(r["rouge"]["bucketed"]["rougeL"], ".4f") for r in differ)}'
      f' against'
      f' {", ".join(format(r["rouge"]["full_width"]["rougeL"], ".4f") for r in differ)}'
    )
  return text


def test_the_readme_quotes_the_committed_run():
  got = json.loads((ROOT / 'benchmarks/results/hybrid_select.json').read_text())
  assert got['model'] == 'smollm2-135m'
  assert all(r['full_width_picks_equal_run'] for r in got['rows'])
  assert all(r['gram_max_relative_difference'] < 1e-3 for r in got['rows'])
  text = ' '.join((ROOT / 'benchmarks/README.md').read_text().split())
  assert quoted(got) in text, quoted(got)
