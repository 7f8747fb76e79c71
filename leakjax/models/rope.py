"""Rotary position embeddings (Su et al. 2021), HF `rotate_half` layout.

With the scalings Llama checkpoints use: linear, Llama 3.1's and
per-frequency factors (llama.cpp's `rope_freqs`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from leakjax.models._llama_config import LlamaConfig


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
