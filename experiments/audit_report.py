"""Audit report: the answer in words, summary.json and .md, report.html.

Turns an audit's rows (`kind='attack'`: one attack on one batch;
`kind='utility'`: one fine-tuning run) into

* summary.json: per (artefact, b, defense) cell the strongest attack's
  means over batches, `exact@artefact=gradient,b=16,defense=dp:8`,
  `rougeL@...`, `entities@...` and its name `attack@...` (no b for the
  snapshot pair); the utility keys `perplexity_before`,
  `perplexity_after@defense=D` (mean over seeds) and
  `perplexity_ratio@defense=D` (mean over seeds of the ratio to the
  undefended run of the same seed), their `_std`, and `utility_measurable`;
* summary.md: the answer paragraph and one table;
* report.html (:mod:`experiments.audit_html`): the answer, the threat
  models, the leakage-utility frontier, every sentence, the settings.

The strongest attack of a batch is the one with the most exact recoveries,
then the highest ROUGE-L: an attacker runs them all and keeps the best.
A defense's cost is shown only when the undefended fine-tuning moved the
held-out perplexity by more than 5% and by more than three standard
deviations over seeds (:func:`utility`): a shorter run would show every
defense at about 1.0x, as if free.

`python -m experiments.audit_report WORKDIR [--screenshot]` rewrites
summary.* and report.html of a finished run from its config.json,
results.jsonl and facts.json (and report.png with `--screenshot`).
"""

from __future__ import annotations

import dataclasses
import json
import types
from typing import Any

import numpy as np

from experiments import audit_html
from leakjax import io
from leakjax.audit.config import AuditConfig, parse_defense
from leakjax.errors import LeakjaxError

# ROUGE-L from which a recovery without exact sentences is still worth
# saying: a fifth of each sentence's words come back in order.
HIGH_ROUGE = 0.2

ATTACKS = {  # name in words, citation
  'dager': ('DAGER', 'Petrov et al., NeurIPS 2024'),
  'film': ('FILM', 'Gupta et al., NeurIPS 2022'),
  'hybrid': (
    'hybrid',
    "leakjax's hybrid: FILM's bag of words searched with DAGER's span tests",
  ),
  'differential': (
    'differential rank search',
    'Zanella-Béguelin et al., CCS 2020',
  ),
  'bei': ('BEI', 'Wan et al. 2024'),
  'hei': ('HEI', 'Wan et al. 2024'),
  'ridge': (
    'ridge inverse',
    "a linear inverse of the layer fitted on the attacker's own text",
  ),
  'exact': (
    'exact inversion',
    "Nikolaou et al., arXiv 2510.15511; proposals: leakjax's softmax inverse",
  ),
}

THREAT_MODELS = {
  'gradient': 'The server, or anyone who reads a client message, sees one'
  " FedSGD gradient of every weight, computed on b of the user's"
  ' sentences, and knows the model (weights, tokenizer, architecture).',
  'update': 'The server sees one FedAvg client update: the change of every'
  " weight after the client's local SGD steps over b sentences; it knows"
  ' the starting weights, the learning rate and the number of steps.',
  'snapshot': 'Anyone holding both releases of the model, before and after'
  " fine-tuning on the user's data, can query both for next-token"
  " probabilities; they know nothing of the user's text.",
  'hidden': 'A provider that runs the model past a split layer sees the'
  " hidden states of the user's sentences at that layer, knows the model"
  ' and can run it on text of its own.',
}

PANEL_NAMES = {
  'gradient': 'client gradient',
  'update': 'FedAvg update',
  'snapshot': 'model before/after',
}


@dataclasses.dataclass
class Cell:
  """One (artefact, b, defense): the strongest attack of each batch."""

  artefact: str
  b: int
  defense: str
  rows: list[dict]  # the best row of each batch, in results order
  attack: str
  exact: float
  rouge_l: float
  entities: float | None
  total: int  # sentences attacked, over batches
  hits: int  # of them read back verbatim


@dataclasses.dataclass
class Utility:
  before: float
  after: dict[str, tuple[float, float, int]]  # defense -> mean, std, seeds
  ratio: dict[str, tuple[float, float, int]]  # empty when not measurable
  measurable: bool


def _std(xs) -> float:
  return float(np.std(xs, ddof=1)) if len(xs) >= 2 else 0.0


