"""DAGER's span kernels (leakjax.attacks.dager) against NumPy and brute force.

Every kernel is checked against an independent reference on tiny random
models (a GPT-2 with learned positions and a Llama with RoPE, vocab 101,
width 32, 2 blocks): the span and its residuals against `np.linalg.svd`,
the layer-1 token filter against the normalised embeddings computed in
NumPy, the incremental block-1 decode against the full forward, the
layer-2 extension residuals against one forward per extension, and
:func:`recover` end to end on FedSGD gradients of 2-sentence batches.

The default :class:`SpanConfig` tolerances hold on these untrained models.
Measured on the two batches below (13 and 16 distinct input tokens),
layer 1: inputs <= 1.7e-4 (GPT-2; <= 2e-6 Llama) vs every other token
>= 0.32, tolerance 1e-2; layer 2: true extensions of true prefixes
<= 1.8e-6 vs every wrong one >= 0.035, tolerance 5e-4 (on Llama, runs of a
sentence's first token excepted, which the search refuses: see
:func:`assert_recovered`).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import fl, models, sharding
from leakjax._jit import jitted
from leakjax.attacks import dager
from leakjax.attacks.dager import search as sr
from leakjax.errors import LeakjaxError
from leakjax.models import get_path, gpt2, llama
from leakjax.recovery import span as span_lib

V, D = 101, 32
FAMILIES = ('gpt2', 'llama')
CONFIG = dager.DagerAttackConfig(max_live=8, max_done=8, max_length=10, chunk=8)
TOLERANCE = sr.SpanConfig().layer2_tolerance

# Jitted: one compile beats op-by-op dispatch on a 2-core CI machine.
token_filter = jax.jit(sr.token_filter, static_argnames=('model', 'config'))
extension_residuals = jax.jit(
  sr.extension_residuals, static_argnames=('model', 'chunk')
)


@functools.partial(jax.jit, static_argnames=('model', 'layer'))
def block_inputs(model, params, ids, layer):
  return model.block_inputs(params, ids, layer=layer)


@functools.partial(jax.jit, static_argnames=('model', 'layer'))
def block_decode(model, params, cache, ids, layer):
  return model.block_decode(params, cache, ids, layer=layer)


# Sentences of distinct tokens (1..V-1: token 0 is the padding id, so a
# padded position could never pass for a real one).
_PERM = (1 + np.random.default_rng(0).permutation(V - 1)).tolist()
BATCHES = {
  'equal': [_PERM[:9], _PERM[9:18]],  # 16 non-final tokens: 16 candidates
  'padded': [_PERM[20:29], _PERM[29:35]],  # 13: also 16 after padding
}  # both [2, 9]: one compiled client gradient per model


@functools.cache
def tiny(family):
  """`(model, params)`: a random 2-block model of `family`."""
  key = jax.random.key(0)
  if family == 'gpt2':
    config = gpt2.GPT2Config.tiny(
      vocab_size=V, n_embd=D, n_layer=2, n_head=4, n_positions=16
    )
    return gpt2.init_model(config, key=key)
  config = llama.LlamaConfig(
    vocab_size=V,
    hidden_size=D,
    intermediate_size=2 * D,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
  )
  return llama.init_model(config, key=key)


def pad(rows):
  """Right-padded int32 `(ids, mask)` of `rows`."""
  t = max(len(r) for r in rows)
  ids = np.zeros((len(rows), t), np.int32)
  mask = np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    ids[i, : len(r)] = r
    mask[i, : len(r)] = 1
  return jnp.asarray(ids), jnp.asarray(mask)


@functools.cache
def gradient(family, batch):
  """The FedSGD gradient of `BATCHES[batch]` on `tiny(family)`."""
  model, params = tiny(family)
  ids, mask = pad(BATCHES[batch])
  return fl.client_gradient(
    model, params, ids, mask, defense=fl.Defense(), key=jax.random.key(0)
  )


def inputs_of(rows):
  """The tokens whose position has a gradient: all but each row's last."""
  return sorted({v for r in rows for v in r[:-1]})


def numpy_residuals(x, basis):
  """`‖x − QQᵀx‖ / ‖x‖` over the last axis, in float64."""
  x = np.asarray(x, np.float64)
  res = x - (x @ basis) @ basis.T
  return np.linalg.norm(res, axis=-1) / np.linalg.norm(x, axis=-1)


