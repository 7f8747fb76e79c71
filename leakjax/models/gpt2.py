"""GPT-2 (Radford et al. 2019) as a Flax linen module, with HF checkpoint I/O.

The module reproduces transformers' `GPT2LMHeadModel` numerically (fp32 logits
agree to about 1e-6): learned position embeddings, pre-norm blocks, a final
`ln_f` and an LM head tied to the word embeddings (or an untied `lm_head`).
Our GPT-2 has no dropout, also when it is trained.

>>> model, params = init_model(GPT2Config.tiny(), key=jax.random.key(0))
>>> model.logits(params, jnp.zeros((2, 5), jnp.int32)).shape
(2, 5, 512)

Parameter tree (`h_0` ... `h_{n_layer-1}` are the blocks; Dense kernels are
`[in, out]`, exactly the layout of HF's `Conv1D` weights)::

  wte/embedding [vocab, dim]      wpe/embedding [n_positions, dim]
  h_i/ln_1/{scale,bias}           h_i/attn/c_attn/{kernel,bias} [dim, 3*dim]
  h_i/attn/c_proj/{kernel,bias}   h_i/ln_2/{scale,bias}
  h_i/mlp/c_fc/{kernel,bias}      h_i/mlp/c_proj/{kernel,bias}
  ln_f/{scale,bias}               lm_head/kernel [dim, vocab] (untied only)

Inputs are right-padded: `mask` `[batch, time]` is 1 for real tokens, and
real tokens sit at positions 0 .. length-1, as in transformers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from leakjax.errors import LeakjaxError, check_length
from leakjax.io import as_path, atomic_write_text
from leakjax.models import hf_checkpoint
from leakjax.models.hf_checkpoint import TensorSpec
from leakjax.models.protocol import (
  Bound,
  FirstLayerInputs,
  Model,
  ParamPaths,
  PyTree,
)
from leakjax.tokenization import (
  Tokenizer,
  check_vocab,
  gpt2_tokenizer,
  tokenizer_from_file,
)

# transformers' ACT2FN names -> jax functions. 'gelu_new', 'gelu_fast' and
# 'gelu_pytorch_tanh' are all the tanh approximation of GELU.
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  'gelu_new': functools.partial(jax.nn.gelu, approximate=True),
  'gelu_fast': functools.partial(jax.nn.gelu, approximate=True),
  'gelu_pytorch_tanh': functools.partial(jax.nn.gelu, approximate=True),
  'gelu': functools.partial(jax.nn.gelu, approximate=False),
  'quick_gelu': lambda x: x * jax.nn.sigmoid(1.702 * x),
  'relu': jax.nn.relu,
  'silu': jax.nn.silu,
  'swish': jax.nn.silu,
  'tanh': jnp.tanh,
}
_DTYPES = ('float32', 'bfloat16', 'float16')
# GPT-2's BPE has 50257 ids; its <|endoftext|> is the last one.
_GPT2_VOCAB_SIZE = 50257
# HF buffers that hold the causal mask, not weights (older transformers).
_IGNORED_HF_TENSORS = (r'transformer\.h\.\d+\.attn\.(masked_)?bias',)
# HF config aliases (GPT2Config.attribute_map) -> our field names.
_HF_ALIASES = {
  'hidden_size': 'n_embd',
  'max_position_embeddings': 'n_positions',
  'num_attention_heads': 'n_head',
  'num_hidden_layers': 'n_layer',
}


# ------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class GPT2Config:
  """GPT-2 hyperparameters, named as in transformers' `GPT2Config`.

  Attributes:
    vocab_size: rows of the word embedding (and of the LM head).
    n_positions: context length (rows of the position embedding).
    n_embd: model width.
    n_layer: number of transformer blocks.
    n_head: attention heads; must divide `n_embd`.
    n_inner: MLP width; None means `4 * n_embd`.
    activation_function: a transformers activation name, e.g. 'gelu_new'.
    layer_norm_epsilon: LayerNorm epsilon.
    initializer_range: std of the normal init of weights and embeddings.
    scale_attn_weights: divide attention scores by sqrt(head_dim).
    scale_attn_by_inverse_layer_idx: also divide them by (layer index + 1).
    tie_word_embeddings: the LM head is the transposed word embedding.
    bos_token_id: written to config.json for transformers.
    eos_token_id: written to config.json for transformers.
    dtype: name of the parameter and activation dtype ('float32',
      'bfloat16' or 'float16'); attention softmax, LayerNorm statistics and
      the returned logits are always float32.
  """

  vocab_size: int = _GPT2_VOCAB_SIZE
  n_positions: int = 1024
  n_embd: int = 768
  n_layer: int = 12
  n_head: int = 12
  n_inner: int | None = None
  activation_function: str = 'gelu_new'
  layer_norm_epsilon: float = 1e-5
  initializer_range: float = 0.02
  scale_attn_weights: bool = True
  scale_attn_by_inverse_layer_idx: bool = False
  tie_word_embeddings: bool = True
  bos_token_id: int | None = _GPT2_VOCAB_SIZE - 1
  eos_token_id: int | None = _GPT2_VOCAB_SIZE - 1
  dtype: str = 'float32'

  def __post_init__(self):
    for name in ('vocab_size', 'n_positions', 'n_embd', 'n_layer', 'n_head'):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise LeakjaxError(
          f'GPT-2 config: {name}={getattr(self, name)!r} must be a positive'
          ' integer',
          'fix config.json',
        )
    if self.n_embd % self.n_head:
      raise LeakjaxError(
        f'GPT-2 config: n_embd={self.n_embd} is not divisible by'
        f' n_head={self.n_head}',
        'fix config.json',
      )
    if self.activation_function not in _ACTIVATIONS:
      raise LeakjaxError(
        f'GPT-2 config: activation_function={self.activation_function!r}'
        ' is not supported',
        'use one of ' + ', '.join(sorted(_ACTIVATIONS)),
      )
    if self.dtype not in _DTYPES:
      raise LeakjaxError(
        f'GPT-2 config: dtype={self.dtype!r} is not supported',
        'use one of ' + ', '.join(_DTYPES),
      )

  # Properties every leakjax config has (see base.Model).
  @property
  def hidden_size(self) -> int:
    return self.n_embd

  @property
  def num_layers(self) -> int:
    return self.n_layer

  @property
  def max_length(self) -> int:
    return self.n_positions

  @property
  def head_dim(self) -> int:
    return self.n_embd // self.n_head

  @property
  def inner_size(self) -> int:
    return self.n_inner if self.n_inner is not None else 4 * self.n_embd

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  # Presets.
  @classmethod
  def small(cls, **overrides) -> GPT2Config:
    """OpenAI's GPT-2 small (124M parameters)."""
    return cls(**overrides)

  @classmethod
  def medium(cls, **overrides) -> GPT2Config:
    """OpenAI's GPT-2 medium (355M parameters)."""
    return cls(**{'n_embd': 1024, 'n_layer': 24, 'n_head': 16, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> GPT2Config:
    """A 2-layer, 64-wide model for tests and quick experiments."""
    defaults = dict(
      vocab_size=512,
      n_positions=64,
      n_embd=64,
      n_layer=2,
      n_head=4,
      bos_token_id=None,
      eos_token_id=None,
    )
    return cls(**{**defaults, **overrides})

  # HF config.json <-> GPT2Config.
  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> GPT2Config:
    """Reads the fields we use from a transformers `config.json` dict.

    Unknown keys (dropout rates, summary_* heads, ...) are ignored; features
    we do not implement (cross-attention) raise LeakjaxError.
    """
    d = dict(d)
    for alias, name in _HF_ALIASES.items():
      if alias in d and name not in d:
        d[name] = d[alias]
    if d.get('add_cross_attention'):
      raise LeakjaxError(
        'GPT-2 config has add_cross_attention=true, which'
        ' leakjax does not implement',
        'use a decoder-only GPT-2 checkpoint',
      )
    fields = {f.name for f in dataclasses.fields(cls)} - {'dtype'}
    return cls(**{k: v for k, v in d.items() if k in fields})

  def to_hf_dict(self) -> dict[str, Any]:
    """A transformers `config.json` dict for `GPT2LMHeadModel`.

    Dropout rates are 0 because this model has no dropout; `dtype` is
    float32 because :func:`to_hf_directory` writes float32 tensors.
    """
    return {
      'model_type': 'gpt2',
      'architectures': ['GPT2LMHeadModel'],
      'vocab_size': self.vocab_size,
      'n_positions': self.n_positions,
      'n_embd': self.n_embd,
      'n_layer': self.n_layer,
      'n_head': self.n_head,
      'n_inner': self.n_inner,
      'activation_function': self.activation_function,
      'layer_norm_epsilon': self.layer_norm_epsilon,
      'initializer_range': self.initializer_range,
      'scale_attn_weights': self.scale_attn_weights,
      'scale_attn_by_inverse_layer_idx': self.scale_attn_by_inverse_layer_idx,
      'reorder_and_upcast_attn': False,
      'add_cross_attention': False,
      'tie_word_embeddings': self.tie_word_embeddings,
      'bos_token_id': self.bos_token_id,
      'eos_token_id': self.eos_token_id,
      'resid_pdrop': 0.0,
      'embd_pdrop': 0.0,
      'attn_pdrop': 0.0,
      'use_cache': True,
      'dtype': 'float32',
    }


# ------------------------------------------------------------------- cache
@struct.dataclass
class KVCache:
  """Keys and values of the tokens decoded so far.

  Every leaf has the batch as its leading axis, so beams are reordered with
  `jax.tree.map(lambda x: x[idx], cache)`.

  Attributes:
    keys: n_layer arrays, each `[batch, max_len, heads, head_dim]`, dtype of
      the params.
    values: like `keys`.
    index: int32 `[batch]`, number of tokens already in each row (= position
      of the next token).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  index: jax.Array

  @property
  def max_length(self) -> int:
    return self.keys[0].shape[1]


def init_cache(config: GPT2Config, batch_size: int, max_length: int) -> KVCache:
  """An empty cache for up to `max_length` (<= n_positions) tokens per row."""
  check_length(max_length, config.n_positions, 'the decoding cache')
  shape = (batch_size, max_length, config.n_head, config.head_dim)
  zeros = tuple(
    jnp.zeros(shape, config.jnp_dtype) for _ in range(config.n_layer)
  )
  return KVCache(
    keys=zeros, values=zeros, index=jnp.zeros((batch_size,), jnp.int32)
  )


# ------------------------------------------------------------------ module
def _normal(config: GPT2Config, *, residual: bool = False):
  std = config.initializer_range
  if residual:  # GPT-2 Sec. 2.3: scale residual projections by 1/sqrt(N).
    std /= math.sqrt(2 * config.n_layer)
  return nn.initializers.normal(std)


def _dense(
  config: GPT2Config, features: int, name: str, *, residual: bool = False
) -> nn.Dense:
  return nn.Dense(
    features,
    kernel_init=_normal(config, residual=residual),
    dtype=config.jnp_dtype,
    param_dtype=config.jnp_dtype,
    name=name,
  )


def _layer_norm(config: GPT2Config, name: str) -> nn.LayerNorm:
  # Two-pass variance, as torch's LayerNorm.
  return nn.LayerNorm(
    epsilon=config.layer_norm_epsilon,
    use_fast_variance=False,
    dtype=config.jnp_dtype,
    param_dtype=config.jnp_dtype,
    name=name,
  )


class CausalSelfAttention(nn.Module):
  """Multi-head attention; optionally writes into and reads a KV cache."""

  config: GPT2Config
  layer_index: int

  @nn.compact
  def __call__(self, x, allowed, kv=None, index=None):
    """Attends from `x` to itself (or to the cache plus itself).

    Args:
      x: `[batch, t, dim]`.
      allowed: bool `[batch, t, s]`, whether query i may attend to key j;
        s = t without a cache, s = max_len with one.
      kv: None, or the cached `(keys, values)`, each
        `[batch, max_len, heads, head_dim]`.
      index: int32 `[batch]`, where to write the new keys (with `kv`).

    Returns:
      `([batch, t, dim], (keys, values))`, the keys/values attended to.
    """
    c = self.config
    batch, t, dim = x.shape
    qkv = _dense(c, 3 * dim, 'c_attn')(x)  # [batch, t, 3*dim]
    # [batch, t, dim] -> [batch, t, heads, head_dim]
    q, k, v = (
      y.reshape(batch, t, c.n_head, c.head_dim)
      for y in jnp.split(qkv, 3, axis=-1)
    )
    if kv is not None:
      write = jax.vmap(
        lambda cache, new, i: lax.dynamic_update_slice(
          cache, new.astype(cache.dtype), (i, 0, 0)
        )
      )
      k = write(kv[0], k, index)  # [batch, max_len, heads, head_dim]
      v = write(kv[1], v, index)
    scale = c.head_dim**-0.5 if c.scale_attn_weights else 1.0
    if c.scale_attn_by_inverse_layer_idx:
      scale /= self.layer_index + 1
    scores = jnp.einsum(
      'bqhd,bkhd->bhqk', q, k, preferred_element_type=jnp.float32
    )  # [batch, heads, t, s], float32 even for bfloat16 params
    scores = scores * scale
    scores = jnp.where(allowed[:, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    out = out.reshape(batch, t, dim)  # [batch, t, heads, head_dim] -> [.., dim]
    return _dense(c, dim, 'c_proj', residual=True)(out), (k, v)


class MLP(nn.Module):
  config: GPT2Config

  @nn.compact
  def __call__(self, x):
    c = self.config
    h = _ACTIVATIONS[c.activation_function](_dense(c, c.inner_size, 'c_fc')(x))
    return _dense(c, c.n_embd, 'c_proj', residual=True)(h)


class Block(nn.Module):
  """Pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

  config: GPT2Config
  layer_index: int

  @nn.compact
  def __call__(self, x, allowed, kv=None, index=None):
    c = self.config
    a, kv = CausalSelfAttention(c, self.layer_index, name='attn')(
      _layer_norm(c, 'ln_1')(x), allowed, kv, index
    )
    x = x + a
    x = x + MLP(c, name='mlp')(_layer_norm(c, 'ln_2')(x))
    return x, kv


class GPT2LMHeadModel(nn.Module):
  """GPT-2 with its LM head. Methods: `__call__` (logits), `hidden_states`,
  `head`, `decode`; use them through :class:`leakjax.models.Model`."""

  config: GPT2Config

  def setup(self):
    c = self.config
    embed = functools.partial(
      nn.Embed,
      features=c.n_embd,
      embedding_init=_normal(c),
      dtype=c.jnp_dtype,
      param_dtype=c.jnp_dtype,
    )
    self.wte = embed(c.vocab_size)
    self.wpe = embed(c.n_positions)
    self.h = [Block(c, i) for i in range(c.n_layer)]  # named h_0, h_1, ...
    self.ln_f = _layer_norm(c, None)
    if not c.tie_word_embeddings:
      self.lm_head = nn.Dense(
        c.vocab_size,
        use_bias=False,
        kernel_init=_normal(c),
        dtype=c.jnp_dtype,
        param_dtype=c.jnp_dtype,
      )

  def _forward(self, ids, mask, collect: bool, num_blocks=None):
    _, t = ids.shape
    causal = jnp.tril(jnp.ones((t, t), bool))  # [t, t]
    allowed = causal[None]
    if mask is not None:  # padded keys are never attended to
      allowed = allowed & mask.astype(bool)[:, None, :]  # [batch, t, t]
    x = self.wte(ids) + self.wpe(jnp.arange(t)[None])  # [batch, t, dim]
    states = [x]
    for block in self.h[:num_blocks]:
      x, _ = block(x, allowed)
      states.append(x)
    return jnp.stack(states) if collect else x

  def __call__(self, ids, mask=None):
    """`ids`, `mask` `[batch, t]` -> float32 logits `[batch, t, vocab]`."""
    return self.head(self._forward(ids, mask, collect=False))

  def hidden_states(self, ids, mask=None, num_blocks=None):
    """`[n_layer + 1, batch, t, dim]`: embeddings, then each block's output
    (with `num_blocks`, only the first `num_blocks` blocks run)."""
    return self._forward(ids, mask, collect=True, num_blocks=num_blocks)

  def head(self, h):
    """ln_f + LM head: `[..., dim]` -> float32 `[..., vocab]`."""
    h = self.ln_f(h)
    if self.config.tie_word_embeddings:
      logits = self.wte.attend(h)
    else:
      logits = self.lm_head(h)
    return logits.astype(jnp.float32)

  def decode_stream(self, ids, cache: KVCache):
    """Appends `ids` through the first `len(cache.keys)` blocks; returns
    the residual stream after them (no ln_f) and the cache."""
    _, t = ids.shape
    positions = cache.index[:, None] + jnp.arange(t)[None]  # [batch, t]
    key_pos = jnp.arange(cache.max_length)
    allowed = key_pos[None, None, :] <= positions[:, :, None]  # [b, t, max]
    x = self.wte(ids) + self.wpe(positions)  # [batch, t, dim]
    keys, values = [], []
    blocks = self.h[: len(cache.keys)]  # all of them, except for block_decode
    for block, k, v in zip(blocks, cache.keys, cache.values, strict=True):
      x, (k, v) = block(x, allowed, (k, v), cache.index)
      keys.append(k)
      values.append(v)
    new_cache = KVCache(
      keys=tuple(keys), values=tuple(values), index=cache.index + t
    )
    return x, new_cache

  def decode(self, ids, cache: KVCache):
    """Appends `ids [batch, t]` at `cache.index`; see :func:`make_model`."""
    x, new_cache = self.decode_stream(ids, cache)
    return self.head(x), new_cache


# ------------------------------------------------------------------- model
def _check_ids(ids, mask, config: GPT2Config, what: str = 'the input') -> None:
  """Static-shape checks; shapes are concrete even under jit."""
  if len(ids.shape) != 2:
    raise LeakjaxError(
      f'{what} ids have shape {tuple(ids.shape)}, expected [batch, time]',
      'add a batch axis',
    )
  if mask is not None and tuple(mask.shape) != tuple(ids.shape):
    raise LeakjaxError(
      f'mask shape {tuple(mask.shape)} differs from ids shape'
      f' {tuple(ids.shape)}',
      'pass the mask of these ids',
    )
  check_length(ids.shape[1], config.n_positions, what)


def _gpt2_logits(config: GPT2Config, params, ids, mask=None):
  _check_ids(ids, mask, config)
  return GPT2LMHeadModel(config).apply({'params': params}, ids, mask)


def _gpt2_hidden(config: GPT2Config, params, ids, mask=None):
  _check_ids(ids, mask, config)
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, mask, method=GPT2LMHeadModel.hidden_states
  )


def _gpt2_head(config: GPT2Config, params, hidden):
  return GPT2LMHeadModel(config).apply(
    {'params': params}, hidden, method=GPT2LMHeadModel.head
  )


def _gpt2_init_cache(config: GPT2Config, params, batch_size, max_length):
  del params
  return init_cache(config, batch_size, max_length)


def _gpt2_decode(config: GPT2Config, params, cache, ids):
  _check_ids(ids, None, config, 'the decoded chunk')
  check_length(ids.shape[1], cache.max_length, 'the decoded chunk')
  if not isinstance(cache.index, jax.core.Tracer):
    check_length(
      int(np.max(np.asarray(cache.index))) + ids.shape[1],
      cache.max_length,
      'the decoding cache after this step',
    )
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, cache, method=GPT2LMHeadModel.decode
  )


