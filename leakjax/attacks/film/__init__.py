"""FILM (Gupta et al., NeurIPS 2022): private sentences from a gradient.

Read top-down from :mod:`runner` (the experiment: preprocessing, client
gradients, the sweep), which calls the pipeline :func:`recover`
(:mod:`pipeline`), which calls the kernels:

* :func:`bag_mask` / :func:`extract_bag` (:mod:`bag`, Sec. 4.2): the bag of
  words from the gradient;
* :func:`bag_beam_search` (:mod:`beam_search`, Sec. 4.3): beam search
  restricted to the bag;
* :func:`reorder_scores` (:mod:`reorder`, Sec. 4.4): gradient-matching + LM
  scores of candidate orderings;

and :mod:`leakjax.metrics` scores the result (ROUGE, NERR, bag
precision/recall).
"""

from leakjax.attacks.film import bag, beam_search, pipeline, reorder
from leakjax.attacks.film.bag import Bag, TiedBagConfig, bag_mask, extract_bag
from leakjax.attacks.film.beam_search import BeamSearchConfig, bag_beam_search
from leakjax.attacks.film.pipeline import (
  FilmConfig,
  FilmResult,
  Recovery,
  recover,
)
from leakjax.attacks.film.reorder import ReorderConfig
from leakjax.attacks.film.reorder import candidate_scores as reorder_scores

__all__ = [
  'Bag',
  'BeamSearchConfig',
  'FilmConfig',
  'FilmResult',
  'Recovery',
  'ReorderConfig',
  'TiedBagConfig',
  'bag',
  'bag_beam_search',
  'bag_mask',
  'beam_search',
  'extract_bag',
  'pipeline',
  'recover',
  'reorder',
  'reorder_scores',
]
