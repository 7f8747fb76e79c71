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
  BOS, whose clean state the attacker computes. Its residual `|n_0|^2`
  estimates `D sigma^2`; the true token's `d^2 = |n_t|^2` is then `D
  sigma^2 (1 +- 2 / sqrt(D))` (chi-square with D degrees of freedom, over
  an estimate with the same spread), while a wrong token sits at about
  `d^2 = Delta^2 + D sigma^2`, Delta its clean distance: under strong
  noise a wrong token near the true one is within any tolerance that
  keeps the true one. So two tolerances, `|n_0| sqrt(1 + z * 2 /
  sqrt(D))`: a candidate within `noise_z_early` is accepted at once;
  otherwise the search checks `noise_confirm` candidates and takes the
  nearest once it is within `noise_z` (the likeliest token among many
  checked), going on through the budget when none is, then the nearest,
  undecided. Neither tolerance is below the tolerance rule's (noise
  smaller than float32 rounding). It needs a BOS.

Scale-out: with a `('data',)` mesh (`mesh=` of :func:`invert`) each
check's candidates are split over its devices, the parameters and the
prefix's caches replicated; the check itself does not know (chunks are
rounded up to a multiple of the data axis, padded with a real candidate).

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
from leakjax.errors import LeakjaxError

RULES = ('tolerance', 'nearest', 'calibrated')


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
      distance (module docstring).
    noise_z_early: its tolerance before them.
    noise_confirm: candidates it checks before the wider tolerance.
    first_chunk: candidates in the first check of a position (the learned
      inverse's and the LM's best).
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
      a row's guess count 1; under the calibrated rule's wide tolerance,
      every candidate checked).
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
  states = model.stream_candidates(
    params, cache, candidates, layer=_layer_index(model, layer)
  )
  if layer == bei_hei.LAST:
    states = bei_hei.final_norm(model, params, states)
  return _distance(states.astype(jnp.float32), observed[None])


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


def proposal_order(
  scores: np.ndarray, prior: np.ndarray | None, config
) -> np.ndarray:
  """Every vocabulary id once, in proposal order (module docstring): the
  learned inverse's best `first_chunk // 2`, the prior's best `prior_top`,
  then the two rankings interleaved (a token's place is set by the better
  of its two ranks, so neither ranking's tail can bury a token the other
  ranks high)."""
  ranked = np.argsort(-scores, kind='stable')
  head = list(dict.fromkeys(ranked[: max(1, config.first_chunk // 2)].tolist()))
  if prior is None or not config.prior_top:
    rest = ranked
  else:
    by_prior = np.argsort(-prior, kind='stable')
    for tok in by_prior[: config.prior_top].tolist():
      if tok not in head:
        head.append(tok)
    place = np.empty(len(ranked), np.int64)
    place[ranked] = 2 * np.arange(len(ranked))
    place[by_prior] = np.minimum(
      place[by_prior], 2 * np.arange(len(ranked)) + 1
    )
    rest = np.argsort(place, kind='stable')
  seen = np.zeros(len(ranked), bool)
  seen[head] = True
  rest = rest[~seen[rest]]
  return np.concatenate([np.asarray(head, np.int64), rest.astype(np.int64)])


def _top(x: np.ndarray, k: int) -> np.ndarray:
  """The first entries of `np.argsort(-x, kind='stable')`: at least `k` of
  them (every tie of the k-th value is kept), without sorting all of x."""
  if k >= len(x):
    return np.argsort(-x, kind='stable')
  idx = np.argpartition(-x, k - 1)[:k]
  idx = np.flatnonzero(x >= x[idx].min())
  return idx[np.lexsort((idx, -x[idx]))]


def proposal_head(
  scores: np.ndarray, prior: np.ndarray | None, config, n: int
) -> np.ndarray:
  """`proposal_order(scores, prior, config)[:m]` for some m >= n, or the
  whole order, from the two rankings' heads only (a position accepted in
  its first check never sorts the vocabulary).

  Both rankings' first k entries are exact (:func:`_top`); a token outside
  both has an interleaved place of at least `min(2 k_s, 2 k_p + 1)`, so
  every head token with a smaller place is where the full order puts it.
  """
  k = n + config.first_chunk + config.prior_top
  ranked = _top(scores, k)
  if len(ranked) == len(scores):
    return proposal_order(scores, prior, config)
  head = list(dict.fromkeys(ranked[: max(1, config.first_chunk // 2)].tolist()))
  if prior is None or not config.prior_top:
    rest = ranked
  else:
    by_prior = _top(prior, k)
    if len(by_prior) == len(prior):
      return proposal_order(scores, prior, config)
    for tok in by_prior[: config.prior_top].tolist():
      if tok not in head:
        head.append(tok)
    place = {int(t): 2 * r for r, t in enumerate(ranked.tolist())}
    for r, t in enumerate(by_prior.tolist()):
      place[t] = min(place.get(t, 2 * r + 1), 2 * r + 1)
    bound = min(2 * len(ranked), 2 * len(by_prior) + 1)
    rest = np.asarray(
      sorted((t for t in place if place[t] < bound), key=place.__getitem__),
      np.int64,
    )
  seen = set(head)
  rest = [int(t) for t in rest if t not in seen]
  out = np.asarray(head + rest, np.int64)
  if len(out) < n:
    return proposal_order(scores, prior, config)
  return out


class _Order:
  """The first `limit` entries of a position's proposal order, computed
  only as far as the search reads them."""

  def __init__(self, scores, prior, config, limit: int):
    self.scores, self.prior, self.config = scores, prior, config
    self.size = min(limit, len(scores))
    self.known = np.zeros((0,), np.int64)

  def __len__(self) -> int:
    return self.size

  def upto(self, n: int) -> np.ndarray:
    n = min(n, self.size)
    if len(self.known) < n:
      if not len(self.known):
        self.known = proposal_head(self.scores, self.prior, self.config, n)
      if len(self.known) < n:
        self.known = proposal_order(self.scores, self.prior, self.config)
    return self.known[:n]

  def __getitem__(self, i: int) -> int:
    return int(self.upto(i + 1)[i])


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
  bos = getattr(getattr(model, 'tokenizer', None), 'bos_id', None)
  if config.rule == 'calibrated' and bos is None:
    raise LeakjaxError(
      'the calibrated rule reads the noise off the BOS state, and this'
      ' model has no BOS',
      "use rule='nearest'",
    )
  decided, checked = [True] * length, [1] * length
  twins = _Twins(
    np.asarray(model.word_embeddings(params), np.float32), config.rel_tol
  )
  tolerance = config.rule in ('tolerance', 'calibrated')
  state = {
    **sharding.replicate(
      {
        'stream': model.init_stream_cache(
          params, 1, 2 * width, layer=_layer_index(model, layer)
        ),
        'full': model.init_cache(params, 1, 2 * width),
      },
      mesh,
    ),
    'prior': None,
  }

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

  def distances(tokens) -> np.ndarray:
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

  t = 0
  if config.rule == 'calibrated':
    # The BOS's residual: the noise of one position, |n_0|.
    d_bos = np.asarray(
      check_row(
        model,
        params,
        state['stream'],
        jnp.full((width,), bos, jnp.int32),
        jnp.asarray(observed_w[:width]),
        layer,
      )
    )[0]
    # Never below the tolerance rule's: noise under float32 rounding.
    spread = 2 / np.sqrt(observed.shape[-1])
    floor = tol.copy()
    tol[:] = np.maximum(
      floor, d_bos * np.sqrt(1 + config.noise_z_early * spread)
    )
    wide = np.maximum(floor, d_bos * np.sqrt(1 + config.noise_z * spread))
  if bos is not None:
    ids[0] = bos
    verified(bos)
    t = 1
  limit = config.max_candidates or model.vocab_size
  while t < length:
    if tolerance:
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
    order = _Order(np.asarray(scores[t]), state['prior'], config, limit)
    offset, best, accepted, tie = 0, [], None, False
    while offset < len(order) and accepted is None:
      size = config.first_chunk if offset == 0 else config.chunk
      cands = order.upto(offset + size)[offset:]
      d = distances(cands)
      best = sorted(
        best + list(zip(d.tolist(), range(offset, offset + len(d))))
      )[:2]
      offset += len(cands)
      within = tol[t]
      confirmed = min(config.noise_confirm, len(order))
      if config.rule == 'calibrated' and offset >= confirmed:
        within = wide[t]
      accepted, tie = _accept(best, within, config)
    if accepted is not None and tolerance and not tie:
      # Near-identical input embeddings give near-identical states: a
      # twin of the accepted token that was not checked is checked now.
      seen = set(order.upto(offset).tolist())
      rest = [v for v in twins(int(order[accepted])).tolist() if v not in seen]
      for s in range(0, len(rest), config.chunk):
        tie = tie or bool(
          np.any(distances(rest[s : s + config.chunk]) <= within)
        )
    if accepted is None:
      # The vocabulary (or the budget) is spent: the nearest, undecided.
      ids[t], decided[t], checked[t] = int(order[best[0][1]]), False, offset
    else:
      # Accepted as the nearest of many (calibrated): all of them counted.
      late = config.rule == 'calibrated' and offset >= confirmed
      ids[t], decided[t], checked[t] = (
        int(order[accepted]),
        not tie,
        offset if late else accepted + 1,
      )
    verified(ids[t])
    t += 1
  return Inversion(
    ids=[int(x) for x in ids],
    decided=decided,
    checked=checked,
    seconds=time.perf_counter() - start,
  )


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
) -> list[Inversion]:
  """:func:`invert_sentence` for every row of `observed [N, W, D]` (real
  lengths `lengths [N]`, proposal scores `scores [N, W, V]`), the
  candidates of each check split over `mesh`'s data axis when given."""
  width = observed.shape[1]
  params = sharding.replicate(params, mesh)
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
    )
    for i in range(len(observed))
  ]


__all__ = [
  'CHECK_STATIC',
  'ExactConfig',
  'Inversion',
  'RULES',
  'check_candidates',
  'invert',
  'invert_sentence',
  'layer_of',
  'proposal_head',
  'proposal_order',
  'proposal_scores',
]
