"""Summary, tables and figures of the GBoard experiment (experiments/gboard.py).

:func:`write_report` turns a finished :class:`gboard.GboardRun` into
summary.json (means over datasets, keyed
`metric@B=..,E=..,n_k=..,noise=..,sigma=..[,scale=..]`), summary.md (the
word-recovery, scaling and local-DP tables of Suliman & Leith, Figs. 2-7,
and example reconstructions) and the figures fig2-fig7.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from leakjax import io
from leakjax.attacks import gboard
from leakjax.attacks.gboard import GboardConfig, GboardRun, thresholds


def write_report(run: GboardRun, cfg: GboardConfig) -> dict[str, float]:
  """Writes summary.json, summary.md and the figures; returns the summary."""
  summary = summarize(run.writer.results, run.pretrain_info, cfg)
  md = render_markdown(
    cfg,
    summary,
    run.writer,
    run.corpora,
    run.pretrain_info,
    run.model,
    run.datasets,
  )
  run.writer.write_summary(summary, md)
  return summary


# ----------------------------------------------------------------- summary
_MEANS = (
  'f1',
  'f1_upper',
  'precision',
  'recall',
  'zero_f1',
  'universal_f1',
  'fdr_f1',
  'auto_f1',
  'oracle_f1',
  'stouffer_f1',
  'rescue_f1',
  'num_convex',
  'num_rescued',
  'drift_to_noise',
  'auto_num_recovered',
  'coverage',
  'levenshtein',
  'levenshtein_topn',
  'levenshtein_cover',
  'levenshtein_words',
  'levenshtein_gap',
  'levenshtein_recall',
  'recon_f1',
  'num_kept',
  'exact_fraction',
  'zero_num_recovered',
  'fdr_num_recovered',
)
_SUMMARY_NAMES = {'coverage': 'vocab_coverage'}
# The columns that name a setting in the noise tables.
_SETTING_COLUMNS = ('noise', 'σ', 'B', 'E', 'n_k')


def _group_key(r) -> tuple:
  return (r['B'], r['E'], r['n_k'], r['noise'], r['sigma'], r.get('scale', 0.0))


def summarize(results, pre_info, cfg: GboardConfig) -> dict[str, float]:
  """Means over datasets, keyed `metric@B=..,E=..,n_k=..,noise=..,sigma=..`.

  A full-batch run with n_k <= B is also reported under that B (it is the
  same training: Fig. 2b's n_k=16 with B=16).
  """
  groups: dict[tuple, list] = {}
  for r in results:
    if r.get('kind') != 'attack':
      continue
    groups.setdefault(_group_key(r), []).append(r)
    if r['B'] == 'full':
      for b in cfg.batch_sizes:
        if b != 'full' and int(b) >= r['n_k']:
          groups.setdefault(_group_key({**r, 'B': b}), []).append(r)
  summary: dict[str, float] = {
    'theta0_eval_perplexity': float(pre_info['eval_perplexity']),
    'theta0_sms_perplexity': float(pre_info['sms_eval_perplexity']),
  }
  for (b, e, n_k, noise, sigma, scale), rows in sorted(
    groups.items(), key=lambda kv: str(kv[0])
  ):
    params = dict(B=b, E=e, n_k=n_k, noise=noise, sigma=sigma)
    if scale:
      params['scale'] = scale
    for m in _MEANS:
      vals = [r[m] for r in rows if m in r and r[m] is not None]
      if vals and (
        not scale or m.startswith(('lev', 'recon', 'num_kept', 'exact'))
      ):  # noqa: E127
        summary[io.summary_key(_SUMMARY_NAMES.get(m, m), **params)] = float(
          np.mean(vals)
        )
  return summary


def _is_alias(b: str, n_k: int) -> bool:
  """B >= n_k: the full-batch run, listed once in the tables."""
  return b != 'full' and int(b) >= n_k


def _scaling_levenshtein(summary, cfg, n_k) -> list:
  """Noise-free FedSGD Levenshtein at n_k for each scale of Sec. 4.3.2."""
  return [
    _get(
      summary,
      'levenshtein',
      B='full',
      E=1,
      n_k=n_k,
      noise='none',
      sigma=0.0,
      **({'scale': s} if s else {}),
    )
    for s in cfg.scales
  ]


def _get(summary, metric, **params):
  return summary.get(io.summary_key(metric, **params), math.nan)


def render_markdown(
  cfg: GboardConfig, summary, writer, corpora, pre_info, model, datasets
) -> str:
  res = [r for r in writer.results if r.get('kind') == 'attack']
  counts = ', '.join(f'{k}: {v:,}' for k, v in corpora.counts.items())
  lines = [
    '# GBoard next-word-prediction attack (Suliman & Leith) on SMS',
    '',
    f'θ0: CIFG-LSTM V={cfg.vocab_size}, D={cfg.embed_dim},'
    f' {cfg.units} units ({pre_info["num_params"]:,} parameters), Adam'
    f' {pre_info["steps"]} steps ({pre_info["seconds"] / 60:.0f} min)'
    f' on {pre_info["train_sentences"]:,}'
    f' public sentences ({counts}).'
    f' Held-out perplexity {pre_info["eval_perplexity"]:.1f} (public'
    f' mix), {pre_info["sms_eval_perplexity"]:.1f} (public SMS).',
    '',
    f'Client: {cfg.sentence_length}-word SMS ham sentences, SGD'
    f' η={cfg.learning_rate}, loss `{cfg.loss}`; no-oracle threshold'
    f' rule `{cfg.threshold_rule}` (q={cfg.fdr_q}), keep rule'
    f' `{cfg.keep_rule}`.',
    '',
  ]
  # Word recovery table (noise-free).
  rows = []
  for b in cfg.batch_sizes:
    for e in cfg.epochs:
      for n_k in cfg.num_sentences:
        if _is_alias(b, n_k):
          continue
        p = dict(B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        f1 = _get(summary, 'f1', **p)
        if math.isnan(f1):
          continue
        up = _get(summary, 'f1_upper', **p)
        rows.append(
          [
            b,
            e,
            n_k,
            _get(summary, 'zero_f1', **p),
            _get(summary, 'fdr_f1', **p),
            _get(summary, 'rescue_f1', **p),
            _get(summary, 'num_convex', **p),
            f1,
            _get(summary, 'oracle_f1', **p),
            up,
            f1 / up,
            _get(summary, 'recon_f1', **p),
            _get(summary, 'levenshtein_cover', **p),
            _get(summary, 'levenshtein_words', **p),
            _get(summary, 'levenshtein_gap', **p),
            _get(summary, 'levenshtein_topn', **p),
            _get(summary, 'levenshtein_recall', **p),
            _get(summary, 'num_kept', **p),
          ]
        )
  lines += [
    '## Word recovery and reconstruction, no noise (Figs. 2, 3)',
    '',
    'F1 over distinct words ("rule" = the no-oracle rule'
    f' `{cfg.threshold_rule}`; "bias fdr" = the bias threshold'
    ' alone; "old" = the rule with the row-residual rescue instead'
    ' of the convexity test; "convex flags" = words whose bias fell'
    ' that the convexity test adds; B >= n_k is listed only as'
    ' B=full); "upper" = F1 of'
    ' returning exactly the'
    ' true in-vocabulary words. Lev. = mean over kept'
    ' reconstructions of the best word-level Levenshtein ratio'
    ' against the true sentences (Sec. 4.2), for each keep rule;'
    ' "recall" = mean over true sentences of their best kept'
    ' reconstruction; "recon F1" = word F1 of the kept'
    f' reconstructions ({cfg.keep_rule} rule, Fig. 3 x-axis).',
    '',
    io.markdown_table(
      [
        'B',
        'E',
        'n_k',
        'F1 Alg.2',
        'F1 bias fdr',
        'F1 bias+row rescue (old)',
        'convex flags',
        'F1 rule',
        'F1 oracle bias cut',
        'F1 upper',
        'rule/upper',
        'recon F1',
        'Lev. cover',
        'Lev. words',
        'Lev. gap',
        'Lev. top-n_k',
        'Lev. recall',
        'kept',
      ],
      rows,
    ),
  ]
  # Scaling.
  rows = []
  for n_k in cfg.num_sentences:
    vals = _scaling_levenshtein(summary, cfg, n_k)
    rows.append([n_k] + vals)
  lines += [
    '## FedSGD with scaling θ1 + s(θ1 − θ0) (Sec. 4.3.2, Fig. 4)',
    '',
    io.markdown_table(['n_k'] + [f's={s:g}' for s in cfg.scales], rows),
  ]
  # DP.
  rows = []
  for noise, sigmas in (
    ('dpsgd', cfg.dpsgd_sigmas),
    ('single', cfg.single_sigmas),
  ):
    for b in cfg.batch_sizes:
      for e in cfg.epochs:
        for n_k in cfg.num_sentences:
          for s in sigmas:
            p = dict(B=b, E=e, n_k=n_k, noise=noise, sigma=s)
            f1 = _get(summary, 'f1', **p)
            if math.isnan(f1) or _is_alias(b, n_k):
              continue
            up = _get(summary, 'f1_upper', **p)
            rows.append(
              [
                noise,
                f'{s:g}',
                b,
                e,
                n_k,
                _get(summary, 'zero_f1', **p),
                _get(summary, 'fdr_f1', **p),
                _get(summary, 'stouffer_f1', **p),
                f1,
                _get(summary, 'oracle_f1', **p),
                f1 / up,
                _get(summary, 'levenshtein', **p),
              ]
            )
  lines += [
    '## Local DP (Sec. 6, Figs. 5-7)',
    '',
    io.markdown_table(
      [
        *_SETTING_COLUMNS,
        'F1 Alg.2',
        'F1 bias fdr',
        'F1 bias+rows',
        'F1 rule',
        'F1 oracle bias cut',
        'rule/upper',
        'Lev. (kept)',
      ],
      rows,
    ),
  ]
  lines += _spread_markdown(cfg, res)
  lines += ['', *paper_claims_markdown(summary)]
  plots = make_plots(cfg, summary, writer, res, model, datasets)
  lines += ['## Plots', ''] + [f'![{p}]({p})' for p in plots]
  # Examples.
  ex = [
    r
    for r in res
    if r['noise'] == 'none'
    and r['E'] == max(r2['E'] for r2 in res)
    and r.get('examples')
  ]
  if ex:
    r = ex[0]
    lines += [
      '',
      f'## Example reconstructions (n_k={r["n_k"]}, B={r["B"]},'
      f' E={r["E"]}, top of the ranking)',
      '',
    ]
    lines += [f'- {t}' for t in r['examples']]
  return '\n'.join(lines) + '\n'


def _spread_markdown(cfg: GboardConfig, res) -> list[str]:
  """Mean ± standard deviation over the datasets of each setting (only
  with more than one dataset per n_k; the tables above give the means)."""
  if cfg.num_datasets < 2:
    return []
  groups: dict[tuple, list] = {}
  for r in res:
    if not r.get('scale'):
      groups.setdefault(_group_key(r), []).append(r)

  def spread(values) -> str:
    v = np.asarray([x for x in values if x is not None], float)
    if not len(v):
      return 'n/a'
    return f'{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0.0:.3f}'

  order = {'none': 0, 'dpsgd': 1, 'single': 2}
  rows = []
  for (b, e, n_k, noise, sigma, _), rs in sorted(
    groups.items(),
    key=lambda kv: (
      (order.get(kv[0][3], 3), kv[0][4], str(kv[0][0])) + kv[0][1:3]
    ),
  ):
    rows.append(
      [
        noise,
        f'{sigma:g}',
        b,
        e,
        n_k,
        len(rs),
        spread(r['f1'] for r in rs),
        spread(r['f1'] / r['f1_upper'] for r in rs if r.get('f1_upper')),
        spread(r.get('recon_f1') for r in rs),
        spread(r.get('levenshtein') for r in rs),
      ]
    )
  return [
    '## Spread over datasets',
    '',
    f'Mean ± sample standard deviation over the {cfg.num_datasets} client'
    ' datasets of each setting (each its own draw of n_k sentences from'
    ' the client pool).',
    '',
    io.markdown_table(
      [
        *_SETTING_COLUMNS,
        'datasets',
        'F1 rule',
        'rule/upper',
        'recon F1',
        'Lev. (kept)',
      ],
      rows,
    ),
  ]


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


def make_plots(cfg, summary, writer, res, model, datasets):
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
  # Fig. 4: FedSGD scaling.
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for n_k in cfg.num_sentences:
    vals = _scaling_levenshtein(summary, cfg, n_k)
    ax.plot(
      [max(s, 0.1) for s in cfg.scales],
      vals,
      'o-',
      color=colors[n_k],
      label=f'n_k={n_k}',
    )
  ax.set_xscale('log')
  ax.set_xlabel('scale s (0 plotted at 0.1)')
  ax.set_ylabel('mean Levenshtein ratio')
  ax.set_title('FedSGD reconstruction with scaling')
  ax.legend(fontsize=7)
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
              _get(summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s)
            )
          ]
          if xs:
            ax.plot(
              xs,
              [
                _get(summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s)
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
      ax.legend(fontsize=6)
    _magnitude_plot(axes[1], cfg, model, datasets, writer.workdir)
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
      and (r['B'] == b or (r['B'] == 'full' and _is_alias(b, n_k)))
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
        e for e in cfg.epochs if not math.isnan(_get(summary, 'f1', E=e, **p))
      ]
      if not es:
        continue
      # Colours share x: a small shift per n_k keeps the bars apart.
      xs = [e * 1.08 ** (i - (len(cfg.num_sentences) - 1) / 2) for e in es]
      f1 = [_get(summary, 'f1', E=e, **p) for e in es]
      up = [_get(summary, 'f1_upper', E=e, **p) for e in es]
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
  (noise-free runs): colour = n_k, marker = B (o: full batch, s: minibatches)."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  es = [e for e in cfg.epochs if e > 1] or list(cfg.epochs)
  fig, axes = plt.subplots(
    1, len(es), figsize=(4 * len(es), 3.6), squeeze=False
  )
  for ax, e in zip(axes[0], es):
    for r in res:
      if (
        r['E'] == e
        and r['noise'] == 'none'
        and r.get('scale', 0) == 0
        and 'levenshtein' in r
      ):
        ax.scatter(
          r['recon_f1'],
          r['levenshtein'],
          color=colors[r['n_k']],
          marker='o' if r['B'] == 'full' else 's',
          s=30,
        )
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 102)
    ax.set_xlabel('F1 of reconstructed tokens')
    ax.set_ylabel('mean Levenshtein ratio')
    ax.set_title(f'E={e}')
  for n_k in cfg.num_sentences:
    axes[0][0].scatter([], [], color=colors[n_k], label=f'n_k={n_k}')
  for b in cfg.batch_sizes:
    axes[0][0].scatter(
      [], [], color='grey', marker='o' if b == 'full' else 's', label=f'B={b}'
    )
  axes[0][0].legend(fontsize=7, loc='upper left')
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
          _get(summary, metric, B=b, E=e, n_k=n_k, noise=noise, sigma=s)
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
  ax.legend(fontsize=6)


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


def main(argv: list[str]) -> None:
  """`python -m experiments.gboard_report W`: the paper-statements table of
  a finished run from `W/summary.json` (e.g. a committed report folder);
  `python -m experiments.gboard_report --plots W`: its figures re-drawn
  (:func:`rerender_plots`)."""
  import json  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  plots = '--plots' in argv
  argv = [a for a in argv if a != '--plots']
  if len(argv) != 1:
    sys.exit('usage: python -m experiments.gboard_report [--plots] WORKDIR')
  path = Path(argv[0]) / 'summary.json'
  if not path.is_file():
    sys.exit(f'leakjax: error: {path} does not exist')
  if plots:
    print('\n'.join(rerender_plots(argv[0])))
    return
  print('\n'.join(paper_claims_markdown(json.loads(path.read_text()))))


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
