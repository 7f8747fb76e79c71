"""Tests for leakjax.models.lstm against a plain NumPy LSTM."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import lstm
from leakjax.tokenization import WordTokenizer

ATOL = 1e-5

# Tiny configs: a tied CIFG with projection (GBoard's shape, shrunk), a
# 2-layer untied LSTM, and the 512/160 shape (embedding narrower than state).
TINY_CIFG = lstm.CIFGConfig(vocab_size=13, embed_dim=6, units=7, proj_dim=6)
TINY_LSTM = lstm.LSTMConfig(
  vocab_size=11, embed_dim=5, hidden_size=8, num_layers=2, dropout_keep=0.9
)
TINY_NARROW = lstm.LSTMConfig(vocab_size=11, embed_dim=4, hidden_size=6)
CONFIGS = {'cifg': TINY_CIFG, 'lstm': TINY_LSTM, 'narrow': TINY_NARROW}


def words(vocab_size):
  return WordTokenizer(
    ['<UNK>', '<S>'] + [f'w{i}' for i in range(vocab_size - 2)]
  )


def abstract_params(config, dtype=jnp.float32):
  return jax.eval_shape(
    lambda: lstm.init_model(config, key=jax.random.key(0), dtype=dtype)[1]
  )


@functools.cache
def random_model(config, seed=0):
  """`(model, params)` with every parameter (biases too) random and O(1).

  The values come from NumPy: compiling `init` for every config would
  dominate the test time on a shared 2-core CPU.
  """
  rng = np.random.default_rng(seed)
  params = jax.tree.map(
    lambda x: jnp.asarray(0.5 * rng.standard_normal(x.shape), x.dtype),
    abstract_params(config),
  )
  return lstm.make_model(config, words(config.vocab_size)), params


# Jitted model functions: the model is a static (hashable) argument, so each
# shape compiles once per model config.
@functools.partial(jax.jit, static_argnames=('model',))
def jit_logits(model, params, ids, mask=None):
  return model.logits(params, ids, mask)


@functools.partial(jax.jit, static_argnames=('model',))
def jit_hidden_states(model, params, ids, mask=None):
  return model.hidden_states(params, ids, mask)


@functools.partial(jax.jit, static_argnames=('model',))
def jit_decode(model, params, cache, ids):
  return model.decode(params, cache, ids)


@functools.partial(jax.jit, static_argnames=('model',))
def jit_train_logits(model, params, ids, key):
  return model.train_logits(params, ids, key=key)


@functools.partial(jax.jit, static_argnames=('model',))
def jit_loss_and_grad(model, params, ids, mask=None):
  return jax.value_and_grad(model.loss)(params, ids, mask)


def random_ids(config, batch=3, time=7, seed=1):
  rng = np.random.default_rng(seed)
  return jnp.asarray(
    rng.integers(0, config.vocab_size, (batch, time)), jnp.int32
  )


def padded_mask(ids):
  """Row 1 has 5 real tokens, the others are full."""
  return jnp.ones_like(ids).at[1, 5:].set(0)


# ---------------------------------------------------------- NumPy reference
def sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_cell(w, c, h, x, cifg):
  """The docstring equations, one gate matrix at a time, in float64."""
  w = {k: np.asarray(v, np.float64) for k, v in w.items()}
  units = c.shape[-1]
  names = 'igo' if cifg else 'ifgo'

  def pre(gate):
    cols = slice(names.index(gate) * units, (names.index(gate) + 1) * units)
    return (
      x @ w['kernel_x'][:, cols] + h @ w['kernel_h'][:, cols] + w['bias'][cols]
    )

  i = sigmoid(pre('i'))
  f = 1.0 - i if cifg else sigmoid(pre('f'))
  g = np.tanh(pre('g'))
  o = sigmoid(pre('o'))
  c = f * c + i * g
  m = o * np.tanh(c)
  h = m @ w['proj'] if 'proj' in w else m
  return c, h


def np_hidden_and_logits(config, params, ids):
  """All layer outputs and logits of the whole model, float64 NumPy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  emb = p['embed']['embedding']
  ids = np.asarray(ids)
  batch, time = ids.shape
  x = emb[ids]  # [B, T, E]
  outs = [x]
  for k in range(config.num_layers):
    w = p[f'layer_{k}']
    c = np.zeros((batch, config.units))
    h = np.zeros((batch, config.output_dim))
    ys = []
    for t in range(time):
      c, h = np_cell(w, c, h, x[:, t], config.cifg)
      ys.append(h)
    x = np.stack(ys, axis=1)
    outs.append(x)
  kernel = emb.T if config.tie_word_embeddings else p['head']['kernel']
  return outs, x @ kernel + p['head']['bias']


