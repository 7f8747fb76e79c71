"""studies/film_bag/defenses/dp_curve.py and its README section.

The curve repeats `dp_bound.json` and `dp_pooled.json` at the committed σ,
its crossing points agree with its grid, its threshold band bounds the
rule, the study's main regenerates `dp_curve.json`, and the section "DP as
a curve" of reports/film_bag/defenses/README.md writes its numbers.
"""

import json
import math
import pathlib

import numpy as np
import pytest

from leakjax import fl
from studies.film_bag.defenses import dp_bound, dp_curve

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = ROOT / 'reports/film_bag/defenses'


def load(name: str):
  return json.loads((HERE / name).read_text())


def section() -> str:
  """The README's "DP as a curve" section, its line breaks as spaces."""
  text = (HERE / 'README.md').read_text('utf-8')
  start = text.index('## DP as a curve')
  end = text.index('\n## ', start + 1)
  return ' '.join(text[start:end].split())


def eps_text(value: float) -> str:
  return f'{value:,.0f}' if value >= 10 else f'{value:.1f}'


@pytest.mark.slow
def test_curve_repeats_the_committed_bounds():
  bound, pooled = load('dp_bound.json'), load('dp_pooled.json')
  by_eps = {r['epsilon']: r for r in pooled['epsilons']}
  summary = load('summary.json')
  for committed in bound['epsilons']:
    eps = committed['epsilon']
    row = dp_curve.point(committed['sigma'], bound, pooled)
    for name in ('matched', 'energy'):
      assert row[name]['best_f1'] == committed[f'{name}_best_f1']
      if eps not in dp_bound.PAPER:
        continue
      assert (
        row[name][f'recall_at_precision_of_{eps:g}']
        == committed[f'{name}_recall_at_paper_precision']
      )
      assert (
        row[name][f'precision_at_recall_of_{eps:g}']
        == committed[f'{name}_precision_at_paper_recall']
      )
    if eps in dp_bound.PAPER:
      assert (
        row['pooled'][f'recall_at_precision_of_{eps:g}']
        == by_eps[eps]['all_recall_at_paper_precision']
      )
      assert (
        row['pooled'][f'precision_at_recall_of_{eps:g}']
        == by_eps[eps]['all_precision_at_paper_recall']
      )
    # The measured threshold rule sits at the band (its noise floor).
    for what in ('precision', 'recall'):
      got = summary[f'bag_{what}@b=16,defense=dp:{eps:g},method=dp']
      lo = row['threshold'][f'spread_{what}']
      hi = row['threshold'][f'peaked_{what}']
      assert lo - 0.01 < got < hi + 0.01, (eps, what, got, lo, hi)


def test_crossings_agree_with_the_grid_and_the_committed_bounds():
  curve = load('dp_curve.json')
  bound, pooled = load('dp_bound.json'), load('dp_pooled.json')
  sigmas = load('dp_sigma.json')
  for row, b_row, p_row in zip(
    curve['crossings'], bound['paper_rows'], pooled['paper_rows']
  ):
    eps = row['epsilon']
    assert eps == b_row['epsilon'] == p_row['epsilon']
    assert row['matched_largest_sigma'] == b_row['matched_largest_sigma']
    assert row['energy_largest_sigma'] == b_row['energy_largest_sigma']
    assert row['pooled_largest_sigma'] == p_row['largest_sigma']
    assert row['matched_epsilon_run'] == b_row['matched_epsilon_needed']
    assert row['pooled_epsilon_run'] == p_row['epsilon_needed']
    for name in dp_curve.ORACLES:
      crossing = row[f'{name}_largest_sigma']
      for c in curve['curve']:
        reached = (
          c[name][f'recall_at_precision_of_{eps:g}'] >= row['paper_recall']
        )
        assert reached == (c['sigma'] <= crossing), (name, eps, c['sigma'])
  # The ε columns: the run's own σ, and σ that meet ε under FILM's setup.
  run = {s['epsilon']: s['sigma'] for s in sigmas}
  setup = curve['assumptions']['paper_setup']
  assert setup['sampling_rate'] == 16 / 203_456 and setup['steps'] == 90_000
  assert (
    curve['assumptions']['run']['sampling_rate'] == sigmas[0]['sampling_rate']
  )
  for m in curve['paper_marks']:
    assert m['sigma_run'] == run[m['epsilon']]
    assert (m['paper_precision'], m['paper_recall']) == dp_bound.PAPER[
      m['epsilon']
    ]
  m = curve['paper_marks'][0]
  got = fl.epsilon(
    m['sigma_paper_setup'],
    setup['sampling_rate'],
    setup['steps'],
    setup['delta'],
  )
  assert got <= m['epsilon'] and got > 0.99 * m['epsilon']


