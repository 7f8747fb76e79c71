"""An outside user's Flax LM, as written, through `from_flax` and DAGER.

The model is what people write with Flax's stock layers: two pre-LN blocks
on `nn.MultiHeadDotProductAttention` (q/k/v `DenseGeneral` kernels shaped
`[dim, heads, head_dim]`) with a causal mask, learned positions and a tied
head; or the same blocks with one fused q/k/v kernel, `[dim, 3 * dim]` or
`[dim, 3, heads, head_dim]`. It is declared through
:func:`leakjax.models.from_flax` by its stock parameter paths and method
names; the tied bag of words then holds every input of a FedSGD batch, and
DAGER recovers the batch from its gradient exactly.
"""

import dataclasses
import functools
import inspect
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import attacks, fl, models
from leakjax.attacks import dager
from leakjax.errors import LeakjaxError

VOCAB, DIM, HEADS, MAX_LEN, EPS = 50, 32, 4, 16, 1e-6
LAYOUTS = ('stock', 'fused', 'fused_heads')
# The fused-heads kernel stores its slices as k | q | v: the declaration
# says so, and the span tests see q | k | v.
PARTS = {'fused': 'qkv', 'fused_heads': 'kqv'}


class FusedAttention(nn.Module):
  """Self-attention with one q/k/v kernel, `[d, 3d]` or `[d, 3, h, hd]`."""

  layout: str

  def setup(self):
    hd = DIM // HEADS
    if self.layout == 'fused':
      self.qkv = nn.Dense(3 * DIM)
    else:
      self.qkv = nn.DenseGeneral((3, HEADS, hd))
    self.out = nn.DenseGeneral(DIM, axis=(-2, -1))

  def __call__(self, h, mask):
    b, t, _ = h.shape
    qkv = self.qkv(h).reshape(b, t, 3, HEADS, DIM // HEADS)
    slices = dict(zip(PARTS[self.layout], jnp.moveaxis(qkv, 2, 0)))
    out = nn.dot_product_attention(
      slices['q'], slices['k'], slices['v'], mask=mask
    )
    return self.out(out)


class Block(nn.Module):
  layout: str

  def setup(self):
    self.ln = nn.LayerNorm(epsilon=EPS)
    if self.layout == 'stock':
      self.attn = nn.MultiHeadDotProductAttention(num_heads=HEADS)
    else:
      self.attn = FusedAttention(self.layout)
    self.ln2 = nn.LayerNorm(epsilon=EPS)
    self.up = nn.Dense(2 * DIM)
    self.down = nn.Dense(DIM)

  def __call__(self, x, mask):
    h = self.ln(x)
    if self.layout == 'stock':
      x = x + self.attn(h, mask=mask)
    else:
      x = x + self.attn(h, mask)
    return x + self.down(nn.gelu(self.up(self.ln2(x))))


class UserLM(nn.Module):
  """Causal LM: embed + positions, two pre-LN blocks, tied head."""

  layout: str = 'stock'

  def setup(self):
    self.embed = nn.Embed(
      VOCAB, DIM, embedding_init=nn.initializers.normal(1.0)
    )
    self.pos = self.param('pos', nn.initializers.normal(0.5), (MAX_LEN, DIM))
    self.blocks = [Block(self.layout) for _ in range(2)]
    self.ln_f = nn.LayerNorm(epsilon=EPS)

  def _embed(self, ids, mask):
    allowed = nn.make_causal_mask(ids)
    if mask is not None:
      allowed = nn.combine_masks(allowed, nn.make_attention_mask(mask, mask))
    return self.embed(ids) + self.pos[: ids.shape[1]], allowed

  def hidden_states(self, ids, mask=None):
    x, allowed = self._embed(ids, mask)
    out = [x]
    for block in self.blocks:
      x = block(x, allowed)
      out.append(x)
    return jnp.stack(out)

  def head(self, hidden):
    return self.embed.attend(self.ln_f(hidden)).astype(jnp.float32)

  def __call__(self, ids, mask=None):
    return self.head(self.hidden_states(ids, mask)[-1])

  def block_inputs(self, ids, mask, layer):
    """What block `layer`'s q/k/v read: its LayerNorm of the stream."""
    x, allowed = self._embed(ids, mask)
    for block in self.blocks[:layer]:
      x = block(x, allowed)
    return self.blocks[layer].ln(x)

  def first_layer(self):
    ln = self.variables['params']['blocks_0']['ln']
    return models.FirstLayerInputs(
      tokens=self.embed.embedding,
      positions=self.pos,
      scale=ln['scale'],
      bias=ln['bias'],
      eps=EPS,
      kind='layer',
    )


def kernels(layout, block):
  """The declared attention inputs of `block`: by stock path, or fused."""
  if layout == 'stock':
    return tuple(
      f'blocks_{block}/attn/{n}/kernel' for n in ('query', 'key', 'value')
    )
  return (models.FusedKernel(f'blocks_{block}/attn/qkv/kernel', PARTS[layout]),)


@functools.cache
def init_params(layout, seed=0):
  return UserLM(layout).init(
    jax.random.key(seed), jnp.zeros((1, 2), jnp.int32)
  )['params']


def declare(layout, **changes):
  facts = dict(
    vocab_size=VOCAB,
    word_embeddings='embed/embedding',
    position_embeddings='pos',
    hidden_size=DIM,
    num_layers=2,
    max_length=MAX_LEN,
    tie_word_embeddings=True,
    attention_inputs=(kernels(layout, 0), kernels(layout, 1)),
    first_layer_inputs='first_layer',
    block_inputs='block_inputs',
    hidden_states_method='hidden_states',
    lm_head_method='head',
  )
  return models.from_flax(UserLM(layout), **{**facts, **changes})


# Distinct tokens 1..VOCAB-1 (0 pads), two sentences of unequal length.
_PERM = (1 + np.random.default_rng(0).permutation(VOCAB - 1)).tolist()
BATCH = [_PERM[:7], _PERM[7:12]]


def pad(rows):
  t = max(len(r) for r in rows)
  ids = np.zeros((len(rows), t), np.int32)
  mask = np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    ids[i, : len(r)] = r
    mask[i, : len(r)] = 1
  return jnp.asarray(ids), jnp.asarray(mask)


@functools.cache
def gradient(layout):
  ids, mask = pad(BATCH)
  return fl.client_gradient(declare(layout), init_params(layout), ids, mask)


def dager_config():
  """The default DAGER settings, sized for a batch of two short rows."""
  default = inspect.signature(dager.recover).parameters['config'].default
  return dataclasses.replace(
    default, max_live=8, max_done=8, max_length=10, chunk=8
  )


# ------------------------------------------------------------ declaration
@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_declared_kernels_read_as_one_dim_by_out_matrix(layout):
  params = init_params(layout)
  model = declare(layout, params=params)  # shapes checked at build
  got = np.asarray(model.attention_input_kernels(params, 1))
  attn = params['blocks_1']['attn']
  if layout == 'stock':
    # [dim, heads, head_dim] -> [dim, heads * head_dim], q | k | v.
    assert attn['query']['kernel'].shape == (DIM, HEADS, DIM // HEADS)
    want = np.concatenate(
      [
        np.asarray(attn[n]['kernel']).reshape(DIM, DIM)
        for n in ('query', 'key', 'value')
      ],
      axis=1,
    )
  else:
    fused = np.asarray(attn['qkv']['kernel']).reshape(DIM, 3, DIM)
    order = [PARTS[layout].index(p) for p in 'qkv']
    want = fused[:, order].reshape(DIM, 3 * DIM)
  assert got.shape == (DIM, 3 * DIM)
  np.testing.assert_array_equal(got, want)
  # The same under jit (the model is static).
  jitted = jax.jit(lambda p: model.attention_input_kernels(p, 1))
  np.testing.assert_array_equal(jitted(params), want)


@pytest.mark.slow
def test_block_inputs_and_first_layer_by_method_name():
  model, params = declare('stock'), init_params('stock')
  ids, mask = pad(BATCH)
  x0 = model.block_inputs(params, ids, mask, layer=0)
  first = model.first_layer_inputs(params)
  emb = (
    np.asarray(first.tokens)[np.asarray(ids)]
    + np.asarray(first.positions)[: ids.shape[1]]
  )
  mean = emb.mean(-1, keepdims=True)
  var = emb.var(-1, keepdims=True)
  want = (emb - mean) / np.sqrt(var + EPS) * np.asarray(
    first.scale
  ) + np.asarray(first.bias)
  np.testing.assert_allclose(x0, want, atol=1e-4)
  hidden = model.hidden_states(params, ids, mask)
  np.testing.assert_allclose(
    model.lm_head(params, hidden[-1]),
    model.logits(params, ids, mask),
    atol=1e-5,
  )


@pytest.mark.slow
def test_a_wrong_kernel_is_refused_at_build_naming_path_and_shape():
  params = init_params('stock')
  out = ('blocks_0/attn/out/kernel',)  # [heads, head_dim, dim]: an output
  with pytest.raises(
    LeakjaxError,
    match=r"attention_inputs\[0\]\[0\] 'blocks_0/attn/out/kernel' has shape"
    r' \(4, 8, 32\); expected \[32, \.\.\.\]',
  ):
    declare('stock', attention_inputs=(out,), params=params)
  fused = (models.FusedKernel('blocks_0/attn/qkv/kernel', 'qk'),)
  with pytest.raises(
    LeakjaxError, match=r'expected \[32, 2, heads, head_dim\]'
  ):
    declare(
      'fused_heads',
      attention_inputs=(fused,),
      params=init_params('fused_heads'),
    )
  with pytest.raises(LeakjaxError, match=r"parts='qq' must name each"):
    models.FusedKernel('a/kernel', 'qq')
  with pytest.raises(
    LeakjaxError, match=r'attention_inputs\[0\] must be the tuple of block 0'
  ):
    declare('stock', attention_inputs=('blocks_0/attn/query/kernel',))


def test_params_given_wrapped_are_refused_at_build():
  params = init_params('stock')
  with pytest.raises(
    LeakjaxError,
    match=r"did you pass \{'params': params\}\? pass params\['params'\]",
  ):
    declare('stock', params={'params': params})
  with pytest.raises(
    LeakjaxError,
    match=r"^word_embeddings 'embed/table' is not in params: no 'embed/table';"
    r' pass the path of this tensor in params as word_embeddings= \(keys'
    r" here: 'embedding'\)",
  ):
    declare('stock', word_embeddings='embed/table', params=params)
  with pytest.raises(LeakjaxError, match=r"no method 'nope'.*block_inputs="):
    declare('stock', block_inputs='nope')


# ------------------------------------------------------------------ DAGER
@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_dager_recovers_the_batch_of_a_stock_flax_model_exactly(layout):
  model, params = declare(layout), init_params(layout)
  result = dager.recover(model, params, gradient(layout), config=dager_config())
  assert not result.rank_limited and result.dropped == 0
  assert sorted(result.sequences) == sorted(BATCH)  # token for token
  assert sorted(result.prefixes) == sorted(r[:-1] for r in BATCH)
  assert sorted(result.candidates.tolist()) == sorted(
    {v for r in BATCH for v in r[:-1]}
  )


# ---------------------------------------------------------- bag of words
@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_the_tied_bag_of_a_stock_flax_model_holds_every_input(layout):
  model, params = declare(layout), init_params(layout)
  with warnings.catch_warnings():
    warnings.simplefilter('error')  # every span fact is declared
    bag = attacks.extract_bag(model, params, gradient(layout))
  assert bag.method == 'tied' and bag.missing_facts == ()
  assert bool(bag.evidence.span_valid)
  inputs = {v for r in BATCH for v in r[:-1]}
  targets = {r[-1] for r in BATCH}  # found only if the model misses them
  assert inputs <= set(bag.ids.tolist()) <= inputs | targets
