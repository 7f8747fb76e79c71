"""DAGER on one observed gradient: filter, search, complete the last token.

>>> model, params = leakjax.models.load('smollm2-135m')      # doctest: +SKIP
>>> result = recover(model, params, grads)                   # doctest: +SKIP
>>> result.texts[0]                                          # doctest: +SKIP
'Volume mgmt is trying to clear up these issues.'

Steps (the kernels are in :mod:`leakjax.attacks.dager.search`):

1. the layer-1 token filter over the vocabulary (one jitted call);
2. the span of block 2's projection gradient; if no clear rank shows below
   the limit (more input positions than the width d), the span test cannot
   decide, :class:`DagerResult.rank_limited` is set and nothing is
   returned;
3. the layer-2 sequence search (one jitted `lax.while_loop`);
4. each recovered sequence lacks its sentence's last token (it has no
   gradient under the next-token loss; DAGER stops one token short). Our
   addition: the last tokens are read off the head gradient, where they
   enter linearly once the prefixes are known (:func:`last_token_scores`).
   FILM's bag of words does not serve here: on the pretrained SmolLM2 its
   target test misses the last tokens ('.', '?'), which the model already
   predicts well.

The kernels are plain functions; :func:`recover` jits each where it calls
it (`leakjax._jit.jitted`, with the model and the settings static).
Candidates are padded to `chunk · 2^k` and the recovered sequences to
`max_length` tokens and `2^k` rows, so the kernels compile once per
size bucket; new gradients or new params of the same shapes never
recompile.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from leakjax import checks, sharding
from leakjax._jit import jitted
from leakjax.attacks.dager import search as sr
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, get_path
from leakjax.recovery.span import span_of

PyTree = Any


@dataclasses.dataclass(frozen=True)
class DagerAttackConfig:
  """The attack's settings (hashable).

  Attributes:
    span: thresholds of the span tests (:class:`search.SpanConfig`).
    max_live: live prefixes per step of the search; a batch of b
      sentences needs at least b (distinct prefixes of one length).
    max_done: finished sequences kept (at least b).
    max_length: the longest sequence searched (tokens, incl. BOS).
    chunk: extensions (a live prefix and a candidate) decoded per pass of
      the search (memory: `chunk` copies of a one-block cache); the
      candidates are padded to `chunk · 2^k`. 64: wider passes are larger
      matmuls, which ran the search faster than 32 at b = 4 and 16 on
      SmolLM2 on the CPU (128 was no faster); a step at b = 1 (tens of
      extensions) still takes one or two passes. The recovered sentences
      do not depend on it.
    complete_last_token: complete each sequence with its last token read
      off the head gradient (:func:`last_token_scores`; False: DAGER's
      output, one token short).
  """

  span: sr.SpanConfig = sr.SpanConfig()
  max_live: int = 24
  max_done: int = 64
  max_length: int = 64
  chunk: int = 64
  complete_last_token: bool = True

  def __post_init__(self):
    for name in ('max_live', 'max_done', 'max_length', 'chunk'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise LeakjaxError(
          f'DagerAttackConfig.{name} must be a positive int, got {value!r}'
        )


@dataclasses.dataclass
class DagerResult:
  """What DAGER recovered from one gradient.

  Attributes:
    sequences: token ids of each recovered sentence (with its last token
      when completed).
    prefixes: the sequences the span search found (no last token).
    texts: `sequences` decoded, or None without a tokenizer.
    candidates: the layer-1 candidate token ids.
    rank1, rank2: ranks of blocks 1 and 2's projection gradients.
    valid1, valid2: whether those spans had a clear gap below the limit.
    rank_limited: the span tests could not decide (not valid1 or valid2).
    dropped: passing extensions that found no free slot.
    residuals: per sequence, the largest layer-2 residual along it.
    seconds: wall time per stage.
  """

  sequences: list[list[int]]
  prefixes: list[list[int]]
  texts: list[str] | None
  candidates: np.ndarray
  rank1: int
  rank2: int
  valid1: bool
  valid2: bool
  rank_limited: bool
  dropped: int
  residuals: list[float]
  seconds: dict[str, float]


def _layer1(model, params, grads, config):
  mask, res, span1 = sr.token_filter(model, params, grads, config=config)
  return mask, res, span1.rank, span1.valid


def _span2(model, grads, config):
  return span_of(
    sr.block_gradient(model, grads, 1),
    min_gap_decades=config.min_gap_decades,
    max_rank_fraction=config.max_rank_fraction,
  )


def _bucket(n: int, unit: int) -> int:
  """The smallest `unit · 2^k` >= n (few distinct shapes, few compiles)."""
  size = unit
  while size < n:
    size *= 2
  return size


def _pad_rows(rows: list[list[int]], width: int | None = None):
  t = max(max(len(r) for r in rows), width or 0)
  ids = np.zeros((_bucket(len(rows), 1), t), np.int32)
  mask = np.zeros(ids.shape, np.int32)
  for i, r in enumerate(rows):
    ids[i, : len(r)] = r
    mask[i, : len(r)] = 1
  return ids, mask


def head_path(model: Model):
  """The head matrix's path: the LM head's, or the word embeddings' when
  the head is tied to them."""
  return model.paths.lm_head or model.paths.word_embeddings


def last_token_scores(
  model: Model,
  params: PyTree,
  grads: PyTree,
  ids: Int[Array, 'n t'],
  mask: Int[Array, 'n t'],
) -> Float[Array, 'n V']:
  """How strongly the observed head gradient names each token as the last
  target of each sequence (our completion of DAGER; exact for FedSGD).

  `ids`/`mask` hold the recovered sequences (each a sentence without its
  last token, right-padded; rows with an all-zero mask are ignored);
  together they must be the client's whole batch. Under the mean next-token loss over N targets, the last target
  `y_j` of sentence j enters the gradient linearly:

      ∇θ = ∇θ L₀ − (1/N) Σ_j ∂z_j[y_j]/∂θ,

  with L₀ the loss whose last targets are replaced by logsumexp(z_j) (all
  known once the prefixes are) and z_j the logits at the prefix's last
  position. On the head matrix, ∂z_j[v]/∂W = e_v ⊗ h̃_j (h̃_j the head's
  input there), so `R = N (∇L₀ − ∇θ)` has rows `R[v] = Σ_{j: y_j = v} h̃_j`
  (plus, for a tied head, input-side terms on the rows of tokens inside the
  prefixes). Least squares against the h̃_j gives coefficients
  `C = R Hᵀ (H Hᵀ)⁻¹` `[V, n]`, 1 where v is sentence j's last token and 0
  elsewhere; the scores returned are `Cᵀ`.

  Needs the model's `hidden_states` and `lm_head` functions. Pure, with
  `model` static:

  >>> scores = jax.jit(last_token_scores, static_argnames=('model',))(
  ...   model, params, grads, ids, mask)                      # doctest: +SKIP
  """
  n = ids.shape[0]
  length = mask.sum(1)
  row_ok = length > 0
  last = jnp.maximum(length - 1, 0)
  num_targets = length.sum()  # known targets + one last target per row
  path = head_path(model)

  def loss0(p):
    # One forward serves the loss and the head's inputs: the logits are
    # the head of the last hidden state (what `hidden_states` and
    # `lm_head` mean), not a second pass through `model.logits`.
    hidden = model.hidden_states(p, ids, mask)[-1]  # [n, t, d]
    logits = model.lm_head(p, hidden).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    known = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    known = (known * mask[:, 1:]).sum()
    z = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
    lse = jnp.where(row_ok, jax.nn.logsumexp(z, axis=-1), 0.0)
    return (known + lse.sum()) / num_targets, hidden

  g0, hidden = jax.grad(loss0, has_aux=True)(params)
  g0 = get_path(g0, path)
  gobs = get_path(grads, path)
  r = (g0 - gobs).astype(jnp.float32) * num_targets
  if model.paths.lm_head is not None:  # a Dense kernel [d, V]
    r = r.T
  h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]

  def head_input(h):  # what multiplies the head matrix: ∂z[v]/∂W[v]
    def z0(p):
      return model.lm_head(p, h)[0]

    g = get_path(jax.grad(z0)(params), path)
    return g.T[0] if model.paths.lm_head is not None else g[0]

  h = jax.vmap(head_input)(h_last).astype(jnp.float32)  # [n, d]
  h = h * row_ok[:, None]
  gram = h @ h.T
  gram = gram + (1e-6 * jnp.trace(gram) / n + 1e-30) * jnp.eye(n)
  return jnp.linalg.solve(gram, h @ r.T)  # [n, V]


def _next_token_logits(model, params, ids, mask):
  last = jnp.maximum(mask.sum(1) - 1, 0)
  logits = model.logits(params, ids, mask)
  return jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]


def complete_last_tokens(
  model: Model,
  params: PyTree,
  grads: PyTree,
  prefixes: list[list[int]],
  width: int | None = None,
) -> list[list[int]]:
  """Each prefix + its last token read off the head gradient.

  See :func:`last_token_scores`; the prefixes must be the whole batch.

  Args:
    model: the attacked model.
    params: θ.
    grads: the observed (FedSGD) gradient.
    prefixes: the recovered sequences, each without its last token.
    width: pad the sequences to at least this many tokens (rows are padded
      to `2^k`), so batches of one setting compile once.

  Returns:
    The completed sequences. When the head's gradient is exactly zero (a
    frozen head, e.g. the frozen-embedding defense on a tied model), each
    prefix gets the model's likeliest next token instead.
  """
  if not prefixes:
    return []
  ids, mask = _pad_rows(prefixes, width)
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  if not np.any(np.asarray(get_path(grads, head_path(model)))):
    # A frozen head sends no gradient: the LM's likeliest next token.
    logits = jitted(_next_token_logits, static_argnames=('model',))
    scores = np.asarray(logits(model, params, ids, mask))
  else:
    last = jitted(last_token_scores, static_argnames=('model',))
    scores = np.asarray(last(model, params, grads, ids, mask))
  best = scores[: len(prefixes)].argmax(1)
  return [list(p) + [int(v)] for p, v in zip(prefixes, best, strict=True)]


def recover(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  config: DagerAttackConfig = DagerAttackConfig(),
  mesh=None,
) -> DagerResult:
  """DAGER on one observed gradient (module docstring).

  Args:
    model: the attacked model; it must declare the attention input kernels
      of its first two blocks, `first_layer_inputs` and `block_inputs`
      (ours do; see :func:`leakjax.models.from_functions`).
    params: θ at which the gradient was taken.
    grads: the observed gradient, a pytree like `params`.
    config: settings.
    mesh: a `jax.sharding.Mesh` with a `'data'` axis
      (:func:`leakjax.sharding.make_mesh`): the sequence search splits its
      decode passes (`chunk` extensions each) over it; the result
      is the same as on one device.

  Returns:
    A :class:`DagerResult`.

  Raises:
    LeakjaxError: before any work, when `grads` holds NaN/inf, is zero
      everywhere or is not shaped like `params`, when `params` do not fit
      the model's facts, when the model lacks a fact DAGER reads (the
      attention inputs of two blocks, `first_layer_inputs`, `block_inputs`;
      `hidden_states` and `lm_head` to complete the last token), or when its
      tokenizer has no `decode`.
  """
  last = ('hidden_states', 'lm_head') if config.complete_last_token else ()
  checks.check_inputs(
    model,
    params,
    grads,
    attack='DAGER',
    attention_blocks=2,
    needs=('first_layer_inputs', 'block_inputs') + last,
    tokenizer=('decode',),
  )
  seconds = {}
  t0 = time.perf_counter()
  layer1 = jitted(_layer1, static_argnames=('model', 'config'))
  mask, _, rank1, valid1 = layer1(model, params, grads, config.span)
  mask = np.asarray(mask)
  cands = np.flatnonzero(mask).astype(np.int32)
  span2 = jitted(_span2, static_argnames=('model', 'config'))(
    model, grads, config.span
  )
  rank2, valid2 = int(span2.rank), bool(span2.valid)
  seconds['filter'] = time.perf_counter() - t0
  rank_limited = not (bool(valid1) and valid2)
  prefixes, res, dropped = [], [], 0
  t0 = time.perf_counter()
  start = None
  bos = getattr(model.tokenizer, 'bos_id', None)
  if bos is not None and bos in cands:
    # Every row starts with BOS; see search.py on why it must be given.
    start = jnp.asarray(bos, jnp.int32)
    cands = cands[cands != bos]
  if not rank_limited and len(cands):
    size = _bucket(len(cands), config.chunk)
    padded = np.zeros(size, np.int32)
    padded[: len(cands)] = cands
    valid = np.arange(size) < len(cands)
    search = jitted(sr.sequence_search, static_argnames=sr.SEARCH_STATIC)
    state = search(
      model,
      params,
      span2,
      jnp.asarray(padded),
      jnp.asarray(valid),
      start,
      max_live=config.max_live,
      max_done=config.max_done,
      max_length=config.max_length,
      tolerance=config.span.layer2_tolerance,
      chunk=config.chunk,
      mesh=mesh,
    )
    # Read back (gathered from every process when the mesh spans several).
    state = sharding.to_host(state.replace(cache=None))
    dropped = int(state.dropped)
    rows = [
      (state.done, state.done_length, state.done_residual),
      (
        state.live,
        np.where(state.live_ok, int(state.step), 0),
        state.live_residual,
      ),
    ]
    for ids, length, residual in rows:
      ids, length = np.asarray(ids), np.asarray(length)
      residual = np.asarray(residual)
      for row in np.flatnonzero(length > 0):
        prefixes.append(ids[row, : length[row]].tolist())
        res.append(float(residual[row]))
  seconds['search'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  sequences = [list(p) for p in prefixes]
  if config.complete_last_token and prefixes:
    sequences = complete_last_tokens(
      model, params, grads, prefixes, config.max_length
    )
  seconds['last_token'] = time.perf_counter() - t0
  texts = None
  if model.tokenizer is not None:
    texts = [model.tokenizer.decode(s) for s in sequences]
  return DagerResult(
    sequences=sequences,
    prefixes=prefixes,
    texts=texts,
    candidates=cands,
    rank1=int(rank1),
    rank2=rank2,
    valid1=bool(valid1),
    valid2=valid2,
    rank_limited=rank_limited,
    dropped=dropped,
    residuals=res,
    seconds=seconds,
  )


__all__ = [
  'DagerAttackConfig',
  'DagerResult',
  'complete_last_tokens',
  'head_path',
  'last_token_scores',
  'recover',
]
