"""Ancestral sampling from any :class:`~leakjax.models.Model` with a cache.

An attacker who holds the target model can always make text of its own:
the model's samples. :func:`sample` draws them with temperature and nucleus
(top-p) truncation (Holtzman et al., ICLR 2020, Sec. 3.1: keep the smallest
set of tokens whose probability reaches p, renormalise). It only calls
`init_cache(params, ...)` and `decode(params, cache, ids)`, so it works for
every family and for models without a KV cache (then each step recomputes
the prefix).

>>> draw = jax.jit(sample, static_argnames=SAMPLE_STATIC)
>>> ids = draw(model, params, jax.random.key(0),            # doctest: +SKIP
...            jnp.zeros((8, 1), jnp.int32), num_tokens=32)
>>> ids.shape                                               # doctest: +SKIP
(8, 33)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float, Int

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, PyTree


def nucleus_logits(
  logits: Float[Array, '*b V'],
  top_p: float | Float[Array, ''],
  *,
  iterations: int = 40,
) -> Float[Array, '*b V']:
  """`logits` with every token outside the top-p nucleus set to -inf.

  The nucleus is the smallest set of most likely tokens whose probability
  sums to at least `top_p` (ties at the boundary kept together); the most
  likely token is always kept, so `top_p -> 0` is greedy decoding and
  `top_p = 1` keeps every token. Instead of sorting the vocabulary (the
  slow part of a decoding step on a CPU), the probability threshold is
  found by bisection: `mass(t) = sum(p[p >= t])` falls as t grows, and the
  nucleus is `p >= t*` for the largest t* with `mass(t*) >= top_p`. After
  `iterations` halvings the kept set can only add tokens whose probability
  is within `max(p) / 2**iterations` of t*, and the mass is a float32 sum
  (near `top_p = 1` its rounding moves the boundary among tokens of
  probability ~1e-6).
  """
  logits = logits.astype(jnp.float32)
  probs = jax.nn.softmax(logits, axis=-1)
  top = jnp.max(probs, axis=-1, keepdims=True)

  def mass(t):
    return jnp.sum(jnp.where(probs >= t, probs, 0.0), axis=-1, keepdims=True)

  def halve(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    ok = mass(mid) >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  # mass(0) = 1 >= top_p; above the largest probability the mass is 0.
  lo, _ = lax.fori_loop(
    0, iterations, halve, (jnp.zeros_like(top), top * (1 + 1e-6))
  )
  # lo <= max(p): it only moves to a t with mass(t) > 0.
  keep = (probs >= lo) | (top_p >= 1)
  return jnp.where(keep, logits, -jnp.inf)


# The static arguments of :func:`sample` under `jax.jit`.
SAMPLE_STATIC = ('model', 'num_tokens')


def sample(
  model: Model,
  params: PyTree,
  key: jax.Array,
  prompt: Int[Array, 'b p'],
  *,
  num_tokens: int,
  temperature: float | Float[Array, ''] = 1.0,
  top_p: float | Float[Array, ''] = 1.0,
) -> Int[Array, 'b p+n']:
  """Continues every row of `prompt` by `num_tokens` sampled tokens.

  Each step draws from `softmax(logits / temperature)` restricted to its
  top-p nucleus (:func:`nucleus_logits`). One prefill of the prompt, then
  one `lax.scan`. A kernel: jit it with :data:`SAMPLE_STATIC` static;
  temperature and top_p are traced, so changing them does not recompile.

  Args:
    model: the model (its `init_cache` / `decode`).
    params: its parameters.
    key: PRNG key, split into one key per step; the rows of a step draw
      independently from it.
    prompt: int32 `[b, p]`, p >= 1 (e.g. the BOS id in every row).
    num_tokens: tokens to sample after the prompt.
    temperature: > 0; 1 samples the model's own distribution.
    top_p: nucleus mass in (0, 1]; 1 disables the truncation.

  Returns:
    int32 `[b, p + num_tokens]`: the prompt and its continuation (nothing
    stops at an end-of-text token; cut the rows afterwards).
  """
  if num_tokens < 1:
    raise LeakjaxError(f'num_tokens must be >= 1, got {num_tokens}')
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise LeakjaxError(
      f'prompt has shape {prompt.shape}; sample needs [batch, >= 1 token]',
      'start every row with the BOS id',
    )
  b, p = prompt.shape
  prompt = prompt.astype(jnp.int32)
  cache = model.init_cache(params, b, p + num_tokens)
  logits, cache = model.decode(params, cache, prompt)

  def draw(last, k):
    scaled = last.astype(jnp.float32) / temperature
    return jax.random.categorical(k, nucleus_logits(scaled, top_p), axis=-1)

  def step(carry, k):
    last, cache = carry
    token = draw(last, k).astype(jnp.int32)  # [b]
    logits, cache = model.decode(params, cache, token[:, None])
    return (logits[:, 0], cache), token

  keys = jax.random.split(key, num_tokens)
  # The scan's last decode is not needed; it keeps one scan body.
  _, tokens = lax.scan(step, (logits[:, -1], cache), keys)
  return jnp.concatenate([prompt, tokens.T], axis=1)
