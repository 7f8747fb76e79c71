"""Algorithm 1 of Zanella-Beguelin et al. (CCS 2020): differential-rank search.

* :func:`rank_beam_search` -- Algorithm 1 (beam search for differential
  rank) with the beam width halved at every step (Sec. 3.2, "Optimizing for
  Speed") and group beam search (Sec. 3.2, "Optimizing for Diversity"). Each
  step decodes the `k` beam sequences once on both models with the
  incremental cache; the full-vocabulary probabilities then give the scores
  of all `k * |T|` one-token extensions as one array, from which
  `lax.top_k` keeps the best. (Named apart from FILM's bag-restricted
  :func:`leakjax.attacks.film.bag_beam_search`.)
* :func:`halving_widths` -- the paper's beam schedule; :func:`ranked` --
  all groups' sequences in one list, best first.

The search is pure and works with any :class:`leakjax.models.LanguageModel`
(it uses `vocab_size`, `init_cache` and `decode`). The caller owns `jit` and
the placement of the inputs (`rank_beam_search(..., mesh=)` splits each
step's beam rows over a mesh's `'data'` axis). A
:class:`leakjax.models.Model` compares and hashes by value, so it is a
static argument, and new params of the same shapes never recompile:

>>> search = jax.jit(rank_beam_search, static_argnames=(       # doctest: +SKIP
...     'model', 'model_prime', 'widths', 'length'))
>>> result = search(model, model, params, params_prime, jnp.array([bos]),
...                 widths=halving_widths(10_000, length=5), length=5)

Cost of one search step with `k` beam sequences, vocabulary `V` and hidden
width `H` (word-level LSTM): `2 * 2 * k * H * V` FLOPs for the two output
layers (plus the recurrent layers), `2 * k * V` exponentials (one per
logit: the softmax is written out so that it also yields the
log-partition), and a top-k selection over `k * |T|` candidates. The step
runs over chunks of `chunk_rows` sequences (`lax.map`) so that memory stays
at `O(chunk_rows * V)` whatever `k` and `|T|` are (|T| = 10,000 for the
word-level LSTMs, 49,152 for SmolLM2, where step 2 of the halving schedule
scores 2.4e9 candidates). `benchmarks/dr_search.py` measures it on the
2x200 LSTM with |T| = 10,000 and n = 5 (see benchmarks/results/).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int

from leakjax import sharding
from leakjax.attacks.differential.score import SCORES
from leakjax.errors import LeakjaxError

PyTree = Any
# Default memory budget of one search chunk: candidate scores per chunk.
DEFAULT_CHUNK_CANDIDATES = 1 << 22  # 4M floats = 16 MiB per array


# ----------------------------------------------------- search (Algorithm 1)
@struct.dataclass
class RankBeamState:
  """Differential-rank search state after step `i` (`i` tokens chosen).

  `G` groups of `W` sequences (named apart from FILM's `BeamState`). Caches
  are those of M and M' after reading the context and all chosen tokens
  except the last one (which is `last`), so the next step decodes exactly
  one token per sequence.
  """

  sequences: jax.Array  # int32 [G, W, i]: chosen token ids
  ds: jax.Array  # float32 [G, W]: DS of each sequence so far
  rel_ds: jax.Array  # float32 [G, W]: relative DS so far
  last: jax.Array  # int32 [G, W]: the next token to feed to the models
  cache: PyTree  # M's decode cache, leaves [G*W, ...]
  cache_prime: PyTree  # M''s decode cache, leaves [G*W, ...]


@struct.dataclass
class SearchResult:
  """What Algorithm 1 returns: sequences and their scores, per group."""

  sequences: jax.Array  # int32 [G, W, n]: token ids, best first per group
  ds: jax.Array  # float32 [G, W]: DS (Definition 3.1)
  rel_ds: jax.Array  # float32 [G, W]: relative DS


def halving_widths(
  num_tokens: int,
  length: int,
  *,
  min_width: int = 1,
  num_groups: int = 1,
) -> tuple[int, ...]:
  """The paper's beam schedule: |T|, |T|/2, |T|/4, ... (Sec. 3.2).

  Width `i` (0-based) is the number of sequences of length `i + 1` kept,
  `max(num_tokens // 2**i, min_width)`, never more than there are
  sequences of that length, rounded down to a multiple of `num_groups`
  (and at least one sequence per group).

  >>> halving_widths(10_000, 5)
  (10000, 5000, 2500, 1250, 625)
  >>> halving_widths(10_000, 5, min_width=1024)
  (10000, 5000, 2500, 1250, 1024)
  """
  if num_tokens < 1 or length < 1:
    raise LeakjaxError(
      f'need num_tokens >= 1 and length >= 1, got {num_tokens}, {length}'
    )
  widths = []
  for i in range(length):
    available = num_tokens ** (i + 1)
    w = min(max(num_tokens // 2**i, min_width), available)
    w = max(w - w % num_groups, num_groups)  # at least one per group
    if w > available or (i == 0 and w > num_tokens):
      raise LeakjaxError(
        f'{num_groups} groups need {w} sequences at step {i + 1}, but'
        f' there are {num_tokens} tokens',
        'use fewer groups',
      )
    widths.append(w)
  return tuple(widths)


def _check_widths(
  widths: Sequence[int], length: int, num_tokens: int, num_groups: int
) -> tuple[int, ...]:
  widths = tuple(int(w) for w in widths)
  if len(widths) != length:
    raise LeakjaxError(
      f'{len(widths)} beam widths for a search of length {length}',
      'give one width per step, e.g. halving_widths(|T|, length)',
    )
  if widths[0] > num_tokens:
    raise LeakjaxError(
      f'first beam width {widths[0]} exceeds |T| = {num_tokens}',
      'the first step has only |T| one-token sequences',
    )
  for i, w in enumerate(widths):
    if w < 1 or w % num_groups:
      raise LeakjaxError(
        f'beam width {w} at step {i + 1} is not a positive multiple of'
        f' num_groups={num_groups}',
        'use halving_widths(..., num_groups=G)',
      )
    if i and w > widths[i - 1] * num_tokens:
      raise LeakjaxError(
        f'beam width {w} at step {i + 1} exceeds the'
        f' {widths[i - 1] * num_tokens} candidates'
      )
  return widths


@struct.dataclass
class _NextToken:
  """One model's next-token distribution for a chunk of beam sequences."""

  logits: jax.Array  # float32 [rows, |T|]: logits of T's tokens
  probs: jax.Array  # float32 [rows, |T|]: probabilities of T's tokens
  lse: jax.Array  # float32 [rows, 1]: log-partition over the whole vocabulary


def _next_token(model, params, tokens, last, cache):
  """Decodes `last [rows]` from `cache`; returns (_NextToken, cache).

  The softmax is written out so that one exponential per logit gives both
  the probabilities and the log-partition.
  """
  logits, cache = model.decode(params, cache, last[:, None])
  logits = logits[:, 0].astype(jnp.float32)  # [R, 1, V] -> [R, V]
  top = jax.lax.stop_gradient(logits.max(-1, keepdims=True))
  unnormalized = jnp.exp(logits - top)
  total = unnormalized.sum(-1, keepdims=True)
  probs = unnormalized / total
  lse = top + jnp.log(total)  # [R, 1]
  if tokens is not None:  # [R, V] -> [R, |T|]
    logits, probs = logits[:, tokens], probs[:, tokens]
  return _NextToken(logits=logits, probs=probs, lse=lse), cache


def _token_score(
  score, cur: _NextToken, new: _NextToken, at=None, per_row=None
):
  """Per-token DS (`M' - M`) or relative DS (`M'/M - 1`).

  DS subtracts the probabilities; the relative DS is
  `expm1(log M' - log M)` from the logits, exact also where M underflows.
  `at` / `per_row` gather `[rows, |T|]` / `[rows, 1]` arrays at chosen
  candidates first (identity if None).
  """
  at = at or (lambda x: x)
  per_row = per_row or (lambda x: x)
  if score == 'ds':
    return at(new.probs) - at(cur.probs)
  return jnp.expm1(
    (at(new.logits) - at(cur.logits)) - (per_row(new.lse) - per_row(cur.lse))
  )


def _reshape_leading(tree: PyTree, shape: tuple[int, ...]) -> PyTree:
  """Splits/merges the leading axis of every leaf into `shape`."""
  return jax.tree.map(lambda x: x.reshape(shape + x.shape[1:]), tree)


def _merge_leading(tree: PyTree, num_axes: int) -> PyTree:
  """Merges the first `num_axes` axes of every leaf into one."""

  def f(x):
    rows = 1
    for d in x.shape[:num_axes]:
      rows *= d
    return x.reshape((rows,) + x.shape[num_axes:])

  return jax.tree.map(f, tree)


def _search_step(
  model,
  model_prime,
  params,
  params_prime,
  tokens,
  num_tokens: int,
  state: RankBeamState,
  width: int,
  chunk_rows: int,
  score: str,
  mesh: Mesh | None = None,
) -> RankBeamState:
  """Extends every sequence by every token of T; keeps the best `width`.

  Algorithm 1 lines 3-4 for all groups at once: the `G*W*|T|` candidate
  scores are computed chunk by chunk (`chunk_rows` beam sequences per group
  and chunk, a `lax.map`, so memory is `O(G*chunk_rows*V)`), each chunk
  keeps its best `width` per group with `lax.top_k`, and a last `top_k`
  over the chunk winners picks the `width` best per group.

  A chunk's `c*G` decode rows are laid out row-major (`[c, G]`) so that,
  with a `mesh`, splitting them into equal contiguous blocks over the
  `'data'` axis splits every group's rows evenly over the devices; the
  chunk is then padded up to a multiple of the data-axis size `P`, and each
  device's `c/P` rows keep their best `width` candidates before the last
  `top_k` (`P = 1` without a mesh).
  """
  groups, beam = state.ds.shape
  chunk = min(chunk_rows, beam)
  if mesh is not None:  # whole rows per device; padded rows are discarded
    chunk = -(-chunk // sharding.data_size(mesh)) * sharding.data_size(mesh)
  num_chunks = -(-beam // chunk)
  pad = num_chunks * chunk - beam

  parent_score = state.ds if score == 'ds' else state.rel_ds
  other_score = state.rel_ds if score == 'ds' else state.ds
  last = state.last
  cache = _reshape_leading(state.cache, (groups, beam))  # [G, W, ...]
  cache_prime = _reshape_leading(state.cache_prime, (groups, beam))
  if pad:  # Padded rows score -inf and are never kept.
    pad_rows = lambda x, **kw: jnp.pad(  # [G, W, ...] -> [G, W+pad, ...]
      x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2), **kw
    )
    parent_score = pad_rows(parent_score, constant_values=-jnp.inf)
    other_score = pad_rows(other_score)
    # Copies of real rows (not zeros) keep the models' inputs valid.
    last = pad_rows(last, mode='edge')
    cache = jax.tree.map(functools.partial(pad_rows, mode='edge'), cache)
    cache_prime = jax.tree.map(
      functools.partial(pad_rows, mode='edge'), cache_prime
    )

  def to_chunks(x):  # [G, C*c, ...] -> [C, c, G, ...]
    x = x.reshape((groups, num_chunks, chunk) + x.shape[2:])
    return jnp.moveaxis(x, 0, 2)

  def shard_axis_1(x):  # [C, c, G, ...] or [G, P, ...] over the data axis
    if mesh is None:
      return x
    return jax.lax.with_sharding_constraint(
      x, NamedSharding(mesh, PartitionSpec(None, sharding.DATA_AXIS))
    )

  xs = (
    to_chunks(parent_score),
    to_chunks(other_score),
    to_chunks(last),
    jax.tree.map(to_chunks, cache),
    jax.tree.map(to_chunks, cache_prime),
  )
  xs = jax.tree.map(shard_axis_1, xs)  # [C, c, G, ...], c over 'data'
  # With a mesh each device keeps its own best `keep` candidates first
  # (a top-k along a sharded axis would gather all of them); the final
  # top-k over chunks and parts breaks ties by index like one top-k.
  parts = sharding.data_size(mesh)
  part_rows = chunk // parts
  keep = min(width, part_rows * num_tokens)

  def to_parts(x):  # [c*G, k] -> [c, G, k] -> [G, P, c/P, k], P over 'data'
    x = jnp.swapaxes(x.reshape(chunk, groups, -1), 0, 1)
    return shard_axis_1(x.reshape(groups, parts, part_rows, -1))

  other = 'rel_ds' if score == 'ds' else 'ds'
  group_ids = jnp.arange(groups)[:, None]

  def score_chunk(x):
    p_score, p_other, p_last, p_cache, p_cache_prime = x  # [c, G, ...]
    last_rows = p_last.reshape(-1)  # [c, G] -> [c*G]
    cur, new_cache = _next_token(
      model, params, tokens, last_rows, _merge_leading(p_cache, 2)
    )
    new, new_cache_prime = _next_token(
      model_prime,
      params_prime,
      tokens,
      last_rows,
      _merge_leading(p_cache_prime, 2),
    )
    tok_score = _token_score(score, cur, new)  # [c*G, |T|]
    # [G, P, c/P, |T|] -> [G, P, c/P*|T|]: a group's chunk extensions, in
    # P parts of whole rows (one per device).
    cand = (to_parts(p_score.reshape(-1, 1)) + to_parts(tok_score)).reshape(
      groups, parts, -1
    )
    values, local = jax.lax.top_k(shard_axis_1(cand), keep)  # [G, P, keep]
    # The other score only for the kept candidates, gathered per part.
    row = local // num_tokens  # [G, P, keep] in [0, c/P)
    at = lambda x: jnp.take_along_axis(  # [c*G, |T|] -> [G, P, keep]
      to_parts(x).reshape(groups, parts, -1), local, axis=2
    )
    per_row = lambda x: jnp.take_along_axis(  # [c*G, 1] -> [G, P, keep]
      to_parts(x)[..., 0], row, axis=2
    )
    others = jnp.take_along_axis(
      to_parts(p_other.reshape(-1, 1))[..., 0], row, axis=2
    )
    others = others + _token_score(other, cur, new, at, per_row)
    # Part-local -> chunk-local flat index; [G, P, keep] -> [G, P*keep].
    flat = local + jnp.arange(parts)[:, None] * (part_rows * num_tokens)
    values, others, flat = (
      x.reshape(groups, -1) for x in (values, others, flat)
    )
    new_caches = (
      _reshape_leading(new_cache, (chunk, groups)),
      _reshape_leading(new_cache_prime, (chunk, groups)),
    )
    return values, others, flat, new_caches

  values, others, flat, (new_cache, new_cache_prime) = jax.lax.map(
    score_chunk, xs
  )  # [C, G, P*keep], caches [C, c, G, ...]
  # Chunk-local flat index -> (row within group, token index).
  chunk_ids = jnp.arange(num_chunks, dtype=jnp.int32)[:, None, None]
  rows = chunk_ids * chunk + flat // num_tokens  # [C, G, P*keep]
  tok = flat % num_tokens
  # [C, G, P*keep] -> [G, C*P*keep]
  merge = lambda x: jnp.moveaxis(x, 0, 1).reshape(groups, -1)
  values, others, rows, tok = map(merge, (values, others, rows, tok))
  values, best = jax.lax.top_k(values, width)  # [G, width]
  others = jnp.take_along_axis(others, best, axis=1)
  parents = jnp.take_along_axis(rows, best, axis=1)  # [G, width] in [0, W)
  tok = jnp.take_along_axis(tok, best, axis=1)

  def gather_rows(x):  # [C, c, G, ...] -> [G, width, ...] -> [G*width, ...]
    x = x.reshape((num_chunks * chunk,) + x.shape[2:])
    return x[parents, group_ids].reshape((groups * width,) + x.shape[2:])

  token_ids = tok if tokens is None else tokens[tok]
  sequences = jnp.concatenate(
    [state.sequences[group_ids, parents], token_ids[..., None]], axis=-1
  )
  ds, rel_ds = (values, others) if score == 'ds' else (others, values)
  return RankBeamState(
    sequences=sequences.astype(jnp.int32),
    ds=ds,
    rel_ds=rel_ds,
    last=token_ids.astype(jnp.int32),
    cache=jax.tree.map(gather_rows, new_cache),
    cache_prime=jax.tree.map(gather_rows, new_cache_prime),
  )


def _split_groups(state: RankBeamState, num_groups: int) -> RankBeamState:
  """[1, W] sorted by score -> [G, W/G]: group g holds ranks g*W/G.. ."""
  width = state.ds.shape[1]
  per = width // num_groups
  split = lambda x: x.reshape((num_groups, per) + x.shape[2:])
  return RankBeamState(
    sequences=split(state.sequences),
    ds=split(state.ds),
    rel_ds=split(state.rel_ds),
    last=split(state.last),
    cache=state.cache,
    cache_prime=state.cache_prime,
  )


def rank_beam_search(
  model,
  model_prime,
  params: PyTree,
  params_prime: PyTree,
  context: Int[Array, ' c'],
  tokens: Int[Array, ' T'] | None = None,
  *,
  widths: Sequence[int],
  length: int,
  num_groups: int = 1,
  score: str = 'ds',
  chunk_rows: int | None = None,
  mesh: Mesh | None = None,
) -> SearchResult:
  """Algorithm 1: the sequences of T^n with the highest differential score.

  Starting from the empty sequence (after `context`), step `i` extends each
  kept sequence by every token of T, scores all extensions at once and
  keeps the best `widths[i]` (Algorithm 1, lines 2-4). With the paper's
  schedule (:func:`halving_widths`) step 1 keeps all |T| one-token
  sequences and the width halves at every further step (Sec. 3.2,
  "Optimizing for Speed"). With `num_groups = G > 1` the one-token
  sequences, ranked by score, are split into G contiguous groups that are
  extended independently, each keeping `widths[i] / G` (group beam search,
  Sec. 3.2, "Optimizing for Diversity").

  Shapes are fixed per step, so under `jit` the search compiles once for a
  given (|T|, widths, length, G) and runs without host round trips.

  Memory: `O(G * chunk_rows * V)` for the scores of one chunk, plus the
  decode caches of every sequence of the widest step (small for LSTMs; for
  a transformer, `widths[0]` KV caches of `len(context) + length` tokens,
  so use narrower widths with SmolLM2 than |T| = 49,152).

  Sharding: with a `mesh` the search is data-parallel over the
  beam sequences. Every step's chunk of beam rows is split over the mesh's
  `'data'` axis with `jax.lax.with_sharding_constraint` and the parameters
  are constrained to be replicated, so each device decodes its rows on both
  models, scores their `rows * |T|` extensions and keeps its best `width`
  with a local `top_k`; only those winners (and then the decode caches of
  the rows that survive the step) cross devices. A chunk is padded up to a
  multiple of the data-axis size with copies of a real row whose candidates
  score -inf and are never kept, and the two-level top-k breaks ties by
  index like one top-k, so the result does not depend on the mesh (up to
  float32 rounding of the per-device matmuls). Sharding constraints rather
  than `shard_map` keep one code path for one device and many and leave
  the rest of the placement to the caller's `jit`; the mesh is an argument
  because the beam axis only exists inside the search.

  Args:
    model: M, any :class:`leakjax.models.LanguageModel` (only its
      `vocab_size` and its pure `init_cache` and `decode` are used).
    model_prime: the updated snapshot M'.
    params: M's parameters.
    params_prime: M''s parameters.
    context: int32 `[c]`, c >= 1: what every sequence is conditioned on,
      e.g. `[bos]`, or `[bos] + prefix` for an adversary who knows the start
      of the secret (Sec. 4.3, RQ3).
    tokens: int32 `[|T|]` the token ids of T, or None for the whole
      vocabulary.
    widths: beam width after each step, `length` entries, each a multiple
      of `num_groups`; see :func:`halving_widths`.
    length: n, the number of tokens to generate.
    num_groups: G, the number of beam groups.
    score: 'ds' (Algorithm 1) or 'rel_ds' (rank by the relative DS, which
      the paper finds more robust to different random initializations).
    chunk_rows: beam sequences per group scored together; default: as many
      as fit `DEFAULT_CHUNK_CANDIDATES` candidate scores per device.
      Results do not depend on it.
    mesh: optional `jax.sharding.Mesh` with a `'data'` axis (see
      :func:`leakjax.sharding.make_mesh`) over which every step's beam rows
      are split; None runs wherever `jit` puts the inputs. Call the search
      under `jit`.

  Returns:
    :class:`SearchResult` with `[G, widths[-1] / G]` sequences (token ids,
    context excluded), each group sorted best first. The DS and relative DS
    of each sequence are those of Definition 3.1 (given `context`).
  """
  if score not in SCORES:
    raise LeakjaxError(f'score must be one of {SCORES}, got {score!r}')
  context = jnp.asarray(context, jnp.int32)
  if context.ndim != 1 or context.shape[0] < 1:
    raise LeakjaxError(
      f'context must be a non-empty 1-D array of ids, got shape'
      f' {context.shape}',
      'pass at least the BOS token',
    )
  vocab_size = model.vocab_size
  if model_prime.vocab_size != vocab_size:
    raise LeakjaxError(
      f"M has {vocab_size} tokens but M' has {model_prime.vocab_size}",
      'compare snapshots of one model',
    )
  num_tokens = vocab_size if tokens is None else int(tokens.shape[0])
  widths = _check_widths(widths, length, num_tokens, num_groups)
  if mesh is not None and sharding.DATA_AXIS not in mesh.shape:
    raise LeakjaxError(
      f'the mesh has axes {tuple(mesh.shape)}, none named'
      f' {sharding.DATA_AXIS!r}',
      "build it with make_mesh('data:N')",
    )
  if chunk_rows is None:  # the same memory per device with a mesh
    chunk_rows = max(
      1, DEFAULT_CHUNK_CANDIDATES // (num_groups * num_tokens)
    ) * sharding.data_size(mesh)
  if mesh is not None:
    params, params_prime = jax.lax.with_sharding_constraint(
      (params, params_prime), sharding.replicated(mesh)
    )
  if tokens is not None:
    tokens = jnp.asarray(tokens, jnp.int32)

  # Read the context except its last token, which step 1 decodes.
  max_length = context.shape[0] + length
  cache = model.init_cache(params, 1, max_length)
  cache_prime = model_prime.init_cache(params_prime, 1, max_length)
  if context.shape[0] > 1:
    _, cache = model.decode(params, cache, context[None, :-1])
    _, cache_prime = model_prime.decode(
      params_prime, cache_prime, context[None, :-1]
    )
  state = RankBeamState(
    sequences=jnp.zeros((1, 1, 0), jnp.int32),
    ds=jnp.zeros((1, 1), jnp.float32),
    rel_ds=jnp.zeros((1, 1), jnp.float32),
    last=context[-1:].reshape(1, 1),
    cache=cache,
    cache_prime=cache_prime,
  )
  step = functools.partial(
    _search_step,
    model,
    model_prime,
    params,
    params_prime,
    tokens,
    num_tokens,
    chunk_rows=chunk_rows,
    score=score,
    mesh=mesh,
  )
  # Step 1 runs as one group; its |T| one-token sequences are then ranked
  # and split into the G groups.
  state = step(state, widths[0])
  state = _split_groups(state, num_groups)
  for width in widths[1:]:
    state = step(state, width // num_groups)
  return SearchResult(
    sequences=state.sequences, ds=state.ds, rel_ds=state.rel_ds
  )


def ranked(result: SearchResult, score: str = 'ds') -> SearchResult:
  """All groups' sequences in one list `[1, G*W, n]`, best `score` first."""
  if score not in SCORES:
    raise LeakjaxError(f'score must be one of {SCORES}, got {score!r}')
  flat = lambda x: x.reshape((1, -1) + x.shape[2:])
  values = flat(getattr(result, score))
  order = jnp.argsort(-values[0])
  return SearchResult(
    sequences=flat(result.sequences)[:, order],
    ds=flat(result.ds)[:, order],
    rel_ds=flat(result.rel_ds)[:, order],
  )


__all__ = [
  'DEFAULT_CHUNK_CANDIDATES',
  'RankBeamState',
  'SearchResult',
  'halving_widths',
  'rank_beam_search',
  'ranked',
]
