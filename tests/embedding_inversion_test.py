"""Tests of BEI, HEI, the DCT defense and the text metrics (Wan et al. 2024)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import metrics, models
from leakjax.attacks.inversion import bei_hei as ei
from leakjax.attacks.inversion import dct, scoring
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, llama
from leakjax.tokenization import gpt2_tokenizer


@functools.lru_cache(maxsize=None)
def tiny_llama(vocab_size=200, tokenizer=None):
  """`(model, params)` of a tiny tied Llama (built once per argument set)."""
  config = llama.LlamaConfig(
    vocab_size=vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
  )
  return llama.init_model(config, key=jax.random.key(0), tokenizer=tokenizer)


@functools.lru_cache(maxsize=None)
def tiny_gpt2():
  """`(model, params)` of a tiny GPT-2 with learned positions."""
  return gpt2.init_model(gpt2.GPT2Config.tiny(n_layer=3), key=jax.random.key(1))


def random_ids(vocab, shape=(3, 7), seed=0):
  ids = jax.random.randint(jax.random.key(seed), shape, 0, vocab)
  mask = jnp.ones(shape, jnp.int32).at[0, 5:].set(0)
  return ids, mask


MODELS = {'llama': tiny_llama, 'gpt2': tiny_gpt2}


# ------------------------------------------------------------------ layers
@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(MODELS))
def test_layer_states_shapes_and_definitions(family):
  model, params = MODELS[family]()
  ids, mask = random_ids(model.vocab_size)
  hs = model.hidden_states(params, ids, mask)
  states = ei.layer_states(model, params, ids, mask, (0, '2', 3, 'last'))
  assert states.shape == (4, 3, 7, model.hidden_size)
  np.testing.assert_array_equal(states[0], hs[0])
  np.testing.assert_array_equal(states[1], hs[2])
  # 'last' is the final norm of the last block: the head's own input.
  logits = model.logits(params, ids, mask)
  np.testing.assert_allclose(
    ei.head_logits(model, params, states[3]), logits, atol=1e-5
  )
  assert not np.allclose(states[3], states[2])


def test_parse_layer_rejects_bad_layers():
  model, _ = tiny_llama()
  assert ei.parse_layer(model, 'last') == 'last'
  assert ei.parse_layer(model, '3') == 3
  for bad in (4, -1, 'deep', '2.5'):
    with pytest.raises(LeakjaxError):
      ei.parse_layer(model, bad)


def test_block_and_norm_paths():
  assert ei.block_paths(*tiny_llama()) == (
    ('layers_0',),
    ('layers_1',),
    ('layers_2',),
  )
  assert ei.block_paths(*tiny_gpt2()) == (('h_0',), ('h_1',), ('h_2',))
  assert ei.final_norm_path(*tiny_llama()) == ('final_norm',)
  assert ei.final_norm_path(*tiny_gpt2()) == ('ln_f',)


def test_block_paths_work_on_traced_params():
  model, params = tiny_llama()
  found = []

  def fn(p):
    found.append(ei.block_paths(model, p))
    return p['embed']['embedding'].sum()

  jax.jit(fn)(params)
  assert found == [(('layers_0',), ('layers_1',), ('layers_2',))]


def _bare_model(flax_model, params, **facts):
  """The Flax model's own logits/hidden/head as a `from_functions` model.

  Plain functions: no interception reaches inside them from the protocol's
  declared facts unless `attention_inputs` says where block 0 is.
  """
  return models.from_functions(
    flax_model.logits_fn,
    vocab_size=flax_model.vocab_size,
    word_embeddings=flax_model.paths.word_embeddings,
    hidden_size=flax_model.hidden_size,
    hidden_states=flax_model.hidden_fn,
    lm_head=flax_model.head_fn,
    **facts,
  )


@pytest.mark.slow
def test_models_that_declare_too_little_get_clear_errors():
  model, params = tiny_llama()
  ids, mask = random_ids(model.vocab_size)
  # No num_layers: layer specs cannot be checked.
  bare = _bare_model(model, params)
  with pytest.raises(LeakjaxError, match='num_layers'):
    ei.parse_layer(bare, 1)
  # No attention_inputs: the blocks cannot be located.
  bare = _bare_model(model, params, num_layers=3)
  with pytest.raises(LeakjaxError, match='attention_inputs'):
    ei.block_paths(bare, params)
  with pytest.raises(LeakjaxError, match='attention_inputs'):
    ei.logits_with_transform(
      bare, params, ids, mask, layer=1, transform=lambda h: h
    )
  # Layer states and HEI need only hidden_states.
  np.testing.assert_array_equal(
    ei.layer_states(bare, params, ids, mask, (0, 2)),
    ei.layer_states(model, params, ids, mask, (0, 2)),
  )
  # Declared attention kernels that no chain of module calls holds.
  wrong = _bare_model(
    model,
    params,
    num_layers=3,
    attention_inputs=((('final_norm', 'scale'),),),
  )
  with pytest.raises(LeakjaxError, match='cannot locate'):
    ei.block_paths(wrong, params)
  # Declaring them is enough for the interventions.
  declared = _bare_model(
    model, params, num_layers=3, attention_inputs=model.paths.attention_inputs
  )
  assert ei.block_paths(declared, params) == ei.block_paths(model, params)
  np.testing.assert_allclose(
    ei.logits_with_transform(
      declared, params, ids, mask, layer=2, transform=lambda h: h
    ),
    model.logits(params, ids, mask),
    atol=1e-5,
  )


def test_head_without_flax_modules_has_no_separable_final_norm():
  model, params = tiny_llama()

  def head(p, h):  # the tied head in plain jnp, with its RMSNorm
    var = jnp.mean(jnp.square(h), axis=-1, keepdims=True)
    h = h * jax.lax.rsqrt(var + 1e-5) * p['final_norm']['scale']
    return h @ p['embed']['embedding'].T

  plain = models.from_functions(
    model.logits_fn,
    vocab_size=model.vocab_size,
    word_embeddings=model.paths.word_embeddings,
    hidden_size=model.hidden_size,
    num_layers=3,
    lm_head=head,
  )
  h = jnp.ones((1, 2, 32))
  with pytest.raises(LeakjaxError, match='final norm'):
    ei.bei_ids(plain, params, h)
  bei = ei.bei_ids(plain, params, h, apply_final_norm=True)
  assert bei.shape == (1, 2)


# --------------------------------------------------------------- HEI, BEI
@pytest.mark.slow
def test_hei_at_layer0_recovers_tokens_exactly():
  model, params = tiny_llama()
  ids, mask = random_ids(200, (4, 9), seed=3)
  h0 = ei.layer_states(model, params, ids, mask, (0,))[0]
  emb = model.word_embeddings(params)
  np.testing.assert_array_equal(ei.hei_ids(h0, emb), ids)
  np.testing.assert_array_equal(jax.jit(ei.hei_ids)(h0, emb), ids)


@pytest.mark.slow
def test_hei_layer0_text_f1_with_real_tokenizer():
  tok = gpt2_tokenizer()
  model, params = tiny_llama(vocab_size=tok.vocab_size, tokenizer=tok)
  texts = [
    'The meeting moved to Thursday afternoon.',
    'Please send the signed contract by Friday!',
  ]
  ids, mask = tok.encode_batch(texts)
  h0 = ei.layer_states(model, params, ids, mask, (0,))[0]
  guess = ei.hei_ids(h0, model.word_embeddings(params))
  decoded = ei.decode_ids(tok, guess, mask)
  assert decoded == texts
  assert min(metrics.token_f1(p, r) for p, r in zip(decoded, texts)) >= 0.95


def test_hei_equals_numpy_cosine_argmax():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 5, 16)).astype(np.float32)
  emb = (rng.normal(size=(50, 16)) * rng.uniform(0.1, 3, (50, 1))).astype(
    np.float32
  )
  cos = (hidden / np.linalg.norm(hidden, axis=-1, keepdims=True)) @ (
    emb / np.linalg.norm(emb, axis=-1, keepdims=True)
  ).T
  np.testing.assert_array_equal(ei.hei_ids(hidden, emb), cos.argmax(-1))
  np.testing.assert_allclose(ei.cosine_scores(hidden, emb), cos, atol=1e-5)


@pytest.mark.parametrize('family', sorted(MODELS))
def test_bei_shapes_and_final_norm_choice(family):
  model, params = MODELS[family]()
  ids, mask = random_ids(model.vocab_size)
  h = ei.layer_states(model, params, ids, mask, (2,))[0]
  bei = ei.bei_ids(model, params, h)
  assert bei.shape == (3, 7) and bei.dtype == jnp.int32
  np.testing.assert_array_equal(
    jax.jit(ei.bei_ids, static_argnames=('model',))(model, params, h), bei
  )
  # Default (Sec. 4.1): the linear head alone, H W^T for these tied models.
  emb = np.asarray(model.word_embeddings(params))
  np.testing.assert_array_equal(bei, (np.asarray(h) @ emb.T).argmax(-1))
  # apply_final_norm=True: the model's whole lm_head (norm + head).
  normed = ei.bei_ids(model, params, h, apply_final_norm=True)
  np.testing.assert_array_equal(
    normed, np.asarray(model.lm_head(params, h)).argmax(-1)
  )


def test_tied_shortcut_equals_separate_bei_and_hei():
  model, params = tiny_llama()
  assert ei.has_tied_linear_head(model)
  ids, mask = random_ids(200)
  h = ei.layer_states(model, params, ids, mask, (3,))[0]
  emb = model.word_embeddings(params)
  bei, hei = ei.tied_bei_hei_ids(h, emb)
  np.testing.assert_array_equal(bei, ei.bei_ids(model, params, h))
  np.testing.assert_array_equal(hei, ei.hei_ids(h, emb))
  both = ei.bei_hei_ids(model, params, h)
  np.testing.assert_array_equal(both[0], bei)
  np.testing.assert_array_equal(both[1], hei)


def test_bei_hei_ids_untied_head():
  config = gpt2.GPT2Config.tiny(n_layer=2, tie_word_embeddings=False)
  model, params = gpt2.init_model(config, key=jax.random.key(4))
  assert not ei.has_tied_linear_head(model)
  ids, mask = random_ids(model.vocab_size)
  h = ei.layer_states(model, params, ids, mask, (1,))[0]
  bei, hei = ei.bei_hei_ids(model, params, h)
  np.testing.assert_array_equal(bei, ei.bei_ids(model, params, h))
  np.testing.assert_array_equal(
    hei, ei.hei_ids(h, model.word_embeddings(params))
  )


def test_jitted_with_static_model_compiles_once_for_new_params():
  model, params = tiny_llama()
  fn = jax.jit(ei.bei_hei_ids, static_argnames=('model',))
  h = jnp.ones((2, 3, 32))
  # Both params sets come from the same kind of op, so that only their
  # values differ (an array's device commitment is part of the cache key).
  fn(model, jax.tree.map(lambda x: x * 1.0, params), h)
  # jax.jit wrappers of one function share its cache: count what we add.
  size = fn._cache_size()
  other = jax.tree.map(lambda x: x + 1.0, params)
  # An equal model built again, new params of the same shapes: cache hit.
  again = llama.make_model(model.config)
  assert again == model and hash(again) == hash(model)
  fn(again, other, h)
  assert fn._cache_size() == size


def test_hei_sharded_over_batch_equals_single_device():
  devices = jax.devices()
  if len(devices) < 8:
    pytest.skip('needs 8 (simulated) devices, see conftest.py')
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(16, 5, 32)), jnp.float32)
  emb = jnp.asarray(rng.normal(size=(300, 32)), jnp.float32)
  mesh = jax.sharding.Mesh(np.array(devices[:8]), ('data',))
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  out = jax.jit(ei.hei_ids)(
    jax.device_put(hidden, shard), jax.device_put(emb, repl)
  )
  assert out.sharding.is_equivalent_to(shard, out.ndim)
  np.testing.assert_array_equal(out, ei.hei_ids(hidden, emb))


# ------------------------------------------------------------ DCT defense
@pytest.mark.slow
@pytest.mark.parametrize('n', [1, 8, 33])
def test_dct_matrix_is_orthonormal_dct2(n):
  c = np.asarray(dct.dct_matrix(n))
  np.testing.assert_allclose(c @ c.T, np.eye(n), atol=1e-5)
  x = np.random.default_rng(n).normal(size=(4, n)).astype(np.float32)
  expected = jax.scipy.fft.dct(jnp.asarray(x), type=2, norm='ortho', axis=-1)
  np.testing.assert_allclose(dct.dct(x), expected, atol=1e-4)
  np.testing.assert_allclose(dct.idct(dct.dct(x)), x, atol=1e-5)
  np.testing.assert_allclose(jax.jit(dct.idct)(dct.dct(x)), x, atol=1e-5)


def test_overlap_matrix_structure():
  subset = [4, 0, 6, 2]
  o = dct.overlap_matrix(subset, 8)
  assert set(np.unique(o)) <= {0.0, 1.0}
  assert o.sum() == 2 * (len(subset) - 1)
  assert np.linalg.matrix_rank(o) == len(subset) - 1
  f = np.arange(1.0, 9.0)
  out = f @ o
  # (f O)[v_j] = f[v_j] + f[v_{j+1}] for j < last; everything else dropped.
  expected = np.zeros(8)
  for a, b in zip(subset[:-1], subset[1:]):
    expected[a] = f[a] + f[b]
  np.testing.assert_array_equal(out, expected)


def test_make_dct_defense_partitions_a_permutation():
  d, k = 24, 3
  defense = dct.make_dct_defense(d, k, key=jax.random.key(5))
  assert sorted(np.asarray(defense.permutation).tolist()) == list(range(d))
  assert defense.overlaps.shape == (k, d, d)
  assert 0 <= defense.selected < k
  # Each subset's matrix touches only its own indices; together all of them.
  touched = [
    set(np.nonzero(np.asarray(o).sum(0) + np.asarray(o).sum(1))[0])
    for o in defense.overlaps
  ]
  assert all(
    not (a & b) for i, a in enumerate(touched) for b in touched[i + 1 :]
  )
  assert set().union(*touched) == set(range(d))
  again = dct.make_dct_defense(d, k, key=jax.random.key(5))
  np.testing.assert_array_equal(again.overlaps, defense.overlaps)
  with pytest.raises(LeakjaxError):
    dct.make_dct_defense(d, d, key=jax.random.key(0))


def test_dct_defense_is_the_linear_map_ct_o_c():
  d = 16
  defense = dct.make_dct_defense(d, 2, key=jax.random.key(2))
  x = np.random.default_rng(0).normal(size=(3, 4, d)).astype(np.float32)
  y = dct.apply_dct_defense(x, defense.overlap)
  np.testing.assert_allclose(y, x @ np.asarray(defense.matrix), atol=1e-5)
  # With O = I the transform is IDCT(DCT(x)) = x: the DCT pair inverts.
  np.testing.assert_allclose(dct.apply_dct_defense(x, jnp.eye(d)), x, atol=1e-5)
  # The selected subset's frequencies survive (minus its last), others not.
  c = np.asarray(dct.dct_matrix(d))
  rank = np.linalg.matrix_rank(np.asarray(defense.matrix), tol=1e-4)
  assert rank == d // 2 - 1
  # A single subset over all features keeps d-1 of d directions.
  full = dct.make_dct_defense(d, 1, key=jax.random.key(3))
  assert np.linalg.matrix_rank(np.asarray(full.matrix), tol=1e-4) == d - 1
  np.testing.assert_allclose(
    np.asarray(full.matrix), c.T @ np.asarray(full.overlap) @ c, atol=1e-5
  )


@pytest.mark.parametrize('family', sorted(MODELS))
def test_logits_with_identity_transform_and_from_hidden(family):
  model, params = MODELS[family]()
  ids, mask = random_ids(model.vocab_size)
  logits = model.logits(params, ids, mask)
  hs = model.hidden_states(params, ids, mask)
  for layer in (0, 2, 3, 'last'):
    same = ei.logits_with_transform(
      model, params, ids, mask, layer=layer, transform=lambda h: h
    )
    np.testing.assert_allclose(same, logits, atol=1e-5)
  np.testing.assert_allclose(
    ei.logits_from_hidden(model, params, hs[1], mask, layer=1),
    logits,
    atol=1e-5,
  )
  changed = ei.logits_with_transform(
    model, params, ids, mask, layer=1, transform=lambda h: -h
  )
  assert np.abs(np.asarray(changed - logits)).max() > 1e-3


@pytest.mark.slow
def test_defended_nll_and_perplexity():
  model, params = tiny_llama()
  ids, mask = random_ids(200, (2, 8))
  nll, count = dct.defended_nll(
    model, params, ids, mask, layer=None, overlap=None
  )
  np.testing.assert_allclose(count, np.asarray(mask)[:, 1:].sum(1))
  np.testing.assert_allclose(
    nll.sum() / count.sum(), model.loss(params, ids, mask), rtol=1e-5
  )
  defense = dct.make_dct_defense(32, 2, key=jax.random.key(0))
  fn = jax.jit(dct.defended_nll, static_argnames=('model', 'layer'))
  nll_d, count_d = fn(
    model, params, ids, mask, layer=1, overlap=defense.overlap
  )
  np.testing.assert_array_equal(count_d, count)
  assert np.all(np.isfinite(nll_d)) and not np.allclose(nll_d, nll)


# ----------------------------------------------------------------- metrics
def test_score_texts():
  out = scoring.score_texts(['the cat sat', 'xyz'], ['the cat sat down', 'abc'])
  assert list(out) == ['f1', 'rouge1', 'rougeL']
  np.testing.assert_allclose(out['f1'], [0.8, 0.0])
  # rouge-score's tokenizer, no stemming: 'cats' does not match 'cat'.
  np.testing.assert_allclose(out['rouge1'], [6 / 7, 0.0])
  np.testing.assert_allclose(out['rougeL'], [6 / 7, 0.0])
  out = scoring.score_texts(['the cats'], ['the cat'])
  assert out['rouge1'][0] == pytest.approx(0.5)
  with pytest.raises(LeakjaxError):
    scoring.score_texts(['a'], [])
