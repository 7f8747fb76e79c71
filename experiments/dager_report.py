"""DAGER report: summary keys, the markdown table, the plot against the rank limit.

Turns the rows of :func:`leakjax.attacks.dager.runner.run` into summary.json
(means per setting, keyed by :func:`leakjax.io.summary_key`: `rouge1@b=16`,
`exact@b=16`, `rougeL@b=16,defense=freeze`, `rougeL@attack=film,b=16`),
summary.md and dager_vs_tokens.png (full-batch ROUGE-L and exact match
against the number of input tokens per batch, with the hidden size d: the
span tests need fewer input positions than d).
"""

from __future__ import annotations

import numpy as np

from leakjax import io
from leakjax.attacks.dager import runner

METRICS = ('rouge1', 'rouge2', 'rougeL', 'exact', 'exact_prefix')


def _key_params(cfg, b, defense, attack):
  params = {'b': b}
  if defense != 'none':
    params['defense'] = defense
  if attack != 'dager':
    params['attack'] = attack
  return params


def summarize(cfg: runner.DagerConfig, rows: list[dict], extra: dict):
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r['b'], r['defense'], r['attack']), []).append(r)
  summary: dict[str, float] = {}
  table = []
  for (b, defense, attack), rs in sorted(groups.items()):
    params = _key_params(cfg, b, defense, attack)
    means = {m: float(np.mean([r[m] for r in rs])) for m in METRICS}
    for m, v in means.items():
      summary[io.summary_key(m, **params)] = v
    # Timings stay in results.jsonl and the table: equal runs give equal
    # summaries.
    secs = float(np.mean([r['seconds'] for r in rs]))
    tokens = float(np.mean([r['num_tokens'] for r in rs]))
    limited = sum(bool(r.get('rank_limited')) for r in rs)
    table.append(
      [
        b,
        attack,
        defense,
        len(rs),
        f'{tokens:.0f}',
        f'{means["rouge1"]:.3f}',
        f'{means["rouge2"]:.3f}',
        f'{means["rougeL"]:.3f}',
        f'{means["exact"]:.3f}',
        f'{means["exact_prefix"]:.3f}',
        f'{limited}/{len(rs)}' if attack == 'dager' else '–',
        f'{secs:.1f}',
      ]
    )
  d = extra.get('hidden_size')
  state = (
    f'fine-tuned for {extra.get("trained_steps", cfg.train_steps)} steps'
    if cfg.train_steps
    else 'pretrained, t = 0'
  )
  md = (
    '# DAGER: exact batch recovery from attention-gradient spans\n\n'
    f'Model `{cfg.model}` ({state}, hidden size d = {d}),'
    f' {extra.get("num_sentences")} private sentences; consecutive'
    ' batches. Full-batch ROUGE: each original sentence against its best'
    ' recovered sentence, averaged. `exact`: fraction of originals'
    ' recovered token for token (last token included); `w/o last`: without'
    " the last token (DAGER's own output). `rank-limited`: batches whose"
    ' span tests had no clear rank below the limit (more input positions'
    ' than d). Seconds per batch on this machine, gradient excluded.\n\n'
    + io.markdown_table(
      [
        'b',
        'attack',
        'defense',
        'batches',
        'tokens',
        'ROUGE-1',
        'ROUGE-2',
        'ROUGE-L',
        'exact',
        'w/o last',
        'rank-limited',
        's / batch',
      ],
      table,
    )
  )
  return summary, md


def plot(cfg, rows: list[dict], extra: dict):
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  styles = {'rougeL': ('o-', 'ROUGE-L'), 'exact': ('s--', 'exact match')}
  for attack in sorted({r['attack'] for r in rows}):
    for defense in sorted({r['defense'] for r in rows}):
      rs = [
        r for r in rows if r['attack'] == attack and r['defense'] == defense
      ]
      if not rs:
        continue
      bs = sorted({r['b'] for r in rs})
      x = [np.mean([r['num_tokens'] for r in rs if r['b'] == b]) for b in bs]
      for metric, (style, label) in styles.items():
        if attack == 'film' and metric == 'exact':
          continue
        y = [np.mean([r[metric] for r in rs if r['b'] == b]) for b in bs]
        name = attack if defense == 'none' else f'{attack}, {defense}'
        ax.plot(x, y, style, label=f'{name}: {label}')
        for xi, yi, b in zip(x, y, bs, strict=True):
          ax.annotate(f'b={b}', (xi, yi), fontsize=7, alpha=0.6)
  d = extra.get('hidden_size')
  if d:
    ax.axvline(d, color='grey', linestyle=':', label=f'rank limit (d = {d})')
  ax.set_xscale('log')
  ax.set_xlabel('input tokens per batch')
  ax.set_ylabel('full-batch score')
  ax.set_ylim(-0.02, 1.05)
  ax.legend(fontsize=7, loc='lower left')
  ax.set_title(f'DAGER on {cfg.model}, consecutive Enron batches', fontsize=9)
  fig.tight_layout()
  return fig


def write(writer: io.ExperimentWriter, cfg, dager_run: runner.DagerRun):
  rows = dager_run.results
  summary, md = summarize(cfg, rows, dager_run.extra)
  fig = plot(cfg, rows, dager_run.extra)
  name = writer.save_figure(fig, 'dager_vs_tokens.png')
  md += f'\n\n![ROUGE-L and exact match against tokens per batch]({name})\n'
  writer.write_summary(summary, md)
  return summary
