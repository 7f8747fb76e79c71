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

:func:`span_residuals` measures every vocabulary token's first-layer input
(RMSNorm(w_v), or LN(w_v + p_t) at every position t) against the span of
the first block's input projections. Two attacks use it: the tied-embedding
bag of words (:mod:`leakjax.recovery.bag`, test 1) and DAGER's layer-1
token filter (:func:`leakjax.attacks.dager.token_filter`), so it lives here,
in neither paper's package.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model

PyTree = Any


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
    accurate: small singular values resolved down to ~1.5e-8 of the
      largest (:func:`accurate_spectrum`); False: the default
      divide-and-conquer SVD, whose raised floor of a float32 gradient's
      spectrum can hide the gaps of batches near the rank limit.

  Returns:
    A :class:`Span`.
  """
  g = grad.astype(jnp.float32)
  if accurate:
    u, s = accurate_spectrum(g)
  else:
    u, s, _ = jax.lax.linalg.svd(g, full_matrices=False)
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


def _x64():
  """Float64 inside a trace (`jax.enable_x64`; older JAX: experimental)."""
  ctx = getattr(jax, 'enable_x64', None)
  if ctx is None:  # jax < 0.5
    from jax.experimental import enable_x64  # pylint: disable=g-import-not-at-top

    return enable_x64()
  return ctx(True)


def _gram_spectrum(g):
  with _x64():
    g64 = g.astype(jnp.float64)
    lam, v = jnp.linalg.eigh(g64 @ g64.T)
    lam, v = lam[::-1], v[:, ::-1]
    # What float64 cannot tell from zero: sqrt(eps) of the largest.
    floor = jnp.finfo(jnp.float64).eps * lam[0]
    s = jnp.sqrt(jnp.maximum(lam, floor))
    k = min(g.shape)
    return v[:, :k].astype(jnp.float32), s[:k].astype(jnp.float32)


def _qr_spectrum(g):
  u, s, _ = jax.lax.linalg.svd(
    g, full_matrices=False, algorithm=jax.lax.linalg.SvdAlgorithm.QR
  )
  return u, s


def accurate_spectrum(
  g: Float[Array, 'd out'],
) -> tuple[Float[Array, 'd k'], Float[Array, ' k']]:
  """Left singular vectors and singular values of `g` (descending,
  `k = min(d, out)`), the small ones resolved down to ~1.5e-8 of the
  largest.

  On CPU and GPU: the eigendecomposition of the Gram matrix `g gᵀ`
  (`[d, d]`) in float64, where `g`'s float32 entries are exact. Its
  eigenvalues are accurate to float64 round-off of the largest, so
  singular values are resolved down to `sqrt(eps₆₄) ≈ 1.5e-8` of the
  largest and clamped there (below, float64 cannot tell them from zero),
  about where a float32 SVD's own round-off floors the spectrum. It is
  faster than a QR-iteration SVD of `g` (DAGER's filter stage, two of
  them, in `benchmarks/results/dager_vs_reference*.json`).
  Elsewhere (TPUs have no float64): the float32 QR-iteration SVD.
  """
  return jax.lax.platform_dependent(
    g,
    cpu=_gram_spectrum,
    cuda=_gram_spectrum,
    rocm=_gram_spectrum,
    default=_qr_spectrum,
  )


def residuals(span: Span, x: Float[Array, '... d']) -> Float[Array, '...']:
  """Relative distance `‖x − QQᵀx‖ / ‖x‖` of each row `x` to the span."""
  return _relative_residuals(span.basis, x)


# Rows of the vocabulary tested per tile (`input_span_residuals`).
ROW_TILE = 2048


def _relative_residuals(q, x):
  x = x.astype(jnp.float32)
  res = x - project(x, q)
  return jnp.linalg.norm(res, axis=-1) / (jnp.linalg.norm(x, axis=-1) + 1e-30)


def _span_basis(
  first_layer_grad: Float[Array, 'd out'],
  min_gap_decades: float,
  max_rank_fraction: float,
):
  """Orthonormal basis of the column space, its rank, and whether valid.

  The rule the tied bag of words was measured with (any drop, the default
  SVD); DAGER's span tests pass a :class:`Span` with the stricter defaults
  of :func:`span_of` instead.
  """
  span = span_of(
    first_layer_grad,
    min_gap_decades=min_gap_decades,
    max_rank_fraction=max_rank_fraction,
    max_tail=None,
    accurate=False,
  )
  return span.basis, span.rank, span.valid


def _basis(grad, min_gap_decades, max_rank_fraction, span):
  if span is not None:
    return span.basis, span.rank, span.valid
  return _span_basis(grad, min_gap_decades, max_rank_fraction)


def input_span_residuals(
  first_layer_grad: Float[Array, 'd out'],
  inputs: Float[Array, 'V d'],
  *,
  min_gap_decades: float = 1.0,
  max_rank_fraction: float = 0.9,
  span: Span | None = None,
) -> tuple[Float[Array, ' V'], Int[Array, ''], Bool[Array, '']]:
  """Relative distance of each normalised input embedding to the input span.

  Args:
    first_layer_grad: gradient of the first layer's input projection,
      `[d, out]` (e.g. Llama's q/k/v kernels of layer 0 side by side).
    inputs: what that layer sees for each token, `[V, d]` (Llama:
      RMSNorm(w_v)).
    min_gap_decades: the spectrum must drop by this many decades at the
      rank (an exact rank deficiency); else the test is invalid.
    max_rank_fraction: invalid if the rank exceeds this fraction of d.
    span: a precomputed span of `first_layer_grad` (then the two
      thresholds above are not used).

  Returns:
    `(residual [V], rank, valid)`: ‖(I − QQᵀ)x̂_v‖ / ‖x̂_v‖.
  """
  q, rank, valid = _basis(
    first_layer_grad, min_gap_decades, max_rank_fraction, span
  )
  # Row tiles: each tile's projection stays in cache (one read of `inputs`).
  rel = jax.lax.map(
    lambda x: _relative_residuals(q, x), inputs, batch_size=ROW_TILE
  )
  return rel, rank, valid


def project(
  x: Float[Array, '... d'], basis: Float[Array, 'd k'], block: int = 64
) -> Float[Array, '... d']:
  """`x Q Qᵀ`, reading only `basis`'s columns up to its last non-zero one.

  A span's basis keeps `k = min(d, out)` columns, those past the rank zero
  (:class:`Span`); the product runs over blocks of `block` columns up to
  the last non-zero one (a `lax.while_loop`), so testing the whole
  vocabulary costs what the rank needs, not what `k` does.
  """
  d, k = basis.shape
  num_blocks = -(-k // block)
  blocks = jnp.pad(basis, ((0, 0), (0, num_blocks * block - k)))
  blocks = blocks.reshape(d, num_blocks, block).transpose(1, 0, 2)
  used = jnp.max(jnp.where(jnp.any(basis != 0, 0), jnp.arange(1, k + 1), 0))

  def body(j, acc):
    q = blocks[j]
    return acc + (x @ q) @ q.T

  return jax.lax.fori_loop(
    0, (used + block - 1) // block, body, jnp.zeros_like(x)
  )


def layer_norm_span_residuals(
  first_layer_grad: Float[Array, 'd out'],
  embeddings: Float[Array, 'V d'],
  positions: Float[Array, 'P d'],
  scale: Float[Array, ' d'],
  bias: Float[Array, ' d'],
  eps: float,
  *,
  min_gap_decades: float = 1.0,
  max_rank_fraction: float = 0.9,
  num_positions: Int[Array, ''] | None = None,
  span: Span | None = None,
) -> tuple[Float[Array, ' V'], Int[Array, ''], Bool[Array, '']]:
  """:func:`input_span_residuals` for GPT-2: inputs LN(w_v + p_t) per position.

  Each token is tested at every position t < P (t < `num_positions` if
  given, a possibly traced bound) and keeps its smallest relative
  residual. The V·P residuals come from inner products (no
  `[V, P, d]` tensor): with c = centred vectors, R = I − QQᵀ,
  A_v = R(γ⊙c_v), B_t = R(γ⊙c_t), C = Rβ and s_vt the LN std,
  R·LN(w_v + p_t) = (A_v + B_t)/s_vt + C.

  Returns:
    `(residual [V], rank, valid)`.
  """
  q, rank, valid = _basis(
    first_layer_grad, min_gap_decades, max_rank_fraction, span
  )
  d = embeddings.shape[-1]

  def proj(x):  # R x
    return x - project(x, q)

  cv = embeddings.astype(jnp.float32)
  cv = cv - cv.mean(-1, keepdims=True)
  ct = positions.astype(jnp.float32)
  ct = ct - ct.mean(-1, keepdims=True)
  gv, gt = cv * scale, ct * scale
  a, b, c = proj(gv), proj(gt), proj(bias[None].astype(jnp.float32))[0]
  # [V, P] inner products
  s2 = (
    (cv * cv).sum(-1)[:, None] + 2 * cv @ ct.T + (ct * ct).sum(-1)[None, :]
  ) / d + eps
  s = jnp.sqrt(s2)
  res2 = (
    ((a * a).sum(-1)[:, None] + 2 * a @ b.T + (b * b).sum(-1)[None]) / s2
    + 2 * ((a @ c)[:, None] + (b @ c)[None]) / s
    + c @ c
  )
  full2 = (
    ((gv * gv).sum(-1)[:, None] + 2 * gv @ gt.T + (gt * gt).sum(-1)[None]) / s2
    + 2 * ((gv @ bias)[:, None] + (gt @ bias)[None]) / s
    + bias @ bias
  )
  rel = jnp.sqrt(jnp.maximum(res2, 0.0) / (full2 + 1e-30))
  if num_positions is not None:
    rel = jnp.where(jnp.arange(rel.shape[1]) < num_positions, rel, jnp.inf)
  return rel.min(-1), rank, valid


# ------------------------------------------------------ model-level entry
def first_layer_input_grad(model: Model, grads: PyTree) -> jax.Array | None:
  """Gradient of the first block's input projection `[d, out]`, or None.

  The gradients of the kernels the model declares at
  `model.paths.attention_inputs[0]`, side by side along axis 1 (Llama: the
  q/k/v kernels of layer 0; GPT-2: h_0's fused c_attn; any declared layout,
  see :meth:`leakjax.models.Model.attention_input_kernels`). None when the
  model declares none.
  """
  return model.attention_input_kernels(grads, 0)


def span_residuals(
  model: Model,
  params: PyTree,
  grads: PyTree,
  max_positions: int | None = None,
  *,
  num_positions: Int[Array, ''] | None = None,
  span: Span | None = None,
):
  """Each token's distance to the span of the model's first layer.

  Test 1 of :func:`leakjax.recovery.bag.tied_bag` and DAGER's
  layer-1 token filter (:func:`leakjax.attacks.dager.token_filter`).

  Reads :func:`first_layer_input_grad` and `model.first_layer_inputs`:
  an RMSNorm without position embeddings (Llama) tests RMSNorm(w_v)·γ
  (:func:`input_span_residuals`); a LayerNorm with learned positions
  (GPT-2) tests LN(w_v + p_t) at every position t
  (:func:`layer_norm_span_residuals`).

  Args:
    model: the attacked model.
    params: θ^t.
    grads: the observed gradient.
    max_positions: test positions `t < max_positions` only (a static
      int, e.g. the longest sentence read off the position gradient);
      None: all positions.
    num_positions: the same bound as a (traced) int32 scalar: positions
      at or past it are masked out instead of sliced off, so the shapes
      stay static under `jax.jit`.
    span: a precomputed span of the first layer's gradient (DAGER's rank
      rule); None: the tied bag's rule (any drop, :func:`_span_basis`).

  Returns:
    `(residual [V], rank, valid)`, or None when the model declares no
    first-layer attention inputs or no `first_layer_inputs`.

  Raises:
    LeakjaxError: the declared first-layer inputs are neither an RMSNorm
      without positions nor a LayerNorm with positions.
  """
  g1 = first_layer_input_grad(model, grads)
  if g1 is None:
    return None
  inputs = model.first_layer_inputs(params)
  if inputs is None:
    return None
  if inputs.kind == 'rms' and inputs.positions is None:
    w32 = inputs.tokens.astype(jnp.float32)
    x = (
      inputs.scale
      * w32
      * jax.lax.rsqrt(jnp.mean(w32 * w32, -1, keepdims=True) + inputs.eps)
    )
    return input_span_residuals(g1, x, span=span)
  if inputs.kind == 'layer' and inputs.positions is not None:
    pos = inputs.positions
    if max_positions is not None:
      pos = pos[:max_positions]
    bias = inputs.bias
    if bias is None:
      bias = jnp.zeros_like(inputs.scale)
    return layer_norm_span_residuals(
      g1,
      inputs.tokens,
      pos,
      inputs.scale,
      bias,
      inputs.eps,
      num_positions=num_positions,
      span=span,
    )
  raise LeakjaxError(
    f'the span test does not support first-layer inputs of kind'
    f' {inputs.kind!r} with'
    f' {"no" if inputs.positions is None else "learned"} position embeddings',
    "first_layer_inputs must be kind='rms' without positions or"
    " kind='layer' with positions; or use bag method 'norm' / 'nonzero'",
  )


__all__ = [
  'Span',
  'accurate_spectrum',
  'first_layer_input_grad',
  'input_span_residuals',
  'layer_norm_span_residuals',
  'project',
  'residuals',
  'span_of',
  'span_residuals',
]
