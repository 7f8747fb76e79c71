r"""Exact inversion of hidden states: sequential verification with proposals.

Nikolaou et al., "Language Models are Injective and Hence Invertible"
(arXiv 2510.15511): a decoder-only transformer maps distinct prompts to
distinct hidden states, so the state `H^l_t` of position t, given the true
prefix, identifies token t. Their SipIt recovers a prompt one position at
a time, checking candidate tokens until one reproduces the observed state.
What costs is the order of the candidates; ours (no paper does this):

1. the learned inverse's per-position ranking (the ridge inverse of the
   layer, Embed Parrot's linear skip, then HEI's cosine on its output:
   :func:`proposal_scores`),
2. the LM's next-token prior given the verified prefix,
3. the rest of the vocabulary, in the learned inverse's order.

The kernel (:func:`check_candidates`, pure, fixed shapes) runs C candidate
rows at once. Each row is the verified prefix, one candidate at position
t and the learned inverse's best guess at every later position; by
causality the row's state at t depends only on the prefix and the
candidate, and its later states verify the guesses that follow as far as
they are right (speculative verification: one forward pass can verify
many positions).

Acceptance needs no truth (:class:`ExactConfig`):

* `rule='tolerance'` -- the observed states are the model's own (up to
  float32 rounding of another batch or padding): a candidate is accepted
  when its distance to `H^l_t` is at most `rel_tol * |H^l_t|`; two
  candidates within it are a near-tie, reported undecided, never guessed.
* `rule='nearest'` -- perturbed states (noise, rounding, a defense): the
  nearest candidate checked so far is accepted once it is at most `gap`
  times the second nearest; after the whole vocabulary the nearest is
  taken and the position marked undecided when the gap rule fails.

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

from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei
from leakjax.errors import LeakjaxError

RULES = ('tolerance', 'nearest')


@dataclasses.dataclass(frozen=True)
class ExactConfig:
  """How candidates are proposed, checked and accepted.

  Attributes:
    rule: 'tolerance' (the model's own states) or 'nearest' (perturbed
      states); see the module docstring.
    rel_tol: the tolerance rule's distance, relative to the observed
      state's norm.
    gap: the nearest rule's ratio of the nearest to the second nearest.
    first_chunk: candidates in the first check of a position (the learned
      inverse's and the LM's best).
    chunk: candidates per later check.
    prior_top: the LM prior's candidates placed after the learned
      inverse's first `first_chunk // 2`.
    max_candidates: candidates checked per position before giving up
      (None: the whole vocabulary).
  """

  rule: str = 'tolerance'
  rel_tol: float = 1e-3
  gap: float = 0.2
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
      a row's guess count 1).
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


def check_candidates(
  model,
  params,
  rows: Int[Array, 'c w'],
  mask: Int[Array, 'c w'],
  observed: Float[Array, 'w d'],
  layer,
  position: Int[Array, ''],
) -> tuple[Float[Array, 'c w'], Float[Array, 'c v']]:
  """Distances of every row's layer states to the observed ones, and the
  LM's next-token log-probabilities at `position` (for position + 1).

  Pure, fixed shapes (jit it with `model` and `layer` static): `rows` are
  C candidate sequences padded to width W; `distances[c, j]` is
  `|H^layer(rows[c])_j - observed_j|`.
  """
  states = model.hidden_states(params, rows, mask)
  if layer == bei_hei.LAST:
    mine = bei_hei.final_norm(model, params, states[-1])
  else:
    mine = states[int(layer)]
  diff = mine.astype(jnp.float32) - observed.astype(jnp.float32)[None]
  distances = jnp.sqrt(jnp.sum(diff * diff, axis=-1))
  last = jax.lax.dynamic_index_in_dim(states[-1], position, 1, keepdims=False)
  logits = model.lm_head(params, last).astype(jnp.float32)
  return distances, jax.nn.log_softmax(logits, axis=-1)


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
  cosine (Wan et al. Eq. 9) on the ridge inverse's `H^0` (identity without
  a kernel)."""
  x = hidden.astype(jnp.float32)
  if kernel is not None:
    x = ((x - shift) / scale) @ kernel + bias
  return bei_hei.cosine_scores(x, embeddings)


