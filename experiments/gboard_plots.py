"""The figures of the GBoard report (Suliman & Leith, Figs. 2-7).

:func:`make_plots` draws fig2-fig7 of a finished run from its summary and
rows (:mod:`experiments.gboard_report` writes the tables);
:func:`rerender_plots` re-draws them from a run folder's config.json,
summary.json and results.jsonl (`python -m experiments.gboard_plots W`).
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from experiments import gboard_report as report
from leakjax import io
from leakjax.attacks import gboard
from leakjax.attacks.gboard import thresholds


def make_plots(cfg, summary, writer, res, model, datasets):
  """Draws fig2-fig7 through `writer.save_figure`; returns the names
  written. Fig. 4 only for a run with a scale s > 0, Fig. 5 only for one
  with DPSGD-like runs (its panel (b) needs the model and datasets)."""
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
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for col, metric, title in (
      (0, 'zero_f1', '(a) Algorithm 2 (cut 0)'),
      (2, 'f1', '(c) no-oracle threshold'),
    ):
      ax = axes[col]
      for b, n_k in sorted({(r['B'], r['n_k']) for r in dp}):
        for e in sorted({r['E'] for r in dp}):
          xs = [
            s
            for s in cfg.dpsgd_sigmas
            if not math.isnan(
              report.get_metric(
                summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s
              )
            )
          ]
          if xs:
            ax.plot(
              xs,
              [
                report.get_metric(
                  summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s
                )
                for s in xs
              ],
              'o-',
              label=f'B={b} n_k={n_k} E={e}',
            )
      ax.set_xscale('log')
      ax.set_ylim(0, 1.02)
      ax.set_xlabel('σ (DPSGD-like)')
      ax.set_ylabel('word F1')
      ax.set_title(title)
    # (a) and (c) draw the same runs: one legend, right of the panels.
    fig.legend(
      *axes[0].get_legend_handles_labels(),
      loc='center left',
      bbox_to_anchor=(1.0, 0.5),
      fontsize=7,
    )
    _magnitude_plot(axes[1], cfg, model, datasets, writer.workdir)
    fig.tight_layout()
    names.append(writer.save_figure(fig, 'fig5_dpsgd_threshold.png'))
    plt.close(fig)
  # Fig. 6 and 7: both local DP methods against σ, one panel per method
  # and E, one line per (B, n_k).
  names.append(
    writer.save_figure(
      _local_dp_figure(cfg, summary, res, 'f1', 'word F1 (no oracle)', colors),
      'fig6_local_dp_words.png',
    )
  )
  names.append(
    writer.save_figure(
      _local_dp_figure(
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
      and (r['B'] == b or (r['B'] == 'full' and report.is_alias(b, n_k)))
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
        if not math.isnan(report.get_metric(summary, 'f1', E=e, **p))
      ]
      if not es:
        continue
      # Colours share x: a small shift per n_k keeps the bars apart.
      xs = [e * 1.08 ** (i - (len(cfg.num_sentences) - 1) / 2) for e in es]
      f1 = [report.get_metric(summary, 'f1', E=e, **p) for e in es]
      up = [report.get_metric(summary, 'f1_upper', E=e, **p) for e in es]
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
      report.scaling_levenshtein(summary, cfg, n_k),
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


def _local_dp_figure(cfg, summary, res, metric, ylabel, colors):
  """`metric` against σ: rows = the two local DP methods, columns = E.

  Colour = n_k, line style = B (solid: full batch, dashed: minibatches); the
  legend sits below the panels, off the data.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  methods = [
    (noise, sigmas)
    for noise, sigmas in (
      ('dpsgd', cfg.dpsgd_sigmas),
      ('single', cfg.single_sigmas),
    )
    if sigmas and any(r['noise'] == noise for r in res)
  ]
  epochs = sorted({r['E'] for r in res if r['noise'] in dict(methods)})
  top = 1.02 if metric == 'f1' else 102
  fig, axes = plt.subplots(
    max(len(methods), 1),
    max(len(epochs), 1),
    figsize=(max(3.2 * len(epochs), 6.0), 2.8 * max(len(methods), 1)),
    squeeze=False,
    sharey=True,
  )
  batches = set()
  for row, (noise, sigmas) in enumerate(methods):
    for col, e in enumerate(epochs):
      ax = axes[row][col]
      keys = sorted(
        {(r['B'], r['n_k']) for r in res if r['noise'] == noise and r['E'] == e}
      )
      for b, n_k in keys:
        batches.add(b)
        ys = [
          report.get_metric(
            summary, metric, B=b, E=e, n_k=n_k, noise=noise, sigma=s
          )
          for s in sigmas
        ]
        ax.plot(
          sigmas,
          ys,
          'o-' if b == 'full' else 's--',
          color=colors.get(n_k, 'grey'),
          markersize=3,
        )
      ax.set_xscale('log')
      ax.set_ylim(0, top)
      ax.set_title(f'{noise}, E={e}', fontsize=8)
      ax.grid(alpha=0.3)
      if row == len(methods) - 1:
        ax.set_xlabel('σ')
      if col == 0:
        ax.set_ylabel(ylabel, fontsize=8)
  handles = [
    Line2D([], [], color=colors[n], marker='o', label=f'n_k={n}')
    for n in cfg.num_sentences
    if n in colors
  ]
  handles += [
    Line2D(
      [], [], color='grey', ls='-' if b == 'full' else '--', label=f'B={b}'
    )
    for b in sorted(batches, key=str)
  ]
  fig.legend(
    handles=handles,
    loc='lower center',
    ncol=min(len(handles), 8),
    fontsize=7,
    bbox_to_anchor=(0.5, -0.02),
  )
  fig.tight_layout(rect=(0, 0.06, 1, 1))
  return fig


