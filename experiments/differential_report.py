"""Report of the differential score / rank experiment (summary.json, .md, PNG).

Zanella-Beguelin et al., "Analyzing Information Leakage of Updates to Natural
Language Models", CCS 2020: Table 1 per method (DS of the canary and its
differential-rank bound, shaded as in the paper: DR 0, DR > 1000), the RQ3
tables (background knowledge: the canary's first words given), a plot of DS
and DR against the number of insertions k (:mod:`experiments.differential_plots`),
and the top extracted sequences.

Reads the rows of :func:`leakjax.attacks.differential.runner.run` only;
:func:`write_report` writes summary.json and summary.md.

Which data stands in for the paper's: only WikiText-2 is available here
(its validation split, ~180k words), so it plays PTB, the paper's low-data
set (~900k words, 10k vocabulary, the same 2x200 LSTM). Insertion counts are
chosen to match PTB's canary rates (1 canary word in 18K, 3.6K and 1.8K
training words for k = 10, 50, 100) rather than PTB's absolute counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments import differential_plots
from experiments.differential_plots import DR_GRAY
from leakjax import io
from leakjax.attacks import differential as dlib

# PTB canary rates of Table 1 (Sec. 4.4): one canary word in this many
# training words for k = 10, 50, 100 insertions of a 5-word canary.
PAPER_PTB_RATES = {10: 18_000, 50: 3_600, 100: 1_800}


def _no_prefix_row(results, method: str, k: int, kind: str) -> dict | None:
  """The result row of a canary attacked without background knowledge."""
  return next(
    (
      r
      for r in results
      if r['method'] == method
      and r['k'] == k
      and r['canary'] == kind
      and not r['prefix']
    ),
    None,
  )


def write_report(
  run: dlib.runner.DifferentialRun, cfg: dlib.DifferentialConfig
) -> dict[str, float]:
  """summary.json (flat numbers) and summary.md of `run`; returns the summary."""
  results = run.results
  summary = summarize(results, cfg, run.base_ppl)
  summary['ppl@model=M'] = run.base_ppl
  summary['train_words'] = float(run.train_words)
  markdown = report(
    run.writer,
    results,
    cfg,
    run.canaries,
    run.base_ppl,
    run.train_words,
    run.num_params,
  )
  run.writer.write_summary(summary, markdown)
  return summary


def fmt_ds(value: float) -> str:
  if abs(value) >= 1000:
    return f'{value:.3g}'
  return f'{value:.3f}' if abs(value) >= 0.01 else f'{value:.1e}'


def dr_cell(dr: int, num_found: int | None) -> str:
  """Table 1's shading as text: DR 0, DR > 1000, or the bound."""
  if num_found is None:  # not searched: 0 without the prefix
    return 'DR 0*'
  if dr == 0:
    return 'DR 0'
  if dr > DR_GRAY:
    return 'DR >1000'
  return f'DR >={dr}' if dr < num_found else f'DR >={num_found}'


def key_params(row) -> dict[str, Any]:
  params = dict(canary=row['canary'], k=row['k'], method=row['method'])
  if row['prefix']:
    params['prefix'] = row['prefix']
  return params


def summarize(
  results, cfg: dlib.DifferentialConfig, base_ppl: float
) -> dict[str, float]:
  del base_ppl
  summary = {}
  for row in results:
    params = key_params(row)
    summary[io.summary_key('ds', **params)] = row['ds']
    summary[io.summary_key('rel_ds', **params)] = row['rel_ds']
    summary[io.summary_key('dr', **params)] = row['dr']
    if row['searched']:
      summary[io.summary_key('found', **params)] = int(row['found'])
      summary[io.summary_key('top_match', **params)] = top_match(row)
    if row['method'] == 'retrain':
      summary[io.summary_key('dr_own', **params)] = row['dr_own']
    if not row['prefix'] and row['method'] == 'retrain':
      summary[io.summary_key('ppl', k=row['k'], method='retrain')] = row[
        'perplexity'
      ]
    elif not row['prefix']:
      summary[io.summary_key('ppl', **params)] = row['perplexity']
  # Headline: fraction of (canary, k) cells at DR 0 without background
  # knowledge, per method (retraining: not counting the other planted
  # canaries, `dr_own`).
  for method in cfg.methods:
    cells = [r for r in results if r['method'] == method and not r['prefix']]
    if cells:
      field = 'dr_own' if method == 'retrain' else 'dr'
      summary[io.summary_key('dr0_fraction', method=method)] = float(
        np.mean([r[field] == 0 for r in cells])
      )
  return summary


def top_match(row) -> int:
  """Most canary words, in place, in one of the top found sequences.

  Counts only the words the adversary did not know (after the prefix): 5
  means the canary itself is among the stored top sequences, 4 a sequence
  that differs from it in one word.
  """
  words = row['text'].split()[row['prefix'] :]
  best = 0
  for t in row.get('top', []):
    found = t['text'].split()[row['prefix'] :]
    best = max(best, sum(a == b for a, b in zip(words, found)))
  return best


