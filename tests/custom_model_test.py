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

from leakjax import attacks, models
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

  def hidden_states(self, ids, mask=None):
    """`[2, b, t, d]`: the embedding output and the block's output."""
    t = ids.shape[1]
    x = self.embed(ids) + self.pos[:t]
    h = self.ln(x)
    allowed = jnp.tril(jnp.ones((t, t), bool))[None]
    if mask is not None:
      allowed = allowed & (mask[:, None, :] > 0)
    return jnp.stack([x, self.block(x, self.k(h), self.v(h), allowed)])

  def head(self, hidden):
    return self.embed.attend(self.ln_f(hidden)).astype(jnp.float32)

  def __call__(self, ids, mask=None):
    return self.head(self.hidden_states(ids, mask)[-1])

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


def user_hidden_states(params, ids, mask=None):
  return MODULE.apply(
    {'params': params}, ids, mask, method=TinyLM.hidden_states
  )


def user_head(params, hidden):
  return MODULE.apply({'params': params}, hidden, method=TinyLM.head)


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
    user_logits,
    decode=user_decode,
    init_cache=user_init_cache,
    hidden_states=user_hidden_states,
    lm_head=user_head,
    **FACTS,
  )


def without_cache():
  return models.from_flax(
    MODULE, hidden_states_method='hidden_states', lm_head_method='head', **FACTS
  )


BUILDERS = {'from_functions': with_cache, 'from_flax': without_cache}


def sentences(n=3, t=7, seed=1):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (n, t)).astype(np.int32)
  lengths = rng.integers(3, t + 1, n)
  lengths[0] = t
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask)


# ------------------------------------------------------------ protocol
@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


# ------------------------------------------------------------- kernels
def np_log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_sequence_logp(model, params, seq):
  """Brute force: sum of log p(seq[t] | seq[:t]) from full logits, t >= 1."""
  logits = np.asarray(model.logits(params, jnp.asarray([seq], jnp.int32)))[0]
  logp = np_log_softmax(logits)
  return float(sum(logp[t - 1, seq[t]] for t in range(1, len(seq))))


@pytest.mark.slow
def test_bag_mask_finds_the_inputs_of_a_batch():
  """Tied head: the span test on q/k/v finds every input token."""
  model = without_cache()
  params = init_params()
  ids = jnp.asarray([[3, 11, 25, 7, 30, 2], [19, 5, 14, 28, 0, 0]], jnp.int32)
  mask = (ids > 0).astype(jnp.int32).at[0].set(1)
  grads = jax.grad(model.loss)(params, ids, mask)
  truth = set(np.asarray(ids)[np.asarray(mask) > 0].tolist())
  # NumPy reference of the premise: the inputs LN(E[v] + P[t]) of the batch
  # are exactly the (token, position) pairs in the span of the q/k/v grads,
  # except each sentence's last token: under the next-token loss its query
  # gets no gradient and no later query reads its key and value.
  last = {2, 28}
  g1 = np.concatenate(
    [np.asarray(grads[n]['kernel'], np.float64) for n in 'qkv'], axis=1
  )
  u, sv, _ = np.linalg.svd(g1, full_matrices=False)
  basis = u[:, sv > sv[0] * 1e-5]
  emb = np.asarray(params['embed']['embedding'], np.float64)
  pos = np.asarray(params['pos'], np.float64)[: ids.shape[1]]
  x = emb[:, None, :] + pos[None]  # [V, T, d]
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + EPS)
  x = x * np.asarray(params['ln']['scale']) + np.asarray(params['ln']['bias'])
  res = np.linalg.norm(x - (x @ basis) @ basis.T, axis=-1) / np.linalg.norm(
    x, axis=-1
  )
  assert set(np.flatnonzero(res.min(1) < 1e-4).tolist()) == truth - last
  kernel = jax.jit(attacks.bag_mask, static_argnames=('model', 'method'))
  found = kernel(model, params, grads, method='tied')
  # No false positives; every span-visible input. (The final tokens are
  # targets, which the target-sign test reads only when the model does not
  # already predict them; on this random 37-token model it does not fire.)
  assert (
    truth - last <= set(np.flatnonzero(np.asarray(found)).tolist()) <= truth
  )
  # vmap over two clients' gradients: each row is its own bag.
  other = jax.grad(model.loss)(params, ids[1:], mask[1:])
  both = jax.vmap(lambda g: attacks.bag_mask(model, params, g, method='tied'))(
    jax.tree.map(lambda a, b: jnp.stack([a, b]), grads, other)
  )
  np.testing.assert_array_equal(both[0], found)
  assert (
    {19, 5, 14}
    <= set(np.flatnonzero(np.asarray(both[1])).tolist())
    <= {
      19,
      5,
      14,
      28,
    }
  )


