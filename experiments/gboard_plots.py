"""The figures of the GBoard report (Suliman & Leith, Figs. 2-7).

:func:`make_plots` draws fig2-fig7 of a finished run from its summary and
rows (Figs. 5-7: :mod:`experiments.gboard_dp_plots`;
:mod:`experiments.gboard_report` writes the tables);
:func:`rerender_plots` re-draws them from a run folder's config.json,
summary.json and results.jsonl (`python -m experiments.gboard_plots W`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from experiments import gboard_dp_plots as dp_plots
from experiments import gboard_summary
from leakjax import io


def make_plots(cfg, summary, writer, res, model, datasets):
  """Draws fig2-fig7 through `writer.save_figure`; returns the names
  written. Fig. 4 only for a run with a scale s > 0, Fig. 5 only for one
  with DPSGD-like runs (its panel (b) needs the model, the datasets and
  the run's update files in `<workdir>/deltas`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  names = []
  colors = {
    n: plt.cm.viridis(i / max(len(cfg.num_sentences) - 1, 1))
    for i, n in enumerate(cfg.num_sentences)
  }
  fig = _word_recovery_figure(cfg, summary, res, colors)
  names.append(writer.save_figure(fig, 'fig2_word_recovery.png'))
  plt.close(fig)
  # Fig. 3: Levenshtein vs reconstruction F1 per E.
  fig = _reconstruction_figure(cfg, res, colors)
  names.append(writer.save_figure(fig, 'fig3_sentence_reconstruction.png'))
  plt.close(fig)
  # Fig. 4: FedSGD scaling, when the run scaled (Sec. 4.3.2).
  if any(cfg.scales):
    fig = _scaling_figure(cfg, summary, colors)
    names.append(writer.save_figure(fig, 'fig4_fedsgd_scaling.png'))
    plt.close(fig)
  # Fig. 5: DPSGD-like: Alg. 2 vs rule, and sorted magnitudes.
  dp = [r for r in res if r['noise'] == 'dpsgd']
  if dp:
    fig = dp_plots.dpsgd_figure(
      cfg,
      summary,
      dp,
      colors,
      dp_plots.magnitudes(cfg, model, datasets, writer),
    )
    names.append(writer.save_figure(fig, 'fig5_dpsgd_threshold.png'))
    plt.close(fig)
  # Fig. 6 and 7: both local DP methods against σ, one panel per method
  # and E, one line per (B, n_k).
  names.append(
    writer.save_figure(
      dp_plots.local_dp_figure(
        cfg, summary, res, 'f1', 'word F1 (no oracle)', colors
      ),
      'fig6_local_dp_words.png',
    )
  )
  names.append(
    writer.save_figure(
      dp_plots.local_dp_figure(
        cfg,
        summary,
        [r for r in res if r['E'] > 1],
        'levenshtein',
        'mean Levenshtein ratio',
        colors,
      ),
      'fig7_local_dp_sentences.png',
    )
  )
  plt.close('all')
  return names


def _word_recovery_figure(cfg, summary, res, colors):
  """Fig. 2 (Sec. 4.3.1): noise-free word F1 against E, one column per B.

  Top row: the rule's F1 (solid) and its vocabulary bound (dashed: the F1
  of returning exactly the true in-vocabulary words), on an axis fitted to
  the data. Bottom row: their ratio. With several datasets per setting the
  bars span ±1 standard deviation over them. The paper's text gives no
  values for Fig. 2, only that F1 is high and constant over E, B and n_k;
  the caption quotes that.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  def runs(b, e, n_k):
    # A full-batch run with n_k <= B is the B run too (summarize).
    return [
      r
      for r in res
      if r['noise'] == 'none'
      and not r.get('scale')
      and r['E'] == e
      and r['n_k'] == n_k
      and (
        r['B'] == b or (r['B'] == 'full' and gboard_summary.is_alias(b, n_k))
      )
      and r.get('f1_upper')
    ]

  fig, axes = plt.subplots(
    2,
    len(cfg.batch_sizes),
    figsize=(4.2 * len(cfg.batch_sizes) + 1.6, 5.6),
    squeeze=False,
    sharex=True,
    sharey='row',
  )
  # Every bar end and bound per row, to fit the axes to them.
  lows = {0: [], 1: []}
  for col, b in enumerate(cfg.batch_sizes):
    for i, n_k in enumerate(cfg.num_sentences):
      p = dict(B=b, n_k=n_k, noise='none', sigma=0.0)
      es = [
        e
        for e in cfg.epochs
        if not math.isnan(gboard_summary.get_metric(summary, 'f1', E=e, **p))
      ]
      if not es:
        continue
      # Colours share x: a small shift per n_k keeps the bars apart.
      xs = [e * 1.08 ** (i - (len(cfg.num_sentences) - 1) / 2) for e in es]
      f1 = [gboard_summary.get_metric(summary, 'f1', E=e, **p) for e in es]
      up = [
        gboard_summary.get_metric(summary, 'f1_upper', E=e, **p) for e in es
      ]
      ratio = [f / u for f, u in zip(f1, up, strict=True)]
      spread = [
        (
          np.std([r['f1'] for r in runs(b, e, n_k)], ddof=1),
          np.std([r['f1'] / r['f1_upper'] for r in runs(b, e, n_k)], ddof=1),
        )
        if len(runs(b, e, n_k)) > 1
        else (0.0, 0.0)
        for e in es
      ]
      kw = dict(color=colors[n_k], markersize=4, capsize=2, clip_on=False)
      axes[0][col].errorbar(xs, f1, [s[0] for s in spread], fmt='o-', **kw)
      axes[0][col].plot(xs, up, '--', color=colors[n_k], alpha=0.7)
      axes[1][col].errorbar(xs, ratio, [s[1] for s in spread], fmt='o-', **kw)
      for row, ys in ((0, f1), (1, ratio)):
        for y, sd in zip(ys, spread, strict=True):
          lows[row] += [y - sd[row], y + sd[row]]
      lows[0] += up
    alias = '' if b == 'full' else f' (n_k ≤ {b}: the full-batch run)'
    axes[0][col].set_title(f'B={b}{alias}', fontsize=9)
    axes[1][col].axhline(1.0, color='grey', lw=0.8, ls=':')
    axes[1][col].set_xlabel('local epochs E (1 = FedSGD)')
  for row, label in ((0, 'word F1'), (1, 'F1 / vocabulary bound')):
    low, high = min(lows[row], default=0.0), max(lows[row], default=1.0)
    axes[row][0].set_ylim(
      max(0.0, math.floor(low * 100 - 1) / 100), max(high, 1.0) + 0.005
    )
    axes[row][0].set_ylabel(label)
  for ax in axes.flat:
    ax.set_xscale('log')
    ax.set_xticks(cfg.epochs, [str(e) for e in cfg.epochs])
    ax.minorticks_off()
    ax.grid(alpha=0.3)
  handles = [
    Line2D([], [], color=colors[n], marker='o', label=f'n_k={n}')
    for n in cfg.num_sentences
  ] + [
    Line2D([], [], color='k', marker='o', label='rule F1 (no oracle)'),
    Line2D([], [], color='k', ls='--', label='vocabulary bound'),
  ]
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.55), fontsize=8
  )
  fig.suptitle('Word recovery, no noise (Suliman & Leith Fig. 2)', fontsize=10)
  fig.text(
    0.01,
    -0.02,
    "Paper (Sec. 4.3.1, Fig. 2): no values in its text; F1 'high' and"
    ' constant over E, B and n_k, its maximum the vocabulary bound.\n'
    'Vocabulary bound: F1 of returning exactly the true in-vocabulary'
    ' words.'
    + (
      f' Bars: ±1 sd over {cfg.num_datasets} datasets.'
      if cfg.num_datasets > 1
      else ''
    ),
    fontsize=7,
    va='top',
  )
  fig.tight_layout()
  return fig


def _reconstruction_figure(cfg, res, colors):
  """Mean Levenshtein ratio against the reconstruction F1, one panel per E
  (noise-free runs): colour = n_k, marker = B (o: full batch, s: minibatches).
  The paper's Fig. 3 (Sec. 4.3.2) is drawn without values in its text. The
  F1 axis ends at 1 (perfect, as the paper's top-right corner) and starts
  just below the data, so close points stay apart; the legend sits right
  of the panels."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  es = [e for e in cfg.epochs if e > 1] or list(cfg.epochs)
  fig, axes = plt.subplots(
    1,
    len(es),
    figsize=(3.6 * len(es) + 1.4, 3.6),
    squeeze=False,
    sharex=True,
    sharey=True,
  )
  f1s = []
  for ax, e in zip(axes[0], es):
    for r in res:
      if (
        r['E'] == e
        and r['noise'] == 'none'
        and r.get('scale', 0) == 0
        and 'levenshtein' in r
      ):
        f1s.append(r['recon_f1'])
        ax.scatter(
          r['recon_f1'],
          r['levenshtein'],
          color=colors[r['n_k']],
          marker='o' if r['B'] == 'full' else 's',
          s=30,
          clip_on=False,
        )
    ax.set_xlabel('F1 of reconstructed tokens')
    ax.set_title(f'E={e}')
    ax.grid(alpha=0.3)
  axes[0][0].set_xlim(
    max(0.0, math.floor((min(f1s, default=0.0) - 0.02) * 20) / 20), 1.005
  )
  axes[0][0].set_ylim(0, 102)
  axes[0][0].set_ylabel('mean Levenshtein ratio')
  handles = [
    Line2D([], [], color=colors[n], marker='o', ls='', label=f'n_k={n}')
    for n in cfg.num_sentences
  ] + [
    Line2D(
      [],
      [],
      color='grey',
      marker='o' if b == 'full' else 's',
      ls='',
      label=f'B={b}',
    )
    for b in cfg.batch_sizes
  ]
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  fig.tight_layout()
  return fig


def _scaling_figure(cfg, summary, colors):
  """Fig. 4 (Sec. 4.3.2): noise-free FedSGD Levenshtein against the scale
  s of θ1 + s(θ1 − θ0), one line per n_k; s = 0 (no scaling, Fig. 4a)
  sits left of the smallest scale on the log axis, labelled 0; each line
  is shifted a little along s so equal values stay apart. The paper's text
  gives no values for Fig. 4; the legend sits right of the panel."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  scaled = [s for s in cfg.scales if s]
  zero_at = min(scaled) / 10
  xs = [s if s else zero_at for s in cfg.scales]
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for i, n_k in enumerate(cfg.num_sentences):
    # A small shift per n_k keeps equal values apart.
    shift = 1.1 ** (i - (len(cfg.num_sentences) - 1) / 2)
    ax.plot(
      [x * shift for x in xs],
      gboard_summary.scaling_levenshtein(summary, cfg, n_k),
      'o-',
      color=colors[n_k],
      label=f'n_k={n_k}',
      clip_on=False,
    )
  ax.set_xscale('log')
  ax.set_xticks(xs, [f'{s:g}' for s in cfg.scales])
  ax.minorticks_off()
  ax.set_xlabel('scale s (0: no scaling)')
  ax.set_ylabel('mean Levenshtein ratio')
  ax.set_title('FedSGD reconstruction with scaling', fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(loc='center left', bbox_to_anchor=(1.02, 0.5), fontsize=8)
  fig.tight_layout()
  return fig


def rerender_plots(workdir: str | Path) -> list[str]:
  """Re-draws the figures of a finished run from its config.json,
  summary.json and results.jsonl (a committed report folder); returns the
  names written. summary.md stays (its header needs the run's model and
  corpus facts). Without the model, Fig. 5 has no panel (b) (the sorted
  bias updates of one run); its caption says so."""
  import json  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top

  from leakjax.attacks.gboard import runner  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  cfg = runner.load_config(workdir)
  summary = json.loads((workdir / 'summary.json').read_text())
  res = [
    r
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip() and (r := json.loads(line)).get('kind') == 'attack'
  ]
  written = []

  def save_figure(fig, name):
    io.atomic_write_bytes(workdir / name, io.figure_png(fig))
    written.append(name)
    return name

  folder = types.SimpleNamespace(workdir=workdir, save_figure=save_figure)
  make_plots(cfg, summary, folder, res, None, [])
  return written


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.gboard_plots WORKDIR')
  print('\n'.join(rerender_plots(sys.argv[1])))
