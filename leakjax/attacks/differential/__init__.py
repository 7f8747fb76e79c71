"""Differential score and rank (Zanella-Beguelin et al., CCS 2020).

Given a model `M` trained on `D` and a snapshot `M'` trained on `D' ⊋ D`,
the token sequences whose probability rose most from `M` to `M'` reveal the
update `D' \\ D`. Read top-down:

* :mod:`.score` -- :func:`differential_score` (Definition 3.1, kernel) and
  :func:`differential_rank_lower_bound` (Proposition 3.3);
* :mod:`.rank_search` -- :func:`rank_beam_search` (Algorithm 1, kernel) with
  the paper's halving schedule :func:`halving_widths`;
* :mod:`.canaries` -- the canaries of Sec. 4.4 (:func:`make_canaries`);
* :mod:`.runner` -- the canary experiment of Sec. 4, read top-down from
  `runner.run(config, writer)` (:class:`DifferentialConfig`), with its
  corpus (:mod:`.corpus`), M and M' (:mod:`.training`) and the attack of
  each pair (:mod:`.evaluation`);
* :mod:`.presets` -- the named configs (`paper`, `strongest`).

>>> from leakjax.attacks import differential as dlib
>>> ds = dlib.differential_score(model, model, params, params_prime,
...                              ids)                          # doctest: +SKIP
"""

from leakjax.attacks.differential import (
  canaries,
  presets,
  rank_search,
  runner,
  score,
)
from leakjax.attacks.differential.canaries import (
  CANARY_LENGTH,
  PROFILES,
  Canary,
  make_canaries,
)
from leakjax.attacks.differential.rank_search import (
  RankBeamState,
  SearchResult,
  halving_widths,
  rank_beam_search,
  ranked,
)
from leakjax.attacks.differential.runner import DifferentialConfig
from leakjax.attacks.differential.score import (
  SCORES,
  DifferentialScores,
  contains,
  differential_rank_lower_bound,
  differential_score,
  token_differential_scores,
)

__all__ = [
  'CANARY_LENGTH',
  'PROFILES',
  'SCORES',
  'Canary',
  'DifferentialConfig',
  'DifferentialScores',
  'RankBeamState',
  'SearchResult',
  'canaries',
  'contains',
  'differential_rank_lower_bound',
  'differential_score',
  'halving_widths',
  'make_canaries',
  'presets',
  'rank_beam_search',
  'rank_search',
  'ranked',
  'runner',
  'score',
  'token_differential_scores',
]