def numpy_basis(grad, rank):
  """The first `rank` left singular vectors of `grad`."""
  return np.linalg.svd(np.asarray(grad, np.float64))[0][:, :rank]


# ---------------------------------------------------------------- span.py
def test_span_of_and_residuals_match_numpy_svd():
  rng = np.random.default_rng(1)
  n, d, out = 10, 48, 96
  x = rng.standard_normal((n, d)).astype(np.float32)
  delta = rng.standard_normal((n, out)).astype(np.float32)
  g = x.T @ delta  # ∂L/∂W of y = x W over the n rows of x
  span = jax.jit(span_lib.span_of)(jnp.asarray(g))
  assert int(span.rank) == n
  assert bool(span.valid)
  assert float(span.log_gap) > 3  # float32 noise floor vs O(1) values
  q = numpy_basis(g, n)
  basis = np.asarray(span.basis, np.float64)
  np.testing.assert_array_equal(basis[:, n:], 0.0)
  np.testing.assert_allclose(basis @ basis.T, q @ q.T, atol=1e-4)
  # The inputs lie in the span.
  np.testing.assert_array_less(np.asarray(span_lib.residuals(span, x)), 1e-4)
  # Random vectors, and in-span vectors plus a growing random part (so the
  # residuals spread over (0, 1)), with a leading batch axis.
  y = rng.standard_normal((3, 8, d))
  y[1] = rng.standard_normal((8, n)) @ x + 0.1 * y[1]
  y[2] = rng.standard_normal((8, n)) @ x + np.linspace(0, 3, 8)[:, None] * y[2]
  got = np.asarray(span_lib.residuals(span, jnp.asarray(y, jnp.float32)))
  want = numpy_residuals(y, q)
  assert got.shape == (3, 8)
  assert want.min() < 0.1 and want.max() > 0.8
  np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.parametrize('d, out', [(48, 96), (96, 48)])
def test_accurate_spectrum_matches_a_float64_svd_down_to_its_floor(d, out):
  # A rank-12 float32 gradient with a spread spectrum (1 .. 1e-5): its
  # singular values and span against NumPy's float64 SVD of the same
  # float32 matrix; past the rank, nothing below sqrt(eps64) of the
  # largest (no drop to a clamped zero can pass for the rank).
  rng = np.random.default_rng(4)
  n = 12
  x = rng.standard_normal((d, n)) * np.logspace(0, -5, n)
  g = (x @ rng.standard_normal((n, out))).astype(np.float32)
  u, s = jax.jit(span_lib.accurate_spectrum)(jnp.asarray(g))
  k = min(d, out)
  assert u.shape == (d, k) and s.shape == (k,)
  want = np.linalg.svd(g.astype(np.float64), compute_uv=False)
  s = np.asarray(s, np.float64)
  np.testing.assert_allclose(s[:n], want[:n], rtol=1e-5)
  floor = np.sqrt(np.finfo(np.float64).eps) * want[0]
  assert s[n:].min() >= floor * (1 - 1e-6)
  assert s[n:].max() < 1e-6 * want[0]
  q = numpy_basis(g, n)
  basis = np.asarray(u[:, :n], np.float64)
  np.testing.assert_allclose(basis @ basis.T, q @ q.T, atol=1e-5)
  # The rank rule on it: the drop at n is the float64 spectrum's, down to
  # the floor.
  span = span_lib.span_of(jnp.asarray(g))
  assert int(span.rank) == n and bool(span.valid)
  gap = np.log10(want[n - 1] / max(want[n], floor))
  np.testing.assert_allclose(float(span.log_gap), gap, atol=0.05)


@pytest.mark.parametrize('k, used', [(48, 10), (48, 0), (48, 48), (130, 65)])
def test_project_reads_the_basis_up_to_its_last_nonzero_column(k, used):
  # Blocks of 64 columns up to the last non-zero one; past it the columns
  # are zero, so the product equals the whole one (and costs the rank's).
  rng = np.random.default_rng(3)
  d = 48
  basis = np.zeros((d, k), np.float32)
  basis[:, :used] = rng.standard_normal((d, used))
  x = rng.standard_normal((5, 7, d)).astype(np.float32)
  got = np.asarray(span_lib.project(jnp.asarray(x), jnp.asarray(basis)))
  want = (x.astype(np.float64) @ basis) @ basis.T
  assert got.shape == x.shape
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
  'n, max_rank_fraction, valid',
  [
    (53, 0.9, False),  # n > d: full rank, no gap in the spectrum
    (45, 0.9, False),  # a clear gap at 45 > 0.9 * 48
    (45, 0.97, True),  # the same gradient, below 0.97 * 48
  ],
)
def test_span_of_detects_the_rank_limit(n, max_rank_fraction, valid):
  rng = np.random.default_rng(2)
  d, out = 48, 96
  x = rng.standard_normal((n, d)).astype(np.float32)
  delta = rng.standard_normal((n, out)).astype(np.float32)
  span = span_lib.span_of(
    jnp.asarray(x.T @ delta), max_rank_fraction=max_rank_fraction
  )
  assert bool(span.valid) == valid
  if valid:
    assert int(span.rank) == n


