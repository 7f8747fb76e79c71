"""Attention of many alternative next tokens after one cached prefix.

The exact inversion of hidden states (:mod:`leakjax.attacks.inversion.exact`)
puts C candidate tokens at the same position after the same verified
prefix. Each candidate attends to the prefix's keys/values and to its own;
none attends to another. Copying the one-row cache C times (the generic
:meth:`leakjax.models.Model.stream_candidates`) costs C cache copies per
block; here the prefix is read once, in place, and the two parts of the
softmax are joined by their running maximum.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from leakjax.errors import LeakjaxError


def attend_shared_prefix(
  q: Float[Array, 'c kv g hd'],
  k: Float[Array, 'c kv hd'],
  v: Float[Array, 'c kv hd'],
  keys: Float[Array, 's kv hd'],
  values: Float[Array, 's kv hd'],
  length: Int[Array, ''],
  scale: float,
) -> Float[Array, 'c kv g hd']:
  """Softmax attention of C one-token queries over a shared prefix + self.

  Args:
    q: each candidate's queries, grouped by the key/value head they read
      (`g` query heads per key/value head; 1 without grouped queries).
    k, v: each candidate's own key and value.
    keys, values: the prefix's cache of one row; slots `>= length` are
      stale and never attended to.
    length: the number of prefix tokens.
    scale: the score scale (`head_dim ** -0.5`, or a family's own).

  Returns:
    The attention output per query head, in `v`'s dtype.
  """
  f32 = jnp.float32
  prefix = jnp.einsum('ckgd,skd->ckgs', q, keys, preferred_element_type=f32)
  prefix = jnp.where(
    jnp.arange(keys.shape[0]) < length, prefix * scale, jnp.finfo(f32).min
  )
  own = jnp.einsum('ckgd,ckd->ckg', q, k, preferred_element_type=f32) * scale
  top = jnp.maximum(prefix.max(-1), own)
  w_prefix = jnp.exp(prefix - top[..., None])
  w_own = jnp.exp(own - top)
  total = w_prefix.sum(-1) + w_own
  out = jnp.einsum(
    'ckgs,skd->ckgd',
    w_prefix.astype(values.dtype),
    values,
    preferred_element_type=f32,
  )
  out = out + w_own[..., None] * v[:, :, None].astype(f32)
  return (out / total[..., None]).astype(v.dtype)


def one_row(cache_index: jax.Array) -> None:
  """Raises unless a cache index `[b]` holds exactly one row."""
  if cache_index.shape != (1,):
    raise LeakjaxError(
      f'stream_candidates needs a cache of one row, got {cache_index.shape[0]}',
      'decode the prefix into a cache made with batch_size=1',
    )


__all__ = ['attend_shared_prefix', 'one_row']
