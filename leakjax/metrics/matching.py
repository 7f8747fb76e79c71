"""Which original a recovered sentence matches (FILM Sec. 6.2, Table 3).

* :func:`best_of_batch` -- FILM's single-sentence score of a batch: each
  metric of the recovered sentence against its best-matching original in
  the batch (Sec. 6.2; Table 10 reports the mean over batches of this);
* :func:`sentence_matching` -- multi-sentence recovery (Table 3): recall =
  fraction of originals matched by some recovery with ROUGE-L > 0.25,
  precision = fraction of recoveries that match some original.

ROUGE here is FILM's: ROUGE-1/2/L with Porter stemming.

>>> sentence_matching(['a b c', 'd e f'], ['a b c', 'x y'])
{'recall': 0.5, 'precision': 0.5}
"""

from __future__ import annotations

from typing import Iterable, Sequence

from leakjax.errors import LeakjaxError
from leakjax.metrics.entities import named_entities, nerr
from leakjax.metrics.rouge import rouge_matrix

# FILM Sec. 6.2 / Table 3: a recovery "leaks" a sentence if ROUGE-L > 0.25.
LEAK_THRESHOLD = 0.25


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
    nlp: a spaCy pipeline; None loads the default model (only needed when
      `entities` is None).

  Returns:
    `{'rouge1', 'rouge2', 'rougeL', 'nerr'}`; 'nerr' is NaN when no original
    has a named entity, and 'match' is the index of the ROUGE-L best match.
  """
  if not originals:
    raise LeakjaxError('best_of_batch needs at least one original sentence')
  scores = rouge_matrix(originals, [prediction], stemmer=True)
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
  hits = (
    rouge_matrix(originals, predictions, stemmer=True)['rougeL'] > threshold
  )
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


__all__ = [
  'LEAK_THRESHOLD',
  'best_of_batch',
  'sentence_matching',
  'sentence_matching_by_count',
]
