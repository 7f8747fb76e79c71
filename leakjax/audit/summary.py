"""The audit's numbers: every cell's strongest attack and every defense's
cost, from the rows of :func:`leakjax.audit.run`.

* :func:`attack_cells` -- per (artefact, b, defense) the strongest attack of
  each batch (the most exact recoveries, then the highest ROUGE-L: an
  attacker runs them all and keeps the best), averaged over batches;
* :func:`utility` -- the fine-tuning runs' held-out perplexities and each
  defense's ratio to the undefended run of the same seed; a cost is
  `measurable` only when the undefended fine-tuning moved the perplexity
  by more than 5% and by more than three standard deviations over seeds
  (a shorter run would show every defense at about 1.0x, as if free);
* :func:`summary_dict` -- both as summary.json keys,
  `exact@artefact=gradient,b=16,defense=dp:8`, `rougeL@...`,
  `entities@...`, `attack@...` (no b for the snapshot pair),
  `perplexity_before`, `perplexity_after@defense=D`,
  `perplexity_ratio@defense=D`, their `_std`, `utility_measurable`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from leakjax import io

# What the attacker sees and knows, per artefact (the report's threat
# model; the audit writes it into its facts).
THREAT_MODELS = {
  'gradient': (
    'An honest-but-curious server (or an eavesdropper) reads one'
    " client's FedSGD gradient of a batch of b sentences; it knows the"
    ' model and its weights (FILM Sec. 3.3, DAGER Sec. 3).'
  ),
  'update': (
    "The server reads one client's FedAvg update (the weights after"
    ' local SGD steps minus the weights before) and knows the local'
    ' learning rate and step count (DAGER Sec. 5, Table 4).'
  ),
  'snapshot': (
    'Anyone with the model before and after fine-tuning on the user'
    "'s sentences compares the two (Zanella-Beguelin et al., CCS 2020)."
  ),
  'hidden': (
    'A model provider receives the hidden states of one layer (split'
    ' inference) and holds the model (Wan et al. 2024, Sec. 3).'
  ),
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


__all__ = [
  'THREAT_MODELS',
  'Cell',
  'Utility',
  'attack_cells',
  'summary_dict',
  'utility',
]
