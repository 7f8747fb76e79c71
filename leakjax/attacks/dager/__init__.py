"""Exact batch recovery from attention-gradient spans (DAGER and beyond).

Petrov et al., "DAGER: Exact Gradient Inversion for Large Language Models",
NeurIPS 2024 (arXiv 2405.15586). Read top-down from :mod:`runner`:

* :mod:`search` -- the kernels: the layer-1 token filter and the layer-2
  sequence search (one `lax.while_loop`), on the span of a projection
  gradient (:mod:`leakjax.recovery.span`);
* :mod:`pipeline` -- :func:`recover` on one gradient, with the last token
  of each sentence read off the head gradient;
* :mod:`hybrid` -- past the rank limit, FILM's bag and beam search scored
  by block 2's span (:func:`hybrid.recover`);
* :mod:`presets` -- the named configs (`paper`, `strongest`);
* :mod:`runner` -- the experiment (:class:`DagerConfig`, :func:`run`):
  batches, FedSGD gradients, metrics.
"""

from leakjax.attacks.dager import hybrid, presets, runner
from leakjax.attacks.dager.pipeline import (
  DagerAttackConfig,
  DagerResult,
  complete_last_tokens,
  recover,
)
from leakjax.attacks.dager.runner import DagerConfig, DagerRun, run
from leakjax.attacks.dager.search import (
  SearchState,
  SpanConfig,
  block_gradient,
  search_step,
  sequence_search,
  token_filter,
)

__all__ = [
  'DagerAttackConfig',
  'DagerConfig',
  'DagerResult',
  'DagerRun',
  'SearchState',
  'SpanConfig',
  'block_gradient',
  'hybrid',
  'complete_last_tokens',
  'recover',
  'run',
  'presets',
  'runner',
  'sequence_search',
  'search_step',
  'token_filter',
]
