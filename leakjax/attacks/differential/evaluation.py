"""The attack of the canary experiment on one (M, M') pair (Sec. 3).

:class:`Attack` jits and runs the DS scoring (:func:`score_sequences`,
Definition 3.1) and Algorithm 1 over the whole vocabulary with the width
halved at each step (:func:`search_sequences`), optionally sharded;
:func:`dr_bounds` bounds a canary's differential rank (Prop. 3.3) and
:func:`evaluate_pair` gives one result row per canary and known prefix
(RQ3).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import sharding
from leakjax._jit import jitted
from leakjax.attacks.differential.canaries import (
  CANARY_LENGTH,
  Canary,
  hamming_close,
)
from leakjax.attacks.differential.rank_search import (
  SearchResult,
  halving_widths,
  rank_beam_search,
  ranked,
)
from leakjax.attacks.differential.score import (
  differential_rank_lower_bound,
  differential_score,
)

if TYPE_CHECKING:
  from leakjax.attacks.differential.runner import DifferentialConfig


# The static arguments of each kernel under `jax.jit` (hashable, no arrays).
SCORE_STATIC = ('model', 'num_context')
SEARCH_STATIC = ('model', 'widths', 'length', 'num_groups', 'score', 'mesh')


def score_sequences(model, params, params_prime, ids, *, num_context: int):
  """DS and relative DS of `ids` on M (`params`) and M' (`params_prime`).

  M and M' are snapshots of one model, so `model` serves both.
  """
  return differential_score(
    model, model, params, params_prime, ids, num_context=num_context
  )


def search_sequences(
  model,
  params,
  params_prime,
  context,
  *,
  widths: tuple[int, ...],
  length: int,
  num_groups: int,
  score: str,
  mesh=None,
) -> SearchResult:
  """Algorithm 1 over the whole vocabulary for M (`params`) against M'."""
  return rank_beam_search(
    model,
    model,
    params,
    params_prime,
    context,
    widths=widths,
    length=length,
    num_groups=num_groups,
    score=score,
    mesh=mesh,
  )


class Attack:
  """DS scoring and DR searches for one M against many M'.

  Both jit the module's kernels (:func:`score_sequences`,
  :func:`search_sequences`) with :data:`SCORE_STATIC` / :data:`SEARCH_STATIC`
  static, so they compile once per shape for the model and never again for
  new parameters. With a `mesh` both are data-parallel over
  its `'data'` axis: the DS batch is padded to a multiple of the
  axis size and split over it, the search splits its beam rows
  (`rank_beam_search(mesh=...)`), and the parameters of M and M' are
  replicated. Results equal the unsharded ones up to float32 rounding.
  """

  def __init__(self, model, cfg: DifferentialConfig, mesh=None):
    self.model = model
    self.cfg = cfg
    self.mesh = mesh
    self.bos = model.tokenizer.bos_id
    self.widths = {
      n: halving_widths(
        model.vocab_size, n, min_width=cfg.min_width, num_groups=cfg.num_groups
      )
      for n in range(1, CANARY_LENGTH + 1)
    }

  def scores(self, params, params_prime, ids: np.ndarray, num_context: int):
    ids, num = sharding.pad_to_multiple(
      np.asarray(ids, np.int32), sharding.data_size(self.mesh)
    )
    score = jitted(score_sequences, static_argnames=SCORE_STATIC)
    s = score(
      self.model,
      *sharding.replicate((params, params_prime), self.mesh),
      sharding.shard_batch(jnp.asarray(ids), self.mesh),
      num_context=num_context,
    )
    return jax.tree.map(lambda x: x[:num], sharding.to_host(s))

  def search_options(self, length: int) -> dict[str, Any]:
    """The static arguments of :func:`search_sequences` for `length`."""
    return dict(
      widths=self.widths[length],
      length=length,
      num_groups=self.cfg.num_groups,
      score=self.cfg.score,
      mesh=self.mesh,
    )

  def search(
    self, params, params_prime, context: Sequence[int], length: int
  ) -> SearchResult:
    search = jitted(search_sequences, static_argnames=SEARCH_STATIC)
    result = search(
      self.model,
      *sharding.replicate((params, params_prime), self.mesh),
      jnp.asarray(context, jnp.int32),
      **self.search_options(length),
    )
    return sharding.to_host(ranked(result, self.cfg.score))


