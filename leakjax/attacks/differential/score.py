"""Differential score (Def. 3.1) and the differential-rank bound (Prop. 3.3).

Zanella-Beguelin et al., "Analyzing Information Leakage of Updates to Natural
Language Models", CCS 2020, Sec. 3. Given a model `M` trained on `D` and a
snapshot `M'` trained on `D' ⊋ D`, the token sequences whose probability rose
most from `M` to `M'` reveal the update `D' \\ D`.

* :func:`differential_score` -- Definition 3.1 for a batch of sequences, on
  both models in one pass::

    DS(t_1..t_n)     = sum_i  M'(t_<i)(t_i) - M(t_<i)(t_i)
    rel_DS(t_1..t_n) = sum_i [M'(t_<i)(t_i) - M(t_<i)(t_i)] / M(t_<i)(t_i)

  with `M(t_<i)(t_i)` the probability of `t_i` given the context and prefix.
* :func:`differential_rank_lower_bound` -- Proposition 3.3: the number of
  sequences returned by :func:`leakjax.attacks.differential.rank_beam_search`
  whose DS exceeds that of a given sequence is a lower bound on its
  differential rank `DR(s) = |{s' in T^n : DS(s') > DS(s)}|`.

Pure functions; the DS works with any :class:`leakjax.models.LanguageModel`
(only its `token_log_probs` is used), and the caller owns `jit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from leakjax import checks
from leakjax.errors import LeakjaxError

if TYPE_CHECKING:
  from leakjax.attacks.differential.rank_search import SearchResult

PyTree = Any
SCORES = ('ds', 'rel_ds')


# -------------------------------------------------------------- DS (Def 3.1)
@struct.dataclass
class DifferentialScores:
  """Differential scores of a batch of sequences (Definition 3.1)."""

  ds: jax.Array  # float32 [batch]: sum of M'(t|prefix) - M(t|prefix)
  rel_ds: jax.Array  # float32 [batch]: sum of (M' - M) / M
  token_ds: jax.Array  # float32 [batch, time-1]: per target, 0 if unscored
  token_rel_ds: jax.Array  # float32 [batch, time-1]: per target, 0 if unscored


def token_differential_scores(
  log_probs: Float[Array, '*shape'], log_probs_prime: Float[Array, '*shape']
) -> tuple[Float[Array, '*shape'], Float[Array, '*shape']]:
  """Per-token DS and relative DS from log-probabilities of M and M'.

  Args:
    log_probs: `log M(t_<i)(t_i)`, any shape.
    log_probs_prime: `log M'(t_<i)(t_i)`, the same shape.

  Returns:
    `(M' - M, (M' - M) / M)`, float32, the shape of the inputs. The relative
    score is computed as `expm1(log M' - log M)`, exact also where `M` is
    tiny.
  """
  log_probs = log_probs.astype(jnp.float32)
  log_probs_prime = log_probs_prime.astype(jnp.float32)
  ds = jnp.exp(log_probs_prime) - jnp.exp(log_probs)
  rel_ds = jnp.expm1(log_probs_prime - log_probs)
  return ds, rel_ds


def differential_score(
  model,
  model_prime,
  params: PyTree,
  params_prime: PyTree,
  ids: Int[Array, 'batch time'],
  mask: Int[Array, 'batch time'] | None = None,
  *,
  num_context: int = 1,
) -> DifferentialScores:
  """DS and relative DS (Definition 3.1) of many sequences on M and M'.

  Both models score the whole batch in one call (one forward pass each; the
  caller jits the function once for both). Position `j` of `ids` is scored
  when `j >= num_context` and `mask[:, j] == 1`; the first `num_context`
  tokens are the context the sequence is conditioned on (the BOS token, plus
  a known prefix for the background-knowledge attack of Sec. 4.3, RQ3).

  Args:
    model: M, any :class:`leakjax.models.LanguageModel` (only its pure
      `token_log_probs` is used).
    model_prime: the updated snapshot M' (same tokenizer as M).
    params: M's parameters.
    params_prime: M''s parameters.
    ids: int32 `[batch, time]` token ids, context first, right-padded.
    mask: int `[batch, time]`, 1 for real tokens; None means all real.
    num_context: leading tokens that are context, not scored (>= 1: the
      first token has no prediction).

  Returns:
    :class:`DifferentialScores`.

  Raises:
    LeakjaxError: the two models differ in vocabulary (declared, or the
      rows of their word embeddings; shapes only, so also under jit).
  """
  checks.check_same_vocabulary(model, model_prime, params, params_prime)
  if num_context < 1:
    raise LeakjaxError(
      f'num_context must be >= 1, got {num_context}',
      'start every sequence with the BOS token',
    )
  ids = jnp.asarray(ids, jnp.int32)
  if mask is None:
    mask = jnp.ones_like(ids)
  logp = model.token_log_probs(params, ids, mask)  # [B, T-1]
  logp_prime = model_prime.token_log_probs(params_prime, ids, mask)
  token_ds, token_rel = token_differential_scores(logp, logp_prime)
  positions = jnp.arange(1, ids.shape[1])  # target index of column j
  scored = (positions[None, :] >= num_context) & (mask[:, 1:] > 0)
  token_ds = jnp.where(scored, token_ds, 0.0)
  token_rel = jnp.where(scored, token_rel, 0.0)
  return DifferentialScores(
    ds=token_ds.sum(-1),
    rel_ds=token_rel.sum(-1),
    token_ds=token_ds,
    token_rel_ds=token_rel,
  )


# ------------------------------------------------------- DR (Prop. 3.3)
def differential_rank_lower_bound(
  result: SearchResult,
  sequences: Int[Array, 'batch n'],
  scores: Float[Array, ' batch'],
  *,
  score: str = 'ds',
) -> Int[Array, ' batch']:
  """Lower bounds on the differential rank of given sequences (Prop. 3.3).

  `DR(s) = |{s' in T^n : DS(s') > DS(s)}|`. Every sequence returned by the
  search that differs from `s` and scores higher is such an `s'`, so their
  count is a lower bound, exact for a wide enough beam. The sequence `s`
  itself is never counted, even when it is in the result with a score that
  differs from `scores` by rounding.

  Args:
    result: the output of :func:`rank_beam_search` (all groups are used).
    sequences: int32 `[batch, n]` the sequences to rank (context excluded).
    scores: float32 `[batch]` their DS (or relative DS), e.g. from
      :func:`differential_score` with the same context.
    score: which score `scores` holds, 'ds' or 'rel_ds'.

  Returns:
    int32 `[batch]` lower bounds on DR; 0 means no found sequence scores
    higher (DR 0 "as approximated by beam search", Table 1).
  """
  if score not in SCORES:
    raise LeakjaxError(f'score must be one of {SCORES}, got {score!r}')
  found = result.sequences.reshape(-1, result.sequences.shape[-1])  # [S, n]
  found_scores = getattr(result, score).reshape(-1)  # [S]
  sequences = jnp.asarray(sequences, jnp.int32)
  if sequences.shape[-1] != found.shape[-1]:
    raise LeakjaxError(
      f'sequences have {sequences.shape[-1]} tokens but the search found'
      f' sequences of {found.shape[-1]}',
      'search with length=len(s)',
    )
  differs = jnp.any(found[None, :, :] != sequences[:, None, :], -1)  # [B, S]
  higher = found_scores[None, :] > jnp.asarray(scores)[:, None]
  return jnp.sum(differs & higher, axis=-1).astype(jnp.int32)


def contains(
  result: SearchResult, sequences: Int[Array, 'batch n']
) -> Bool[Array, ' batch']:
  """bool `[batch]`: whether each of `sequences [batch, n]` was found."""
  found = result.sequences.reshape(-1, result.sequences.shape[-1])
  same = jnp.all(found[None] == jnp.asarray(sequences)[:, None], -1)
  return jnp.any(same, -1)


__all__ = [
  'SCORES',
  'DifferentialScores',
  'token_differential_scores',
  'differential_score',
  'differential_rank_lower_bound',
  'contains',
]
