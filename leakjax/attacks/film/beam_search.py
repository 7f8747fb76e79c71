"""Beam search over a bag of words (FILM Sec. 4.3, Appendix A, Algorithm 1).

Given the bag of tokens `B` recovered from a gradient, FILM orders it into
sentences with the attacked language model: start from prompts (bag tokens
that begin with a capital letter, after BOS), extend every beam by every bag
token, and keep the `k` best by

    score(beam) = log P_θ(beam) - ρ · R_n(beam)                  (Alg. 1)

where `R_n` counts repeated n-grams (Sec. 4.3: the bag has no frequencies,
and beam search repeats itself; n = 2 works best, Sec. 7 / Fig. 5). Beams
are split into diverse groups (Vijayakumar et al. 2016): at each step group
g picks its beams after groups 0..g-1, with a penalty λ for every earlier
group that picked the same token at this step. For multi-sentence recovery
(Sec. 4.5) n-grams of earlier results are penalised too.

The kernel is one `jax.jit`-able function with fixed shapes: the prompts
are prefilled into a KV cache once, then a `lax.while_loop` decodes one
token per step for all beams, restricts the log-probabilities to the bag
(`[k, vocab] -> [k, bag]`), adds the penalties, selects per group with
`lax.top_k` and reorders the cache with `tree.map(x[idx])`. It works on any
:class:`leakjax.models.LanguageModel` (GPT-2, Llama, LSTMs, your own): it
only calls `init_cache(params, ...)` and `decode(params, cache, ids)`.
:func:`bag_beam_search` is written for one search and batched over searches
(different prompt sets) with `vmap`:

>>> config = BeamSearchConfig(num_beams=8, length=20)          # doctest: +SKIP
>>> search = jax.jit(bag_beam_search, static_argnames=('model', 'config'))
>>> result = search(model, params, prompts, bag_ids,
...                 config=config)                             # doctest: +SKIP
>>> result.tokens.shape   # [searches, beams, prompt + length]  # +SKIP

(The differential-rank search of :mod:`leakjax.attacks.differential` is a
different algorithm; this one is FILM's, restricted to a bag of words.)

Cost per search and step: one decode of `k` tokens (≈ 2·k·params FLOPs plus
attention over the cache), a `[k, bag]` gather, the n-gram test (k·T·bag
compares) and a top-k over `k/G · bag` candidates per group.

Scale-out: with `mesh=` the k beams of every search are split
over the mesh's `'data'` axis (`with_sharding_constraint` on the tokens,
scores and KV cache; parameters replicated), so each device decodes k/N
beams per step. The per-group top-k and the cache reordering gather across
devices; the results equal the unsharded ones.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jaxtyping import Array, Bool, Float, Int

from leakjax import sharding
from leakjax.errors import LeakjaxError, check_token_ids
from leakjax.models.protocol import LanguageModel

PyTree = Any
_NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class BeamSearchConfig:
  """Hyperparameters of the bag-restricted beam search (hashable, static).

  Attributes:
    num_beams: k, beams kept per search (FILM Sec. 7: 32 is the best
      trade-off).
    num_groups: diverse beam groups G; must divide `num_beams`.
    diversity_penalty: λ, subtracted per earlier group that chose the same
      token at the same step (Vijayakumar et al. 2016, Hamming diversity).
      It only steers selection; beam scores stay `log P - ρ R_n`.
    ngram_size: n of the repeated n-gram penalty (FILM Sec. 7: n = 2).
      0 disables it.
    ngram_penalty: ρ, added once per repeated n-gram (Alg. 1). `inf` bans
      repeats, as the authors' implementation does (no_repeat_ngram_size).
    prior_penalty: penalty per n-gram that an earlier result of the same
      batch contains (multi-sentence recovery, FILM Sec. 4.5).
    length: L, tokens generated after the prompt (FILM Sec. 4.3 generates
      40 words; we count tokens).
  """

  num_beams: int = 32
  num_groups: int = 1
  diversity_penalty: float = 0.0
  ngram_size: int = 2
  ngram_penalty: float = math.inf
  prior_penalty: float = 2.0
  length: int = 40

  def __post_init__(self):
    if self.num_beams < 1 or self.num_groups < 1 or self.length < 1:
      raise LeakjaxError(
        'num_beams, num_groups and length must be >= 1, got'
        f' {self.num_beams}, {self.num_groups},'
        f' {self.length}'
      )
    if self.num_beams % self.num_groups:
      raise LeakjaxError(
        f'num_beams={self.num_beams} is not a multiple of'
        f' num_groups={self.num_groups}',
        'make the groups equal in size',
      )
    if self.ngram_size < 0:
      raise LeakjaxError(f'ngram_size must be >= 0, got {self.ngram_size}')
    if self.ngram_penalty < 0 or self.prior_penalty < 0:
      raise LeakjaxError('n-gram penalties must be >= 0')

  @property
  def beams_per_group(self) -> int:
    return self.num_beams // self.num_groups


@flax.struct.dataclass
class BagBeamState:
  """The loop carry of one search (k = num_beams, T = prompt + length).

  With a mesh, k here is `kp`: num_beams padded to a multiple of the
  devices with dead beams (see :func:`bag_beam_search`).

  Attributes:
    step: int32 `[]`, tokens generated so far after the prompt.
    tokens: int32 `[k, T]`, prompt then generated tokens (0 after `step`).
    scores: float32 `[k]`, log P(beam) - ρ R_n(beam) - prior penalties.
    cache: the model's decoding cache; every leaf `[k, ...]`.
  """

  step: jax.Array
  tokens: jax.Array
  scores: jax.Array
  cache: PyTree


@flax.struct.dataclass
class BeamResult:
  """Finished beams, best first within each search.

  Attributes:
    tokens: int32 `[..., k, T]`, prompt + generated tokens.
    scores: float32 `[..., k]`, the Alg. 1 scores (-inf: no valid beam).
    prompt_length: static P, where the generated tokens start.
  """

  tokens: jax.Array
  scores: jax.Array
  prompt_length: int = flax.struct.field(pytree_node=False)


# --------------------------------------------------------------- n-grams
def ngram_followers(
  seq: Int[Array, ' T'],
  seq_length: Int[Array, ''],
  context: Int[Array, ' n1'],
  candidates: Int[Array, ' M'],
) -> Bool[Array, ' M']:
  """Which candidates would complete an n-gram already in `seq`.

  `context` holds the last n-1 tokens of a beam; candidate c repeats an
  n-gram iff `seq[j-n+1:j] == context` and `seq[j] == c` for some
  `j < seq_length`. With n = 1 (empty context) every token of `seq` counts.

  Args:
    seq: a token sequence `[T]`, valid up to `seq_length`.
    seq_length: number of valid tokens of `seq`.
    context: the n-1 tokens that precede the candidate.
    candidates: token ids `[M]`.

  Returns:
    bool `[M]`.
  """
  n1 = context.shape[0]
  positions = jnp.arange(seq.shape[0])
  matches = (positions >= n1) & (positions < seq_length)  # [T]
  for offset in range(1, n1 + 1):
    before = jnp.take(seq, positions - offset, mode='clip')  # seq[j - offset]
    matches &= before == context[n1 - offset]
  # [T, 1] & ([T, 1] == [1, M]) -> [T, M] -> [M]
  return (matches[:, None] & (seq[:, None] == candidates[None, :])).any(0)


def _context(tokens: Int[Array, ' T'], length, n1: int) -> Int[Array, ' n1']:
  """The last n-1 tokens before position `length` (garbage if length < n1)."""
  return lax.dynamic_slice(tokens, (jnp.maximum(length - n1, 0),), (n1,))


def _penalties(
  tokens, length, bag_ids, prior, prior_lengths, config: BeamSearchConfig
) -> Float[Array, ' M']:
  """ρ for repeated n-grams + prior penalty, per bag token, for one beam."""
  n = config.ngram_size
  if n == 0:
    return jnp.zeros(bag_ids.shape, jnp.float32)
  context = _context(tokens, length, n - 1)
  has_context = length >= n - 1
  seen = ngram_followers(tokens, length, context, bag_ids) & has_context
  penalty = jnp.where(seen, config.ngram_penalty, 0.0)
  if prior is not None:
    # [R, Tp] -> [R, M] -> [M]
    in_prior = (
      jax.vmap(ngram_followers, in_axes=(0, 0, None, None))(
        prior, prior_lengths, context, bag_ids
      ).any(0)
      & has_context
    )
    penalty += jnp.where(in_prior, config.prior_penalty, 0.0)
  return penalty.astype(jnp.float32)


# ------------------------------------------------------------- selection
def _select(
  total: Float[Array, 'sources M'],
  config: BeamSearchConfig,
  *,
  shared: bool,
) -> tuple[Int[Array, ' k'], Int[Array, ' k'], Float[Array, ' k']]:
  """Per-group top-k with the diversity penalty.

  Args:
    total: scores of every (source, bag token) pair.
    config: the search config.
    shared: True on the first step, when every group draws from the same
      pool of sources (the prompts); False later, when group g only extends
      its own beams `g*kg:(g+1)*kg` of `total [k, M]`.

  Returns:
    `(source, token_index, score)`, each `[k]`, group-major. Scores exclude
    the diversity penalty.
  """
  g, kg = config.num_groups, config.beams_per_group
  m = total.shape[1]
  used = jnp.zeros((m,), jnp.float32)  # choices of earlier groups, this step
  sources, tokens, scores = [], [], []
  for group in range(g):
    if shared:
      pool, offset = total, 0
    else:
      pool, offset = total[group * kg : (group + 1) * kg], group * kg
    steered = pool - config.diversity_penalty * used[None, :]
    width = min(kg, steered.size)
    # [sources, M] -> [sources * M] -> top kg
    _, flat = lax.top_k(steered.reshape(-1), width)
    source, token = flat // m, flat % m
    score = pool.reshape(-1)[flat]
    if width < kg:  # fewer candidates than beams: pad with dead beams
      pad = kg - width
      source = jnp.concatenate([source, jnp.zeros((pad,), source.dtype)])
      token = jnp.concatenate([token, jnp.zeros((pad,), token.dtype)])
      score = jnp.concatenate([score, jnp.full((pad,), _NEG_INF)])
    if g > 1:
      used = used.at[token].add(jnp.where(jnp.isfinite(score), 1.0, 0.0))
    sources.append(source + offset)
    tokens.append(token)
    scores.append(score)
  return (
    jnp.concatenate(sources),
    jnp.concatenate(tokens),
    jnp.concatenate(scores),
  )


# ----------------------------------------------------------------- kernel
def _search_one(
  model: LanguageModel,
  params: PyTree,
  prompts: Int[Array, 'Z P'],
  prompt_mask: Bool[Array, ' Z'],
  bag_ids: Int[Array, ' M'],
  bag_mask: Bool[Array, ' M'],
  prior: Int[Array, 'R Tp'] | None,
  prior_lengths: Int[Array, ' R'] | None,
  config: BeamSearchConfig,
  mesh: Mesh | None = None,
  num_steps: Int[Array, ''] | None = None,
) -> tuple[Int[Array, 'k T'], Float[Array, ' k']]:
  """One beam search from a pool of prompts (Alg. 1 with π¹ = prompts).

  With a `mesh` the beam rows are padded to `kp`, a multiple of the data
  axis size N, with dead beams (copies of beam 0, score -inf) that no
  selection reads, and split over the devices; the prompt rows are split
  too when N divides Z.
  """
  num_prompts, p = prompts.shape
  total_len = p + config.length
  bag_ok = jnp.where(bag_mask, 0.0, _NEG_INF)  # [M]
  k = config.num_beams
  kp = -(-k // sharding.data_size(mesh)) * sharding.data_size(mesh)
  split_beams = functools.partial(sharding.constrain_batch, mesh=mesh)

  def pad_beams(source, token, scores):
    """`[k]` selections -> `[kp]`: dead rows that copy beam 0."""
    if kp == k:
      return source, token, scores
    zeros = jnp.zeros((kp - k,), source.dtype)
    dead = jnp.full((kp - k,), _NEG_INF, scores.dtype)
    return (
      jnp.concatenate([source, zeros]),
      jnp.concatenate([token, zeros]),
      jnp.concatenate([scores, dead]),
    )

  # Prefill: log P(prompt) and the first bag distribution of every prompt.
  cache = model.init_cache(params, num_prompts, total_len)
  if num_prompts % sharding.data_size(mesh) == 0:
    prompts, cache = split_beams((prompts, cache))
  logits, cache = model.decode(params, cache, prompts)  # [Z, P, V]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  prompt_scores = jnp.take_along_axis(
    logp[:, :-1], prompts[:, 1:, None], axis=-1
  )[..., 0].sum(-1)  # [Z]
  prompt_scores = jnp.where(prompt_mask, prompt_scores, _NEG_INF)
  tokens0 = jnp.zeros((num_prompts, total_len), jnp.int32)
  tokens0 = tokens0.at[:, :p].set(prompts)
  pen0 = jax.vmap(_penalties, in_axes=(0, None, None, None, None, None))(
    tokens0, p, bag_ids, prior, prior_lengths, config
  )  # [Z, M]
  total0 = (
    prompt_scores[:, None] + logp[:, -1, bag_ids] + bag_ok[None] - pen0
  )  # [Z, M]
  source, token, scores = pad_beams(*_select(total0, config, shared=True))
  tokens = tokens0[source].at[:, p].set(bag_ids[token])  # [kp, T]
  state = BagBeamState(
    step=jnp.array(1, jnp.int32),
    tokens=tokens,
    scores=scores,
    cache=jax.tree.map(lambda x: x[source], cache),
  )
  state = _split_state(state, mesh)

  steps = config.length if num_steps is None else num_steps

  def cond(state: BagBeamState):
    return state.step < steps

  def body(state: BagBeamState) -> BagBeamState:
    length = p + state.step
    last = lax.dynamic_slice_in_dim(state.tokens, length - 1, 1, axis=1)
    logits, cache = model.decode(params, state.cache, last)  # [kp, 1, V]
    logp = jax.nn.log_softmax(logits[:, -1].astype(jnp.float32), axis=-1)
    pen = jax.vmap(_penalties, in_axes=(0, None, None, None, None, None))(
      state.tokens, length, bag_ids, prior, prior_lengths, config
    )
    # [kp, V] -> [kp, M]: only bag tokens may follow.
    total = state.scores[:, None] + logp[:, bag_ids] + bag_ok[None] - pen
    # Sources are < k: the groups read rows [0, k), never the dead rows.
    source, token, scores = pad_beams(*_select(total, config, shared=False))
    tokens = state.tokens[source]
    tokens = lax.dynamic_update_slice_in_dim(
      tokens, bag_ids[token][:, None], length, axis=1
    )
    return _split_state(
      BagBeamState(
        step=state.step + 1,
        tokens=tokens,
        scores=scores,
        cache=jax.tree.map(lambda x: x[source], cache),
      ),
      mesh,
    )

  state = lax.while_loop(cond, body, state)
  scores = state.scores[:k]  # [kp] -> [k]: drop the dead padding rows
  order = jnp.argsort(-scores)
  return state.tokens[order], scores[order]


def _split_state(state: BagBeamState, mesh: Mesh | None) -> BagBeamState:
  """Splits the beam axis of tokens, scores and cache over the mesh."""
  tokens, scores, cache = sharding.constrain_batch(
    (state.tokens, state.scores, state.cache), mesh
  )
  return state.replace(tokens=tokens, scores=scores, cache=cache)


def bag_beam_search(
  model: LanguageModel,
  params: PyTree,
  prompts: Int[Array, 'S Z P'],
  bag_ids: Int[Array, ' M'],
  *,
  config: BeamSearchConfig,
  prompt_mask: Bool[Array, 'S Z'] | None = None,
  bag_mask: Bool[Array, ' M'] | None = None,
  prior: Int[Array, 'R Tp'] | None = None,
  prior_lengths: Int[Array, ' R'] | None = None,
  mesh: Mesh | None = None,
  num_steps: Int[Array, ''] | None = None,
) -> BeamResult:
  """Bag-restricted beam search, batched over S independent searches.

  Each search starts from its own pool of Z prompts (Alg. 1: π¹ = P); to
  give every capitalised start word its own k beams, put one prompt in each
  search (:func:`prompt_batches`). Pure and jit-able (`model`, `config`,
  `mesh` static).

  Two ways to use several devices: shard the S axis of the inputs (many
  searches, e.g. one per prompt), or pass `mesh` to split the k beams of
  each search (FILM's default single pool has S = 1). With a `mesh` the
  parameters are constrained to be replicated, and if N (the data-axis
  size) does not divide k the beams are padded to the next multiple of N
  with dead rows that are decoded but never selected: any `--num_beams`
  works, at the cost of the idle rows (k = 32 on 8 devices pads nothing).
  Results equal the unsharded ones (scores up to float32 rounding).

  Args:
    model: any leakjax model (uses `init_cache` and `decode`); static
      under `jax.jit` (it hashes by value).
    params: its parameters (θ^t, the attacked model).
    prompts: int32 `[S, Z, P]`, e.g. `[BOS, capitalised bag token]`.
    bag_ids: int32 `[M]`, the recovered bag (pad with any id, see mask).
    config: a :class:`BeamSearchConfig`.
    prompt_mask: bool `[S, Z]`, False for padding prompts.
    bag_mask: bool `[M]`, False for padding entries of `bag_ids`.
    prior: int32 `[R, Tp]`, earlier recovered sequences whose n-grams are
      penalised with `config.prior_penalty` (Sec. 4.5); None for none.
    prior_lengths: int32 `[R]`, valid tokens of each prior row (0 = unused).
    mesh: optional `jax.sharding.Mesh` with a `'data'` axis
      (:func:`leakjax.sharding.make_mesh`) over which the beams of every
      search are split; None: no sharding constraints.
    num_steps: int32 `[]`, 1 <= num_steps <= L: generate this many tokens
      into the `P + L` buffer (the rest stays 0). A traced length, so one
      compilation serves every length up to L (FILM's length is the
      longest client sentence's, Sec. 4.2, different in every batch). The
      beams equal those of `config.length = num_steps` (the unused cache
      slots are masked; scores agree to float32 rounding). None: L steps.

  Returns:
    A :class:`BeamResult` with `tokens [S, k, P + L]` and `scores [S, k]`,
    best first per search.
  """
  prompts = jnp.asarray(prompts, jnp.int32)
  bag_ids = jnp.asarray(bag_ids, jnp.int32)
  if prompts.ndim != 3:
    raise LeakjaxError(
      f'prompts must be [searches, prompts, length], got shape {prompts.shape}'
    )
  if prompt_mask is None:
    prompt_mask = jnp.ones(prompts.shape[:2], bool)
  if bag_mask is None:
    bag_mask = jnp.ones(bag_ids.shape, bool)
  # A static size, so checked under jit too; the mask only when concrete.
  if not bag_ids.size or (
    not isinstance(bag_mask, jax.core.Tracer) and not np.any(bag_mask)
  ):
    raise LeakjaxError(
      f'the bag of words is empty (bag_ids of shape {bag_ids.shape}, no'
      ' unmasked entry)',
      'the beam search needs at least one candidate token: pass a non-empty'
      ' bag [M], e.g. extract_bag(...).ids',
    )
  if (prior is None) != (prior_lengths is None):
    raise LeakjaxError('pass prior and prior_lengths together')
  # Eager calls check the user's ids (the real entries only); under jit
  # the arrays are traced and pass unchecked.
  for ids, mask, what in (
    (prompts, prompt_mask, 'prompt ids'),
    (bag_ids, bag_mask, 'bag ids'),
  ):
    if not isinstance(ids, jax.core.Tracer) and not isinstance(
      mask, jax.core.Tracer
    ):
      check_token_ids(
        np.asarray(ids)[np.asarray(mask, bool)], model.vocab_size, what
      )
  if prior is not None:
    prior = jnp.asarray(prior, jnp.int32)
    prior_lengths = jnp.asarray(prior_lengths, jnp.int32)
  sharding.check_data_axis(mesh)
  params = sharding.constrain_replicated(params, mesh)
  if num_steps is not None:
    num_steps = jnp.asarray(num_steps, jnp.int32)
    if not isinstance(num_steps, jax.core.Tracer) and not (
      1 <= int(num_steps) <= config.length
    ):
      raise LeakjaxError(
        f'num_steps must be in [1, {config.length}] (the buffer length),'
        f' got {int(num_steps)}'
      )
  tokens, scores = jax.vmap(
    functools.partial(
      _search_one, model, config=config, mesh=mesh, num_steps=num_steps
    ),
    in_axes=(None, 0, 0, None, None, None, None),
  )(
    params,
    prompts,
    prompt_mask,
    bag_ids,
    bag_mask,
    prior,
    prior_lengths,
  )
  return BeamResult(
    tokens=tokens, scores=scores, prompt_length=prompts.shape[2]
  )


# ---------------------------------------------------------------- prompts
def capitalised_tokens(tokenizer, bag_ids: Sequence[int]) -> list[int]:
  """Bag tokens whose text begins with a capital letter (FILM Sec. 4.3).

  A token that starts with a space (' Houston') is a word inside a
  sentence, so only tokens whose first character is upper case qualify.
  """
  strings = tokenizer.token_strings()
  return [int(t) for t in bag_ids if strings[int(t)][:1].isupper()]


def make_prompts(
  tokenizer,
  bag_ids: Sequence[int],
  *,
  use_bos: bool = True,
  mode: str = 'capital',
) -> list[list[int]]:
  """Start prompts for the beam search (FILM Sec. 4.3).

  Args:
    tokenizer: the model's tokenizer.
    bag_ids: the recovered bag.
    use_bos: start each prompt with the tokenizer's BOS (the client's
      sentences were trained with one).
    mode: 'capital' -- BOS + each capitalised bag token (falls back to
      'bos' if the bag has none); 'bos' -- BOS alone, so that the model
      picks the first word from the bag.

  Returns:
    A list of prompts, all of the same length.
  """
  if mode not in ('capital', 'bos'):
    raise LeakjaxError(
      f'unknown prompt mode {mode!r}', "use 'capital' or 'bos'"
    )
  bos = [tokenizer.bos_id] if use_bos and tokenizer.bos_id is not None else []
  capital = [bos + [t] for t in capitalised_tokens(tokenizer, bag_ids)]
  if mode == 'capital' and capital:
    return capital
  if not bos:
    raise LeakjaxError(
      'no BOS token and no capitalised bag token to start the beam search from',
      'pass prompts explicitly',
    )
  return [bos]


def prompt_batches(
  prompts: Sequence[Sequence[int]],
  *,
  per_search: int = 1,
  pad_to: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Packs prompts into `[S, Z, P]` searches with a validity mask.

  Args:
    prompts: prompts of one length P.
    per_search: Z, prompts that share one search's k beams (1: every prompt
      gets its own beams; len(prompts): Alg. 1's single pool).
    pad_to: round S up to a multiple of this (fixed shapes across batches,
      or divisibility by the number of devices).

  Returns:
    `(prompts int32 [S, Z, P], mask bool [S, Z])`.
  """
  if not prompts:
    raise LeakjaxError('no prompts to start the beam search from')
  lengths = {len(p) for p in prompts}
  if len(lengths) != 1 or 0 in lengths:
    raise LeakjaxError(
      f'prompts must share one positive length, got {sorted(lengths)}'
    )
  z = max(1, per_search)
  s = -(-len(prompts) // z)
  if pad_to:
    s = -(-s // pad_to) * pad_to
  arr = np.zeros((s * z, lengths.pop()), np.int32)
  mask = np.zeros((s * z,), bool)
  arr[: len(prompts)] = np.asarray(prompts, np.int32)
  mask[: len(prompts)] = True
  arr[len(prompts) :] = arr[0]  # padding rows: valid ids, masked out
  return arr.reshape(s, z, -1), mask.reshape(s, z)


def best_sequences(
  result: BeamResult, top: int | None = None
) -> list[tuple[float, list[int]]]:
  """All finished beams of all searches as `(score, tokens)`, best first."""
  tokens = np.asarray(result.tokens).reshape(-1, result.tokens.shape[-1])
  scores = np.asarray(result.scores).reshape(-1)
  order = np.argsort(-scores, kind='stable')
  out, seen = [], set()
  for i in order:
    if not np.isfinite(scores[i]):
      continue
    key = tuple(tokens[i].tolist())
    if key in seen:
      continue
    seen.add(key)
    out.append((float(scores[i]), list(key)))
    if top is not None and len(out) >= top:
      break
  return out


__all__ = [
  'BagBeamState',
  'BeamResult',
  'BeamSearchConfig',
  'bag_beam_search',
  'best_sequences',
  'capitalised_tokens',
  'make_prompts',
  'ngram_followers',
  'prompt_batches',
]