# ------------------------------------------------------------------ kernel
@pytest.mark.parametrize('cifg', [True, False])
@pytest.mark.parametrize('proj_dim', [None, 3])
@pytest.mark.parametrize('jit', [False, True])
def test_one_step_matches_numpy(cifg, proj_dim, jit):
  batch, inputs, units = 4, 5, 6
  out = proj_dim or units
  gates = (3 if cifg else 4) * units
  normal = functools.partial(
    np.random.default_rng(0).standard_normal, dtype=np.float32
  )
  w = {
    'kernel_x': normal((inputs, gates)),
    'kernel_h': normal((out, gates)),
    'bias': normal((gates,)),
  }
  if proj_dim:
    w['proj'] = normal((units, proj_dim))
  state = lstm.LSTMState(c=normal((batch, units)), h=normal((batch, out)))
  x = normal((batch, inputs))
  cell = lambda w, s, x: lstm.lstm_cell(w, s, x, cifg=cifg)
  new, h = (jax.jit(cell) if jit else cell)(w, state, x)
  want_c, want_h = np_cell(
    w,
    np.asarray(state.c, np.float64),
    np.asarray(state.h, np.float64),
    np.asarray(x, np.float64),
    cifg,
  )
  np.testing.assert_allclose(new.c, want_c, atol=ATOL)
  np.testing.assert_allclose(new.h, want_h, atol=ATOL)
  np.testing.assert_allclose(h, want_h, atol=ATOL)
  assert h.shape == (batch, out)


def test_cifg_forget_gate_is_coupled():
  # With g = 0 the cell only decays: c_t = (1 - i) c_{t-1}, i = sigmoid(b_i).
  units = 3
  b_i = jnp.array([-1.0, 0.0, 2.0])
  w = {
    'kernel_x': jnp.zeros((2, 3 * units)),
    'kernel_h': jnp.zeros((units, 3 * units)),
    'bias': jnp.concatenate([b_i, jnp.zeros(2 * units)]),
  }
  c0 = jnp.array([[1.0, 2.0, 3.0]])
  state = lstm.LSTMState(c=c0, h=jnp.zeros((1, units)))
  new, _ = lstm.lstm_cell(w, state, jnp.ones((1, 2)), cifg=True)
  np.testing.assert_allclose(new.c, (1 - jax.nn.sigmoid(b_i)) * c0, atol=1e-6)


# ------------------------------------------------------------------- model
@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('jit', [False, True])
def test_logits_and_hidden_states_match_numpy(name, jit):
  config = CONFIGS[name]
  model, params = random_model(config)
  ids = random_ids(config)
  logits_fn = functools.partial(jit_logits, model) if jit else model.logits
  hidden_fn = (
    functools.partial(jit_hidden_states, model) if jit else model.hidden_states
  )
  want_hidden, want_logits = np_hidden_and_logits(config, params, ids)
  logits = logits_fn(params, ids)
  assert logits.shape == (3, 7, config.vocab_size)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, want_logits, atol=ATOL)

  hidden = hidden_fn(params, ids)
  assert hidden.shape == (config.num_layers + 1, 3, 7, config.hidden_size)
  for k, want in enumerate(want_hidden):
    width = want.shape[-1]
    np.testing.assert_allclose(hidden[k, ..., :width], want, atol=ATOL)
    # A narrower embedding is zero-padded to hidden_size.
    np.testing.assert_array_equal(hidden[k, ..., width:], 0.0)
  np.testing.assert_allclose(
    model.lm_head(params, hidden[-1]), logits, atol=ATOL
  )


