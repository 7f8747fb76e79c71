"""Prior-guided token reordering (FILM Sec. 4.4).

Beam search is greedy left to right; FILM refines its best sentence by
local search under the prior score (Eq. 4)

    S(x) = exp(-1/n log P_θ(x)) + β ‖∇_θ L_θ(x)‖        (perplexity + β·norm)

where training sentences have both a low perplexity and a small gradient
norm on the trained model (Appendix B.8). Three stages, each keeping the
best candidate only if it lowers S (greedy hill climbing):

1. truncation: cut after the first sentence-ending punctuation if that
   lowers S (Sec. 4.4, footnote 6);
2. phrase-wise: cut the sentence at p positions and permute the pieces
   (Malkin et al. 2021), 200 steps;
3. token-wise: swap two tokens, delete one, or insert a bag token, 200
   steps.

Everything is fixed-shape JAX: a sentence is `tokens [T]` + `length`, each
step draws C candidates with `vmap` over `fold_in(key, step)` keys, scores
them all at once, and the steps run in one `lax.while_loop`. The gradient
norms of all candidates come from one `vmap(grad)` over a parameter subset
(:func:`candidate_scores`); by default the last transformer block plus the
final norm (:func:`default_grad_paths`): it costs one forward pass plus a
backward pass through one block, and the authors' implementation also
takes the norm of a single layer's gradient.

A step's cost is a forward pass over the whole buffer, padding included.
:func:`reorder_in_stages` (a host loop) therefore runs the loop in
stretches (step 0, the phrase-wise steps, the token-wise steps 8 at a
time), each in the narrowest buffer the sentence can need in it: after
step 0 cuts a beam-search sentence at its first sentence end, each stage
of :data:`MIN_STAGE_STEPS` steps or more (by default every stage) runs in
a buffer of about the sentence's length instead of the beam buffer plus
room for insertions; the moves are those of one buffer.

Scale-out: with `mesh=` the C candidates of every step are split
over the mesh's `'data'` axis and the parameters replicated, so each device
takes the gradients of C/N candidates; C need not divide evenly (padding,
see :func:`candidate_scores`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from jax import lax
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int

from leakjax import sharding
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import LanguageModel, lm_loss

PyTree = Any
ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ReorderConfig:
  """Hyperparameters of the reordering stage (hashable, static).

  Attributes:
    beta: β of Eq. 4 (FILM Sec. 7, Fig. 6: β = 1 is best).
    phrase_steps: steps of phrase-wise reordering (Sec. 4.4: 200).
    token_steps: steps of token-wise reordering (Sec. 4.4: 200).
    num_candidates: C, candidates scored per step.
    min_cuts / max_cuts: p, the number of cut positions, drawn uniformly
      per candidate (the authors' code uses 3 to 5).
    fixed_prefix: leading tokens that never move (BOS and the capitalised
      start word chosen by the beam search).
    truncate: try cutting after the first sentence-ending punctuation.
    grad_chunk: score the candidates' gradients in chunks of this many
      (`lax.map(batch_size=...)`) to bound memory; None: all at once.
  """

  beta: float = 1.0  # FILM Sec. 7
  phrase_steps: int = 200  # FILM Sec. 4.4
  token_steps: int = 200  # FILM Sec. 4.4
  num_candidates: int = 16
  min_cuts: int = 3
  max_cuts: int = 5
  fixed_prefix: int = 2
  truncate: bool = True
  grad_chunk: int | None = None

  def __post_init__(self):
    if not 1 <= self.min_cuts <= self.max_cuts:
      raise LeakjaxError(
        f'need 1 <= min_cuts <= max_cuts, got {self.min_cuts}, {self.max_cuts}'
      )
    if self.num_candidates < 1 or self.phrase_steps < 0 or self.token_steps < 0:
      raise LeakjaxError('num_candidates must be >= 1 and steps >= 0')
    if self.fixed_prefix < 1:
      raise LeakjaxError(
        'fixed_prefix must be >= 1 (the first token has no log-probability)'
      )


@flax.struct.dataclass
class ReorderState:
  """Loop carry of the hill climbing for one sentence.

  Attributes:
    step: int32 `[]`.
    tokens: int32 `[T]`, valid up to `length`, the rest 0.
    length: int32 `[]`.
    score: float32 `[]`, S(tokens[:length]).
    initial_score: float32 `[]`, S of the input sentence.
    accepted: int32 `[]`, improving moves after step 0 (truncation).
  """

  step: jax.Array
  tokens: jax.Array
  length: jax.Array
  score: jax.Array
  initial_score: jax.Array
  accepted: jax.Array


# ------------------------------------------------------------- parameters
def default_grad_paths(model: LanguageModel) -> tuple[ParamPath, ...]:
  """What the model declares in `paths.last_layers`, else every parameter.

  Our GPT-2 and Llama declare their last block and final norm (see the
  module docstring); a model that declares nothing is scored on the
  gradient of all its parameters (exact, slower).
  """
  return tuple(model.paths.last_layers) or ((),)


def _selected(path: ParamPath, prefixes: Sequence[ParamPath]) -> bool:
  return any(path[: len(p)] == tuple(p) for p in prefixes)


def split_params(
  params: PyTree, prefixes: Sequence[ParamPath]
) -> tuple[dict, dict]:
  """`(subset, rest)` flat dicts: leaves under any of `prefixes` vs others."""
  flat = traverse_util.flatten_dict(params)
  subset = {k: v for k, v in flat.items() if _selected(k, prefixes)}
  if not subset:
    raise LeakjaxError(
      f'no parameter under {list(prefixes)}',
      'pick paths that exist in params',
    )
  rest = {k: v for k, v in flat.items() if k not in subset}
  return subset, rest


# ---------------------------------------------------------------- scoring
def candidate_scores(
  model: LanguageModel,
  params: PyTree,
  ids: Int[Array, 'C T'],
  mask: Int[Array, 'C T'],
  *,
  beta: float = 1.0,
  grad_paths: Sequence[ParamPath] | None = None,
  chunk: int | None = None,
  mesh: Mesh | None = None,
) -> tuple[Float[Array, ' C'], Float[Array, ' C'], Float[Array, ' C']]:
  """S(x) = perplexity + β‖∇L(x)‖ of C candidates at once (FILM Eq. 4).

  The per-candidate gradient norms come from `vmap(grad)` of each
  candidate's own mean token loss with respect to the parameters under
  `grad_paths` (default :func:`default_grad_paths`).

  With a `mesh` (a `'data'` axis of N devices) the candidates are split
  over the devices and the parameters replicated. If N does not divide C,
  the last candidate is repeated up to a multiple of N and the copies'
  scores are dropped, so any C works (C = 16 on 8 devices pads nothing).
  `chunk` then counts each device's rows per `lax.map` step. The scores
  equal the unsharded ones up to float32 rounding.

  Returns:
    `(scores, perplexities, grad_norms)`, float32 `[C]`.
  """
  sharding.check_data_axis(mesh)
  num, width = ids.shape
  n = sharding.data_size(mesh)
  if mesh is not None:
    # [C, T] -> [Cp, T], Cp a multiple of N, split over the devices.
    ids, _ = sharding.pad_to_multiple(ids, n)
    mask, _ = sharding.pad_to_multiple(mask, n)
    ids, mask = sharding.constrain_batch((ids, mask), mesh)
    params = sharding.constrain_replicated(params, mesh)
  paths = default_grad_paths(model) if grad_paths is None else grad_paths
  subset, rest = split_params(params, paths)

  def one(ids1, mask1):
    def loss_fn(sub):
      full = traverse_util.unflatten_dict({**rest, **sub})
      logits = model.logits(full, ids1[None], mask1[None])
      return lm_loss(logits, ids1[None], mask1[None])

    loss, grads = jax.value_and_grad(loss_fn)(subset)
    sq = sum(
      jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)
    )
    return loss, jnp.sqrt(sq)

  if chunk is None or chunk * n >= ids.shape[0]:
    loss, norm = jax.vmap(one)(ids, mask)
  elif mesh is None:
    loss, norm = lax.map(lambda a: one(*a), (ids, mask), batch_size=chunk)
  else:
    # [Cp, T] -> [N, Cp/N, T]: every device maps over its own rows.
    ids, mask = sharding.constrain_batch(
      (ids.reshape(n, -1, width), mask.reshape(n, -1, width)), mesh
    )
    loss, norm = jax.vmap(
      lambda i, m: lax.map(lambda a: one(*a), (i, m), batch_size=chunk)
    )(ids, mask)
    loss, norm = loss.reshape(-1), norm.reshape(-1)  # [N, Cp/N] -> [Cp]
  ppl = jnp.exp(loss[:num])
  norm = norm[:num]
  return ppl + beta * norm, ppl, norm


def pad_sequences(
  seqs: Sequence[Sequence[int]], width: int
) -> tuple[np.ndarray, np.ndarray]:
  """`(tokens int32 [N, width], lengths int32 [N])`, zero padded."""
  out = np.zeros((len(seqs), width), np.int32)
  lengths = np.zeros((len(seqs),), np.int32)
  for i, s in enumerate(seqs):
    s = list(s)[:width]
    out[i, : len(s)] = s
    lengths[i] = len(s)
  return out, lengths


def _mask(length, width: int):
  return (jnp.arange(width) < length).astype(jnp.int32)


# ------------------------------------------------------------- candidates
def _uniform_int(key, low, high):
  """Uniform int in [low, high) for traced bounds (high > low assumed)."""
  u = jax.random.uniform(key)
  return jnp.minimum(
    low + jnp.floor(u * (high - low)).astype(jnp.int32), high - 1
  )


def permute_phrases(
  key,
  tokens: Int[Array, ' T'],
  length,
  *,
  fixed: int,
  min_cuts: int,
  max_cuts: int,
) -> Int[Array, ' T']:
  """Cuts `tokens[fixed:length]` at p random places and permutes the pieces.

  FILM Sec. 4.4 (phrase-wise, after Malkin et al. 2021). Tokens before
  `fixed` and the padding after `length` stay where they are.
  """
  width = tokens.shape[0]
  k_num, k_pos, k_perm = jax.random.split(key, 3)
  pos = jnp.arange(width)
  # Cut before position c, c in (fixed, length): draw the smallest keys.
  cut_ok = (pos > fixed) & (pos < length)
  noise = jnp.where(cut_ok, jax.random.uniform(k_pos, (width,)), 2.0)
  order = jnp.argsort(noise)
  num_cuts = _uniform_int(k_num, min_cuts, max_cuts + 1)
  is_cut = (
    jnp.zeros((width,), bool)
    .at[order]
    .set((jnp.arange(width) < num_cuts) & (noise[order] < 2.0))
  )
  segment = jnp.cumsum(is_cut)  # [T], 0 .. num_cuts
  num_segments = segment[jnp.maximum(length - 1, 0)] + 1
  # Random order of the existing segments; missing ones sort last.
  seg_ids = jnp.arange(max_cuts + 1)
  seg_keys = jnp.where(
    seg_ids < num_segments, jax.random.uniform(k_perm, (max_cuts + 1,)), 2.0
  )
  rank = jnp.argsort(jnp.argsort(seg_keys))  # segment -> new slot
  movable = (pos >= fixed) & (pos < length)
  slot = jnp.where(
    movable,
    rank[jnp.minimum(segment, max_cuts)] + 1,
    jnp.where(pos < fixed, 0, max_cuts + 2),
  )
  new_order = jnp.argsort(slot * width + pos)
  return tokens[new_order]


def edit_tokens(
  key,
  tokens: Int[Array, ' T'],
  length,
  bag_ids,
  bag_mask,
  *,
  fixed: int,
  max_length=None,
) -> tuple[Int[Array, ' T'], Int[Array, '']]:
  """One random token-wise move (FILM Sec. 4.4): swap, delete or insert.

  `max_length` (a traced int, default T) bounds the length an insertion
  may reach, so T can be a padded buffer wider than the limit.

  Returns:
    `(tokens, length)` of the candidate. Moves that do not fit (delete of
    the last movable token, insert into a full row) return the input.
  """
  width = tokens.shape[0]
  k_op, k_i, k_j, k_bag = jax.random.split(key, 4)
  op = jax.random.randint(k_op, (), 0, 3)
  pos = jnp.arange(width)
  i = _uniform_int(k_i, fixed, jnp.maximum(length, fixed + 1))
  j = _uniform_int(k_j, fixed, jnp.maximum(length, fixed + 1))
  # swap i <-> j
  swapped = tokens.at[i].set(tokens[j]).at[j].set(tokens[i])
  # delete i: shift left after i
  deleted = jnp.where(pos < i, tokens, jnp.take(tokens, pos + 1, mode='clip'))
  deleted = jnp.where(pos >= length - 1, 0, deleted)
  # insert a bag token at i: shift right from i
  logits = jnp.where(bag_mask, 0.0, -jnp.inf)
  new_token = bag_ids[jax.random.categorical(k_bag, logits)]
  inserted = jnp.where(pos < i, tokens, jnp.take(tokens, pos - 1, mode='clip'))
  inserted = inserted.at[i].set(new_token)
  can_delete = length > fixed + 1
  limit = width if max_length is None else jnp.minimum(max_length, width)
  can_insert = (length < limit) & bag_mask.any()
  out = jnp.select(
    [op == 0, (op == 1) & can_delete, (op == 2) & can_insert],
    [swapped, deleted, inserted],
    tokens,
  )
  new_length = jnp.select(
    [(op == 1) & can_delete, (op == 2) & can_insert],
    [length - 1, length + 1],
    length,
  )
  return out, new_length


def truncate_at_punctuation(
  tokens: Int[Array, ' T'], length, is_end: Bool[Array, ' V'], *, fixed: int
):
  """`(tokens, length)` cut after the first sentence end at/after `fixed`."""
  pos = jnp.arange(tokens.shape[0])
  hit = is_end[tokens] & (pos >= fixed) & (pos < length)
  first = jnp.where(hit.any(), jnp.argmax(hit), length - 1)
  new_length = jnp.minimum(first + 1, length)
  return jnp.where(pos < new_length, tokens, 0), new_length


# ------------------------------------------------------------------ search
def reorder(
  model: LanguageModel,
  params: PyTree,
  tokens: Int[Array, ' T'],
  length: Int[Array, ''],
  bag_ids: Int[Array, ' M'],
  *,
  key: jax.Array,
  config: ReorderConfig,
  is_end: Bool[Array, ' V'] | None = None,
  bag_mask: Bool[Array, ' M'] | None = None,
  grad_paths: Sequence[ParamPath] | None = None,
  mesh: Mesh | None = None,
  max_length: Int[Array, ''] | None = None,
  state: ReorderState | None = None,
  stop: Int[Array, ''] | None = None,
) -> ReorderState:
  """Reorders one sentence under S(x) (FILM Sec. 4.4). Jit-able.

  One `lax.while_loop` of 1 + phrase_steps + token_steps steps, each
  scoring C candidates: step 0 the input and its truncation, then
  phrase-wise, then token-wise moves. With `state` and `stop` it runs a
  stretch of that loop: from `state` (a result of an earlier call) up to
  step `stop`; :func:`reorder_in_stages` strings stretches together in
  buffers as short as the sentence allows.

  Args:
    model: the attacked model.
    params: θ^t.
    tokens: int32 `[T]`, the beam-search sentence (with BOS), zero padded;
      T bounds the length that insertions can reach (see `max_length`).
    length: its number of tokens.
    bag_ids: int32 `[M]`, the recovered bag (insertions draw from it).
    key: a `jax.random.key`.
    config: a :class:`ReorderConfig`.
    is_end: bool `[V]`, sentence-ending tokens
      (:func:`leakjax.tokenization.sentence_end_mask`);
      None skips truncation.
    bag_mask: bool `[M]`, valid entries of `bag_ids`.
    grad_paths: parameter subset of the gradient norm.
    mesh: optional mesh with a `'data'` axis over which each step's C
      candidates are split (:func:`candidate_scores`; any C works).
    max_length: int32 `[]`, the length insertions may reach when it is
      below T (default T). Padding T past it changes no result: padded
      positions are masked out of every score, and the random draws of
      a `[T]` shape agree on their common prefix (JAX's partitionable
      threefry, the default since JAX 0.5), so callers pad T to a few
      bucket sizes and compile once per bucket.
    state: continue from this state (its tokens `[T]`) instead of the
      input; `tokens` and `length` are then read only for step 0's
      truncation. None: start at step 0.
    stop: int32 `[]`, run the steps before this one (default: all of them).

  Returns:
    The final :class:`ReorderState` (`initial_score` is S of the input).
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  length = jnp.asarray(length, jnp.int32)
  width = tokens.shape[0]
  bag_ids = jnp.asarray(bag_ids, jnp.int32)
  if bag_mask is None:
    bag_mask = jnp.ones(bag_ids.shape, bool)
  fixed = config.fixed_prefix
  c = config.num_candidates
  phrase_end = 1 + config.phrase_steps
  total_steps = phrase_end + config.token_steps
  if config.truncate and is_end is not None:
    cut, cut_len = truncate_at_punctuation(tokens, length, is_end, fixed=fixed)
  else:
    cut, cut_len = tokens, length

  def propose(k, s: ReorderState):
    """One candidate: step 0 truncation, then phrase-, then token-wise."""
    k_phrase, k_token = jax.random.split(k)
    phrase = permute_phrases(
      k_phrase,
      s.tokens,
      s.length,
      fixed=fixed,
      min_cuts=config.min_cuts,
      max_cuts=config.max_cuts,
    )
    edited, edited_len = edit_tokens(
      k_token,
      s.tokens,
      s.length,
      bag_ids,
      bag_mask,
      fixed=fixed,
      max_length=max_length,
    )
    is_phrase = s.step < phrase_end
    new = jnp.where(s.step == 0, cut, jnp.where(is_phrase, phrase, edited))
    new_len = jnp.where(
      s.step == 0, cut_len, jnp.where(is_phrase, s.length, edited_len)
    )
    return new, new_len

  last = total_steps if stop is None else jnp.minimum(stop, total_steps)

  def cond(s: ReorderState):
    return s.step < last

  def body(s: ReorderState) -> ReorderState:
    keys = jax.random.split(jax.random.fold_in(key, s.step), c)
    cand, lengths = jax.vmap(propose, in_axes=(0, None))(keys, s)
    # Step 0 scores the input itself (slot 0) beside its truncation.
    first = s.step == 0
    cand = cand.at[0].set(jnp.where(first, s.tokens, cand[0]))
    lengths = lengths.at[0].set(jnp.where(first, s.length, lengths[0]))
    masks = jax.vmap(_mask, in_axes=(0, None))(lengths, width)
    scores, _, _ = candidate_scores(
      model,
      params,
      cand,
      masks,
      beta=config.beta,
      grad_paths=grad_paths,
      chunk=config.grad_chunk,
      mesh=mesh,
    )  # [C]
    best = jnp.argmin(scores)
    better = scores[best] < s.score
    return ReorderState(
      step=s.step + 1,
      tokens=jnp.where(better, cand[best], s.tokens),
      length=jnp.where(better, lengths[best], s.length),
      score=jnp.where(better, scores[best], s.score),
      initial_score=jnp.where(first, scores[0], s.initial_score),
      accepted=s.accepted + (better & ~first).astype(jnp.int32),
    )

  if state is None:
    state = initial_state(tokens, length)
  elif state.tokens.shape != tokens.shape:
    raise LeakjaxError(
      f'state.tokens has shape {state.tokens.shape}, tokens {tokens.shape}',
      'pass the state in a buffer of the same width',
    )
  return lax.while_loop(cond, body, state)


# ------------------------------------------------------------ host loop
def initial_state(tokens, length) -> ReorderState:
  """The state :func:`reorder` starts from (step 0, no score yet)."""
  return ReorderState(
    step=jnp.array(0, jnp.int32),
    tokens=jnp.asarray(tokens, jnp.int32),
    length=jnp.asarray(length, jnp.int32),
    score=jnp.array(jnp.inf, jnp.float32),
    initial_score=jnp.array(jnp.inf, jnp.float32),
    accepted=jnp.array(0, jnp.int32),
  )


# A stage (phrase- or token-wise) of fewer steps runs in the one buffer.
# Each narrower buffer is one more compilation of the whole scorer, but
# with the bag padded to `FilmAttackConfig.bag_bucket` every batch size
# shares those programs, and every stage narrowed made the FILM quickstart
# (10 + 10 steps) faster with a fresh compilation cache and with a filled
# one, the same summary.json (benchmarks/results/reorder_stages_quickstart.json;
# the step times per width: reorder_stages.json). Our decision, not the
# paper's (its code has no buffers to size).
MIN_STAGE_STEPS = 1


def stretches(
  config: ReorderConfig, chunk: int, min_steps: int = MIN_STAGE_STEPS
) -> list[tuple[int, int, int, bool]]:
  """`(start, stop, growth, narrow)` of the loop's stretches for
  :func:`reorder_in_stages`.

  Step 0, the phrase-wise steps, then the token-wise steps `chunk` at a
  time when they are `min_steps` or more, else in one stretch. `growth`
  bounds how many tokens a sentence can gain within the stretch (only an
  accepted insertion adds one, at most one per step, and only token-wise
  steps insert); `narrow` says whether the stretch may run in a narrower
  buffer than the one-buffer loop's (its stage has `min_steps` or more).
  """
  phrase_end = 1 + config.phrase_steps
  total = phrase_end + config.token_steps
  out = [(0, 1, 0, False)]
  if config.phrase_steps:
    out.append((1, phrase_end, 0, config.phrase_steps >= min_steps))
  narrow = config.token_steps >= min_steps
  step = chunk if narrow else max(1, config.token_steps)
  for start in range(phrase_end, total, step):
    stop = min(total, start + step)
    out.append((start, stop, stop - start, narrow))
  return out


def stretch_width(
  length: int, growth: int, narrow: bool, *, max_length: int, bucket: int
) -> int:
  """The buffer :func:`reorder_in_stages` runs a stretch in: a narrow one
  in the least multiple of `bucket` that holds `length + growth` tokens
  (at most `max_length`), any other in the one buffer that holds
  `max_length`."""
  if not narrow:
    return -(-max_length // bucket) * bucket
  reach = min(max_length, length + growth)
  return max(bucket, -(-reach // bucket) * bucket)


RunStretch = Callable[[np.ndarray, int, ReorderState, int], ReorderState]


def reorder_in_stages(
  run: RunStretch,
  tokens: Sequence[int],
  *,
  config: ReorderConfig,
  max_length: int,
  bucket: int = 8,
  min_steps: int = MIN_STAGE_STEPS,
) -> ReorderState:
  """:func:`reorder` in buffers as short as each stretch of the loop allows.

  Host loop. A step costs a forward pass over the whole buffer `[C, T]`,
  padding included, and the one buffer wide enough for the input and
  every insertion is mostly padding once step 0 cuts a beam-search
  sentence at its first sentence end. This runs :func:`stretches` one
  after the other, reading the length back between them: step 0 in the
  one buffer (the multiple of `bucket` that holds `max_length`), and each
  later stretch of a stage of `min_steps` steps or more in the narrowest
  multiple of `bucket` that holds the longest sentence it can produce
  (its current length plus `growth`, at most `max_length`). Exact: the
  insertion limit stays `max_length` and no sentence outgrows its buffer,
  so every stretch makes the moves of the one-buffer loop (see the padding
  invariance in :func:`reorder`); scores agree up to float32 rounding of
  sums over a different number of masked positions.

  Args:
    run: `run(tokens [T], length, state, stop)` -> the state after
      :func:`reorder` from `state` up to step `stop` in a buffer of width
      T (the caller's jitted kernel; one compilation per width).
    tokens: the sentence to reorder (with BOS).
    config: the :class:`ReorderConfig` `run` uses.
    max_length: the length insertions may reach (:func:`reorder`).
    bucket: buffer widths are multiples of this.
    min_steps: stages of fewer steps stay in the one buffer
      (:data:`MIN_STAGE_STEPS`).

  Returns:
    The final :class:`ReorderState`, tokens in the last stretch's buffer.
  """
  tokens = [int(t) for t in tokens]
  length = len(tokens)
  if not 0 < length <= max_length:
    raise LeakjaxError(
      f'a sentence of {length} tokens with max_length={max_length}',
      'pass max_length >= the sentence length',
    )
  state = None
  for _, stop, growth, narrow in stretches(config, bucket, min_steps):
    width = stretch_width(
      length, growth, narrow, max_length=max_length, bucket=bucket
    )
    buffer, _ = pad_sequences([tokens], width)
    if state is None:
      state = initial_state(buffer[0], length)
    else:
      state = state.replace(
        tokens=jnp.asarray(_resize(np.asarray(state.tokens), width))
      )
    state = run(buffer[0], len(tokens), state, stop)
    length = int(state.length)
  return state


def _resize(tokens: np.ndarray, width: int) -> np.ndarray:
  """`tokens` zero-padded or cut to `width` (only padding is cut)."""
  if tokens.shape[0] >= width:
    assert not tokens[width:].any(), 'cut a token, not padding'
    return tokens[:width].copy()
  return np.pad(tokens, (0, width - tokens.shape[0]))


__all__ = [
  'ReorderConfig',
  'ReorderState',
  'candidate_scores',
  'default_grad_paths',
  'edit_tokens',
  'initial_state',
  'pad_sequences',
  'permute_phrases',
  'reorder',
  'reorder_in_stages',
  'stretch_width',
  'split_params',
  'stretches',
  'truncate_at_punctuation',
]
