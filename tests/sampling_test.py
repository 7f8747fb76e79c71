"""Tests of ancestral sampling (`leakjax.models.sampling`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import llama
from leakjax.models.sampling import nucleus_logits, sample


def nucleus_reference(logits: np.ndarray, top_p: float) -> np.ndarray:
  """Sort-based nucleus in float64: the smallest top set with mass >= p."""
  out = np.full(logits.shape, -np.inf)
  for i, row in enumerate(logits.astype(np.float64)):
    p = np.exp(row - row.max())
    p /= p.sum()
    order = np.argsort(-p, kind='stable')
    k = int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1
    keep = p >= p[order[min(k, len(p)) - 1]]
    out[i, keep] = row[keep]
  return out


@pytest.mark.parametrize('top_p', [1e-4, 0.3, 0.5, 0.8, 0.9])
def test_nucleus_matches_a_sorting_reference(top_p):
  logits = 3 * np.asarray(jax.random.normal(jax.random.key(0), (16, 5000)))
  got = np.asarray(nucleus_logits(jnp.asarray(logits), top_p))
  want = nucleus_reference(logits, top_p)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
  kept = np.isfinite(got)
  np.testing.assert_allclose(got[kept], logits[kept], rtol=1e-6)
  if top_p < 0.01:  # greedy: only the argmax
    assert (kept.sum(1) == 1).all()
    assert (kept.argmax(1) == logits.argmax(1)).all()


def test_nucleus_keeps_everything_at_one_and_ties_together():
  logits = jnp.array([[0.0, 0.0, 0.0, -1.0]])
  assert np.isfinite(np.asarray(nucleus_logits(logits, 1.0))).all()
  # The three tied tokens hold 0.86 of the mass: p = 0.5 keeps all three.
  kept = np.isfinite(np.asarray(nucleus_logits(logits, 0.5)))[0]
  np.testing.assert_array_equal(kept, [True, True, True, False])


@functools.lru_cache(maxsize=None)
def tiny_model():
  config = llama.LlamaConfig(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    tie_word_embeddings=True,
  )
  model, params = llama.init_model(config, key=jax.random.key(0))
  # Sharper than an untrained model's near-uniform next-token distribution.
  params = jax.tree.map(lambda x: x * 3.0, params)
  return model, params


@pytest.mark.slow
def test_greedy_limit_is_the_argmax_continuation():
  model, params = tiny_model()
  prompt = jnp.array([[1, 7], [1, 30]], jnp.int32)
  got = np.asarray(
    sample(model, params, jax.random.key(0), prompt, num_tokens=4, top_p=1e-6)
  )
  # Reference: re-run the whole prefix and append its argmax each step.
  ids = np.asarray(prompt)
  for _ in range(4):
    logits = np.asarray(model.logits(params, jnp.asarray(ids)))[:, -1]
    ids = np.concatenate([ids, logits.argmax(-1)[:, None]], 1)
  np.testing.assert_array_equal(got, ids)


@pytest.mark.slow
def test_first_token_follows_the_tempered_nucleus_distribution():
  model, params = tiny_model()
  n, temperature, top_p = 20000, 0.7, 0.8
  prompt = jnp.tile(jnp.array([[1, 7]], jnp.int32), (n, 1))
  got = np.asarray(
    sample(
      model,
      params,
      jax.random.key(3),
      prompt,
      num_tokens=1,
      temperature=temperature,
      top_p=top_p,
    )
  )[:, 2]
  logits = np.asarray(model.logits(params, prompt[:1]))[0, -1] / temperature
  want = nucleus_reference(logits[None], top_p)[0]
  probs = np.exp(want - want[np.isfinite(want)].max())
  probs /= probs.sum()
  assert 2 <= np.isfinite(want).sum() < 50  # the test truncates something
  freq = np.bincount(got, minlength=50) / n
  assert freq[~np.isfinite(want)].sum() == 0  # nothing outside the nucleus
  assert 0.5 * np.abs(freq - probs).sum() < 0.02  # total variation


@pytest.mark.slow
def test_a_model_without_a_cache_samples_the_same_tokens():
  model, params = tiny_model()
  no_cache = models.from_functions(
    model.logits_fn,
    vocab_size=model.vocab_size,
    word_embeddings=model.paths.word_embeddings,
    max_length=32,
  )
  prompt = jnp.array([[1, 7], [1, 30], [2, 2]], jnp.int32)
  kwargs = dict(num_tokens=8, temperature=0.5, top_p=0.9)
  a = sample(model, params, jax.random.key(5), prompt, **kwargs)
  b = sample(no_cache, params, jax.random.key(5), prompt, **kwargs)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert a.shape == (3, 10)
  np.testing.assert_array_equal(np.asarray(a[:, :2]), np.asarray(prompt))


def test_sample_rejects_bad_shapes():
  model, params = tiny_model()
  with pytest.raises(LeakjaxError, match='num_tokens'):
    sample(model, params, jax.random.key(0), jnp.ones((2, 1)), num_tokens=0)
  with pytest.raises(LeakjaxError, match='prompt'):
    sample(model, params, jax.random.key(0), jnp.ones((2,)), num_tokens=3)