# ------------------------------------------------------- the token filter
def numpy_first_layer_residuals(model, params, grads, rank):
  """Each token's smallest residual over positions, from NumPy alone.

  Llama: RMSNorm(e_v)·γ; GPT-2: LN(e_v + p_t)·γ + β at every position t.
  """
  inputs = model.first_layer_inputs(params)
  g1 = np.concatenate(
    [np.asarray(get_path(grads, p)) for p in model.paths.attention_inputs[0]],
    axis=1,
  )
  q = numpy_basis(g1, rank)
  e = np.asarray(inputs.tokens, np.float64)
  scale = np.asarray(inputs.scale, np.float64)
  if inputs.positions is None:
    assert inputs.kind == 'rms'
    x = e / np.sqrt((e * e).mean(-1, keepdims=True) + inputs.eps) * scale
    x = x[:, None]  # [V, 1, d]
  else:
    assert inputs.kind == 'layer'
    z = e[:, None] + np.asarray(inputs.positions, np.float64)[None]
    z = z - z.mean(-1, keepdims=True)
    z = z / np.sqrt((z * z).mean(-1, keepdims=True) + inputs.eps)
    x = z * scale + np.asarray(inputs.bias, np.float64)  # [V, P, d]
  return numpy_residuals(x, q).min(1)


@pytest.mark.slow
@pytest.mark.parametrize('family', FAMILIES)
def test_token_filter_finds_exactly_the_input_tokens(family):
  model, params = tiny(family)
  rows = BATCHES['padded']
  grads = gradient(family, 'padded')
  mask, res, span = token_filter(model, params, grads)
  expected = inputs_of(rows)
  # Distinct tokens: one span dimension per position with a gradient. The
  # last token of each row is not an input (its output predicts nothing),
  # nor is the padding.
  assert int(span.rank) == len(expected) and bool(span.valid)
  assert np.flatnonzero(np.asarray(mask)).tolist() == expected
  assert rows[0][-1] not in expected and rows[1][-1] not in expected
  want = numpy_first_layer_residuals(model, params, grads, len(expected))
  res = np.asarray(res)
  # GPT-2's residuals come from inner products (no [V, P, d] tensor): the
  # cancellation costs ~2e-4 near zero, where the square root magnifies it.
  np.testing.assert_allclose(res, want, atol=5e-4, rtol=1e-3)
  assert res[expected].max() < 1e-3
  assert np.delete(res, expected).min() > 0.1


# ----------------------------------------------------- block_inputs/decode
def prefix_recompute_model(family):
  """`tiny(family)` as a user's model with block_inputs, no block_decode."""
  model, _ = tiny(family)
  return models.from_functions(
    model.logits_fn,
    vocab_size=V,
    word_embeddings=model.paths.word_embeddings,
    block_inputs=model.block_input_fn,
  )


@pytest.mark.slow
@pytest.mark.parametrize('layer', [0, 1])
@pytest.mark.parametrize('build', ['gpt2', 'llama', 'gpt2_prefix'])
def test_block_decode_in_two_chunks_equals_block_inputs(build, layer):
  family = build.split('_')[0]
  model, params = tiny(family)
  if build.endswith('_prefix'):
    model = prefix_recompute_model(family)
    assert model.block_decode_fn is None
  ids, _ = pad(BATCHES['equal'])
  want = block_inputs(model, params, ids, layer)
  assert want.shape == (2, 9, D)
  cache = model.init_block_cache(params, 2, 12, layer=layer)
  first, cache = block_decode(model, params, cache, ids[:, :3], layer)
  second, _ = block_decode(model, params, cache, ids[:, 3:], layer)
  got = jnp.concatenate([first, second], axis=1)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------ the layer-2 search