def test_hidden_states_refuses_embedding_wider_than_state():
  config = lstm.LSTMConfig(vocab_size=9, embed_dim=6, hidden_size=4)
  model = lstm.make_model(config)
  params = abstract_params(config)
  ids = random_ids(config)
  assert jax.eval_shape(model.logits, params, ids).shape == (3, 7, 9)
  with pytest.raises(LeakjaxError, match='embed_dim'):
    jax.eval_shape(model.hidden_states, params, ids)


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_padding_does_not_reach_real_positions(name):
  config = CONFIGS[name]
  model, params = random_model(config)
  ids = np.asarray(random_ids(config))
  mask = np.ones_like(ids)
  mask[0, 4:] = 0
  mask[2, 2:] = 0
  other = np.where(mask == 1, ids, (ids + 3) % config.vocab_size)
  a = jit_logits(model, params, jnp.asarray(ids), jnp.asarray(mask))
  b = jit_logits(model, params, jnp.asarray(other), jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_array_equal(np.asarray(a)[real], np.asarray(b)[real])
  assert not np.allclose(np.asarray(a)[~real], np.asarray(b)[~real])


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('jit', [False, True])
def test_decode_matches_logits(name, jit):
  config = CONFIGS[name]
  model, params = random_model(config)
  ids = random_ids(config)
  full = jit_logits(model, params, ids)
  decode = functools.partial(jit_decode, model) if jit else model.decode

  cache = model.init_cache(params, batch_size=3, max_length=7)
  for leaf in jax.tree.leaves(cache):
    assert leaf.shape[0] == 3
  steps = []
  for t in range(7):
    logits, cache = decode(params, cache, ids[:, t : t + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=ATOL)
  np.testing.assert_array_equal(cache.index, [7, 7, 7])

  # Chunks of different lengths continue the same recurrence.
  cache = model.init_cache(params, batch_size=3, max_length=7)
  first, cache = decode(params, cache, ids[:, :4])
  second, cache = decode(params, cache, ids[:, 4:])
  np.testing.assert_allclose(
    jnp.concatenate([first, second], axis=1), full, atol=ATOL
  )


def test_decode_cache_reorders_like_beams():
  model, params = random_model(TINY_CIFG)
  ids = random_ids(TINY_CIFG)
  cache = model.init_cache(params, batch_size=3, max_length=7)
  _, cache = jit_decode(model, params, cache, ids[:, :4])
  order = jnp.array([2, 0, 0])
  cache = jax.tree.map(lambda x: x[order], cache)
  logits, _ = jit_decode(model, params, cache, ids[order, 4:])
  full = jit_logits(model, params, ids[order])
  np.testing.assert_allclose(logits, full[:, 4:], atol=ATOL)


# --------------------------------------------------------------- gradients
@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_gradient_reaches_output_bias_and_embeddings(name):
  config = CONFIGS[name]
  model, params = random_model(config)
  ids = random_ids(config)
  mask = padded_mask(ids)
  _, grads = jit_loss_and_grad(model, params, ids, mask)

  # dL/db = mean over real targets of softmax(z_t) - onehot(y_t).
  logits = np.asarray(jit_logits(model, params, ids), np.float64)[:, :-1]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  onehot = np.eye(config.vocab_size)[np.asarray(ids)[:, 1:]]
  weights = np.asarray(mask)[:, 1:, None]
  want = ((probs - onehot) * weights).sum((0, 1)) / weights.sum()
  np.testing.assert_allclose(grads['head']['bias'], want, atol=ATOL)

  # Every input token's embedding row gets a gradient.
  emb_grad = np.abs(np.asarray(grads['embed']['embedding'])).sum(-1)
  used = np.unique(np.asarray(ids)[:, :-1])
  assert (emb_grad[used] > 0).all()
  for k in range(config.num_layers):
    assert np.abs(grads[f'layer_{k}']['kernel_h']).sum() > 0


def test_tied_embedding_gradient_sums_both_uses():
  tied, tied_params = random_model(TINY_CIFG)
  untied_config = lstm.CIFGConfig(
    vocab_size=13, embed_dim=6, units=7, proj_dim=6, tie_word_embeddings=False
  )
  assert tied.paths.lm_head is None and tied.tie_word_embeddings
  emb = tied_params['embed']['embedding']
  untied_params = dict(tied_params)
  untied_params['head'] = {'bias': tied_params['head']['bias'], 'kernel': emb.T}
  untied = lstm.make_model(untied_config, tied.tokenizer)
  assert untied.paths.lm_head == ('head', 'kernel')
  assert not untied.tie_word_embeddings and untied != tied
  ids = random_ids(TINY_CIFG)
  mask = padded_mask(ids)
  loss_tied, g_tied = jit_loss_and_grad(tied, tied_params, ids, mask)
  loss_untied, g_untied = jit_loss_and_grad(untied, untied_params, ids, mask)
  np.testing.assert_allclose(loss_tied, loss_untied, atol=ATOL)
  in_use = g_untied['embed']['embedding']
  out_use = g_untied['head']['kernel'].T
  assert np.abs(in_use).max() > 1e-4 and np.abs(out_use).max() > 1e-4
  np.testing.assert_allclose(
    g_tied['embed']['embedding'], in_use + out_use, atol=ATOL
  )
  # Rows of words never typed still move through the output use.
  unused = np.setdiff1d(np.arange(13), np.asarray(ids))
  assert unused.size
  assert (
    np.abs(np.asarray(g_tied['embed']['embedding'])[unused]).sum(-1) > 0
  ).all()


# ----------------------------------------------------------------- dropout
def test_dropout_only_in_train_logits():
  model, params = random_model(TINY_LSTM)
  ids = random_ids(TINY_LSTM)
  a = jit_train_logits(model, params, ids, jax.random.key(1))
  b = jit_train_logits(model, params, ids, jax.random.key(2))
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(
    a, jit_train_logits(model, params, ids, jax.random.key(1))
  )
  clean = jit_logits(model, params, ids)
  np.testing.assert_array_equal(clean, jit_logits(model, params, ids))
  assert not np.allclose(a, clean)
  assert np.isfinite(a).all()


def test_no_dropout_without_keep_below_one():
  model, params = random_model(TINY_CIFG)
  ids = random_ids(TINY_CIFG)
  np.testing.assert_array_equal(
    jit_train_logits(model, params, ids, jax.random.key(1)),
    jit_logits(model, params, ids),
  )


# ---------------------------------------------------------------- configs
def test_gboard_parameter_count():
  params = jax.eval_shape(
    lambda: lstm.init_model(lstm.CIFGConfig.gboard(), key=jax.random.key(0))[1]
  )
  model = lstm.make_model(lstm.CIFGConfig.gboard())
  v, d, u, p = 9502, 96, 670, 96
  embedding = v * d  # tied: also the output matrix W
  gates = 3 * (d * u + p * u + u)  # i, g, o; f = 1 - i; no peepholes
  projection = u * p
  output_bias = v
  n = models.num_params(params)
  assert n == embedding + gates + projection + output_bias
  assert n == 1_373_944
  assert model.family == 'cifg_lstm'
  assert model.paths.output_bias == ('head', 'bias')
  assert model.word_embeddings(params).shape == (v, d)
  assert model.config.hidden_size == 96 and model.config.max_length is None
  assert model.hidden_size == 96 and model.max_length is None
  assert (model.vocab_size, model.num_layers) == (v, 1)
  assert model.tie_word_embeddings
  assert not hasattr(model, 'params') and not hasattr(model, 'module')


def test_paper_presets():
  small = lstm.LSTMConfig.ptb_small()
  assert (
    small.num_layers,
    small.embed_dim,
    small.hidden_size,
    small.dropout_keep,
  ) == (2, 200, 200, 1.0)
  medium = lstm.LSTMConfig.medium_512()
  assert (
    medium.num_layers,
    medium.embed_dim,
    medium.hidden_size,
    medium.dropout_keep,
    medium.tie_word_embeddings,
  ) == (1, 160, 512, 0.9, False)
  shapes = jax.eval_shape(
    lambda: lstm.init_model(medium, key=jax.random.key(0))[1]
  )
  assert shapes['head']['kernel'].shape == (512, 10_000)
  assert shapes['layer_0']['kernel_x'].shape == (160, 4 * 512)


def test_config_validation():
  with pytest.raises(LeakjaxError, match='tied embeddings'):
    lstm.LSTMConfig(
      vocab_size=10, embed_dim=4, hidden_size=6, tie_word_embeddings=True
    )
  with pytest.raises(LeakjaxError, match='tied embeddings'):
    lstm.CIFGConfig(proj_dim=None)
  with pytest.raises(LeakjaxError, match='dropout_keep'):
    lstm.LSTMConfig(vocab_size=10, embed_dim=4, hidden_size=4, dropout_keep=0.0)
  with pytest.raises(LeakjaxError, match='units'):
    lstm.CIFGConfig(units=0)


def test_standard_lstm_forget_bias_starts_at_one():
  model, params = lstm.init_model(TINY_LSTM, key=jax.random.key(0))
  assert model == lstm.make_model(TINY_LSTM)
  bias = np.asarray(params['layer_0']['bias'])
  h = TINY_LSTM.hidden_size
  np.testing.assert_array_equal(bias[h : 2 * h], 1.0)
  np.testing.assert_array_equal(np.delete(bias, np.s_[h : 2 * h]), 0.0)


def test_bfloat16_params():
  for leaf in jax.tree.leaves(abstract_params(TINY_LSTM, jnp.bfloat16)):
    assert leaf.dtype == jnp.bfloat16
  ref, ref_params = random_model(TINY_CIFG)
  model = lstm.make_model(TINY_CIFG, dtype=jnp.bfloat16)
  assert model != ref  # the dtype is part of the model
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), ref_params)
  ids = random_ids(TINY_CIFG)
  logits = jit_logits(model, params, ids)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, jit_logits(ref, ref_params, ids), atol=0.1)