@pytest.mark.slow
@pytest.mark.parametrize('build', BUILDERS)
def test_bag_beam_search_matches_exhaustive_search(build):
  """With as many beams as sequences, the best beam is the brute-force best."""
  model = BUILDERS[build]()
  params = init_params()
  bag = jnp.asarray([4, 9, 21], jnp.int32)
  config = attacks.BeamSearchConfig(num_beams=9, length=2, ngram_penalty=0.0)
  search = jax.jit(attacks.bag_beam_search, static_argnames=('model', 'config'))
  prompts = jnp.asarray([[[1]], [[2]]], jnp.int32)  # [S=2, Z=1, P=1]
  result = search(model, params, prompts, bag, config=config)
  assert result.tokens.shape[:2] == (2, 9)
  for s, start in enumerate((1, 2)):
    seqs = [
      [start, int(a), int(b)] for a in np.asarray(bag) for b in np.asarray(bag)
    ]
    brute = [np_sequence_logp(model, params, q) for q in seqs]
    best = np.asarray(result.tokens[s, 0])
    assert best.tolist() == seqs[int(np.argmax(brute))]
    np.testing.assert_allclose(
      float(result.scores[s, 0]), max(brute), rtol=1e-4, atol=1e-4
    )
  other = BUILDERS[
    'from_flax' if build == 'from_functions' else 'from_functions'
  ]()
  again = search(other, params, prompts, bag, config=config)
  np.testing.assert_array_equal(again.tokens, result.tokens)


@pytest.mark.slow
def test_reorder_scores_match_one_gradient_per_candidate():
  model = with_cache()
  params = init_params()
  ids, mask = sentences(n=4, t=6)
  scores, ppl, norms = jax.jit(
    attacks.reorder_scores, static_argnames=('model', 'beta')
  )(model, params, ids, mask, beta=2.0)
  for c in range(ids.shape[0]):
    loss, grads = jax.value_and_grad(model.loss)(
      params, ids[c : c + 1], mask[c : c + 1]
    )
    norm = np.sqrt(
      sum(
        np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)
      )
    )  # the model declares no last_layers: every parameter counts
    np.testing.assert_allclose(norms[c], norm, rtol=2e-4)
    np.testing.assert_allclose(ppl[c], np.exp(float(loss)), rtol=2e-4)
    np.testing.assert_allclose(scores[c], ppl[c] + 2.0 * norms[c], rtol=1e-5)


@pytest.mark.slow
def test_differential_score_and_rank_match_brute_force():
  model, model_prime = with_cache(), without_cache()
  params, params_prime = init_params(0), init_params(3)
  ids, mask = sentences(n=3, t=6)
  scores = jax.jit(
    attacks.differential_score, static_argnames=('model', 'model_prime')
  )(model, model_prime, params, params_prime, ids, mask)

  def np_ds(seq, m):
    p = np.exp(np_log_softmax(model.logits(params, jnp.asarray([seq]))))[0]
    q = np.exp(np_log_softmax(model.logits(params_prime, jnp.asarray([seq]))))[
      0
    ]
    return sum(q[t - 1, seq[t]] - p[t - 1, seq[t]] for t in range(1, m))

  lengths = np.asarray(mask).sum(1)
  for i in range(ids.shape[0]):
    want = np_ds(np.asarray(ids[i]).tolist(), int(lengths[i]))
    np.testing.assert_allclose(scores.ds[i], want, atol=1e-5)
  # vmap over snapshots M': one DS row per snapshot.
  stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), params, params_prime)
  rows = jax.vmap(
    lambda pp: (
      attacks.differential_score(model, model_prime, params, pp, ids, mask).ds
    )
  )(stacked)
  np.testing.assert_allclose(rows[0], 0.0, atol=1e-6)
  np.testing.assert_allclose(rows[1], scores.ds, atol=1e-6)
  # Algorithm 1 over T = 4 tokens, length 2, exhaustive widths.
  context = jnp.asarray([1], jnp.int32)
  tokens = jnp.asarray([4, 9, 21, 30], jnp.int32)
  found = jax.jit(
    attacks.rank_beam_search,
    static_argnames=('model', 'model_prime', 'widths', 'length'),
  )(
    model,
    model_prime,
    params,
    params_prime,
    context,
    tokens,
    widths=(4, 16),
    length=2,
  )
  brute = {
    (a, b): np_ds([1, a, b], 3)
    for a in np.asarray(tokens).tolist()
    for b in np.asarray(tokens).tolist()
  }
  best = max(brute, key=brute.get)
  assert tuple(np.asarray(found.sequences[0, 0]).tolist()) == best
  np.testing.assert_allclose(found.ds[0, 0], brute[best], atol=1e-5)


