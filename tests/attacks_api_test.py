"""The public attack API: every exported name resolves to the right object."""

import inspect

from leakjax import attacks
from leakjax.attacks import differential, film


def test_all_names_resolve():
  for name in attacks.__all__:
    assert getattr(attacks, name) is not None, name


def test_beam_searches_stay_behind_module_names():
  # FILM's bag-restricted search and the differential-rank search differ.
  assert inspect.ismodule(attacks.beam_search)
  assert attacks.differential.beam_search is differential.beam_search
  assert (
    'bag_ids' in inspect.signature(attacks.beam_search.beam_search).parameters
  )


def test_entry_points():
  assert attacks.recover is film.recover
  assert attacks.FilmConfig is film.FilmConfig
  assert attacks.extract_bag is attacks.bag_of_words.bag_of_words
  assert attacks.differential_score is differential.differential_score
