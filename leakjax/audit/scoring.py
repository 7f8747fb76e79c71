"""What a person reads off one attack: each original against its best
recovery, and the named entities that leaked.

* :func:`matched` -- per original, the recovered sentence with the highest
  ROUGE-L (Porter stemming, as FILM's and DAGER's scores);
* :func:`leaked_entities` -- per original, its named entities (people,
  organisations, places, products, events, dates, amounts, numbers) that
  appear verbatim anywhere in what the attacker recovered;
* :func:`describe` -- the row fields the report shows.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from leakjax import metrics
from leakjax.metrics import entities as entities_lib

# FILM Appendix B.1's types and the numbers a person would not want read
# back (spaCy's labels).
ENTITY_TYPES = entities_lib.ENTITY_TYPES + (
  'DATE',
  'TIME',
  'MONEY',
  'PERCENT',
  'QUANTITY',
  'CARDINAL',
)


def _normal(text: str) -> str:
  return ' '.join(text.split())


def matched(originals: Sequence[str], recovered: Sequence[str]) -> list[str]:
  """Per original, its best recovered sentence by ROUGE-L ('' if none)."""
  recovered = [r for r in recovered if r.strip()]
  if not recovered:
    return [''] * len(originals)
  scores = metrics.rouge_matrix(list(originals), recovered, stemmer=True)
  best = np.asarray(scores['rougeL']).argmax(1)
  return [recovered[j] for j in best]


def leaked_entities(
  original_entities: Sequence[set[str]], recovered: Sequence[str]
) -> list[list[str]]:
  """Per original, its entities found verbatim (on word boundaries) in any
  recovered sentence: the attacker reads all of them."""
  text = '\n'.join(recovered)
  return [
    sorted(e for e in ents if entities_lib.nerr({e}, text) == 1.0)
    for ents in original_entities
  ]


def describe(
  originals: Sequence[str],
  recovered: Sequence[str],
  original_entities: Sequence[set[str]],
) -> dict[str, Any]:
  """`matched`, `exact_each` (the best match equals the original up to
  whitespace), `original_entities`, `leaked_entities` and `entities` (the
  fraction of all the originals' entities that leaked; None without any)."""
  best = matched(originals, recovered)
  leaked = leaked_entities(original_entities, recovered)
  total = sum(len(e) for e in original_entities)
  return {
    'matched': best,
    'exact_each': [_normal(o) == _normal(m) for o, m in zip(originals, best)],
    'original_entities': [sorted(e) for e in original_entities],
    'leaked_entities': leaked,
    'entities': (sum(len(x) for x in leaked) / total) if total else None,
  }


def entities_of(texts: Sequence[str]) -> list[set[str]]:
  """The named entities of each text (:data:`ENTITY_TYPES`)."""
  return entities_lib.named_entities(list(texts), types=ENTITY_TYPES)


__all__ = [
  'ENTITY_TYPES',
  'describe',
  'entities_of',
  'leaked_entities',
  'matched',
]
