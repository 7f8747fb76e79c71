"""Llama-architecture decoder (Llama 2/3.x, SmolLM2, Qwen2/2.5, Mistral without windows).

Pre-norm blocks of grouped-query attention with rotary position embeddings
(Hugging Face's `rotate_half` layout) and a SwiGLU MLP, RMSNorm everywhere,
and a tied or untied LM head. Numerics follow transformers'
`LlamaForCausalLM` (fp32 logits agree to about 2e-6).

>>> config = LlamaConfig(vocab_size=200, hidden_size=64,
...                      intermediate_size=128, num_hidden_layers=2,
...                      num_attention_heads=4, num_key_value_heads=2)
>>> model, params = init_model(config, key=jax.random.key(0))
>>> model.logits(params, jnp.zeros((1, 5), jnp.int32)).shape
(1, 5, 200)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from leakjax.errors import LeakjaxError, check_length, check_token_ids
from leakjax.models import hf_checkpoint
from leakjax.models.hf_checkpoint import TensorSpec
from leakjax.models.protocol import (
  Bound,
  FirstLayerInputs,
  Model,
  ParamPaths,
  PyTree,
  require_family,
)

FAMILY = 'llama'
_HF_MODEL_TYPES = ('llama', 'mistral', 'qwen2', 'qwen2_no_bias', 'gemma')
HIDDEN_ACTS = ('silu', 'gelu_tanh', 'gelu')
# HF activation names -> ours.
_HF_ACTS = {
  'silu': 'silu',
  'swish': 'silu',
  'gelu_pytorch_tanh': 'gelu_tanh',
  'gelu_tanh': 'gelu_tanh',
  'gelu': 'gelu',
}
ATTENTION_BIASES = ('none', 'qkv', 'qkvo')
ROPE_TYPES = ('default', 'linear', 'llama3', 'factors')


# ------------------------------------------------------------------ config
@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyperparameters of a Llama-architecture model (HF field names).

  Attributes:
    vocab_size: rows of the embedding matrix.
    hidden_size: model width D.
    intermediate_size: width of the SwiGLU MLP.
    num_hidden_layers: number of transformer blocks.
    num_attention_heads: query heads H.
    num_key_value_heads: key/value heads (H for multi-head attention); must
      divide H.
    head_dim: per-head width; default `hidden_size // num_attention_heads`.
    rms_norm_eps: epsilon of every RMSNorm.
    rope_theta: RoPE base frequency.
    max_position_embeddings: context length (longest sequence accepted).
    tie_word_embeddings: whether the LM head is the embedding matrix.
    bos_token_id / eos_token_id: special ids, or None.
    attention_bias: which attention projections carry a bias: 'none'
      (Llama, SmolLM2, Mistral), 'qkv' (Qwen2 / Qwen2.5: q, k and v, not
      the output; Yang et al. 2024, arXiv 2407.10671, Sec. 2.2.1) or 'qkvo'
      (HF Llama's `attention_bias=true`).
    rope_type: 'default', 'linear' (positions divided by `rope_factor`),
      'llama3' (the frequency-dependent scaling of Llama 3.1; see
      :func:`rope_inv_freq`) or 'factors' (each frequency divided by its
      entry of `rope_freq_factors`: llama.cpp's `rope_freqs` tensor, how
      its GGUF files carry Llama 3.1's scaling).
    rope_factor, rope_low_freq_factor, rope_high_freq_factor,
      rope_original_max_position_embeddings: the scaling's parameters
      (HF `rope_scaling` / `rope_parameters` names without the prefix).
    rope_freq_factors: with rope_type 'factors', `head_dim // 2` positive
      divisors of the frequencies (a tuple, so that the config stays
      hashable).
    hidden_act: the gated MLP's activation: 'silu' (SwiGLU: Llama, Qwen2,
      Mistral), 'gelu_tanh' (GeGLU with tanh GELU: Gemma) or 'gelu'.
    norm_offset: every RMSNorm scales by `norm_offset + weight` (Gemma: 1,
      in float32 before casting back; Team Gemma 2024, arXiv 2403.08295,
      and HF's GemmaRMSNorm), else by the weight (0).
    embedding_scale: multiply the token embeddings by sqrt(hidden_size)
      (Gemma) before the first block; the tied head uses them unscaled.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int | None = None
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = False
  bos_token_id: int | None = 1
  eos_token_id: int | None = 2
  attention_bias: str = 'none'
  rope_type: str = 'default'
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position_embeddings: int | None = None
  rope_freq_factors: tuple[float, ...] | None = None
  hidden_act: str = 'silu'
  norm_offset: float = 0.0
  embedding_scale: bool = False

  def __post_init__(self):
    if self.hidden_act not in HIDDEN_ACTS:
      raise LeakjaxError(
        f'hidden_act={self.hidden_act!r} is not one of {", ".join(HIDDEN_ACTS)}'
      )
    if self.attention_bias not in ATTENTION_BIASES:
      raise LeakjaxError(
        f'attention_bias={self.attention_bias!r} is not one of'
        f' {", ".join(ATTENTION_BIASES)}'
      )
    if self.rope_type not in ROPE_TYPES:
      raise LeakjaxError(
        f'RoPE scaling of type {self.rope_type!r} is not supported',
        f'leakjax implements {", ".join(ROPE_TYPES)}',
      )
    if self.rope_type != 'default' and self.rope_factor <= 0:
      raise LeakjaxError(f'rope factor {self.rope_factor} must be positive')
    if self.rope_type == 'llama3' and (
      self.rope_original_max_position_embeddings is None
      or self.rope_high_freq_factor <= self.rope_low_freq_factor
    ):
      raise LeakjaxError(
        'llama3 RoPE scaling needs original_max_position_embeddings and'
        ' high_freq_factor > low_freq_factor',
        'fix the rope_scaling entry of config.json',
      )
    if self.num_key_value_heads is None:
      object.__setattr__(self, 'num_key_value_heads', self.num_attention_heads)
    if self.head_dim is None:
      if self.hidden_size % self.num_attention_heads:
        raise LeakjaxError(
          f'hidden_size={self.hidden_size} is not a multiple of'
          f' num_attention_heads={self.num_attention_heads}',
          'set head_dim explicitly',
        )
      object.__setattr__(
        self, 'head_dim', self.hidden_size // self.num_attention_heads
      )
    if self.num_attention_heads % self.num_key_value_heads:
      raise LeakjaxError(
        f'num_attention_heads={self.num_attention_heads} is not a multiple'
        f' of num_key_value_heads={self.num_key_value_heads}',
        'fix the model config',
      )
    if self.head_dim % 2:
      raise LeakjaxError(
        f'head_dim={self.head_dim} is odd; RoPE needs an even head_dim',
        'fix the model config',
      )
    factors = self.rope_freq_factors
    if (self.rope_type == 'factors') != (factors is not None):
      raise LeakjaxError(
        'rope_freq_factors go with rope_type factors, and only with it'
      )
    if factors is not None:
      factors = tuple(float(f) for f in factors)
      object.__setattr__(self, 'rope_freq_factors', factors)
      if len(factors) != self.head_dim // 2 or not all(f > 0 for f in factors):
        raise LeakjaxError(
          f'rope_freq_factors has {len(factors)} entries (all must be'
          f' positive); head_dim={self.head_dim} needs {self.head_dim // 2}',
          'the file does not match its own metadata',
        )

  @property
  def num_layers(self) -> int:
    return self.num_hidden_layers

  @property
  def max_length(self) -> int:
    return self.max_position_embeddings

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_attention_heads // self.num_key_value_heads

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
    """Reads an HF `config.json` dict, rejecting features we do not model.

    Accepts transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x
    (`rope_parameters`) spellings.
    """
    model_type = d.get('model_type', 'llama')
    if model_type not in _HF_MODEL_TYPES:
      raise LeakjaxError(
        f'config model_type={model_type!r} is not a Llama model',
        'load it with its own family',
      )
    gemma = model_type == 'gemma'
    # Gemma's checkpoints name their activation `hidden_activation` (older
    # ones left it null and meant tanh GELU); the others `hidden_act`.
    act = d.get('hidden_activation') or d.get(
      'hidden_act', 'gelu_pytorch_tanh' if gemma else 'silu'
    )
    if act not in _HF_ACTS:
      raise LeakjaxError(
        f'hidden_act={act!r} is not supported',
        f'leakjax implements {", ".join(sorted(_HF_ACTS))}',
      )
    if d.get('mlp_bias'):
      raise LeakjaxError(
        'mlp_bias=true is not supported by leakjax Llama',
        'use a checkpoint without MLP biases',
      )
    if model_type == 'qwen2':  # q, k, v biases, always (Qwen2 Sec. 2.2.1)
      bias = 'qkv'
    else:
      bias = 'qkvo' if d.get('attention_bias') else 'none'
    rope_theta = d.get('rope_theta')
    scaling = {}
    for key in ('rope_scaling', 'rope_parameters'):
      rope = d.get(key)
      if rope is None:
        continue
      if not isinstance(rope, Mapping):
        raise LeakjaxError(f'{key}={rope!r} is not understood')
      kind = rope.get('rope_type', rope.get('type', 'default'))
      if kind not in ROPE_TYPES:
        raise LeakjaxError(
          f'{key} of type {kind!r} is not supported',
          f'leakjax implements RoPE {", ".join(ROPE_TYPES)}',
        )
      if kind != 'default':
        scaling = {
          'rope_type': kind,
          'rope_factor': float(rope.get('factor', 1.0)),
          'rope_low_freq_factor': float(rope.get('low_freq_factor', 1.0)),
          'rope_high_freq_factor': float(rope.get('high_freq_factor', 4.0)),
          'rope_original_max_position_embeddings': rope.get(
            'original_max_position_embeddings'
          ),
        }
      rope_theta = rope.get('rope_theta', rope_theta)
    missing = [
      k
      for k in (
        'vocab_size',
        'hidden_size',
        'intermediate_size',
        'num_hidden_layers',
        'num_attention_heads',
      )
      if k not in d
    ]
    if missing:
      raise LeakjaxError(
        f'config.json lacks {", ".join(missing)}',
        'use a complete Hugging Face config.json',
      )
    max_pos = int(d.get('max_position_embeddings', 2048))
    if d.get('sliding_window') and d.get('use_sliding_window', True):
      # Within one window, sliding-window attention is plain causal attention.
      max_pos = min(max_pos, int(d['sliding_window']))
    return cls(
      vocab_size=int(d['vocab_size']),
      hidden_size=int(d['hidden_size']),
      intermediate_size=int(d['intermediate_size']),
      num_hidden_layers=int(d['num_hidden_layers']),
      num_attention_heads=int(d['num_attention_heads']),
      num_key_value_heads=d.get('num_key_value_heads'),
      head_dim=d.get('head_dim'),
      rms_norm_eps=float(d.get('rms_norm_eps', 1e-6)),
      rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
      max_position_embeddings=max_pos,
      tie_word_embeddings=bool(d.get('tie_word_embeddings', False)),
      bos_token_id=_first_id(d.get('bos_token_id')),
      eos_token_id=_first_id(d.get('eos_token_id')),
      attention_bias=bias,
      hidden_act=_HF_ACTS[act],
      norm_offset=1.0 if gemma else 0.0,
      embedding_scale=gemma,
      **scaling,
    )

  def to_hf_dict(self) -> dict[str, Any]:
    """An HF `config.json` dict that transformers 4.x and 5.x both read
    (Qwen2's when the q/k/v projections alone carry biases)."""
    qwen = self.attention_bias == 'qkv'
    gemma = self.norm_offset == 1.0 and self.embedding_scale
    if (self.norm_offset, self.embedding_scale) not in (
      (0.0, False),
      (1.0, True),
    ):
      raise LeakjaxError(
        f'norm_offset={self.norm_offset} with embedding_scale='
        f'{self.embedding_scale} is neither Llama nor Gemma',
        'no HF config.json describes it',
      )
    if self.rope_type == 'factors':
      raise LeakjaxError(
        'per-frequency RoPE factors (a GGUF rope_freqs tensor) have no HF'
        ' config.json form',
        'export the HF checkpoint this GGUF was converted from instead',
      )
    rope = {'rope_type': self.rope_type, 'rope_theta': self.rope_theta}
    if self.rope_type != 'default':
      rope['factor'] = self.rope_factor
    if self.rope_type == 'llama3':
      rope.update(
        low_freq_factor=self.rope_low_freq_factor,
        high_freq_factor=self.rope_high_freq_factor,
        original_max_position_embeddings=(
          self.rope_original_max_position_embeddings
        ),
      )
    arch, model_type = (
      ('GemmaForCausalLM', 'gemma')
      if gemma
      else ('Qwen2ForCausalLM', 'qwen2')
      if qwen
      else ('LlamaForCausalLM', 'llama')
    )
    act = {'silu': 'silu', 'gelu_tanh': 'gelu_pytorch_tanh', 'gelu': 'gelu'}
    return {
      'architectures': [arch],
      'model_type': model_type,
      'vocab_size': self.vocab_size,
      'hidden_size': self.hidden_size,
      'intermediate_size': self.intermediate_size,
      'num_hidden_layers': self.num_hidden_layers,
      'num_attention_heads': self.num_attention_heads,
      'num_key_value_heads': self.num_key_value_heads,
      'head_dim': self.head_dim,
      'hidden_act': act[self.hidden_act],
      'rms_norm_eps': self.rms_norm_eps,
      'rope_theta': self.rope_theta,
      'rope_parameters': rope,
      'rope_scaling': None if self.rope_type == 'default' else rope,
      'use_sliding_window': False,
      'max_position_embeddings': self.max_position_embeddings,
      'tie_word_embeddings': self.tie_word_embeddings,
      'attention_bias': self.attention_bias == 'qkvo',
      'mlp_bias': False,
      'bos_token_id': self.bos_token_id,
      'eos_token_id': self.eos_token_id,
      'torch_dtype': 'float32',
    }


def _first_id(value) -> int | None:
  if isinstance(value, (list, tuple)):
    value = value[0] if value else None
  return None if value is None else int(value)


# ------------------------------------------------------------------ cache
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


# ----------------------------------------------------------------- layers
def rope_inv_freq(config: LlamaConfig) -> jax.Array:
  """RoPE's inverse frequencies, float32 `[head_dim // 2]`, with scaling.

  'default': `theta ** (-2i / head_dim)` (Su et al. 2021). 'linear':
  divided by `factor` (positions interpolated). 'llama3' (Llama 3.1; Meta,
  "The Llama 3 Herd of Models", 2024): with wavelength `w = 2 pi / f` and
  the original context `L`, frequencies whose `w > L / low_freq_factor`
  are divided by `factor`, those with `w < L / high_freq_factor` are kept,
  and in between `f` moves smoothly from one to the other with weight
  `s = (L / w - low) / (high - low)`: `(1 - s) f / factor + s f`.
  """
  half = config.head_dim // 2
  inv_freq = 1.0 / (
    config.rope_theta ** (jnp.arange(0, half, dtype=jnp.float32) / half)
  )
  if config.rope_type == 'factors':
    return inv_freq / jnp.asarray(config.rope_freq_factors, jnp.float32)
  if config.rope_type == 'linear':
    return inv_freq / config.rope_factor
  if config.rope_type == 'llama3':
    old_len = float(config.rope_original_max_position_embeddings)
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    wavelen = 2 * jnp.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    mixed = (1 - smooth) * inv_freq / config.rope_factor + smooth * inv_freq
    return jnp.where(
      wavelen > old_len / low,
      inv_freq / config.rope_factor,
      jnp.where(wavelen < old_len / high, inv_freq, mixed),
    )
  return inv_freq


def rope(
  x: jax.Array,
  positions: jax.Array,
  theta: float,
  inv_freq: jax.Array | None = None,
) -> jax.Array:
  """Rotary embedding, HF `rotate_half` layout.

  Args:
    x: `[batch, time, heads, head_dim]`.
    positions: int `[batch, time]`.
    theta: RoPE base (used when `inv_freq` is None).
    inv_freq: float32 `[head_dim // 2]` from :func:`rope_inv_freq`, for
      scaled RoPE.

  Returns:
    `x` rotated, same shape and dtype.
  """
  half = x.shape[-1] // 2
  if inv_freq is None:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) / half))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, t, half]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  cos = jnp.cos(angles).astype(x.dtype)
  sin = jnp.sin(angles).astype(x.dtype)
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


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

  def __call__(self, x, positions, allowed, kv=None, index=None):
    """Attention of `x [b, t, D]`.

    Args:
      x: block input `[b, t, D]`.
      positions: int `[b, t]` RoPE positions of `x`.
      allowed: bool `[b, t, s]`, which keys each query may see (s = t
        without a cache, the cache length with one).
      kv: optional `(keys, values)` cache of this layer, `[b, s, kv, hd]`.
      index: int32 `[b]` write position in `kv`.

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

  def __call__(self, x, positions, allowed, kv=None, index=None):
    h, new_kv = self.attn(self.attn_norm(x), positions, allowed, kv, index)
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


# ------------------------------------------------------------ Model glue
def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_ids(config: LlamaConfig, ids, what='input'):
  check_length(ids.shape[-1], config.max_position_embeddings, f'the {what}')
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)


def _llama_logits(config: LlamaConfig, dtype, params, ids, mask=None):
  _check_ids(config, ids)
  return Llama(config, dtype=dtype).apply({'params': params}, ids, mask)


def _llama_hidden(config: LlamaConfig, dtype, params, ids, mask=None):
  _check_ids(config, ids)
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, mask, method=Llama.hidden_states
  )


def _llama_head(config: LlamaConfig, dtype, params, hidden):
  return Llama(config, dtype=dtype).apply(
    {'params': params}, hidden, method=Llama.head
  )


def _llama_init_cache(
  config: LlamaConfig, dtype, params, batch_size: int, max_length: int
) -> LlamaCache:
  del params
  check_length(max_length, config.max_position_embeddings, 'the decoding cache')
  shape = (
    batch_size,
    max_length,
    config.num_key_value_heads,
    config.head_dim,
  )
  empty = tuple(
    jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers)
  )
  return LlamaCache(
    keys=empty, values=empty, index=jnp.zeros((batch_size,), jnp.int32)
  )


def _llama_decode(config: LlamaConfig, dtype, params, cache: LlamaCache, ids):
  max_len = cache.keys[0].shape[1]
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)
  # Under jit the index is unknown; writes past the end are then clamped.
  start = (
    int(np.max(np.asarray(cache.index))) if _is_concrete(cache.index) else 0
  )
  if start + ids.shape[1] > max_len:
    raise LeakjaxError(
      f'the decoding cache holds {max_len} tokens; appending'
      f' {ids.shape[1]} at position {start} overflows it',
      'make a longer cache with init_cache(params, batch_size, max_length)',
    )
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, cache, method=Llama.decode
  )


def _check_block(config: LlamaConfig, layer: int):
  if not 0 <= layer < config.num_hidden_layers:
    raise LeakjaxError(
      f'block {layer} does not exist; the model has'
      f' {config.num_hidden_layers} blocks',
      f'pass 0 <= layer < {config.num_hidden_layers}',
    )


def _llama_block_inputs(config: LlamaConfig, dtype, params, ids, mask, layer):
  _check_ids(config, ids)
  _check_block(config, layer)
  stream = Llama(config, dtype=dtype).apply(
    {'params': params}, ids, mask, layer, method=Llama.hidden_states
  )[-1]
  scale = params[f'layers_{layer}']['attn_norm']['scale']
  return _norm(config, stream, scale)


def _llama_block_cache(
  config: LlamaConfig, dtype, params, batch_size, max_length, layer
):
  _check_block(config, layer)
  full = _llama_init_cache(config, dtype, params, batch_size, max_length)
  return LlamaCache(
    keys=full.keys[:layer], values=full.values[:layer], index=full.index
  )


def _llama_block_decode(config: LlamaConfig, dtype, params, cache, ids, layer):
  _check_block(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this block cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_block_cache(..., layer=layer)',
    )
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)
  if layer == 0:  # no block runs: the embeddings, normalised
    x = Llama(config, dtype=dtype).apply(
      {'params': params}, ids, method=Llama.embed_ids
    )
    new = cache.replace(index=cache.index + ids.shape[1])
  else:
    x, new = Llama(config, dtype=dtype).apply(
      {'params': params}, ids, cache, method=Llama.decode_stream
    )
  scale = params[f'layers_{layer}']['attn_norm']['scale']
  return _norm(config, x, scale), new


def _llama_first_layer(config: LlamaConfig, params) -> FirstLayerInputs:
  tokens = params['embed']['embedding']
  if config.embedding_scale:
    tokens = tokens * jnp.asarray(config.hidden_size**0.5, tokens.dtype)
  scale = params['layers_0']['attn_norm']['scale']
  if config.norm_offset:
    scale = config.norm_offset + scale.astype(jnp.float32)
  return FirstLayerInputs(
    tokens=tokens,
    positions=None,
    scale=scale,
    bias=None,
    eps=config.rms_norm_eps,
    kind='rms',
  )


def make_model(
  config: LlamaConfig, tokenizer=None, *, dtype=jnp.float32
) -> Model:
  """Llama of `config` as a :class:`Model` (no weights).

  Args:
    config: the architecture.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer` or None.
    dtype: the compute dtype, which must be the dtype of the params'
      embedding matrix; logits are float32.

  Returns:
    A Model with family 'llama'; equal configs and dtypes give equal models.
  """
  dtype = jnp.dtype(dtype)
  paths = ParamPaths(
    word_embeddings=('embed', 'embedding'),
    lm_head=None if config.tie_word_embeddings else ('lm_head', 'kernel'),
    attention_inputs=tuple(
      tuple(
        (f'layers_{i}', 'attn', n, 'kernel')
        for n in ('q_proj', 'k_proj', 'v_proj')
      )
      for i in range(min(4, config.num_hidden_layers))
    ),
    last_layers=((f'layers_{config.num_hidden_layers - 1}',), ('final_norm',)),
  )
  static = (config, dtype)
  return Model(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_layers=config.num_layers,
    max_length=config.max_position_embeddings,
    tie_word_embeddings=config.tie_word_embeddings,
    family=FAMILY,
    config=config,
    tokenizer=tokenizer,
    paths=paths,
    logits_fn=Bound(_llama_logits, static),
    hidden_fn=Bound(_llama_hidden, static),
    head_fn=Bound(_llama_head, static),
    init_cache_fn=Bound(_llama_init_cache, static),
    decode_fn=Bound(_llama_decode, static),
    first_layer_fn=Bound(_llama_first_layer, (config,)),
    block_input_fn=Bound(_llama_block_inputs, static),
    block_cache_fn=Bound(_llama_block_cache, static),
    block_decode_fn=Bound(_llama_block_decode, static),
  )


def abstract_params(config: LlamaConfig, dtype=jnp.float32):
  """Shapes/dtypes of the params, via `jax.eval_shape` (no compute)."""
  module = Llama(config, dtype=dtype)
  ids = jnp.zeros((1, 1), jnp.int32)
  return jax.eval_shape(
    lambda k: module.init(k, ids)['params'], jax.random.key(0)
  )


def init_model(
  config: LlamaConfig, *, key, tokenizer=None, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """A randomly initialised model (normal(0.02) weights, unit norms).

  Returns:
    `(model, params)`.
  """
  module = Llama(config, dtype=dtype)
  # One compiled init instead of one eager op per parameter.
  init = jax.jit(lambda k: module.init(k, jnp.zeros((1, 1), jnp.int32)))
  return make_model(config, tokenizer, dtype=dtype), init(key)['params']


def from_params(config: LlamaConfig, params, tokenizer=None):
  """`(model, params)` for Llama weights of any dtype (the embedding's)."""
  params = jax.tree.map(jnp.asarray, params)
  dtype = params['embed']['embedding'].dtype
  return make_model(config, tokenizer, dtype=dtype), params


# ----------------------------------------------------------- HF weights
_BIASED = {
  'none': (),
  'qkv': ('q_proj', 'k_proj', 'v_proj'),
  'qkvo': ('q_proj', 'k_proj', 'v_proj', 'o_proj'),
}


def hf_name_map(config: LlamaConfig) -> dict[str, TensorSpec]:
  """HF tensor name -> our param path, one entry per parameter."""
  t = hf_checkpoint.transpose()
  specs = {
    'model.embed_tokens.weight': TensorSpec(('embed', 'embedding')),
    'model.norm.weight': TensorSpec(('final_norm', 'scale')),
  }
  for i in range(config.num_hidden_layers):
    hf, ours = f'model.layers.{i}', f'layers_{i}'
    specs[f'{hf}.input_layernorm.weight'] = TensorSpec(
      (ours, 'attn_norm', 'scale')
    )
    specs[f'{hf}.post_attention_layernorm.weight'] = TensorSpec(
      (ours, 'mlp_norm', 'scale')
    )
    for proj in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
      specs[f'{hf}.self_attn.{proj}.weight'] = TensorSpec(
        (ours, 'attn', proj, 'kernel'), **t
      )
      if proj in _BIASED[config.attention_bias]:
        specs[f'{hf}.self_attn.{proj}.bias'] = TensorSpec(
          (ours, 'attn', proj, 'bias')
        )
    for proj in ('gate_proj', 'up_proj', 'down_proj'):
      specs[f'{hf}.mlp.{proj}.weight'] = TensorSpec(
        (ours, 'mlp', proj, 'kernel'), **t
      )
  if not config.tie_word_embeddings:
    specs['lm_head.weight'] = TensorSpec(('lm_head', 'kernel'), **t)
  return specs


# Buffers some exports include and we recompute.
_IGNORED_HF = (
  r'model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq',
  r'model\.rotary_emb\.inv_freq',
)


def params_from_hf_tensors(
  tensors: Mapping[str, np.ndarray],
  config: LlamaConfig,
  *,
  dtype=jnp.float32,
  source: str = 'checkpoint',
):
  """HF-named tensors -> our params, checking names and shapes."""
  ignore = list(_IGNORED_HF)
  if config.tie_word_embeddings:
    ignore.append(r'lm_head\.weight')  # a copy of the embeddings, if saved
  return hf_checkpoint.params_from_hf(
    tensors,
    hf_name_map(config),
    abstract_params(config),
    ignore=ignore,
    source=source,
    dtype=dtype,
  )


def from_hf_directory(
  path: str | os.PathLike, config_dict: Mapping[str, Any], *, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """Loads an HF Llama checkpoint directory (+ `tokenizer.json` if present).

  Args:
    path: folder with `config.json` and `model.safetensors` (or shards).
    config_dict: the parsed `config.json`.
    dtype: parameter dtype.

  Returns:
    `(model, params)`, the model of family 'llama'.
  """
  from leakjax import tokenization  # pylint: disable=g-import-not-at-top

  path = Path(path)
  config = LlamaConfig.from_hf_dict(config_dict)
  params = params_from_hf_tensors(
    hf_checkpoint.read_tensors(path), config, dtype=dtype, source=str(path)
  )
  tokenizer = None
  if (path / 'tokenizer.json').is_file():
    tokenizer = tokenization.tokenizer_from_file(path / 'tokenizer.json')
    if tokenizer.bos_id is None:
      tokenizer.bos_id = config.bos_token_id
    if tokenizer.eos_id is None:
      tokenizer.eos_id = config.eos_token_id
    tokenization.check_vocab(tokenizer, config.vocab_size, str(path))
  return from_params(config, params, tokenizer)


def to_hf_directory(
  model: Model, params: PyTree, directory: str | os.PathLike
) -> None:
  """Writes `model` with `params` so that transformers' `LlamaForCausalLM` loads it.

  Writes `config.json`, `model.safetensors` and, when the model has a
  subword tokenizer, `tokenizer.json` + `tokenizer_config.json`.
  """
  from leakjax.io import as_path, atomic_write_text  # pylint: disable=g-import-not-at-top

  require_family(model, FAMILY)
  directory = as_path(directory)
  config: LlamaConfig = model.config
  tensors = hf_checkpoint.params_to_hf(params, hf_name_map(config))
  hf_config = config.to_hf_dict()
  tok = model.tokenizer
  backend = getattr(tok, 'backend', None)
  if tok is not None and getattr(tok, 'pad_id', None) is not None:
    hf_config['pad_token_id'] = tok.pad_id
  hf_checkpoint.write_checkpoint(directory, tensors, hf_config)
  if backend is None:
    return
  atomic_write_text(directory / 'tokenizer.json', backend.to_str())
  special = {}
  for key in ('bos', 'eos', 'pad', 'unk'):
    i = getattr(tok, f'{key}_id', None)
    if i is not None:
      special[f'{key}_token'] = tok.id_to_token(i)
  atomic_write_text(
    directory / 'tokenizer_config.json',
    json.dumps(
      {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        'model_max_length': config.max_position_embeddings,
        **special,
      },
      indent=2,
    ),
  )


__all__ = [
  'LlamaConfig',
  'LlamaCache',
  'Llama',
  'init_model',
  'make_model',
  'from_params',
  'hf_name_map',
  'from_hf_directory',
  'to_hf_directory',
  'params_from_hf_tensors',
  'abstract_params',
]
