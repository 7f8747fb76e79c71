"""DAGER report: summary keys, the markdown table, the plot against the rank limit.

Turns the rows of :func:`leakjax.attacks.dager.runner.run` into summary.json
(means per setting, keyed by :func:`leakjax.io.summary_key`: `rouge1@b=16`,
`exact@b=16`, `rougeL@b=16,defense=freeze`, `rougeL@attack=film,b=16`),
summary.md and dager_vs_tokens.png (full-batch ROUGE-L and exact match
against the number of input tokens per batch, with the hidden size d: the
span tests need fewer input positions than d).
"""

from __future__ import annotations

import math

import numpy as np

from leakjax import io
from leakjax.attacks.dager import runner

METRICS = ('rouge1', 'rouge2', 'rougeL', 'exact', 'exact_prefix')
# One marker per plotted series, so series that coincide stay apart.
MARKERS = 'osD^vP<X>p'


def _key_params(cfg, b, defense, attack):
  params = {'b': b}
  if defense != 'none':
    params['defense'] = defense
  if attack != 'dager':
    params['attack'] = attack
  return params


def summarize(cfg: runner.DagerConfig, rows: list[dict], extra: dict):
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r['b'], r['defense'], r['attack']), []).append(r)
  summary: dict[str, float] = {}
  table = []
  for (b, defense, attack), rs in sorted(groups.items()):
    params = _key_params(cfg, b, defense, attack)
    means = {m: float(np.mean([r[m] for r in rs])) for m in METRICS}
    for m, v in means.items():
      summary[io.summary_key(m, **params)] = v
    # Timings stay in results.jsonl and the table: equal runs give equal
    # summaries.
    secs = float(np.mean([r['seconds'] for r in rs]))
    tokens = float(np.mean([r['num_tokens'] for r in rs]))
    limited = sum(bool(r.get('rank_limited')) for r in rs)
    table.append(
      [
        b,
        attack,
        defense,
        len(rs),
        f'{tokens:.0f}',
        f'{means["rouge1"]:.3f}',
        f'{means["rouge2"]:.3f}',
        f'{means["rougeL"]:.3f}',
        f'{means["exact"]:.3f}',
        f'{means["exact_prefix"]:.3f}',
        f'{limited}/{len(rs)}' if attack == 'dager' else '–',
        f'{secs:.1f}',
      ]
    )
  d = extra.get('hidden_size')
  state = (
    f'fine-tuned for {extra.get("trained_steps", cfg.train_steps)} steps'
    if cfg.train_steps
    else 'pretrained, t = 0'
  )
  md = (
    '# DAGER: exact batch recovery from attention-gradient spans\n\n'
    f'Model `{cfg.model}` ({state}, hidden size d = {d}),'
    f' {extra.get("num_sentences")} private sentences; consecutive'
    ' batches. Full-batch ROUGE: each original sentence against its best'
    ' recovered sentence, averaged. `exact`: fraction of originals'
    ' recovered token for token (last token included); `w/o last`: without'
    " the last token (DAGER's own output). `rank-limited`: batches whose"
    ' span tests had no clear rank below the limit (more input positions'
    ' than d). Seconds per batch on this machine, gradient excluded.\n\n'
    + io.markdown_table(
      [
        'b',
        'attack',
        'defense',
        'batches',
        'tokens',
        'ROUGE-1',
        'ROUGE-2',
        'ROUGE-L',
        'exact',
        'w/o last',
        'rank-limited',
        's / batch',
      ],
      table,
    )
  )
  return summary, md


def data_name(cfg) -> str:
  """The corpus as a title names it: a named data set or hub id as given,
  a local file by its name, no data (the runner's embedded sentences) as
  the quickstart corpus."""
  data = str(cfg.data or '')
  if not data:
    return 'quickstart corpus'
  if '/' in data and not data.startswith('hub:'):
    data = data.rstrip('/').rsplit('/', 1)[-1]
  return data


def log_ticks(lo: float, hi: float) -> list[float]:
  """The 1-2-5 values (1, 2, 5 times powers of ten) from lo to hi, at least
  two: with fewer inside, the nearest ones outside are added, so a narrow
  range (one batch size) still gets labelled ticks and never matplotlib's
  crowded linear fallback."""
  steps = sorted(
    m * 10.0**e
    for e in range(
      math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 2
    )
    for m in (1, 2, 5)
  )
  inside = [v for v in steps if lo <= v <= hi]
  if len(inside) >= 2:
    return inside
  return (
    [max(v for v in steps if v < lo)]
    + inside
    + [min(v for v in steps if v > hi)]
  )


