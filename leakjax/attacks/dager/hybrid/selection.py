"""The selection: which searched sentences (or their cuts, or other beams)
the batch holds, chosen by matching the observed head gradient with the
sum of the sentences' own (:func:`select_from_gram`; our construction, in
the spirit of LAMP's gradient-matching selection, Balunović et al.,
NeurIPS 2022)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jaxtyping import Array, Float, Int

from leakjax._jit import jitted
from leakjax.attacks.dager.hybrid._common import PyTree, _match
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.attacks.dager.hybrid.heads import (
  pool_head_gradients,
  raw_head_rows,
)
from leakjax.attacks.dager.pipeline import head_path
from leakjax.models.protocol import Model, get_path
from leakjax.tokenization import sentence_end_mask


def select_by_gradient(
  features: Float[Array, 'P F'],
  target: Float[Array, ' F'],
  k: int,
  *,
  max_swaps: int | None = None,
  groups: Int[Array, ' P'] | None = None,
) -> Int[Array, ' k']:
  """`k` rows whose sum best matches `target` in direction.

  The objective is `cos(target, Σ_chosen features)` (the least-squares fit
  with a free scale: the batch's number of targets is unknown), so a
  near-copy of a chosen sentence, which would count its contexts twice,
  loses to a sentence that explains new ones. See :func:`select_from_gram`
  (this computes its Gram matrix and projections). Pure, `k` and
  `max_swaps` static:

  >>> select = jax.jit(select_by_gradient, static_argnames=('k', 'max_swaps'))
  >>> chosen = select(features, target, 3)                    # doctest: +SKIP

  Returns:
    int32 `[k]`, the chosen rows in increasing order.
  """
  features = features.astype(jnp.float32)
  return select_from_gram(
    features @ features.T,
    features @ target.astype(jnp.float32),
    k,
    max_swaps=max_swaps,
    groups=groups,
  )


def select_from_gram(
  gram: Float[Array, 'P P'],
  along: Float[Array, ' P'],
  k: int,
  *,
  max_swaps: int | None = None,
  groups: Int[Array, ' P'] | None = None,
) -> Int[Array, ' k']:
  """:func:`select_by_gradient` from `gram = F Fᵀ` and `along = F t`.

  Greedy forward selection, then single swaps (one chosen row for one
  other) while the best swap improves the objective, at most `max_swaps`
  (default `k`) times: greedy alone can take a near-copy first and then
  never the original. `O(k P)` per greedy step, `O(P^2)` per swap; the
  caller may build `gram` in blocks when the features do not fit. Pure,
  `k` and `max_swaps` static (:func:`select_pool` jits it).

  Args:
    gram: `F Fᵀ`.
    along: `F t`.
    k: rows to choose.
    max_swaps: at most this many swaps (default `k`).
    groups: int32 `[P]` in `[0, P)`: at most one row of each group is
      chosen (a swap may trade a row for another of its own group); the
      caller makes sure at least `k` groups exist. None: every row is its
      own group.

  Returns:
    int32 `[k]`, the chosen rows in increasing order.
  """
  gram = gram.astype(jnp.float32)
  along = along.astype(jnp.float32)
  diag = jnp.diag(gram)
  p = gram.shape[0]
  if groups is None:
    groups = jnp.arange(p, dtype=jnp.int32)
  same = groups[:, None] == groups[None, :]

  def add(_, carry):
    taken, used, a_t, a_a, a_x = carry
    free = ~taken & ~used[groups]
    objective = jnp.where(
      free, _match(a_t + along, a_a + 2 * a_x + diag), -jnp.inf
    )
    # No row left with a positive match: the first free row.
    j = jnp.where(
      jnp.isfinite(objective).any(), jnp.argmax(objective), jnp.argmax(free)
    )
    return (
      taken.at[j].set(True),
      used.at[groups[j]].set(True),
      a_t + along[j],
      a_a + 2 * a_x[j] + diag[j],
      a_x + gram[:, j],
    )

  zero = jnp.zeros((), jnp.float32)
  none = jnp.zeros((p,), bool)
  carry = jax.lax.fori_loop(
    0, k, add, (none, none, zero, zero, jnp.zeros((p,), jnp.float32))
  )

  def best_swap(carry):
    taken, used, a_t, a_a, a_x = carry
    # Row i leaves, row j joins: [P, P] over (i, j).
    num = a_t - along[:, None] + along[None, :]
    den = (
      a_a
      - 2 * a_x[:, None]
      + 2 * a_x[None, :]
      + diag[:, None]
      + diag[None, :]
      - 2 * gram
    )
    allowed = taken[:, None] & ~taken[None, :] & (~used[groups][None, :] | same)
    value = jnp.where(allowed, _match(num, den), -jnp.inf)
    flat = jnp.argmax(value)
    return flat // p, flat % p, value.reshape(-1)[flat]

  def cond(state):
    carry, n = state
    _, _, gain = best_swap(carry)
    return (n < (k if max_swaps is None else max_swaps)) & (
      gain > _match(carry[2], carry[3]) * (1 + 1e-6)
    )

  def swap(state):
    (taken, used, a_t, a_a, a_x), n = state
    i, j, _ = best_swap((taken, used, a_t, a_a, a_x))
    a_a = a_a - 2 * a_x[i] + 2 * a_x[j] + diag[i] + diag[j] - 2 * gram[i, j]
    return (
      taken.at[i].set(False).at[j].set(True),
      used.at[groups[i]].set(False).at[groups[j]].set(True),
      a_t - along[i] + along[j],
      a_a,
      a_x - gram[:, i] + gram[:, j],
    ), n + 1

  (taken, *_), _ = jax.lax.while_loop(cond, swap, (carry, 0))
  return jnp.nonzero(taken, size=k)[0].astype(jnp.int32)


def cut_variants(
  sequence: Sequence[int],
  *,
  is_end: np.ndarray,
  cuttable: np.ndarray,
  end_id: int,
  min_length: int,
) -> list[list[int]]:
  """A searched sentence and its cuts at word boundaries.

  Each cut keeps the sentence up to a word boundary (before a token that
  `cuttable` marks: one that starts a word or is punctuation) and closes
  it with the sentence's own end token, or `end_id` where it has none
  (it ran to `max_length`). The searches' sentences run on, longer than
  the originals, and cutting each where it should end (with the original
  in hand) lifts ROUGE-L (reports/dager/README.md,
  `reports/dager/truncation_bound.json`); the head gradient can tell
  which cut the batch holds, since a sentence's own gradient counts every
  context it holds (:func:`pool_head_gradients`).

  Args:
    sequence: token ids, BOS first.
    is_end: bool `[V]`, sentence-ending tokens.
    cuttable: bool `[V]`, tokens a cut may fall before.
    end_id: the end token of a cut sentence that has none.
    min_length: no variant shorter than this (tokens, BOS and end
      included).

  Returns:
    The distinct variants, the whole sentence last.
  """
  seq = [int(t) for t in sequence]
  ended = len(seq) > 1 and bool(is_end[seq[-1]])
  body = seq[:-1] if ended else seq
  end = seq[-1] if ended else int(end_id)
  out = []
  for m in range(2, len(body)):
    if cuttable[body[m]] and m + 1 >= min_length:
      out.append(body[:m] + [end])
  out.append(seq)
  unique = []
  for v in out:
    if v not in unique:
      unique.append(v)
  return unique


# The pool's rows are computed on the shortest buffer that holds them: a
# multiple of this many tokens (or the pool's width). Cut variants run from
# `min_length` to the whole sentence, so on FILM's Enron sentences at
# b = 64 this halves the tokens the rows pass through.
_WIDTH_BUCKET = 8
# The Gram's rows log their progress at most this often (seconds).
_LOG_EVERY_S = 10.0
# Sentences per `lax.map` step: about this many tokens, at most 8, and at
# most _ROWS_BYTES of `[V, d]` gradients alive at once.
_TOKENS_PER_STEP = 96
_ROWS_BYTES = 1 << 30


def pool_gram(
  model: Model,
  params: PyTree,
  tokens: Int[np.ndarray, 'P L'],
  lengths: Int[np.ndarray, ' P'],
  candidates: Int[Array, ' C'],
  target: Float[Array, 'C d'],
  weights: Float[np.ndarray, 'W C'],
  *,
  chunk: int = 64,
  transform: Float[Array, 'd d'] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """`gram = F Fᵀ` and `along = F t` of the pool's weighted head rows.

  `F[p]` is :func:`pool_head_gradients`'s row of sentence p (times
  `transform` when given: `rows @ transform`) with each candidate's row
  scaled by one row of `weights`, flattened; `t` the target rows, which
  the caller passes already transformed, scaled alike; one Gram per
  weighting. The rows are computed `chunk` sentences at a time, shortest
  first, each chunk on the shortest buffer that holds it (a multiple of
  _WIDTH_BUCKET tokens, one compile per buffer; the last chunk is padded;
  a pool smaller than `chunk` is padded only to the next power of two, so
  a small pool computes no rows it drops), and kept on the device once
  (:func:`features_gram` makes the Grams). A row does not depend on its
  buffer but through float rounding: the model is causal and the padding
  masked.

  Returns:
    float32 numpy `gram [W, P, P]` and `along [W, P]`, in the order of
    `tokens`.
  """
  num = len(tokens)
  lengths = np.asarray(lengths)
  chunk = min(chunk, max(8, 1 << (num - 1).bit_length()))
  w = jnp.asarray(weights, jnp.float32)
  target = jnp.asarray(target, jnp.float32)
  pool_rows = jitted(
    pool_head_gradients, static_argnames=('model', 'batch_size')
  )
  row_bytes = 4 * get_path(params, head_path(model)).size  # one [V, d]
  plan = chunk_plan(lengths, tokens.shape[1], chunk, row_bytes)
  put = jitted(_put_rows, donate_argnames=('feats',))
  feats = None
  start = last_log = time.perf_counter()
  for i, (rows, cols, batch) in enumerate(plan):
    block = pool_rows(
      model,
      params,
      jnp.asarray(tokens[rows, :cols]),
      jnp.asarray(lengths[rows]),
      candidates,
      batch_size=batch,
    )
    if transform is not None:
      block = block @ transform
    if feats is None:
      feats = jnp.zeros((len(plan) * chunk, *block.shape[1:]), jnp.float32)
    feats = put(feats, block, i * chunk)
    # Progress, at most every _LOG_EVERY_S (a chunk's rows take seconds,
    # so waiting for each before the next is dispatched costs nothing).
    jax.block_until_ready(feats)
    if time.perf_counter() - last_log >= _LOG_EVERY_S:
      last_log = time.perf_counter()
      logging.info(
        'hybrid selection: rows of %d/%d sentences, %.1f s',
        min(num, (i + 1) * chunk),
        num,
        last_log - start,
      )
  gram, along = features_gram(feats, target, w)
  # Sorted position of each input row (its first, for the padding copies).
  order = np.concatenate([rows for rows, _, _ in plan])
  place = np.empty(num, np.int64)
  place[order[:num]] = np.arange(num)
  return gram[:, place][:, :, place], along[:, place]


def _put_rows(feats, block, start):
  return jax.lax.dynamic_update_slice_in_dim(feats, block, start, 0)


# Rows of the Gram per product (`[panel, C d] @ [C d, P]`): few passes over
# the pool's rows, a few hundred MB of scaled rows at once.
_GRAM_PANEL = 256


def features_gram(
  feats: Float[Array, 'P C d'],
  target: Float[Array, 'C d'],
  weights: Float[Array, 'W C'],
) -> tuple[np.ndarray, np.ndarray]:
  """`gram [W, P, P]` and `along [W, P]` (float32 numpy) of the rows
  `feats` with each candidate's row scaled by one row of `weights`:
  `Σ_c,e w[c]² F[n, c, e] F[m, c, e]` and the same with `target`; the Gram
  _GRAM_PANEL rows at a time."""
  size = feats.shape[0]
  panel = min(size, _GRAM_PANEL)
  gram_rows = jitted(_weighted_gram_rows, static_argnames=('panel',))
  gram = np.zeros((weights.shape[0], size, size), np.float32)
  for start in range(0, size, panel):
    first = min(start, size - panel)  # the last panel may overlap
    gram[:, first : first + panel] = np.asarray(
      gram_rows(feats, first, weights, panel=panel)
    )
  along = np.asarray(jitted(_weighted_along)(feats, target, weights))
  return gram, along


def _weighted_gram_rows(feats, start, w, *, panel: int):
  """`[W, panel, P]`: rows `start:start + panel` of the weighted Gram."""
  rows = jax.lax.dynamic_slice_in_dim(feats, start, panel)
  scaled = rows[None] * (w**2)[:, None, :, None]  # [W, panel, C, d]
  flat = feats.reshape(feats.shape[0], -1)
  return jnp.einsum('wnk,mk->wnm', scaled.reshape(w.shape[0], panel, -1), flat)


def chunk_plan(
  lengths: Int[np.ndarray, ' P'], width: int, chunk: int, row_bytes: int
) -> list[tuple[np.ndarray, int, int]]:
  """How :func:`pool_gram` computes the rows: `(rows, buffer, batch)` per
  chunk of `chunk` pool rows, shortest first (the last chunk padded with
  copies of the shortest row), each on a buffer of a multiple of
  _WIDTH_BUCKET tokens (at most `width`) that holds its longest row,
  `batch` sentences a `lax.map` step (:func:`_map_batch`; `row_bytes`: one
  `[V, d]` gradient)."""
  lengths = np.asarray(lengths)
  order = np.argsort(lengths, kind='stable')
  order = np.concatenate([order, np.repeat(order[:1], -len(order) % chunk)])
  plan = []
  for s in range(0, len(order), chunk):
    rows = order[s : s + chunk]
    need = int(lengths[rows].max())
    cols = min(width, -(-need // _WIDTH_BUCKET) * _WIDTH_BUCKET)
    plan.append((rows, cols, _map_batch(cols, row_bytes, chunk)))
  return plan


def _map_batch(width: int, row_bytes: int, chunk: int) -> int:
  """Sentences per `lax.map` step of a chunk on a `width`-token buffer: a
  power of two that divides `chunk` (_TOKENS_PER_STEP, _ROWS_BYTES)."""
  most = min(8, _TOKENS_PER_STEP // width, _ROWS_BYTES // row_bytes, chunk)
  batch = 1
  while batch * 2 <= most and chunk % (batch * 2) == 0:
    batch *= 2
  return batch


def _weighted_along(a, target, w):
  return jnp.einsum('nce,ce,wc->wn', a, target, w**2)


def selection_weights(
  observed: Float[np.ndarray, 'C d'], valid: np.ndarray, power: float
) -> np.ndarray:
  """float32 `[C]`: `valid · (|row| + 0.1 · median |row|)^(−power)` of
  the observed head rows (`HybridConfig.select_weight`)."""
  weights = np.asarray(valid, np.float32)
  if power:
    norm = np.linalg.norm(np.asarray(observed, np.float64), axis=1)
    floor = 0.1 * np.median(norm[np.asarray(valid, bool)])
    weights = weights * ((norm + floor) ** -power).astype(np.float32)
  return weights


def pool_variants(
  model: Model,
  sequences: Sequence[Sequence[int]],
  config: HybridConfig,
  alternatives: Sequence[Sequence[Sequence[int]]] | None = None,
) -> tuple[list[list[int]], list[int]]:
  """The selection's pool and each variant's search.

  The pool holds each searched sentence and its `alternatives` (other
  beams of the same search, if given), or with `config.cuts` each one's
  :func:`cut_variants`; a variant appears once per search.
  """
  groups = [
    [list(seq), *(alternatives[j] if alternatives else ())]
    for j, seq in enumerate(sequences)
  ]
  if config.cuts:
    tok = model.tokenizer
    ends = sentence_end_mask(tok, model.vocab_size)
    cuttable = np.array([not s[:1].isalnum() for s in tok.token_strings()])
    end_id = _end_token(tok, ends)
    groups = [
      [
        v
        for seq in group
        for v in cut_variants(
          seq,
          is_end=ends,
          cuttable=cuttable,
          end_id=end_id,
          min_length=config.min_length,
        )
      ]
      for group in groups
    ]
  variants, owner = [], []
  for j, group in enumerate(groups):
    seen = set()
    for v in group:
      if tuple(v) not in seen:
        seen.add(tuple(v))
        variants.append(list(v))
        owner.append(j)
  return variants, owner


def pool_inputs(
  model: Model,
  grads: PyTree,
  variants: Sequence[Sequence[int]],
  padded: np.ndarray,
  valid: np.ndarray,
  powers: Sequence[float],
  width: int,
  transform: Float[Array, 'd d'] | None = None,
) -> tuple[np.ndarray, np.ndarray, Array, Array, np.ndarray]:
  """What :func:`pool_grams` passes to :func:`pool_gram`: `(tokens [P, L]
  zero padded to at least `width`, lengths [P], candidates, the observed
  head rows (times `transform` when given), weights [W, C])`, one row of
  weights per power, from the observed rows."""
  tokens = np.zeros((len(variants), max(width, *map(len, variants))), np.int32)
  for i, v in enumerate(variants):
    tokens[i, : len(v)] = v
  lengths = np.array([len(v) for v in variants], np.int32)
  candidates = jnp.asarray(padded)
  observed = jitted(raw_head_rows, static_argnames=('model',))(
    model, grads, candidates
  )
  if transform is not None:
    observed = observed @ transform
  weights = np.stack(
    [selection_weights(np.asarray(observed), valid, q) for q in powers]
  )
  return tokens, lengths, candidates, observed, weights


def pool_grams(
  model: Model,
  params: PyTree,
  grads: PyTree,
  variants: Sequence[Sequence[int]],
  padded: np.ndarray,
  valid: np.ndarray,
  powers: Sequence[float],
  width: int,
  transform: Float[Array, 'd d'] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """:func:`pool_gram` of `variants` against the observed head rows, one
  Gram per weighting power: `[W, P, P]` and `[W, P]`. With `transform`
  every row, observed or a variant's, is matched as `row @ transform`
  (the weights come from the transformed observed rows)."""
  inputs = pool_inputs(
    model, grads, variants, padded, valid, powers, width, transform
  )
  return pool_gram(model, params, *inputs, transform=transform)


def select_pool(
  model: Model,
  params: PyTree,
  grads: PyTree,
  sequences: Sequence[Sequence[int]],
  num_sentences: int,
  *,
  padded: np.ndarray,
  valid: np.ndarray,
  config: HybridConfig,
  transform: Float[Array, 'd d'] | None = None,
  alternatives: Sequence[Sequence[Sequence[int]]] | None = None,
) -> tuple[list[list[int]], list[int]]:
  """`num_sentences` of the searched `sequences` (or of their cuts, and
  of each search's `alternatives`: one per search), chosen by matching the
  observed head gradient
  (:func:`pool_grams`, :func:`select_from_gram`; every row times
  `transform` when given).

  Returns:
    The chosen sentences and, for each, the search it came from.
  """
  variants, owner = pool_variants(model, sequences, config, alternatives)
  gram, along = pool_grams(
    model,
    params,
    grads,
    variants,
    padded,
    valid,
    (config.select_weight,),
    config.max_length,
    transform=transform,
  )
  select = jitted(select_from_gram, static_argnames=('k', 'max_swaps'))
  chosen = select(
    jnp.asarray(gram[0]),
    jnp.asarray(along[0]),
    num_sentences,
    groups=jnp.asarray(owner, jnp.int32),
  )
  keep = sorted(int(i) for i in np.asarray(chosen))
  return [variants[i] for i in keep], [owner[i] for i in keep]


def _end_token(tok, ends: np.ndarray) -> int:
  """'.' where it is one sentence-ending token, else the first end."""
  ids = tok.encode('.')
  if len(ids) == 1 and ends[ids[0]]:
    return int(ids[0])
  return int(np.flatnonzero(ends)[0])
