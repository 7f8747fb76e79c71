"""The privacy figures of the GBoard report (Suliman & Leith, Figs. 5-7):
DPSGD-like noise against the threshold rules and the sorted bias updates
(Fig. 5), and both local DP methods against σ (Figs. 6 and 7).
:func:`experiments.gboard_plots.make_plots` draws them with the others.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from experiments import gboard_summary
from leakjax import io
from leakjax.attacks import gboard
from leakjax.attacks.gboard import thresholds


def local_dp_figure(cfg, summary, res, metric, ylabel, colors):
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
          gboard_summary.get_metric(
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


def run_title(cfg) -> str:
  """The run's model and client data (a named data set as given, a local
  file by its name), for the figures' titles."""
  heldout = getattr(cfg, 'heldout_from_seed', None)
  data = str(cfg.sms).rstrip('/').rsplit('/', 1)[-1]
  return (
    f'CIFG-LSTM ({cfg.units} units, V={cfg.vocab_size}); clients:'
    f' {cfg.sentence_length}-word {data} sentences'
    + (f' unused by seed {heldout}' if heldout is not None else '')
    + f', loss {cfg.loss}'
  )


# Fig. 5 (a), (c): marker per E, so runs of one (B, n_k) stay apart.
_E_MARKERS = 'os^Dvp*h'