def _magnitude_plot(ax, cfg, model, datasets, workdir: Path):
  """Fig. 5b: sorted positive bias updates, typed vs not, one DPSGD run."""
  if not cfg.dpsgd_runs or not cfg.dpsgd_sigmas:
    return
  n_k, b, _ = max(cfg.dpsgd_runs)
  ds = next((d for d in datasets if d.n_k == n_k), None)
  sigma = sorted(cfg.dpsgd_sigmas)[len(cfg.dpsgd_sigmas) // 2]
  files = sorted(
    (workdir / 'deltas').glob(f'n{n_k}_d0_B{b}_dpsgd_{sigma:g}_E*.npy'),
    key=lambda f: int(f.stem.rsplit('_E', 1)[1]),
  )
  if ds is None or not files:
    return
  e = int(files[-1].stem.rsplit('_E', 1)[1])
  delta = io.load_npy(files[-1])
  tok = model.tokenizer
  cand = np.asarray(
    gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  )
  pos = np.flatnonzero((delta > 0) & cand)
  order = pos[np.argsort(-delta[pos])]
  typed = np.array([tok.words[k] in ds.true_words for k in order], bool)
  x = np.arange(1, len(order) + 1)
  ax.scatter(
    x[~typed], delta[order][~typed], s=3, color='tab:red', label='not typed'
  )
  ax.scatter(
    x[typed], delta[order][typed], s=3, color='tab:blue', label='typed'
  )
  rule = 'fdr' if cfg.threshold_rule == 'auto' else cfg.threshold_rule
  thr = float(
    gboard.choose_threshold(
      jnp.asarray(delta), rule, q=cfg.fdr_q, candidates=jnp.asarray(cand)
    )
  )
  oracle, _ = thresholds.oracle_threshold(delta, tok.words, ds.true_words, cand)
  ax.axhline(thr, color='k', label=f'bias cut ({rule})')
  ax.axhline(oracle, color='k', ls=':', label='oracle')
  ax.set_xscale('log')
  ax.set_xlabel('rank of positive b1 - b0')
  ax.set_ylabel('b1 - b0')
  ax.set_title(f'(b) DPSGD-like σ={sigma:g}, B={b}, n_k={n_k}, E={e}')
  ax.legend(fontsize=6, ncol=4, loc='upper center', bbox_to_anchor=(0.5, -0.2))


def rerender_plots(workdir: str | Path) -> list[str]:
  """Re-draws the figures of a finished run from its config.json,
  summary.json and results.jsonl (a committed report folder); returns the
  names written. summary.md stays (its header needs the run's model and
  corpus facts); Fig. 5 needs the run's update files (`deltas/`), so a
  folder without them keeps its Fig. 5."""
  import io as _io  # pylint: disable=g-import-not-at-top
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
  kept = set()
  if not (workdir / 'deltas').is_dir():
    kept.add('fig5_dpsgd_threshold.png')
  written = []

  def save_figure(fig, name):
    if name not in kept:
      buf = _io.BytesIO()
      fig.savefig(buf, format='png', dpi=120, bbox_inches='tight')
      io.atomic_write_bytes(workdir / name, buf.getvalue())
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