def _layer_norm_fn(x, ln, eps):
  """`_layer_norm` (flax LayerNorm) as a function of its params."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), -1, keepdims=True)
  y = (x32 - mean) * lax.rsqrt(var + eps)
  return (y * ln['scale'] + ln['bias']).astype(ln['scale'].dtype)


def _check_block(config: GPT2Config, layer: int):
  if not 0 <= layer < config.n_layer:
    raise LeakjaxError(
      f'block {layer} does not exist; the model has {config.n_layer} blocks',
      f'pass 0 <= layer < {config.n_layer}',
    )


def _gpt2_block_inputs(config: GPT2Config, params, ids, mask, layer):
  _check_ids(ids, mask, config)
  _check_block(config, layer)
  stream = GPT2LMHeadModel(config).apply(
    {'params': params},
    ids,
    mask,
    layer,
    method=GPT2LMHeadModel.hidden_states,
  )[-1]
  ln = params[f'h_{layer}']['ln_1']
  return _layer_norm_fn(stream, ln, config.layer_norm_epsilon)


def _gpt2_block_cache(
  config: GPT2Config, params, batch_size, max_length, layer
):
  del params
  _check_block(config, layer)
  full = init_cache(config, batch_size, max_length)
  return KVCache(
    keys=full.keys[:layer], values=full.values[:layer], index=full.index
  )


def _gpt2_block_decode(config: GPT2Config, params, cache, ids, layer):
  _check_ids(ids, None, config, 'the decoded chunk')
  _check_block(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this block cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_block_cache(..., layer=layer)',
    )
  if layer == 0:  # no block runs: token + position embeddings
    positions = cache.index[:, None] + jnp.arange(ids.shape[1])[None]
    x = params['wte']['embedding'][ids] + params['wpe']['embedding'][positions]
    new = cache.replace(index=cache.index + ids.shape[1])
  else:
    x, new = GPT2LMHeadModel(config).apply(
      {'params': params}, ids, cache, method=GPT2LMHeadModel.decode_stream
    )
  ln = params[f'h_{layer}']['ln_1']
  return _layer_norm_fn(x, ln, config.layer_norm_epsilon), new


def _gpt2_first_layer(config: GPT2Config, params) -> FirstLayerInputs:
  ln = params['h_0']['ln_1']
  return FirstLayerInputs(
    tokens=params['wte']['embedding'],
    positions=params['wpe']['embedding'],
    scale=ln['scale'],
    bias=ln['bias'],
    eps=config.layer_norm_epsilon,
    kind='layer',
  )


def make_model(config: GPT2Config, tokenizer=None) -> Model:
  """GPT-2 of `config` as a :class:`leakjax.models.Model` (no weights).

  `decode(params, cache, ids)` appends `ids [batch, t]` at each row's
  `cache.index` (positions index .. index+t-1) with causal attention over the
  cache and returns `(logits [batch, t, vocab], new_cache)`. It assumes the
  rows have no padding: prefill a batch with prompts of one length (or
  prefill rows separately and concatenate their caches, which may then sit
  at different indices). Writing past the cache's `max_length` raises
  LeakjaxError when the index is concrete; under jit it is not checked.

  `train_logits` equals `logits`: our GPT-2 has no dropout.

  Args:
    config: the model's config.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer` or None.

  Returns:
    A Model with family 'gpt2'; equal configs give equal models.
  """
  check_vocab(tokenizer, config.vocab_size)
  paths = ParamPaths(
    word_embeddings=('wte', 'embedding'),
    position_embeddings=('wpe', 'embedding'),
    lm_head=None if config.tie_word_embeddings else ('lm_head', 'kernel'),
    attention_inputs=tuple(
      ((f'h_{i}', 'attn', 'c_attn', 'kernel'),)
      for i in range(min(4, config.n_layer))
    ),
    last_layers=((f'h_{config.n_layer - 1}',), ('ln_f',)),
  )
  return Model(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_layers=config.num_layers,
    max_length=config.n_positions,
    tie_word_embeddings=config.tie_word_embeddings,
    family='gpt2',
    config=config,
    tokenizer=tokenizer,
    paths=paths,
    logits_fn=Bound(_gpt2_logits, (config,)),
    hidden_fn=Bound(_gpt2_hidden, (config,)),
    head_fn=Bound(_gpt2_head, (config,)),
    init_cache_fn=Bound(_gpt2_init_cache, (config,)),
    decode_fn=Bound(_gpt2_decode, (config,)),
    first_layer_fn=Bound(_gpt2_first_layer, (config,)),
    block_input_fn=Bound(_gpt2_block_inputs, (config,)),
    block_cache_fn=Bound(_gpt2_block_cache, (config,)),
    block_decode_fn=Bound(_gpt2_block_decode, (config,)),
  )


def _init_params(config: GPT2Config, key):
  module = GPT2LMHeadModel(config)
  return module.init(key, jnp.zeros((1, 1), jnp.int32))['params']


def init_model(
  config: GPT2Config, *, key, tokenizer=None, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """A randomly initialized GPT-2 with transformers' initialization.

  Weights and embeddings are normal(initializer_range), biases 0, LayerNorm
  scales 1, and the residual projections (`c_proj`) normal(initializer_range
  / sqrt(2 * n_layer)) (GPT-2 Sec. 2.3).

  Args:
    config: the architecture; its `dtype` is replaced by `dtype`.
    key: a `jax.random.key`.
    tokenizer: attached to the model (must fit in `config.vocab_size`).
    dtype: parameter and activation dtype.

  Returns:
    `(model, params)`, the model with family 'gpt2'.
  """
  config = dataclasses.replace(config, dtype=jnp.dtype(dtype).name)
  params = jax.jit(functools.partial(_init_params, config))(key)
  return make_model(config, tokenizer), params


# -------------------------------------------------------- HF checkpoints
def hf_name_map(config: GPT2Config) -> dict[str, TensorSpec]:
  """transformers `GPT2LMHeadModel` tensor name -> where it goes in params.

  Names carry the `transformer.` prefix; `lm_head.weight` ([vocab, dim]) is
  only listed when the head is untied. HF's `Conv1D` weights are already
  `[in, out]`, so only `lm_head` is transposed.
  """
  specs = {
    'transformer.wte.weight': TensorSpec(('wte', 'embedding')),
    'transformer.wpe.weight': TensorSpec(('wpe', 'embedding')),
    'transformer.ln_f.weight': TensorSpec(('ln_f', 'scale')),
    'transformer.ln_f.bias': TensorSpec(('ln_f', 'bias')),
  }
  per_layer = {
    'ln_1.weight': ('ln_1', 'scale'),
    'ln_1.bias': ('ln_1', 'bias'),
    'attn.c_attn.weight': ('attn', 'c_attn', 'kernel'),
    'attn.c_attn.bias': ('attn', 'c_attn', 'bias'),
    'attn.c_proj.weight': ('attn', 'c_proj', 'kernel'),
    'attn.c_proj.bias': ('attn', 'c_proj', 'bias'),
    'ln_2.weight': ('ln_2', 'scale'),
    'ln_2.bias': ('ln_2', 'bias'),
    'mlp.c_fc.weight': ('mlp', 'c_fc', 'kernel'),
    'mlp.c_fc.bias': ('mlp', 'c_fc', 'bias'),
    'mlp.c_proj.weight': ('mlp', 'c_proj', 'kernel'),
    'mlp.c_proj.bias': ('mlp', 'c_proj', 'bias'),
  }
  for i in range(config.n_layer):
    for hf_name, path in per_layer.items():
      specs[f'transformer.h.{i}.{hf_name}'] = TensorSpec((f'h_{i}', *path))
  if not config.tie_word_embeddings:
    specs['lm_head.weight'] = TensorSpec(
      ('lm_head', 'kernel'), **hf_checkpoint.transpose()
    )
  return specs


def _canonical_tensors(
  tensors: Mapping[str, np.ndarray], config: GPT2Config, source: str
) -> dict[str, np.ndarray]:
  """Adds the `transformer.` prefix (GPT2Model checkpoints lack it) and drops
  a tied `lm_head.weight` after checking it equals `wte`."""
  out: dict[str, np.ndarray] = {}
  for name, value in tensors.items():
    canonical = (
      name
      if name.startswith(('transformer.', 'lm_head.'))
      else f'transformer.{name}'
    )
    if canonical in out:
      raise LeakjaxError(
        f'{source} holds {canonical} twice (with and without the'
        ' transformer. prefix)',
        'the checkpoint is corrupt; re-export it',
      )
    out[canonical] = value
  if config.tie_word_embeddings and 'lm_head.weight' in out:
    head = out.pop('lm_head.weight')
    wte = out.get('transformer.wte.weight')
    if wte is not None and not np.array_equal(head, wte):
      raise LeakjaxError(
        f'{source}: lm_head.weight differs from wte.weight although'
        ' config.json has tie_word_embeddings=true',
        'set "tie_word_embeddings": false in config.json',
      )
  return out


def _directory_tokenizer(
  directory: Path, config: GPT2Config
) -> Tokenizer | None:
  """The checkpoint's tokenizer: tokenizer.json, else vocab.json +
  merges.txt, else OpenAI's GPT-2 BPE if the model has room for its 50257
  ids, else None (e.g. a tiny random model)."""
  if (directory / 'tokenizer.json').is_file():
    tokenizer = tokenizer_from_file(directory / 'tokenizer.json')
  elif all((directory / f).is_file() for f in ('vocab.json', 'merges.txt')):
    tokenizer = gpt2_tokenizer(directory)
  elif config.vocab_size >= _GPT2_VOCAB_SIZE:
    tokenizer = gpt2_tokenizer()
  else:
    return None
  check_vocab(tokenizer, config.vocab_size, what=f'model in {directory}')
  return tokenizer


def from_hf_directory(
  path: str | os.PathLike, config_dict: Mapping[str, Any], *, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """Loads a transformers GPT-2 checkpoint directory.

  Reads `model.safetensors`, its shards, or `pytorch_model.bin` (only with
  `torch.load(weights_only=True)`). Tensor names may carry the
  `transformer.` prefix (GPT2LMHeadModel) or not (GPT2Model); attention-mask
  buffers are ignored; a tied `lm_head.weight` must equal `wte`. Every shape
  is checked against the config, and missing, unused or non-finite tensors
  raise LeakjaxError.

  Args:
    path: the checkpoint directory.
    config_dict: its parsed config.json.
    dtype: parameter and activation dtype.

  Returns:
    `(model, params)`: a Model with family 'gpt2' and the directory's
    tokenizer (see `_directory_tokenizer`).
  """
  path = Path(path)
  config = dataclasses.replace(
    GPT2Config.from_hf_dict(config_dict), dtype=jnp.dtype(dtype).name
  )
  # The tokenizer check is cheap: do it before reading the weights.
  tokenizer = _directory_tokenizer(path, config)
  source = str(path)
  tensors = _canonical_tensors(hf_checkpoint.read_tensors(path), config, source)
  abstract = jax.eval_shape(
    functools.partial(_init_params, config), jax.random.key(0)
  )
  params = hf_checkpoint.params_from_hf(
    tensors,
    hf_name_map(config),
    abstract,
    ignore=_IGNORED_HF_TENSORS,
    source=source,
    dtype=config.jnp_dtype,
  )
  params = jax.tree.map(jnp.asarray, params)
  return make_model(config, tokenizer), params


def to_hf_directory(
  model: Model, params: PyTree, directory: str | os.PathLike
) -> None:
  """Writes `model` as a transformers `GPT2LMHeadModel` directory.

  Writes `params` as config.json, model.safetensors (float32; a tied head is not
  stored, as transformers does) and, if the model has a subword tokenizer,
  tokenizer.json + tokenizer_config.json. The directory loads with
  `GPT2LMHeadModel.from_pretrained` (and `AutoTokenizer.from_pretrained`)
  and with `leakjax.models.load`.
  """
  if model.family != 'gpt2':
    raise LeakjaxError(
      f'to_hf_directory needs a gpt2 model, got {model.family}',
      'use leakjax.models.save',
    )
  config: GPT2Config = model.config
  directory = as_path(directory)
  tensors = hf_checkpoint.params_to_hf(params, hf_name_map(config))
  hf_checkpoint.write_checkpoint(directory, tensors, config.to_hf_dict())
  tokenizer = model.tokenizer
  if tokenizer is None:
    return
  if not hasattr(tokenizer, 'backend'):
    raise LeakjaxError(
      f'cannot save a {type(tokenizer).__name__} with a GPT-2 model',
      'attach a subword Tokenizer or None',
    )
  atomic_write_text(directory / 'tokenizer.json', tokenizer.backend.to_str())
  special = {}
  for key in ('bos', 'eos', 'unk', 'pad'):
    i = getattr(tokenizer, f'{key}_id', None)
    if i is not None:
      special[f'{key}_token'] = tokenizer.id_to_token(i)
  # PreTrainedTokenizerFast loads tokenizer.json as it is; without a class,
  # transformers would pick GPT2Tokenizer, which assumes GPT-2's BPE.
  tokenizer_config = {
    **special,
    'model_max_length': config.n_positions,
    'tokenizer_class': 'PreTrainedTokenizerFast',
  }
  atomic_write_text(
    directory / 'tokenizer_config.json',
    json.dumps(tokenizer_config, indent=2, sort_keys=True),
  )


__all__ = [
  'GPT2Config',
  'GPT2LMHeadModel',
  'KVCache',
  'init_cache',
  'init_model',
  'make_model',
  'hf_name_map',
  'from_hf_directory',
  'to_hf_directory',
]
