"""FILM's plot: ROUGE and NERR against the batch size, one panel per
defense, the paper's Enron means beside ours (film_vs_batch_size.png).

`python -m experiments.film_report WORKDIR` redraws it for a finished run
(:func:`rerender_plot`).
"""

from __future__ import annotations

import math

from experiments.film_tables import mean_std, paper_points
from leakjax import io


def data_name(cfg) -> str:
  """The corpus as a title names it: a named data set or hub id as given,
  a local file by its name, no data (the runner's embedded sentences) as
  the quickstart corpus."""
  data = str(getattr(cfg, 'data', None) or '')
  if not data:
    return 'quickstart corpus'
  if '/' in data and not data.startswith('hub:'):
    data = data.rstrip('/').rsplit('/', 1)[-1]
  return data


# (field, label, marker): one marker per metric, so metrics that coincide
# stay apart.
_PLOT_METRICS = (
  ('rouge1', 'ROUGE-1', 'o'),
  ('rouge2', 'ROUGE-2', 's'),
  ('rougeL', 'ROUGE-L', '^'),
  ('nerr', 'NERR', 'D'),
)


def plot(rows, cfg=None):
  """ROUGE/NERR against b, mean ± std over batches; one panel per defense.

  Each metric has its colour and marker, its points shifted a little along
  b so equal values stay side by side; where all metrics are equal at a b
  the value is written beside them. The undefended panel draws the
  paper's Enron means (FILM Table 10, b = 4 from Table 9; GPT-2) with
  hollow markers and dotted lines, over the run's batch sizes only. The
  title names the run's model and corpus.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  # No defense first, then the defenses in the order the rows give them.
  defenses = sorted(
    dict.fromkeys(r.get('defense', 'none') for r in rows),
    key=lambda d: d != 'none',
  )
  fig, axes = plt.subplots(
    1,
    len(defenses),
    figsize=(4.2 * len(defenses) + 1.8, 3.6),
    sharex=True,
    sharey=True,
    squeeze=False,
  )
  ends = [0.0, 1.0]  # every bar end, to fit the y axis to them
  ticks = set()
  drew_paper = False
  for ax, defense in zip(axes[0], defenses):
    rs = [r for r in rows if r.get('defense', 'none') == defense]
    bs_ = sorted({r['b'] for r in rs})
    ticks.update(bs_)
    paper = paper_points(bs_) if defense == 'none' else {}
    ticks.update(paper)
    drew_paper |= bool(paper)
    means = {}
    for i, (f, _, marker) in enumerate(_PLOT_METRICS):
      stats = [mean_std([r for r in rs if r['b'] == b], f) for b in bs_]
      shift = 2 ** (0.08 * (i - (len(_PLOT_METRICS) - 1) / 2))
      ax.errorbar(
        [b * shift for b in bs_],
        [m for m, _ in stats],
        yerr=[sd for _, sd in stats],
        fmt=marker + '-',
        color=f'C{i}',
        markersize=4.5,
        capsize=2,
        clip_on=False,
      )
      for b, (m, sd) in zip(bs_, stats, strict=True):
        means.setdefault(b, []).append(m)
        if not math.isnan(m):
          ends.extend((m - sd, m + sd))
      if paper:
        ax.plot(
          [b * shift for b in paper],
          [v[i] for v in paper.values()],
          marker + ':',
          color=f'C{i}',
          markerfacecolor='white',
          markersize=4.5,
          clip_on=False,
        )
    for b, ms in means.items():
      if len(set(ms)) == 1 and not math.isnan(ms[0]):
        ax.annotate(
          f'all {ms[0]:.2f}',
          (b, ms[0]),
          xytext=(0, -11),
          textcoords='offset points',
          ha='center',
          va='top',
          fontsize=7,
        )
    ax.set_xscale('log', base=2)
    ax.set_xlabel('batch size b')
    ax.grid(alpha=0.3)
    if len(defenses) > 1:
      ax.set_title(f'defense: {defense}', fontsize=9)
  ticks = sorted(ticks)
  for ax in axes[0]:
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.minorticks_off()
    ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
  axes[0][0].set_ylim(min(ends) - 0.05, max(ends) + 0.05)
  axes[0][0].set_ylabel('score (mean ± std over batches)')
  handles = [
    Line2D([], [], color=f'C{i}', marker=marker, label=label)
    for i, (_, label, marker) in enumerate(_PLOT_METRICS)
  ]
  handles.append(
    Line2D([], [], color='k', marker='o', label='this run (filled, solid)')
  )
  if drew_paper:
    handles.append(
      Line2D(
        [],
        [],
        color='k',
        ls=':',
        marker='o',
        markerfacecolor='white',
        label='paper: Enron, GPT-2\n(FILM Table 10;\nb = 4: Table 9)',
      )
    )
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  if cfg is not None:
    fig.suptitle(
      f'FILM on {getattr(cfg, "model", "?")}, {data_name(cfg)}', fontsize=10
    )
  fig.tight_layout()
  return fig, 'film_vs_batch_size.png'


def rerender_plot(workdir) -> str:
  """Re-draws film_vs_batch_size.png of a finished attack run from its
  config.json and results.jsonl (a committed report folder); summary.md
  and summary.json stay."""
  import json  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  stored = json.loads((workdir / 'config.json').read_text())
  if stored.get('mode', 'attack') != 'attack':
    raise ValueError(f'{workdir}: a {stored["mode"]} run draws no plot')
  # The plot reads the model and data names only.
  cfg = types.SimpleNamespace(model=stored['model'], data=stored.get('data'))
  rows = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  fig, name = plot(rows, cfg)
  io.atomic_write_bytes(workdir / name, io.figure_png(fig))
  plt.close(fig)
  return str(workdir / name)
