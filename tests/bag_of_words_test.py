"""Tests of leakjax.attacks.bag_of_words (FILM Sec. 4.2, 6.3)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import fl
from leakjax.attacks import bag_of_words as bow
from leakjax.models import get_path, gpt2, llama

VOCAB = 300


@functools.cache
def tiny_gpt2(tied: bool):
  config = gpt2.GPT2Config.tiny(
    vocab_size=VOCAB, n_positions=32, n_layer=1, tie_word_embeddings=tied
  )
  return gpt2.init_model(config, key=jax.random.key(1))


@functools.cache
def tiny_llama():
  config = llama.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  )
  return llama.init_model(config, key=jax.random.key(2))


def batch(lengths, seed=0, width=9):
  """Random right-padded ids `[len(lengths), width]`, BOS-free.

  One width (and 3 rows) for most tests: fewer compilations.
  """
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = rng.integers(3, VOCAB, n)
    mask[i, :n] = 1
  return ids, mask


def input_tokens(ids, mask):
  """Tokens fed at a position whose output is trained (not the last)."""
  has_target = mask[:, :-1] * mask[:, 1:]
  return set(ids[:, :-1][has_target > 0].tolist())


def test_untied_nonzero_rows_are_exactly_the_input_tokens():
  model = tiny_gpt2(tied=False)
  ids, mask = batch([7, 4, 9])
  grads = fl.client_gradient(model, model.params, ids, mask)
  rows = get_path(grads, model.paths.word_embeddings)
  found = set(np.flatnonzero(np.asarray(bow.nonzero_rows(rows))).tolist())
  assert found == input_tokens(ids, mask)
  bag = bow.bag_of_words(model, model.params, grads)
  assert bag.method == 'nonzero'
  assert set(bag.ids.tolist()) == found
  assert bag.max_length == 9


@pytest.mark.parametrize('lengths', [[3, 2, 1], [5, 9, 2], [8, 8, 1]])
def test_max_length_from_position_gradient(lengths):
  model = tiny_gpt2(tied=True)
  ids, mask = batch(lengths, seed=len(lengths))
  grads = fl.client_gradient(model, model.params, ids, mask)
  pos = get_path(grads, model.paths.position_embeddings)
  assert int(bow.max_length_from_positions(pos)) == max(lengths)
  assert int(jax.jit(bow.max_length_from_positions)(pos)) == max(lengths)


def test_pruned_gradient_keeps_precision_one():
  model = tiny_gpt2(tied=False)
  ids, mask = batch([9, 9, 9], seed=3)
  grads = fl.client_gradient(
    model, model.params, ids, mask, defense=fl.gradient_pruning(0.99)
  )
  bag = bow.bag_of_words(model, model.params, grads, method='nonzero')
  truth = input_tokens(ids, mask)
  assert bag.ids.size > 0
  assert set(bag.ids.tolist()) <= truth


def test_dp_threshold_rule():
  assert bow.dp_threshold(0.5, 768) == pytest.approx(
    0.5 * math.sqrt(2 * math.log(768))
  )
  rng = np.random.default_rng(0)
  sigma, d = 0.01, 256
  rows = rng.normal(0, sigma, (500, d)).astype(np.float32)
  true = rng.choice(500, 30, replace=False)
  rows[true, rng.integers(0, d, 30)] += 20 * sigma  # a strong coordinate
  found = np.asarray(bow.dp_rows(jnp.asarray(rows), sigma))
  tau = sigma * math.sqrt(2 * math.log(d))
  np.testing.assert_array_equal(found, np.abs(rows).max(1) > tau)
  assert found[true].all()
  # Pure-noise rows pass τ with probability ~ 1/sqrt(pi log d) (~0.24).
  assert found.sum() - 30 < 0.35 * 470
  assert np.array_equal(
    found,
    np.asarray(
      jax.jit(bow.dp_rows, static_argnums=1)(jnp.asarray(rows), sigma)
    ),
  )


def test_target_sign_separates_targets_from_absent_tokens():
  """Test 2's premise on a synthetic tied head with peaked predictions."""
  rng = np.random.default_rng(0)
  v, d, n = 200, 32, 12
  w = rng.normal(0, 1, (v, d))
  targets = rng.choice(v, n, replace=False)
  # Hidden states that predict their target (a trained model, p ~ 0.1-0.9).
  h = 0.2 * w[targets] + 0.05 * rng.normal(0, 1, (n, d))
  logits = h @ w.T
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  y = np.zeros_like(p)
  y[np.arange(n), targets] = 1
  g = (p - y).T @ h / n  # the output side of ∇W
  t = np.asarray(
    bow.target_scores(jnp.asarray(g, jnp.float32), jnp.asarray(w, jnp.float32))
  )
  absent = np.setdiff1d(np.arange(v), targets)
  # Absent rows are positive combinations of h with weights p: t_v <= ~0.
  assert t[absent].max() <= 1e-2 * np.abs(t).max()
  assert t[targets].min() > 10 * t[absent].max()


