"""The host loop: the searches one after the other (:func:`search_sentences`),
then the selection (:func:`recover`). The loop jits the kernels where it
calls them (`leakjax._jit.jitted`: one wrapper per kernel, so every call
and every run in one process share its compilations). The search kernel
gets :attr:`HybridConfig.search` only, so the host's settings never
recompile it."""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax._jit import jitted
from leakjax.attacks.dager.hybrid._common import PyTree
from leakjax.attacks.dager.hybrid.config import HybridConfig
from leakjax.attacks.dager.hybrid.heads import (
  HeadScore,
  head_score,
  head_transform,
  model_head_transform,
)
from leakjax.attacks.dager.hybrid.kernel import hybrid_beams, hybrid_search
from leakjax.attacks.dager.hybrid.selection import select_pool
from leakjax.attacks.dager.hybrid.spans import block_span, candidate_tokens
from leakjax.attacks.dager.hybrid.starts import plan_starts, start_mask
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model
from leakjax.recovery import bag as bow
from leakjax.tokenization import sentence_end_mask

# The searches log their progress at most this often (seconds).
_LOG_EVERY_S = 10.0


@dataclasses.dataclass
class HybridResult:
  """What the hybrid recovered from one gradient.

  Attributes:
    sequences: token ids of each sentence (BOS first).
    texts: decoded sentences.
    scores: mean score per token of each.
    candidates: the candidate token ids (bag and sentence ends).
    bag: FILM's bag.
    seconds: wall time per stage.
    searched: sentences searched (more than returned with `oversample`).
    pool: token ids of every searched sentence, in search order.
    alternatives: with `config.pool_beams > 1`, each search's other live
      beams (token ids, best first), distinct from its sentence.
    starts: with `config.start_dims`, each search's allocated first
      token (token ids, in search order; else empty).
  """

  sequences: list[list[int]]
  texts: list[str]
  scores: list[float]
  candidates: np.ndarray
  bag: bow.Bag
  seconds: dict[str, float]
  searched: int = 0
  pool: list[list[int]] = dataclasses.field(default_factory=list)
  alternatives: list[list[list[int]]] = dataclasses.field(default_factory=list)
  starts: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Searched:
  """The hybrid's searches before its selection (:func:`search_sentences`).

  Attributes:
    sequences: each search's sentence (token ids, BOS first).
    scores: each one's mean score per token.
    alternatives: with `config.pool_beams > 1`, each search's other live
      beams, best first, distinct from its sentence (else empty).
    starts: with `config.start_dims`, each search's allocated first token
      (else empty).
    candidates: the candidate token ids (bag and sentence ends).
    padded: int32 `[C]` the candidates, padded; `valid` marks the real ones.
    valid: bool `[C]`.
    ends: bool `[V]`, the sentence-ending tokens.
    head: the head-gradient term (None without `config.weight_head`).
    bag: FILM's bag.
    seconds: wall time per stage.
  """

  sequences: list[list[int]]
  scores: list[float]
  alternatives: list[list[list[int]]]
  starts: list[int]
  candidates: np.ndarray
  padded: np.ndarray
  valid: np.ndarray
  ends: np.ndarray
  head: HeadScore | None
  bag: bow.Bag
  seconds: dict[str, float]


