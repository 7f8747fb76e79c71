"""Summary, tables and figures of the GBoard experiment (experiments/gboard.py).

:func:`write_report` turns a finished :class:`gboard.GboardRun` into
summary.json (means over datasets, keyed
`metric@B=..,E=..,n_k=..,noise=..,sigma=..[,scale=..]`), summary.md (the
word-recovery, scaling and local-DP tables of Suliman & Leith, Figs. 2-7,
and example reconstructions) and the figures fig2-fig7
(:mod:`experiments.gboard_plots`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from leakjax import io
from leakjax.attacks.gboard import GboardConfig, GboardRun


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


def is_alias(b: str, n_k: int) -> bool:
  """B >= n_k: the full-batch run, listed once in the tables."""
  return b != 'full' and int(b) >= n_k


def scaling_levenshtein(summary, cfg, n_k) -> list:
  """Noise-free FedSGD Levenshtein at n_k for each scale of Sec. 4.3.2."""
  return [
    get_metric(
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


def get_metric(summary, metric, **params):
  """The summary's value of `metric` at `params`; NaN where the run has
  none."""
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
        if is_alias(b, n_k):
          continue
        p = dict(B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        f1 = get_metric(summary, 'f1', **p)
        if math.isnan(f1):
          continue
        up = get_metric(summary, 'f1_upper', **p)
        rows.append(
          [
            b,
            e,
            n_k,
            get_metric(summary, 'zero_f1', **p),
            get_metric(summary, 'fdr_f1', **p),
            get_metric(summary, 'rescue_f1', **p),
            get_metric(summary, 'num_convex', **p),
            f1,
            get_metric(summary, 'oracle_f1', **p),
            up,
            f1 / up,
            get_metric(summary, 'recon_f1', **p),
            get_metric(summary, 'levenshtein_cover', **p),
            get_metric(summary, 'levenshtein_words', **p),
            get_metric(summary, 'levenshtein_gap', **p),
            get_metric(summary, 'levenshtein_topn', **p),
            get_metric(summary, 'levenshtein_recall', **p),
            get_metric(summary, 'num_kept', **p),
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
    vals = scaling_levenshtein(summary, cfg, n_k)
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
            f1 = get_metric(summary, 'f1', **p)
            if math.isnan(f1) or is_alias(b, n_k):
              continue
            up = get_metric(summary, 'f1_upper', **p)
            rows.append(
              [
                noise,
                f'{s:g}',
                b,
                e,
                n_k,
                get_metric(summary, 'zero_f1', **p),
                get_metric(summary, 'fdr_f1', **p),
                get_metric(summary, 'stouffer_f1', **p),
                f1,
                get_metric(summary, 'oracle_f1', **p),
                f1 / up,
                get_metric(summary, 'levenshtein', **p),
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
  # Imported here: the plots module reads this one's summary helpers.
  from experiments import gboard_plots  # pylint: disable=g-import-not-at-top

  plots = gboard_plots.make_plots(cfg, summary, writer, res, model, datasets)
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


def main(argv: list[str]) -> None:
  """`python -m experiments.gboard_report W`: the paper-statements table of
  a finished run from `W/summary.json` (e.g. a committed report folder);
  `python -m experiments.gboard_report --plots W`: its figures re-drawn
  (:func:`experiments.gboard_plots.rerender_plots`)."""
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
    from experiments import gboard_plots  # pylint: disable=g-import-not-at-top

    print('\n'.join(gboard_plots.rerender_plots(argv[0])))
    return
  print('\n'.join(paper_claims_markdown(json.loads(path.read_text()))))


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
