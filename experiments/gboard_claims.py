"""The GBoard paper's statements beside this run's numbers.

Suliman & Leith state their results in words over Figs. 2-7;
:func:`paper_claims_markdown` quotes each statement's gist with its
section and figure and the matching range of a run's summary.json
(`python -m experiments.gboard_report W` prints it for a finished run).
"""

from __future__ import annotations

import math

from leakjax import io


def _parse_key(key: str) -> tuple[str, dict[str, str]]:
  metric, _, rest = key.partition('@')
  params = dict(p.split('=', 1) for p in rest.split(',') if '=' in p)
  return metric, params


def _select(summary, metric: str, **want) -> list[float]:
  """Values of `metric` whose parameters include `want` (strings), NaN
  dropped; `E='>1'` selects every E above 1."""
  out = []
  for key, value in summary.items():
    name, params = _parse_key(key)
    if name != metric or not isinstance(value, (int, float)):
      continue
    ok = True
    for k, v in want.items():
      if k == 'E' and v == '>1':
        ok &= int(params.get('E', 0)) > 1
      else:
        ok &= params.get(k) == v
    if ok and not math.isnan(value):
      out.append(float(value))
  return out


def _ratios(summary, **want) -> list[float]:
  """Rule F1 / vocabulary upper bound for every setting matching `want`."""
  out = []
  for key, f1 in summary.items():
    name, params = _parse_key(key)
    if name != 'f1' or any(params.get(k) != v for k, v in want.items()):
      continue
    up = summary.get('f1_upper@' + key.partition('@')[2], math.nan)
    if up and not math.isnan(f1) and not math.isnan(up):
      out.append(f1 / up)
  return out


def _span(values, fmt='.2f') -> str:
  if not values:
    return 'not run'
  lo, hi = f'{min(values):{fmt}}', f'{max(values):{fmt}}'
  return lo if lo == hi else f'{lo}-{hi}'


def paper_claims_markdown(summary) -> list[str]:
  """The paper's statements (it gives figures, not tables) beside ours.

  Suliman & Leith state their results in words over Figs. 2-7; each row
  quotes the statement's gist with its section and figure, and gives the
  matching range of this run's summary (NaN and absent settings skipped).
  """
  free = dict(noise='none', sigma='0.0')
  rows = [
    [
      'word F1 stays high for every n_k, E and B; its maximum is the'
      ' vocabulary bound (Sec. 4.3.1, Fig. 2)',
      'rule F1 / upper, noise-free: ' + _span(_ratios(summary, **free)),
    ],
    [
      'reconstructions improve from E = 50 to 100 to 1000 (Sec. 4.3.2, Fig. 3)',
      'mean Levenshtein ratio, noise-free, E = 50 / 100 / 1000: '
      + ' / '.join(
        _span(_select(summary, 'levenshtein', E=str(e), **free), '.0f')
        for e in (50, 100, 1000)
      ),
    ],
    [
      'DPSGD-like noise up to σ = 0.1: F1 close to the noise-free F1 with'
      ' the magnitude threshold (Sec. 6.1, Fig. 6)',
      'rule F1 / upper, DPSGD-like σ = 0.1, E > 1: '
      + _span(
        [
          r
          for e in ('50', '100', '1000')
          for r in _ratios(summary, E=e, noise='dpsgd', sigma='0.1')
        ]
      ),
    ],
    [
      'DPSGD-like σ >= 0.001: Algorithm 2 (every negative bias) loses'
      ' its precision (Sec. 6.1, Fig. 5a)',
      'Algorithm 2 F1, σ = 0.001 / 0.01 / 0.1: '
      + ' / '.join(
        _span(_select(summary, 'zero_f1', noise='dpsgd', sigma=s))
        for s in ('0.001', '0.01', '0.1')
      ),
    ],
    [
      'noise on θ1 (n_k = 256, B = 32): F1 drops drastically from'
      ' σ = 0.01 (Sec. 6.1, Fig. 6)',
      'rule F1 / upper, n_k = 256, B = 32, σ = 0.01, E = 1 / 50 / 100 /'
      ' 1000: '
      + ' / '.join(
        _span(
          _ratios(summary, B='32', E=e, n_k='256', noise='single', sigma='0.01')
        )
        for e in ('1', '50', '100', '1000')
      ),
    ],
    [
      'DPSGD-like σ up to 0.1, E = 100, B = 32: reconstructions close to'
      ' the noise-free ones (Sec. 6.2, Fig. 7)',
      'mean Levenshtein ratio, B = 32, E = 100, noise-free / σ = 0.1: '
      + _span(_select(summary, 'levenshtein', B='32', E='100', **free), '.0f')
      + ' / '
      + _span(
        _select(
          summary, 'levenshtein', B='32', E='100', noise='dpsgd', sigma='0.1'
        ),
        '.0f',
      ),
    ],
  ]
  return [
    "## The paper's statements beside this run",
    '',
    io.markdown_table(
      ['Suliman & Leith', 'this run (range over the settings it names)'], rows
    ),
  ]
