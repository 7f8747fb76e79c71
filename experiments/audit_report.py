"""Audit report: the answer in words, summary.json and .md, report.html.

Turns an audit's rows (`kind='attack'`: one attack on one batch;
`kind='utility'`: one fine-tuning run), summed up by
:mod:`leakjax.audit.summary` (every cell's strongest attack, every
defense's cost), into

* summary.json: :func:`leakjax.audit.summary.summary_dict`'s keys;
* summary.md: the answer paragraph and one table;
* report.html (:mod:`experiments.audit_html`): the answer, the threat
  models, the leakage-utility frontier, every sentence, the settings.

`python -m experiments.audit_report WORKDIR [--screenshot]` rewrites
summary.* and report.html of a finished run from its config.json,
results.jsonl and facts.json (and report.png with `--screenshot`).
"""

from __future__ import annotations

import json
import types
from typing import Any

from experiments import audit_html, audit_plot, audit_words, browser
from leakjax import io
from leakjax.audit.config import AuditConfig
from leakjax.audit.summary import (
  THREAT_MODELS,
  Cell,
  attack_cells,
  summary_dict,
  utility,
)
from leakjax.errors import LeakjaxError


def _data_name(cfg) -> str:
  return str(getattr(cfg, 'data', None) or 'the quickstart sentences')


def summarize(cfg, run) -> tuple[dict, str]:
  """(summary.json's dict, summary.md's text) of an audit run."""
  cells = attack_cells(cfg, run.results)
  util = utility(run.results)
  extra = run.extra or {}
  table = []
  for c in cells:
    notes = {r.get('note') for r in c.rows} - {'', None}
    table.append(
      [
        c.artefact,
        '–' if c.artefact == 'snapshot' else c.b,
        c.defense,
        c.attack + (f' ({", ".join(sorted(notes))})' if notes else ''),
        c.exact,
        c.rouge_l,
        '–' if c.entities is None else c.entities,
        audit_words.ratio_cell(util, c),
      ]
    )
  md = (
    f'# Leakage audit: {extra.get("model") or cfg.model} on'
    f' {_data_name(cfg)}\n\n{" ".join(audit_words.answer(cfg, cells, util))}\n\n'
    f'{audit_words.perplexity_line(cfg, util, extra)}\n\n'
    'Per cell the strongest attack of each batch, averaged over batches.'
    ' `exact`: fraction of the sentences recovered token for token;'
    ' `entities`: fraction of their named entities found verbatim;'
    ' perplexity ratio: held-out perplexity after the same fine-tuning'
    ' with the defense over without it (mean ± std over seeds).'
    + (
      ' Hidden states have none: their noise is added at inference, which'
      ' the fine-tuning does not measure.'
      * any(not audit_words.has_cost(c.artefact) for c in cells)
    )
    + ' The full report, sentence by sentence: [report.html](report.html).\n\n'
    + io.markdown_table(
      [
        'artefact',
        'b',
        'defense',
        'attack',
        'exact',
        'ROUGE-L',
        'entities',
        'perplexity ratio',
      ],
      table,
    )
  )
  return summary_dict(cells, util), md


# ------------------------------------------------------------------- page
def _nth(row: dict, key: str, i: int, default):
  """`row[key][i]`, or `default` where the list is missing or short."""
  values = row.get(key) or []
  return values[i] if i < len(values) and values[i] is not None else default


def _sentence_group(cell: Cell, title: str) -> audit_html.SentenceGroup:
  rows = [
    dict(
      original=original,
      matched=_nth(r, 'matched', i, ''),
      exact=bool(_nth(r, 'exact_each', i, False)),
      entities=list(_nth(r, 'original_entities', i, [])),
      leaked=list(_nth(r, 'leaked_entities', i, [])),
    )
    for r in cell.rows
    for i, original in enumerate(r.get('originals') or [])
  ]
  return audit_html.SentenceGroup(title, rows[: audit_html.MAX_ROWS], len(rows))


def _group_title(cell: Cell) -> str:
  b = '' if cell.artefact == 'snapshot' else f', b = {cell.b}'
  return (
    f'{cell.artefact}{b}, {audit_words.defense_words(cell.defense, cell.artefact)}'
    f' ({audit_words.attack_words(cell.attack)}): {cell.hits} of {cell.total}'
    f' verbatim, ROUGE-L {cell.rouge_l:.2f}'
    + (f', entities {cell.entities:.2f}' if cell.entities is not None else '')
  )


def _panel(artefact: str) -> str:
  base, _, layer = artefact.partition(':')
  if base == 'hidden':
    return (
      f'hidden states, {audit_words.layer_words(artefact)}'
      if layer
      else 'hidden states'
    )
  return audit_words.PANEL_NAMES.get(base, artefact)


