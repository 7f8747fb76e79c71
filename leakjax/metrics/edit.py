"""Word-level edit distance and the Levenshtein ratio (GBoard Sec. 4.2).

The sequences are lists of words (any hashables); RapidFuzz compares the
elements by their hash, so two distinct words count as equal only if
their 64-bit hashes collide.

>>> levenshtein_ratio('how are you doing'.split(), 'how are you'.split())
85.71428571428572
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Levenshtein


def levenshtein_distance(
  a: Sequence[Any], b: Sequence[Any], *, substitution_cost: int = 2
) -> int:
  """Word-level edit distance (insert/delete 1, substitute `substitution_cost`).

  With the default cost 2 this is the InDel distance behind the usual
  "Levenshtein ratio" (python-Levenshtein's `ratio`, RapidFuzz's
  `fuzz.ratio`); cost 1 gives the classic Levenshtein distance.
  """
  return int(Levenshtein.distance(a, b, weights=(1, 1, substitution_cost)))


def levenshtein_ratio(a: Sequence[Any], b: Sequence[Any]) -> float:
  """GBoard Sec. 4.2's word-level Levenshtein ratio, 0 (disjoint) to 100.

  `100 * (1 - d / (|a| + |b|))` with `d` the word-level distance whose
  substitutions cost 2 (i.e. `200 * LCS / (|a| + |b|)`), the definition of
  python-Levenshtein's `ratio`, applied to words instead of characters.
  """
  total = len(a) + len(b)
  if total == 0:
    return 100.0
  return 100.0 * (1.0 - levenshtein_distance(a, b) / total)


def best_match_ratios(
  candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]]
) -> np.ndarray:
  """For each candidate, its best :func:`levenshtein_ratio` over references.

  GBoard Sec. 4.2 / Fig. 3: the mean of this over the reconstructed
  sentences is the reported Levenshtein ratio. Swap the arguments for the
  recall view (each true sentence's best reconstruction).

  Returns:
    float64 `[len(candidates)]`.
  """
  if not references:
    return np.zeros((len(candidates),))
  if not candidates:
    return np.zeros((0,))
  cands = [tuple(c) for c in candidates]
  refs = [tuple(r) for r in references]
  dist = process.cdist(
    cands,
    refs,
    scorer=Levenshtein.distance,
    scorer_kwargs={'weights': (1, 1, 2)},
    dtype=np.int64,
  )  # [candidates, references]
  total = np.array([len(c) for c in cands])[:, None] + np.array(
    [len(r) for r in refs]
  )
  # Two empty sentences are equal: d = 0 over max(0, 1) gives 100.
  return (100.0 * (1.0 - dist / np.maximum(total, 1))).max(axis=1)


__all__ = ['best_match_ratios', 'levenshtein_distance', 'levenshtein_ratio']
