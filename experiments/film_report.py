"""FILM report: summary keys, markdown tables, the plot, the paper's numbers.

Turns the rows of :func:`leakjax.attacks.film.runner.run` into summary.json
(means, stds and bests per setting, keyed by :func:`leakjax.io.summary_key`),
summary.md (FILM Table 10 layout with the paper's Enron numbers; Table 4 in
bag mode; Table 3 for multi-sentence recovery) and film_vs_batch_size.png.
"""

from __future__ import annotations

import math

import numpy as np

from leakjax import io
from leakjax.attacks.film import runner

# FILM Table 10, Enron Email rows: mean over 20 batches (best in brackets
# in the paper): b -> (ROUGE-1, ROUGE-2, ROUGE-L, NERR).
PAPER_TABLE10_ENRON = {
  1: (0.73, 0.45, 0.61, 0.34),
  16: (0.41, 0.20, 0.31, 0.40),
  64: (0.37, 0.18, 0.29, 0.35),
  128: (0.37, 0.19, 0.29, 0.38),
}
# FILM Table 9 (Enron, FILM row) adds b = 4: (R-1, R-2, R-L, NERR).
PAPER_TABLE9_ENRON = {4: (0.54, 0.32, 0.44, 0.66)}
# FILM Table 4 (GPT-2, WikiText-103, b = 16): defense -> (precision, recall).
PAPER_TABLE4 = {
  'none': (1.00, 1.00),
  'prune:0.9': (1.00, 1.00),
  'prune:0.99': (1.00, 1.00),
  'prune:0.999': (1.00, 0.98),
  'prune:0.9999': (1.00, 0.90),
  'dp:15': (0.97, 0.49),
  'dp:10': (0.88, 0.17),
  'dp:5': (0.29, 0.01),
  'dp:1': (0.00, 0.00),
}
# FILM Tables 4a/4b (GPT-2 fine-tuned on WikiText-103): defense -> test
# perplexity of the model trained under it.
PAPER_TABLE4_PERPLEXITY = {
  'none': 11.46,
  'prune:0.9': 11.57,
  'prune:0.99': 12.77,
  'prune:0.999': 15.34,
  'prune:0.9999': 19.21,
  'dp:15': 11.98,
  'dp:10': 12.86,
  'dp:5': 14.32,
  'dp:1': 16.31,
}
# FILM Table 5: (init, embeddings) -> test perplexity on WikiText-103 and
# Enron.
PAPER_TABLE5 = {
  ('random', 'none'): {'wikitext': 27.31, 'enron': 15.16},
  ('random', 'freeze'): {'wikitext': 118.69, 'enron': 69.17},
  ('pretrained', 'none'): {'wikitext': 11.40, 'enron': 7.09},
  ('pretrained', 'freeze'): {'wikitext': 11.48, 'enron': 7.30},
}
# FILM Table 3 (GPT-2, WikiText-103, b = 16): repetitions of the beam
# search -> (recall, precision) of ROUGE-L > 0.25, means over batches.
PAPER_TABLE3 = {
  1: (0.03, 0.50),
  5: (0.13, 0.36),
  10: (0.19, 0.28),
  20: (0.25, 0.21),
  50: (0.30, 0.12),
  100: (0.34, 0.07),
}


def _values(rows, field):
  # NERR is None for batches whose sentences have no named entity.
  return [
    r[field]
    for r in rows
    if r.get(field) is not None
    and not (isinstance(r[field], float) and math.isnan(r[field]))
  ]


def _mean_std(rows, field):
  vals = _values(rows, field)
  if not vals:
    return float('nan'), float('nan')
  return float(np.mean(vals)), float(np.std(vals))


def _best(rows, field):
  vals = _values(rows, field)
  return float(np.max(vals)) if vals else float('nan')