@pytest.mark.slow
@pytest.mark.parametrize('length', [0, 3])
@pytest.mark.parametrize('family', FAMILIES)
def test_extension_residuals_match_brute_force(family, length):
  model, params = tiny(family)
  rows = BATCHES['equal']
  span2 = span_lib.span_of(
    dager.block_gradient(model, gradient(family, 'equal'), 1)
  )
  assert int(span2.rank) == len(inputs_of(rows)) and bool(span2.valid)
  # Live rows 0 and 1 hold the true prefixes of `length` tokens.
  prefixes = np.array([r[:length] for r in rows], np.int32)
  state = sr.init_state(model, params, 2, 2, CONFIG.max_length)
  if length:
    _, cache = block_decode(
      model, params, state.cache, jnp.asarray(prefixes), 1
    )
    state = state.replace(
      live=state.live.at[:, :length].set(prefixes),
      live_ok=jnp.ones(2, bool),
      cache=cache,
      step=jnp.asarray(length, jnp.int32),
    )
  state = state.replace(live_ok=jnp.ones(2, bool))
  candidates = np.concatenate([np.arange(V), np.zeros(3)]).astype(np.int32)
  got = extension_residuals(
    model, params, span2, state, jnp.asarray(candidates), chunk=8
  )
  assert got.shape == (2, len(candidates))
  # Brute force: one forward of every prefix + [c] through block 1.
  seqs = np.concatenate(
    [np.repeat(prefixes, len(candidates), 0), np.tile(candidates, 2)[:, None]],
    axis=1,
  )
  x = block_inputs(model, params, jnp.asarray(seqs), 1)[:, -1]
  want = np.asarray(span_lib.residuals(span2, x)).reshape(2, -1)
  np.testing.assert_allclose(got, want, atol=1e-4)
  # The span test separates the true next token from every other one.
  for row, prefix in enumerate(prefixes.tolist()):
    nexts = {r[length] for r in rows if r[:length] == prefix}
    true = np.isin(candidates, list(nexts))
    assert np.asarray(got)[row, true].max() < TOLERANCE
    assert np.asarray(got)[row, ~true].min() > 20 * TOLERANCE
  # Only live rows and valid candidates are decoded, the rest is inf.
  valid = np.arange(len(candidates)) % 3 != 1
  one_live = state.replace(live_ok=jnp.array([False, True]))
  part = np.asarray(
    extension_residuals(
      model,
      params,
      span2,
      one_live,
      jnp.asarray(candidates),
      jnp.asarray(valid),
      chunk=8,
    )
  )
  assert np.isinf(part[0]).all() and np.isinf(part[1, ~valid]).all()
  np.testing.assert_allclose(part[1, valid], want[1, valid], atol=1e-4)


@pytest.mark.parametrize('batch', BATCHES)
@pytest.mark.parametrize('family', FAMILIES)
@pytest.mark.slow
def test_last_token_scores_are_one_hot_on_the_last_targets(family, batch):
  # FedSGD: given every prefix, the head gradient is linear in the last
  # targets, so each prefix's row of scores is ~1 at its sentence's last
  # token and ~0 elsewhere; the loss and the head inputs share one forward,
  # whose logits equal the model's own.
  model, params = tiny(family)
  rows = BATCHES[batch]
  ids, mask = pad([r[:-1] for r in rows])
  scores = jax.jit(
    dager.pipeline.last_token_scores, static_argnames=('model',)
  )(model, params, gradient(family, batch), jnp.asarray(ids), mask)
  last = [r[-1] for r in rows]
  want = np.zeros((len(rows), V))
  want[np.arange(len(rows)), last] = 1.0
  # A tied head also gets input-side terms on the prefixes' tokens.
  outside = ~np.isin(np.arange(V), ids[mask.astype(bool)])
  np.testing.assert_allclose(scores[:, outside], want[:, outside], atol=1e-3)
  assert np.asarray(scores).argmax(1).tolist() == last
  hidden = model.hidden_states(params, jnp.asarray(ids), mask)[-1]
  np.testing.assert_allclose(
    model.lm_head(params, hidden),
    model.logits(params, jnp.asarray(ids), mask),
    rtol=1e-5,
    atol=1e-5,
  )

  def no_logits(*args):
    raise AssertionError('a second forward through model.logits')

  one_pass = dataclasses.replace(model, logits_fn=no_logits)
  again = dager.pipeline.last_token_scores(
    one_pass, params, gradient(family, batch), jnp.asarray(ids), mask
  )
  np.testing.assert_allclose(again, scores, atol=1e-5)


