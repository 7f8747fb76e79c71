"""The span of an attention projection's gradient, and distances to it.

For a linear layer `y = x W` applied to the rows `x_t` of a batch, the
gradient is `∂L/∂W = Σ_t x_tᵀ δ_t = Xᵀ Δ` (`[d, out]`): its column space is
spanned by the inputs `x_t` whose output gradient `δ_t` is non-zero, so it
has rank at most the number of such inputs. When that number is below the
width `d`, a candidate row `x` was an input iff it lies in the column space
(Petrov et al., "DAGER: Exact Gradient Inversion for Large Language
Models", NeurIPS 2024, arXiv 2405.15586).

The rank is read off the spectrum with a rule that needs no ground truth:
the largest drop of the log singular values, valid only when that drop is
at least `min_gap_decades` decades and the rank stays below
`max_rank_fraction · d` (past it every vector is close to the span, the
rank limit). DAGER's code takes a fixed numerical tolerance per batch size
(its README); a gap adapts to the batch and to the float precision.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Span:
  """The column space of a gradient, as the projector onto its complement.

  Attributes:
    basis: float32 `[d, k]`, orthonormal columns; those past `rank` are zero.
    rank: int32 `[]`, the dimension read off the spectrum (when not
      `valid`: the number of singular values above `max_tail` of the
      largest).
    valid: bool `[]`, whether the spectrum has a clear gap below the rank
      limit (False: the span test cannot separate inputs from non-inputs).
    log_gap: float32 `[]`, the drop (decades) of the spectrum at `rank`.
  """

  basis: Float[Array, 'd k']
  rank: Int[Array, '']
  valid: Bool[Array, '']
  log_gap: Float[Array, '']


def span_of(
  grad: Float[Array, 'd out'],
  *,
  min_gap_decades: float = 1.0,
  max_rank_fraction: float = 0.9,
  max_tail: float | None = 1e-4,
  accurate: bool = True,
) -> Span:
  """The column space of `grad` with its rank read off the spectrum.

  Args:
    grad: `∂L/∂W` of a projection `x W`, `[d, out]` (several projections
      that read the same `x`, e.g. q/k/v, side by side along `out`).
    min_gap_decades: the spectrum must drop by at least this many decades
      at the rank, else the span is not `valid`.
    max_tail: only drops *to* a singular value below this fraction of the
      largest, at ranks up to the limit, count (None: any drop, any rank). A float32 gradient's zero directions
      sit at ~1e-7 of the largest; its top singular values often fall by
      almost a decade (a few tokens with large output gradients, e.g. BOS),
      which is never the rank.
    max_rank_fraction: not `valid` when the rank exceeds this fraction of
      `d` (DAGER's rank cutoff: its code stops 20 below d = 768).
    accurate: use the QR-iteration SVD (LAPACK gesvd), whose small singular
      values are accurate to float32 round-off; the default
      divide-and-conquer one raises the floor of a float32 gradient's
      spectrum from ~1e-8 to ~5e-8 of the largest, which hides gaps of
      batches near the rank limit (measured on SmolLM2, b = 16).

  Returns:
    A :class:`Span`.
  """
  g = grad.astype(jnp.float32)
  algorithm = (
    jax.lax.linalg.SvdAlgorithm.QR
    if accurate
    else jax.lax.linalg.SvdAlgorithm.DEFAULT
  )
  u, s, _ = jax.lax.linalg.svd(g, full_matrices=False, algorithm=algorithm)
  d = g.shape[0]
  logs = jnp.log10(s / s[0] + 1e-30)
  gaps = logs[:-1] - logs[1:]
  if max_tail is not None:
    # Only drops to the noise floor, at ranks below the limit.
    admissible = (logs[1:] < jnp.log10(max_tail)) & (
      jnp.arange(1, logs.shape[0]) <= max_rank_fraction * d
    )
    gaps = jnp.where(admissible, gaps, -jnp.inf)
  rank = jnp.argmax(gaps) + 1
  gap = gaps[rank - 1]
  valid = (gap >= min_gap_decades) & (rank <= max_rank_fraction * d)
  keep = jnp.arange(u.shape[1]) < rank
  if max_tail is not None:
    # Without a valid drop, report the numerical rank (for diagnostics).
    rank = jnp.where(valid, rank, (logs >= jnp.log10(max_tail)).sum())
  return Span(
    basis=u * keep[None, :],
    rank=rank.astype(jnp.int32),
    valid=valid,
    log_gap=gap,
  )


def residuals(span: Span, x: Float[Array, '... d']) -> Float[Array, '...']:
  """Relative distance `‖x − QQᵀx‖ / ‖x‖` of each row `x` to the span."""
  x = x.astype(jnp.float32)
  res = x - (x @ span.basis) @ span.basis.T
  return jnp.linalg.norm(res, axis=-1) / (jnp.linalg.norm(x, axis=-1) + 1e-30)


__all__ = ['Span', 'residuals', 'span_of']
