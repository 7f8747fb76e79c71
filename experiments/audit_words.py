"""The audit's answer in words: what each cell leaked, what each defense
cost, who the attacker is (:mod:`experiments.audit_report` puts them in
summary.md and report.html).

:func:`answer` gives one sentence per artefact at its largest batch size;
:func:`perplexity_line` what the fine-tuning did to the held-out
perplexity; :func:`defense_words` and :func:`attack_words` name a defense
and an attack as a person would.
"""

from __future__ import annotations

from leakjax.audit.config import parse_defense
from leakjax.audit.summary import Cell, Utility
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

PANEL_NAMES = {
  'gradient': 'client gradient',
  'update': 'FedAvg update',
  'snapshot': 'model before/after',
}


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


def layer_words(artefact: str) -> str:
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
    return f'From hidden states at {layer_words(cell.artefact)} (b = {cell.b})'
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
      head = f'at {layer_words(artefact)}, {_first_clause(first, short=True)}'
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


def ratio_cell(util: Utility | None, cell: Cell) -> str:
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
