"""Each search's first token: how many of the batch's sentences start with
each candidate, read from the head gradient at BOS (:func:`start_counts`),
and one start handed to each search (:func:`allocate_starts`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from leakjax._jit import jitted
from leakjax.attacks.dager.hybrid._common import PyTree
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.attacks.dager.hybrid.heads import (
  head_readout,
  raw_head_rows,
  sample_head_inputs,
)
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model


def start_counts(
  rows: Float[Array, 'C d'],
  first_input: Float[Array, ' d'],
  samples: Float[Array, 'n d'],
  prior: Float[Array, ' C'],
  valid: Bool[Array, ' C'],
  num_sentences: Int[Array, ''] | int,
  *,
  dims: int,
) -> Float[Array, ' C']:
  """How many of the batch's sentences start with each candidate, read
  from the head gradient at BOS.

  Every sentence's first target follows BOS, whose head input `h̃_0` is
  the same in every sentence (causal model, BOS first). So the negated
  head rows `r_v = −∇W[v]` (:func:`raw_head_rows`) hold
  `(c_v − b p_0[v]) h̃_0 / N`, `c_v` the sentences starting with v, `p_0`
  the LM after BOS, b the sentences and N the targets, beside the other
  positions' head inputs. Those share few directions with `h̃_0` once the
  top `dims` principal directions of head inputs after BOS (`samples`:
  the model's own, :func:`sample_head_inputs` past row 0) are projected
  out of both: the coefficient `a_v = ⟨P r_v, P h̃_0⟩ / |P h̃_0|²`
  estimates `(c_v − b p_0[v]) / N`. N is not known; it comes from the
  counts summing to b over the `valid` candidates:
  `N = b (1 − Σ p_0) / Σ a`. (Our construction; no paper describes it.)
  For a tied head the rows also hold the input embeddings' gradient,
  which this leaves in. Pure, `dims` static:
  `jax.jit(start_counts, static_argnames=('dims',))`.

  Returns:
    `(counts, n)`: float32 `[C]` the estimated counts (0 where not
    `valid`) and `[]` the estimated N.
  """
  u = jnp.linalg.svd(samples.astype(jnp.float32), full_matrices=False)[2]
  u = u[:dims]  # [k, d]
  h = first_input - (u @ first_input) @ u
  r = rows - (rows @ u.T) @ u
  a = jnp.where(valid, r @ h / (h @ h), 0.0)
  p = jnp.where(valid, prior, 0.0)
  n = num_sentences * (1.0 - p.sum()) / a.sum()
  return jnp.where(valid, n * a + num_sentences * p, 0.0), n


def estimate_starts(
  model: Model,
  params: PyTree,
  grads: PyTree,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  start: Int[Array, ''],
  num_sentences: int,
  *,
  key: jax.Array,
  config: HybridConfig,
) -> tuple[Float[Array, ' C'], Float[Array, ' C d'], Float[Array, '']]:
  """:func:`start_counts` for `candidates` under the observed gradient,
  with the head inputs of the model's own samples (drawn as
  :func:`head_score` draws them, same `key`) and `config.start_dims`
  directions; `start`: BOS.

  Returns:
    `(counts, share, n)`: the estimated counts `[C]`, each candidate's
    share of its negated head row that the sentences' first targets
    explain, `(c_v − b p_0[v]) h̃_0 / N` `[C, d]`, and the estimated
    number of targets N `[]`.
  """
  readout = jitted(head_readout, static_argnames=('model',))(model, params)
  sample = jitted(
    sample_head_inputs, static_argnames=('model', 'num', 'length')
  )
  h = sample(
    model,
    params,
    readout,
    start,
    key=key,
    num=config.head_samples,
    length=config.head_sample_length,
  )
  logits = model.logits(
    params, start.reshape(1, 1), jnp.ones((1, 1), jnp.int32)
  )
  prior = jax.nn.softmax(logits[0, 0].astype(jnp.float32))[candidates]
  rows = jitted(raw_head_rows, static_argnames=('model',))
  counts, n = jitted(start_counts, static_argnames=('dims',))(
    rows(model, grads, candidates),
    h[0, 0],
    h[1:].reshape(-1, h.shape[-1]),
    prior,
    valid,
    num_sentences,
    dims=config.start_dims,
  )
  coef = jnp.where(valid, (counts - num_sentences * prior) / n, 0.0)
  return counts, coef[:, None] * h[0, 0][None], n


def allocate_starts(
  counts: np.ndarray, allowed: np.ndarray, num: int
) -> np.ndarray:
  """`num` candidate indices, one per sentence, greedily from the
  estimated counts (:func:`start_counts`): each pick is the allowed
  candidate with the largest count not yet used."""
  left = np.where(allowed, np.asarray(counts, np.float64), -np.inf)
  if not np.isfinite(left).any():
    raise LeakjaxError('no candidate may start a sentence')
  picks = []
  for _ in range(num):
    j = int(np.argmax(left))
    picks.append(j)
    left[j] -= 1.0
  return np.asarray(picks, np.int64)


def start_mask(
  strings: list[str], padded: np.ndarray, valid: np.ndarray
) -> np.ndarray:
  """The candidates a sentence may start with: FILM Sec. 4.3 starts its
  beams from the bag's capitalised tokens; we also let a sentence start
  with a digit (every valid candidate if none is either). `strings`: the
  tokenizer's token strings."""
  starts = np.array(
    [
      strings[int(t)][:1].isupper() or strings[int(t)][:1].isdigit()
      for t in padded
    ]
  )
  is_start = starts & valid
  return is_start if is_start.any() else valid


def plan_starts(
  model: Model,
  params: PyTree,
  grads: PyTree,
  padded: np.ndarray,
  valid: np.ndarray,
  allowed: np.ndarray,
  num_sentences: int,
  searches: int,
  *,
  key: jax.Array,
  config: HybridConfig,
) -> tuple[np.ndarray, np.ndarray, jax.Array, jax.Array]:
  """`(picks, counts, share, n)`: :func:`estimate_starts` over the
  padded candidates for `num_sentences` sentences, then one allowed start
  per search (:func:`allocate_starts`, `searches` of them; `picks` index
  `padded`)."""
  counts, share, n = estimate_starts(
    model,
    params,
    grads,
    jnp.asarray(padded),
    jnp.asarray(valid),
    jnp.asarray(model.tokenizer.bos_id, jnp.int32),
    num_sentences,
    key=key,
    config=config,
  )
  counts = np.asarray(counts)
  return allocate_starts(counts, allowed, searches), counts, share, n
