"""The Gaussian-mixture word detector and the no-oracle rule that uses it.

Part of :mod:`leakjax.attacks.gboard` (the package docstring has the
method). :func:`mixture_word_posterior` fits a mixture to the standardised
(bias, row) updates of all words under local DP noise;
:func:`expected_f1_cut` cuts its log-odds; :func:`recover_words_auto`
reads the regime off the update and picks the mixture, the bias rule or
the Stouffer rule of :mod:`leakjax.attacks.gboard.thresholds`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float

from leakjax.attacks.gboard.thresholds import (
  choose_threshold,
  convexity_violations,
  drift_to_noise,
  recover_words,
  rescued_words,
  robust_noise_scale,
  stouffer_words,
)
from leakjax.errors import LeakjaxError


def _gaussian_loglik(
  y: jax.Array, mean: jax.Array, cov: jax.Array
) -> jax.Array:
  """`log N(y; mean, cov)` up to the shared `-d/2 log 2π`, rows of y."""
  chol = jnp.linalg.cholesky(cov)
  sol = jax.scipy.linalg.solve_triangular(chol, (y - mean).T, lower=True)
  return -0.5 * jnp.sum(sol**2, 0) - jnp.sum(jnp.log(jnp.diag(chol)))


def mixture_word_posterior(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  candidates: Bool[Array, ' V'] | None = None,
  *,
  init_fraction: float = 0.05,
  min_signal: float = 2.0,
  num_iters: int = 200,
  tol: float = 1e-5,
) -> tuple[Float[Array, ' V'], Float[Array, ' V']]:
  """Log-odds and posterior that each word was typed, under local DP noise.

  The bias alone carries little of a typed word's signal under Algorithm
  3's noise: on the SMS updates the noise-free update of a typed word lies
  almost all in the word's D = 96 tied output-row entries, and across
  typed words in a few principal directions (the hidden states that
  predicted the words share directions; reports/gboard/README.md, "The
  mixture"). A chi-square over all 96 entries
  (:func:`row_update_scores`) spreads that signal over 96 degrees of
  freedom. Here, with no true words:

  1. Each word is the vector `x_k = (Δb_k, ΔW_k)` (D + 1 entries), centred
     by the per-entry median and divided by one robust noise scale (the
     MAD of all entries: the noise of Algorithms 3 and 4 is the same on
     every parameter), so an untyped word without drift is N(0, I).
  2. Principal directions of `x` over the candidate words; kept: those
     whose eigenvalue exceeds the Marchenko-Pastur edge
     `(1 + sqrt((D + 1) / V))²` of pure unit noise (at least one). When
     even the leading one is below `min_signal` x the edge, no word is
     typed (all log-odds -inf): pure Gaussian noise lies at the edge, and
     without the guard the mixture would fit its tails and call them
     typed. (The SMS σ = 0.1 updates, in edges: "The mixture's guard on
     the SMS updates" in reports/gboard/README.md.) Nor when the bulk is
     not Gaussian: the 90th percentile of the words' mean squared
     standardised entry must be below 2 x that of chi2(D + 1) / (D + 1).
     Noise-free updates (drift, no noise) lie far above it, and a mixture
     with a white null fits them badly (:func:`recover_words_auto` reads
     them with the bias rule).
  3. A Gaussian mixture in those k directions, fitted by EM: the null
     component is fixed at N(0, I_k) (known white noise; it may not widen
     to swallow weak typed words), two free components (full covariance)
     take everything else. They start from the `init_fraction` longest
     vectors, split at the median of their projection on their first
     principal direction (oriented to rise with Δb): untyped frequent
     words drift along `-(1, h̄)` (their bias and row fall together) and
     typed words along `+(1, h̄)`.
  4. A free component is *typed* when its responsibility-weighted mean
     Δb z-score is positive (untyped drift lowers the bias); the score of
     a word is `log p(typed components) - log p(null + other)`.

  Decision (not in the paper, which reads a magnitude threshold off a plot
  of the bias, Sec. 6.1): on the SMS σ = 0.1 updates the mixture beats
  the bias + row chi-square (Stouffer) rule at n_k = 64 and 256, B = 32,
  from E = 50 on (reports/gboard/README.md, the DPSGD-like σ = 0.1
  table). Three or more
  free components fitted the largest datasets better and the smallest
  worse, so two are used.

  Args:
    delta: `b1 - b0`, `[vocab]`.
    rows: `W1 - W0` by word, `[vocab, D]`.
    candidates: optional bool `[vocab]`; others get log-odds -inf.
    init_fraction: share of the words that start in the free components.
    min_signal: the leading eigenvalue, in Marchenko-Pastur edges, below
      which the update is taken as pure noise.
    num_iters: most EM iterations.
    tol: stop when no responsibility moves more than this.

  Returns:
    `(log_odds, posterior)`, float32 `[vocab]` each.
  """
  num_words, width = rows.shape
  if candidates is None:
    candidates = jnp.ones((num_words,), bool)
  x = jnp.concatenate(
    [delta.astype(jnp.float32)[:, None], rows.astype(jnp.float32)], 1
  )  # [V, D + 1]
  dim = width + 1
  xm = jnp.where(candidates[:, None], x, jnp.nan)
  x = x - jnp.nanmedian(xm, 0)
  _, scale = robust_noise_scale(
    x, jnp.broadcast_to(candidates[:, None], x.shape)
  )
  x = jnp.where(candidates[:, None], x / scale, 0.0)
  n = jnp.sum(candidates).astype(jnp.float32)
  evals, evecs = jnp.linalg.eigh(x.T @ x / n)
  evals, evecs = evals[::-1], evecs[:, ::-1]
  edge = (1.0 + jnp.sqrt(dim / n)) ** 2
  keep = (evals > edge) | (jnp.arange(dim) == 0)  # [dim], a prefix
  y = (x @ evecs) * keep  # the dropped directions are 0 for everyone

  # The null is Gaussian white noise: per word, the mean square of the
  # standardised entries is then chi2(dim) / dim; noise-free updates (drift
  # only) put their 90th percentile far above that.
  mean_sq = jnp.where(candidates, jnp.mean(x**2, 1), jnp.nan)
  wh = 2.0 / (9.0 * dim)
  chi2_q90 = (1.0 - wh + 1.2815516 * math.sqrt(wh)) ** 3  # Wilson-Hilferty
  gaussian = jnp.nanquantile(mean_sq, 0.9) < 2.0 * chi2_q90
  signal = (evals[0] > min_signal * edge) & gaussian
  # Without a signal the answer is fixed: the EM below is skipped.
  return lax.cond(
    signal,
    lambda: _fit_mixture(
      x, y, keep, candidates, n, init_fraction, num_iters, tol
    ),
    lambda: (jnp.full((num_words,), -jnp.inf), jnp.zeros((num_words,))),
  )


def _fit_mixture(x, y, keep, candidates, n, init_fraction, num_iters, tol):
  """EM and scores of :func:`mixture_word_posterior` (steps 3-4)."""
  dim = y.shape[1]
  eye = jnp.eye(dim)
  outer = keep[:, None] & keep[None, :]

  # Initial responsibilities: null / low / high projection.
  norm2 = jnp.where(candidates, jnp.sum(y**2, 1), -jnp.inf)
  num_top = jnp.maximum(jnp.round(init_fraction * n), 4.0)
  top = candidates & (jnp.argsort(jnp.argsort(-norm2)) < num_top)
  ytop = jnp.where(top[:, None], y, 0.0)
  _, _, vt = jnp.linalg.svd(ytop, full_matrices=False)
  proj = y @ vt[0]
  bias_z = x[:, 0]
  tw = top.astype(jnp.float32)
  cov_pb = jnp.sum(
    tw
    * (proj - jnp.sum(tw * proj) / num_top)
    * (bias_z - jnp.sum(tw * bias_z) / num_top)
  )
  proj = jnp.where(cov_pb < 0, -proj, proj)
  mid = jnp.nanmedian(jnp.where(top, proj, jnp.nan))
  high = top & (proj >= mid)
  resp0 = jnp.stack([~top, top & ~high, high], 1).astype(jnp.float32)
  resp0 = resp0 * candidates[:, None]

  def loglik(resp):
    weight = resp.sum(0) + 1e-6  # [3]
    out = [jnp.log(weight[0] / n) - 0.5 * jnp.sum(y**2, 1)]
    for j in (1, 2):
      w = resp[:, j]
      mean = (w @ y) / weight[j]
      yc = (y - mean) * keep
      cov = (yc * w[:, None]).T @ yc / weight[j]
      cov = jnp.where(outer, cov + 1e-3 * eye, eye)
      out.append(jnp.log(weight[j] / n) + _gaussian_loglik(y, mean, cov))
    return jnp.stack(out, 1)  # [V, 3]

  def posterior(resp):
    ll = loglik(resp)
    post = jax.nn.softmax(ll, axis=1) * candidates[:, None]
    return ll, post

  def cond(state):
    i, _, change = state
    return (i < num_iters) & (change > tol)

  def body(state):
    i, resp, _ = state
    _, new = posterior(resp)
    return i + 1, new, jnp.max(jnp.abs(new - resp))

  _, resp, _ = lax.while_loop(cond, body, (0, resp0, jnp.inf))
  ll, post = posterior(resp)
  mean_bias = (post.T @ bias_z) / (post.sum(0) + 1e-6)  # [3]
  typed = (jnp.arange(3) > 0) & (mean_bias > 0)
  log_typed = jax.nn.logsumexp(jnp.where(typed, ll, -jnp.inf), 1)
  log_other = jax.nn.logsumexp(jnp.where(typed, -jnp.inf, ll), 1)
  log_odds = jnp.where(candidates, log_typed - log_other, -jnp.inf)
  prob = jnp.where(candidates, jnp.sum(jnp.where(typed, post, 0.0), 1), 0.0)
  return log_odds, prob


def expected_f1_cut(
  scores: Float[Array, ' V'], posterior: Float[Array, ' V']
) -> Float[Array, '']:
  """The cut on `scores` that maximises the F1 expected under `posterior`.

  Keeping the top m words by score, the expected true positives are the sum
  of their posteriors and the expected number of typed words the sum of
  all posteriors; the cut maximises `2 TP(m) / (m + Σ posterior)`.
  Returns +inf when every posterior is 0.

  Args:
    scores: float `[vocab]` (e.g. log-odds; -inf for non-candidates).
    posterior: float `[vocab]` probabilities that each word was typed.

  Returns:
    float32 scalar cut (keep `scores > cut`), halfway between two scores.
  """
  order = jnp.argsort(-scores)
  s = scores[order]
  tp = jnp.cumsum(posterior[order])
  rank = jnp.arange(1, scores.shape[0] + 1, dtype=jnp.float32)
  total = jnp.sum(posterior)
  est = jnp.where(jnp.isfinite(s), 2.0 * tp / (rank + total), -1.0)
  best = jnp.argmax(est)
  nxt = jnp.minimum(best + 1, scores.shape[0] - 1)
  dropped = jnp.where(
    (best + 1 < scores.shape[0]) & jnp.isfinite(s[nxt]), s[nxt], s[best] - 1.0
  )
  return jnp.where(total > 0, 0.5 * (s[best] + dropped), jnp.inf)


def recover_words_auto(
  delta: Float[Array, ' V'],
  rows: Float[Array, 'V D'],
  candidates: Bool[Array, ' V'] | None = None,
  *,
  rows0: Float[Array, 'V D'] | None = None,
  bias0: Float[Array, ' V'] | None = None,
  q: float = 0.05,
  max_drift: float = 8.0,
  bias_first_drift: float = 50.0,
) -> Bool[Array, ' V']:
  """The no-oracle word recovery used by the experiments.

  Three rules; which one applies is read off the update (no true words):

  * drift far above the noise (:func:`drift_to_noise` above
    `bias_first_drift`), or else drift above `max_drift` and no
    low-rank signal in Gaussian noise (below): the bias test
    (`choose_threshold(..., 'fdr')`) plus the typed words whose bias fell:
    :func:`convexity_violations` when θ0's `rows0` and `bias0` are given
    (the default of the experiments), else the older :func:`rescued_words`;
  * otherwise, when the update looks like a low-rank signal in white
    Gaussian noise (local DP noise, Algorithms 3 and 4;
    :func:`mixture_word_posterior`'s guard passes): the Gaussian mixture
    on the bias and row updates, cut where the F1 expected under its
    posterior is highest (:func:`expected_f1_cut`);
  * otherwise (noise, but no low-rank signal found): the Stouffer sum of
    the bias z-score and the row chi-square z-score
    (:func:`row_update_scores`), cut by :func:`max_f1_cut` among rising
    biases.

  The mixture is preferred to the Stouffer rule as the noisy-regime
  rule: the chi-square spreads the row signal over all D entries. On the
  SMS DPSGD-like σ = 0.1 updates the mixture is ahead at n_k = 64 and
  256 from E = 50 on, and mixed at n_k = 16 (reports/gboard/README.md,
  the σ = 0.1 table; reports/gboard/noise_detectors/bounds.json). The
  mixture assumes the typed words' row updates share a few directions
  (true of the LSTM's hidden states); signal spread evenly over all D
  entries is left to the chi-square. Noise-free updates fail the
  guard's Gaussian-bulk test by orders of magnitude and keep the bias
  rule.

  Args:
    delta: `b1 - b0`, `[vocab]`.
    rows: `[vocab, D]` output-row update.
    candidates: optional bool `[vocab]` of ids that may be words.
    rows0: θ0's output rows `[vocab, D]` (:func:`output_rows`).
    bias0: θ0's output bias `[vocab]` (:func:`output_bias`).
    q: the FDR level.
    max_drift: the bias rule's regime (:func:`drift_to_noise`) when the
      mixture does not apply. Pure noise gives about 3.1, noise-free
      updates far more; chosen on the SMS run (reports/gboard/README.md,
      "Where the constants come from").
    bias_first_drift: above this the bias rule applies even where the
      mixture would: the largest drifts (frequent untyped words) are then
      far out in the tails that a white-noise null does not model. Chosen
      on the SMS run's noisy updates, where the mixture lost to the bias
      rule at the largest drifts (the weakest single noise) and won at
      moderate ones (reports/gboard/README.md, "Where the constants come
      from"; `drift_to_noise` in its summary.json).

  Returns:
    bool `[vocab]`.
  """
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  if (rows0 is None) != (bias0 is None):
    raise LeakjaxError('pass both rows0 and bias0 (θ0) or neither')
  thr = choose_threshold(delta, 'fdr', q=q, candidates=candidates)
  if rows0 is None:
    fell = rescued_words(delta, rows, candidates)
  else:
    fell = convexity_violations(delta, rows, rows0, bias0, candidates)
  bias_words = recover_words(delta, thr, candidates) | fell
  drift = drift_to_noise(delta, candidates)

  def noisy():
    log_odds, posterior = mixture_word_posterior(delta, rows, candidates)
    mixture = log_odds > expected_f1_cut(log_odds, posterior)
    fallback = jnp.where(
      drift > max_drift, bias_words, stouffer_words(delta, rows, candidates)
    )
    return jnp.where(jnp.sum(posterior) > 0, mixture, fallback)

  # Far above the noise the mixture is not looked at: skip its EM.
  return lax.cond(drift > bias_first_drift, lambda: bias_words, noisy)


__all__ = [
  'expected_f1_cut',
  'mixture_word_posterior',
  'recover_words_auto',
]