def report(
  writer, results, cfg, canaries, base_ppl, train_words, num_params
) -> str:
  """summary.md: Table 1 per method, RQ3, plots, top extracted sequences."""
  ks = sorted(cfg.insertions)
  name = {'ds': 'DS', 'rel_ds': 'relative DS'}[cfg.score]
  rate = lambda k: f'1 in {train_words / (k * dlib.CANARY_LENGTH) / 1000:.1f}K'
  lines = [
    '# Differential score and rank of canaries (Zanella-Beguelin et al.'
    ' 2020, Table 1)\n',
    f'Corpus `{cfg.data}`: {train_words:,} training'
    f' words (D), vocabulary {cfg.vocab_size:,} (= |T|). Model'
    f' `{cfg.model}` LSTM, {num_params:,} parameters, M perplexity'
    f' **{base_ppl:.1f}** on held-out sentences. Beam search over all of'
    f' T, widths {"/".join(str(w) for w in dlib.halving_widths(cfg.vocab_size, dlib.CANARY_LENGTH, min_width=cfg.min_width, num_groups=cfg.num_groups))},'
    f' {cfg.num_groups} group(s), ranked by `{cfg.score}`.\n',
    'Canary rates of the paper on PTB (Table 1): '
    + ', '.join(
      f'k={k}: 1 in {w / 1000:.1f}K' for k, w in PAPER_PTB_RATES.items()
    )
    + ' training words.\n',
    'Canaries (word quintiles, 0 = most frequent; counts in D):\n',
  ]
  for c in canaries:
    lines.append(
      f'- {c.kind}: "{c.text}" quintiles {list(c.quintiles)},'
      f' counts {list(c.counts)}'
    )
  lines.append('')
  for method in cfg.methods:
    lines.append(
      f'## {method}: {name} of the canary (DR bound), no background knowledge\n'
    )
    header = ['canary'] + [f'k={k} ({rate(k)})' for k in ks]
    table = []
    for c in canaries:
      cells = [c.kind]
      for k in ks:
        row = _no_prefix_row(results, method, k, c.kind)
        if row is None:
          cells.append('-')
          continue
        cell = f'{fmt_ds(row[cfg.score])} ({dr_cell(row["dr"], row.get("num_found"))}'
        if method == 'retrain' and row['dr_own'] != row['dr']:
          cell += f'; own {dr_cell(row["dr_own"], row["num_found"])}'
        cells.append(cell + f'; top {top_match(row)}/5)')
      table.append(cells)
    lines.append(io.markdown_table(header, table))
    ppls = {
      k: [
        r['perplexity']
        for r in results
        if r['method'] == method and r['k'] == k and not r['prefix']
      ]
      for k in ks
    }
    lines.append(
      "Perplexity of M' (median over its snapshots): "
      + ', '.join(f'k={k}: {np.median(ppls[k]):.1f}' for k in ks if ppls[k])
      + '\n'
    )
  prefixes = sorted({r['prefix'] for r in results if r['prefix']})
  for p in prefixes:
    lines.append(
      f'## RQ3: the first {p} canary words given ({name} of the rest,'
      ' DR bound)\n'
    )
    header = ['method', 'canary'] + [f'k={k}' for k in ks]
    table = []
    for method in cfg.methods:
      for c in canaries:
        cells = [method, c.kind]
        for k in ks:
          row = next(
            (
              r
              for r in results
              if r['method'] == method
              and r['k'] == k
              and r['canary'] == c.kind
              and r['prefix'] == p
            ),
            None,
          )
          cells.append(
            '-'
            if row is None
            else f'{fmt_ds(row[cfg.score])} ({dr_cell(row["dr"], row.get("num_found"))})'
          )
        table.append(cells)
    lines.append(io.markdown_table(header, table))
    lines.append(
      '\\* not searched: DR 0 without the prefix implies DR 0'
      ' with it (the prefix adds the same DS to every'
      ' candidate).\n'
    )
  plot = differential_plots.plot_ds_dr(writer, results, cfg, canaries)
  if plot:
    lines.append(f'![DS and DR against k]({plot})\n')
  lines.append('## Top extracted sequences (no background knowledge)\n')
  for method in cfg.methods:
    for k in sorted({min(ks), max(ks)}):
      for c in canaries:
        row = _no_prefix_row(results, method, k, c.kind)
        if row is None or (method == 'retrain' and c is not canaries[0]):
          continue
        title = (
          f'{method}, k={k}, all canaries planted'
          if method == 'retrain'
          else f'{method}, k={k}, {c.kind} "{c.text}"'
          f' ({name} {fmt_ds(row[cfg.score])})'
        )
        lines.append(f'**{title}**\n')
        lines.append(
          io.markdown_table(
            ['rank', 'sequence', 'DS', 'rel DS'],
            [
              [i, t['text'], f'{t["ds"]:.4g}', f'{t["rel_ds"]:.4g}']
              for i, t in enumerate(row['top'][:5])
            ],
          )
        )
  return '\n'.join(lines)


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.differential_report WORKDIR')
  print(differential_plots.rerender_plot(sys.argv[1]))
