"""DAGER's two span tests on a decoder: the token filter and the sequence search.

Petrov et al., "DAGER: Exact Gradient Inversion for Large Language Models"
(NeurIPS 2024, arXiv 2405.15586), written from the paper:

1. **Layer-1 token filter** (:func:`token_filter`): the first block's
   attention projections read `x̂ = norm(e_v + p_t)` for token `v` at
   position `t` (rotary models: `norm(e_v)`, one test per token). A token
   is a candidate iff some `x̂` lies in the span of the gradient of those
   projections (:mod:`leakjax.recovery.span`). All `V` tokens (times
   the positions for learned position embeddings) are tested at once.
2. **Layer-2 sequence search** (:func:`search_step`, :func:`sequence_search`): under
   causal attention, the input of block 2 at position `i` depends only on
   tokens `0..i`. Sequences grow one position per step: every live prefix
   is extended by every candidate token, the extension's block-2 input is
   computed incrementally (a cache of block 1 only,
   :meth:`leakjax.models.Model.block_decode`), and the extension is kept
   iff that input lies in the span of block 2's projection gradient.
   A prefix none of whose extensions passes is finished.

The decisions the paper leaves open, taken here:

* fixed shapes: `max_live` rows hold the live prefixes and `max_done` the
  finished sequences; when more extensions pass than there are live rows,
  the closest to the span are kept and the rest counted in `dropped`
  (DAGER's code keeps every passing sequence, on a GPU);
* the search starts from a given first token (the tokenizer's BOS, which
  the client's batch starts with) or from the empty prefix, position 0
  then tested like every other. A BOS must be given when the model puts
  it in every row: its block-2 input barely depends on its position
  (attention sink), so it passes the test anywhere;
* a prefix is finished when no extension passes; the last token of a
  sentence has no gradient under the next-token loss, so what the search
  returns is each sentence without its last token (measured: the authors'
  code recovers none of them either, `benchmarks/dager_vs_reference.py`),
  which :mod:`leakjax.attacks.dager.pipeline` completes from the head
  gradient.

Every function here is pure; `model` is a static argument (it hashes by
value). :func:`sequence_search` runs the steps in one `lax.while_loop`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from leakjax import sharding
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model
from leakjax.recovery.span import (
  Span,
  residuals,
  span_of,
  span_residuals,
)

PyTree = Any


@dataclasses.dataclass(frozen=True)
class SpanConfig:
  """Thresholds of the span tests (hashable, static).

  Attributes:
    layer1_tolerance: a token is a layer-1 candidate if its input's
      relative residual to the span is below this.
    layer2_tolerance: an extension passes the layer-2 test below this.
    min_gap_decades: the spectrum's drop at the rank for a valid span
      (:func:`leakjax.recovery.span.span_of`).
    max_rank_fraction: rank limit as a fraction of the width d.

  Each tolerance sits, on a log scale, between the largest residual of a
  true input (or true extension) and the smallest of any other token (the
  closest wrong extension), as measured on the pretrained SmolLM2-135M on
  FILM's Enron batches at b = 4 and 16 (BOS excepted, see the module
  docstring). Near the rank limit the drop of a float32 gradient's
  spectrum shrinks to well under one decade (b = 16), hence a minimum gap
  of a fraction of a decade.
  """

  layer1_tolerance: float = 1e-2
  layer2_tolerance: float = 5e-4
  min_gap_decades: float = 0.3
  max_rank_fraction: float = 0.97


def block_gradient(model: Model, grads: PyTree, block: int) -> jax.Array:
  """`[d, out]`: the gradients of block `block`'s attention input kernels,
  side by side (the model's `paths.attention_inputs[block]`, laid out by
  :meth:`leakjax.models.Model.attention_input_kernels`)."""
  kernels = model.attention_input_kernels(grads, block)
  if kernels is None:
    raise LeakjaxError(
      f'the model declares no attention input kernels for block {block}',
      'declare attention_inputs (the q/k/v kernels of the first two blocks)'
      ' through from_functions / from_flax',
    )
  return kernels


def token_filter(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  config: SpanConfig = SpanConfig(),
  num_positions: Int[Array, ''] | None = None,
) -> tuple[Bool[Array, ' V'], Float[Array, ' V'], Span]:
  """Layer-1 filter: which tokens were inputs of the batch (DAGER, layer 1).

  Args:
    model: the attacked model (declares `attention_inputs` and
      `first_layer_inputs`).
    params: θ at which the gradient was taken.
    grads: the observed gradient (a params-shaped pytree).
    config: thresholds.
    num_positions: for learned position embeddings, test positions below
      this bound only (traced int32); None tests all.

  Returns:
    `(mask [V], residual [V], span)`: the candidates, each token's smallest
    relative residual over positions, and block 1's span. At most `rank`
    tokens (the closest) pass: the span has `rank` dimensions.
  """
  g1 = block_gradient(model, grads, 0)
  span = span_of(
    g1,
    min_gap_decades=config.min_gap_decades,
    max_rank_fraction=config.max_rank_fraction,
  )
  out = span_residuals(
    model, params, grads, num_positions=num_positions, span=span
  )
  if out is None:
    raise LeakjaxError(
      'the model declares no first_layer_inputs',
      'declare first_layer_inputs through from_functions / from_flax',
    )
  res = out[0]
  order = jnp.argsort(res)
  closest = (
    jnp.zeros(res.shape, bool)
    .at[order]
    .set(jnp.arange(res.shape[0]) < span.rank)
  )
  mask = (res < config.layer1_tolerance) & closest & span.valid
  return mask, res, span


# --------------------------------------------------------------- the search
@flax.struct.dataclass
class SearchState:
  """The sequence search's buffers (fixed shapes).

  Live prefixes all have length `step`; finished sequences keep theirs.

  Attributes:
    live: int32 `[A, L]`, the live prefixes (tokens past `step` are 0).
    live_ok: bool `[A]`, which live rows hold a prefix.
    live_residual: float32 `[A]`, the largest layer-2 residual along each
      live prefix (how sure the search is of it).
    cache: the block-1 cache of the live rows (:meth:`Model.block_decode`).
    done: int32 `[F, L]`, finished sequences (no extension passed).
    done_length: int32 `[F]`, their lengths (0: empty row).
    done_residual: float32 `[F]`.
    step: int32 `[]`, the position the next step fills.
    dropped: int32 `[]`, passing extensions (or finished sequences) that
      found no free row.
  """

  live: Int[Array, 'A L']
  live_ok: Bool[Array, ' A']
  live_residual: Float[Array, ' A']
  cache: PyTree
  done: Int[Array, 'F L']
  done_length: Int[Array, ' F']
  done_residual: Float[Array, ' F']
  step: Int[Array, '']
  dropped: Int[Array, '']


def init_state(
  model: Model,
  params: PyTree,
  max_live: int,
  max_done: int,
  max_length: int,
  start: Int[Array, ''] | None = None,
) -> SearchState:
  """One live prefix in row 0: empty, or the token `start` (e.g. BOS)."""
  a = max_live
  cache = model.init_block_cache(params, a, max_length, layer=1)
  live = jnp.zeros((a, max_length), jnp.int32)
  step = jnp.zeros((), jnp.int32)
  if start is not None:
    first = jnp.full((a, 1), start, jnp.int32)
    _, cache = model.block_decode(params, cache, first, layer=1)
    live = live.at[:, 0].set(first[:, 0])
    step = step + 1
  return SearchState(
    live=live,
    live_ok=jnp.arange(a) == 0,
    live_residual=jnp.zeros((a,), jnp.float32),
    cache=cache,
    done=jnp.zeros((max_done, max_length), jnp.int32),
    done_length=jnp.zeros((max_done,), jnp.int32),
    done_residual=jnp.zeros((max_done,), jnp.float32),
    step=step,
    dropped=jnp.zeros((), jnp.int32),
  )


def extension_residuals(
  model: Model,
  params: PyTree,
  span2: Span,
  state: SearchState,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'] | None = None,
  *,
  chunk: int,
  mesh: sharding.Mesh | None = None,
) -> Float[Array, 'A C']:
  """Layer-2 residual of every live prefix extended by every valid candidate.

  Only the pairs (live row, valid candidate) are decoded: they are listed
  densely and run `chunk` at a time (a `lax.while_loop` whose trip count is
  the number of pairs, which shrinks as sentences end), each pass a batch
  of `chunk` one-token decodes on copies of the parents' block-1 caches.
  Pairs not decoded (rows not live, candidates not valid) get `inf`. With
  a `mesh`, each pass is split over its `'data'` axis (`chunk` must divide
  evenly).
  """
  a = state.live.shape[0]
  c = candidates.shape[0]
  if chunk % sharding.data_size(mesh):
    raise LeakjaxError(
      f'chunk {chunk} does not split over {sharding.data_size(mesh)} devices',
      'choose a chunk the data axis divides',
    )
  if valid is None:
    valid = jnp.ones((c,), bool)
  live_ok = state.live_ok
  rows = jnp.nonzero(live_ok, size=a, fill_value=0)[0]
  cols = jnp.nonzero(valid, size=c, fill_value=0)[0]
  n_cols = valid.sum()
  total = live_ok.sum() * n_cols
  passes = (total + chunk - 1) // chunk

  def body(carry):
    j, out = carry
    k = j * chunk + jnp.arange(chunk)
    ok = k < total
    kk = jnp.where(ok, k, 0)
    row = rows[kk // jnp.maximum(n_cols, 1)]
    col = cols[kk % jnp.maximum(n_cols, 1)]
    cache = jax.tree.map(lambda x: x[row], state.cache)
    ids = candidates[col][:, None]
    cache, ids = sharding.constrain_batch((cache, ids), mesh)
    x, _ = model.block_decode(params, cache, ids, layer=1)
    flat = jnp.where(ok, row * c + col, a * c)  # out of range: dropped
    out = out.at[flat].set(residuals(span2, x[:, 0]), mode='drop')
    return j + 1, out

  out = jnp.full((a * c,), jnp.inf, jnp.float32)
  _, out = jax.lax.while_loop(lambda st: st[0] < passes, body, (0, out))
  return out.reshape(a, c)


def search_step(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  state: SearchState,
  *,
  tolerance: float,
  chunk: int,
  mesh: sharding.Mesh | None = None,
) -> SearchState:
  """One position of the sequence search (pure; `model` static).

  Extends every live prefix by every valid candidate and keeps the
  extensions whose block-2 input lies in the span (residual <
  `tolerance`), the closest first when more pass than there are live
  rows; a live prefix none of whose extensions passes moves to `done`.
  """
  a, max_len = state.live.shape
  f = state.done.shape[0]
  c = candidates.shape[0]
  i = state.step
  res = extension_residuals(
    model, params, span2, state, candidates, valid, chunk=chunk, mesh=mesh
  )
  passing = (res < tolerance) & state.live_ok[:, None] & valid[None, :]
  if model.paths.position_embeddings is None:  # a static fact
    # Without position embeddings, `t t ... t` gives every position the
    # hidden state of `t` at position 0, which is in the span whenever t
    # starts a sentence: such runs are refused (a sentence that truly
    # repeats its first token cannot be told apart by the span test).
    seen = jnp.arange(max_len)[None] < i
    run = jnp.all(jnp.where(seen, state.live == state.live[:, :1], True), 1)
    passing &= ~(
      (i > 0) & run[:, None] & (candidates[None] == state.live[:, :1])
    )
  # 1. live prefixes without a passing extension are finished.
  ends = state.live_ok & ~passing.any(1)
  n_done = (state.done_length > 0).sum()
  slot = n_done + jnp.cumsum(ends) - 1
  write = ends & (slot < f)
  slot = jnp.where(write, slot, f)  # out of range: dropped by the scatter
  done = state.done.at[slot].set(state.live, mode='drop')
  done_length = state.done_length.at[slot].set(i, mode='drop')
  done_residual = state.done_residual.at[slot].set(
    state.live_residual, mode='drop'
  )
  # 2. the passing extensions, closest first, become the live prefixes.
  keys = jnp.where(passing, res, jnp.inf).reshape(-1)
  neg, pick = jax.lax.top_k(-keys, a)
  live_ok = jnp.isfinite(neg)
  dropped = jnp.maximum(passing.sum() - a, 0) + (ends & ~write).sum()
  parent = pick // c
  token = candidates[pick % c]
  live = state.live[parent]
  live = jnp.where(
    live_ok[:, None] & (jnp.arange(max_len)[None] == i), token[:, None], live
  )
  live_residual = jnp.where(
    live_ok, jnp.maximum(state.live_residual[parent], -neg), 0.0
  )
  cache = jax.tree.map(lambda x: x[parent], state.cache)
  _, cache = model.block_decode(params, cache, token[:, None], layer=1)
  return SearchState(
    live=live,
    live_ok=live_ok,
    live_residual=live_residual,
    cache=cache,
    done=done,
    done_length=done_length,
    done_residual=done_residual,
    step=i + 1,
    dropped=state.dropped + dropped,
  )


# What :func:`sequence_search` takes as static arguments under `jax.jit`.
SEARCH_STATIC = (
  'model',
  'max_live',
  'max_done',
  'max_length',
  'tolerance',
  'chunk',
  'mesh',
)


def sequence_search(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  start: Int[Array, ''] | None = None,
  *,
  max_live: int,
  max_done: int,
  max_length: int,
  tolerance: float,
  chunk: int,
  mesh: sharding.Mesh | None = None,
) -> SearchState:
  """The whole layer-2 search in one `lax.while_loop` (DAGER, layer 2).

  Pure; jit it with the model and the sizes static, as the pipeline's
  :func:`recover` does:

  >>> search = jax.jit(sequence_search, static_argnames=SEARCH_STATIC)
  >>> state = search(model, params, span2, candidates, valid, bos,
  ...                max_live=24, max_done=64, max_length=64,
  ...                tolerance=5e-4, chunk=32)               # doctest: +SKIP

  Args:
    model: the attacked model (declares `block_inputs`, ideally with
      `block_decode`), static.
    params: θ.
    span2: the span of block 2's attention-input gradient.
    candidates: int32 `[C]` token ids from :func:`token_filter` (padding
      marked invalid; the pipeline pads to `chunk · 2^k`, few compiles).
    valid: bool `[C]`.
    start: a token every sequence starts with (BOS), or None to search
      position 0 like the others.
    max_live: live prefixes per step, static (at least the number of
      distinct prefixes of one length in the batch: b).
    max_done: finished sequences kept, static (at least b).
    max_length: longest sequence grown, static.
    tolerance: the layer-2 residual threshold.
    chunk: extensions decoded per pass (memory: `chunk` copies of a
      one-block cache).
    mesh: a mesh with a `'data'` axis (static): each pass of `chunk`
      extensions is split over it and the parameters
      replicated; None runs on one device. The decisions are the same.

  Returns:
    The final :class:`SearchState`: the recovered sequences (each sentence
    without its last token) are the rows of `done` with a non-zero length,
    then the live rows if the search stopped at `max_length`.
  """
  sharding.check_data_axis(mesh)
  params = sharding.constrain_replicated(params, mesh)
  state = init_state(model, params, max_live, max_done, max_length, start)

  def cond(st):
    return (st.step < max_length) & jnp.any(st.live_ok)

  def body(st):
    return search_step(
      model,
      params,
      span2,
      candidates,
      valid,
      st,
      tolerance=tolerance,
      chunk=chunk,
      mesh=mesh,
    )

  return jax.lax.while_loop(cond, body, state)


__all__ = [
  'SEARCH_STATIC',
  'SearchState',
  'SpanConfig',
  'block_gradient',
  'extension_residuals',
  'init_state',
  'sequence_search',
  'search_step',
  'token_filter',
]
