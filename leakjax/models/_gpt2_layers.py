"""The Flax modules of GPT-2 and its KV cache.

Causal self-attention that reads and writes the cache, the MLP, pre-norm
blocks and :class:`GPT2LMHeadModel`, the whole model.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from leakjax.errors import check_length
from leakjax.models._gpt2_config import _ACTIVATIONS, GPT2Config
from leakjax.models._shared_prefix import attend_shared_prefix


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
  def __call__(self, x, allowed, kv=None, index=None, shared=False):
    """Attends from `x` to itself (or to the cache plus itself).

    Args:
      x: `[batch, t, dim]`.
      allowed: bool `[batch, t, s]`, whether query i may attend to key j;
        s = t without a cache, s = max_len with one; unused when `shared`.
      kv: None, or the cached `(keys, values)`, each
        `[batch, max_len, heads, head_dim]`.
      index: int32 `[batch]`, where to write the new keys (with `kv`).
      shared: `x` is `[c, 1, dim]`, c alternative next tokens after the
        one-row cache `kv` (`index [1]`): each attends to the prefix and
        itself, and the cache is returned unchanged.

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
    scale = c.head_dim**-0.5 if c.scale_attn_weights else 1.0
    if c.scale_attn_by_inverse_layer_idx:
      scale /= self.layer_index + 1
    if shared:  # t == 1; one group of one query head per key/value head
      out = attend_shared_prefix(
        q[:, 0, :, None], k[:, 0], v[:, 0], kv[0][0], kv[1][0], index[0], scale
      )
      out = out.reshape(batch, 1, dim)
      return _dense(c, dim, 'c_proj', residual=True)(out), kv
    if kv is not None:
      write = jax.vmap(
        lambda cache, new, i: lax.dynamic_update_slice(
          cache, new.astype(cache.dtype), (i, 0, 0)
        )
      )
      k = write(kv[0], k, index)  # [batch, max_len, heads, head_dim]
      v = write(kv[1], v, index)
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
  def __call__(self, x, allowed, kv=None, index=None, shared=False):
    c = self.config
    a, kv = CausalSelfAttention(c, self.layer_index, name='attn')(
      _layer_norm(c, 'ln_1')(x), allowed, kv, index, shared
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

  def stream_candidates(self, ids, cache: KVCache):
    """The residual stream after the first `len(cache.keys)` blocks of each
    of `ids [c]` placed at the next position of the one-row `cache` (each
    attends to the cached prefix and itself); `[c, dim]`."""
    x = self.wte(ids) + self.wpe(cache.index[:1])  # [c, dim]
    x = x[:, None]
    for block, k, v in zip(self.h, cache.keys, cache.values):
      x, _ = block(x, None, (k, v), cache.index, shared=True)
    return x[:, 0]

  def decode(self, ids, cache: KVCache):
    """Appends `ids [batch, t]` at `cache.index`; see :func:`make_model`."""
    x, new_cache = self.decode_stream(ids, cache)
    return self.head(x), new_cache
