"""The head matrix's gradient as evidence (:class:`HeadScore`): the
candidates' rows of the observed gradient, one sentence's own rows, and
the mean and whitening of the head inputs under the model's own samples
(no data needed)."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from leakjax._jit import jitted
from leakjax.attacks.dager.hybrid._common import PyTree
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.attacks.dager.pipeline import head_path
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, get_path, set_path


@flax.struct.dataclass
class HeadScore:
  """The head gradient's evidence for each candidate as the next target.

  Under the mean next-token loss over N targets the head matrix's gradient
  has rows `N ∇W[v] = Σ_t p_t[v] h̃_t − Σ_{t: y_t = v} h̃_t` (h̃_t the head
  input at position t; for a tied head, plus the input embeddings'
  gradient at the positions holding v). The row of a token the batch
  predicts after a context points away from that context's head input,
  and the row of a token the LM favours there but the batch does not
  hold points towards it. Unlike a span test this needs no rank: each
  token has its own row. Head inputs share a large common component, so
  both sides are centred and whitened with the head inputs' mean and
  covariance under the model's own samples (:func:`head_statistics`; no
  data needed) and compared by cosine: `score(v | prefix) =
  cos(−W(∇W[v]), W(h̃ − μ))` with `W` the whitening. This is the
  per-position form of :func:`leakjax.attacks.dager.pipeline.
  last_token_scores` (our construction; no paper describes it).

  Attributes:
    readout: float32 `[V, d]`, logits -> head input (`h̃ = z @ readout`,
      least squares against the head matrix: exact for a linear head
      without bias).
    mean: float32 `[d]`, μ.
    whiten: float32 `[d, d]`, W (symmetric).
    rows: float32 `[C, d]`, the candidates' negated, centred, whitened
      head-gradient rows, each of unit norm.
    transformed: for :meth:`evidence` (else None): float32 `[C, d]`, the
      same rows before their norm is set, `R_v = r_v M` with `M`
      :func:`head_transform`.
    noise: for :meth:`evidence`: float32 `[C]`, `|R_v|² + m²`, `m` the
      median `|R_v|` over the real candidates.
    targets: for :meth:`evidence`: float32 `[]`, the batch's number of
      targets N (estimated: :func:`start_counts`).
  """

  readout: Float[Array, 'V d']
  mean: Float[Array, ' d']
  whiten: Float[Array, 'd d']
  rows: Float[Array, 'C d']
  transformed: Float[Array, 'C d'] | None = None
  noise: Float[Array, ' C'] | None = None
  targets: Float[Array, ''] | None = None

  def scores(self, head: Float[Array, 'K d']) -> Float[Array, 'K C']:
    """Cosine of each head input with each candidate's row."""
    h = (head - self.mean) @ self.whiten
    h = h / (jnp.linalg.norm(h, axis=-1, keepdims=True) + 1e-30)
    return h @ self.rows.T

  def evidence(
    self, head: Float[Array, 'K d'], prob: Float[Array, 'K C']
  ) -> Float[Array, 'K C']:
    """Each candidate's log-likelihood ratio as the target after each
    head input (`prob`: the LM's probabilities of the candidates there).

    If v followed the context `h̃` once, its row holds `(1 − p[v]) H / N`
    (`H = h̃ M`, the head input mapped as the rows are) beside its other
    contexts; if not, only the others. Model the row's coefficient along
    H, `a = ⟨R_v, H⟩ / |H|²`, as Gaussian with mean `μ = (1 − p[v]) / N`
    or 0 and variance `σ² = (|R_v|² + m²) / |H|²` (the rest of the row
    spread evenly; `m` keeps rare rows from claiming certainty): the
    ratio is `(a μ − μ² / 2) / σ²`. Unlike the cosine of :meth:`scores`
    it knows how large a true context's share is: a token that occurs
    once and whose row does not lie along H is strong evidence against
    it, a frequent token's row is weak evidence either way (our
    construction; no paper describes it). Given the true prefix,
    `0.6 log p + 12 cos + 30 ·` this ranks the true token first more often
    than without it (b = 64, batch 0: reports/dager/README.md,
    `reports/dager/head_ranks.json`, `lm+head+evidence,w=12.0,e=30.0`
    against `lm+head,s=0.1,w=12.0`).
    """
    h = head @ head_transform(self.mean, self.whiten)
    mu = (1.0 - prob) / self.targets
    along = h @ self.transformed.T  # [K, C]
    h2 = jnp.sum(h * h, axis=-1, keepdims=True)
    return (mu * along - 0.5 * mu**2 * h2) / self.noise[None]