# ------------------------------------------------------------- checkpoints
@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_save_load_round_trip(name, tmp_path):
  config = CONFIGS[name]
  model, params = random_model(config)
  models.save(model, params, tmp_path)
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert saved['model_type'] == lstm.MODEL_TYPES[model.family]
  assert (tmp_path / 'words.json').is_file()

  loaded, loaded_params = models.load(tmp_path)
  assert loaded.family == model.family
  assert loaded.config == config
  assert loaded.paths == model.paths
  assert loaded == model and hash(loaded) == hash(model)
  assert loaded.tokenizer.words == model.tokenizer.words
  jax.tree.map(np.testing.assert_array_equal, loaded_params, params)
  ids = random_ids(config)
  np.testing.assert_array_equal(
    jit_logits(loaded, loaded_params, ids),
    jit_logits(model, params, ids),
  )


def test_round_trip_without_tokenizer(tmp_path):
  model, params = random_model(TINY_CIFG)
  models.save(model.replace(tokenizer=None), params, tmp_path)
  assert not (tmp_path / 'words.json').exists()
  assert models.load(tmp_path)[0].tokenizer is None


def test_vocab_mismatch_is_refused(tmp_path):
  model, params = random_model(TINY_CIFG)
  models.save(model, params, tmp_path)
  words(TINY_CIFG.vocab_size + 1).save(tmp_path / 'words.json')
  with pytest.raises(LeakjaxError, match='14 words.*vocab_size=13'):
    models.load(tmp_path)
  with pytest.raises(LeakjaxError, match='vocab_size=13'):
    lstm.make_model(TINY_CIFG, words(12))


