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

from experiments import gboard_claims, gboard_plots, gboard_summary
from leakjax import io
from leakjax.attacks.gboard import GboardConfig, GboardRun


def write_report(run: GboardRun, cfg: GboardConfig) -> dict[str, float]:
  """Writes summary.json, summary.md and the figures; returns the summary."""
  summary = gboard_summary.summarize(run.writer.results, run.pretrain_info, cfg)
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


# The columns that name a setting in the noise tables.
_SETTING_COLUMNS = ('noise', 'σ', 'B', 'E', 'n_k')


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
        if gboard_summary.is_alias(b, n_k):
          continue
        p = dict(B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        f1 = gboard_summary.get_metric(summary, 'f1', **p)
        if math.isnan(f1):
          continue
        up = gboard_summary.get_metric(summary, 'f1_upper', **p)
        rows.append(
          [
            b,
            e,
            n_k,
            gboard_summary.get_metric(summary, 'zero_f1', **p),
            gboard_summary.get_metric(summary, 'fdr_f1', **p),
            gboard_summary.get_metric(summary, 'rescue_f1', **p),
            gboard_summary.get_metric(summary, 'num_convex', **p),
            f1,
            gboard_summary.get_metric(summary, 'oracle_f1', **p),
            up,
            f1 / up,
            gboard_summary.get_metric(summary, 'recon_f1', **p),
            gboard_summary.get_metric(summary, 'levenshtein_cover', **p),
            gboard_summary.get_metric(summary, 'levenshtein_words', **p),
            gboard_summary.get_metric(summary, 'levenshtein_gap', **p),
            gboard_summary.get_metric(summary, 'levenshtein_topn', **p),
            gboard_summary.get_metric(summary, 'levenshtein_recall', **p),
            gboard_summary.get_metric(summary, 'num_kept', **p),
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
    vals = gboard_summary.scaling_levenshtein(summary, cfg, n_k)
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
            f1 = gboard_summary.get_metric(summary, 'f1', **p)
            if math.isnan(f1) or gboard_summary.is_alias(b, n_k):
              continue
            up = gboard_summary.get_metric(summary, 'f1_upper', **p)
            rows.append(
              [
                noise,
                f'{s:g}',
                b,
                e,
                n_k,
                gboard_summary.get_metric(summary, 'zero_f1', **p),
                gboard_summary.get_metric(summary, 'fdr_f1', **p),
                gboard_summary.get_metric(summary, 'stouffer_f1', **p),
                f1,
                gboard_summary.get_metric(summary, 'oracle_f1', **p),
                f1 / up,
                gboard_summary.get_metric(summary, 'levenshtein', **p),
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
  lines += ['', *gboard_claims.paper_claims_markdown(summary)]
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
      groups.setdefault(gboard_summary.group_key(r), []).append(r)

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
    print('\n'.join(gboard_plots.rerender_plots(argv[0])))
    return
  print(
    '\n'.join(gboard_claims.paper_claims_markdown(json.loads(path.read_text())))
  )


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
