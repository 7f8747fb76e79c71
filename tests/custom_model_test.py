"""A user's own Flax LM (not a leakjax model) through the public protocol.

The model is defined here, in ~40 lines, as an outside researcher would:
one pre-norm attention block with learned positions and a tied head. It is
wrapped with :func:`leakjax.models.from_functions` (its own KV cache) and with
:func:`leakjax.models.from_flax` (no cache: decoding recomputes the prefix),
and every public kernel runs on it under `jax.jit` and `jax.vmap`, checked
against a brute-force or NumPy reference.
"""

import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import models
from leakjax.errors import LeakjaxError

VOCAB, DIM, MAX_LEN = 37, 16, 12
EPS = 1e-6


class TinyLM(nn.Module):
  """Causal LM: embed + positions, one pre-LN attention block, tied head."""

  vocab: int = VOCAB
  dim: int = DIM
  max_len: int = MAX_LEN

  def setup(self):
    self.embed = nn.Embed(
      self.vocab, self.dim, embedding_init=nn.initializers.normal(1.0)
    )
    self.pos = self.param(
      'pos', nn.initializers.normal(0.5), (self.max_len, self.dim)
    )
    self.ln = nn.LayerNorm(epsilon=EPS)
    self.q = nn.Dense(self.dim, use_bias=False)
    self.k = nn.Dense(self.dim, use_bias=False)
    self.v = nn.Dense(self.dim, use_bias=False)
    self.o = nn.Dense(self.dim)
    self.ln_f = nn.LayerNorm(epsilon=EPS)

  def block(self, x, keys, values, allowed):
    """`x [b, t, d]` attends to `keys/values [b, s, d]` where allowed."""
    att = jnp.einsum('btd,bsd->bts', self.q(self.ln(x)), keys)
    att = jnp.where(allowed, att / jnp.sqrt(self.dim), -1e9)
    return x + self.o(jnp.einsum('bts,bsd->btd', nn.softmax(att), values))

  def __call__(self, ids, mask=None):
    t = ids.shape[1]
    x = self.embed(ids) + self.pos[:t]
    h = self.ln(x)
    allowed = jnp.tril(jnp.ones((t, t), bool))[None]
    if mask is not None:
      allowed = allowed & (mask[:, None, :] > 0)
    x = self.block(x, self.k(h), self.v(h), allowed)
    return self.embed.attend(self.ln_f(x)).astype(jnp.float32)

  def step(self, cache, ids):
    """KV-cached decoding: `(cache, ids [b, t]) -> (logits, cache)`."""
    b, t = ids.shape
    positions = cache['index'][:, None] + jnp.arange(t)  # [b, t]
    x = self.embed(ids) + self.pos[positions]
    h = self.ln(x)
    rows = jnp.arange(b)[:, None]
    keys = cache['keys'].at[rows, positions].set(self.k(h))
    values = cache['values'].at[rows, positions].set(self.v(h))
    slots = jnp.arange(keys.shape[1])
    allowed = slots[None, None, :] <= positions[:, :, None]
    x = self.block(x, keys, values, allowed)
    logits = self.embed.attend(self.ln_f(x)).astype(jnp.float32)
    return logits, {
      'keys': keys,
      'values': values,
      'index': cache['index'] + t,
    }


MODULE = TinyLM()


def init_params(seed=0):
  return MODULE.init(jax.random.key(seed), jnp.zeros((1, 2), jnp.int32))[
    'params'
  ]


# --- the user's own functions, defined once (the model compares by them)
def user_logits(params, ids, mask=None):
  return MODULE.apply({'params': params}, ids, mask)


def user_init_cache(params, batch_size, max_length):
  del params
  zeros = jnp.zeros((batch_size, max_length, DIM), jnp.float32)
  return {
    'keys': zeros,
    'values': zeros,
    'index': jnp.zeros((batch_size,), jnp.int32),
  }


def user_decode(params, cache, ids):
  return MODULE.apply({'params': params}, cache, ids, method=TinyLM.step)


def user_first_layer(params):
  return models.FirstLayerInputs(
    tokens=params['embed']['embedding'],
    positions=params['pos'],
    scale=params['ln']['scale'],
    bias=params['ln']['bias'],
    eps=EPS,
    kind='layer',
  )