def test_threshold_band_bounds_the_rule():
  # log P(|y + n| <= τ) is concave in y², so a row of a given norm passes
  # the max-entry rule most with its signal on one coordinate and least
  # with it spread evenly.
  dim = 576
  tau = math.sqrt(2 * math.log(dim))
  x = np.linspace(0.0, (8 * tau) ** 2, 20001)
  h = np.log(dp_curve.inside(np.sqrt(x), tau))
  assert np.diff(h, 2).max() < 1e-12
  # Rows of random directions pass between the two, by a direct count.
  rng = np.random.default_rng(0)
  snr = np.asarray([2.0, 4.0, 6.0])
  vocab = 1000
  band = dp_curve.threshold_rule(snr, dim, vocab)
  draws = 4000
  direction = rng.normal(size=(len(snr), dim))
  direction /= np.linalg.norm(direction, axis=1, keepdims=True)
  rows = snr[:, None] * direction + rng.normal(size=(draws, len(snr), dim))
  recall = (np.abs(rows).max(-1) > tau).mean()
  assert band['spread_recall'] - 0.02 < recall < band['peaked_recall'] + 0.02
  null = (np.abs(rng.normal(size=(draws, dim))).max(-1) > tau).mean()
  limits = dp_curve.threshold_limits(load('dp_bound.json'))
  assert abs(null - limits['null_pass_rate']) < 0.02
  for c in load('dp_curve.json')['curve']:
    assert c['threshold']['peaked_precision'] <= limits['precision_limit']


@pytest.mark.slow
def test_main_regenerates_the_curve(fresh_flags, tmp_path):
  dp_curve.define_flags()
  fresh_flags(['prog', '--num_sigmas=3', f'--out={tmp_path}'])
  dp_curve.main([])
  got = json.loads((tmp_path / 'dp_curve.json').read_text())
  committed = load('dp_curve.json')
  assert {k: v for k, v in got.items() if k != 'curve'} == {
    k: v for k, v in committed.items() if k != 'curve'
  }
  by_sigma = {round(c['sigma'], 12): c for c in committed['curve']}
  assert len(got['curve']) == 3
  for row in got['curve']:
    assert row == by_sigma[round(row['sigma'], 12)]
  png = (tmp_path / 'dp_curve.png').read_bytes()
  assert png.startswith(b'\x89PNG\r\n\x1a\n') and len(png) > 10_000
  assert (HERE / 'dp_curve.png').stat().st_size > 10_000


