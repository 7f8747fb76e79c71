"""The search kernel: one sentence grown from BOS by a beam search in one
`lax.while_loop` (:func:`hybrid_search`, :func:`hybrid_beams`), each
extension scored by the LM's prior, the head gradient and block 2's
span."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from leakjax.attacks.dager.hybrid._common import PyTree
from leakjax.attacks.dager.hybrid.config import SearchConfig
from leakjax.attacks.dager.hybrid.heads import HeadScore
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model
from leakjax.recovery.span import Span, residuals


@flax.struct.dataclass
class HybridState:
  """One search's beams (fixed shapes).

  Attributes:
    tokens: int32 `[K, L]`, BOS first.
    length: int32 `[K]`.
    score: float32 `[K]`, summed step scores.
    finished: bool `[K]`, ended at a sentence end.
    alive: bool `[K]`, holds a beam.
    logp: float32 `[K, V]`, the LM's next-token log-probabilities.
    head: float32 `[K, d]`, the head input at the last position (`[K, 1]`
      zeros without a :class:`HeadScore`).
    cache: the LM's decode cache, `[K]` rows; with
      `SearchConfig.prior_start`, `[2K]`: the beams on BOS's context (rows
      `< K`) then the same beams on the LM prior's own context (rows
      `>= K`), decoded together, so that each step reads the weights once
      for both.
    block_cache: the block-1 cache (:meth:`Model.block_decode`).
    step: int32 `[]`, the position the next step fills.
  """

  tokens: Int[Array, 'K L']
  length: Int[Array, ' K']
  score: Float[Array, ' K']
  finished: Bool[Array, ' K']
  alive: Bool[Array, ' K']
  logp: Float[Array, 'K V']
  head: Float[Array, 'K d']
  cache: PyTree
  block_cache: PyTree
  step: Int[Array, '']


def bigram_counts(
  last: Int[Array, ' K'],
  candidates: Int[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  taken_skip: Int[Array, ' G'] | None = None,
) -> Int[Array, 'K C']:
  """How many rows of `taken` hold the bigram `(last[k], candidates[c])`
  at a position past BOS (sentences may share their first word), and,
  with `taken_skip`, at a position `p >= taken_skip[g]` (the bigram
  `(taken[g, p], taken[g, p + 1])`; None: 1 for every row)."""
  pos = jnp.arange(taken.shape[1] - 1)
  skip = (
    jnp.ones(taken_length.shape, jnp.int32)
    if taken_skip is None
    else jnp.maximum(taken_skip, 1)
  )
  ok = (pos[None] >= skip[:, None]) & (pos[None] + 1 < taken_length[:, None])
  first = jnp.where(ok, taken[:, :-1], -1)
  second = jnp.where(ok, taken[:, 1:], -1)
  hit_first = first[None] == last[:, None, None]  # [K, G, L-1]
  # [K, C]: sum over rows g and positions p of hit_first * (second == c).
  onehot = second[..., None] == candidates[None, None]  # [G, L-1, C]
  return jnp.einsum(
    'kgp,gpc->kc', hit_first.astype(jnp.int32), onehot.astype(jnp.int32)
  )


def _own_bigrams(
  tokens: Int[Array, 'K L'],
  length: Int[Array, ' K'],
  last: Int[Array, ' K'],
  candidates: Int[Array, ' C'],
) -> Bool[Array, 'K C']:
  """Whether the bigram `(last[k], candidates[c])` already occurs in row k."""
  pos = jnp.arange(tokens.shape[1] - 1)
  ok = pos[None] + 1 < length[:, None]  # [K, L-1]
  first = jnp.where(ok, tokens[:, :-1], -1) == last[:, None]  # [K, L-1]
  second = jnp.where(ok, tokens[:, 1:], -1)
  hit = first[..., None] & (second[..., None] == candidates[None, None])
  return hit.any(1)


def _split_contexts(logits, beams: int):
  """`(logits on BOS's context, the LM prior's logits)`: the first
  `beams` rows and the rest, or the same rows twice when the decode held
  one context only (no `prior_start`)."""
  if logits.shape[0] == beams:
    return logits, logits
  return logits[:beams], logits[beams:]


def _head_input(head: HeadScore | None, logits) -> jax.Array:
  z = logits[:, -1].astype(jnp.float32)
  if head is None:
    return jnp.zeros((z.shape[0], 1), jnp.float32)
  return z @ head.readout


def init_state(
  model: Model,
  params: PyTree,
  start: Int[Array, ''],
  beams: int,
  max_length: int,
  layer: int = 1,
  head: HeadScore | None = None,
  prior_start: int | None = None,
) -> HybridState:
  """Every beam at `start` (BOS); only beam 0 alive; the block cache runs
  up to block `layer`'s input; with `prior_start` the LM prior's
  log-probabilities come from a second context that starts with that
  token instead (`SearchConfig.prior_start`)."""
  first = jnp.full((beams, 1), start, jnp.int32)
  ids = first
  if prior_start is not None:
    ids = jnp.concatenate([first, jnp.full_like(first, prior_start)])
  cache = model.init_cache(params, ids.shape[0], max_length + 1)
  logits, cache = model.decode(params, cache, ids)
  logits, prior_logits = _split_contexts(logits, beams)
  block_cache = model.init_block_cache(
    params, beams, max_length + 1, layer=layer
  )
  _, block_cache = model.block_decode(params, block_cache, first, layer=layer)
  tokens = jnp.zeros((beams, max_length), jnp.int32).at[:, 0].set(start)
  return HybridState(
    tokens=tokens,
    length=jnp.ones((beams,), jnp.int32),
    score=jnp.zeros((beams,), jnp.float32),
    finished=jnp.zeros((beams,), bool),
    alive=jnp.arange(beams) == 0,
    logp=jax.nn.log_softmax(prior_logits[:, -1].astype(jnp.float32), axis=-1),
    head=_head_input(head, logits),
    cache=cache,
    block_cache=block_cache,
    step=jnp.ones((), jnp.int32),
  )


def hybrid_step(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  state: HybridState,
  *,
  config: SearchConfig,
  shortlist: int | None = None,
  allowed: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  taken_skip: Int[Array, ' G'] | None = None,
) -> HybridState:
  """One position of the search (pure; `model` and `config` static).

  `shortlist` overrides `config.shortlist` (the first step scores every
  candidate: after BOS the LM's prior says little about which words start
  the batch's sentences, the span says much); `allowed` further restricts
  the candidates of this step (the first: sentence starts); `head` adds
  `config.weight_head` times its scores to the LM's prior (None: no head
  term). The returned state holds `config.beams` beams, whatever `state`
  holds (the search's first step grows one beam to `config.beams`).
  """
  k, max_len = state.tokens.shape
  contexts = 1 if config.prior_start is None else 2
  if jax.tree.leaves(state.cache)[0].shape[0] != contexts * k:
    raise LeakjaxError(
      f'the state holds a decode cache for another prior_start: expected'
      f' {contexts * k} rows (config.prior_start = {config.prior_start})',
      'build the state with init_state(..., prior_start=config.prior_start)',
    )
  s = shortlist or config.shortlist
  i = state.step
  last = state.tokens[:, i - 1]
  lm = state.logp[:, candidates]  # [K, C]
  repeat = _own_bigrams(state.tokens, state.length, last, candidates)
  others = bigram_counts(last, candidates, taken, taken_length, taken_skip)
  open_ = state.alive & ~state.finished
  # No sentence ends before `min_length` tokens (BOS and one word at least).
  early = i + 1 < max(config.min_length, 3)
  ok = valid[None] & ~repeat & open_[:, None] & ~(is_end[None] & early)
  if allowed is not None:
    ok &= allowed[None]
  prior = config.weight_lm * lm - config.weight_diverse * others
  if config.weight_start:
    started = (taken_length > 1)[:, None] & (
      taken[:, 1][:, None] == candidates[None]
    )  # [G, C]
    first = (i == 1).astype(jnp.float32)
    prior = prior - config.weight_start * first * started.sum(0)[None]
  if head is not None:
    prior = prior + config.weight_head * head.scores(state.head)
    if config.weight_evidence and head.targets is not None:
      prior = prior + config.weight_evidence * head.evidence(
        state.head, jnp.exp(lm)
      )
  prior = jnp.where(ok, prior, -jnp.inf)
  short_prior, short = jax.lax.top_k(prior, s)  # [K, S]
  token = candidates[short]  # [K, S]
  end = is_end[short]
  # Block-2 inputs of the K·S shortlisted extensions.
  cache = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), state.block_cache)
  x, _ = model.block_decode(
    params, cache, token.reshape(-1, 1), layer=config.span_block
  )
  res = residuals(span2, x[:, 0]).reshape(k, s)
  log_res = jnp.log(res + 1e-12)
  counted = jnp.isfinite(short_prior) & ~end
  ref = jnp.nanquantile(
    jnp.where(counted, log_res, jnp.nan), config.reference_quantile
  )
  ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
  span_term = jnp.where(counted, ref - log_res, 0.0)
  if config.end_as_best:
    # A sentence end scores as well as the beam's best continuation: the
    # span cannot say where a sentence ends, so the LM decides.
    best = jnp.max(jnp.where(counted, span_term, -jnp.inf), 1, keepdims=True)
    end_term = jnp.where(jnp.isfinite(best), best, 0.0)
  else:
    end_term = jnp.zeros((k, 1), jnp.float32)
  span_term = jnp.where(end, end_term, span_term)
  ext = state.score[:, None] + short_prior + config.weight_span * span_term
  ext = jnp.where(jnp.isfinite(short_prior), ext, -jnp.inf)
  # A finished beam competes unchanged (one "stay" entry, column 0).
  stay = state.alive & state.finished
  ext = jnp.where(stay[:, None], -jnp.inf, ext)
  ext = ext.at[:, 0].set(jnp.where(stay, state.score, ext[:, 0]))
  new_len = jnp.where(stay, state.length, state.length + 1)[:, None]
  norm = new_len.astype(jnp.float32) ** config.length_penalty
  key = jnp.where(jnp.isfinite(ext), ext / norm, -jnp.inf).reshape(-1)
  best, pick = jax.lax.top_k(key, config.beams)
  alive = jnp.isfinite(best)
  parent = pick // s
  col = pick % s
  kept = stay[parent]
  tok = token[parent, col]
  tokens = state.tokens[parent]
  tokens = jnp.where(
    (~kept & alive)[:, None] & (jnp.arange(max_len)[None] == i),
    tok[:, None],
    tokens,
  )
  gather = lambda t, rows: jax.tree.map(lambda x: x[rows], t)  # noqa: E731
  rows, ids = parent, tok[:, None]
  if config.prior_start is not None:  # both contexts in one decode
    rows, ids = jnp.concatenate([parent, parent + k]), jnp.tile(ids, (2, 1))
  logits, lm_cache = model.decode(params, gather(state.cache, rows), ids)
  logits, prior_logits = _split_contexts(logits, config.beams)
  _, block_cache = model.block_decode(
    params,
    gather(state.block_cache, parent),
    tok[:, None],
    layer=config.span_block,
  )
  return HybridState(
    tokens=tokens,
    length=jnp.where(kept, state.length[parent], i + 1),
    score=jnp.where(alive, ext.reshape(-1)[pick], -jnp.inf),
    finished=alive & (kept | end[parent, col]),
    alive=alive,
    logp=jax.nn.log_softmax(prior_logits[:, -1].astype(jnp.float32), axis=-1),
    head=_head_input(head, logits),
    cache=lm_cache,
    block_cache=block_cache,
    step=i + 1,
  )


def hybrid_search(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  start: Int[Array, ''],
  is_start: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  *,
  config: SearchConfig,
  taken_skip: Int[Array, ' G'] | None = None,
) -> tuple[Int[Array, ' L'], Int[Array, ''], Float[Array, '']]:
  """One sentence: the best beam's `(tokens [L], length, mean score)`.

  Pure; jit it with the model and the settings static, as the host loop
  (:func:`search_sentences`) does:

  >>> search = jax.jit(hybrid_search, static_argnames=('model', 'config'))
  >>> tokens, length, score = search(
  ...   model, params, span2, candidates, valid, is_end, taken,
  ...   taken_length, bos, config=config.search)             # doctest: +SKIP

  Args:
    model: the attacked model (`decode`, `block_decode`), static.
    params: θ.
    span2: the span of block `config.span_block`'s attention-input
      gradient (:func:`block_span`).
    candidates: int32 `[C]` token ids (the bag and the sentence ends),
      padded; `valid` marks the real ones and `is_end` the sentence ends.
    taken: int32 `[G, L]` sentences recovered before (BOS first), whose
      bigrams are penalised; `taken_length` `[G]` their lengths (0: none).
    start: BOS.
    is_start: bool `[C]`, the candidates a sentence may start with (None:
      any).
    head: the head-gradient term for these candidates (None: none).
    config: settings, static.
    taken_skip: int32 `[G]`, the bigram penalty counts a row's bigrams
      from this position on (:func:`bigram_counts`; None: past BOS).
  """
  rows, lengths, keys = hybrid_beams(
    model,
    params,
    span2,
    candidates,
    valid,
    is_end,
    taken,
    taken_length,
    start,
    is_start,
    head,
    config=config,
    taken_skip=taken_skip,
  )
  return rows[0], lengths[0], keys[0]


def hybrid_beams(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  start: Int[Array, ''],
  is_start: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  *,
  config: SearchConfig,
  taken_skip: Int[Array, ' G'] | None = None,
) -> tuple[Int[Array, 'K L'], Int[Array, ' K'], Float[Array, ' K']]:
  """One sentence's final beams, best first: `(tokens [K, L], lengths
  [K], mean scores [K])`, K = `config.beams`; a dead beam scores -inf.
  The arguments are :func:`hybrid_search`'s, whose sentence is row 0;
  jit it as that one.
  """
  if taken.shape[1] != config.max_length:
    raise LeakjaxError('taken must have max_length columns')
  # Before the first step every beam is BOS and only one is alive: the
  # first step (every candidate shortlisted) runs on that one beam and
  # returns `config.beams`, as it would from `config.beams` copies of
  # which all but one are dead (it picks the same entries), at a
  # `config.beams`-th of the block passes. It needs as many candidates as
  # beams to pick from.
  first_beams = 1 if candidates.shape[0] >= config.beams else config.beams
  state = init_state(
    model,
    params,
    start,
    first_beams,
    config.max_length,
    config.span_block,
    head,
    config.prior_start,
  )
  state = hybrid_step(
    model,
    params,
    span2,
    candidates,
    valid,
    is_end,
    taken,
    taken_length,
    state,
    config=config,
    shortlist=candidates.shape[0],
    allowed=is_start,
    head=head,
    taken_skip=taken_skip,
  )

  def cond(st):
    return (st.step < config.max_length) & jnp.any(st.alive & ~st.finished)

  def body(st):
    return hybrid_step(
      model,
      params,
      span2,
      candidates,
      valid,
      is_end,
      taken,
      taken_length,
      st,
      config=config,
      head=head,
      taken_skip=taken_skip,
    )

  state = jax.lax.while_loop(cond, body, state)
  norm = state.length.astype(jnp.float32) ** config.length_penalty
  key = jnp.where(state.alive, state.score / norm, -jnp.inf)
  order = jnp.argsort(-key)
  return state.tokens[order], state.length[order], key[order]
