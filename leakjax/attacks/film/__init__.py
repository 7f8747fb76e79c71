"""FILM (Gupta et al., NeurIPS 2022): private sentences from a gradient.

Read top-down from :mod:`runner` (the experiment, :class:`FilmConfig` and
:func:`run`: preprocessing, client gradients, the sweep; beside it
:mod:`client`, :mod:`training` and :mod:`bag_only`), which calls the
pipeline :func:`recover` (:mod:`pipeline`), which calls the kernels:

* :func:`leakjax.recovery.bag_mask` / `extract_bag` (Sec. 4.2): the
  bag of words from the gradient, shared with DAGER's hybrid, so it lives
  in :mod:`leakjax.recovery`;
* :func:`bag_beam_search` (:mod:`beam_search`, Sec. 4.3): beam search
  restricted to the bag;
* :func:`reorder_scores` (:mod:`reorder`, Sec. 4.4): gradient-matching + LM
  scores of candidate orderings;

and :mod:`leakjax.metrics` scores the result (ROUGE, NERR, bag
precision/recall). :mod:`presets` names the settings of :class:`FilmConfig`
(`paper`, FILM's protocol; `strongest`).
"""

from leakjax.attacks.film import beam_search, pipeline, presets, reorder, runner
from leakjax.attacks.film.beam_search import BeamSearchConfig, bag_beam_search
from leakjax.attacks.film.comparison import baseline
from leakjax.attacks.film.pipeline import (
  FilmAttackConfig,
  FilmResult,
  Recovery,
  recover,
)
from leakjax.attacks.film.reorder import ReorderConfig
from leakjax.attacks.film.reorder import candidate_scores as reorder_scores
from leakjax.attacks.film.runner import FilmConfig, FilmRun, run

__all__ = [
  'BeamSearchConfig',
  'FilmAttackConfig',
  'FilmConfig',
  'FilmResult',
  'FilmRun',
  'Recovery',
  'ReorderConfig',
  'bag_beam_search',
  'baseline',
  'beam_search',
  'pipeline',
  'presets',
  'recover',
  'reorder',
  'reorder_scores',
  'run',
  'runner',
]
