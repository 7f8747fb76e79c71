"""The DCT/overlap defense of Wan et al. 2024 (Sec. 5.3.1, Table 6).

The user transforms the hidden states of layer i before sending them:
`E_trans = IDCT(DCT(E) O_s)` with an orthonormal DCT-II over the feature
axis and a random overlap matrix `O_s` (:func:`make_dct_defense`,
:func:`apply_dct_defense`). :func:`defended_nll` is the perplexity cost:
the target model run with the transform at layer i (Table 6,
"PPL(origin/defense)").
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from leakjax.attacks.inversion.bei_hei import (
  Layer,
  logits_with_transform,
  sequence_nll,
)
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model


def dct_matrix(n: int, dtype=jnp.float32) -> Float[Array, 'n n']:
  """The orthonormal DCT-II matrix C `[n, n]`: `DCT(x) = C x`, `IDCT = C^T`.

  `C[k, m] = a_k cos(pi (2m + 1) k / (2n))`, `a_0 = sqrt(1/n)`,
  `a_k = sqrt(2/n)`; equals `scipy.fft.dct(np.eye(n), norm='ortho', axis=0)`.
  """
  k = np.arange(n)[:, None]
  m = np.arange(n)[None, :]
  c = np.cos(np.pi * (2 * m + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
  c[0] /= math.sqrt(2.0)
  return jnp.asarray(c, dtype)


def dct(x: Float[Array, '*batch n']) -> Float[Array, '*batch n']:
  """Orthonormal DCT-II over the last axis."""
  c = dct_matrix(x.shape[-1], jnp.float32)
  return jnp.einsum('...m,km->...k', x.astype(jnp.float32), c)


def idct(y: Float[Array, '*batch n']) -> Float[Array, '*batch n']:
  """Inverse of :func:`dct` (orthonormal DCT-III) over the last axis."""
  c = dct_matrix(y.shape[-1], jnp.float32)
  return jnp.einsum('...k,km->...m', y.astype(jnp.float32), c)


def overlap_matrix(subset: Sequence[int], dim: int) -> np.ndarray:
  """`O_i` of Sec. 5.3.1 for one subset `v_i` of the feature indices.

  `M[v_j, v_j] = M[v_j, v_{j+1}] = 1` for every j but the last, `O = M^T`.
  So for a row vector f, `(f O)[v_j] = f[v_j] + f[v_{j+1}]` (j < last) and
  every other entry is 0: the frequencies of the subset survive, each
  overlapped with its successor, all others are dropped.
  """
  m = np.zeros((dim, dim), np.float32)
  v = np.asarray(subset, np.int64)
  m[v[:-1], v[:-1]] = 1.0
  m[v[:-1], v[1:]] = 1.0
  return m.T


@flax.struct.dataclass
class DCTDefense:
  """A drawn DCT/overlap defense (Sec. 5.3.1), saved for repeatability.

  Attributes:
    permutation: int32 `[D]`, the random permutation of the feature indices.
    overlaps: float32 `[num_subsets, D, D]`, binary `O_i` for each subset.
    selected: index s of the overlap matrix that is applied.
  """

  permutation: jax.Array
  overlaps: jax.Array
  selected: int = flax.struct.field(pytree_node=False)

  @property
  def overlap(self) -> jax.Array:
    """The applied `O_s`, `[D, D]`."""
    return self.overlaps[self.selected]

  @property
  def matrix(self) -> jax.Array:
    """The whole transform as one matrix A `[D, D]`: `E_trans = E A`.

    `A = C^T O_s C` with C the DCT matrix (rows are embeddings).
    """
    c = dct_matrix(self.overlaps.shape[-1])
    return c.T @ self.overlap @ c


def make_dct_defense(dim: int, num_subsets: int, *, key) -> DCTDefense:
  """Draws the permutation, its `num_subsets` overlap matrices and `s`.

  Args:
    dim: the hidden size d.
    num_subsets: k, the number of (near-equal) parts of the permutation.
    key: a `jax.random.key`.
  """
  if not 1 <= num_subsets <= dim // 2:
    raise LeakjaxError(
      f'num_subsets={num_subsets} must be in 1..{dim // 2} for d={dim}',
      'pick fewer subsets',
    )
  perm_key, select_key = jax.random.split(key)
  perm = np.asarray(jax.random.permutation(perm_key, dim))
  # Step (1) of Sec. 5.3.1 takes "the non-zero indices" of each subset, i.e.
  # its indices in increasing order; the permutation decides membership.
  subsets = [np.sort(v) for v in np.array_split(perm, num_subsets)]
  overlaps = np.stack([overlap_matrix(v, dim) for v in subsets])
  selected = int(jax.random.randint(select_key, (), 0, num_subsets))
  return DCTDefense(
    permutation=jnp.asarray(perm, jnp.int32),
    overlaps=jnp.asarray(overlaps),
    selected=selected,
  )


def apply_dct_defense(
  hidden: Float[Array, '*batch D'], overlap: Float[Array, 'D D']
) -> Float[Array, '*batch D']:
  """`E_trans = IDCT(DCT(E) O_s)` over the feature axis (Sec. 5.3.1).

  The paper writes `IDCT(DCT(E^T) O_s)^T` for `E [n, d]`; the transposes
  only say that the transform runs along d, one embedding at a time.

  Args:
    hidden: `[..., D]` embeddings or hidden states.
    overlap: `O_s`, `[D, D]`.

  Returns:
    `[..., D]` in the dtype of `hidden`.
  """
  freq = dct(hidden)  # [..., D]
  return idct(freq @ overlap.astype(jnp.float32)).astype(hidden.dtype)


def defended_nll(
  model: Model,
  params,
  ids,
  mask,
  *,
  layer: Layer | None,
  overlap: jax.Array | None,
) -> tuple[jax.Array, jax.Array]:
  """`sequence_nll` of the model with the DCT defense at `layer`.

  `layer=None` or `overlap=None` is the undefended model.
  """
  if layer is None or overlap is None:
    logits = model.logits(params, ids, mask)
  else:
    logits = logits_with_transform(
      model,
      params,
      ids,
      mask,
      layer=layer,
      transform=functools.partial(apply_dct_defense, overlap=overlap),
    )
  return sequence_nll(logits, ids, mask)


__all__ = [
  'dct_matrix',
  'dct',
  'idct',
  'overlap_matrix',
  'DCTDefense',
  'make_dct_defense',
  'apply_dct_defense',
  'defended_nll',
]
