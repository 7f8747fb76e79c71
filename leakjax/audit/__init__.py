"""The audit: how much of the user's text each artefact of their system
leaks at worst, and what each defense costs.

* :mod:`config` -- :class:`AuditConfig`: the model, the corpus, the
  artefacts (gradient, update, snapshot, hidden), the defenses;
* :mod:`runner` -- :func:`run`: every cell's strongest attack and every
  defense's fine-tuning, rows into an :class:`leakjax.io.ExperimentWriter`;
* :mod:`client`, :mod:`hidden`, :mod:`snapshot`, :mod:`utility`,
  :mod:`scoring` -- what a client sends, the hidden-state and snapshot
  attacks, the utility cost, what a person reads off a recovery;
* :mod:`summary` -- every cell's strongest attack and every defense's
  cost, read off the rows (what the report states).

The audit runs the attack packages' own functions (DAGER's
`attack_gradient`, FILM's pipeline, Wan et al.'s BEI/HEI, Algorithm 1 of
Zanella-Beguelin et al.), so its numbers equal theirs on the same inputs.

  python -m experiments.audit --flagfile=experiments/configs/audit_quick.flags
"""

from leakjax.audit import (
  client,
  config,
  hidden,
  runner,
  scoring,
  snapshot,
  summary,
  utility,
)
from leakjax.audit.config import (
  ARTEFACTS,
  AuditConfig,
  applies,
  parse_defense,
)
from leakjax.audit.runner import AuditRun, run

__all__ = [
  'ARTEFACTS',
  'AuditConfig',
  'AuditRun',
  'applies',
  'client',
  'config',
  'hidden',
  'parse_defense',
  'run',
  'runner',
  'scoring',
  'snapshot',
  'summary',
  'utility',
]