def head_readout(model: Model, params: PyTree) -> Float[Array, 'V d']:
  """`[V, d]` with `logits @ readout` the head input (least squares
  against the head matrix, through its QR factors)."""
  w = get_path(params, head_path(model)).astype(jnp.float32)
  if model.paths.lm_head is not None:  # a Dense kernel [d, V]
    w = w.T
  q, r = jnp.linalg.qr(w)  # w = q r, so h̃ = r⁻¹ qᵀ z
  return jax.scipy.linalg.solve_triangular(r, q.T, lower=False).T


def head_transform(
  mean: Float[Array, ' d'], whiten: Float[Array, 'd d']
) -> Float[Array, 'd d']:
  """`(I − μ̂μ̂ᵀ) W`: a row `r` maps to `r @ M`, the centring and
  whitening of :class:`HeadScore` as one linear map (so sums of rows map
  to sums)."""
  unit = mean / jnp.linalg.norm(mean)
  return (jnp.eye(mean.shape[0]) - jnp.outer(unit, unit)) @ whiten


def model_head_transform(
  model: Model,
  params: PyTree,
  config: HybridConfig,
  key: jax.Array | None = None,
) -> Float[Array, 'd d']:
  """:func:`head_transform` from the head inputs of the model's own
  samples after BOS, drawn as :func:`recover` draws them (default key:
  `jax.random.key(0)`, as there)."""
  readout = head_readout(model, params)
  statistics = jitted(
    head_statistics, static_argnames=('model', 'num', 'length', 'shrinkage')
  )
  mean, whiten = statistics(
    model,
    params,
    readout,
    jnp.asarray(model.tokenizer.bos_id, jnp.int32),
    key=jax.random.key(0) if key is None else key,
    num=config.head_samples,
    length=config.head_sample_length,
    shrinkage=config.head_shrinkage,
  )
  return head_transform(mean, whiten)


