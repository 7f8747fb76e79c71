"""Sentence reconstruction (Sec. 3.2) and which candidates to keep.

Part of :mod:`leakjax.attacks.gboard` (the package docstring has the
method). :func:`reconstruct_sentences` is the kernel (the sweep jits it): restricted
greedy generation from every recovered word on θ1 (one `lax.scan` over
the model's decode cache) and the relative log-perplexity change of each
candidate; :func:`select_sentences` keeps some without knowing n_k.

Cost of :func:`reconstruct_sentences` for M start words, V words, D = 96,
U = 670 units: `length + 1` decode steps of `M` rows on θ1
(`2 M (3 U (D + D) + U D + D V)` FLOPs each, the `D V` output layer
dominating) and one forward pass of `M x (length + 1)` tokens on each of θ0
and θ1 for the scores.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax
from jaxtyping import Array, Bool, Float, Int

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, PyTree

KEEP_RULES = ('cover', 'words', 'gap')


@struct.dataclass
class Reconstruction:
  """Candidate sentences from every start word, with their scores."""

  tokens: jax.Array  # int32 [M, length + 1]: <S>, start word, greedy words
  log_ppl0: jax.Array  # float32 [M]: PP_θ0, summed -log p over length words
  log_ppl1: jax.Array  # float32 [M]: PP_θ1 (the generating parameters)
  scores: jax.Array  # float32 [M]: (PP_θ0 - PP_θ1) / PP_θ0; -inf if invalid


def padded_indices(
  mask: np.ndarray | jax.Array, size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """The True indices of a bool mask, padded to a fixed `size` (host side).

  Returns `(indices int32 [size], valid bool [size])`; padded slots hold
  index 0 and valid False. `size` defaults to the next power of two >= the
  count, so that jitted kernels see few distinct shapes.
  """
  idx = np.flatnonzero(np.asarray(mask)).astype(np.int32)
  if size is None:
    size = 1 << max(int(math.ceil(math.log2(max(len(idx), 1)))), 0)
  if len(idx) > size:
    raise LeakjaxError(
      f'{len(idx)} recovered words do not fit size={size}', 'raise the size'
    )
  out = np.zeros((size,), np.int32)
  out[: len(idx)] = idx
  valid = np.arange(size) < len(idx)
  return out, valid


def greedy_generate(
  model: Model,
  params: PyTree,
  start_words: Int[Array, ' M'],
  allowed: Bool[Array, ' V'],
  *,
  length: int,
  bos_id: int,
) -> Int[Array, 'M L1']:
  """Sec. 3.2 greedy continuation of `<S> w` for many start words at once.

  At each step the next-word distribution of `params` is restricted to the
  `allowed` words and renormalised; its most likely word is appended (the
  renormalisation does not move the argmax, so the masked argmax of the
  logits is taken). One prefill of `[<S>, w]` and one `lax.scan` over the
  remaining `length - 1` words, all start words in one batch.

  Args:
    model: the model (its `init_cache` / `decode`).
    params: θ1 (possibly scaled).
    start_words: int32 `[M]`, the first word of each candidate.
    allowed: bool `[vocab]`, the recovered words.
    length: words per sentence, the start word included.
    bos_id: the `<S>` id.

  Returns:
    int32 `[M, length + 1]`: `<S>`, the start word, `length - 1` words.
  """
  if length < 1:
    raise LeakjaxError(f'length must be >= 1, got {length}')
  num = start_words.shape[0]
  start_words = start_words.astype(jnp.int32)
  prompt = jnp.stack([jnp.full((num,), bos_id, jnp.int32), start_words], 1)
  cache = model.init_cache(params, num, length + 1)
  logits, cache = model.decode(params, cache, prompt)  # [M, 2, V]
  if length == 1:
    return prompt
  neg = jnp.finfo(jnp.float32).min

  def step(carry, _):
    last, cache = carry  # last: float32 [M, V], logits of the next word
    masked = jnp.where(allowed[None, :], last.astype(jnp.float32), neg)
    word = jnp.argmax(masked, axis=-1).astype(jnp.int32)  # [M]
    logits, cache = model.decode(params, cache, word[:, None])  # [M, 1, V]
    return (logits[:, 0], cache), word

  # The last decode of the scan is not needed; it keeps one scan body.
  _, words = lax.scan(step, (logits[:, -1], cache), None, length=length - 1)
  return jnp.concatenate([prompt, words.T], axis=1)  # [L-1, M] -> [M, L-1]


def relative_perplexity_change(
  model: Model, params0: PyTree, params1: PyTree, tokens: Int[Array, 'M T']
) -> tuple[Float[Array, ' M'], Float[Array, ' M'], Float[Array, ' M']]:
  """`(PP0, PP1, (PP0 - PP1) / PP0)` of `[M, T]` token rows (Sec. 3.2).

  `PP_θ(x_0..x_t) = Σ_{i=1..t} -log Pr(x_i | x_<i; θ)`, the summed
  log-perplexity of every token after the first (`<S>`).
  """
  pp0 = -model.token_log_probs(params0, tokens).sum(-1)
  pp1 = -model.token_log_probs(params1, tokens).sum(-1)
  return pp0, pp1, (pp0 - pp1) / pp0


def reconstruct_sentences(
  model: Model,
  params0: PyTree,
  params1: PyTree,
  start_words: Int[Array, ' M'],
  valid: Bool[Array, ' M'],
  allowed: Bool[Array, ' V'],
  *,
  length: int,
  bos_id: int,
) -> Reconstruction:
  """Sec. 3.2: one greedy candidate per recovered word, scored, in one kernel.

  A kernel: jit it with `model`, `length` and `bos_id` static (as
  :func:`leakjax.attacks.gboard.sweep.reconstruct_candidates` does): one
  compilation per model and number of start words `M`, whatever the
  parameters.

  Args:
    model: the model (static; it holds no parameters).
    params0: θ0, for the score.
    params1: θ1 (or the scaled `θ1 + s (θ1 - θ0)`), generates and scores.
    start_words: int32 `[M]` recovered words (e.g. :func:`padded_indices`).
    valid: bool `[M]`; False slots are padding (score -inf).
    allowed: bool `[vocab]`, the recovered words.
    length: words per sentence (Sec. 4.1: 4).
    bos_id: the `<S>` id.

  Returns:
    A :class:`Reconstruction` (rank by `scores`, descending).
  """
  tokens = greedy_generate(
    model, params1, start_words, allowed, length=length, bos_id=bos_id
  )
  pp0, pp1, score = relative_perplexity_change(model, params0, params1, tokens)
  score = jnp.where(valid, score, -jnp.inf)
  return Reconstruction(tokens=tokens, log_ppl0=pp0, log_ppl1=pp1, scores=score)


def select_sentences(
  tokens: np.ndarray,
  scores: np.ndarray,
  recovered: np.ndarray,
  *,
  rule: str = 'cover',
  length: int | None = None,
) -> np.ndarray:
  """Which candidates to keep, without knowing n_k (host side).

  Args:
    tokens: int `[M, length + 1]` candidates (`Reconstruction.tokens`).
    scores: float `[M]` (`Reconstruction.scores`; -inf = padding).
    recovered: bool `[vocab]` recovered words, or their int ids.
    rule: 'cover': walk down the ranking and keep a candidate when it uses
      a recovered word that no kept candidate uses yet; stop once every
      recovered word is used. A client's sentences use every word it typed,
      so their set covers the recovered words. 'words': the top
      `ceil(|recovered| / length)` (as many sentences as the words fill).
      'gap': the top candidates above the largest split of the sorted
      scores (Otsu: the cut maximising the between-group variance of the
      scores), i.e. the group whose perplexity fell most.
    length: words per sentence (for 'words'; default `tokens.shape[1] - 1`).

  Returns:
    int64 indices of the kept candidates, best first.
  """
  if rule not in KEEP_RULES:
    raise LeakjaxError(
      f'unknown keep rule {rule!r}', f'use one of {", ".join(KEEP_RULES)}'
    )
  scores = np.asarray(scores, np.float64)
  order = np.argsort(-scores, kind='stable')
  order = order[np.isfinite(scores[order])]
  recovered = np.asarray(recovered)
  ids = (
    np.flatnonzero(recovered)
    if recovered.dtype == bool
    else recovered.astype(np.int64)
  )
  tokens = np.asarray(tokens)
  if rule == 'words':
    length = length or tokens.shape[1] - 1
    return order[: math.ceil(len(ids) / length)]
  if rule == 'gap':
    return order[: _otsu_count(scores[order])]
  remaining = set(int(i) for i in ids)
  kept = []
  for c in order:
    if not remaining:
      break
    words = set(int(t) for t in tokens[c, 1:])
    if words & remaining:
      kept.append(int(c))
      remaining -= words
  return np.asarray(kept, np.int64)


def _otsu_count(sorted_desc: np.ndarray) -> int:
  """Size of the upper group of the best two-group split of the values."""
  n = len(sorted_desc)
  if n < 2:
    return n
  x = sorted_desc
  csum = np.cumsum(x)
  k = np.arange(1, n)  # upper group = first k values
  mean_hi = csum[:-1] / k
  mean_lo = (csum[-1] - csum[:-1]) / (n - k)
  between = k * (n - k) * (mean_hi - mean_lo) ** 2
  return int(k[np.argmax(between)])


__all__ = [
  'KEEP_RULES',
  'Reconstruction',
  'greedy_generate',
  'padded_indices',
  'reconstruct_sentences',
  'relative_perplexity_change',
  'select_sentences',
]
