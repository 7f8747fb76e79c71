"""The private corpus of a text-attack experiment, shared by the FILM and
DAGER runners: which texts a config names and what the experiment writer
records about them."""

from __future__ import annotations

from typing import Any, Sequence

from leakjax import data as data_lib
from leakjax import models, quickstart_corpus


def load_texts(config) -> list[str]:
  """The private corpus of `config` (its `data`, `data_column` and
  `data_label` fields; no `data`: the embedded quickstart sentences)."""
  if not config.data:
    return list(quickstart_corpus.SENTENCES)
  return data_lib.load_corpus(
    config.data, column=config.data_column, label=config.data_label
  )


def writer_inputs(config, texts: Sequence[str]) -> dict[str, Any]:
  """The run's inputs by name, for :class:`leakjax.io.ExperimentWriter`:
  the corpus, its texts and the model file of `config.model` (their sha256
  go to provenance.json)."""
  return {
    'data': config.data,
    'texts': list(texts),
    'model': models.source_path(config.model),
  }
