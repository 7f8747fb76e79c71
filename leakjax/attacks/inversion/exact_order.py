"""The exact search's proposal order (:mod:`.exact`): every vocabulary id
once, the learned inverse's best first, then the LM prior's, then the two
rankings interleaved, computed only as far as the search reads it."""

from __future__ import annotations

import numpy as np


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


__all__ = ['proposal_head', 'proposal_order']