def attack_cells(cfg, results: list[dict]) -> list[Cell]:
  """The cells of the attack rows, in the config's order (artefacts,
  then b, then defenses as listed)."""
  best: dict[tuple, tuple[int, dict]] = {}
  for i, r in enumerate(results):
    if r.get('kind') != 'attack':
      continue
    key = (r['artefact'], r['b'], r['defense'], r['batch'])
    if key not in best or (r['exact'], r['rougeL']) > (
      best[key][1]['exact'],
      best[key][1]['rougeL'],
    ):
      best[key] = (i, r)
  groups: dict[tuple, list[tuple[int, dict]]] = {}
  for (artefact, b, defense, _), found in best.items():
    groups.setdefault((artefact, b, defense), []).append(found)
  cells = []
  for (artefact, b, defense), found in groups.items():
    rows = [r for _, r in sorted(found, key=lambda x: x[0])]
    entities = [r['entities'] for r in rows if r.get('entities') is not None]
    exact = float(np.mean([r['exact'] for r in rows]))
    total = sum(len(r.get('originals') or ()) or b for r in rows)
    cells.append(
      Cell(
        artefact=artefact,
        b=b,
        defense=defense,
        rows=rows,
        attack='+'.join(dict.fromkeys(r['attack'] for r in rows)),
        exact=exact,
        rouge_l=float(np.mean([r['rougeL'] for r in rows])),
        entities=float(np.mean(entities)) if entities else None,
        total=total,
        hits=round(exact * total),
      )
    )
  order = list(dict.fromkeys(a for a, _, _ in cfg.cells()))
  order += [c.artefact for c in cells if c.artefact not in order]
  defenses = list(cfg.defenses)
  defenses += [c.defense for c in cells if c.defense not in defenses]
  cells.sort(
    key=lambda c: (
      order.index(c.artefact),
      c.b,
      defenses.index(c.defense),
    )
  )
  return cells


def utility(results: list[dict]) -> Utility | None:
  """The fine-tuning runs' perplexities; None without any."""
  rows = [r for r in results if r.get('kind') == 'utility']
  if not rows:
    return None
  by_defense: dict[str, dict[int, float]] = {}
  for r in rows:
    by_defense.setdefault(r['defense'], {})[r['seed']] = r['ppl_after']
  before = float(np.mean([r['ppl_before'] for r in rows]))
  after = {
    d: (float(np.mean(list(v.values()))), _std(list(v.values())), len(v))
    for d, v in by_defense.items()
  }
  base = by_defense.get('none', {})
  measurable = bool(base) and before - after['none'][0] > max(
    0.05 * before, 3 * after['none'][1]
  )
  ratio = {}
  for d, v in by_defense.items():
    ratios = [v[s] / base[s] for s in v if s in base]
    if measurable and ratios:
      ratio[d] = (float(np.mean(ratios)), _std(ratios), len(ratios))
  return Utility(before, after, ratio, measurable)


def _params(cell: Cell) -> dict[str, Any]:
  if cell.artefact == 'snapshot':
    return dict(artefact=cell.artefact, defense=cell.defense)
  return dict(artefact=cell.artefact, b=cell.b, defense=cell.defense)


def summary_dict(cells: list[Cell], util: Utility | None) -> dict:
  summary: dict[str, float | str] = {}
  for c in cells:
    p = _params(c)
    summary[io.summary_key('exact', **p)] = c.exact
    summary[io.summary_key('rougeL', **p)] = c.rouge_l
    if c.entities is not None:
      summary[io.summary_key('entities', **p)] = c.entities
    summary[io.summary_key('attack', **p)] = c.attack
  if util is None:
    return summary
  summary['perplexity_before'] = util.before
  for d, (mean, std, _) in util.after.items():
    summary[io.summary_key('perplexity_after', defense=d)] = mean
    summary[io.summary_key('perplexity_after_std', defense=d)] = std
  for d, (mean, std, _) in util.ratio.items():
    summary[io.summary_key('perplexity_ratio', defense=d)] = mean
    summary[io.summary_key('perplexity_ratio_std', defense=d)] = std
  summary['utility_measurable'] = int(util.measurable)
  return summary


# ------------------------------------------------------------------ words
def defense_words(spec: str, artefact: str = 'gradient') -> str:
  """'dp:8' -> 'DP-SGD at ε = 8', 'prune:0.99' -> 'pruning 99% of each
  gradient', 'freeze' -> 'frozen embeddings', 'noise:1e-6' -> 'Gaussian
  noise σ = 1e-06'."""
  try:
    kind, value = parse_defense(spec)
  except LeakjaxError:
    return spec
  sent = 'update' if artefact == 'update' else 'gradient'
  return {
    'none': 'no defense',
    'dp': f'DP-SGD at ε = {value:g}',
    'prune': f'pruning {value * 100:g}% of each {sent}',
    'freeze': 'frozen embeddings',
    'noise': f'Gaussian noise σ = {value:g}',
  }[kind]


def attack_words(name: str) -> str:
  """'dager' -> 'DAGER'; 'dager+film' -> 'DAGER+FILM'."""
  return '+'.join(ATTACKS.get(a, (a, ''))[0] for a in name.split('+'))


