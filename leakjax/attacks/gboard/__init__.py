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
   :func:`thresholds.oracle_threshold` (best F1 given the true words) exists only to
   compare with.
   The tied output matrix (Sec. 3.1: "similar methods can be applied to the
   W parameters") helps twice (:func:`recover_words_auto`): without noise,
   :func:`thresholds.convexity_violations` finds typed words whose bias *fell* (the
   model already predicted them more often than they occur): for untyped
   words `log(-Δb_k) - b_k` and `Δw_k / Δb_k` are the value and gradient
   of one convex function of the word's row, and a typed word lies below
   its tangent planes. Under noise, :func:`thresholds.row_update_scores` (a
   chi-square test on the D entries of each row) adds evidence to the bias
   z-score, cut where the estimated F1 is highest
   (:func:`thresholds.max_f1_cut`).
   Which regime holds is read off the update itself
   (:func:`thresholds.drift_to_noise`).
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
5. Metrics (Sec. 4.2, in :mod:`leakjax.metrics`):
   :func:`word_metrics` (precision, recall, F1, and the F1 upper bound set
   by the vocabulary), :func:`levenshtein_ratio` (word level, 0-100) and
   :func:`best_match_ratios`.

Modules (this package exports the host rule, the kernels, the config and
the result types; the detectors' building blocks stay in their modules):

* :mod:`~leakjax.attacks.gboard.update` -- reading the update: output bias,
  tied output rows, θ snapshots, FedSGD scaling, the client;
* :mod:`~leakjax.attacks.gboard.thresholds` -- Algorithm 2, the bias
  thresholds, the row chi-square and Stouffer rules, the convexity test;
* :mod:`~leakjax.attacks.gboard.mixture` -- the Gaussian-mixture detector
  and :func:`recover_words_auto`;
* :mod:`~leakjax.attacks.gboard.reconstruct` -- the reconstruction kernel
  and the keep rules;
* :mod:`~leakjax.attacks.gboard.runner` -- the experiment on SMS messages,
  read top-down from `runner.run(config, writer)`: :class:`GboardConfig`,
  then the corpora and θ0 (:mod:`~leakjax.attacks.gboard.corpora`), the
  victim clients (:mod:`~leakjax.attacks.gboard.clients`) and the attack
  sweep (:mod:`~leakjax.attacks.gboard.sweep`);
* :mod:`~leakjax.attacks.gboard.presets` -- the named configs (`paper`,
  `strongest`).

All array functions are pure and jit-able. The parameters are explicit
arguments; the model holds none and is compared by value, so it is a
static argument of `jax.jit`. The caller owns `jit`: jit
:func:`reconstruct_sentences` with `model`, `length` and `bos_id` static,
and new θ of the same shapes reuse the compiled kernel:

>>> model, theta0 = leakjax.models.load(path)                   # doctest: +SKIP
>>> delta = bias_update(model, theta0, theta1)                  # +SKIP
>>> rows = output_rows_update(model, theta0, theta1)            # +SKIP
>>> words = recover_words_auto(delta, rows, candidate_mask(9502))  # +SKIP
>>> starts, valid = padded_indices(words)                       # +SKIP
>>> reconstruct = jax.jit(reconstruct_sentences,
...                       static_argnames=('model', 'length', 'bos_id'))
>>> out = reconstruct(model, theta0, theta1, starts, valid, words,
...                   length=4, bos_id=1)                       # +SKIP
"""

from leakjax.attacks.gboard import presets
from leakjax.attacks.gboard.mixture import recover_words_auto
from leakjax.attacks.gboard.reconstruct import (
  KEEP_RULES,
  Reconstruction,
  padded_indices,
  reconstruct_sentences,
  select_sentences,
)
from leakjax.attacks.gboard.runner import GboardConfig, GboardRun
from leakjax.attacks.gboard.thresholds import (
  THRESHOLD_RULES,
  candidate_mask,
  choose_threshold,
  recover_words,
)
from leakjax.attacks.gboard.update import (
  bias_update,
  client_config,
  load_snapshot,
  output_bias,
  output_rows,
  output_rows_update,
  save_snapshot,
  scale_update,
)

__all__ = [
  'KEEP_RULES',
  'THRESHOLD_RULES',
  'GboardConfig',
  'GboardRun',
  'Reconstruction',
  'bias_update',
  'candidate_mask',
  'choose_threshold',
  'client_config',
  'load_snapshot',
  'output_bias',
  'output_rows',
  'output_rows_update',
  'padded_indices',
  'presets',
  'reconstruct_sentences',
  'recover_words',
  'recover_words_auto',
  'save_snapshot',
  'scale_update',
  'select_sentences',
]