def search_sentences(
  model: Model,
  params: PyTree,
  grads: PyTree,
  num_sentences: int,
  *,
  config: HybridConfig = HybridConfig(),  # noqa: B008 (frozen)
  bag: bow.Bag | None = None,
  key: jax.Array | None = None,
) -> Searched:
  """The hybrid's searches, one sentence each, in order (:func:`recover`
  without its selection; the same arguments)."""
  if num_sentences < 1:
    raise LeakjaxError(f'num_sentences must be >= 1, got {num_sentences}')
  tok = model.tokenizer
  bos = getattr(tok, 'bos_id', None) if tok is not None else None
  if bos is None:
    raise LeakjaxError(
      'the hybrid needs a tokenizer with a BOS token',
      'load the model with its tokenizer',
    )
  seconds = {}
  t0 = time.perf_counter()
  if bag is None:
    bag = bow.extract_bag(model, params, grads)
  ends = sentence_end_mask(tok, model.vocab_size)
  cands, padded, valid = candidate_tokens(model, params, grads, bag, config)
  is_end = ends[padded] & valid
  strings = tok.token_strings()
  is_start = start_mask(strings, padded, valid)
  declared = len(model.paths.attention_inputs)
  if declared < 2:
    raise LeakjaxError(
      'the hybrid needs the attention input kernels of at least two blocks',
      'declare attention_inputs through from_functions / from_flax',
    )
  config = dataclasses.replace(
    config, span_block=max(1, min(config.span_block, declared - 1))
  )
  span = jitted(
    block_span, static_argnames=('model', 'block', 'drop', 'span_config')
  )
  span2 = span(model, grads, config.span_block, config.span_dims, config.span)
  searches = max(num_sentences, math.ceil(config.oversample * num_sentences))
  shift = targets = None
  if config.start_dims:
    picks, _, shift, targets = plan_starts(
      model,
      params,
      grads,
      padded,
      valid,
      is_start,
      num_sentences,
      searches,
      key=jax.random.key(0) if key is None else key,
      config=config,
    )
    # Sentences given the same first token may share its first word:
    # bigrams inside a taken sentence's first word are not penalised.
    word_start = np.array([not s[:1].isalnum() for s in strings])
  head = None
  if config.weight_head:
    head = head_score(
      model,
      params,
      grads,
      jnp.asarray(padded),
      jnp.asarray(bos, jnp.int32),
      key=jax.random.key(0) if key is None else key,
      config=config,
      valid=jnp.asarray(valid),
      shift=shift,
      targets=targets if config.weight_evidence else None,
    )
  seconds['span'] = time.perf_counter() - t0
  logging.info(
    'hybrid: %d candidates, span and head term in %.1f s; %d searches',
    int(np.asarray(valid).sum()),
    seconds['span'],
    searches,
  )
  t0 = last_log = time.perf_counter()
  taken = np.zeros((searches, config.max_length), np.int32)
  taken_len = np.zeros((searches,), np.int32)
  taken_skip = np.ones((searches,), np.int32)
  args = [jnp.asarray(a) for a in (padded, valid, is_end)]
  sequences, scores, alternatives = [], [], []
  kernel = config.search
  beams_kernel = jitted(hybrid_beams, static_argnames=('model', 'config'))
  search_kernel = jitted(hybrid_search, static_argnames=('model', 'config'))
  for j in range(searches):
    search_args = (
      model,
      params,
      span2,
      *args,
      jnp.asarray(taken),
      jnp.asarray(taken_len),
      jnp.asarray(bos, jnp.int32),
      jnp.asarray(
        is_start
        if not config.start_dims
        else np.arange(len(padded)) == picks[j]
      ),
      head,
    )
    skip = jnp.asarray(taken_skip) if config.start_dims else None
    if config.pool_beams > 1:
      rows, lengths, keys = map(
        np.asarray,
        beams_kernel(*search_args, config=kernel, taken_skip=skip),
      )
      row, length, score = rows[0], lengths[0], keys[0]
    else:
      row, length, score = search_kernel(
        *search_args, config=kernel, taken_skip=skip
      )
    n = int(length)
    seq = np.asarray(row)[:n].tolist()
    if config.pool_beams > 1:
      others = []
      for k in range(1, config.pool_beams):
        other = rows[k][: int(lengths[k])].tolist()
        if np.isfinite(keys[k]) and other != seq and other not in others:
          others.append(other)
      alternatives.append(others)
    taken[j, :n] = seq
    taken_len[j] = n
    if config.start_dims:
      # The bigram (p, p + 1) counts from the first word's end on.
      later = [p for p in range(2, n) if word_start[seq[p]]]
      taken_skip[j] = (later[0] if later else n) - 1
    sequences.append(seq)
    scores.append(float(score))
    if time.perf_counter() - last_log >= _LOG_EVERY_S or j + 1 == searches:
      last_log = time.perf_counter()
      logging.info(
        'hybrid: search %d/%d done, %.1f s', j + 1, searches, last_log - t0
      )
  seconds['search'] = time.perf_counter() - t0
  return Searched(
    sequences=sequences,
    scores=scores,
    alternatives=alternatives,
    starts=[int(padded[j]) for j in picks] if config.start_dims else [],
    candidates=cands,
    padded=padded,
    valid=valid,
    ends=ends,
    head=head,
    bag=bag,
    seconds=seconds,
  )


def recover(
  model: Model,
  params: PyTree,
  grads: PyTree,
  num_sentences: int,
  *,
  config: HybridConfig = HybridConfig(),  # noqa: B008 (frozen)
  bag: bow.Bag | None = None,
  key: jax.Array | None = None,
) -> HybridResult:
  """`num_sentences` sentences from one gradient (module docstring).

  Args:
    model: the attacked model, with its tokenizer (BOS, sentence ends)
      and the attention inputs of block 2 declared.
    params: θ at which the gradient was taken.
    grads: the observed gradient.
    num_sentences: sentences to recover (the client's batch size, which
      the server knows in FedSGD).
    config: settings.
    bag: FILM's bag (default: :func:`leakjax.recovery.bag.extract_bag`
      with its automatic method).
    key: draws the model's samples for the head term's statistics
      (default: `jax.random.key(0)`).

  Returns:
    A :class:`HybridResult`.
  """
  if num_sentences < 1:
    raise LeakjaxError(f'num_sentences must be >= 1, got {num_sentences}')
  found = search_sentences(
    model, params, grads, num_sentences, config=config, bag=bag, key=key
  )
  sequences, scores, head = (
    list(found.sequences),
    list(found.scores),
    found.head,
  )
  padded, valid, seconds = found.padded, found.valid, found.seconds
  alternatives = found.alternatives or None
  tok = model.tokenizer
  searches = len(sequences)
  searched = list(sequences)
  transform = None
  if config.select_whiten:
    transform = (
      head_transform(head.mean, head.whiten)
      if head is not None
      else model_head_transform(model, params, config, key)
    )
  if searches > num_sentences or config.cuts or alternatives:
    t0 = time.perf_counter()
    sequences, owner = select_pool(
      model,
      params,
      grads,
      searched,
      num_sentences,
      padded=padded,
      valid=valid,
      config=config,
      transform=transform,
      alternatives=alternatives,
    )
    scores = [scores[j] for j in owner]
    seconds['select'] = time.perf_counter() - t0
    logging.info(
      'hybrid: %d of %d searched sentences selected in %.1f s',
      len(sequences),
      searches,
      seconds['select'],
    )
  texts = [tok.decode(s, skip_special=True).strip() for s in sequences]
  return HybridResult(
    sequences=sequences,
    texts=texts,
    scores=scores,
    candidates=found.candidates,
    bag=found.bag,
    seconds=seconds,
    searched=len(searched),
    pool=searched,
    alternatives=found.alternatives,
    starts=found.starts,
  )
