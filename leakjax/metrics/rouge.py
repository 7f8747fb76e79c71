"""ROUGE F-measures from Google's `rouge-score` (Lin 2004).

Each paper scores with its own settings, so both are arguments:
FILM and DAGER use ROUGE-1/2/L with Porter stemming (`stemmer=True`, as in
the FILM authors' evaluation); Wan et al. 2024 (Embed Parrot) use ROUGE-1
and ROUGE-L without stemming (`stemmer=False`, Sec. 5.1.3).

>>> s = rouge_scores('the cats sat on the mat', 'the cat sat', stemmer=True)
>>> round(s['rouge1'], 4), round(s['rougeL'], 4)
(0.6667, 0.6667)
>>> rouge_scores('the cats sat', 'the cat sat', stemmer=False, types=('rouge1',))
{'rouge1': 0.6666666666666666}
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from leakjax.errors import LeakjaxError

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')


@functools.cache
def _scorer(types: tuple[str, ...], stemmer: bool):
  try:
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise LeakjaxError(
      'the rouge-score package is not installed', 'pip install rouge-score'
    ) from None
  return rouge_scorer.RougeScorer(list(types), use_stemmer=stemmer)


def rouge_scores(
  prediction: str,
  reference: str,
  *,
  stemmer: bool,
  types: Sequence[str] = ROUGE_TYPES,
) -> dict[str, float]:
  """ROUGE F-measures of `prediction` against `reference`.

  Args:
    prediction: the recovered text.
    reference: the original text.
    stemmer: Porter-stem the words before matching.
    types: rouge-score's names, e.g. 'rouge1', 'rouge2', 'rougeL'.

  Returns:
    `{type: F-measure}` in the order of `types`.
  """
  types = tuple(types)
  # rouge-score takes (target, prediction).
  scores = _scorer(types, stemmer).score(reference, prediction)
  return {name: float(scores[name].fmeasure) for name in types}


def rouge_matrix(
  references: Sequence[str],
  predictions: Sequence[str],
  *,
  stemmer: bool,
  types: Sequence[str] = ROUGE_TYPES,
) -> dict[str, np.ndarray]:
  """:func:`rouge_scores` of every (reference, prediction) pair.

  Returns:
    `{type: float64 [len(references), len(predictions)]}`.
  """
  types = tuple(types)
  out = {name: np.zeros((len(references), len(predictions))) for name in types}
  for i, ref in enumerate(references):
    for j, pred in enumerate(predictions):
      scores = rouge_scores(pred, ref, stemmer=stemmer, types=types)
      for name, value in scores.items():
        out[name][i, j] = value
  return out


__all__ = ['ROUGE_TYPES', 'rouge_matrix', 'rouge_scores']