def _layer(artefact: str) -> str:
  layer = artefact.partition(':')[2]
  return 'the last layer' if layer == 'last' else f'layer {layer}'


def _opening(cell: Cell, cfg) -> str:
  base = cell.artefact.partition(':')[0]
  if base == 'gradient':
    return f'From one client gradient at b = {cell.b}'
  if base == 'update':
    steps = getattr(cfg, 'local_steps', None)
    return f'From one FedAvg client update at b = {cell.b}' + (
      f' ({steps} local steps)' if steps else ''
    )
  if base == 'snapshot':
    return 'From the model before and after fine-tuning'
  if base == 'hidden':
    return f'From hidden states at {_layer(cell.artefact)} (b = {cell.b})'
  return f'From {cell.artefact} at b = {cell.b}'


def _first_clause(cell: Cell, short: bool) -> str:
  """How much the undefended (first) cell gives away, with its attack."""
  attack = f'({attack_words(cell.attack)})'
  if cell.hits == 0 and cell.rouge_l >= HIGH_ROUGE:
    if short:
      return f'none verbatim, ROUGE-L {cell.rouge_l:.2f} {attack}'
    return (
      f'none of the {cell.total} sentences is read back verbatim, though'
      f' the recovery reaches ROUGE-L {cell.rouge_l:.2f} {attack}'
    )
  if short:
    return f'{cell.hits} of {cell.total} {attack}'
  verb = 'is' if cell.hits == 1 else 'are'
  if cell.artefact == 'snapshot':
    # The search extracts openings of the sentences (`snapshot_length`
    # tokens): one is read back when it is among the extracted sequences.
    if cell.hits == 0:
      return (
        f"none of the user's {cell.total} sentence openings is among the"
        f' extracted sequences {attack}'
      )
    return (
      f"{cell.hits} of {cell.total} of the user's sentence openings {verb}"
      f' among the extracted sequences {attack}'
    )
  noun = 'sentence' if cell.total == 1 else 'sentences'
  return (
    f'{cell.hits} of {cell.total} {noun} {verb} read back verbatim {attack}'
  )


def has_cost(artefact: str) -> bool:
  """Whether the fine-tuning's perplexity is the cost of a defense of
  `artefact`: not for hidden states, where noise is added at inference
  and the fine-tuning's gradient noise is another thing."""
  return not artefact.startswith('hidden')


class _Costs:
  """A defense's cost in words: with its spread the first time, then the
  ratio alone; "too short to show a cost" once where there is none."""

  def __init__(self, util: Utility | None):
    self.util = util
    self.said = False

  def __call__(self, defense: str, artefact: str) -> str:
    u = self.util
    if u is None or defense not in u.after or not has_cost(artefact):
      return ''
    if not u.measurable:
      if self.said:
        return ''
      self.said = True
      return (
        ' (the fine-tuning was too short to show a cost: held-out'
        f' perplexity {u.before:.2f} before, {u.after["none"][0]:.2f} after)'
        if 'none' in u.after
        else ' (no undefended fine-tuning to measure a cost against)'
      )
    if defense not in u.ratio:
      return ''
    mean, std, n = u.ratio[defense]
    if self.said:
      return f' at {mean:.2f}x'
    self.said = True
    spread = f'±{std:.2f} over {n} seeds' if n >= 2 else '1 seed'
    return f' at {mean:.2f}x the perplexity ({spread})'


def _defense_clause(cell: Cell, first: Cell, cost: str) -> str:
  words = defense_words(cell.defense, cell.artefact)
  plural = cell.defense == 'freeze'  # "frozen embeddings leave"
  leave = 'leave' if plural else 'leaves'
  if cell.hits == 0 and cell.rouge_l >= HIGH_ROUGE:
    text = f'{words} {leave} none verbatim, ROUGE-L {cell.rouge_l:.2f}'
  elif cell.hits == 0 and first.hits > 0:
    text = f'{words} {"bring" if plural else "brings"} that to 0'
  else:
    text = f'{words} {leave} {cell.hits} of {cell.total}'
  return text + cost


def at_largest_b(cells: list[Cell]):
  """(artefact, its cells at its largest b, no defense first), artefact by
  artefact: what the answer and the sentence table show."""
  for artefact in dict.fromkeys(c.artefact for c in cells):
    b = max(c.b for c in cells if c.artefact == artefact)
    mine = [c for c in cells if (c.artefact, c.b) == (artefact, b)]
    yield artefact, sorted(mine, key=lambda c: c.defense != 'none')