@pytest.mark.parametrize('build', BUILDERS)
def test_bei_hei_match_numpy(build):
  model = BUILDERS[build]()
  params = init_params()
  ids, mask = sentences()
  hidden = model.hidden_states(params, ids, mask)[1]  # [b, t, d]
  bei, hei = jax.jit(attacks.bei_hei_ids, static_argnames='model')(
    model, params, hidden
  )
  h = np.asarray(hidden, np.float64)
  emb = np.asarray(params['embed']['embedding'], np.float64)
  np.testing.assert_array_equal(bei, np.argmax(h @ emb.T, -1))
  cos = (h @ emb.T) / np.linalg.norm(emb, axis=-1)
  np.testing.assert_array_equal(hei, np.argmax(cos, -1))
  np.testing.assert_array_equal(attacks.hei_ids(hidden, jnp.asarray(emb)), hei)


@pytest.mark.slow
@pytest.mark.parametrize('build', BUILDERS)
def test_gboard_reconstruction_matches_a_greedy_loop(build):
  model = BUILDERS[build]()
  params0, params1 = init_params(0), init_params(5)
  allowed = np.zeros(VOCAB, bool)
  allowed[[4, 9, 13, 21, 30]] = True
  starts = jnp.asarray([9, 21, 0], jnp.int32)
  valid = jnp.asarray([True, True, False])
  out = attacks.reconstruct_sentences(
    model,
    params0,
    params1,
    starts,
    valid,
    jnp.asarray(allowed),
    length=4,
    bos_id=1,
  )
  for m in range(2):
    seq = [1, int(starts[m])]
    while len(seq) < 5:  # <S> + 4 words
      logits = np.asarray(model.logits(params1, jnp.asarray([seq])))[0, -1]
      seq.append(int(np.argmax(np.where(allowed, logits, -np.inf))))
    assert np.asarray(out.tokens[m]).tolist() == seq
    np.testing.assert_allclose(
      out.log_ppl1[m], -np_sequence_logp(model, params1, seq), rtol=1e-4
    )
  assert out.scores[2] == -np.inf


def _kernel_calls():
  """(name, jitted kernel, args builder) for every public kernel."""
  model, other = with_cache(), without_cache()
  ids, mask = sentences(n=2, t=5)
  bag = jnp.asarray([4, 9, 21], jnp.int32)
  allowed = jnp.zeros(VOCAB, bool).at[bag].set(True)
  config = attacks.BeamSearchConfig(num_beams=3, length=2)
  return {
    'bag_mask': (
      jax.jit(attacks.bag_mask, static_argnames=('model', 'method')),
      lambda p: (model, p, jax.grad(model.loss)(p, ids, mask)),
      {'method': 'tied'},
    ),
    'bag_beam_search': (
      jax.jit(attacks.bag_beam_search, static_argnames=('model', 'config')),
      lambda p: (model, p, jnp.asarray([[[1]]], jnp.int32), bag),
      {'config': config},
    ),
    'reorder_scores': (
      jax.jit(attacks.reorder_scores, static_argnames=('model',)),
      lambda p: (model, p, ids, mask),
      {},
    ),
    'differential_score': (
      jax.jit(
        attacks.differential_score, static_argnames=('model', 'model_prime')
      ),
      lambda p: (model, other, p, init_params(7), ids, mask),
      {},
    ),
    'rank_beam_search': (
      jax.jit(
        attacks.rank_beam_search,
        static_argnames=('model', 'model_prime', 'widths', 'length'),
      ),
      lambda p: (model, other, p, init_params(7), ids[0, :1], bag),
      {'widths': (3, 2), 'length': 2},
    ),
    'bei_hei_ids': (
      jax.jit(attacks.bei_hei_ids, static_argnames=('model',)),
      lambda p: (model, p, model.hidden_states(p, ids, mask)[1]),
      {},
    ),
    'reconstruct_sentences': (
      jax.jit(
        attacks.reconstruct_sentences,
        static_argnames=('model', 'length', 'bos_id'),
      ),
      lambda p: (model, init_params(7), p, bag, jnp.ones(3, bool), allowed),
      {'length': 3, 'bos_id': 1},
    ),
  }


@pytest.mark.slow
@pytest.mark.parametrize(
  'name',
  [
    'bag_mask',
    'bag_beam_search',
    'reorder_scores',
    'differential_score',
    'rank_beam_search',
    'bei_hei_ids',
    'reconstruct_sentences',
  ],
)
def test_each_kernel_compiles_once_across_params(name):
  kernel, args, kwargs = _kernel_calls()[name]
  # jax.jit wrappers of one function share its cache: count what we add.
  first = kernel(*args(init_params(0)), **kwargs)
  size = kernel._cache_size()  # pylint: disable=protected-access
  # New params of the same shapes and a freshly built, equal model object.
  second = kernel(*args(init_params(1)), **kwargs)
  assert kernel._cache_size() == size  # pylint: disable=protected-access
  leaves = zip(jax.tree.leaves(first), jax.tree.leaves(second))
  if name != 'bag_mask':  # the bag of one batch is the same at any params
    assert any(not np.array_equal(a, b) for a, b in leaves), 'params unused'