def summarize(
  cfg: runner.FilmConfig, rows: list[dict], extra: dict
) -> tuple[dict[str, float], str, list]:
  summary: dict[str, float] = {}
  figures = []
  if cfg.mode == 'utility':
    md = utility_markdown(cfg, rows, extra)
    return _summarize_utility(cfg, rows), md, figures
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
        summary[io.summary_key(f, **params)] = _mean_std(rs, f)[0]
      paper = PAPER_TABLE4.get(d) if b == 16 else None
      if d == 'none' and m in ('norm', 'norm_oracle'):
        paper = None
      pm, ps = _mean_std(rs, 'bag_precision')
      rm, rsd = _mean_std(rs, 'bag_recall')
      table.append(
        [
          b,
          d,
          m,
          len(rs),
          f'{pm:.3f} ± {ps:.3f}',
          f'{rm:.3f} ± {rsd:.3f}',
          f'{paper[0]:.2f} / {paper[1]:.2f}' if paper else '–',
          _mean_std(rs, 'true_bag_size')[0],
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
      mean, std = _mean_std(rs, f)
      if f.startswith('multi') and math.isnan(mean):
        continue
      summary[io.summary_key(f, **params)] = mean
      if f in ('rouge1', 'rouge2', 'rougeL', 'nerr'):
        summary[io.summary_key(f + '_std', **params)] = std
        summary[io.summary_key(f + '_best', **params)] = _best(rs, f)
    b = params['b']
    paper = PAPER_TABLE10_ENRON.get(b) or PAPER_TABLE9_ENRON.get(b)
    cells = []
    for i, f in enumerate(('rouge1', 'rouge2', 'rougeL', 'nerr')):
      mean, std = _mean_std(rs, f)
      best = _best(rs, f)
      ours = f'{mean:.2f} ± {std:.2f} ({best:.2f})'
      counted = len(_values(rs, f))
      if counted < len(rs):  # NERR: only batches with a named entity
        ours += f' [{counted}]'
      cells += [ours, f'{paper[i]:.2f}' if paper else '–']
    label = ', '.join(f'{k}={v}' for k, v in params.items())
    table.append(
      [label, len(rs)]
      + cells
      + [
        f'{_mean_std(rs, "bag_precision")[0]:.3f} /'
        f' {_mean_std(rs, "bag_recall")[0]:.3f}'
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
  figures.append(_plot(rows, cfg))
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
    return f'{_mean_std(rs, f)[0]:.{digits}f}'

  table = []
  for b in bs_:
    frozen = by[(b, 'freeze')]
    valid = [r['span_valid'] for r in frozen if 'span_valid' in r]
    tokens = _values(frozen, 'true_bag_size')
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


def data_name(cfg) -> str:
  """The corpus as a title names it: a named data set or hub id as given,
  a local file by its name, no data (the runner's embedded sentences) as
  the quickstart corpus."""
  data = str(getattr(cfg, 'data', None) or '')
  if not data:
    return 'quickstart corpus'
  if '/' in data and not data.startswith('hub:'):
    data = data.rstrip('/').rsplit('/', 1)[-1]
  return data


def paper_points(bs) -> dict[int, tuple[float, ...]]:
  """The paper's Enron means (FILM Table 10; b = 4: Table 9) at the batch
  sizes from the smallest to the largest of `bs`: the paper is drawn over
  the run's range only."""
  paper = {**PAPER_TABLE10_ENRON, **PAPER_TABLE9_ENRON}
  if not bs:
    return {}
  return {b: paper[b] for b in sorted(paper) if min(bs) <= b <= max(bs)}


# (field, label, marker): one marker per metric, so metrics that coincide
# stay apart.
_PLOT_METRICS = (
  ('rouge1', 'ROUGE-1', 'o'),
  ('rouge2', 'ROUGE-2', 's'),
  ('rougeL', 'ROUGE-L', '^'),
  ('nerr', 'NERR', 'D'),
)


def _plot(rows, cfg=None):
  """ROUGE/NERR against b, mean ± std over batches; one panel per defense.

  Each metric has its colour and marker, its points shifted a little along
  b so equal values stay side by side; where all metrics are equal at a b
  the value is written beside them. The undefended panel draws the
  paper's Enron means (FILM Table 10, b = 4 from Table 9; GPT-2) with
  hollow markers and dotted lines, over the run's batch sizes only. The
  title names the run's model and corpus.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  # No defense first, then the defenses in the order the rows give them.
  defenses = sorted(
    dict.fromkeys(r.get('defense', 'none') for r in rows),
    key=lambda d: d != 'none',
  )
  fig, axes = plt.subplots(
    1,
    len(defenses),
    figsize=(4.2 * len(defenses) + 1.8, 3.6),
    sharex=True,
    sharey=True,
    squeeze=False,
  )
  ends = [0.0, 1.0]  # every bar end, to fit the y axis to them
  ticks = set()
  drew_paper = False
  for ax, defense in zip(axes[0], defenses):
    rs = [r for r in rows if r.get('defense', 'none') == defense]
    bs_ = sorted({r['b'] for r in rs})
    ticks.update(bs_)
    paper = paper_points(bs_) if defense == 'none' else {}
    ticks.update(paper)
    drew_paper |= bool(paper)
    means = {}
    for i, (f, _, marker) in enumerate(_PLOT_METRICS):
      stats = [_mean_std([r for r in rs if r['b'] == b], f) for b in bs_]
      shift = 2 ** (0.08 * (i - (len(_PLOT_METRICS) - 1) / 2))
      ax.errorbar(
        [b * shift for b in bs_],
        [m for m, _ in stats],
        yerr=[sd for _, sd in stats],
        fmt=marker + '-',
        color=f'C{i}',
        markersize=4.5,
        capsize=2,
        clip_on=False,
      )
      for b, (m, sd) in zip(bs_, stats, strict=True):
        means.setdefault(b, []).append(m)
        if not math.isnan(m):
          ends.extend((m - sd, m + sd))
      if paper:
        ax.plot(
          [b * shift for b in paper],
          [v[i] for v in paper.values()],
          marker + ':',
          color=f'C{i}',
          markerfacecolor='white',
          markersize=4.5,
          clip_on=False,
        )
    for b, ms in means.items():
      if len(set(ms)) == 1 and not math.isnan(ms[0]):
        ax.annotate(
          f'all {ms[0]:.2f}',
          (b, ms[0]),
          xytext=(0, -11),
          textcoords='offset points',
          ha='center',
          va='top',
          fontsize=7,
        )
    ax.set_xscale('log', base=2)
    ax.set_xlabel('batch size b')
    ax.grid(alpha=0.3)
    if len(defenses) > 1:
      ax.set_title(f'defense: {defense}', fontsize=9)
  ticks = sorted(ticks)
  for ax in axes[0]:
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.minorticks_off()
    ax.set_xlim(ticks[0] / 1.5, ticks[-1] * 1.5)
  axes[0][0].set_ylim(min(ends) - 0.05, max(ends) + 0.05)
  axes[0][0].set_ylabel('score (mean ± std over batches)')
  handles = [
    Line2D([], [], color=f'C{i}', marker=marker, label=label)
    for i, (_, label, marker) in enumerate(_PLOT_METRICS)
  ]
  handles.append(
    Line2D([], [], color='k', marker='o', label='this run (filled, solid)')
  )
  if drew_paper:
    handles.append(
      Line2D(
        [],
        [],
        color='k',
        ls=':',
        marker='o',
        markerfacecolor='white',
        label='paper: Enron, GPT-2\n(FILM Table 10;\nb = 4: Table 9)',
      )
    )
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  if cfg is not None:
    fig.suptitle(
      f'FILM on {getattr(cfg, "model", "?")}, {data_name(cfg)}', fontsize=10
    )
  fig.tight_layout()
  return fig, 'film_vs_batch_size.png'


def rerender_plot(workdir) -> str:
  """Re-draws film_vs_batch_size.png of a finished attack run from its
  config.json and results.jsonl (a committed report folder); summary.md
  and summary.json stay."""
  import io as _io  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  stored = json.loads((workdir / 'config.json').read_text())
  if stored.get('mode', 'attack') != 'attack':
    raise ValueError(f'{workdir}: a {stored["mode"]} run draws no plot')
  # The plot reads the model and data names only.
  cfg = types.SimpleNamespace(model=stored['model'], data=stored.get('data'))
  rows = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  fig, name = _plot(rows, cfg)
  buf = _io.BytesIO()
  fig.savefig(buf, format='png', dpi=120, bbox_inches='tight')
  plt.close(fig)
  io.atomic_write_bytes(workdir / name, buf.getvalue())
  return str(workdir / name)


def write(writer: io.ExperimentWriter, cfg, film_run: runner.FilmRun):
  """Writes summary.json, summary.md and the plot; returns the summary."""
  summary, md, figures = summarize(cfg, film_run.results, film_run.extra)
  for fig, name in figures:
    writer.save_figure(fig, name)
  writer.write_summary(summary, md)
  return summary


def _paper_table5(cfg, defense: str):
  """FILM Table 5's perplexity for this init and defense, on the corpus
  (WikiText or Enron) the data name suggests; None if none fits."""
  name = str(cfg.data).lower()
  corpus = (
    'enron' if 'enron' in name else 'wikitext' if 'wikitext' in name else None
  )
  return PAPER_TABLE5.get((cfg.init, defense), {}).get(corpus)


def _summarize_utility(cfg, rows: list[dict]) -> dict[str, float]:
  summary = {}
  for r in rows:
    if r.get('kind') == 'utility':
      key = io.summary_key('test_perplexity', defense=r['defense'])
      summary[key] = r['perplexity']
  return summary


def _paper_utility(cfg, spec: str):
  """(perplexity, perplexity / the paper's undefended one, source) of the
  paper cell that matches `spec`, or None."""
  if spec in ('none', 'freeze'):
    value = _paper_table5(cfg, spec)
    base = _paper_table5(cfg, 'none')
    if value is not None:
      return value, value / base, 'Table 5'
    if spec == 'freeze' or cfg.init != 'pretrained':
      return None
  if cfg.init != 'pretrained' or spec not in PAPER_TABLE4_PERPLEXITY:
    return None
  value = PAPER_TABLE4_PERPLEXITY[spec]
  return value, value / PAPER_TABLE4_PERPLEXITY['none'], 'Table 4'


def utility_markdown(cfg, rows: list[dict], extra: dict) -> str:
  """FILM Tables 4-5's perplexity columns beside ours."""
  by = {r['defense']: r for r in rows if r.get('kind') == 'utility'}
  base = by.get('none', {}).get('perplexity')
  table = []
  for spec in ['start', *cfg.defenses]:
    r = by.get(spec)
    if r is None:
      continue
    ppl = r['perplexity']
    paper = _paper_utility(cfg, spec) if spec != 'start' else None
    sigma = r.get('noise_multiplier')
    table.append(
      [
        spec,
        f'{sigma:.3f}' if sigma or spec.startswith('dpsigma:') else '–',
        f'{ppl:.2f}',
        f'{ppl / base:.3f}' if base and spec != 'start' else '–',
        f'{paper[0]:.2f}' if paper else '–',
        f'{paper[1]:.3f}' if paper else '–',
        paper[2] if paper else '–',
        f'{r["seconds"]:.0f}' if r.get('seconds') else '–',
      ]
    )
  return (
    '# FILM defenses: what they cost in utility\n\n'
    f'Model `{cfg.model}` ({cfg.init}), data `{cfg.data}`,'
    f' {extra.get("num_train", "?")} training sentences; every row trains'
    f' t = {cfg.train_steps} steps of b = {cfg.train_batch_size} at'
    f' learning rate {cfg.learning_rate:g} (linear decay) with the'
    " defense on every step's gradient, then measures the perplexity of"
    ' the held-out split (`start`: before training). DP-SGD: clip'
    f' C = {cfg.dp_clip:g}, δ = {cfg.dp_delta:g}, σ calibrated for these'
    ' steps at sampling rate b/N (`dp:ε`) or given (`dpsigma:σ`; σ = 0'
    ' clips and adds no noise). "paper" is FILM Table 4 (GPT-2 fine-tuned'
    ' from pretrained on WikiText-103: pruning and DP-SGD rows) or Table 5'
    ' (frozen vs. trained embeddings, from scratch or pretrained, for the'
    ' corpus named by the data); the ratio columns divide by the'
    ' undefended row of the same source, the comparable quantity across'
    ' models and training lengths.\n\n'
    + io.markdown_table(
      [
        'defense',
        'σ',
        'test perplexity',
        '/ none',
        'paper',
        'paper / none',
        'source',
        'seconds',
      ],
      table,
    )
  )


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.film_report WORKDIR')
  print(rerender_plot(sys.argv[1]))
