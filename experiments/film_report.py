"""FILM report: summary keys and markdown tables.

Turns the rows of :func:`leakjax.attacks.film.runner.run` into summary.json
(means, stds and bests per setting, keyed by :func:`leakjax.io.summary_key`),
summary.md (FILM Table 10 layout with the paper's Enron numbers; Table 4 in
bag mode; Table 3 for multi-sentence recovery; the utility runs:
:mod:`experiments.film_utility`) and film_vs_batch_size.png
(:mod:`experiments.film_plots`); the paper's numbers are in
:mod:`experiments.film_tables`.

`python -m experiments.film_report WORKDIR` redraws the plot of a finished
run.
"""

from __future__ import annotations

import math

import numpy as np

from experiments import film_plots, film_tables, film_utility
from experiments.film_tables import (
  PAPER_TABLE3,
  PAPER_TABLE4,
  PAPER_TABLE9_ENRON,
  PAPER_TABLE10_ENRON,
)
from leakjax import io
from leakjax.attacks.film import runner


def summarize(
  cfg: runner.FilmConfig, rows: list[dict], extra: dict
) -> tuple[dict[str, float], str, list]:
  summary: dict[str, float] = {}
  figures = []
  if cfg.mode == 'utility':
    md = film_utility.utility_markdown(cfg, rows, extra)
    return film_utility.summarize_utility(cfg, rows), md, figures
  if cfg.mode == 'bag':
    groups = {}
    for r in rows:
      groups.setdefault((r['b'], r['defense'], r['method']), []).append(r)
    table = []
    for (b, d, m), rs in sorted(groups.items()):
      params = {'b': b, 'method': m}
      if len(cfg.defenses) > 1 or d != 'none':
        params['defense'] = d
      for f in ('bag_precision', 'bag_recall'):
        summary[io.summary_key(f, **params)] = film_tables.mean_std(rs, f)[0]
      paper = PAPER_TABLE4.get(d) if b == 16 else None
      if d == 'none' and m in ('norm', 'norm_oracle'):
        paper = None
      pm, ps = film_tables.mean_std(rs, 'bag_precision')
      rm, rsd = film_tables.mean_std(rs, 'bag_recall')
      table.append(
        [
          b,
          d,
          m,
          len(rs),
          f'{pm:.3f} ± {ps:.3f}',
          f'{rm:.3f} ± {rsd:.3f}',
          f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else '–',
          film_tables.mean_std(rs, 'true_bag_size')[0],
        ]
      )
    md = (
      '# FILM bag of words from gradients\n\n'
      f'Model `{cfg.model}` ({cfg.init}), t = {cfg.train_steps} steps.'
      " `tied` is leakjax's method for tied embeddings (input span +"
      ' target sign + norm outliers, no oracle); `norm` the norm'
      f' threshold at robust z > 8; `norm_oracle` the norm'
      ' threshold at its best F1 *given the true bag* (an upper bound'
      ' of the baseline). Mean ± std over batches. "paper P / R" is'
      ' FILM Table 4 (GPT-2 on WikiText-103, b = 16; its defense rows'
      ' use the non-zero-rows and DP-threshold attacks).\n\n'
      + io.markdown_table(
        [
          'b',
          'defense',
          'method',
          'batches',
          'precision',
          'recall',
          'paper P / R',
          'true bag size',
        ],
        table,
      )
    )
    return summary, md, figures
  groups = {}
  for r in rows:
    key = tuple(
      sorted(
        (k, r[k]) for k in r if k in ('b', 'beams', 'ngram', 'beta', 'defense')
      )
    )
    groups.setdefault(key, []).append(r)
  table = []
  for key, rs in sorted(groups.items()):
    params = dict(key)
    for f in (
      'rouge1',
      'rouge2',
      'rougeL',
      'nerr',
      'bag_precision',
      'bag_recall',
      'multi_recall',
      'multi_precision',
    ):
      mean, std = film_tables.mean_std(rs, f)
      if f.startswith('multi') and math.isnan(mean):
        continue
      summary[io.summary_key(f, **params)] = mean
      if f in ('rouge1', 'rouge2', 'rougeL', 'nerr'):
        summary[io.summary_key(f + '_std', **params)] = std
        summary[io.summary_key(f + '_best', **params)] = film_tables.best(rs, f)
    b = params['b']
    paper = PAPER_TABLE10_ENRON.get(b) or PAPER_TABLE9_ENRON.get(b)
    cells = []
    for i, f in enumerate(('rouge1', 'rouge2', 'rougeL', 'nerr')):
      mean, std = film_tables.mean_std(rs, f)
      best = film_tables.best(rs, f)
      ours = f'{mean:.2f} ± {std:.2f} ({best:.2f})'
      counted = len(film_tables.values(rs, f))
      if counted < len(rs):  # NERR: only batches with a named entity
        ours += f' [{counted}]'
      cells += [ours, f'{paper[i]:.2f}' if paper else '–']
    label = ', '.join(f'{k}={v}' for k, v in params.items())
    table.append(
      [label, len(rs)]
      + cells
      + [
        f'{film_tables.mean_std(rs, "bag_precision")[0]:.3f} /'
        f' {film_tables.mean_std(rs, "bag_recall")[0]:.3f}'
      ]
    )
  header = [
    'setting',
    'batches',
    'ROUGE-1',
    'paper',
    'ROUGE-2',
    'paper',
    'ROUGE-L',
    'paper',
    'NERR',
    'paper',
    'bag P / R',
  ]
  md = (
    '# FILM: sentences recovered from client gradients\n\n'
    f'Model `{cfg.model}` ({cfg.init}), fine-tuned for t ='
    f' {extra.get("trained_steps", cfg.train_steps)} steps'
    + (' (early stopping)' if extra.get('stopped_early') else '')
    + (
      f', attacked at step {extra["attacked_step"]} (lowest eval loss)'
      if 'attacked_step' in extra
      else ''
    )
    + f' on {extra.get("num_train", "?")} private sentences'
    + (
      f' (eval perplexity {extra["eval_ppl"]:.2f})'
      if extra.get('eval_ppl')
      else ''
    )
    + '. Mean ± std over batches (best in brackets), as in FILM Table'
    ' 10; "paper" is the Enron Email row of Table 10 (b = 4: Table 9),'
    ' GPT-2 fine-tuned on 31,797 sentences for up to 90k iterations.'
    ' Bags come from the gradient, never from the true tokens.'
    ' [n]: batches with a named entity, when not all (NERR is undefined'
    ' without one).\n\n' + io.markdown_table(header, table)
  )
  md += _multi_sentence_table(rows, summary)
  md += _frozen_table(rows, extra.get('hidden_size'))
  first = min((r.get('batch', 0) for r in rows), default=0)
  examples = [r for r in rows if r.get('batch') == first][:4]
  if examples:
    md += f'\n## Examples (batch {first})\n\n'
    for r in examples:
      orig = r['originals'][r['match']]
      md += (
        f'- b={r["b"]}: original: *{orig}*  \n  recovered:'
        f' **{r["recovered"][0]}** (ROUGE-L {r["rougeL"]:.2f})\n'
      )
  figures.append(film_plots.plot(rows, cfg))
  md += '\n![ROUGE and NERR vs batch size](film_vs_batch_size.png)\n'
  return summary, md, figures