def assert_recovered(family, rows, result):
  assert not result.rank_limited and result.valid1 and result.valid2
  assert result.rank1 == result.rank2 == len(inputs_of(rows))
  assert sorted(result.candidates.tolist()) == inputs_of(rows)
  assert result.dropped == 0
  for row in rows:
    assert row in result.sequences
  # Nothing else passes. (On Llama without a start token, runs `t t ... t`
  # of a sentence's first token would: every position sees the same
  # values, so their block-2 input is t's at position 0; the search
  # refuses them for models without position embeddings.)
  assert not [s for s in result.sequences if s not in rows]
  assert sorted(result.prefixes) == sorted(r[:-1] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize('batch', BATCHES)
@pytest.mark.parametrize('family', FAMILIES)
def test_recover_finds_the_batch_exactly(family, batch):
  model, params = tiny(family)
  result = dager.recover(model, params, gradient(family, batch), config=CONFIG)
  assert_recovered(family, BATCHES[batch], result)
  assert result.texts is None  # no tokenizer


@pytest.mark.slow
def test_search_split_over_a_mesh_decides_the_same():
  # conftest fakes 8 CPU devices: the decode passes (chunk 8 extensions)
  # are split over 4 of them; the recovered sentences, their residuals
  # and what was dropped equal the one-device search's.
  model, params = tiny('llama')
  grads = gradient('llama', 'equal')
  one = dager.recover(model, params, grads, config=CONFIG)
  mesh = sharding.make_mesh('data:4')
  split = dager.recover(model, params, grads, config=CONFIG, mesh=mesh)
  assert split.sequences == one.sequences and split.dropped == one.dropped
  # The true sentences' residuals sit at float32's floor (~3e-6), where
  # the split batches' other reduction order moves them by ~1e-8.
  np.testing.assert_allclose(
    split.residuals, one.residuals, rtol=1e-5, atol=1e-7
  )
  assert max(one.residuals) < CONFIG.span.layer2_tolerance
  assert_recovered('llama', BATCHES['equal'], split)
  with pytest.raises(LeakjaxError, match='does not split over 3 devices'):
    dager.recover(
      model, params, grads, config=CONFIG, mesh=sharding.make_mesh('data:3')
    )


def recover_wrappers():
  """The jitted wrappers :func:`dager.recover` calls (`jitted` caches one
  per kernel and options)."""
  return (
    jitted(sr.sequence_search, static_argnames=sr.SEARCH_STATIC),
    jitted(dager.pipeline._layer1, static_argnames=('model', 'config')),
    jitted(dager.pipeline._span2, static_argnames=('model', 'config')),
  )


@pytest.mark.slow
def test_recover_compiles_the_search_once():
  model, params = tiny('gpt2')
  first = dager.recover(model, params, gradient('gpt2', 'equal'), config=CONFIG)
  sizes = tuple(f._cache_size() for f in recover_wrappers())
  assert all(sizes)  # recover called these wrappers
  # Another batch: 13 candidates instead of 16, both padded to 16.
  second = dager.recover(
    model, params, gradient('gpt2', 'padded'), config=CONFIG
  )
  assert len(first.candidates) != len(second.candidates)
  assert tuple(f._cache_size() for f in recover_wrappers()) == sizes
  assert_recovered('gpt2', BATCHES['padded'], second)


# ----------------------------------------------------------------- errors
def test_recover_needs_attention_inputs_and_block_inputs():
  gpt, params = tiny('gpt2')
  grads = gradient('gpt2', 'equal')
  bare = models.from_functions(
    gpt.logits_fn, vocab_size=V, word_embeddings=gpt.paths.word_embeddings
  )
  with pytest.raises(LeakjaxError, match='attention input kernels'):
    dager.recover(bare, params, grads, config=CONFIG)
  # Everything the layer-1 filter reads, but no block_inputs.
  no_blocks = models.from_functions(
    gpt.logits_fn,
    vocab_size=V,
    word_embeddings=gpt.paths.word_embeddings,
    position_embeddings=gpt.paths.position_embeddings,
    attention_inputs=gpt.paths.attention_inputs,
    first_layer_inputs=gpt.first_layer_fn,
  )
  with pytest.raises(LeakjaxError, match='no block_inputs function'):
    dager.recover(no_blocks, params, grads, config=CONFIG)
