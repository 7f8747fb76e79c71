"""Privacy attacks on language-model training artefacts.

Each attack is a module of pure, jit-able functions:

* FILM (Gupta et al. 2022): :mod:`bag_of_words`, :mod:`beam_search`,
  :mod:`reorder`, the pipeline :mod:`film` and its :mod:`metrics`;
* GBoard next-word prediction (Suliman & Leith): :mod:`gboard`;
* differential score / rank (Zanella-Béguelin et al. 2020):
  :mod:`differential`;
* embedding inversion (Wan et al. 2024): :mod:`embedding_inversion` (BEI,
  HEI, the DCT defense), :mod:`embed_parrot` and :mod:`text_metrics`.

The entry points are re-exported here; two modules define a `beam_search`
(FILM's bag-restricted one and the differential-rank search), so those stay
behind their module names:

>>> from leakjax import attacks
>>> result = attacks.recover(model, params, grads, config=attacks.FilmConfig(),
...                          key=jax.random.key(0))            # doctest: +SKIP
>>> scores = attacks.differential_score(model, params, params_prime,
...                                     ids)                   # doctest: +SKIP
>>> found = attacks.differential.beam_search(...)              # doctest: +SKIP
"""

from leakjax.attacks import (
  bag_of_words,
  beam_search,
  differential,
  embed_parrot,
  embedding_inversion,
  film,
  gboard,
  metrics,
  reorder,
  text_metrics,
)
from leakjax.attacks.bag_of_words import Bag
from leakjax.attacks.bag_of_words import bag_of_words as extract_bag
from leakjax.attacks.beam_search import BeamSearchConfig
from leakjax.attacks.differential import (
  differential_rank_lower_bound,
  differential_score,
)
from leakjax.attacks.embedding_inversion import (
  apply_dct_defense,
  bei_ids,
  hei_ids,
  layer_states,
  make_dct_defense,
)
from leakjax.attacks.film import FilmConfig, FilmResult, recover
from leakjax.attacks.gboard import reconstruct_sentences, recover_words
from leakjax.attacks.reorder import ReorderConfig

__all__ = [
  'Bag',
  'BeamSearchConfig',
  'FilmConfig',
  'FilmResult',
  'ReorderConfig',
  'apply_dct_defense',
  'bag_of_words',
  'beam_search',
  'bei_ids',
  'differential',
  'differential_rank_lower_bound',
  'differential_score',
  'embed_parrot',
  'embedding_inversion',
  'extract_bag',
  'film',
  'gboard',
  'hei_ids',
  'layer_states',
  'make_dct_defense',
  'metrics',
  'reconstruct_sentences',
  'recover',
  'recover_words',
  'reorder',
  'text_metrics',
]
