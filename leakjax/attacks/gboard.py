r"""The GBoard next-word-prediction attack (Suliman & Leith, "Two Models are
Better than One: Federated Learning Is Not Private For Google GBoard Next
Word Prediction").

An honest-but-curious server holds the global CIFG-LSTM θ0 and a client's
locally trained θ1 (Sec. 2.2). Everything here reads only those two:

1. Word recovery (Sec. 3.1, Algorithm 2). With `z_t = W h_t + b`, the
   gradient of the summed cross-entropy w.r.t. the output bias is
   `sum_t (p_t - y_t)`: positive at every untyped word, negative at a typed
   word unless the model already predicts it more often than it occurs.
   After gradient descent the bias *rose* at the typed words, so
   :func:`recover_words` returns `{k : (b1 - b0)_k > threshold}`.
   Sign note: Algorithm 2 is printed as `{i | d_i < 0}`, `d = θ1 − θ0`, but
   its Table 1 lists `(θ1 − θ0)_i ≈ -0.000995 = η (p - 1)` at the typed words,
   i.e. the value of the gradient step `θ0 − θ1`; both name the same words
   as our `b1 - b0 > 0`.
2. Noise-robust recovery (Sec. 6.1). Local DP noise (Algorithms 3, 4) makes
   about half of the untyped words positive. Sec. 6.1 cuts them with a
   magnitude threshold read off a plot (Fig. 5b); we choose it without the
   true words (:func:`choose_threshold`): the untyped words are the bulk of
   the 9502 entries, so their noise is estimated robustly (median, and
   1.4826 x the median absolute deviation), and the threshold is
   - 'fdr': Benjamini-Hochberg at level `q` on the one-sided Gaussian
     p-values `1 - Φ((d - median) / scale)`: the lowest cut whose expected
     share of false words among the recovered is at most `q`;
   - 'universal': `median + scale * sqrt(2 ln V)` (Donoho & Johnstone), at
     which pure noise exceeds the cut about once in ten draws of V words;
   never below 0 (Algorithm 2's own cut). Without noise the scale is the
   tiny spread of the untyped words' drift `-η Σ p`, so both rules stay
   near Algorithm 2. Both assume that the typed words are a minority of
   the vocabulary (GBoard: at most a few hundred of 9502).
   :func:`oracle_threshold` (best F1 given the true words) exists only to
   compare with.
   The tied output matrix (Sec. 3.1: "similar methods can be applied to the
   W parameters") helps twice (:func:`recover_words_auto`): without noise,
   :func:`convexity_violations` finds typed words whose bias *fell* (the
   model already predicted them more often than they occur): for untyped
   words `log(-Δb_k) - b_k` and `Δw_k / Δb_k` are the value and gradient
   of one convex function of the word's row, and a typed word lies below
   its tangent planes. Under noise, :func:`row_update_scores` (a
   chi-square test on the D entries of each row) adds evidence to the bias
   z-score, cut where the estimated F1 is highest (:func:`max_f1_cut`).
   Which regime holds is read off the update itself
   (:func:`drift_to_noise`).
3. Sentence reconstruction (Sec. 3.2). From `<S>` and each recovered word,
   θ1 predicts the next word; the prediction is restricted (renormalised)
   to the recovered words and the most likely one appended, until `length`
   words. :func:`reconstruct_sentences` does this for all start words as
   one batched kernel (one `lax.scan` over the model's decode cache) and
   scores every candidate in the same call by the relative change of its
   log-perplexity, `(PP_θ0 − PP_θ1) / PP_θ0` (Sec. 3.2). FedSGD updates
   can be extrapolated first, `θ1 + s (θ1 − θ0)` (Sec. 4.3.2,
   :func:`scale_update`).
4. Which candidates to keep (Sec. 4.1 keeps the top n_k, which the server
   does not know): :func:`select_sentences` with 'cover' (walk down the
   ranking, keep a candidate when it uses a recovered word that no kept
   candidate uses yet, stop when every recovered word is used), 'words'
   (the top `ceil(|recovered| / length)`) or 'gap' (the group above the
   largest split of the scores).
5. Metrics (Sec. 4.2): :func:`word_metrics` (precision, recall, F1, and the
   F1 upper bound set by the vocabulary), :func:`levenshtein_ratio` (word
   level, 0-100) and :func:`best_match_ratios`.

All array functions are pure and jit-able; the caller owns `jit`:

>>> delta = bias_update(model, theta0, theta1)                  # doctest: +SKIP
>>> rows = output_rows_update(model, theta0, theta1)            # +SKIP
>>> words = recover_words_auto(delta, rows, candidate_mask(9502))  # +SKIP
>>> starts, valid = padded_indices(words)                       # +SKIP
>>> out = jax.jit(functools.partial(reconstruct_sentences, model,
...                                 length=4, bos_id=1))(
...     theta0, theta1, starts, valid, words)                   # +SKIP

Cost of :func:`reconstruct_sentences` for M start words, V words, D = 96,
U = 670 units: `length + 1` decode steps of `M` rows on θ1
(`2 M (3 U (D + D) + U D + D V)` FLOPs each, the `D V` output layer
dominating) and one forward pass of `M x (length + 1)` tokens on each of θ0
and θ1 for the scores.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from leakjax import fl
from leakjax.errors import LeakjaxError
from leakjax.models.base import Model, get_path

PyTree = Any
THRESHOLD_RULES = ('zero', 'fdr', 'universal', 'maxf1')
KEEP_RULES = ('cover', 'words', 'gap')
_MAD_TO_STD = 1.482602218505602  # 1 / Φ^{-1}(3/4): MAD -> Gaussian std


# ------------------------------------------------------------- the update
def _require_bias(model: Model) -> None:
  if model.paths.output_bias is None:
    raise LeakjaxError(
      f'a {model.family} model has no output bias to read words from',
      'use a CIFG-LSTM / LSTM model (leakjax.models.lstm)',
    )


def bias_update(model: Model, params0: PyTree, params1: PyTree) -> jax.Array:
  """`b1 - b0`, the output-bias change, float32 `[vocab]` (Algorithm 2's d).

  Args:
    model: a model with an output bias (`model.paths.output_bias`).
    params0: the global parameters θ0.
    params1: the client's parameters θ1 (or θ0 + a transmitted update).

  Returns:
    float32 `[vocab]`; positive entries are the candidate typed words.
  """
  _require_bias(model)
  path = model.paths.output_bias
  return get_path(params1, path).astype(jnp.float32) - get_path(
    params0, path
  ).astype(jnp.float32)


def output_rows(model: Model, params: PyTree) -> jax.Array:
  """The output matrix as rows per word, float32 `[vocab, D]`.

  The tied matrix is the word embedding; an untied head (`[D, vocab]`) is
  transposed so that row k always belongs to word k.
  """
  if model.paths.lm_head is None:
    return get_path(params, model.paths.word_embeddings).astype(jnp.float32)
  return get_path(params, model.paths.lm_head).astype(jnp.float32).T


def output_bias(model: Model, params: PyTree) -> jax.Array:
  """The output bias, float32 `[vocab]`."""
  _require_bias(model)
  return get_path(params, model.paths.output_bias).astype(jnp.float32)


def output_rows_update(
  model: Model, params0: PyTree, params1: PyTree
) -> jax.Array:
  """`W1 - W0` of the output matrix as rows per word, float32 `[vocab, D]`."""
  return output_rows(model, params1) - output_rows(model, params0)


def scale_update(params0: PyTree, params1: PyTree, scale: float) -> PyTree:
  """`θ1 + s (θ1 − θ0)` (Sec. 4.3.2): for FedSGD a step of `η (1 + s)`."""
  return jax.tree.map(lambda a, b: b + scale * (b - a), params0, params1)


def client_config(
  epochs: int,
  batch_size: int | None,
  *,
  learning_rate: float = 1e-3,
  words_per_sentence: int = 1,
  step_noise: float = 0.0,
  update_noise: float = 0.0,
) -> fl.ClientConfig:
  """The client of Sec. 4.1 / 6 as a :class:`leakjax.fl.ClientConfig`.

  :func:`leakjax.fl.client_update` minimises the mean cross-entropy over
  all target words of a batch. Sec. 3.1 writes the loss of a text as the
  *sum* over its words, `J_{1:T} = Σ_t J_t` (and Table 1's update
  `η (p - 1)` per word of a one-sentence batch is that sum's step). For
  sentences of exactly `T = words_per_sentence` targets, the sum per
  sentence averaged over the batch is `T` times the token mean, so SGD with
  `η T` on the token mean is that loss with `η`; Algorithm 3's noise
  `η N(0, σ)` then needs `σ / T` on the gradient. `words_per_sentence=1`
  is the plain token mean.

  Args:
    epochs: E.
    batch_size: B sentences; None is the whole dataset.
    learning_rate: η (Sec. 4.1: 0.001).
    words_per_sentence: T, see above.
    step_noise: σ of Algorithm 3 ("DPSGD-like": θ ← θ − η∇ℓ + η N(0, σ)).
    update_noise: σ of Algorithm 4 ("single noise": θ1 + N(0, σ)).

  Returns:
    A ClientConfig with plain SGD.
  """
  if words_per_sentence < 1:
    raise LeakjaxError(
      f'words_per_sentence must be >= 1, got {words_per_sentence}'
    )
  defense = fl.Defense(
    step_noise_std=step_noise / words_per_sentence,
    update_noise_std=update_noise,
  )
  return fl.ClientConfig(
    epochs=epochs,
    batch_size=batch_size,
    learning_rate=learning_rate * words_per_sentence,
    defense=defense,
  )


# ---------------------------------------------------------- word recovery
def candidate_mask(
  vocab_size: int, special_ids: Sequence[int] = (0, 1)
) -> jax.Array:
  """bool `[vocab]`: False at ids that are no words (`<UNK>`, `<S>`)."""
  mask = jnp.ones((vocab_size,), bool)
  if special_ids:
    mask = mask.at[jnp.asarray(list(special_ids))].set(False)
  return mask


def recover_words(
  delta: jax.Array,
  threshold: jax.Array | float = 0.0,
  candidates: jax.Array | None = None,
) -> jax.Array:
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
  delta: jax.Array, candidates: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
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
  delta: jax.Array,
  rule: str = 'fdr',
  *,
  q: float = 0.05,
  candidates: jax.Array | None = None,
  eligible: jax.Array | None = None,
) -> jax.Array:
  """A word threshold for :func:`recover_words` that needs no true words.

  Args:
    delta: `b1 - b0`, float `[vocab]`.
    rule: 'zero' (Algorithm 2), 'fdr' (Benjamini-Hochberg at level `q` on
      the Gaussian p-values of the robust z-scores), 'universal'
      (`median + scale * sqrt(2 ln V)`); see the module docstring; or
      'maxf1': the cut that maximises the *estimated* F1 under the same
      Gaussian null. Above a cut t, `k(t)` entries pass and
      `V Φ(-t)` of them are expected from the null, so
      `TP(t) ≈ k(t) - V Φ(-t)`; the number of typed words is estimated as
      `n1 = max_t TP(t)` and the cut maximises
      `2 TP(t) / (k(t) + n1)` (:func:`max_f1_cut`, TP less 3 null standard
      deviations). Unlike 'fdr' (precision >= 1 - q) it trades
      precision for recall when the typed words sit only 2-4 noise scales
      up (local DP noise).
    q: the false-discovery level of 'fdr'.
    candidates: optional bool `[vocab]` of ids that may be words; the noise
      and the number of tests V are taken over them.
    eligible: optional bool `[vocab]`: only these entries are counted in
      `k(t)` for 'maxf1' (e.g. `b1 - b0 > 0` when ranking a combined
      score whose words must also have a rising bias).

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
  if rule == 'maxf1':
    cut = max_f1_cut((delta - center) / scale, candidates, eligible)
    return jnp.maximum(center + scale * cut, 0.0)
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
  z: jax.Array,
  candidates: jax.Array | None = None,
  eligible: jax.Array | None = None,
  *,
  slack: float = 3.0,
) -> jax.Array:
  """The cut on z-scores that maximises the estimated F1 (N(0, 1) null).

  Above a cut t, `k(t)` eligible entries pass and `V Φ(-t)` are expected
  from the null (V = number of candidates), so `TP(t) ≈ k(t) - V Φ(-t)`;
  the number of typed words is estimated as `n1 = max_t TP(t)` and the
  cut maximises `2 TP(t) / (k(t) + n1)`. `TP(t)` is taken `slack` null
  standard deviations low (`- slack sqrt(V Φ(-t))`): without it, pure
  noise passes hundreds of entries (the excess wanders up near t = 2);
  with 3, 20 draws of 9500 N(0, 1) entries passed 0-5 (2: up to 2845).
  Returns +inf when no cut has a positive estimate. See
  :func:`choose_threshold`'s 'maxf1'.

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
  rows: jax.Array, candidates: jax.Array | None = None
) -> jax.Array:
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
  delta: jax.Array, rows: jax.Array, fit: jax.Array
) -> jax.Array:
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
  delta: jax.Array,
  rows: jax.Array,
  candidates: jax.Array | None = None,
  *,
  gate: float = 30.0,
  z: float = 5.0,
  min_pool: int = 20,
) -> jax.Array:
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
  set on FedSGD/FedAvg updates of SMS datasets (n_k 16-256): they rescued
  0-19 missed typed words per dataset at the cost of 0-2 untyped ones.

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
  delta: jax.Array,
  rows: jax.Array,
  rows0: jax.Array,
  bias0: jax.Array,
  candidates: jax.Array | None = None,
  *,
  num_sources: int = 64,
  margin: float = 0.3,
  gate: float = 10.0,
) -> jax.Array:
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
  noise the set is (nearly) empty. On the 28 noise-free SMS updates of
  reports/gboard (n_k 16-256, FedSGD and FedAvg E <= 1000, B full/32) it
  flagged 0-55 missed typed words per update at the cost of 0-9 untyped
  ones, raising the worst F1 / upper bound from 0.935 to 0.970. The
  defaults were chosen there (the true words only score the choice, never
  enter the rule); the worst F1 / upper over those updates for other
  settings: num_sources 32 / 128: 0.969 / 0.973; margin 0.2 / 0.5: 0.975
  / 0.944; gate 30: 0.960.

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
  delta: jax.Array, candidates: jax.Array | None = None
) -> jax.Array:
  """`(median - 10th smallest) / scale` of `delta`: is drift above noise?

  Pure Gaussian noise gives about 3.3 (V = 9502); without noise the
  frequent untyped words' drift `-η Σ p` is thousands of noise scales.
  """
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = robust_noise_scale(delta, candidates)
  values = jnp.sort(jnp.where(candidates, delta.astype(jnp.float32), jnp.inf))
  return (center - values[jnp.minimum(9, delta.shape[0] - 1)]) / scale


def stouffer_scores(
  delta: jax.Array, rows: jax.Array, candidates: jax.Array | None = None
) -> jax.Array:
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
  delta: jax.Array, rows: jax.Array, candidates: jax.Array | None = None
) -> jax.Array:
  """bool `[vocab]`: :func:`stouffer_scores` cut by :func:`max_f1_cut`
  among the words whose bias rose (the noisy-regime rule up to session 3,
  now :func:`recover_words_auto`'s fallback when the mixture sees no
  low-rank signal; on pure noise it keeps 0-5 of 9500 words)."""
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  combined = stouffer_scores(delta, rows, candidates)
  rose = delta > 0
  thr = max_f1_cut(combined, candidates, rose)
  return recover_words(combined, thr, candidates) & rose


def _gaussian_loglik(
  y: jax.Array, mean: jax.Array, cov: jax.Array
) -> jax.Array:
  """`log N(y; mean, cov)` up to the shared `-d/2 log 2π`, rows of y."""
  chol = jnp.linalg.cholesky(cov)
  sol = jax.scipy.linalg.solve_triangular(chol, (y - mean).T, lower=True)
  return -0.5 * jnp.sum(sol**2, 0) - jnp.sum(jnp.log(jnp.diag(chol)))


def mixture_word_posterior(
  delta: jax.Array,
  rows: jax.Array,
  candidates: jax.Array | None = None,
  *,
  init_fraction: float = 0.05,
  min_signal: float = 2.0,
  num_iters: int = 200,
  tol: float = 1e-5,
) -> tuple[jax.Array, jax.Array]:
  """Log-odds and posterior that each word was typed, under local DP noise.

  The bias alone carries little of a typed word's signal under Algorithm
  3's noise: on the SMS updates (DPSGD-like σ = 0.1, n_k = 256, B = 32,
  E = 50) the noise-free update of a typed word is a median 7.7 noise
  standard deviations long, and only ~1 % of its squared length is in the
  bias; the rest is in the word's D = 96 tied output-row entries, and
  across typed words it lies in a ~10-dimensional subspace (93 % of the
  energy in 10 principal directions; the hidden states that predicted the
  words share a direction). A chi-square over all 96 entries
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
     typed (all log-odds -inf): pure Gaussian noise gives 0.99-1.00 x, the
     SMS σ = 0.1 updates 1.00-1.03 x at E = 1 (where even a detector told
     each typed word's noise-free direction reaches only 0.34-0.47 x the
     F1 upper bound) and 3.3-5.2 x at E = 50; without the guard the
     mixture fits the tails of pure noise and keeps ~700-1000 words.
     Nor when the bulk is not Gaussian: the 90th percentile of the
     words' mean squared standardised entry must be below 2 x that of
     chi2(D + 1) / (D + 1) (SMS DP updates with σ >= 0.01: 1.0-1.3 x;
     noise-free updates: 100-20000 x, where a mixture with a white null
     kept 0.41 x the upper bound on a small model).
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
  of the bias): on the SMS σ = 0.1 updates this lifted F1 / upper bound at
  n_k = 64, B = 32, E = 50 / 100 from 0.888 / 0.917 (bias + row
  chi-square, Stouffer) to 0.954 / 0.991, and at n_k = 256 from
  0.537 / 0.725 to 0.818 / 0.867 (reports/gboard/README.md). Three or
  more free components fitted n_k = 256 better and n_k = 16 worse, so two
  are used.

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
  # only) put their 90th percentile at 100-20000 x that.
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


