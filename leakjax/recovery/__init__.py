"""What more than one paper's attack reads off a gradient.

A paper package (`film`, `dager`, ...) never imports another; the pieces
two of them share live here:

* :mod:`span` -- the span of a projection gradient (:func:`span_of`), the
  distance of a vector to it (:func:`residuals`) and of every token's
  first-layer input to it (:func:`span_residuals`): DAGER's filters and
  test 1 of the tied bag of words;
* :mod:`bag` -- the bag of words from the embedding gradient
  (:func:`bag_mask`, the kernel; :func:`extract_bag`, its host wrapper):
  FILM's first stage and DAGER's hybrid candidates.
"""

from leakjax.recovery import bag, span
from leakjax.recovery.bag import (
  Bag,
  BagEvidence,
  TiedBagConfig,
  bag_mask,
  extract_bag,
)
from leakjax.recovery.span import (
  Span,
  residuals,
  span_of,
  span_residuals,
)

__all__ = [
  'Bag',
  'BagEvidence',
  'Span',
  'TiedBagConfig',
  'bag',
  'bag_mask',
  'extract_bag',
  'residuals',
  'span',
  'span_of',
  'span_residuals',
]