def answer(cfg, cells: list[Cell], util: Utility | None) -> list[str]:
  """One sentence per artefact at its largest b (hidden layers share
  one): what the attacker reads back without a defense, then under each
  defense with its cost."""
  costs = _Costs(util)
  sentences: dict[str, list[str]] = {}
  for artefact, mine in at_largest_b(cells):
    first = mine[0]
    base = artefact.partition(':')[0]
    parts = sentences.setdefault(base, [])
    if parts:  # another layer of hidden states
      head = f'at {_layer(artefact)}, {_first_clause(first, short=True)}'
    else:
      how = (
        'without a defense'
        if first.defense == 'none'
        else f'with {defense_words(first.defense, artefact)}'
      )
      head = f'{_opening(first, cfg)} {how}, {_first_clause(first, False)}'
    parts.append(
      '; '.join(
        [head]
        + [
          _defense_clause(c, first, costs(c.defense, artefact))
          for c in mine[1:]
        ]
      )
    )
  return ['; '.join(p) + '.' for p in sentences.values()]


def perplexity_line(cfg, util: Utility | None, extra: dict) -> str:
  if util is None:
    return 'No fine-tuning ran: no defense has a measured cost.'
  heldout = extra.get('num_heldout')
  steps = getattr(cfg, 'finetune_steps', None)
  seeds = max(n for _, _, n in util.after.values())
  afters = ', '.join(
    f'{m:.2f} with {defense_words(d)}'
    if d != 'none'
    else f'{m:.2f} without a defense'
    for d, (m, _, _) in util.after.items()
  )
  return (
    'Held-out perplexity'
    + (f' ({heldout} sentences)' if heldout else '')
    + f': {util.before:.2f} before fine-tuning; after'
    + (f' {steps} steps' if steps else ' it')
    + f' {afters} (mean over {seeds} seed{"s" * (seeds != 1)}).'
  )


def _ratio_cell(util: Utility | None, cell: Cell) -> str:
  defense = cell.defense
  if util is None or defense not in util.after or not has_cost(cell.artefact):
    return '–'
  if not util.measurable:
    return 'too short to show'
  if defense == 'none':
    return 'baseline'
  if defense not in util.ratio:
    return '–'
  mean, std, _ = util.ratio[defense]
  return f'{mean:.2f}x ± {std:.2f}'


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
        _ratio_cell(util, c),
      ]
    )
  md = (
    f'# Leakage audit: {extra.get("model") or cfg.model} on'
    f' {_data_name(cfg)}\n\n{" ".join(answer(cfg, cells, util))}\n\n'
    f'{perplexity_line(cfg, util, extra)}\n\n'
    'Per cell the strongest attack of each batch, averaged over batches.'
    ' `exact`: fraction of the sentences recovered token for token;'
    ' `entities`: fraction of their named entities found verbatim;'
    ' perplexity ratio: held-out perplexity after the same fine-tuning'
    ' with the defense over without it (mean ± std over seeds).'
    + (
      ' Hidden states have none: their noise is added at inference, which'
      ' the fine-tuning does not measure.'
      * any(not has_cost(c.artefact) for c in cells)
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
    f'{cell.artefact}{b}, {defense_words(cell.defense, cell.artefact)}'
    f' ({attack_words(cell.attack)}): {cell.hits} of {cell.total}'
    f' verbatim, ROUGE-L {cell.rouge_l:.2f}'
    + (f', entities {cell.entities:.2f}' if cell.entities is not None else '')
  )


def _panel(artefact: str) -> str:
  base, _, layer = artefact.partition(':')
  if base == 'hidden':
    return f'hidden states, {_layer(artefact)}' if layer else 'hidden states'
  return PANEL_NAMES.get(base, artefact)


def build_page(cfg, run) -> audit_html.Page:
  cells = attack_cells(cfg, run.results)
  util = utility(run.results)
  extra = run.extra or {}
  points = []
  for c in cells:
    ratio = util.ratio.get(c.defense) if util else None
    ratio = ratio if has_cost(c.artefact) else None
    points.append(
      audit_html.Point(
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
    if not has_cost(c.artefact):
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
      f'{ATTACKS[a][0]} ({ATTACKS[a][1]})' if a in ATTACKS else a for a in names
    )
    threats.append(
      (_panel(base), told.get(base) or THREAT_MODELS.get(base, ''), attacks)
    )
  for _, mine in at_largest_b(cells):
    groups = [_sentence_group(c, _group_title(c)) for c in mine]
    sentences.append((groups[0], groups[1:]))
  return audit_html.Page(
    title=f'Leakage audit: {extra.get("model") or cfg.model} on'
    f' {_data_name(cfg)}',
    answer=answer(cfg, cells, util),
    perplexity=perplexity_line(cfg, util, extra),
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
  names = {f.name for f in dataclasses.fields(AuditConfig)}
  cfg = AuditConfig(
    **{
      k: tuple(v) if isinstance(v, list) else v
      for k, v in stored.items()
      if k in names
    }
  )
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
    audit_html.screenshot(
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