def dr_bounds(
  found: SearchResult,
  target: np.ndarray,
  value: np.ndarray,
  own: np.ndarray,
  score: str,
) -> tuple[int, int]:
  """Prop. 3.3 bounds on the DR of `target [n]` scoring `value [1]`.

  Returns:
    `(dr, dr_own)`: found sequences other than `target` that score higher,
    all of them / only those marked `own [S]` (`found` holds one list).
  """
  dr = differential_rank_lower_bound(found, target[None], value, score=score)
  # Not own: scored -inf, so never higher.
  masked = jnp.where(own[None], getattr(found, score), -jnp.inf)
  dr_own = differential_rank_lower_bound(
    found.replace(**{score: masked}), target[None], value, score=score
  )
  return int(dr[0]), int(dr_own[0])


def evaluate_pair(
  attack: Attack,
  params,
  params_prime,
  canaries: Sequence[Canary],
  planted: Sequence[Canary],
  prefix_lengths: Sequence[int],
  tokenizer,
  top: int,
) -> list[dict[str, Any]]:
  """DS, relative DS and DR bounds of each canary for one (M, M').

  With a known prefix (RQ3) a canary is searched again only if its bound
  without the prefix is above 0: if no sequence of T^5 scores above the
  canary, none with the canary's prefix does either (the prefix's own DS is
  common to all of them), so its rank given the prefix is 0 as well, as far
  as the search can tell. Such rows carry `searched: False`.
  """
  cfg = attack.cfg
  rows = []
  ranked_at_zero = set()
  for p in sorted(prefix_lengths):
    # The adversary knows the canary's first p words (RQ3), so each canary
    # has its own context; without a prefix one search serves all canaries.
    todo = [c for c in canaries if c.text not in ranked_at_zero]
    groups = [list(canaries)] if p == 0 else [[c] for c in todo]
    for c in canaries:
      if p and c.text in ranked_at_zero:
        context = [attack.bos] + list(c.ids[:p])
        s = attack.scores(
          params,
          params_prime,
          np.asarray([context + list(c.ids[p:])], np.int32),
          len(context),
        )
        rows.append(
          {
            'canary': c.kind,
            'text': c.text,
            'prefix': p,
            'ds': float(s.ds[0]),
            'rel_ds': float(s.rel_ds[0]),
            'dr': 0,
            'dr_own': 0,
            'searched': False,
          }
        )
    for group in groups:
      context = [attack.bos] + list(group[0].ids[:p])
      start = time.perf_counter()
      found = attack.search(params, params_prime, context, CANARY_LENGTH - p)
      search_s = time.perf_counter() - start
      seqs = np.asarray(found.sequences[0])  # [S, n - p]
      found_scores = np.asarray(getattr(found, cfg.score)[0])
      for c in group:
        ids = np.asarray([context + list(c.ids[p:])], np.int32)
        s = attack.scores(params, params_prime, ids, len(context))
        target = np.asarray(c.ids[p:])
        others = [o.ids[p:] for o in planted if o.text != c.text]
        own = ~hamming_close(seqs, others)
        dr, dr_own = dr_bounds(
          found, target, getattr(s, cfg.score)[:1], own, cfg.score
        )
        if p == 0 and dr_own == 0:
          ranked_at_zero.add(c.text)
        same = np.all(seqs == target[None], -1)
        is_found = bool(np.any(same))
        token_ds = np.asarray(s.token_ds[0, len(context) - 1 :])
        rows.append(
          {
            'canary': c.kind,
            'text': c.text,
            'prefix': p,
            'searched': True,
            'ds': float(s.ds[0]),
            'rel_ds': float(s.rel_ds[0]),
            'token_ds': token_ds.tolist(),
            'dr': dr,
            'dr_own': dr_own,
            'found': is_found,
            'found_rank': (int(np.argmax(same)) if is_found else None),
            'num_found': int(len(seqs)),
            'min_found_score': float(found_scores.min()),
            'search_seconds': search_s,
            'top': [
              {
                'text': tokenizer.decode(
                  context[1:] + list(q), skip_special=False
                ),
                'ds': float(d),
                'rel_ds': float(r),
              }
              for q, d, r in zip(
                seqs[:top], found.ds[0][:top], found.rel_ds[0][:top]
              )
            ],
          }
        )
  return rows
