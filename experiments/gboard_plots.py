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
    fig = _dpsgd_figure(
      cfg, summary, dp, colors, _magnitudes(cfg, model, datasets, writer)
    )
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


def _dpsgd_figure(cfg, summary, dp, colors, magnitudes=None):
  """Fig. 5 (Sec. 6.1): DPSGD-like word F1 against σ.

  (a) Algorithm 2 (every negative bias, cut 0) and (c) the no-oracle
  threshold, from the summary: colour = n_k, line style = B (solid: full
  batch, dashed: minibatches), marker = E, each E and each run shifted a
  little along σ so equal values stay apart; with several datasets per setting the bars
  span ±1 standard deviation over them. (b), the sorted bias updates of
  one run (:func:`_magnitudes`), needs the run's update files; without
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
      _magnitude_panel(ax, magnitudes)
      continue
    for k, (b, n_k) in enumerate(keys):
      for j, e in enumerate(epochs):
        p = dict(B=b, E=e, n_k=n_k, noise='dpsgd')
        xs = [
          s
          for s in cfg.dpsgd_sigmas
          if not math.isnan(report.get_metric(summary, metric, sigma=s, **p))
        ]
        if not xs:
          continue
        ys = [report.get_metric(summary, metric, sigma=s, **p) for s in xs]
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


def _magnitudes(cfg, model, datasets, writer):
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


def _magnitude_panel(ax, m) -> None:
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


def rerender_plots(workdir: str | Path) -> list[str]:
  """Re-draws the figures of a finished run from its config.json,
  summary.json and results.jsonl (a committed report folder); returns the
  names written. summary.md stays (its header needs the run's model and
  corpus facts). Without the model, Fig. 5 has no panel (b) (the sorted
  bias updates of one run); its caption says so."""
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
  written = []

  def save_figure(fig, name):
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
