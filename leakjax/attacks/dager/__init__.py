"""Exact batch recovery from attention-gradient spans (DAGER and beyond).

Petrov et al., "DAGER: Exact Gradient Inversion for Large Language Models",
NeurIPS 2024 (arXiv 2405.15586). Read top-down from :mod:`runner`:

* :mod:`span` -- the span of a projection gradient, and distances to it;
* :mod:`search` -- the kernels: the layer-1 token filter and the layer-2
  sequence search (one `lax.while_loop`);
* :mod:`pipeline` -- :func:`recover` on one gradient, with the last token
  of each sentence read off the head gradient;
* :mod:`hybrid` -- past the rank limit, FILM's bag and beam search scored
  by block 2's span (:func:`hybrid.recover`);
* :mod:`runner` -- the experiment: batches, FedSGD gradients, metrics.
"""

from leakjax.attacks.dager import hybrid
from leakjax.attacks.dager.pipeline import (
  DagerConfig,
  DagerResult,
  complete_last_tokens,
  recover,
)
from leakjax.attacks.dager.search import (
  SearchState,
  SpanConfig,
  block_gradient,
  search_step,
  sequence_search,
  token_filter,
)
from leakjax.attacks.dager.span import Span, residuals, span_of

__all__ = [
  'DagerConfig',
  'DagerResult',
  'SearchState',
  'Span',
  'SpanConfig',
  'block_gradient',
  'hybrid',
  'complete_last_tokens',
  'recover',
  'residuals',
  'sequence_search',
  'search_step',
  'span_of',
  'token_filter',
]