def expected_f1_cut(scores: jax.Array, posterior: jax.Array) -> jax.Array:
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
  delta: jax.Array,
  rows: jax.Array,
  candidates: jax.Array | None = None,
  *,
  rows0: jax.Array | None = None,
  bias0: jax.Array | None = None,
  q: float = 0.05,
  max_drift: float = 8.0,
  bias_first_drift: float = 50.0,
) -> jax.Array:
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
    biases (on pure noise it keeps 0-5 of 9500 words).

  The mixture replaced (session 4) the Stouffer rule as the noisy-regime
  rule: the chi-square spreads the row signal over all D entries. On the
  SMS DPSGD-like σ = 0.1 updates (reports/gboard/noise_detectors) F1 /
  upper went from 0.888 / 0.917 to 0.954 / 0.991 at n_k = 64, B = 32,
  E = 50 / 100 and from 0.537 / 0.725 to 0.818 / 0.867 at n_k = 256
  (n_k = 16, E = 50 / 100 / 1000: 0.982 / 0.991 / 0.912 -> 0.973 / 0.965 /
  0.982). The mixture assumes the typed words' row updates share a few
  directions (true of the LSTM's hidden states); signal spread evenly over
  all D entries is left to the chi-square. Noise-free updates fail the
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
      mixture does not apply. Pure noise gives ~3.3, noise-free updates
      thousands; on the SMS sweep the bias rule beat the chi-square rule
      above ~9.
    bias_first_drift: above this the bias rule applies even where the
      mixture would: the largest drifts (frequent untyped words) are then
      far out in the tails that a white-noise null does not model. On the
      SMS sweep (202 noisy rows) the mixture lost to the bias rule above
      ~100 (single noise σ = 1e-5, n_k = 32, E = 50: 0.918 against 0.990)
      and won at 12-40 (DPSGD-like σ = 0.01, n_k = 256, E = 50 / 100:
      0.981 / 0.977 against 0.866 / 0.892).

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


# --------------------------------------------------- sentence generation
@struct.dataclass
class Reconstruction:
  """Candidate sentences from every start word, with their scores."""

  tokens: jax.Array  # int32 [M, length + 1]: <S>, start word, greedy words
  log_ppl0: jax.Array  # float32 [M]: PP_θ0, summed -log p over length words
  log_ppl1: jax.Array  # float32 [M]: PP_θ1 (the generating parameters)
  scores: jax.Array  # float32 [M]: (PP_θ0 - PP_θ1) / PP_θ0; -inf if invalid


def padded_indices(
  mask: np.ndarray | jax.Array, size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """The True indices of a bool mask, padded to a fixed `size` (host side).

  Returns `(indices int32 [size], valid bool [size])`; padded slots hold
  index 0 and valid False. `size` defaults to the next power of two >= the
  count, so that jitted kernels see few distinct shapes.
  """
  idx = np.flatnonzero(np.asarray(mask)).astype(np.int32)
  if size is None:
    size = 1 << max(int(math.ceil(math.log2(max(len(idx), 1)))), 0)
  if len(idx) > size:
    raise LeakjaxError(
      f'{len(idx)} recovered words do not fit size={size}', 'raise the size'
    )
  out = np.zeros((size,), np.int32)
  out[: len(idx)] = idx
  valid = np.arange(size) < len(idx)
  return out, valid


def greedy_generate(
  model: Model,
  params: PyTree,
  start_words: jax.Array,
  allowed: jax.Array,
  *,
  length: int,
  bos_id: int,
) -> jax.Array:
  """Sec. 3.2 greedy continuation of `<S> w` for many start words at once.

  At each step the next-word distribution of `params` is restricted to the
  `allowed` words and renormalised; its most likely word is appended (the
  renormalisation does not move the argmax, so the masked argmax of the
  logits is taken). One prefill of `[<S>, w]` and one `lax.scan` over the
  remaining `length - 1` words, all start words in one batch.

  Args:
    model: the model (its `init_cache` / `decode`).
    params: θ1 (possibly scaled).
    start_words: int32 `[M]`, the first word of each candidate.
    allowed: bool `[vocab]`, the recovered words.
    length: words per sentence, the start word included.
    bos_id: the `<S>` id.

  Returns:
    int32 `[M, length + 1]`: `<S>`, the start word, `length - 1` words.
  """
  if length < 1:
    raise LeakjaxError(f'length must be >= 1, got {length}')
  num = start_words.shape[0]
  start_words = start_words.astype(jnp.int32)
  prompt = jnp.stack([jnp.full((num,), bos_id, jnp.int32), start_words], 1)
  cache = model.init_cache(num, length + 1)
  logits, cache = model.decode(params, prompt, cache)  # [M, 2, V]
  if length == 1:
    return prompt
  neg = jnp.finfo(jnp.float32).min

  def step(carry, _):
    last, cache = carry  # last: float32 [M, V], logits of the next word
    masked = jnp.where(allowed[None, :], last.astype(jnp.float32), neg)
    word = jnp.argmax(masked, axis=-1).astype(jnp.int32)  # [M]
    logits, cache = model.decode(params, word[:, None], cache)  # [M, 1, V]
    return (logits[:, 0], cache), word

  # The last decode of the scan is not needed; it keeps one scan body.
  _, words = lax.scan(step, (logits[:, -1], cache), None, length=length - 1)
  return jnp.concatenate([prompt, words.T], axis=1)  # [L-1, M] -> [M, L-1]


def relative_perplexity_change(
  model: Model, params0: PyTree, params1: PyTree, tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(PP0, PP1, (PP0 - PP1) / PP0)` of `[M, T]` token rows (Sec. 3.2).

  `PP_θ(x_0..x_t) = Σ_{i=1..t} -log Pr(x_i | x_<i; θ)`, the summed
  log-perplexity of every token after the first (`<S>`).
  """
  pp0 = -model.token_log_probs(params0, tokens).sum(-1)
  pp1 = -model.token_log_probs(params1, tokens).sum(-1)
  return pp0, pp1, (pp0 - pp1) / pp0


def reconstruct_sentences(
  model: Model,
  params0: PyTree,
  params1: PyTree,
  start_words: jax.Array,
  valid: jax.Array,
  allowed: jax.Array,
  *,
  length: int,
  bos_id: int,
) -> Reconstruction:
  """Sec. 3.2: one greedy candidate per recovered word, scored, in one kernel.

  Args:
    model: the model.
    params0: θ0, for the score.
    params1: θ1 (or the scaled `θ1 + s (θ1 - θ0)`), generates and scores.
    start_words: int32 `[M]` recovered words (e.g. :func:`padded_indices`).
    valid: bool `[M]`; False slots are padding (score -inf).
    allowed: bool `[vocab]`, the recovered words.
    length: words per sentence (Sec. 4.1: 4).
    bos_id: the `<S>` id.

  Returns:
    A :class:`Reconstruction` (rank by `scores`, descending).
  """
  tokens = greedy_generate(
    model, params1, start_words, allowed, length=length, bos_id=bos_id
  )
  pp0, pp1, score = relative_perplexity_change(model, params0, params1, tokens)
  score = jnp.where(valid, score, -jnp.inf)
  return Reconstruction(tokens=tokens, log_ppl0=pp0, log_ppl1=pp1, scores=score)


def select_sentences(
  tokens: np.ndarray,
  scores: np.ndarray,
  recovered: np.ndarray,
  *,
  rule: str = 'cover',
  length: int | None = None,
) -> np.ndarray:
  """Which candidates to keep, without knowing n_k (host side).

  Args:
    tokens: int `[M, length + 1]` candidates (`Reconstruction.tokens`).
    scores: float `[M]` (`Reconstruction.scores`; -inf = padding).
    recovered: bool `[vocab]` recovered words, or their int ids.
    rule: 'cover': walk down the ranking and keep a candidate when it uses
      a recovered word that no kept candidate uses yet; stop once every
      recovered word is used. A client's sentences use every word it typed,
      so their set covers the recovered words. 'words': the top
      `ceil(|recovered| / length)` (as many sentences as the words fill).
      'gap': the top candidates above the largest split of the sorted
      scores (Otsu: the cut maximising the between-group variance of the
      scores), i.e. the group whose perplexity fell most.
    length: words per sentence (for 'words'; default `tokens.shape[1] - 1`).

  Returns:
    int64 indices of the kept candidates, best first.
  """
  if rule not in KEEP_RULES:
    raise LeakjaxError(
      f'unknown keep rule {rule!r}', f'use one of {", ".join(KEEP_RULES)}'
    )
  scores = np.asarray(scores, np.float64)
  order = np.argsort(-scores, kind='stable')
  order = order[np.isfinite(scores[order])]
  recovered = np.asarray(recovered)
  ids = (
    np.flatnonzero(recovered)
    if recovered.dtype == bool
    else recovered.astype(np.int64)
  )
  tokens = np.asarray(tokens)
  if rule == 'words':
    length = length or tokens.shape[1] - 1
    return order[: math.ceil(len(ids) / length)]
  if rule == 'gap':
    return order[: _otsu_count(scores[order])]
  remaining = set(int(i) for i in ids)
  kept = []
  for c in order:
    if not remaining:
      break
    words = set(int(t) for t in tokens[c, 1:])
    if words & remaining:
      kept.append(int(c))
      remaining -= words
  return np.asarray(kept, np.int64)


def _otsu_count(sorted_desc: np.ndarray) -> int:
  """Size of the upper group of the best two-group split of the values."""
  n = len(sorted_desc)
  if n < 2:
    return n
  x = sorted_desc
  csum = np.cumsum(x)
  k = np.arange(1, n)  # upper group = first k values
  mean_hi = csum[:-1] / k
  mean_lo = (csum[-1] - csum[:-1]) / (n - k)
  between = k * (n - k) * (mean_hi - mean_lo) ** 2
  return int(k[np.argmax(between)])


# ----------------------------------------------------------------- metrics
@dataclasses.dataclass(frozen=True)
class WordMetrics:
  """Word recovery quality (Sec. 4.2), over distinct words."""

  precision: float
  recall: float
  f1: float
  f1_upper: float  # F1 of a perfect attack: every true in-vocabulary word
  coverage: float  # share of the true words that are in the vocabulary
  num_recovered: int
  num_true: int


def _f1(p: float, r: float) -> float:
  return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def word_metrics(
  recovered: Sequence[str],
  true_words: Sequence[str],
  vocabulary: Sequence[str] | set[str],
) -> WordMetrics:
  """Precision, recall and F1 of recovered words against the true words.

  Args:
    recovered: the recovered words (strings; duplicates ignored).
    true_words: the words of the client's sentences as the tokenizer splits
      them (duplicates ignored), in or out of the vocabulary.
    vocabulary: the model's words. Out-of-vocabulary words can only come
      back as `<UNK>`, so recall is at most `coverage` = |true ∩ vocab| /
      |true| and F1 at most `f1_upper = 2 c / (1 + c)` (Sec. 4.3.1).

  Returns:
    :class:`WordMetrics`.
  """
  rec, true = set(recovered), set(true_words)
  vocab = vocabulary if isinstance(vocabulary, set) else set(vocabulary)
  hits = len(rec & true)
  precision = hits / len(rec) if rec else 0.0
  recall = hits / len(true) if true else 0.0
  coverage = len(true & vocab) / len(true) if true else 0.0
  return WordMetrics(
    precision=precision,
    recall=recall,
    f1=_f1(precision, recall),
    f1_upper=_f1(1.0, coverage),
    coverage=coverage,
    num_recovered=len(rec),
    num_true=len(true),
  )


def oracle_threshold(
  delta: np.ndarray,
  words: Sequence[str],
  true_words: Sequence[str],
  candidates: np.ndarray | None = None,
) -> tuple[float, float]:
  """The threshold with the best F1 given the true words (comparison only).

  Args:
    delta: `[vocab]` scores (`b1 - b0`).
    words: the vocabulary, `words[k]` the string of id k.
    true_words: the client's words.
    candidates: optional bool `[vocab]` of ids that may be recovered.

  Returns:
    `(threshold, f1)`: keeping `delta > threshold` gives that F1; the
    threshold lies halfway between the last kept and the first dropped.
  """
  delta = np.asarray(delta, np.float64)
  ok = (
    np.ones(delta.shape, bool)
    if candidates is None
    else np.asarray(candidates, bool)
  )
  idx = np.flatnonzero(ok)
  order = idx[np.argsort(-delta[idx], kind='stable')]
  true = set(true_words)
  hit = np.array([words[k] in true for k in order], np.float64)
  tp = np.cumsum(hit)
  k = np.arange(1, len(order) + 1)
  precision, recall = tp / k, tp / max(len(true), 1)
  f1 = np.where(
    tp > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-300), 0.0
  )
  best = int(np.argmax(f1))
  nxt = (
    delta[order[best + 1]]
    if best + 1 < len(order)
    else delta[order[best]] - 1.0
  )
  return float(0.5 * (delta[order[best]] + nxt)), float(f1[best])


def levenshtein_distance(
  a: Sequence[Any], b: Sequence[Any], *, substitution_cost: int = 2
) -> int:
  """Word-level edit distance (insert/delete 1, substitute `substitution_cost`).

  With the default cost 2 this is the InDel distance behind the usual
  "Levenshtein ratio" (python-Levenshtein's `ratio`, RapidFuzz's
  `fuzz.ratio`); cost 1 gives the classic Levenshtein distance.
  """
  prev = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    cur = [i] + [0] * len(b)
    for j, y in enumerate(b, 1):
      cur[j] = min(
        prev[j] + 1,
        cur[j - 1] + 1,
        prev[j - 1] + (0 if x == y else substitution_cost),
      )
    prev = cur
  return prev[-1]


def levenshtein_ratio(a: Sequence[Any], b: Sequence[Any]) -> float:
  """Sec. 4.2's word-level Levenshtein ratio, 0 (disjoint) to 100 (equal).

  `100 * (1 - d / (|a| + |b|))` with `d` the word-level distance whose
  substitutions cost 2 (i.e. `200 * LCS / (|a| + |b|)`), the definition of
  python-Levenshtein's `ratio`, applied to words instead of characters.

  >>> levenshtein_ratio('how are you doing'.split(), 'how are you'.split())
  85.71428571428571
  """
  total = len(a) + len(b)
  if total == 0:
    return 100.0
  return 100.0 * (1.0 - levenshtein_distance(a, b) / total)


def best_match_ratios(
  candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]]
) -> np.ndarray:
  """For each candidate, its best :func:`levenshtein_ratio` over references.

  Sec. 4.2 / Fig. 3: the mean of this over the reconstructed sentences is
  the reported Levenshtein ratio. Swap the arguments for the recall view
  (each true sentence's best reconstruction).
  """
  if not references:
    return np.zeros((len(candidates),))
  refs = [tuple(r) for r in references]
  return np.array(
    [max(levenshtein_ratio(c, r) for r in refs) for c in candidates], np.float64
  )


__all__ = [
  'Reconstruction',
  'WordMetrics',
  'best_match_ratios',
  'bias_update',
  'candidate_mask',
  'choose_threshold',
  'client_config',
  'convexity_violations',
  'drift_to_noise',
  'greedy_generate',
  'levenshtein_distance',
  'levenshtein_ratio',
  'max_f1_cut',
  'oracle_threshold',
  'output_bias',
  'output_rows',
  'output_rows_update',
  'padded_indices',
  'reconstruct_sentences',
  'recover_words',
  'recover_words_auto',
  'rescued_words',
  'row_residual_scores',
  'select_sentences',
  'relative_perplexity_change',
  'robust_noise_scale',
  'row_update_scores',
  'scale_update',
  'word_metrics',
]
