r"""Exact inversion of hidden states: sequential verification with proposals.

Nikolaou et al., "Language Models are Injective and Hence Invertible"
(arXiv 2510.15511): a decoder-only transformer maps distinct prompts to
distinct hidden states, so the state `H^l_t` of position t, given the true
prefix, identifies token t. Their SipIt recovers a prompt one position at
a time, checking candidate tokens until one reproduces the observed state.
What costs is the order of the candidates and the price of each check.
The order (ours; no paper does this):

1. the learned inverse's per-position ranking (HEI's cosine on the output
   of a linear inverse of the layer, :func:`proposal_scores`: the
   runner's is :mod:`.softmax_inverse`, Embed Parrot's ridge-fitted linear
   skip trained further to rank the true token first),
2. the LM's next-token prior given the verified prefix,
3. the rest of the vocabulary, the two rankings interleaved.

The checks are pure functions of fixed shapes over the verified prefix's
key/value cache (:meth:`leakjax.models.Model.stream_decode`, the first
`layer` blocks only): :func:`check_candidates` puts C candidates at
position t, one token each through the cached blocks;
:func:`check_guesses` runs one row of the learned inverse's guesses at
t, t + 1, ... (by causality each guess's state depends only on the prefix
and the guesses before it, so one row verifies every guess up to the first
wrong one: speculative verification); :func:`commit` appends a verified
token and returns the LM's prior for the next position.

Acceptance needs no truth (:class:`ExactConfig`):

* `rule='tolerance'` -- the observed states are the model's own (up to
  float32 rounding of another batch or padding): a candidate is accepted
  when its distance to `H^l_t` is at most `rel_tol * |H^l_t|`; two
  candidates within it are a near-tie, reported undecided, never guessed.
* `rule='nearest'` -- perturbed states (noise, rounding, a defense): the
  nearest candidate checked so far is accepted once it is at most `gap`
  times the second nearest; after the whole vocabulary the nearest is
  taken and the position marked undecided when the gap rule fails.
* `rule='calibrated'` -- states with i.i.d. Gaussian noise of unknown std
  on every coordinate: the tolerance rule with the tolerance read off the
  noise's own residuals. The attacker computes the BOS's clean state, so
  its residual `|n_0|^2` estimates `D sigma^2`, and so does every position
  accepted since (the residual of its accepted token): the estimate is
  their mean over k positions. The true token's `d^2 = |n_t|^2` is `D
  sigma^2 (1 +- sqrt(2 / D))` (chi-square with D degrees of freedom: one
  standard deviation), the estimate's spread that over sqrt(k), so a
  tolerance of z standard deviations of their difference is `d^2 <= est
  (1 + z sqrt(2 / D) sqrt(1 + 1 / k))` (with the BOS alone, k = 1: `est
  (1 + 2 z / sqrt(D))`). A wrong token sits at about `d^2 = Delta^2 + D sigma^2`,
  Delta its clean distance: under strong noise a wrong token near the
  true one is within any tolerance that keeps the true one, so it is never
  accepted unseen. Each position's first check is a whole `chunk` of
  proposals (no speculative row: the learned inverse's guess is often
  such a near wrong token), whose nearest is accepted when within
  `noise_z_early`; otherwise the search checks `noise_confirm`
  candidates and takes the nearest once it is within `noise_z` (the
  likeliest token among many checked), going on through the budget when
  none is, then the nearest, undecided. Neither tolerance is below the tolerance rule's (noise smaller
  than float32 rounding). It needs a BOS. The first position after the
  BOS is where the learned inverse proposes worst and the estimate rests
  on the BOS alone; its state depends on the BOS and the token only, so
  :func:`first_states` computes every token's there once per model and
  layer, and the rule takes the nearest of the whole vocabulary, decided
  when it alone is within the `noise_z` tolerance.

Scale-out: with a `('data',)` mesh (`mesh=` of :func:`invert`) each
check's candidates are split over its devices, the parameters and the
prefix's caches replicated; the check itself does not know (chunks are
rounded up to a multiple of the data axis, padded with a real candidate).
:func:`check_candidates` is a pure function of its arrays, so it also vmaps
over sentences, each with its own one-row cache (tested); :func:`invert`
runs the sentences one after another, since each search stops at its own
candidate.

Decision: the first position is the tokenizer's BOS when the model has one
(the user's system adds it; the attacker knows the convention), so it is
not searched.

>>> result = invert_sentence(model, params, observed, length, layer=25,
...                          scores=scores, config=ExactConfig())  # +SKIP
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from leakjax import sharding
from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei
from leakjax.attacks.inversion.exact_order import (
  _Order,
  proposal_head,
  proposal_order,
)
from leakjax.errors import LeakjaxError

RULES = ('tolerance', 'nearest', 'calibrated')


def own_states_rule(dtype) -> str:
  """The acceptance rule for a model's own, unperturbed states computed in
  `dtype`: 'tolerance' in float32; in a lower precision (bfloat16) the
  states are the model's own rounding away from what the search recomputes,
  far past `rel_tol`, so the gap rule ('nearest'), as for rounded states."""
  return 'tolerance' if jnp.dtype(dtype) == jnp.float32 else 'nearest'


@dataclasses.dataclass(frozen=True)
class ExactConfig:
  """How candidates are proposed, checked and accepted.

  Attributes:
    rule: 'tolerance' (the model's own states), 'nearest' (perturbed
      states) or 'calibrated' (Gaussian noise); see the module docstring.
    rel_tol: the tolerance rule's distance, relative to the observed
      state's norm.
    gap: the nearest rule's ratio of the nearest to the second nearest.
    noise_z: the calibrated rule's tolerance after `noise_confirm`
      candidates, in standard deviations of the true token's squared
      distance less the noise estimate (module docstring).
    noise_z_early: its tolerance before them.
    noise_confirm: candidates it checks before the wider tolerance.
    first_chunk: candidates in the first check of a position (the learned
      inverse's and the LM's best; `chunk` under the calibrated rule).
    chunk: candidates per later check.
    prior_top: the LM prior's candidates placed after the learned
      inverse's first `first_chunk // 2` (the two rankings are interleaved
      after them); 0: the prior is not used.
    max_candidates: candidates checked per position before giving up
      (None: the whole vocabulary).
  """

  rule: str = 'tolerance'
  rel_tol: float = 1e-3
  gap: float = 0.2
  noise_z: float = 6.0
  noise_z_early: float = 1.0
  noise_confirm: int = 1024
  first_chunk: int = 8
  chunk: int = 128
  prior_top: int = 4
  max_candidates: int | None = None

  def __post_init__(self):
    if self.rule not in RULES:
      raise LeakjaxError(
        f'unknown acceptance rule {self.rule!r}', f'use one of {RULES}'
      )
    if not (self.rel_tol > 0 and 0 < self.gap < 1):
      raise LeakjaxError('rel_tol must be > 0 and gap in (0, 1)')
    if not 0 < self.noise_z_early <= self.noise_z or self.noise_confirm < 1:
      raise LeakjaxError(
        'the calibrated rule needs 0 < noise_z_early <= noise_z and'
        ' noise_confirm >= 1'
      )
    if min(self.first_chunk, self.chunk, self.prior_top + 1) < 1:
      raise LeakjaxError('first_chunk and chunk must be >= 1')


@dataclasses.dataclass(frozen=True)
class Inversion:
  """One sentence inverted.

  Attributes:
    ids: the recovered token ids, `length` of them.
    decided: per position, whether a candidate was accepted by the rule
      (False: a near-tie, or the nearest taken without its gap).
    checked: per position, candidates checked before the accepted one was
      found, itself included (1: the first proposal; positions verified by
      a row's guess count 1; under the calibrated rule, which compares
      them, every candidate checked).
    seconds: wall time.
  """

  ids: list[int]
  decided: list[bool]
  checked: list[int]
  seconds: float


def layer_of(model, hidden_states: jax.Array, layer) -> jax.Array:
  """`H^layer` from all states `[L + 1, ..., D]` (final-normed for 'last')."""
  if layer == bei_hei.LAST:
    return hidden_states[-1]
  return hidden_states[int(layer)]


def _layer_index(model, layer) -> int:
  return model.num_layers if layer == bei_hei.LAST else int(layer)


def _states(model, params, cache, ids, layer):
  """`H^layer` of `ids [b, t]` appended to `cache` (final-normed for
  'last'), float32, and the new cache."""
  states, cache = model.stream_decode(
    params, cache, ids, layer=_layer_index(model, layer)
  )
  if layer == bei_hei.LAST:
    states = bei_hei.final_norm(model, params, states)
  return states.astype(jnp.float32), cache


def _distance(states, observed) -> jax.Array:
  diff = states - observed.astype(jnp.float32)
  return jnp.sqrt(jnp.sum(diff * diff, axis=-1))


def candidate_states(
  model, params, cache, candidates: Int[Array, ' c'], layer
) -> Float[Array, 'c d']:
  """The layer states (float32) of C candidate tokens each placed at the
  next position after the one-row cached prefix."""
  states = model.stream_candidates(
    params, cache, candidates, layer=_layer_index(model, layer)
  )
  if layer == bei_hei.LAST:
    states = bei_hei.final_norm(model, params, states)
  return states.astype(jnp.float32)


def check_candidates(
  model,
  params,
  cache,
  candidates: Int[Array, ' c'],
  observed: Float[Array, ' d'],
  layer,
) -> Float[Array, ' c']:
  """Distances to the observed state of position t of the states of C
  candidate tokens placed at t after the verified prefix.

  Pure, fixed shapes (jit it with `model` and `layer` static): `cache` is
  the prefix's :meth:`Model.stream_decode` cache of one row (t tokens);
  only the candidates' own position runs through the first `layer`
  blocks, attending to the cached prefix
  (:meth:`Model.stream_candidates`: the cache is read in place, not
  copied per candidate).
  """
  states = candidate_states(model, params, cache, candidates, layer)
  return _distance(states, observed[None])


def check_guesses(
  model,
  params,
  cache,
  guesses: Int[Array, ' g'],
  observed: Float[Array, 'g d'],
  layer,
) -> Float[Array, ' g']:
  """Distances of the states of one row of guesses `t .. t + G - 1` after
  the cached prefix (speculative verification: by causality each guess's
  state depends only on the prefix and the guesses before it)."""
  states, _ = _states(model, params, cache, guesses[None], layer)
  return _distance(states[0], observed)


def commit(model, params, stream, full, token: Int[Array, ' 1'], layer):
  """Appends a verified token to both caches; returns them and the LM's
  next-token log-probabilities after it `[V]`."""
  _, stream = model.stream_decode(
    params, stream, token[None], layer=_layer_index(model, layer)
  )
  logits, full = model.decode(params, full, token[None])
  return stream, full, jax.nn.log_softmax(logits[0, -1].astype(jnp.float32))


CHECK_STATIC = ('model', 'layer')


def proposal_scores(
  hidden: Float[Array, 't d'],
  embeddings: Float[Array, 'v d'],
  kernel: Float[Array, 'd d'] | None = None,
  bias: Float[Array, ' d'] | None = None,
  shift: Float[Array, ' d'] | None = None,
  scale: Float[Array, ' d'] | None = None,
) -> Float[Array, 't v']:
  """The learned inverse's score of every token at every position: HEI's
  cosine (Wan et al. Eq. 9) on a linear inverse's `H^0` (identity without
  a kernel)."""
  x = hidden.astype(jnp.float32)
  if kernel is not None:
    x = ((x - shift) / scale) @ kernel + bias
  return bei_hei.cosine_scores(x, embeddings)


class _Twins:
  """Tokens whose input embedding is within `rel` x |e_token| of a token's
  (their states are as near as the tolerance: a near-tie).

  Only tokens whose projection on one fixed direction lies within that
  distance can be twins (a projection never grows a distance), so each
  query sorts nothing and measures a handful of rows.
  """

  def __init__(self, embeddings: np.ndarray, rel: float):
    self.embeddings = embeddings
    self.norms = np.linalg.norm(embeddings, axis=-1)
    direction = np.random.default_rng(0).standard_normal(embeddings.shape[-1])
    self.proj = embeddings @ (direction / np.linalg.norm(direction))
    self.by_proj = np.argsort(self.proj, kind='stable')
    self.sorted_proj = self.proj[self.by_proj]
    self.rel = rel
    self.memo: dict[int, np.ndarray] = {}

  def __call__(self, token: int) -> np.ndarray:
    if token not in self.memo:
      bound = self.rel * max(float(self.norms[token]), 1e-12)
      centre = self.proj[token]
      lo = np.searchsorted(self.sorted_proj, centre - bound, 'left')
      hi = np.searchsorted(self.sorted_proj, centre + bound, 'right')
      near = self.by_proj[lo:hi]
      d = np.linalg.norm(
        self.embeddings[near] - self.embeddings[token], axis=-1
      )
      near = near[(d <= bound) & (near != token)]
      self.memo[token] = np.sort(near)
    return self.memo[token]


def _padded(tokens, size: int) -> jax.Array:
  out = np.full((size,), tokens[0], np.int32)
  out[: len(tokens)] = tokens
  return jnp.asarray(out)


def _bos_of(model) -> int | None:
  return getattr(getattr(model, 'tokenizer', None), 'bos_id', None)


def first_states(
  model, params, layer, *, chunk: int = 512, mesh=None, progress=None
) -> np.ndarray:
  """`[V, D]` float32: the layer state of every token at the first
  position after the BOS.

  That state depends on the BOS and the token alone, so one table per
  model and layer serves every sentence: the calibrated rule compares the
  whole vocabulary there (:func:`invert_sentence`'s `first`). Costs one
  full-vocabulary check; `progress(done, total)` after each chunk.
  """
  bos = _bos_of(model)
  if bos is None:
    raise LeakjaxError('first_states needs a model with a BOS')
  sharding.check_data_axis(mesh)
  params = sharding.replicate(params, mesh)
  size = -(-chunk // sharding.data_size(mesh)) * sharding.data_size(mesh)
  cache = model.init_stream_cache(
    params, 1, 2, layer=_layer_index(model, layer)
  )
  _, cache = jitted(_states, static_argnames=CHECK_STATIC)(
    model, params, cache, jnp.asarray([[bos]], jnp.int32), layer
  )
  cache = sharding.replicate(cache, mesh)
  states = jitted(candidate_states, static_argnames=CHECK_STATIC)
  vocab = model.vocab_size
  out = None
  for s in range(0, vocab, size):
    tokens = np.arange(s, min(s + size, vocab))
    got = sharding.to_host(
      states(
        model,
        params,
        cache,
        sharding.shard_batch(_padded(tokens, size), mesh),
        layer,
      )
    )
    if out is None:
      out = np.empty((vocab, got.shape[-1]), np.float32)
    out[s : s + len(tokens)] = got[: len(tokens)]
    if progress is not None:
      progress(s + len(tokens), vocab)
  return out


def invert_sentence(
  model,
  params,
  observed: np.ndarray,
  length: int,
  *,
  layer,
  scores: np.ndarray,
  config: ExactConfig = ExactConfig(),  # noqa: B008 (frozen)
  width: int | None = None,
  mesh=None,
  first: np.ndarray | None = None,
) -> Inversion:
  """Recovers the `length` tokens whose layer states are `observed`.

  Args:
    model: the target; params: its parameters.
    observed: float `[>= length, D]`: the sent states (padding after).
    length: the number of real positions.
    layer: the layer of the states (int or 'last').
    scores: float `[>= length, V]`: :func:`proposal_scores` of the states.
    config: proposals and acceptance.
    width: the padded width (one compile per width); None: length.
    mesh: a mesh with a `'data'` axis to split each check's candidates
      over (None: one device); replicate `params` on it once beforehand
      (:func:`leakjax.sharding.replicate`) to spare a copy per sentence.
    first: :func:`first_states` of `model` at `layer`: under the
      calibrated rule the first position after the BOS is compared with
      every token (the whole vocabulary, whatever `max_candidates`);
      None: computed here (pass it to spare the cost per sentence).
  """
  start = time.perf_counter()
  sharding.check_data_axis(mesh)
  params = sharding.replicate(params, mesh)
  devices = sharding.data_size(mesh)
  width = width or length
  check = jitted(check_candidates, static_argnames=CHECK_STATIC)
  check_row = jitted(check_guesses, static_argnames=CHECK_STATIC)
  step = jitted(commit, static_argnames=CHECK_STATIC)
  observed_w = np.zeros((2 * width, observed.shape[-1]), np.float32)
  observed_w[:length] = observed[:length]
  tol = config.rel_tol * np.linalg.norm(observed_w, axis=-1)
  ids = [int(x) for x in np.asarray(scores[:length]).argmax(-1)]
  bos = _bos_of(model)
  if config.rule == 'calibrated' and bos is None:
    raise LeakjaxError(
      'the calibrated rule reads the noise off the BOS state, and this'
      ' model has no BOS',
      "use rule='nearest'",
    )
  if config.rule == 'calibrated' and length > 1 and first is None:
    first = first_states(model, params, layer, mesh=mesh)
  decided, checked = [True] * length, [1] * length
  twins = _Twins(
    np.asarray(model.word_embeddings(params), np.float32), config.rel_tol
  )
  tolerance = config.rule in ('tolerance', 'calibrated')
  calibrated = config.rule == 'calibrated'

  def fresh() -> dict:
    caches = {
      'stream': model.init_stream_cache(
        params, 1, 2 * width, layer=_layer_index(model, layer)
      ),
      'full': model.init_cache(params, 1, 2 * width),
    }
    return {**sharding.replicate(caches, mesh), 'prior': None}

  state = fresh()

  def verified(token: int) -> None:
    state['stream'], state['full'], logp = step(
      model,
      params,
      state['stream'],
      state['full'],
      jnp.asarray([token], jnp.int32),
      layer,
    )
    state['prior'] = np.asarray(logp)

  def distances(tokens, t: int) -> np.ndarray:
    size = (
      config.first_chunk if len(tokens) <= config.first_chunk else config.chunk
    )
    size = -(-size // devices) * devices  # whole shards
    got = check(
      model,
      params,
      state['stream'],
      sharding.shard_batch(_padded(tokens, size), mesh),
      jnp.asarray(observed_w[t]),
      layer,
    )
    return sharding.to_host(got)[: len(tokens)]

  dim = observed.shape[-1]
  residual = [0.0] * length  # each position's distance to its token

  def pool(upto: int) -> list[float]:
    # The noise estimate's squared residuals: the BOS, then each
    # accepted token before `upto`.
    return [residual[0] ** 2] + [
      residual[i] ** 2 for i in range(1, upto) if decided[i]
    ]

  def noise_tolerance(t: int, z: float, upto: int) -> float:
    # Never below the tolerance rule's: noise under float32 rounding.
    return max(float(tol[t]), noise_tolerance_of(pool(upto), z, dim))

  def search(t: int):
    """Position t's token, whether the rule accepted it, the candidates
    checked and its distance."""
    if calibrated and t == 1:
      # Every token's state there is in `first`: the nearest, decided
      # when it alone is within the wide tolerance.
      d = np.linalg.norm(first - observed_w[1], axis=-1)
      two = np.argpartition(d, 1)[:2]
      best = sorted(zip(d[two].tolist(), two.tolist()))
      accepted, tie = _accept(
        best, noise_tolerance(1, config.noise_z, 1), config
      )
      return best[0][1], accepted is not None and not tie, len(d), best[0][0]
    order = _Order(np.asarray(scores[t]), state['prior'], config, limit)
    offset, best, accepted, tie = 0, [], None, False
    confirmed = min(config.noise_confirm, len(order))
    within = tol[t]
    if calibrated:
      early, wide = noise_tolerance(t, config.noise_z_early, t), None
    while offset < len(order) and accepted is None:
      opening = config.chunk if calibrated else config.first_chunk
      size = opening if offset == 0 else config.chunk
      cands = order.upto(offset + size)[offset:]
      d = distances(cands, t)
      best = sorted(
        best + list(zip(d.tolist(), range(offset, offset + len(d))))
      )[:2]
      offset += len(cands)
      if calibrated:
        if offset >= confirmed and wide is None:
          wide = noise_tolerance(t, config.noise_z, t)
        within = early if wide is None else wide
      accepted, tie = _accept(best, within, config)
    if accepted is not None and tolerance and not tie:
      # Near-identical input embeddings give near-identical states: a
      # twin of the accepted token that was not checked is checked now.
      seen = set(order.upto(offset).tolist())
      rest = [v for v in twins(int(order[accepted])).tolist() if v not in seen]
      for s in range(0, len(rest), config.chunk):
        tie = tie or bool(
          np.any(distances(rest[s : s + config.chunk], t) <= within)
        )
    if accepted is None:
      # The vocabulary (or the budget) is spent: the nearest, undecided.
      return int(order[best[0][1]]), False, offset, best[0][0]
    # The calibrated rule compares every candidate it checked.
    count = offset if calibrated else accepted + 1
    return int(order[accepted]), not tie, count, best[0][0]

  def decode_from(t: int) -> None:
    while t < length:
      if config.rule == 'tolerance':
        # One row verifies the proposals' guesses while they match.
        row = np.full((width,), ids[t], np.int32)
        row[: length - t] = ids[t:length]
        d = np.asarray(
          check_row(
            model,
            params,
            state['stream'],
            jnp.asarray(row),
            jnp.asarray(observed_w[t : t + width]),
            layer,
          )
        )
        while t < length and d[0] <= tol[t] and not len(twins(ids[t])):
          verified(ids[t])
          d, t = d[1:], t + 1
        if t == length:
          break
      ids[t], decided[t], checked[t], residual[t] = search(t)
      verified(ids[t])
      t += 1

  t = 0
  if calibrated:
    # The BOS's residual: the noise of one position, |n_0|.
    residual[0] = float(
      np.asarray(
        check_row(
          model,
          params,
          state['stream'],
          jnp.full((width,), bos, jnp.int32),
          jnp.asarray(observed_w[:width]),
          layer,
        )
      )[0]
    )
  if bos is not None:
    ids[0] = bos
    verified(bos)
    t = 1
  limit = config.max_candidates or model.vocab_size
  decode_from(t)
  return Inversion(
    ids=[int(x) for x in ids],
    decided=decided,
    checked=checked,
    seconds=time.perf_counter() - start,
  )


def noise_tolerance_of(residuals, z: float, dim: int) -> float:
  """The calibrated rule's distance (module docstring): `z` standard
  deviations of a true token's squared residual less the mean of
  `residuals` (k squared residuals of known positions, all chi-square with
  `dim` degrees of freedom times `sigma^2`) above that mean."""
  est = float(np.mean(residuals))
  spread = np.sqrt(2 / dim) * np.sqrt(1 + 1 / len(residuals))
  return float(np.sqrt(est * max(1 + z * spread, 0.0)))


def _accept(best, tol, config) -> tuple[int | None, bool]:
  """The accepted candidate's index into the order (None: check more) and
  whether it is a near-tie."""
  d0, i0 = best[0]
  d1 = best[1][0] if len(best) > 1 else np.inf
  if config.rule in ('tolerance', 'calibrated'):
    if d0 > tol:
      return None, False
    return i0, d1 <= tol
  if len(best) > 1 and d0 <= config.gap * d1:
    return i0, False
  return None, False


def invert(
  model,
  params,
  observed: np.ndarray,
  lengths: np.ndarray,
  *,
  layer,
  scores: np.ndarray,
  config: ExactConfig = ExactConfig(),  # noqa: B008 (frozen)
  mesh=None,
  first: np.ndarray | None = None,
) -> list[Inversion]:
  """:func:`invert_sentence` for every row of `observed [N, W, D]` (real
  lengths `lengths [N]`, proposal scores `scores [N, W, V]`), the
  candidates of each check split over `mesh`'s data axis when given; the
  calibrated rule's :func:`first_states` computed once when not given."""
  width = observed.shape[1]
  params = sharding.replicate(params, mesh)
  if config.rule == 'calibrated' and first is None and width > 1:
    first = first_states(model, params, layer, mesh=mesh)
  return [
    invert_sentence(
      model,
      params,
      observed[i],
      int(lengths[i]),
      layer=layer,
      scores=scores[i],
      config=config,
      width=width,
      mesh=mesh,
      first=first,
    )
    for i in range(len(observed))
  ]


__all__ = [
  'CHECK_STATIC',
  'ExactConfig',
  'Inversion',
  'RULES',
  'candidate_states',
  'check_candidates',
  'first_states',
  'invert',
  'invert_sentence',
  'layer_of',
  'noise_tolerance_of',
  'own_states_rule',
  'proposal_head',
  'proposal_order',
  'proposal_scores',
]