def head_statistics(
  model: Model,
  params: PyTree,
  readout: Float[Array, 'V d'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  num: int,
  length: int,
  shrinkage: float,
) -> tuple[Float[Array, ' d'], Float[Array, 'd d']]:
  """Mean and whitening `(μ, Σ_s^{-1/2})` of the head inputs along `num`
  sequences of `length` tokens sampled from the model after `start`, with
  `Σ_s = Σ + shrinkage · tr(Σ)/d · I`.

  The model's own text stands in for the private data's, so the attack
  needs no corpus. Pure; :func:`head_score` jits it with `model`, `num`,
  `length` and `shrinkage` static.
  """
  h = sample_head_inputs(
    model, params, readout, start, key=key, num=num, length=length
  )
  return whitening(h.reshape(-1, h.shape[-1]), shrinkage)


def sample_head_inputs(
  model: Model,
  params: PyTree,
  readout: Float[Array, 'V d'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  num: int,
  length: int,
) -> Float[Array, 'length num d']:
  """The head inputs along `num` sequences of `length` tokens sampled
  from the model after `start`: row 0 is `start`'s own (the same in every
  sequence), row i the input after i sampled tokens. Pure, with `model`,
  `num` and `length` static."""
  cache = model.init_cache(params, num, length + 1)
  first = jnp.full((num, 1), start, jnp.int32)
  logits, cache = model.decode(params, cache, first)

  def step(carry, k):
    z, c = carry
    tok = jax.random.categorical(k, z[:, -1].astype(jnp.float32))
    h = z[:, -1].astype(jnp.float32) @ readout
    z, c = model.decode(params, c, tok[:, None].astype(jnp.int32))
    return (z, c), h

  _, h = jax.lax.scan(step, (logits, cache), jax.random.split(key, length))
  return h


def whitening(
  x: Float[Array, 'n d'], shrinkage: float
) -> tuple[Float[Array, ' d'], Float[Array, 'd d']]:
  """`(mean, Σ_s^{-1/2})` of the rows of `x`, `Σ_s` their covariance shrunk
  towards `shrinkage · tr(Σ)/d · I` (symmetric inverse square root)."""
  mean = x.mean(0)
  cov = jnp.cov(x.T)
  d = cov.shape[0]
  cov = cov + shrinkage * jnp.trace(cov) / d * jnp.eye(d)
  w, u = jnp.linalg.eigh(cov)
  return mean, (u * jax.lax.rsqrt(jnp.maximum(w, 1e-30))) @ u.T


def head_score(
  model: Model,
  params: PyTree,
  grads: PyTree,
  candidates: Int[Array, ' C'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  config: HybridConfig,
  valid: Bool[Array, ' C'] | None = None,
  shift: Float[Array, 'C d'] | None = None,
  targets: Float[Array, ''] | float | None = None,
) -> HeadScore:
  """The :class:`HeadScore` of `candidates` under the observed gradient
  (`valid` marks the real candidates among padding: the median row norm
  is theirs; None: all; `shift` is taken off the negated raw rows first,
  e.g. the share the sentences' first targets explain,
  :func:`estimate_starts`; with `targets`, the batch's number of
  targets, it also holds what :meth:`HeadScore.evidence` needs)."""
  readout = jitted(head_readout, static_argnames=('model',))(model, params)
  statistics = jitted(
    head_statistics, static_argnames=('model', 'num', 'length', 'shrinkage')
  )
  mean, whiten = statistics(
    model,
    params,
    readout,
    start,
    key=key,
    num=config.head_samples,
    length=config.head_sample_length,
    shrinkage=config.head_shrinkage,
  )
  if valid is None:
    valid = jnp.ones(candidates.shape, bool)
  return jitted(_head_rows, static_argnames=('model',))(
    model,
    grads,
    candidates,
    valid,
    readout,
    mean,
    whiten,
    jnp.zeros((), jnp.float32) if shift is None else shift,
    None if targets is None else jnp.asarray(targets, jnp.float32),
  )


def _head_rows(
  model, grads, candidates, valid, readout, mean, whiten, shift, targets
):
  rows = raw_head_rows(model, grads, candidates) - shift
  rows = rows - jnp.outer(rows @ mean / (mean @ mean), mean)
  rows = rows @ whiten
  norm = jnp.linalg.norm(rows, axis=-1, keepdims=True)
  median = jnp.nanmedian(jnp.where(valid[:, None], norm, jnp.nan))
  extra = {}
  if targets is not None:
    extra = dict(
      transformed=rows, noise=norm[:, 0] ** 2 + median**2, targets=targets
    )
  rows = rows / (norm + 1e-30)
  return HeadScore(
    readout=readout, mean=mean, whiten=whiten, rows=rows, **extra
  )


def raw_head_rows(
  model: Model, grads: PyTree, candidates: Int[Array, ' C']
) -> Float[Array, 'C d']:
  """The candidates' negated head-gradient rows `−∇W[v]`, unprocessed
  (pure, `model` static)."""
  g = get_path(grads, head_path(model)).astype(jnp.float32)
  if model.paths.lm_head is not None:
    g = g.T
  return -g[candidates]


def pool_head_gradients(
  model: Model,
  params: PyTree,
  tokens: Int[Array, 'P L'],
  lengths: Int[Array, ' P'],
  candidates: Int[Array, ' C'],
  *,
  batch_size: int = 1,
) -> Float[Array, 'P C d']:
  """Each sentence's own head-matrix gradient at the candidates' rows.

  Row p is `(n_p) ∇W L(sentence p)[candidates]`: the gradient of its
  summed next-token loss (`n_p = lengths[p] − 1` targets) with respect to
  the head matrix (the embedding matrix when tied, so the input
  embeddings' part is in it too), negated and oriented like
  :func:`raw_head_rows`. Under the mean loss the batch's gradient is the
  sum of its sentences' rows over the batch's targets, exactly: a causal
  model's sentences do not interact. `batch_size` sentences at a time
  (`lax.map`): that many `[V, d]` gradients are alive. Pure; the
  selection jits it: `jax.jit(pool_head_gradients,
  static_argnames=('model', 'batch_size'))`.
  """
  path = head_path(model)
  weight = get_path(params, path)

  def one(args):
    seq, n = args
    mask = (jnp.arange(seq.shape[0]) < n).astype(jnp.int32)

    def loss(w):
      p = set_path(params, path, w)
      return model.loss(p, seq[None], mask[None]) * (n - 1)

    g = jax.grad(loss)(weight).astype(jnp.float32)
    if model.paths.lm_head is not None:
      g = g.T
    return -g[candidates]

  if batch_size < 1:
    raise LeakjaxError(f'batch_size must be >= 1, got {batch_size}')
  return jax.lax.map(
    one, (tokens, lengths), batch_size=batch_size if batch_size > 1 else None
  )
