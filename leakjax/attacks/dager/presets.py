"""Named presets of the DAGER experiment's config, the way optax names its
optimizers: each maps a name to the :class:`DagerConfig` fields it sets
(`hybrid` a dict of :class:`HybridConfig` fields); the rest keep their
defaults, and explicit settings override a preset's.

* `paper` -- DAGER's own protocol (Petrov et al., NeurIPS 2024): the exact
  attack alone, DAGER's defaults.
* `strongest` -- the best measured setting: exact DAGER where it applies,
  and past the rank limit (:func:`runner.past_rank_limit`) the hybrid with
  allocated starts, the LM prior after `<|endoftext|>`, the head rows'
  log-likelihood ratio, half again as many searches as the batch holds and
  the whitened, equally weighted selection among their cuts. Chosen on
  SmolLM2, Enron, b = 64 batches 0-2
  (`reports/dager/hybrid_evidence_oversample/`), measured on the held-out
  batches 3-5 (`reports/dager/hybrid_evidence_oversample_heldout/`).

  from leakjax.attacks.dager import presets
  cfg = presets.config('strongest', batch_sizes=(64,))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from leakjax.attacks.dager import runner
from leakjax.errors import LeakjaxError


def paper() -> dict[str, Any]:
  """DAGER's protocol: the exact attack with DAGER's defaults."""
  return {'attacks': ('dager',)}


def strongest() -> dict[str, Any]:
  """Exact DAGER below the rank limit, the strongest hybrid past it
  (chosen: `reports/dager/hybrid_evidence_oversample/`, b = 64 batches
  0-2; measured: `reports/dager/hybrid_evidence_oversample_heldout/`,
  batches 3-5)."""
  return {
    'attacks': ('dager', 'hybrid'),
    'hybrid_past_limit': True,
    'hybrid': {
      'start_dims': 64,
      'prior_start': 0,
      'weight_evidence': 30.0,
      'oversample': 1.5,
      'cuts': True,
      'select_weight': 1.0,
      'select_whiten': True,
    },
  }


PRESETS = {'paper': paper, 'strongest': strongest}
DEFAULT = 'strongest'


def overrides(name: str) -> dict[str, Any]:
  """The fields preset `name` sets (`hybrid`: a dict of hybrid fields)."""
  if name not in PRESETS:
    raise LeakjaxError(
      f'unknown preset {name!r}', f'use one of {", ".join(PRESETS)}'
    )
  return PRESETS[name]()


def config(name: str = DEFAULT, **fields) -> runner.DagerConfig:
  """The :class:`DagerConfig` of preset `name`, `fields` overriding it
  (`hybrid` may be a dict of hybrid fields, merged into the preset's)."""
  values = overrides(name)
  hybrid = dict(values.pop('hybrid', {}))
  given = fields.pop('hybrid', {})
  if isinstance(given, runner.hybrid.HybridConfig):
    given = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
  hybrid.update(given)
  values.update(fields)
  return runner.DagerConfig(
    **values,
    hybrid=runner.hybrid.HybridConfig(**hybrid),
    preset=name,
  )


__all__ = ['DEFAULT', 'PRESETS', 'config', 'overrides', 'paper', 'strongest']