def build_page(cfg, run) -> audit_html.Page:
  cells = attack_cells(cfg, run.results)
  util = utility(run.results)
  extra = run.extra or {}
  points = []
  for c in cells:
    ratio = util.ratio.get(c.defense) if util else None
    ratio = ratio if audit_words.has_cost(c.artefact) else None
    points.append(
      audit_plot.Point(
        panel=_panel(c.artefact),
        b=c.b,
        defense=c.defense,
        exact=c.exact,
        rouge_l=c.rouge_l,
        entities=c.entities,
        ratio=ratio[0] if ratio else None,
        ratio_std=ratio[1] if ratio else 0.0,
      )
    )
  notes = {}
  for c in cells:
    if not audit_words.has_cost(c.artefact):
      notes[_panel(c.artefact)] = 'noise at inference: no fine-tuning cost'
    elif util is None:
      notes[_panel(c.artefact)] = 'no fine-tuning ran'
    elif not util.measurable:
      notes[_panel(c.artefact)] = 'fine-tuning too short to show a cost'
  threats, sentences = [], []
  told = extra.get('threat_models') or {}
  for base in dict.fromkeys(c.artefact.partition(':')[0] for c in cells):
    names = dict.fromkeys(  # every attack that ran, not only the best
      r['attack']
      for r in run.results
      if r.get('kind') == 'attack' and r['artefact'].partition(':')[0] == base
    )
    attacks = '; '.join(
      f'{audit_words.ATTACKS[a][0]} ({audit_words.ATTACKS[a][1]})'
      if a in audit_words.ATTACKS
      else a
      for a in names
    )
    threats.append(
      (
        _panel(base),
        told.get(base) or THREAT_MODELS.get(base, ''),
        attacks,
      )
    )
  for _, mine in audit_words.at_largest_b(cells):
    groups = [_sentence_group(c, _group_title(c)) for c in mine]
    sentences.append((groups[0], groups[1:]))
  return audit_html.Page(
    title=f'Leakage audit: {extra.get("model") or cfg.model} on'
    f' {_data_name(cfg)}',
    answer=audit_words.answer(cfg, cells, util),
    perplexity=audit_words.perplexity_line(cfg, util, extra),
    threats=threats,
    points=points,
    x_notes=notes,
    sentences=sentences,
    settings=audit_html.settings_rows(cfg),
    facts=audit_html.facts_rows(
      str(extra.get('model') or cfg.model), _data_name(cfg), extra
    ),
  )


def write(writer, cfg, run) -> dict:
  """summary.json, summary.md and report.html; returns the summary."""
  summary, markdown = summarize(cfg, run)
  writer.write_summary(summary, markdown)
  if writer.enabled:
    io.atomic_write_text(
      writer.workdir / 'report.html', audit_html.page(build_page(cfg, run))
    )
  return summary


class _Folder:
  """A finished run's folder as :func:`write` writes to it."""

  enabled = True

  def __init__(self, workdir):
    self.workdir = io.as_path(workdir)

  def write_summary(self, summary, markdown: str) -> None:
    io.atomic_write_text(
      self.workdir / 'summary.json',
      json.dumps(io.jsonable(dict(summary)), indent=2, sort_keys=True),
    )
    io.atomic_write_text(self.workdir / 'summary.md', markdown)


def load_run(workdir) -> tuple[AuditConfig, Any]:
  """(config, run) of a finished audit's folder; a config field this
  version lacks is dropped, one it added takes its default."""
  workdir = io.as_path(workdir)
  for name in ('config.json', 'results.jsonl'):
    if not (workdir / name).exists():
      raise LeakjaxError(f'{workdir / name} does not exist', 'name a workdir')
  stored = json.loads((workdir / 'config.json').read_text())
  cfg = io.config_from_json(AuditConfig, stored)
  rows = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  facts = workdir / 'facts.json'  # the runner's `AuditRun.extra`
  extra = json.loads(facts.read_text()) if facts.exists() else {}
  return cfg, types.SimpleNamespace(results=rows, extra=extra)


# CSS pixels of the page in report.png.
SCREENSHOT_HEIGHT = 1500


def rerender(workdir, screenshot: bool = False) -> list[str]:
  """Rewrites summary.*, report.html (and report.png) of a finished run;
  returns the paths written."""
  cfg, run = load_run(workdir)
  folder = _Folder(workdir)
  write(folder, cfg, run)
  names = ['summary.json', 'summary.md', 'report.html']
  if screenshot:
    # What a reader sees first: the answer, the threat models, the frontier.
    browser.screenshot(
      folder.workdir / 'report.html',
      folder.workdir / 'report.png',
      height=SCREENSHOT_HEIGHT,
    )
    names.append('report.png')
  return [str(folder.workdir / n) for n in names]


def main(argv: list[str]) -> None:
  """`python -m experiments.audit_report [--screenshot] WORKDIR`."""
  import sys  # pylint: disable=g-import-not-at-top

  shot = '--screenshot' in argv
  argv = [a for a in argv if a != '--screenshot']
  if len(argv) != 1 or argv[0].startswith('-'):
    sys.exit('usage: python -m experiments.audit_report WORKDIR [--screenshot]')
  try:
    print('\n'.join(rerender(argv[0], screenshot=shot)))
  except LeakjaxError as e:
    sys.exit(f'leakjax: error: {e}')


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