def _frozen_table(rows: list[dict], width: int | None = None) -> str:
  """Frozen embeddings (FILM Sec. 6.3) beside no defense, per b.

  FILM's bag reads the word-embedding gradient, which a frozen embedding
  never sends; the span test reads the first attention layer's input
  projection gradient instead, whose column space holds every input
  token's normalised embedding while the batch has fewer distinct tokens
  than the model width `width` (past it the span is all of R^width and
  the test names nothing).
  """
  by = {}
  for r in rows:
    by.setdefault((r['b'], r.get('defense', 'none')), []).append(r)
  bs_ = sorted({b for b, d in by if d == 'freeze'})
  if not bs_:
    return ''

  def cell(b, defense, f, digits=2):
    rs = by.get((b, defense), [])
    if not rs:
      return '–'
    return f'{film_tables.mean_std(rs, f)[0]:.{digits}f}'

  table = []
  for b in bs_:
    frozen = by[(b, 'freeze')]
    valid = [r['span_valid'] for r in frozen if 'span_valid' in r]
    tokens = film_tables.values(frozen, 'true_bag_size')
    empty = sum(bool(r.get('empty_bag')) for r in frozen)
    table.append(
      [
        b,
        len(frozen),
        f'{cell(b, "none", "bag_precision", 3)} /'
        f' {cell(b, "none", "bag_recall", 3)}',
        f'{cell(b, "freeze", "bag_precision", 3)} /'
        f' {cell(b, "freeze", "bag_recall", 3)}',
        cell(b, 'none', 'rougeL'),
        cell(b, 'freeze', 'rougeL'),
        f'{sum(valid)} of {len(valid)}' if valid else '–',
        f'{min(tokens)}-{max(tokens)}' if tokens else '–',
        f'{empty} of {len(frozen)}',
      ]
    )
  return (
    '\n## Frozen embeddings (Sec. 6.3)\n\n'
    'The paper: with the word embeddings frozen, bag precision and recall'
    ' are both 0 and the attack is defended. Here the bag comes from the'
    " span test on the first attention layer's gradient (the embedding"
    ' gradient is zero), then the same beam search over it and the'
    ' one-character sentence ends. Span valid: batches whose first-layer'
    ' gradient spectrum has a clear gap; distinct tokens: per batch, the'
    ' least and most'
    + (f' (the model width d = {width})' if width else '')
    + '; past d the span is the whole space and names nothing, so the bag'
    ' is empty and the batch scores 0.\n\n'
    + io.markdown_table(
      [
        'b',
        'batches',
        'bag P / R, none',
        'bag P / R, frozen',
        'ROUGE-L, none',
        'ROUGE-L, frozen',
        'span valid (frozen)',
        'distinct tokens',
        'empty bags (frozen)',
      ],
      table,
    )
  )


