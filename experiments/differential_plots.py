"""The differential score / rank report's plot (ds_dr.png): the canaries'
score and differential-rank bound against the number of insertions k, one
column per method (Zanella-Beguelin et al., CCS 2020, Table 1's shading).
`python -m experiments.differential_report W` re-draws it for a finished
run (:func:`rerender_plot`).
"""

from __future__ import annotations

from leakjax import io
from leakjax.attacks import differential as dlib

# DR > 1000 is a gray cell of Table 1.
DR_GRAY = 1000


def plot_ds_dr(writer, results, cfg, canaries) -> str | None:
  """ds_dr.png: the canaries' score (top row) and DR bound (bottom row)
  against k, one column per method, no background knowledge."""
  try:
    fig = ds_dr_figure(results, cfg, [c.kind for c in canaries])
  except ImportError:
    return None
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  name = writer.save_figure(fig, 'ds_dr.png')
  plt.close(fig)
  return name


def ds_dr_figure(results, cfg, kinds):
  """The figure of :func:`plot_ds_dr`: colour and marker = canary (its
  points shifted a little along k so equal values stay visible), legend
  right of the panels; DR above 1000 is shaded as Table 1's gray cells.
  Table 1's values are for other corpora and insertion counts (Sec. 4.4),
  so none are drawn."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  ks = sorted(cfg.insertions)
  methods = list(cfg.methods)
  fig, axes = plt.subplots(
    2,
    len(methods),
    figsize=(3.4 * len(methods) + 1.8, 5.6),
    squeeze=False,
    sharex=True,
    sharey='row',
  )
  styles = list(zip(('C0', 'C1', 'C2', 'C3', 'C4'), 'osD^v', strict=True))
  for col, method in enumerate(methods):
    for i, kind in enumerate(kinds):
      pts = sorted(
        (r['k'], r[cfg.score], r['dr'])
        for r in results
        if r['method'] == method and r['canary'] == kind and not r['prefix']
      )
      if not pts:
        continue
      color, marker = styles[i % len(styles)]
      x = [p[0] * 1.06 ** (i - (len(kinds) - 1) / 2) for p in pts]
      kw = dict(color=color, marker=marker, markersize=5, clip_on=False)
      axes[0][col].plot(x, [p[1] for p in pts], '-', **kw)
      axes[1][col].plot(x, [p[2] for p in pts], '-', **kw)
    axes[0][col].set_title(method, fontsize=10)
    axes[1][col].axhspan(DR_GRAY, 1e5, color='0.85', zorder=0)
    axes[1][col].set_xlabel('insertions k')
  axes[0][0].set_yscale('symlog', linthresh=1e-3)
  axes[0][0].set_ylabel(f'{cfg.score} of the canary (Def. 3.1)')
  axes[1][0].set_yscale('symlog', linthresh=1)
  axes[1][0].set_ylim(-0.3, 5000)
  axes[1][0].set_ylabel('DR lower bound (Prop. 3.3)')
  for ax in axes.flat:
    ax.set_xscale('log')
    ax.minorticks_off()
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlim(min(ks) / 1.4, max(ks) * 1.4)
    ax.grid(alpha=0.3)
  handles = [
    Line2D([], [], color=c, marker=m, label=kind)
    for kind, (c, m) in zip(kinds, styles, strict=False)
  ]
  handles.append(
    matplotlib.patches.Patch(
      color='0.85', label=f'DR > {DR_GRAY} (gray in Table 1)'
    )
  )
  fig.legend(
    handles=handles,
    title='canary',
    loc='center left',
    bbox_to_anchor=(1.0, 0.5),
    fontsize=8,
  )
  fig.suptitle(
    f"Canaries between M and M' on {cfg.data}, no background knowledge",
    fontsize=10,
  )
  fig.tight_layout()
  return fig


def rerender_plot(workdir) -> str:
  """Re-draws ds_dr.png of a finished run from its config.json and
  results.jsonl (a committed report folder); summary.md stays (it needs
  the run's canary profile and model size)."""
  import json  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  stored = json.loads((workdir / 'config.json').read_text())
  cfg = dlib.DifferentialConfig(
    **{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
  )
  results = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  order = list(cfg.canary_types)
  kinds = sorted(
    {r['canary'] for r in results},
    key=lambda k: order.index(k) if k in order else len(order),
  )
  fig = ds_dr_figure(results, cfg, kinds)
  io.atomic_write_bytes(workdir / 'ds_dr.png', io.figure_png(fig))
  plt.close(fig)
  return str(workdir / 'ds_dr.png')
