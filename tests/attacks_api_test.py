"""The curated public attack API: what each exported name is and does."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import attacks, recovery
from leakjax.attacks import dager, differential, film
from leakjax.attacks.film import beam_search, reorder


def test_exported_names_are_the_library_objects():
  # Each paper's pipeline is `<paper>.recover`; no bare `recover` at the top.
  assert attacks.film.recover is film.pipeline.recover
  assert attacks.dager.recover is dager.pipeline.recover
  assert attacks.dager.hybrid.recover is dager.hybrid.recover
  assert 'recover' not in attacks.__all__ and not hasattr(attacks, 'recover')
  assert attacks.token_filter is dager.search.token_filter
  assert attacks.sequence_search is dager.search.sequence_search
  assert attacks.DagerAttackConfig is dager.pipeline.DagerAttackConfig
  assert attacks.DagerResult is dager.pipeline.DagerResult
  assert attacks.extract_bag is recovery.bag.extract_bag
  assert attacks.FilmAttackConfig is film.pipeline.FilmAttackConfig
  assert attacks.bag_beam_search is beam_search.bag_beam_search
  assert attacks.rank_beam_search is differential.rank_beam_search
  assert attacks.reorder_scores is reorder.candidate_scores
  assert attacks.differential_score is differential.differential_score
  # One search per name: FILM's takes a bag, the differential one does not.
  assert 'bag_ids' in inspect.signature(attacks.bag_beam_search).parameters
  assert 'bag_ids' not in inspect.signature(attacks.rank_beam_search).parameters


def test_every_paper_package_is_exported_with_a_short_api():
  papers = ('dager', 'differential', 'film', 'gboard', 'inversion')
  for name in papers:
    package = getattr(attacks, name)
    assert name in attacks.__all__ and inspect.ismodule(package), name
    assert len(package.__all__) <= 21, (name, len(package.__all__))
    for exported in package.__all__:
      assert hasattr(package, exported), (name, exported)
  # The neutral pieces two papers share, as short.
  assert len(recovery.__all__) <= 21
  # The scores live in leakjax.metrics, not in a paper's package.
  assert not hasattr(attacks.gboard, 'word_metrics')


def test_no_exported_function_is_named_like_a_module():
  for name in attacks.__all__:
    obj = getattr(attacks, name)
    if inspect.ismodule(obj):
      assert obj.__name__ == f'leakjax.attacks.{name}', name
    else:
      assert not inspect.ismodule(getattr(attacks, obj.__name__, None)), name


def test_bag_mask_kernel_reads_untied_rows():
  # The untied rule on a hand-made gradient: nonzero rows are the bag.
  from leakjax import models

  model = models.from_functions(
    lambda p, ids, mask=None: jnp.zeros(ids.shape + (5,)),
    vocab_size=5,
    word_embeddings='embed',
  )
  grads = {'embed': jnp.zeros((5, 3)).at[1, 0].set(2.0).at[4, 2].set(-1e-3)}
  kernel = jax.jit(attacks.bag_mask, static_argnames=('model', 'method'))
  mask = kernel(model, {'embed': jnp.ones((5, 3))}, grads, method='nonzero')
  np.testing.assert_array_equal(mask, [False, True, False, False, True])