def _order(scores: np.ndarray, prior: np.ndarray | None, config) -> np.ndarray:
  """Every vocabulary id once, in proposal order (module docstring)."""
  ranked = np.argsort(-scores, kind='stable')
  head = list(ranked[: max(1, config.first_chunk // 2)])
  if prior is not None:
    for tok in np.argsort(-prior, kind='stable')[: config.prior_top]:
      if tok not in head:
        head.append(int(tok))
  seen = set(int(t) for t in head)
  rest = [int(t) for t in ranked if int(t) not in seen]
  return np.asarray([int(t) for t in head] + rest, np.int64)


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
) -> Inversion:
  """Recovers the `length` tokens whose layer states are `observed`.

  Args:
    model: the target; params: its parameters.
    observed: float `[>= length, D]`: the sent states (padding after).
    length: the number of real positions.
    layer: the layer of the states (int or 'last').
    scores: float `[>= length, V]`: :func:`proposal_scores` of the states.
    config: proposals and acceptance.
    width: the rows' padded width (one compile per width); None: length.
  """
  start = time.perf_counter()
  width = width or length
  vocab = model.vocab_size
  check = jitted(check_candidates, static_argnames=CHECK_STATIC)
  observed_w = np.zeros((width, observed.shape[-1]), np.float32)
  observed_w[:length] = observed[:length]
  norms = np.linalg.norm(observed_w, axis=-1)
  tol = config.rel_tol * norms
  guess = np.asarray(scores[:length]).argmax(-1)
  bos = getattr(getattr(model, 'tokenizer', None), 'bos_id', None)
  ids = list(guess)
  decided = [True] * length
  checked = [1] * length
  t = 0
  prior = None
  if bos is not None:
    ids[0] = bos
    t = 1
  limit = config.max_candidates or vocab
  embeddings = np.asarray(model.word_embeddings(params), np.float32)
  while t < length:
    order = _order(np.asarray(scores[t]), prior, config)[:limit]
    offset, best, accepted = 0, [], None
    while offset < len(order) and accepted is None:
      size = config.first_chunk if offset == 0 else config.chunk
      cands = order[offset : offset + size]
      rows = np.tile(np.asarray(ids, np.int32), (size, 1))
      rows = np.pad(rows, ((0, 0), (0, width - length)))
      rows[: len(cands), t] = cands
      rows[len(cands) :, t] = cands[0]  # filler rows repeat the first
      mask = np.zeros((size, width), np.int32)
      mask[:, :length] = 1
      dist, logp = check(
        model,
        params,
        jnp.asarray(rows),
        jnp.asarray(mask),
        jnp.asarray(observed_w),
        layer,
        jnp.asarray(t, jnp.int32),
      )
      dist = np.asarray(dist)[: len(cands)]
      best.extend(zip(dist[:, t].tolist(), range(offset, offset + len(cands))))
      best.sort()
      accepted, tie = _accept(
        best, tol[t], config, len(order) - offset - len(cands)
      )
      if accepted is not None and config.rule == 'tolerance' and not tie:
        # Near-identical input embeddings give near-identical states: a
        # twin of the accepted token that was not checked is checked now.
        seen = set(order[: offset + len(cands)].tolist())
        twins = [
          int(v)
          for v in _twins(embeddings, int(order[accepted]), config.rel_tol)
          if int(v) not in seen
        ]
        if twins:
          rows = np.tile(np.asarray(ids, np.int32), (len(twins), 1))
          rows = np.pad(rows, ((0, 0), (0, width - length)))
          rows[:, t] = twins
          twin_mask = np.zeros((len(twins), width), np.int32)
          twin_mask[:, :length] = 1
          twin_dist, _ = check(
            model,
            params,
            jnp.asarray(rows),
            jnp.asarray(twin_mask),
            jnp.asarray(observed_w),
            layer,
            jnp.asarray(t, jnp.int32),
          )
          tie = bool(np.any(np.asarray(twin_dist)[:, t] <= tol[t]))
      if accepted is not None:
        row = accepted - offset
        ids[t] = int(order[accepted])
        checked[t] = accepted + 1
        decided[t] = not tie
        if 0 <= row < len(cands):
          # The accepted row verifies its guesses while they match.
          j = t + 1
          while (
            j < length
            and dist[row, j] <= tol[j]
            and config.rule == 'tolerance'
            # A guess with a twin goes through the twin check instead.
            and not len(_twins(embeddings, int(ids[j]), config.rel_tol))
          ):
            j += 1
          t_next = j
          prior = np.asarray(logp)[row] if t_next == t + 1 else None
        else:
          t_next = t + 1
          prior = None
        t = t_next
        break
      offset += len(cands)
    if accepted is None:
      # The vocabulary (or the budget) is spent: the nearest, undecided.
      ids[t] = int(order[best[0][1]])
      decided[t], checked[t] = False, offset
      prior = None
      t += 1
  return Inversion(
    ids=[int(x) for x in ids],
    decided=decided,
    checked=checked,
    seconds=time.perf_counter() - start,
  )


def _twins(embeddings: np.ndarray, token: int, rel: float) -> np.ndarray:
  """Tokens whose input embedding is within `rel` x |e_token| of token's."""
  e = embeddings[token]
  d = np.linalg.norm(embeddings - e[None], axis=-1)
  near = np.flatnonzero(d <= rel * max(float(np.linalg.norm(e)), 1e-12))
  return near[near != token]


def _accept(best, tol, config, remaining) -> tuple[int | None, bool]:
  """The accepted candidate's index into the order (None: check more) and
  whether it is a near-tie."""
  d0, i0 = best[0]
  d1 = best[1][0] if len(best) > 1 else np.inf
  if config.rule == 'tolerance':
    if d0 > tol:
      return None, False
    return i0, d1 <= tol
  del remaining
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
) -> list[Inversion]:
  """:func:`invert_sentence` for every row of `observed [N, W, D]` (real
  lengths `lengths [N]`, proposal scores `scores [N, W, V]`)."""
  width = observed.shape[1]
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
  'proposal_scores',
]
