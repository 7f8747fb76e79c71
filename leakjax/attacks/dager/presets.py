"""DAGER's presets (:class:`leakjax.presets.Presets` of
:class:`DagerConfig`).

* `paper` -- DAGER's own protocol (Petrov et al., NeurIPS 2024): the exact
  attack alone, DAGER's defaults.
* `strongest` -- exact DAGER where it applies, and past the rank limit
  (:func:`runner.past_rank_limit`) the hybrid with allocated starts, the LM
  prior after `<|endoftext|>`, the head rows' log-likelihood ratio, half
  again as many searches as the batch holds and the whitened, equally
  weighted selection among their cuts.

  from leakjax.attacks.dager import presets
  cfg = presets.config('strongest', batch_sizes=(64,))
"""

from __future__ import annotations

from leakjax.attacks.dager import runner
from leakjax.presets import Preset, Presets

PRESETS = Presets(
  runner.DagerConfig,
  default='strongest',
  paper=Preset(
    description="DAGER's protocol: the exact attack alone",
    fields={'attacks': ('dager',)},
    chosen="Petrov et al., NeurIPS 2024 (the paper's attack and defaults)",
    measured='reports/dager/ (the exact rows)',
  ),
  strongest=Preset(
    description=(
      'exact DAGER below the rank limit, the strongest hybrid past it'
    ),
    fields={
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
    },
    chosen=(
      'reports/dager/hybrid_evidence_oversample/ (SmolLM2, Enron, b = 64,'
      ' batches 0-2)'
    ),
    measured=(
      'reports/dager/hybrid_evidence_oversample_heldout/ (batches 3-8)'
    ),
  ),
)
DEFAULT = PRESETS.default
config = PRESETS.config
overrides = PRESETS.overrides

__all__ = ['DEFAULT', 'PRESETS', 'config', 'overrides']
