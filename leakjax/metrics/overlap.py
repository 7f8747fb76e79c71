"""Overlap metrics: F1 of sets and bags of tokens, and the best-F1 cut.

* :func:`f1_score` -- the harmonic mean of a precision and a recall;
* :func:`set_precision_recall` -- precision and recall of a recovered set
  against the true set; :func:`bag_precision_recall` is FILM's token-set
  version (Sec. 6.3), :func:`word_metrics` the GBoard paper's word version
  with its vocabulary bound (Suliman & Leith, Sec. 4.2);
* :func:`token_f1` -- the SQuAD v1.1 token-overlap F1 (Rajpurkar et al.
  2016) of two texts, over bags (multisets) of normalised tokens, as in
  Wan et al. 2024, Sec. 5.1.3;
* :func:`oracle_f1_cut` -- the threshold on a score with the best F1 given
  the true labels: an oracle that tells a weak score from a weak rule.

>>> token_f1('The cat sat.', 'a cat sat down')
0.8
>>> bag_precision_recall([1, 2, 3], [2, 3, 4, 5])
(0.6666666666666666, 0.5)
>>> oracle_f1_cut([0.9, 0.1, 0.5, 0.7], [True, False, True, False])
F1Cut(threshold=0.3, precision=0.6666666666666666, recall=1.0, f1=0.8)
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
from typing import Hashable, Iterable, NamedTuple, Sequence

import numpy as np

from leakjax.errors import LeakjaxError

_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCTUATION = frozenset(string.punctuation)


def f1_score(precision: float, recall: float) -> float:
  """`2 P R / (P + R)`, and 0 when both are 0."""
  if precision + recall == 0:
    return 0.0
  return 2 * precision * recall / (precision + recall)


def set_precision_recall(
  recovered: Iterable[Hashable], true: Iterable[Hashable], *, empty: float = 0.0
) -> tuple[float, float]:
  """`|R ∩ T| / |R|` and `|R ∩ T| / |T|` over distinct elements.

  Args:
    recovered: the recovered elements R (duplicates ignored).
    true: the true elements T (duplicates ignored).
    empty: the precision when R is empty and the recall when T is empty.

  Returns:
    `(precision, recall)`.
  """
  rec, tru = set(recovered), set(true)
  both = len(rec & tru)
  precision = both / len(rec) if rec else empty
  recall = both / len(tru) if tru else empty
  return precision, recall


def bag_precision_recall(
  recovered: Iterable[int], true: Iterable[int]
) -> tuple[float, float]:
  """Token-set precision |S* ∩ S| / |S*| and recall |S* ∩ S| / |S| (FILM Sec. 6.3).

  Precision of an empty recovered set is 1 (nothing wrong was claimed);
  recall of an empty true set is 1.
  """
  return set_precision_recall(
    (int(x) for x in recovered), (int(x) for x in true), empty=1.0
  )


@dataclasses.dataclass(frozen=True)
class WordMetrics:
  """Word recovery quality (GBoard Sec. 4.2), over distinct words."""

  precision: float
  recall: float
  f1: float
  f1_upper: float  # F1 of a perfect attack: every true in-vocabulary word
  coverage: float  # share of the true words that are in the vocabulary
  num_recovered: int
  num_true: int


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
      |true| and F1 at most `f1_upper = 2 c / (1 + c)` (GBoard Sec. 4.3.1).

  Returns:
    :class:`WordMetrics`.
  """
  rec, true = set(recovered), set(true_words)
  vocab = vocabulary if isinstance(vocabulary, set) else set(vocabulary)
  precision, recall = set_precision_recall(rec, true)
  coverage = len(true & vocab) / len(true) if true else 0.0
  return WordMetrics(
    precision=precision,
    recall=recall,
    f1=f1_score(precision, recall),
    f1_upper=f1_score(1.0, coverage),
    coverage=coverage,
    num_recovered=len(rec),
    num_true=len(true),
  )


def normalize_answer(text: str) -> str:
  """SQuAD's answer normalisation: lower, no punctuation/articles, 1 space."""
  text = text.lower()
  text = ''.join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(' ', text)
  return ' '.join(text.split())


def token_f1(prediction: str, reference: str) -> float:
  """SQuAD token F1 of `prediction` against `reference`.

  Lower-case, strip punctuation and the articles a/an/the, split on
  whitespace, then the F1 of the two bags of tokens (repeated tokens count
  as often as they occur on both sides). As in the official SQuAD v2
  script, if either side normalises to no tokens the score is 1.0 when
  both are empty and 0.0 otherwise.
  """
  pred = normalize_answer(prediction).split()
  ref = normalize_answer(reference).split()
  if not pred or not ref:
    return float(pred == ref)
  common = collections.Counter(pred) & collections.Counter(ref)
  same = sum(common.values())
  if same == 0:
    return 0.0
  return f1_score(same / len(pred), same / len(ref))


class F1Cut(NamedTuple):
  """The best-F1 threshold of :func:`oracle_f1_cut` and what it gives."""

  threshold: float  # keep `score > threshold`
  precision: float
  recall: float
  f1: float


def oracle_f1_cut(
  scores: np.ndarray,
  labels: np.ndarray,
  *,
  num_true: int | None = None,
  candidates: np.ndarray | None = None,
) -> F1Cut:
  """The threshold on `scores` with the best F1 given the true `labels`.

  Every cut that keeps the top k candidates (k = 1..n, ties broken by
  index) is scored; the first best one is returned. It uses the truth, so
  it only compares: it is the ceiling of any rule that cuts this score.

  Args:
    scores: float `[n]`, larger = more likely true.
    labels: bool `[n]`, the true entries.
    num_true: the recall's denominator; default `labels.sum()`. Larger when
      some true items cannot be scored (e.g. out-of-vocabulary words).
    candidates: optional bool `[n]`: only these may be kept.

  Returns:
    :class:`F1Cut`; the threshold lies halfway between the last kept and
    the first dropped score (the last kept score less 1 when none is
    dropped).

  Raises:
    LeakjaxError: there is no candidate.
  """
  scores = np.asarray(scores, np.float64)
  labels = np.asarray(labels, bool)
  if num_true is None:
    num_true = int(labels.sum())
  idx = (
    np.arange(len(scores))
    if candidates is None
    else np.flatnonzero(np.asarray(candidates, bool))
  )
  if not len(idx):
    raise LeakjaxError('oracle_f1_cut needs at least one candidate score')
  order = idx[np.argsort(-scores[idx], kind='stable')]
  tp = np.cumsum(labels[order], dtype=np.float64)
  k = np.arange(1, len(order) + 1)
  precision, recall = tp / k, tp / max(num_true, 1)
  f1 = np.where(
    tp > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-300), 0.0
  )
  best = int(np.argmax(f1))
  nxt = (
    scores[order[best + 1]]
    if best + 1 < len(order)
    else scores[order[best]] - 1.0
  )
  return F1Cut(
    threshold=float(0.5 * (scores[order[best]] + nxt)),
    precision=float(precision[best]),
    recall=float(recall[best]),
    f1=float(f1[best]),
  )


__all__ = [
  'F1Cut',
  'WordMetrics',
  'bag_precision_recall',
  'f1_score',
  'normalize_answer',
  'oracle_f1_cut',
  'set_precision_recall',
  'token_f1',
  'word_metrics',
]
