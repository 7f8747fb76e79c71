"""Word rules on the update without the mixture: the bias rule and its helpers.

Part of :mod:`leakjax.attacks.gboard` (the package docstring has the
method): Algorithm 2 (:func:`recover_words`), the no-oracle thresholds
(:func:`choose_threshold`: 'fdr', 'universal'), the robust noise
scale, the row chi-square and the Stouffer rule (:func:`stouffer_words`),
the typed words whose bias fell (:func:`convexity_violations`,
:func:`rescued_words`), the regime test (:func:`drift_to_noise`) and the
oracle cut that only compares (:func:`oracle_threshold`).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, Bool, Float

from leakjax import metrics
from leakjax.errors import LeakjaxError

# The bias thresholds of :func:`choose_threshold`. The former 'maxf1' rule
# (:func:`max_f1_cut` on the bias z-scores) is kept for comparison in
# reports/gboard/noise_detectors/maxf1_rule.py.
THRESHOLD_RULES = ('zero', 'fdr', 'universal')
_MAD_TO_STD = 1.482602218505602  # 1 / Φ^{-1}(3/4): MAD -> Gaussian std


def candidate_mask(
  vocab_size: int, special_ids: Sequence[int] = (0, 1)
) -> Bool[Array, ' V']:
  """bool `[vocab]`: False at ids that are no words (`<UNK>`, `<S>`)."""
  mask = jnp.ones((vocab_size,), bool)
  if special_ids:
    mask = mask.at[jnp.asarray(list(special_ids))].set(False)
  return mask


def recover_words(
  delta: Float[Array, ' V'],
  threshold: Float[Array, ''] | float = 0.0,
  candidates: Bool[Array, ' V'] | None = None,
) -> Bool[Array, ' V']:
  """Algorithm 2: bool `[vocab]`, True where `delta > threshold`.

  Args:
    delta: `b1 - b0` from :func:`bias_update`, `[vocab]`.
    threshold: 0 is Algorithm 2; see :func:`choose_threshold` under noise.
    candidates: optional bool `[vocab]`; False entries are never recovered
      (e.g. `<UNK>`, `<S>`: :func:`candidate_mask`).
  """
  words = delta > threshold
  return words if candidates is None else words & candidates


def robust_noise_scale(
  delta: Float[Array, ' V'], candidates: Bool[Array, ' V'] | None = None
) -> tuple[Float[Array, ''], Float[Array, '']]:
  """`(median, 1.4826 * MAD)` of `delta`: centre and std of the bulk.

  Most of the vocabulary was not typed, so the median and the median
  absolute deviation describe the untyped words (noise plus their small
  negative drift) and ignore the few hundred typed ones.

  Args:
    delta: float `[vocab]` (or any shape).
    candidates: optional bool mask of the entries to use (same shape).

  Returns:
    float32 scalars `(center, scale)`; the scale is at least the smallest
    positive float32, so it can divide.
  """
  values = delta.astype(jnp.float32)
  if candidates is not None:
    values = jnp.where(candidates, values, jnp.nan)
  center = jnp.nanmedian(values)
  scale = _MAD_TO_STD * jnp.nanmedian(jnp.abs(values - center))
  return center, jnp.maximum(scale, jnp.finfo(jnp.float32).tiny)


def choose_threshold(
  delta: Float[Array, ' V'],
  rule: str = 'fdr',
  *,
  q: float = 0.05,
  candidates: Bool[Array, ' V'] | None = None,
) -> Float[Array, '']:
  """A word threshold for :func:`recover_words` that needs no true words.

  Args:
    delta: `b1 - b0`, float `[vocab]`.
    rule: 'zero' (Algorithm 2), 'fdr' (Benjamini-Hochberg at level `q` on
      the Gaussian p-values of the robust z-scores), 'universal'
      (`median + scale * sqrt(2 ln V)`); see the package docstring.
    q: the false-discovery level of 'fdr'.
    candidates: optional bool `[vocab]` of ids that may be words; the noise
      and the number of tests V are taken over them.

  Returns:
    float32 scalar threshold, at least 0.
  """
  if rule not in THRESHOLD_RULES:
    raise LeakjaxError(
      f'unknown threshold rule {rule!r}',
      f'use one of {", ".join(THRESHOLD_RULES)}',
    )
  delta = delta.astype(jnp.float32)
  if rule == 'zero':
    return jnp.zeros((), jnp.float32)
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = robust_noise_scale(delta, candidates)
  num = jnp.sum(candidates)
  if rule == 'universal':
    cut = center + scale * jnp.sqrt(2.0 * jnp.log(num.astype(jnp.float32)))
    return jnp.maximum(cut, 0.0)
  # Benjamini-Hochberg: sort descending, find the largest i (1-based) with
  # p_(i) <= q i / V; every word at least as large as the i-th is kept.
  z = jnp.where(candidates, (delta - center) / scale, -jnp.inf)
  z_sorted = -jnp.sort(-z)  # [V] descending
  p_sorted = jax.scipy.special.ndtr(-z_sorted)  # one-sided upper p-values
  rank = jnp.arange(1, z.shape[0] + 1, dtype=jnp.float32)
  passes = (p_sorted <= q * rank / num) & jnp.isfinite(z_sorted)
  last = jnp.max(jnp.where(passes, rank, 0.0)).astype(jnp.int32)  # 0: none
  # Cut halfway between the last kept and the first dropped value.
  kept = center + scale * z_sorted[jnp.maximum(last - 1, 0)]
  dropped = center + scale * z_sorted[jnp.minimum(last, z.shape[0] - 1)]
  dropped = jnp.where(jnp.isfinite(dropped), dropped, kept)
  cut = jnp.where(last > 0, 0.5 * (kept + dropped), jnp.inf)
  return jnp.maximum(cut, 0.0)


def max_f1_cut(
  z: Float[Array, ' V'],
  candidates: Bool[Array, ' V'] | None = None,
  eligible: Bool[Array, ' V'] | None = None,
  *,
  slack: float = 3.0,
) -> Float[Array, '']:
  """The cut on z-scores that maximises the estimated F1 (N(0, 1) null).

  Above a cut t, `k(t)` eligible entries pass and `V Φ(-t)` are expected
  from the null (V = number of candidates), so `TP(t) ≈ k(t) - V Φ(-t)`;
  the number of typed words is estimated as `n1 = max_t TP(t)` and the
  cut maximises `2 TP(t) / (k(t) + n1)`. `TP(t)` is taken `slack` null
  standard deviations low (`- slack sqrt(V Φ(-t))`): without it the
  excess of pure noise wanders up near t = 2 and the cut passes it. The
  default 3 was set on pure N(0, 1) noise alone, so that it passes almost
  no entry (reports/gboard/README.md, "No-oracle rules").
  Returns +inf when no cut has a positive estimate. Used by
  :func:`stouffer_words`.

  Args:
    z: float `[vocab]` scores, N(0, 1) for untyped words.
    candidates: optional bool `[vocab]`; V counts them.
    eligible: optional bool `[vocab]`: only these are counted in `k(t)`.
    slack: null standard deviations taken off the estimated TP.

  Returns:
    float32 scalar cut (keep `z > cut`), halfway between two scores.
  """
  z = z.astype(jnp.float32)
  if candidates is None:
    candidates = jnp.ones(z.shape, bool)
  ok = candidates if eligible is None else candidates & eligible
  z_sorted = -jnp.sort(-jnp.where(ok, z, -jnp.inf))  # [V] descending
  finite = jnp.isfinite(z_sorted)
  rank = jnp.arange(1, z.shape[0] + 1, dtype=jnp.float32)
  num = jnp.sum(candidates).astype(jnp.float32)
  null = num * jax.scipy.special.ndtr(-z_sorted)
  # Typed words above the cut, less `slack` null standard deviations
  # (Poisson): on pure noise `k(t) - V Φ(-t)` alone wanders up by
  # tens of entries near t = 1.5-2.
  excess = jnp.where(finite, rank - null - slack * jnp.sqrt(null), -jnp.inf)
  n1 = jnp.maximum(jnp.max(excess), 1.0)
  est_f1 = jnp.where(finite, 2.0 * jnp.maximum(excess, 0.0) / (rank + n1), -1.0)
  best = jnp.argmax(est_f1)
  kept = z_sorted[best]
  nxt = jnp.minimum(best + 1, z.shape[0] - 1)
  dropped = jnp.where(
    (best + 1 < z.shape[0]) & finite[nxt], z_sorted[nxt], kept - 1.0
  )
  return jnp.where(jnp.max(est_f1) > 0, 0.5 * (kept + dropped), jnp.inf)


def row_update_scores(
  rows: Float[Array, 'V D'], candidates: Bool[Array, ' V'] | None = None
) -> Float[Array, ' V']:
  """Robust z-scores of the squared norms of the output-matrix row updates.

  Each entry of an untyped word's row is noise (plus a small drift); the
  squared row norm over D entries is then a scaled chi-square with D
  degrees of freedom. The per-entry noise variance is estimated from all
  entries (1.4826 x MAD), and `||ΔW_k||² / s²` is mapped to a standard
  normal with the Wilson-Hilferty cube-root transform, so the scores can be
  thresholded like :func:`choose_threshold`'s z-scores (large = typed).

  Args:
    rows: `[vocab, D]` from :func:`output_rows_update`.
    candidates: optional bool `[vocab]`; others get -inf.

  Returns:
    float32 `[vocab]`.
  """
  rows = rows.astype(jnp.float32)
  dim = rows.shape[-1]
  mask = (
    None
    if candidates is None
    else jnp.broadcast_to(candidates[:, None], rows.shape)
  )
  center, scale = robust_noise_scale(rows, mask)
  var = scale**2
  chi = jnp.sum((rows - center) ** 2, axis=-1) / var  # ~ chi2(D) if untyped
  k = 2.0 / (9.0 * dim)
  z = ((chi / dim) ** (1.0 / 3.0) - (1.0 - k)) / jnp.sqrt(k)
  return z if candidates is None else jnp.where(candidates, z, -jnp.inf)


def row_residual_scores(
  delta: Float[Array, ' V'], rows: Float[Array, 'V D'], fit: jax.Array
) -> Float[Array, ' V']:
  """How far each output row moved away from the untyped words' pattern.

  For a word k that was not typed, the bias step is `-η/n Σ_t p_tk` and the
  row step `-η/n Σ_t p_tk h_t`: the row is the bias times `h̄_k`, a
  p-weighted mean of the client's hidden states, much the same vector for
  every frequent word. A typed word's row also holds `Σ_{t: y_t=k} h_t`
  and, through the tied embedding, its input gradients. With
  `ĥ = Σ_fit ΔW_k / Σ_fit Δb_k` over the words in `fit` (e.g. all whose
  bias fell: mostly untyped), the score is
  `||ΔW_k - Δb_k ĥ|| / (|Δb_k| ||ĥ||)`.

  Args:
    delta: `b1 - b0`, `[vocab]`.
    rows: `W1 - W0` by word, `[vocab, D]` (:func:`output_rows_update`).
    fit: bool `[vocab]`, the words that fit `ĥ`.

  Returns:
    float32 `[vocab]` relative residuals (large = not like an untyped word).
  """
  delta = delta.astype(jnp.float32)
  rows = rows.astype(jnp.float32)
  weight = jnp.where(fit, 1.0, 0.0)
  denom = jnp.sum(weight * delta)
  hhat = jnp.sum(weight[:, None] * rows, 0) / jnp.where(
    denom == 0, 1.0, denom
  )  # [D]
  resid = jnp.linalg.norm(rows - delta[:, None] * hhat[None], axis=-1)
  return resid / (
    jnp.abs(delta) * jnp.linalg.norm(hhat) + jnp.finfo(jnp.float32).tiny
  )


def rescued_words(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  candidates: Bool[Array, ' V'] | None = None,
  *,
  gate: float = 30.0,
  z: float = 5.0,
  min_pool: int = 20,
) -> Bool[Array, ' V']:
  """Typed words whose bias fell, found from the tied output rows.

  Algorithm 2 misses a typed word k when the model already predicted it so
  often that `Σ_t p_tk` exceeds its count (frequent words: "i", "to",
  "the"). Its row still differs from an untyped word's (see
  :func:`row_residual_scores`, `ĥ` fitted on every word whose bias fell).
  Among the words whose bias fell by more than `gate` noise scales
  (clearly drift, not noise; without noise these are the frequent words),
  those whose relative residual is an outlier (above median + `z` x
  1.4826 MAD of that pool) are returned. Under local DP noise the pool is
  (nearly) empty and nothing is rescued. The defaults (gate 30, z 5) were
  set on the noise-free FedSGD/FedAvg updates of the SMS run (n_k 16-256);
  what they rescue there is `num_rescued` in reports/gboard/summary.json,
  and the word rule's F1 with this rescue is `rescue_f1`.

  Args:
    delta: `b1 - b0`, `[vocab]`.
    rows: `[vocab, D]` output-row update.
    candidates: optional bool `[vocab]` of ids that may be words.
    gate: pool = words with `delta < median - gate * scale`.
    z: outlier cut on the residual scores of the pool.
    min_pool: rescue nothing when the pool is smaller.

  Returns:
    bool `[vocab]`.
  """
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = robust_noise_scale(delta, candidates)
  pool = candidates & (delta < center - gate * scale)
  scores = row_residual_scores(delta, rows, candidates & (delta < 0))
  med, spread = robust_noise_scale(scores, pool)
  return pool & (scores > med + z * spread) & (jnp.sum(pool) >= min_pool)


def _ulp(x: jax.Array) -> jax.Array:
  """float32 spacing at `|x|` (the rounding step of a stored weight)."""
  x = jnp.abs(x.astype(jnp.float32))
  return jnp.nextafter(x, jnp.float32(jnp.inf)) - x


def convexity_violations(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  rows0: Float[Array, 'V D'],
  bias0: Float[Array, ' V'],
  candidates: Bool[Array, ' V'] | None = None,
  *,
  num_sources: int = 64,
  margin: float = 0.3,
  gate: float = 10.0,
) -> Bool[Array, ' V']:
  r"""Typed words whose bias fell, found by a convexity test (no oracle).

  Algorithm 2 misses a typed word k when the model already predicted it
  more often than it occurs (`Σ_t p_tk > count_k`: "i", "to", "a"), so its
  bias fell like an untyped word's, only by less. How much an *untyped*
  word's bias must fall is fixed by the update itself:

  For a word k that the client never typed (not a target, hence, with
  `<S>` first, never an input either), one SGD step on logits
  `z_tk = w_k · h_t + b_k` moves
  `Δb_k = -η Σ_t p_tk = -η e^{b_k} G(w_k)` and
  `Δw_k = -η Σ_t p_tk h_t = -η e^{b_k} ∇G(w_k)`, with the same function
  `G(u) = Σ_t exp(u · h_t - log Z_t)` for every untyped word (h_t, Z_t
  are the client's hidden states and partition sums). So
  `g_k = log(-Δb_k) - b_k = log η + log G(w_k)` and its gradient
  `a_k = Δw_k / Δb_k = ∇ log G(w_k)` are samples of one convex function
  (log-sum-exp of affine functions): every tangent plane lies below it,
  `g_k >= g_j + a_j · (w_k - w_j)`. A typed word's bias fell by
  `η (Σ_t p_tk - count_k)`, less than `G` says: its `g_k` lies *below*
  the tangent planes of untyped words. Several local steps (FedAvg) sum
  such terms with slowly moving weights; the midpoint
  `w_k + Δw_k / 2`, `b_k + Δb_k / 2` stands in for the moving point.

  The test:

  1. sources: the `num_sources` words whose bias fell with the smallest
     relative error `max(ulp(b_k) / |Δb_k|, ulp(w_k) / ||Δw_k||)` (float32
     rounding of the stored weights; their planes are precise);
  2. source planes that contradict each other by more than `margin`
     (some source is typed) are resolved greedily: drop the source in most
     conflicts, repeat until none is left; dropped sources are flagged;
  3. a word is flagged when its `g` lies more than `margin` below the
     highest remaining plane, i.e. its bias fell at least
     `1 - e^{-margin}` (26% at 0.3) less than an untyped word's would.

  Only words whose bias fell clearly (`delta < median - gate * scale`, the
  robust scale of :func:`robust_noise_scale`) are flagged: for rare words
  the fall is a few float32 steps and `g` is meaningless; under local DP
  noise the set is (nearly) empty. It replaced :func:`rescued_words` on
  the noise-free SMS updates of reports/gboard (`num_convex` in its
  summary.json; the worst F1 of each, "The convexity test against the
  row-residual rescue" in reports/gboard/README.md). The defaults were
  chosen there, the true words only scoring the choice, never entering
  the rule (reports/gboard/README.md, "Where the constants come from").

  Args:
    delta: `b1 - b0`, float `[vocab]`.
    rows: `W1 - W0` by word, `[vocab, D]` (:func:`output_rows_update`).
    rows0: θ0's output rows `[vocab, D]` (:func:`output_rows`).
    bias0: θ0's output bias `[vocab]` (:func:`output_bias`).
    candidates: optional bool `[vocab]` of ids that may be words.
    num_sources: S, how many tangent planes (cost `O(V S D)`).
    margin: log-units below the planes needed to flag a word.
    gate: only words whose bias fell by more than this many robust noise
      scales are flagged.

  Returns:
    bool `[vocab]`: the flagged words (their bias fell; add them to the
    words whose bias rose).
  """
  delta = delta.astype(jnp.float32)
  rows = rows.astype(jnp.float32)
  rows0 = rows0.astype(jnp.float32)
  bias0 = bias0.astype(jnp.float32)
  vocab = delta.shape[0]
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  tiny = jnp.finfo(jnp.float32).tiny
  fell = candidates & (delta < 0)
  err = jnp.maximum(
    _ulp(bias0) / jnp.maximum(-delta, tiny),
    jnp.max(_ulp(rows0), -1)
    / jnp.maximum(jnp.linalg.norm(rows, axis=-1), tiny),
  )
  num_sources = min(num_sources, vocab)
  neg_err, src = lax.top_k(jnp.where(fell, -err, -jnp.inf), num_sources)
  src_ok = jnp.isfinite(neg_err)  # [S]; False when fewer words fell
  # g = log(-Δb) - b and a = Δw / Δb at the midpoint; 0 where the bias rose.
  safe = jnp.where(fell, delta, -1.0)
  g = jnp.where(fell, jnp.log(-safe) - (bias0 + 0.5 * delta), 0.0)  # [V]
  x = rows0 + 0.5 * rows  # [V, D]
  a = rows / safe[:, None]  # [V, D]
  a_s, x_s, g_s = a[src], x[src], g[src]  # [S, D], [S, D], [S]
  # planes[k, j] = g_j + a_j · (x_k - x_j) - g_k  (> 0: k below plane j)
  planes = (
    x @ a_s.T + (g_s - jnp.sum(a_s * x_s, -1))[None, :] - g[:, None]
  )  # [V, S]
  conflict = (
    (planes[src] > margin)
    & src_ok[:, None]
    & src_ok[None, :]
    & ~jnp.eye(num_sources, dtype=bool)
  )  # [S, S]

  def live_conflicts(alive):
    return conflict & alive[:, None] & alive[None, :]

  def drop_worst(alive):
    c = live_conflicts(alive)
    degree = c.sum(0) + c.sum(1)
    return alive.at[jnp.argmax(degree)].set(False)

  alive = lax.while_loop(
    lambda al: jnp.any(live_conflicts(al)), drop_worst, src_ok
  )
  below = jnp.max(jnp.where(alive[None, :], planes, -jnp.inf), -1)  # [V]
  dropped = jnp.zeros((vocab,), bool).at[src].max(src_ok & ~alive)
  center, scale = robust_noise_scale(delta, candidates)
  pool = fell & (delta < center - gate * scale)
  return pool & ((below > margin) | dropped)


def drift_to_noise(
  delta: Float[Array, ' V'], candidates: Bool[Array, ' V'] | None = None
) -> Float[Array, '']:
  """`(median - 10th smallest) / scale` of `delta`: is drift above noise?

  Pure Gaussian noise gives about `-Φ⁻¹(10 / V)`, 3.1 for V = 9502 (the
  10th smallest of V standard normals); without noise the frequent
  untyped words' drift `-η Σ p` puts it far higher (`drift_to_noise` in
  reports/gboard/summary.json).
  """
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = robust_noise_scale(delta, candidates)
  values = jnp.sort(jnp.where(candidates, delta.astype(jnp.float32), jnp.inf))
  return (center - values[jnp.minimum(9, delta.shape[0] - 1)]) / scale


def stouffer_scores(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  candidates: Bool[Array, ' V'] | None = None,
) -> Float[Array, ' V']:
  """`(z_b + z_W) / sqrt(2)`: bias z-score and row chi-square z-score.

  The robust bias z-score (:func:`robust_noise_scale`) and
  :func:`row_update_scores` combined (Stouffer), N(0, 1) for an untyped
  word under white noise; -inf at non-candidates.
  """
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = robust_noise_scale(delta, candidates)
  return jnp.where(
    candidates,
    ((delta - center) / scale + row_update_scores(rows, candidates))
    / math.sqrt(2.0),
    -jnp.inf,
  )


def stouffer_words(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  candidates: Bool[Array, ' V'] | None = None,
) -> Bool[Array, ' V']:
  """bool `[vocab]`: :func:`stouffer_scores` cut by :func:`max_f1_cut`
  among the words whose bias rose (:func:`recover_words_auto`'s fallback
  when the mixture sees no low-rank signal; :func:`max_f1_cut`'s slack
  keeps pure noise out)."""
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  combined = stouffer_scores(delta, rows, candidates)
  rose = delta > 0
  thr = max_f1_cut(combined, candidates, rose)
  return recover_words(combined, thr, candidates) & rose


def oracle_threshold(
  delta: np.ndarray,
  words: Sequence[str],
  true_words: Sequence[str],
  candidates: np.ndarray | None = None,
) -> tuple[float, float]:
  """The threshold with the best F1 given the true words (comparison only).

  :func:`leakjax.metrics.oracle_f1_cut` on the words' labels.

  Args:
    delta: `[vocab]` scores (`b1 - b0`).
    words: the vocabulary, `words[k]` the string of id k.
    true_words: the client's words.
    candidates: optional bool `[vocab]` of ids that may be recovered.

  Returns:
    `(threshold, f1)`: keeping `delta > threshold` gives that F1; the
    threshold lies halfway between the last kept and the first dropped.
  """
  true = set(true_words)
  labels = np.array([words[k] in true for k in range(len(delta))], bool)
  # Recall counts every true word, also those outside the vocabulary.
  cut = metrics.oracle_f1_cut(
    delta, labels, num_true=len(true), candidates=candidates
  )
  return cut.threshold, cut.f1


__all__ = [
  'THRESHOLD_RULES',
  'candidate_mask',
  'choose_threshold',
  'convexity_violations',
  'drift_to_noise',
  'max_f1_cut',
  'oracle_threshold',
  'recover_words',
  'rescued_words',
  'robust_noise_scale',
  'row_residual_scores',
  'row_update_scores',
  'stouffer_scores',
  'stouffer_words',
]
