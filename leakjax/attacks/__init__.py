"""Privacy attacks on language-model training artefacts.

Every attack takes a model through the :class:`leakjax.models.LanguageModel`
protocol (ours or yours, via `from_functions` / `from_flax`) and explicit
params. Kernels are pure and jittable with the model as a static argument;
the host-side conveniences (NumPy bags, strings) are named as such.

FILM (Gupta et al., NeurIPS 2022), sentences from a client's gradient:

* :func:`bag_mask` -- kernel: bool `[V]` bag of words from the gradient
  (untied nonzero rows, DP threshold, tied span/sign/norm tests);
  :func:`extract_bag` is its host wrapper (a :class:`Bag` of NumPy ids);
  both in :mod:`leakjax.recovery`, since DAGER's hybrid reads the bag too;
* :func:`bag_beam_search` -- kernel: beam search restricted to a bag;
* :func:`reorder_scores` -- kernel: gradient-matching + LM scores of
  candidate orderings;
* :func:`film.recover` -- the pipeline (host loop over prompts and
  reorderings), with :class:`FilmAttackConfig` and :class:`FilmResult`.

DAGER (Petrov et al., NeurIPS 2024), the exact batch from attention-gradient
spans:

* :func:`token_filter` -- kernel: layer-1 span test of every (token,
  position) pair;
* :func:`sequence_search` -- kernel: layer-2 span search over sequences
  (one `lax.while_loop`);
* :func:`dager.recover` -- the pipeline on one gradient, with
  :class:`DagerAttackConfig` and :class:`DagerResult`;
  :func:`dager.hybrid.recover` goes past the rank limit with FILM's bag.

Each paper's pipeline is `<paper>.recover`; none is exported bare, so
`attacks.film.recover` and `attacks.dager.recover` never shadow each other.

GBoard next-word prediction (Suliman & Leith): :func:`recover_words` (the
output-bias rule), :func:`recover_words_auto` (noise-robust), and the kernel
:func:`reconstruct_sentences`.

Differential score / rank (Zanella-Béguelin et al., CCS 2020):
:func:`differential_score` (kernel), :func:`rank_beam_search` (kernel) and
:func:`differential_rank_lower_bound`.

Embedding inversion (Wan et al. 2024): :func:`bei_ids`, :func:`hei_ids`,
:func:`bei_hei_ids` (kernels), :func:`make_dct_defense`,
:func:`apply_dct_defense`; Embed Parrot in :mod:`inversion.embed_parrot`.

>>> from leakjax import attacks
>>> bag = jax.jit(attacks.bag_mask, static_argnames=('model', 'method'))(
...     model, params, grads, method='tied')                   # doctest: +SKIP
>>> result = attacks.film.recover(model, params, grads,
...                               key=jax.random.key(0))       # doctest: +SKIP
>>> exact = attacks.dager.recover(model, params, grads)      # doctest: +SKIP
>>> ds = attacks.differential_score(model, model, params, params_prime,
...                                 ids)                        # doctest: +SKIP

One package per paper, each read top-down from its `runner` (the
experiment's algorithm: data, training, the sweep; `run(config, writer)`):
:mod:`film` (`beam_search`, `reorder`, `pipeline`),
:mod:`dager` (`search`, `pipeline`, `hybrid`),
:mod:`gboard` (`update`, `thresholds`, `mixture`, `reconstruct`),
:mod:`differential` (`score`, `rank_search`, `canaries`),
:mod:`inversion` (`bei_hei`, `dct`, `embed_parrot`). No paper imports
another: what two of them read off a gradient (the span of a projection
gradient, the bag of words) is in the neutral :mod:`leakjax.recovery`. The metrics that score
what an attack recovered are in :mod:`leakjax.metrics`.
"""

from leakjax.attacks import (
  dager,
  differential,
  film,
  gboard,
  inversion,
)
from leakjax.attacks.dager import (
  DagerAttackConfig,
  DagerResult,
  sequence_search,
  token_filter,
)
from leakjax.attacks.differential import (
  differential_rank_lower_bound,
  differential_score,
  rank_beam_search,
)
from leakjax.attacks.film import (
  BeamSearchConfig,
  FilmAttackConfig,
  FilmResult,
  ReorderConfig,
  bag_beam_search,
  reorder_scores,
)
from leakjax.attacks.gboard import (
  reconstruct_sentences,
  recover_words,
  recover_words_auto,
)
from leakjax.attacks.inversion import (
  apply_dct_defense,
  bei_hei_ids,
  bei_ids,
  hei_ids,
  layer_states,
  make_dct_defense,
)
from leakjax.recovery import Bag, bag_mask, extract_bag

__all__ = [
  'Bag',
  'BeamSearchConfig',
  'DagerAttackConfig',
  'DagerResult',
  'FilmAttackConfig',
  'FilmResult',
  'ReorderConfig',
  'apply_dct_defense',
  'bag_beam_search',
  'bag_mask',
  'bei_hei_ids',
  'bei_ids',
  'dager',
  'differential',
  'differential_rank_lower_bound',
  'differential_score',
  'extract_bag',
  'film',
  'gboard',
  'hei_ids',
  'inversion',
  'layer_states',
  'make_dct_defense',
  'rank_beam_search',
  'reconstruct_sentences',
  'recover_words',
  'recover_words_auto',
  'reorder_scores',
  'sequence_search',
  'token_filter',
]
