"""leakjax.models.load_model: aliases and re-initialised weights."""

import jax
import numpy as np
import pytest

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2


def leaves_equal(a, b) -> bool:
  return all(
    np.array_equal(x, y)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  )


@pytest.mark.slow
def test_gpt2_tiny_is_a_fresh_model_of_the_seed():
  model, params = models.load_model(models.GPT2_TINY, seed=3)
  again = models.load_model(models.GPT2_TINY, seed=3)[1]
  other = models.load_model(models.GPT2_TINY, seed=4)[1]
  assert model.family == 'gpt2' and model.tokenizer.vocab_size == 50257
  assert model.max_length == 64
  assert leaves_equal(params, again) and not leaves_equal(params, other)


@pytest.mark.slow
def test_random_init_keeps_the_architecture_and_tokenizer(tmp_path):
  model, params = models.load_model(models.GPT2_TINY, seed=0)
  models.save(model, params, tmp_path / 'ckpt')
  loaded_model, loaded = models.load_model(tmp_path / 'ckpt')
  assert leaves_equal(loaded, params)
  fresh_model, fresh = models.load_model(
    tmp_path / 'ckpt', init='random', seed=5
  )
  assert fresh_model.config == loaded_model.config
  assert fresh_model.tokenizer.vocab_size == loaded_model.tokenizer.vocab_size
  want = gpt2.init_model(
    loaded_model.config,
    key=jax.random.key(5),
    tokenizer=loaded_model.tokenizer,
  )[1]
  assert leaves_equal(fresh, want) and not leaves_equal(fresh, params)


def test_unknown_init_is_refused():
  with pytest.raises(LeakjaxError, match='unknown --init'):
    models.load_model(models.GPT2_TINY, init='zeros')