FACTS = dict(
  vocab_size=VOCAB,
  word_embeddings='embed/embedding',
  position_embeddings='pos',
  hidden_size=DIM,
  num_layers=1,
  max_length=MAX_LEN,
  tie_word_embeddings=True,
  attention_inputs=((('q', 'kernel'), ('k', 'kernel'), ('v', 'kernel')),),
  first_layer_inputs=user_first_layer,
)


def with_cache():
  return models.from_functions(
    user_logits, decode=user_decode, init_cache=user_init_cache, **FACTS
  )


def without_cache():
  return models.from_flax(MODULE, **FACTS)


BUILDERS = {'from_functions': with_cache, 'from_flax': without_cache}


def sentences(n=3, t=7, seed=1):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (n, t)).astype(np.int32)
  lengths = rng.integers(3, t + 1, n)
  lengths[0] = t
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask)


# ------------------------------------------------------------ protocol
@pytest.mark.parametrize('build', BUILDERS)
def test_wrapped_model_satisfies_the_protocol(build):
  model = BUILDERS[build]()
  assert isinstance(model, models.LanguageModel)
  assert model == BUILDERS[build]() and hash(model) == hash(BUILDERS[build]())
  params = init_params()
  ids, mask = sentences()
  ref = MODULE.apply({'params': params}, ids, mask)
  np.testing.assert_allclose(
    jax.jit(model.logits)(params, ids, mask), ref, atol=1e-5, rtol=1e-5
  )
  # token_log_probs is log_softmax of the logits, read at the next token.
  logp = jax.nn.log_softmax(np.asarray(ref, np.float64)[:, :-1], -1)
  want = np.take_along_axis(logp, np.asarray(ids)[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(
    model.token_log_probs(params, ids, mask), want, atol=1e-5
  )


@pytest.mark.parametrize('build', BUILDERS)
def test_decoding_equals_logits_under_jit(build):
  model = BUILDERS[build]()
  params = init_params()
  ids, _ = sentences(t=8)
  full = model.logits(params, ids)
  decode = jax.jit(model.decode)
  cache = model.init_cache(params, ids.shape[0], MAX_LEN)
  logits, cache = decode(params, cache, ids[:, :3])
  steps = [logits]
  for t in range(3, ids.shape[1]):
    logits, cache = decode(params, cache, ids[:, t : t + 1])
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full, atol=1e-5)
  # Rows at different positions: reorder the cache, then step.
  cache = model.init_cache(params, 2, MAX_LEN)
  _, a = decode(params, cache, ids[:2, :4])
  _, b = decode(params, cache, ids[:2, :5])
  mixed = jax.tree.map(lambda x, y: jnp.stack([x[0], y[1]]), a, b)
  nxt = jnp.stack([ids[0, 4:5], ids[1, 5:6]])
  logits, _ = decode(params, mixed, nxt)
  np.testing.assert_allclose(logits[0, 0], full[0, 4], atol=1e-5)
  np.testing.assert_allclose(logits[1, 0], full[1, 5], atol=1e-5)


def test_vmap_over_parameter_sets():
  model = without_cache()
  stacked = jax.tree.map(
    lambda a, b: jnp.stack([a, b]), init_params(0), init_params(1)
  )
  ids, mask = sentences()
  out = jax.jit(jax.vmap(model.loss, in_axes=(0, None, None)))(
    stacked, ids, mask
  )
  for i, seed in enumerate((0, 1)):
    np.testing.assert_allclose(
      out[i], model.loss(init_params(seed), ids, mask), rtol=1e-6
    )


@pytest.mark.parametrize('build', BUILDERS)
def test_a_static_model_compiles_once_across_params(build):
  chex.clear_trace_counter()

  @functools.partial(jax.jit, static_argnames='model')
  @chex.assert_max_traces(n=1)
  def loss(model, params, ids, mask):
    return model.loss(params, ids, mask)

  ids, mask = sentences()
  first = loss(BUILDERS[build](), init_params(0), ids, mask)
  second = loss(
    BUILDERS[build](), init_params(1), ids, mask
  )  # a new model object too
  assert float(first) != float(second)


def test_bad_declarations_are_refused():
  with pytest.raises(LeakjaxError, match='together'):
    models.from_functions(user_logits, decode=user_decode, **FACTS)
  with pytest.raises(LeakjaxError, match='vocab_size'):
    models.from_functions(user_logits, **{**FACTS, 'vocab_size': 0})
  with pytest.raises(LeakjaxError, match='no method'):
    models.from_flax(MODULE, method='nope', **FACTS)