def test_readme_section():
  text = section()
  curve = load('dp_curve.json')
  assert '```bash python -m studies.film_bag.defenses.dp_curve ```' in text
  assert '](dp_curve.png)' in text
  setup = curve['assumptions']['paper_setup']
  run = curve['assumptions']['run']
  sigmas = load('dp_sigma.json')
  cfg = load('config.json')
  assert run['sampling_rate'] == cfg['batch_sizes'][0] / cfg['max_sentences']
  q = f'q = {cfg["batch_sizes"][0]}/{cfg["max_sentences"]:,}, one step'
  assert run['steps'] == 1 and q in text
  assert run['delta'] == setup['delta'] == sigmas[0]['delta']
  assert f'both with δ = {run["delta"]:.0e}'.replace('e-0', 'e-') in text
  assert (
    f'b = {setup["batch"]} over its {setup["sentences"]:,} WikiText-103'
    f' sentences, {setup["steps"]:,} steps' in text
  )
  limits = curve['threshold_limits']
  assert f'below precision {limits["precision_limit"]:.3f} at every σ' in text
  assert f'{100 * limits["null_pass_rate"]:.1f} % of the rows outside' in text
  assert f'spread over its {curve["dim"]})' in text
  marks = {m['epsilon']: m for m in curve['paper_marks']}
  crossings = {c['epsilon']: c for c in curve['crossings']}
  for eps, m in marks.items():
    c = crossings[eps]
    line = (
      f'| ε = {eps:g} | {m["paper_precision"]:.2f} / {m["paper_recall"]:.2f}'
      f' | {m["sigma_run"]:.3f} / {m["sigma_paper_setup"]:.3f} |'
      f' {c["matched_largest_sigma"]:.3f} / {c["energy_largest_sigma"]:.3f}'
      f' / {c["pooled_largest_sigma"]:.3f} |'
      f' {eps_text(c["pooled_epsilon_run"])} /'
      f' {eps_text(c["pooled_epsilon_paper_setup"])} |'
    )
    assert line in text, line
  # The prose's claims: FILM's setup prices ε = 15 and 10 at more noise;
  # no oracle reaches those rows, the pooled one reaches ε = 5, under both.
  assert 'prices ε = 15 and 10 at more noise than this run' in text
  for eps in (15.0, 10.0):
    assert marks[eps]['sigma_paper_setup'] > marks[eps]['sigma_run']
  for eps, m in marks.items():
    best = max(crossings[eps][f'{n}_largest_sigma'] for n in dp_curve.ORACLES)
    noise = min(m['sigma_run'], m['sigma_paper_setup'])
    assert (best >= noise) == (eps == 5.0), eps
  assert crossings[5.0]['pooled_largest_sigma'] > max(
    marks[5.0]['sigma_run'], marks[5.0]['sigma_paper_setup']
  )


def test_utility_points_and_readme():
  """What σ costs: each point is a committed utility row over its own run's
  undefended perplexity, and the README writes them."""
  curve = load('dp_curve.json')
  u = curve['utility']
  assert u == dp_curve.utility()
  util = ROOT / 'reports/film_utility'
  rows = {}
  for run in u['runs']:
    lines = (util.parent / run['folder'] / 'results.jsonl').read_text()
    by = {r['defense']: r for r in map(json.loads, lines.splitlines())}
    assert run['none'] == by['none']['perplexity']
    rows.update({(run['folder'], d): r for d, r in by.items()})
  # The dp_sigma run repeats the undefended row of the ε run.
  assert len({run['none'] for run in u['runs']}) == 1
  for p in u['points']:
    r = rows[(p['folder'], p['defense'])]
    assert p['sigma'] == r['noise_multiplier']
    assert (
      p['ratio'] == r['perplexity'] / rows[(p['folder'], 'none')]['perplexity']
    )
  sigmas = [p['sigma'] for p in u['points']]
  assert sigmas == sorted(sigmas) and sigmas[0] == 0.0
  ratio = {p['sigma']: p['ratio'] for p in u['points']}
  # The noise costs, monotonically; clipping alone almost nothing.
  assert list(ratio.values()) == sorted(ratio.values())
  assert ratio[0.0] < 1.02
  text = section()
  cells = ' | '.join(f'{s:.3f}' for s in sigmas[1:])
  assert f'| σ | 0 (clipping alone) | {cells} |' in text
  values = ' | '.join(f'{ratio[s]:.3f}' for s in sigmas)
  assert f'| perplexity / undefended | {values} |' in text
  assert f'Clipping alone costs {100 * (ratio[0.0] - 1):.1f} %' in text
  noisy = min(v for s, v in ratio.items() if s > 0)
  assert f'Every σ measured above 0 costs at least {noisy:.2f}x' in text
  crossing = curve['crossings'][0]
  assert crossing['epsilon'] == 15
  c15 = crossing['pooled_largest_sigma']
  above = min(v for s, v in ratio.items() if s > c15)
  assert (
    f"still reaches the paper's ε = 15 row ({c15:.3f}) costs at least"
    f' {above:.2f}x' in text
  )
  assert (
    f'fine-tuned on {u["data"]} for {u["steps"]} steps of b = {u["b"]}' in text
  )
