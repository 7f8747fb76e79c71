"""What the searches score against and over: block 2's span (the rank
rule's, or past the rank limit the gradient's top singular directions)
and the candidate tokens (FILM's bag, DAGER's layer-1 filter, every
sentence end)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

from leakjax._jit import jitted
from leakjax.attacks.dager import search as sr
from leakjax.attacks.dager.hybrid._common import PyTree
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model
from leakjax.recovery import bag as bow
from leakjax.recovery.span import Span, span_of
from leakjax.tokenization import sentence_end_mask


def top_span(grad: Float[Array, 'd out'], drop: int) -> Span:
  """The span of `grad`'s top `d - drop` left singular vectors (no rank
  rule: past the rank limit there is no gap to read)."""
  u, _, _ = jax.lax.linalg.svd(
    grad.astype(jnp.float32),
    full_matrices=False,
    algorithm=jax.lax.linalg.SvdAlgorithm.QR,
  )
  k = max(1, grad.shape[0] - drop)
  keep = jnp.arange(u.shape[1]) < k
  return Span(
    basis=u * keep[None, :],
    rank=jnp.asarray(k, jnp.int32),
    valid=jnp.asarray(False),
    log_gap=jnp.zeros((), jnp.float32),
  )


def span_candidates(
  model: Model, params: PyTree, grads: PyTree, span_config: sr.SpanConfig
) -> Bool[Array, ' V']:
  """DAGER's layer-1 token filter where it can decide, else the tokens
  closest to block 1's span (as many as its numerical rank, at most the
  rank limit).

  On a RoPE model block 1's input depends on the token only, so its span
  test stays exact while the batch has fewer *distinct* tokens than d,
  past the limit of block 2 (SmolLM2 at b = 64: block 1 valid on two of
  three batches, block 2 on none; reports/dager/README.md).

  Pure (`model` and `span_config` static); :func:`candidate_tokens` jits
  it: `jax.jit(span_candidates, static_argnames=('model',
  'span_config'))`.
  """
  mask, res, span1 = sr.token_filter(model, params, grads, config=span_config)
  limit = int(span_config.max_rank_fraction * model.hidden_size)
  k = jnp.minimum(span1.rank, limit)
  order = jnp.argsort(res)
  closest = (
    jnp.zeros(res.shape, bool).at[order].set(jnp.arange(res.shape[0]) < k)
  )
  return jnp.where(span1.valid, mask, closest)


def block_span(model, grads, block, drop, span_config):
  """Block `block`'s span: the rank rule's when it finds a gap, else the
  top `d - drop` directions.

  Pure; :func:`search_sentences` jits it with every argument but `grads`
  static: `jax.jit(block_span, static_argnames=('model', 'block', 'drop',
  'span_config'))`.
  """
  g2 = sr.block_gradient(model, grads, block)
  exact = span_of(
    g2,
    min_gap_decades=span_config.min_gap_decades,
    max_rank_fraction=span_config.max_rank_fraction,
  )
  top = top_span(g2, drop)
  return jax.tree.map(lambda a, b: jnp.where(exact.valid, a, b), exact, top)


def candidate_tokens(
  model: Model,
  params: PyTree,
  grads: PyTree,
  bag: bow.Bag,
  config: HybridConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The searches' candidate tokens: FILM's bag, the layer-1 filter and
  every sentence end, BOS excluded.

  Returns:
    `(candidates, padded, valid)`: the sorted ids; the same padded with
    zeros to a multiple of `config.bag_bucket`; bool, which of `padded`
    are real.
  """
  tok = model.tokenizer
  ends = sentence_end_mask(tok, model.vocab_size)
  layer1 = jitted(span_candidates, static_argnames=('model', 'span_config'))(
    model, params, grads, config.span
  )
  layer1 = np.asarray(layer1)
  cand_mask = np.asarray(bag.mask, bool) | layer1 | ends
  cand_mask[tok.bos_id] = False
  cands = np.flatnonzero(cand_mask).astype(np.int32)
  if len(cands) < config.shortlist:
    raise LeakjaxError(
      f'{len(cands)} candidates, fewer than the shortlist of'
      f' {config.shortlist}',
      'use a smaller HybridConfig.shortlist',
    )
  size = -(-len(cands) // config.bag_bucket) * config.bag_bucket
  padded = np.zeros(size, np.int32)
  padded[: len(cands)] = cands
  valid = np.arange(size) < len(cands)
  return cands, padded, valid