def plot(cfg, rows: list[dict], extra: dict):
  """ROUGE-L (left) and exact match (right) against the input tokens per
  batch, one line and marker per (attack, defense), each shifted a little
  along x so equal values stay visible (where all series are equal at a b
  the value is written beside them); bars span the batches' range; the
  batch sizes b label the top axis at their mean token counts; the rank
  limit d is drawn where the run knows it; the title names the run's model
  and corpus. DAGER's own results (Petrov et al. 2024) are for other
  models and corpora, so no paper values are drawn."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  # No defense first within each attack; it is named so beside defenses.
  series = sorted(
    {(r['attack'], r['defense']) for r in rows},
    key=lambda s: (s[0], s[1] != 'none', s[1]),
  )
  defended = any(d != 'none' for _, d in series)
  panels = (('rougeL', 'full-batch ROUGE-L'), ('exact', 'exact match'))
  fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), sharex=True, sharey=True)
  tokens = {}  # b -> mean input tokens per batch
  means = {}  # (panel, b) -> every series' mean there
  for i, (attack, defense) in enumerate(series):
    rs = [r for r in rows if (r['attack'], r['defense']) == (attack, defense)]
    bs = sorted({r['b'] for r in rs})
    x = [
      float(np.mean([r['num_tokens'] for r in rs if r['b'] == b])) for b in bs
    ]
    tokens.update(zip(bs, x, strict=True))
    # Series share x: a small shift and a marker each keep equal values
    # apart.
    x = [xi * 1.03 ** (i - (len(series) - 1) / 2) for xi in x]
    name = (
      f'{attack}, {"no defense" if defense == "none" else defense}'
      if defended
      else attack
    )
    for j, (ax, (metric, _)) in enumerate(zip(axes, panels, strict=True)):
      vals = [[r[metric] for r in rs if r['b'] == b] for b in bs]
      y = np.array([np.mean(v) for v in vals])
      for b, m in zip(bs, y, strict=True):
        means.setdefault((j, b), []).append(float(m))
      err = [y - [min(v) for v in vals], [max(v) for v in vals] - y]
      ax.errorbar(
        x,
        y,
        err,
        fmt=MARKERS[i % len(MARKERS)] + ('-' if i < 10 else '--'),
        color=f'C{i % 10}',
        markersize=4,
        capsize=2,
        clip_on=False,
        label=name,
      )
  # Several series equal at a b lie on one another: the value is written
  # beside them.
  for (j, b), ms in means.items():
    if len(ms) > 1 and len(set(ms)) == 1:
      axes[j].annotate(
        f'all {ms[0]:.2f}',
        (tokens[b], ms[0]),
        xytext=(0, 8 if ms[0] < 0.5 else -8),
        textcoords='offset points',
        ha='center',
        va='bottom' if ms[0] < 0.5 else 'top',
        fontsize=7,
      )
  d = extra.get('hidden_size')
  xs = list(tokens.values()) + ([d] if d else [])
  lo, hi = min(xs) / 1.3, max(xs) * 1.3
  ticks = log_ticks(lo, hi)
  for ax, (_, title) in zip(axes, panels, strict=True):
    if d:
      ax.axvline(d, color='grey', ls=':', label=f'rank limit d = {d}')
    ax.set_xscale('log')
    ax.set_xlim(min(lo, ticks[0]), max(hi, ticks[-1]))
    ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel('input tokens per batch')
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    top = ax.secondary_xaxis('top')
    top.set_xticks(list(tokens.values()), [f'{b}' for b in tokens])
    top.xaxis.set_minor_locator(ticker.NullLocator())
    top.tick_params(labelsize=7)
    top.set_xlabel('batch size b', fontsize=8)
  axes[0].set_ylim(-0.05, 1.05)
  axes[0].set_ylabel('mean over batches (bars: range)')
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(
    handles, labels, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  fig.suptitle(
    f'{cfg.model}, consecutive {data_name(cfg)} batches', fontsize=10
  )
  fig.tight_layout()
  return fig


def write(writer: io.ExperimentWriter, cfg, dager_run: runner.DagerRun):
  rows = dager_run.results
  summary, md = summarize(cfg, rows, dager_run.extra)
  fig = plot(cfg, rows, dager_run.extra)
  name = writer.save_figure(fig, 'dager_vs_tokens.png')
  md += f'\n\n![ROUGE-L and exact match against tokens per batch]({name})\n'
  writer.write_summary(summary, md)
  return summary


def rerender_plot(workdir) -> str:
  """Re-draws dager_vs_tokens.png of a finished run from its config.json,
  results.jsonl and the hidden size summary.md states (a committed report
  folder); summary.md itself stays."""
  import json  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  # The plot reads the model and data names only: a config with a setting
  # that left the library (runner.config_from_json refuses it) still draws.
  stored = json.loads((workdir / 'config.json').read_text())
  cfg = types.SimpleNamespace(model=stored['model'], data=stored['data'])
  rows = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  md = workdir / 'summary.md'
  found = re.search(
    r'hidden size d = (\d+)', md.read_text() if md.is_file() else ''
  )
  extra = {'hidden_size': int(found.group(1))} if found else {}
  fig = plot(cfg, rows, extra)
  io.atomic_write_bytes(workdir / 'dager_vs_tokens.png', io.figure_png(fig))
  plt.close(fig)
  return str(workdir / 'dager_vs_tokens.png')


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.dager_report WORKDIR')
  print(rerender_plot(sys.argv[1]))