def _edit_tensors(directory, edit):
  tensors = load_file(str(directory / 'model.safetensors'))
  edit(tensors)
  save_file(tensors, str(directory / 'model.safetensors'))


@pytest.mark.parametrize(
  'problem, edit',
  [
    ('missing', lambda t: t.pop('lstm.weight_hr_l0')),
    ('does not use', lambda t: t.update(extra=np.zeros(3, np.float32))),
    ('shape', lambda t: t.update({'output.bias': np.zeros(12, np.float32)})),
    ('NaN', lambda t: t['lstm.bias_l0'].__setitem__(0, np.nan)),
  ],
)
def test_bad_checkpoints_are_refused(problem, edit, tmp_path):
  models.save(*random_model(TINY_CIFG), tmp_path)
  _edit_tensors(tmp_path, edit)
  with pytest.raises(LeakjaxError, match=problem):
    models.load(tmp_path)


def test_bad_config_is_refused(tmp_path):
  models.save(*random_model(TINY_LSTM), tmp_path)
  cfg = json.loads((tmp_path / 'config.json').read_text())
  (tmp_path / 'config.json').write_text(json.dumps({**cfg, 'units': 3}))
  with pytest.raises(LeakjaxError, match='unknown fields'):
    models.load(tmp_path)
  del cfg['vocab_size']
  (tmp_path / 'config.json').write_text(json.dumps(cfg))
  with pytest.raises(LeakjaxError, match='vocab_size'):
    models.load(tmp_path)