def test_layer_norm_span_residuals_match_brute_force():
  rng = np.random.default_rng(1)
  v, p, d = 40, 6, 16
  emb = rng.normal(0, 1, (v, d)).astype(np.float32)
  pos = rng.normal(0, 0.5, (p, d)).astype(np.float32)
  scale = rng.uniform(0.5, 1.5, d).astype(np.float32)
  bias = rng.normal(0, 0.1, d).astype(np.float32)
  eps = 1e-5

  def ln(x):
    x = x - x.mean(-1, keepdims=True)
    return scale * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) + bias

  used = [(3, 0), (7, 1), (11, 4), (3, 5)]
  x_used = np.stack([ln(emb[a] + pos[b]) for a, b in used])
  g1 = x_used.T @ rng.normal(0, 1, (len(used), 24))  # [d, out], rank 4
  res, rank, valid = bow.layer_norm_span_residuals(
    jnp.asarray(g1),
    jnp.asarray(emb),
    jnp.asarray(pos),
    jnp.asarray(scale),
    jnp.asarray(bias),
    eps,
  )
  q, _ = np.linalg.qr(x_used.T)
  brute = np.zeros(v)
  for a in range(v):
    r = [
      np.linalg.norm(ln(emb[a] + pos[b]) - q @ (q.T @ ln(emb[a] + pos[b])))
      / np.linalg.norm(ln(emb[a] + pos[b]))
      for b in range(p)
    ]
    brute[a] = min(r)
  assert int(rank) == 4 and bool(valid)
  np.testing.assert_allclose(np.asarray(res), brute, atol=2e-3)
  assert set(np.flatnonzero(np.asarray(res) < 1e-2)) == {3, 7, 11}


@pytest.mark.parametrize('family', ['llama', 'gpt2'])
def test_tied_bag_finds_every_input_token_and_nothing_else(family):
  model = tiny_llama() if family == 'llama' else tiny_gpt2(tied=True)
  ids, mask = batch([6, 4, 7], seed=5)
  grads = fl.client_gradient(model, model.params, ids, mask)
  bag = bow.bag_of_words(model, model.params, grads)
  assert bag.method == 'tied'
  assert bool(bag.evidence.span_valid)
  found = set(bag.ids.tolist())
  truth = set(ids[mask > 0].tolist())
  assert input_tokens(ids, mask) <= found <= truth


def test_tied_bag_is_the_same_under_jit():
  model = tiny_llama()
  ids, mask = batch([5, 5, 5], seed=7)
  grads = fl.client_gradient(model, model.params, ids, mask)
  rows = get_path(grads, model.paths.word_embeddings)
  res, _, valid = bow.span_residuals(model, model.params, grads)
  w = model.word_embeddings(model.params)
  eager = bow.tied_bag(rows, w, res, valid)
  jitted = jax.jit(bow.tied_bag)(rows, w, res, valid)
  assert np.array_equal(np.asarray(eager), np.asarray(jitted))


def test_norm_baseline_and_unknown_method():
  model = tiny_llama()
  ids, mask = batch([5, 3, 4], seed=8)
  grads = fl.client_gradient(model, model.params, ids, mask)
  bag = bow.bag_of_words(model, model.params, grads, method='norm')
  assert bag.method == 'norm'
  with pytest.raises(Exception, match='unknown bag-of-words method'):
    bow.bag_of_words(model, model.params, grads, method='magic')
  with pytest.raises(Exception, match='noise_std'):
    bow.bag_of_words(model, model.params, grads, method='dp')