def dpsgd_figure(cfg, summary, dp, colors, magnitudes=None):
  """Fig. 5 (Sec. 6.1): DPSGD-like word F1 against σ.

  (a) Algorithm 2 (every negative bias, cut 0) and (c) the no-oracle
  threshold, from the summary: colour = n_k, line style = B (solid: full
  batch, dashed: minibatches), marker = E, each E and each run shifted a
  little along σ so equal values stay apart; with several datasets per setting the bars
  span ±1 standard deviation over them. (b), the sorted bias updates of
  one run (:func:`magnitudes`), needs the run's update files; without
  them the figure has (a) and (c) only, and its caption says so. The
  paper's text gives no values for Fig. 5; the caption quotes what it
  says.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  panels = [('zero_f1', '(a) Algorithm 2 (cut 0)')]
  if magnitudes is not None:
    panels.append((None, '(b) sorted bias updates'))
  panels.append(('f1', '(c) no-oracle threshold'))
  fig, axes = plt.subplots(
    1, len(panels), figsize=(4.6 * len(panels) + 1.0, 3.8), squeeze=False
  )
  axes = axes[0]
  keys = sorted({(r['B'], r['n_k']) for r in dp}, key=str)
  epochs = sorted({r['E'] for r in dp})
  marker = {e: _E_MARKERS[i % len(_E_MARKERS)] for i, e in enumerate(epochs)}
  ends = [0.0, 1.0]
  for ax, (metric, title) in zip(axes, panels):
    ax.set_title(title, fontsize=9)
    if metric is None:
      magnitude_panel(ax, magnitudes)
      continue
    for k, (b, n_k) in enumerate(keys):
      for j, e in enumerate(epochs):
        p = dict(B=b, E=e, n_k=n_k, noise='dpsgd')
        xs = [
          s
          for s in cfg.dpsgd_sigmas
          if not math.isnan(
            gboard_summary.get_metric(summary, metric, sigma=s, **p)
          )
        ]
        if not xs:
          continue
        ys = [
          gboard_summary.get_metric(summary, metric, sigma=s, **p) for s in xs
        ]
        sds = []
        for s in xs:
          vals = [
            r[metric]
            for r in dp
            if (r['B'], r['n_k'], r['E'], r['sigma']) == (b, n_k, e, s)
            and r.get(metric) is not None
          ]
          sds.append(np.std(vals, ddof=1) if len(vals) > 1 else 0.0)
        ends += [y + d for y, d in zip(ys, sds)] + [
          y - d for y, d in zip(ys, sds)
        ]
        # E apart, and within an E the (B, n_k) runs a little apart.
        shift = 1.12 ** (j - (len(epochs) - 1) / 2) * 1.03 ** (
          k - (len(keys) - 1) / 2
        )
        ax.errorbar(
          [s * shift for s in xs],
          ys,
          sds,
          fmt=marker[e] + ('-' if b == 'full' else '--'),
          color=colors.get(n_k, 'grey'),
          markersize=4.5,
          capsize=2,
          clip_on=False,
        )
    ax.set_xscale('log')
    ax.set_xticks(cfg.dpsgd_sigmas, [f'{s:g}' for s in cfg.dpsgd_sigmas])
    ax.minorticks_off()
    lo, hi = min(cfg.dpsgd_sigmas), max(cfg.dpsgd_sigmas)
    ax.set_xlim(lo / 2, hi * 2)
    ax.set_xlabel('σ (DPSGD-like)')
    ax.set_ylabel('word F1')
    ax.grid(alpha=0.3)
  for ax, (metric, _) in zip(axes, panels):
    if metric is not None:
      ax.set_ylim(min(ends) - 0.02, max(ends) + 0.02)
  handles = [
    Line2D([], [], color=colors.get(n, 'grey'), marker='o', label=f'n_k={n}')
    for n in sorted({n for _, n in keys})
  ]
  handles += [
    Line2D(
      [], [], color='grey', ls='-' if b == 'full' else '--', label=f'B={b}'
    )
    for b in sorted({b for b, _ in keys}, key=str)
  ]
  handles += [
    Line2D([], [], color='grey', marker=marker[e], ls='', label=f'E={e}')
    for e in epochs
  ]
  if magnitudes is not None:
    handles += [
      Line2D([], [], color='tab:blue', marker='.', ls='', label='(b) typed'),
      Line2D([], [], color='tab:red', marker='.', ls='', label='(b) not typed'),
      Line2D([], [], color='k', label=f'(b) bias cut ({magnitudes["rule"]})'),
      Line2D([], [], color='k', ls=':', label='(b) oracle cut'),
    ]
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  fig.suptitle(
    f'DPSGD-like noise (Suliman & Leith Fig. 5)\n{run_title(cfg)}',
    fontsize=9,
  )
  caption = (
    'Paper (Sec. 6.1, Fig. 5): no values in its text; Algorithm 2 loses'
    ' its precision from σ = 0.001, the magnitude cut stays close to the'
    ' noise-free F1 up to σ = 0.1.'
  )
  if cfg.num_datasets > 1:
    caption += f' Bars: ±1 sd over {cfg.num_datasets} datasets.'
  if magnitudes is None:
    caption += (
      "\nNot drawn: the paper's panel (b), the sorted bias updates of one"
      " run; it needs the run's update files (deltas/), which a report"
      ' folder does not keep.'
    )
  fig.text(0.01, -0.02, caption, fontsize=7, va='top')
  fig.tight_layout()
  return fig


def magnitudes(cfg, model, datasets, writer):
  """Fig. 5b's data: the sorted positive bias updates `b1 - b0` of one
  DPSGD-like run (the largest n_k, the middle σ, its last E), which are
  typed, the rule's cut and the oracle's; None without the model, the
  dataset or the run's update file in `<workdir>/deltas`."""
  if model is None or not cfg.dpsgd_runs or not cfg.dpsgd_sigmas:
    return None
  n_k, b, _ = max(cfg.dpsgd_runs)
  ds = next((d for d in datasets if d.n_k == n_k), None)
  sigma = sorted(cfg.dpsgd_sigmas)[len(cfg.dpsgd_sigmas) // 2]
  files = sorted(
    (Path(writer.workdir) / 'deltas').glob(
      f'n{n_k}_d0_B{b}_dpsgd_{sigma:g}_E*.npy'
    ),
    key=lambda f: int(f.stem.rsplit('_E', 1)[1]),
  )
  if ds is None or not files:
    return None
  delta = io.load_npy(files[-1])
  tok = model.tokenizer
  cand = np.asarray(
    gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  )
  pos = np.flatnonzero((delta > 0) & cand)
  order = pos[np.argsort(-delta[pos])]
  rule = 'fdr' if cfg.threshold_rule == 'auto' else cfg.threshold_rule
  threshold = gboard.choose_threshold(
    jnp.asarray(delta), rule, q=cfg.fdr_q, candidates=jnp.asarray(cand)
  )
  oracle, _ = thresholds.oracle_threshold(delta, tok.words, ds.true_words, cand)
  return dict(
    values=delta[order],
    typed=np.array([tok.words[k] in ds.true_words for k in order], bool),
    threshold=float(threshold),
    oracle=float(oracle),
    rule=rule,
    run=f'σ={sigma:g}, B={b}, n_k={n_k}, E={files[-1].stem.rsplit("_E", 1)[1]}',
  )


def magnitude_panel(ax, m) -> None:
  """Fig. 5b: the sorted positive bias updates, typed words blue, the
  rule's cut solid and the oracle's dotted."""
  x = np.arange(1, len(m['values']) + 1)
  typed = m['typed']
  ax.scatter(x[~typed], m['values'][~typed], s=3, color='tab:red')
  ax.scatter(x[typed], m['values'][typed], s=3, color='tab:blue')
  ax.axhline(m['threshold'], color='k')
  ax.axhline(m['oracle'], color='k', ls=':')
  ax.set_xscale('log')
  ax.set_xlabel('rank of positive b1 - b0')
  ax.set_ylabel('b1 - b0')
  ax.set_title(f'(b) sorted bias updates, {m["run"]}', fontsize=9)
  ax.grid(alpha=0.3)
