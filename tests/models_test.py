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


def test_unknown_dtype_is_refused():
  with pytest.raises(LeakjaxError, match="unknown --dtype 'float16'"):
    models.load_model(models.GPT2_TINY, dtype='float16')


@pytest.mark.slow
def test_bfloat16_is_the_float32_model_cast(tmp_path):
  # The same weights rounded to bfloat16, computing in it: logits within
  # bfloat16's rounding of the float32 model's, the same next tokens.
  model, params = models.load_model(models.GPT2_TINY, seed=0)
  half_model, half = models.load_model(
    models.GPT2_TINY, seed=0, dtype='bfloat16'
  )
  assert {x.dtype.name for x in jax.tree.leaves(half)} == {'bfloat16'}
  assert leaves_equal(
    jax.tree.map(lambda x: x.astype('bfloat16'), params), half
  )
  ids = np.asarray([[464, 3139, 286, 262, 2068, 373, 257, 1310]])
  full_logits = np.asarray(model.logits(params, ids), np.float32)
  half_logits = np.asarray(half_model.logits(half, ids), np.float32)
  scale = np.abs(full_logits).max()
  assert np.abs(half_logits - full_logits).max() < 0.05 * scale
  assert np.abs(half_logits - full_logits).max() > 0  # it did round
  # A checkpoint and a random initialisation of it load in bfloat16 too.
  models.save(model, params, tmp_path / 'ckpt')
  for init in models.INITS:
    got_model, got = models.load_model(
      tmp_path / 'ckpt', init=init, seed=0, dtype='bfloat16'
    )
    assert {x.dtype.name for x in jax.tree.leaves(got)} == {'bfloat16'}
    assert got_model == half_model
  # Casting a model already in the dtype changes nothing.
  assert models.cast(half_model, half, 'bfloat16')[1] is half
