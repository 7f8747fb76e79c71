"""Local search over the kept sentences (:func:`refine`): single-token
edits ranked by a linearisation of the selection's objective, then checked
exactly."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from leakjax.attacks.dager.hybrid._common import PyTree, _match
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.attacks.dager.hybrid.heads import (
  head_readout,
  pool_head_gradients,
  raw_head_rows,
)
from leakjax.attacks.dager.hybrid.selection import selection_weights
from leakjax.models.protocol import Model
from leakjax.tokenization import sentence_end_mask


@jax.jit
def match_gradient(
  total: Float[Array, 'C d'],
  target: Float[Array, 'C d'],
  weights: Float[Array, ' C'],
) -> tuple[Float[Array, ''], Float[Array, 'C d']]:
  """The selection's objective and its gradient in the raw rows.

  `m(S) = ⟨S, T⟩² / ⟨S, S⟩` with `⟨A, B⟩ = Σ_c w_c² ⟨A_c, B_c⟩`: the
  squared cosine between the weighted rows of `total` (S, the sum of the
  kept sentences' own rows) and of `target` (T, the observed ones), times
  `⟨T, T⟩` (:func:`select_from_gram` maximises the same; `−inf` where
  `⟨S, T⟩ <= 0`).
  """
  w2 = (weights.astype(jnp.float32) ** 2)[:, None]
  num = jnp.sum(w2 * total * target)
  den = jnp.maximum(jnp.sum(w2 * total * total), 1e-30)
  grad = w2 * (2.0 * num / den * target - 2.0 * num**2 / den**2 * total)
  return _match(num, den), grad


@jax.jit
def match_values(
  totals: Float[Array, 'P C d'],
  target: Float[Array, 'C d'],
  weights: Float[Array, ' C'],
) -> Float[Array, ' P']:
  """:func:`match_gradient`'s objective for each of several sums."""
  w2 = (weights.astype(jnp.float32) ** 2)[None, :, None]
  num = jnp.sum(w2 * totals * target[None], axis=(1, 2))
  den = jnp.sum(w2 * totals * totals, axis=(1, 2))
  return _match(num, den)


@functools.partial(jax.jit, static_argnames=('model',))
def edit_gains(
  model: Model,
  params: PyTree,
  tokens: Int[Array, ' L'],
  length: Int[Array, ''],
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  slot: Int[Array, ' V'],
  readout: Float[Array, 'V d'],
  direction: Float[Array, 'C d'],
) -> tuple[Float[Array, 'L C'], Float[Array, ' L']]:
  """First-order gains of one sentence's single-token edits.

  A sentence adds `h_{j−1}` (the head input after its first j tokens) to
  the raw row of its token j (:func:`sentence_head_rows`; the softmax
  part and the tied head's input part aside). With `D` the objective's
  gradient in the rows (:func:`match_gradient`) and `s[i, c] = ⟨D_c,
  h_i⟩`:

  * `sub[j, c] = s[j−1, c] − s[j−1, t_j]`: token j replaced by
    candidate c. The last token (a sentence end) only by another end,
    the others only by tokens that end no sentence;
  * `dele[j] = s[j−1, t_{j+1}] − s[j−1, t_j] − s[j, t_{j+1}]`: token j
    deleted, so `t_{j+1}` follows the shorter context; for `1 <= j <=
    length − 2` (BOS and the end stay).

  Later contexts move too; that is left to the exact check
  (:func:`refine`). Invalid edits are `−inf`. `slot[v]` is v's index
  in `candidates` (−1: none, which counts 0).
  """
  pos = jnp.arange(tokens.shape[0])
  mask = (pos < length).astype(jnp.int32)
  z = model.logits(params, tokens[None], mask[None])[0].astype(jnp.float32)
  s = (z @ readout) @ direction.T  # [L, C]
  idx = slot[tokens]

  def own(values, index):
    picked = jnp.take_along_axis(values, jnp.maximum(index, 0)[:, None], 1)
    return jnp.where(index >= 0, picked[:, 0], 0.0)

  before = jnp.roll(s, 1, axis=0)  # before[j] = s[j − 1]
  current = own(before, idx)
  last = (pos == length - 1)[:, None]
  ok = ((pos >= 1) & (pos < length))[:, None] & valid[None]
  ok = ok & jnp.where(last, is_end[None], ~is_end[None])
  ok = ok & (candidates[None] != tokens[:, None])
  sub = jnp.where(ok, before - current[:, None], -jnp.inf)
  following = jnp.roll(idx, -1)
  dele = own(before, following) - current - own(s, following)
  dele = jnp.where((pos >= 1) & (pos < length - 1), dele, -jnp.inf)
  return sub, dele


@functools.partial(jax.jit, static_argnames=('model',))
def sentence_log_probs(
  model: Model,
  params: PyTree,
  tokens: Int[Array, 'P L'],
  lengths: Int[Array, ' P'],
) -> Float[Array, ' P']:
  """Each sentence's log-probability under the model, its first token
  (BOS) given."""
  mask = (jnp.arange(tokens.shape[1])[None] < lengths[:, None]).astype(
    jnp.int32
  )
  z = model.logits(params, tokens, mask).astype(jnp.float32)
  logp = jax.nn.log_softmax(z[:, :-1], axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  return jnp.sum(picked * mask[:, 1:], axis=1)


def sentence_edits(
  sequence: Sequence[int],
  sub: np.ndarray,
  dele: np.ndarray,
  candidates: np.ndarray,
  count: int,
  min_length: int,
) -> list[list[int]]:
  """The `count` edits of `sequence` with the largest gains
  (:func:`edit_gains`), as edited sequences."""
  n = len(sequence)
  if n - 1 < min_length:
    dele = np.full_like(dele, -np.inf)
  gains = np.concatenate([sub.reshape(-1), dele])
  order = np.argsort(-gains, kind='stable')[:count]
  edits = []
  for e in order:
    if not np.isfinite(gains[e]):
      break
    edited = list(sequence)
    if e < sub.size:
      j, c = divmod(int(e), sub.shape[1])
      edited[j] = int(candidates[c])
    else:
      del edited[int(e) - sub.size]
    edits.append(edited)
  return edits


def refine(
  model: Model,
  params: PyTree,
  grads: PyTree,
  sequences: Sequence[Sequence[int]],
  *,
  padded: np.ndarray,
  valid: np.ndarray,
  config: HybridConfig,
  ends: Bool[np.ndarray, ' V'] | None = None,
  transform: Float[Array, 'd d'] | None = None,
  progress: Callable[[int, int, float], None] | None = None,
) -> tuple[list[list[int]], dict]:
  """Local search over whole sentences by exact gradient matching.

  The observed head rows are exactly the sum of the batch's sentences'
  own rows (:func:`pool_head_gradients`), so a set of recovered
  sentences can be checked as a whole: the selection's objective
  (:func:`match_gradient`) is highest at the batch itself. For
  `config.refine` sweeps, each sentence in turn: its
  `config.refine_proposals` single-token edits with the largest
  first-order gain (:func:`edit_gains`, :func:`sentence_edits`) get their
  exact rows, and the best one replaces the sentence if it raises the
  objective. Our construction (coordinate ascent over discrete edits
  ranked by a linearisation, as in HotFlip, Ebrahimi et al., ACL 2018,
  applied to a gradient-matching objective as in LAMP, Balunović et al.,
  NeurIPS 2022).

  `transform` maps every row before matching (`rows @ transform`; the
  hybrid passes :func:`head_transform` with `config.select_whiten`;
  default: none). `ends` marks the sentence-ending
  tokens (default: the tokenizer's);
  `progress(sweep, sentence, objective)` is called after each sentence.
  Sweeps stop early when one changes nothing.

  Returns:
    The refined sentences and `{'objective': [m after each sweep, the
    first before any], 'edits': [edits accepted per sweep]}`.
  """
  if ends is None:
    ends = sentence_end_mask(model.tokenizer, model.vocab_size)
  ends = np.asarray(ends, bool)
  candidates = jnp.asarray(padded)
  readout = head_readout(model, params)
  if transform is None:
    transform = jnp.eye(readout.shape[1])
  transform = jnp.asarray(transform, jnp.float32)
  observed = raw_head_rows(model, grads, candidates) @ transform
  weights = jnp.asarray(
    selection_weights(np.asarray(observed), valid, config.select_weight)
  )
  slot = np.full(model.vocab_size, -1, np.int32)
  slot[padded[valid]] = np.flatnonzero(valid)
  slot = jnp.asarray(slot)
  is_end = jnp.asarray(ends[padded] & valid)
  valid_j = jnp.asarray(valid)
  width = max(config.max_length, *map(len, sequences))
  chunk = config.refine_proposals

  def rows_of(seqs):
    tokens = np.zeros((-(-len(seqs) // chunk) * chunk, width), np.int32)
    lengths = np.full(len(tokens), len(seqs[0]), np.int32)
    for i, v in enumerate(seqs):
      tokens[i, : len(v)] = v
      lengths[i] = len(v)
    tokens[len(seqs) :] = tokens[0]
    out = []
    for i in range(0, len(tokens), chunk):
      t = jnp.asarray(tokens[i : i + chunk])
      n = jnp.asarray(lengths[i : i + chunk])
      out.append(
        (
          pool_head_gradients(model, params, t, n, candidates),
          sentence_log_probs(model, params, t, n)
          if config.refine_lm
          else jnp.zeros(len(t)),
        )
      )
    rows = jnp.concatenate([o[0] for o in out])[: len(seqs)] @ transform
    return rows, jnp.concatenate([o[1] for o in out])[: len(seqs)]

  seqs = [list(s) for s in sequences]
  own, logp = rows_of(seqs)
  total = own.sum(0)
  value, _ = match_gradient(total, observed, weights)
  info = {'objective': [float(value)], 'edits': []}
  for sweep in range(config.refine):
    accepted = 0
    for k, seq in enumerate(seqs):
      value, direction = match_gradient(total, observed, weights)
      tokens = np.zeros(width, np.int32)
      tokens[: len(seq)] = seq
      sub, dele = edit_gains(
        model,
        params,
        jnp.asarray(tokens),
        jnp.asarray(len(seq), jnp.int32),
        candidates,
        valid_j,
        is_end,
        slot,
        readout,
        direction @ transform.T,
      )
      edits = sentence_edits(
        seq,
        np.asarray(sub),
        np.asarray(dele),
        padded,
        config.refine_proposals,
        config.min_length,
      )
      if edits:
        rows, lp = rows_of(edits)
        values = np.asarray(
          match_values(total[None] - own[k][None] + rows, observed, weights)
        )
        with np.errstate(divide='ignore', invalid='ignore'):
          gain = np.log(values / float(value))
        gain = gain + config.refine_lm * (np.asarray(lp) - float(logp[k]))
        gain = np.where(values > 0, gain, -np.inf)
        best = int(np.argmax(gain))
        if gain[best] > 1e-6:
          total = total - own[k] + rows[best]
          own = own.at[k].set(rows[best])
          logp = logp.at[k].set(lp[best])
          seqs[k] = edits[best]
          accepted += 1
      if progress is not None:
        progress(sweep, k, float(value))
    value, _ = match_gradient(total, observed, weights)
    info['objective'].append(float(value))
    info['edits'].append(accepted)
    if not accepted:
      break
  return seqs, info
