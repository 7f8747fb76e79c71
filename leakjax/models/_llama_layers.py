"""The Flax modules of the Llama decoder and its KV cache.

Grouped-query attention with RoPE, the gated MLP, RMSNorm, pre-norm blocks
and :class:`Llama`, the whole decoder.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from leakjax.models._llama_config import LlamaConfig
from leakjax.models._shared_prefix import attend_shared_prefix
from leakjax.models.rope import rope, rope_inv_freq


@flax.struct.dataclass
class LlamaCache:
  """Keys/values of the tokens decoded so far; every leaf is batch-leading.

  A query at position p attends to slots 0..p only, so after prefilling a
  right-padded batch, `cache.replace(index=lengths)` makes each row continue
  after its last real token (the padding slots are overwritten before any
  query can see them).

  Attributes:
    keys: per layer, float `[batch, max_len, kv_heads, head_dim]`, with RoPE
      already applied.
    values: per layer, float `[batch, max_len, kv_heads, head_dim]`.
    index: int32 `[batch]`, the position the next token is written to.
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  index: jax.Array


def _rms_norm(x, scale, eps, offset=0.0):
  """HF Llama's RMSNorm: normalise in float32, scale in the scale's dtype;
  with an offset, Gemma's: scale by `offset + scale` in float32, then cast
  to the input's dtype."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps)
  if offset:
    return (x32 * (offset + scale.astype(jnp.float32))).astype(x.dtype)
  return scale * x32.astype(scale.dtype)


def _norm(config: LlamaConfig, x, scale):
  return _rms_norm(x, scale, config.rms_norm_eps, config.norm_offset)


class RMSNorm(nn.Module):
  """RMSNorm as in HF Llama (Gemma's with `offset`): normalise in float32,
  scale in `dtype`. The weight starts at the identity: ones, or zeros with
  an offset."""

  eps: float
  dtype: Any = jnp.float32
  offset: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.initializers.zeros if self.offset else nn.initializers.ones
    scale = self.param('scale', init, (x.shape[-1],), self.dtype)
    return _rms_norm(x, scale, self.eps, self.offset)


def _dense(features: int, dtype, name: str, bias: bool = False) -> nn.Dense:
  return nn.Dense(
    features,
    use_bias=bias,
    dtype=dtype,
    param_dtype=dtype,
    kernel_init=nn.initializers.normal(0.02),
    name=name,
  )


def _write_rows(cache: jax.Array, new: jax.Array, index: jax.Array):
  """Writes `new [b, t, ...]` into `cache [b, S, ...]` at row `index [b]`."""

  def one(c, n, i):
    return jax.lax.dynamic_update_slice_in_dim(c, n.astype(c.dtype), i, 0)

  return jax.vmap(one)(cache, new, index)


class Attention(nn.Module):
  """Grouped-query self-attention with RoPE."""

  config: LlamaConfig
  dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    qkv = c.attention_bias != 'none'
    self.q_proj = _dense(
      c.num_attention_heads * c.head_dim, self.dtype, 'q_proj', qkv
    )
    self.k_proj = _dense(
      c.num_key_value_heads * c.head_dim, self.dtype, 'k_proj', qkv
    )
    self.v_proj = _dense(
      c.num_key_value_heads * c.head_dim, self.dtype, 'v_proj', qkv
    )
    self.o_proj = _dense(
      c.hidden_size, self.dtype, 'o_proj', c.attention_bias == 'qkvo'
    )

  def __call__(self, x, positions, allowed, kv=None, index=None, shared=False):
    """Attention of `x [b, t, D]`.

    Args:
      x: block input `[b, t, D]`.
      positions: int `[b, t]` RoPE positions of `x`.
      allowed: bool `[b, t, s]`, which keys each query may see (s = t
        without a cache, the cache length with one); unused when `shared`.
      kv: optional `(keys, values)` cache of this layer, `[b, s, kv, hd]`.
      index: int32 `[b]` write position in `kv`.
      shared: `x` is `[c, 1, D]`, c alternative next tokens after the
        one-row cache `kv` (`[1, s, kv, hd]`, `index [1]`): each attends to
        the prefix and itself, and the cache is returned unchanged.

    Returns:
      `(output [b, t, D], new kv or None)`.
    """
    c = self.config
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, c.num_attention_heads, c.head_dim)
    k = self.k_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
    v = self.v_proj(x).reshape(b, t, c.num_key_value_heads, c.head_dim)
    inv_freq = None if c.rope_type == 'default' else rope_inv_freq(c)
    q = rope(q, positions, c.rope_theta, inv_freq)
    k = rope(k, positions, c.rope_theta, inv_freq)
    if shared:  # t == 1; [c, 1, H, hd] -> [c, kv, groups, hd]
      q = q.reshape(b, c.num_key_value_heads, c.num_groups, c.head_dim)
      out = attend_shared_prefix(
        q, k[:, 0], v[:, 0], kv[0][0], kv[1][0], index[0], c.head_dim**-0.5
      )
      out = out.reshape(b, 1, c.num_attention_heads * c.head_dim)
      return self.o_proj(out), kv
    new_kv = None
    if kv is not None:
      k = _write_rows(kv[0], k, index)
      v = _write_rows(kv[1], v, index)
      new_kv = (k, v)
    # Query head h uses key/value head h // groups (HF `repeat_kv`).
    # [b, t, H, hd] -> [b, t, kv, groups, hd]
    q = q.reshape(b, t, c.num_key_value_heads, c.num_groups, c.head_dim)
    scores = jnp.einsum('btkgd,bskd->bkgts', q, k).astype(jnp.float32)
    scores = scores * (c.head_dim**-0.5)
    big_neg = jnp.finfo(jnp.float32).min
    scores = jnp.where(allowed[:, None, None], scores, big_neg)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum('bkgts,bskd->btkgd', probs, v)
    # [b, t, kv, groups, hd] -> [b, t, H * hd]
    out = out.reshape(b, t, c.num_attention_heads * c.head_dim)
    return self.o_proj(out), new_kv


_ACT = {
  'silu': nn.silu,
  'gelu_tanh': functools.partial(nn.gelu, approximate=True),
  'gelu': functools.partial(nn.gelu, approximate=False),
}


class MLP(nn.Module):
  """Gated MLP: down(act(gate(x)) * up(x)) (SwiGLU with silu)."""

  config: LlamaConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    c = self.config
    gate = _dense(c.intermediate_size, self.dtype, 'gate_proj')(x)
    up = _dense(c.intermediate_size, self.dtype, 'up_proj')(x)
    act = _ACT[c.hidden_act]
    return _dense(c.hidden_size, self.dtype, 'down_proj')(act(gate) * up)


class Block(nn.Module):
  """Pre-norm transformer block."""

  config: LlamaConfig
  dtype: Any = jnp.float32

  def setup(self):
    eps, offset = self.config.rms_norm_eps, self.config.norm_offset
    self.attn_norm = RMSNorm(eps, self.dtype, offset)
    self.attn = Attention(self.config, self.dtype)
    self.mlp_norm = RMSNorm(eps, self.dtype, offset)
    self.mlp = MLP(self.config, self.dtype)

  def __call__(self, x, positions, allowed, kv=None, index=None, shared=False):
    h, new_kv = self.attn(
      self.attn_norm(x), positions, allowed, kv, index, shared
    )
    x = x + h
    return x + self.mlp(self.mlp_norm(x)), new_kv


class Llama(nn.Module):
  """The whole decoder. Params: `embed`, `layers_{i}`, `final_norm` and,
  when untied, `lm_head`.
  """

  config: LlamaConfig
  dtype: Any = jnp.float32

  def setup(self):
    c = self.config
    self.embed = nn.Embed(
      c.vocab_size,
      c.hidden_size,
      dtype=self.dtype,
      param_dtype=self.dtype,
      embedding_init=nn.initializers.normal(0.02),
    )
    self.layers = [Block(c, self.dtype) for _ in range(c.num_hidden_layers)]
    self.final_norm = RMSNorm(c.rms_norm_eps, self.dtype, c.norm_offset)
    if not c.tie_word_embeddings:
      self.lm_head = _dense(c.vocab_size, self.dtype, 'lm_head')

  def __call__(self, ids, mask=None):
    """Logits float32 `[b, t, vocab]`."""
    return self.head(self.hidden_states(ids, mask)[-1])

  def hidden_states(self, ids, mask=None, num_blocks=None):
    """`[L + 1, b, t, D]`: embeddings, then each block's output.

    With `num_blocks`, only the first `num_blocks` blocks run (and
    `num_blocks + 1` states are returned).
    """
    b, t = ids.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    allowed = jnp.tril(jnp.ones((t, t), bool))[None]  # [1, t, t]
    if mask is not None:
      allowed = allowed & (mask[:, None, :] > 0)  # [b, t, t]
    allowed = jnp.broadcast_to(allowed, (b, t, t))
    x = self.embed_ids(ids)
    states = [x]
    for layer in self.layers[:num_blocks]:
      x, _ = layer(x, positions, allowed)
      states.append(x)
    return jnp.stack(states)

  def embed_ids(self, ids):
    """The first block's input: the token embeddings (Gemma: times
    sqrt(hidden_size), in their dtype)."""
    x = self.embed(ids)
    if self.config.embedding_scale:
      x = x * jnp.asarray(self.config.hidden_size**0.5, x.dtype)
    return x

  def head(self, h):
    """Final RMSNorm + LM head: `[..., D] -> [..., vocab]` float32."""
    h = self.final_norm(h)
    if self.config.tie_word_embeddings:
      return self.embed.attend(h).astype(jnp.float32)
    return self.lm_head(h).astype(jnp.float32)

  def decode(self, ids, cache: LlamaCache):
    """Appends `ids [b, t]` at `cache.index`; returns (logits, cache)."""
    x, new = self.decode_stream(ids, cache)
    return self.head(x), new

  def decode_stream(self, ids, cache: LlamaCache):
    """Like `decode` through the first `len(cache.keys)` blocks only;
    returns the residual stream after them (no final norm) and the cache."""
    b, t = ids.shape
    max_len = cache.keys[0].shape[1]
    positions = cache.index[:, None] + jnp.arange(t, dtype=jnp.int32)
    # A query at position p sees cache slots 0..p (later slots are stale).
    allowed = jnp.arange(max_len)[None, None, :] <= positions[:, :, None]
    x = self.embed_ids(ids)
    keys, values = [], []
    for i, layer in enumerate(self.layers[: len(cache.keys)]):
      x, (k, v) = layer(
        x, positions, allowed, (cache.keys[i], cache.values[i]), cache.index
      )
      keys.append(k)
      values.append(v)
    new = LlamaCache(
      keys=tuple(keys), values=tuple(values), index=cache.index + t
    )
    return x, new

  def stream_candidates(self, ids, cache: LlamaCache):
    """The residual stream after the first `len(cache.keys)` blocks of each
    of `ids [c]` placed at the next position of the one-row `cache` (each
    attends to the cached prefix and itself); `[c, D]`."""
    positions = jnp.broadcast_to(cache.index[:1, None], (ids.shape[0], 1))
    x = self.embed_ids(ids[:, None])
    for i, layer in enumerate(self.layers[: len(cache.keys)]):
      kv = (cache.keys[i], cache.values[i])
      x, _ = layer(x, positions, None, kv, cache.index, shared=True)
    return x[:, 0]