def _multi_sentence_table(rows: list[dict], summary: dict) -> str:
  """Table 3 layout: multi-sentence recall/precision per repetition count.

  Adds `multi_recall@b=B,iter=K` / `multi_precision@...` to `summary`.
  """
  by = {}
  for r in rows:
    for k, m in r.get('multi_by_iter', {}).items():
      by.setdefault((r['b'], int(k)), []).append(m)
  if not by:
    return ''
  table = []
  for (b, k), ms in sorted(by.items()):
    rec = np.array([m['recall'] for m in ms])
    prec = np.array([m['precision'] for m in ms])
    summary[io.summary_key('multi_recall', b=b, iter=k)] = float(rec.mean())
    summary[io.summary_key('multi_precision', b=b, iter=k)] = float(prec.mean())
    paper = PAPER_TABLE3.get(k) if b == 16 else None
    table.append(
      [
        b,
        k,
        len(ms),
        f'{rec.mean():.2f} ± {rec.std():.2f}',
        f'{prec.mean():.2f} ± {prec.std():.2f}',
        f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else '–',
      ]
    )
  return (
    '\n## Multi-sentence recovery (Sec. 4.5, Table 3 layout)\n\n'
    'Recall: fraction of the batch with a recovered sentence of ROUGE-L >'
    ' 0.25; precision: fraction of the recovered sentences with ROUGE-L >'
    ' 0.25 against some sentence of the batch, after the first k beam'
    ' searches. "paper": Table 3 (GPT-2, WikiText-103, b = 16).\n\n'
    + io.markdown_table(
      ['b', 'repetitions k', 'batches', 'recall', 'precision', 'paper R / P'],
      table,
    )
  )


def write(writer: io.ExperimentWriter, cfg, film_run: runner.FilmRun):
  """Writes summary.json, summary.md and the plot; returns the summary."""
  summary, md, figures = summarize(cfg, film_run.results, film_run.extra)
  for fig, name in figures:
    writer.save_figure(fig, name)
  writer.write_summary(summary, md)
  return summary


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.film_report WORKDIR')
  print(film_plots.rerender_plot(sys.argv[1]))
