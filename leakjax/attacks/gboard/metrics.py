"""The GBoard paper's metrics (Sec. 4.2): word F1 with its vocabulary bound,
and the word-level Levenshtein ratio.

Part of :mod:`leakjax.attacks.gboard`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class WordMetrics:
  """Word recovery quality (Sec. 4.2), over distinct words."""

  precision: float
  recall: float
  f1: float
  f1_upper: float  # F1 of a perfect attack: every true in-vocabulary word
  coverage: float  # share of the true words that are in the vocabulary
  num_recovered: int
  num_true: int


def _f1(p: float, r: float) -> float:
  return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def word_metrics(
  recovered: Sequence[str],
  true_words: Sequence[str],
  vocabulary: Sequence[str] | set[str],
) -> WordMetrics:
  """Precision, recall and F1 of recovered words against the true words.

  Args:
    recovered: the recovered words (strings; duplicates ignored).
    true_words: the words of the client's sentences as the tokenizer splits
      them (duplicates ignored), in or out of the vocabulary.
    vocabulary: the model's words. Out-of-vocabulary words can only come
      back as `<UNK>`, so recall is at most `coverage` = |true ∩ vocab| /
      |true| and F1 at most `f1_upper = 2 c / (1 + c)` (Sec. 4.3.1).

  Returns:
    :class:`WordMetrics`.
  """
  rec, true = set(recovered), set(true_words)
  vocab = vocabulary if isinstance(vocabulary, set) else set(vocabulary)
  hits = len(rec & true)
  precision = hits / len(rec) if rec else 0.0
  recall = hits / len(true) if true else 0.0
  coverage = len(true & vocab) / len(true) if true else 0.0
  return WordMetrics(
    precision=precision,
    recall=recall,
    f1=_f1(precision, recall),
    f1_upper=_f1(1.0, coverage),
    coverage=coverage,
    num_recovered=len(rec),
    num_true=len(true),
  )


def levenshtein_distance(
  a: Sequence[Any], b: Sequence[Any], *, substitution_cost: int = 2
) -> int:
  """Word-level edit distance (insert/delete 1, substitute `substitution_cost`).

  With the default cost 2 this is the InDel distance behind the usual
  "Levenshtein ratio" (python-Levenshtein's `ratio`, RapidFuzz's
  `fuzz.ratio`); cost 1 gives the classic Levenshtein distance.
  """
  prev = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    cur = [i] + [0] * len(b)
    for j, y in enumerate(b, 1):
      cur[j] = min(
        prev[j] + 1,
        cur[j - 1] + 1,
        prev[j - 1] + (0 if x == y else substitution_cost),
      )
    prev = cur
  return prev[-1]


def levenshtein_ratio(a: Sequence[Any], b: Sequence[Any]) -> float:
  """Sec. 4.2's word-level Levenshtein ratio, 0 (disjoint) to 100 (equal).

  `100 * (1 - d / (|a| + |b|))` with `d` the word-level distance whose
  substitutions cost 2 (i.e. `200 * LCS / (|a| + |b|)`), the definition of
  python-Levenshtein's `ratio`, applied to words instead of characters.

  >>> levenshtein_ratio('how are you doing'.split(), 'how are you'.split())
  85.71428571428571
  """
  total = len(a) + len(b)
  if total == 0:
    return 100.0
  return 100.0 * (1.0 - levenshtein_distance(a, b) / total)


def best_match_ratios(
  candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]]
) -> np.ndarray:
  """For each candidate, its best :func:`levenshtein_ratio` over references.

  Sec. 4.2 / Fig. 3: the mean of this over the reconstructed sentences is
  the reported Levenshtein ratio. Swap the arguments for the recall view
  (each true sentence's best reconstruction).
  """
  if not references:
    return np.zeros((len(candidates),))
  refs = [tuple(r) for r in references]
  return np.array(
    [max(levenshtein_ratio(c, r) for r in refs) for c in candidates], np.float64
  )


__all__ = [
  'WordMetrics',
  'best_match_ratios',
  'levenshtein_distance',
  'levenshtein_ratio',
  'word_metrics',
]
