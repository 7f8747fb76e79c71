"""Tests of leakjax.recovery.bag and .span (FILM Sec. 4.2, 6.3)."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import fl
from leakjax.errors import LeakjaxError
from leakjax.models import FirstLayerInputs, get_path, gpt2, llama
from leakjax.recovery import bag as bow
from leakjax.recovery import span as span_lib

VOCAB = 300


@functools.cache
def tiny_gpt2(tied: bool):
  """`(model, params)`."""
  config = gpt2.GPT2Config.tiny(
    vocab_size=VOCAB, n_positions=32, n_layer=1, tie_word_embeddings=tied
  )
  return gpt2.init_model(config, key=jax.random.key(1))


@functools.cache
def tiny_llama():
  """`(model, params)`."""
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


@pytest.mark.slow
def test_untied_nonzero_rows_are_exactly_the_input_tokens():
  model, params = tiny_gpt2(tied=False)
  ids, mask = batch([7, 4, 9])
  grads = fl.client_gradient(model, params, ids, mask)
  rows = get_path(grads, model.paths.word_embeddings)
  found = set(np.flatnonzero(np.asarray(bow.nonzero_rows(rows))).tolist())
  assert found == input_tokens(ids, mask)
  bag = bow.extract_bag(model, params, grads)
  assert bag.method == 'nonzero'
  assert set(bag.ids.tolist()) == found
  assert bag.max_length == 9


@pytest.mark.parametrize('lengths', [[3, 2, 1], [5, 9, 2], [8, 8, 1]])
@pytest.mark.slow
def test_max_length_from_position_gradient(lengths):
  model, params = tiny_gpt2(tied=True)
  ids, mask = batch(lengths, seed=len(lengths))
  grads = fl.client_gradient(model, params, ids, mask)
  pos = get_path(grads, model.paths.position_embeddings)
  assert int(bow.max_length_from_positions(pos)) == max(lengths)
  assert int(jax.jit(bow.max_length_from_positions)(pos)) == max(lengths)


@pytest.mark.slow
def test_pruned_gradient_keeps_precision_one():
  model, params = tiny_gpt2(tied=False)
  ids, mask = batch([9, 9, 9], seed=3)
  grads = fl.client_gradient(
    model, params, ids, mask, defense=fl.gradient_pruning(0.99)
  )
  bag = bow.extract_bag(model, params, grads, method='nonzero')
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


@pytest.mark.slow
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
  res, rank, valid = span_lib.layer_norm_span_residuals(
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


@pytest.mark.slow
@pytest.mark.parametrize('family', ['llama', 'gpt2'])
def test_tied_bag_finds_every_input_token_and_nothing_else(family):
  model, params = tiny_llama() if family == 'llama' else tiny_gpt2(tied=True)
  ids, mask = batch([6, 4, 7], seed=5)
  grads = fl.client_gradient(model, params, ids, mask)
  bag = bow.extract_bag(model, params, grads)
  assert bag.method == 'tied'
  assert bool(bag.evidence.span_valid)
  found = set(bag.ids.tolist())
  truth = set(ids[mask > 0].tolist())
  assert input_tokens(ids, mask) <= found <= truth


@pytest.mark.slow
def test_tied_bag_is_the_same_under_jit():
  model, params = tiny_llama()
  ids, mask = batch([5, 5, 5], seed=7)
  grads = fl.client_gradient(model, params, ids, mask)
  rows = get_path(grads, model.paths.word_embeddings)
  res, _, valid = span_lib.span_residuals(model, params, grads)
  w = model.word_embeddings(params)
  eager = bow.tied_bag(rows, w, res, valid)
  jitted = jax.jit(bow.tied_bag)(rows, w, res, valid)
  assert np.array_equal(np.asarray(eager), np.asarray(jitted))


def test_norm_baseline_and_unknown_method():
  model, params = tiny_llama()
  ids, mask = batch([5, 3, 4], seed=8)
  grads = fl.client_gradient(model, params, ids, mask)
  bag = bow.extract_bag(model, params, grads, method='norm')
  assert bag.method == 'norm'
  with pytest.raises(LeakjaxError, match='unknown bag-of-words method'):
    bow.extract_bag(model, params, grads, method='magic')
  with pytest.raises(LeakjaxError, match='unknown bag-of-words method'):
    bow.bag_mask(model, params, grads, method='magic')
  with pytest.raises(LeakjaxError, match='noise_std'):
    bow.extract_bag(model, params, grads, method='dp')


# ------------------------------------------- declared facts, no families
@pytest.mark.slow
def test_span_residuals_keep_the_family_arithmetic_bit_for_bit():
  """The declared-facts span test equals the per-family formulas it replaced."""
  # Llama / SmolLM2: RMSNorm(w_v) * scale, no positions.
  model, params = tiny_llama()
  ids, mask = batch([6, 4, 7], seed=5)
  grads = fl.client_gradient(model, params, ids, mask)
  attn = grads['layers_0']['attn']
  g1 = jnp.concatenate(
    [attn[n]['kernel'] for n in ('q_proj', 'k_proj', 'v_proj')], axis=1
  )
  np.testing.assert_array_equal(
    span_lib.first_layer_input_grad(model, grads), g1
  )
  w32 = params['embed']['embedding'].astype(jnp.float32)
  x = (
    params['layers_0']['attn_norm']['scale']
    * w32
    * jax.lax.rsqrt(
      jnp.mean(w32 * w32, -1, keepdims=True) + model.config.rms_norm_eps
    )
  )
  want = span_lib.input_span_residuals(g1, x)
  got = span_lib.span_residuals(model, params, grads)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # GPT-2: LN(w_v + p_t) over the positions of the longest sentence.
  model, params = tiny_gpt2(tied=True)
  grads = fl.client_gradient(model, params, ids, mask)
  g1 = grads['h_0']['attn']['c_attn']['kernel']
  np.testing.assert_array_equal(
    span_lib.first_layer_input_grad(model, grads), g1
  )
  ln = params['h_0']['ln_1']
  want = span_lib.layer_norm_span_residuals(
    g1,
    params['wte']['embedding'],
    params['wpe']['embedding'][:7],
    ln['scale'],
    ln['bias'],
    model.config.layer_norm_epsilon,
  )
  got = span_lib.span_residuals(model, params, grads, 7)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_without_attention_inputs_has_no_span_test():
  model, params = tiny_llama()
  bare = model.replace(
    paths=dataclasses.replace(model.paths, attention_inputs=())
  )
  ids, mask = batch([6, 4, 7], seed=5)
  grads = fl.client_gradient(model, params, ids, mask)
  assert span_lib.first_layer_input_grad(bare, grads) is None
  assert span_lib.span_residuals(bare, params, grads) is None
  bag = bow.extract_bag(bare, params, grads, method='tied')
  assert not bool(bag.evidence.span_valid)  # test 3 instead of test 1


def _layer_without_positions(params):
  return FirstLayerInputs(
    tokens=params['embed']['embedding'],
    positions=None,
    scale=params['layers_0']['attn_norm']['scale'],
    bias=None,
    eps=1e-5,
    kind='layer',
  )


def test_unsupported_first_layer_inputs_are_a_clear_error():
  model, params = tiny_llama()
  odd = model.replace(first_layer_fn=_layer_without_positions)
  ids, mask = batch([6, 4, 7], seed=5)
  grads = fl.client_gradient(model, params, ids, mask)
  with pytest.raises(LeakjaxError, match="kind 'layer'"):
    span_lib.span_residuals(odd, params, grads)


BAG_MASK = jax.jit(bow.bag_mask, static_argnames=('model', 'method', 'config'))


@pytest.mark.slow
@pytest.mark.parametrize(
  'family,method',
  [
    ('llama', 'auto'),  # tied
    ('gpt2', 'tied'),  # positions masked past the longest sentence
    ('gpt2', 'norm'),
    ('gpt2_untied', 'auto'),  # nonzero
  ],
)
def test_bag_mask_under_jit_equals_the_host_wrapper(family, method):
  model, params = {
    'llama': tiny_llama,
    'gpt2': functools.partial(tiny_gpt2, True),
    'gpt2_untied': functools.partial(tiny_gpt2, False),
  }[family]()
  ids, mask = batch([6, 4, 2], seed=11)
  grads = fl.client_gradient(model, params, ids, mask)
  bag = bow.extract_bag(model, params, grads, method=method)
  jitted = BAG_MASK(model, params, grads, method=method)
  assert jitted.dtype == jnp.bool_ and jitted.shape == (VOCAB,)
  np.testing.assert_array_equal(np.asarray(jitted), bag.mask)
  eager = bow.bag_mask(model, params, grads, method=method)
  np.testing.assert_array_equal(np.asarray(eager), bag.mask)
  assert bag.ids.size > 0


def test_bag_mask_takes_a_traced_noise_std():
  model, params = tiny_gpt2(tied=False)
  ids, mask = batch([6, 4, 2], seed=12)
  grads = fl.client_gradient(model, params, ids, mask)
  noise = 1e-4
  bag = bow.extract_bag(model, params, grads, noise_std=noise)
  assert bag.method == 'dp'
  fn = jax.jit(bow.bag_mask, static_argnames=('model', 'method'))
  traced = fn(model, params, grads, method='auto', noise_std=jnp.float32(noise))
  np.testing.assert_array_equal(np.asarray(traced), bag.mask)
  # vmap over several noise levels: one kernel, one mask each.
  masks = jax.vmap(
    lambda s: bow.bag_mask(model, params, grads, method='dp', noise_std=s)
  )(jnp.asarray([noise, 1e3], jnp.float32))
  np.testing.assert_array_equal(np.asarray(masks[0]), bag.mask)
  assert not np.asarray(masks[1]).any()


def test_bag_mask_compiles_once_for_new_params():
  model, params = tiny_llama()
  ids, mask = batch([5, 5, 5], seed=13)
  traces = []

  def kernel(params, grads):
    traces.append(1)
    return bow.bag_mask(model, params, grads, method='tied')

  fn = jax.jit(kernel)
  for scale in (1.0, 1.5):
    p = jax.tree.map(lambda x, s=scale: x * s, params)
    grads = fl.client_gradient(model, p, ids, mask)
    fn(p, grads)
  assert len(traces) == 1


@pytest.mark.slow
def test_tied_bag_with_a_silent_embedding_gradient():
  """Frozen embeddings: ∇W = 0, so only the span test can name tokens; it
  is used without a spectral gap while the rank leaves room."""
  v, d = 40, 10
  w = jax.random.normal(jax.random.key(0), (v, d))
  silent = jnp.zeros((v, d))
  # Tokens 0, 1, 2 lie on the span (residual < span_tolerance 0.05).
  residual = jnp.concatenate(
    [jnp.asarray([0.0, 0.01, 0.02]), jnp.full(v - 3, 0.5)]
  )
  kw = dict(span_residual=residual, span_valid=jnp.asarray(False))
  bag = bow.tied_bag(silent, w, span_rank=jnp.asarray(3), **kw)
  np.testing.assert_array_equal(np.flatnonzero(bag), [0, 1, 2])
  # Rank past max_rank_fraction (0.9) of d: the span says nothing.
  assert not bow.tied_bag(silent, w, span_rank=jnp.asarray(10), **kw).any()
  # A gradient with rows keeps the rule: no gap -> norm outliers, and
  # here none of the span's tokens stands out.
  rows = silent.at[20].set(w[20] * 1e3)
  bag = bow.tied_bag(rows, w, span_rank=jnp.asarray(3), **kw)
  assert not bag[:3].any()
