"""Embedding inversion (Wan et al. 2024): layer states, BEI and HEI.

A split-inference user sends the hidden states `H^i` of layer i of a
language model to the model provider; the provider reconstructs the text.

* :func:`layer_states` -- `H^i` of any layers for a batch: i = 0 is the
  embedding output, i = 1..L the block outputs (no final norm), and 'last'
  the final-normed output of the last block, i.e. what Hugging Face's
  `output_hidden_states` returns last (the "last" column of Tables 2-3).
* **BEI** (Sec. 4.1, Eq. 8), :func:`bei_ids`: `argmax(logits(H^i))` with
  `logits(H) = H w + b` the LM head (Eq. 4). Sec. 4.1 forwards the hidden
  states of layer i "directly" to the language-modeling head, and in the
  Hugging Face models the paper attacks the head is the linear layer only
  (the final norm belongs to the model body), so by default the final norm
  is **not** applied; `apply_final_norm=True` gives the variant that runs the
  whole `Model.lm_head` (final norm + head), a logit-lens readout.
* **HEI** (Sec. 4.2, Eq. 9), :func:`hei_ids`: `argmax_v cos(H^i_t, W_v)`
  over the rows of the input embedding matrix W, one batched matmul. It has
  no model argument, so the caller may shard `hidden` along its batch axis
  and replicate W: rows are independent, results are identical.
* :func:`logits_with_transform` runs the target model with a transform
  applied to the hidden states of layer i (the DCT defense of
  :mod:`leakjax.attacks.inversion.dct`), :func:`sequence_nll` gives its
  perplexity cost.

Everything is a pure function of arrays and of a :class:`Model` (hashable,
so a valid static argument of `jax.jit`) with explicit `params`; jit, vmap
and sharding belong to the caller. Attacks read only what the model
declares: `hidden_states` and `lm_head` for the layer states and BEI,
`tie_word_embeddings` and `paths` for the one-matmul BEI+HEI. Running the
model from, or with a change at, layer i (the DCT defense's perplexity,
EP+PPL) uses Flax's method interception on the module whose `__call__` is
block i: block 0 is the outermost module call of `hidden_states` that holds
the kernels `paths.attention_inputs[0]` declares, and block i + 1 the next
module call that reads block i's output. Models that declare no
`attention_inputs`, or do not run their blocks as Flax modules, get a
LeakjaxError there (and only there).

>>> states = layer_states(model, params, ids, mask, (0, 25, 'last'))  # doctest: +SKIP
>>> guess = hei_ids(states[1], model.word_embeddings(params))  # doctest: +SKIP
>>> texts = decode_ids(model.tokenizer, guess, mask)                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from leakjax._jit import jitted
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model

Layer = Union[int, str]  # 0..num_layers, or 'last'
LAST = 'last'
ModulePath = tuple[str, ...]


# ------------------------------------------------------------------ layers
def _num_layers(model: Model) -> int:
  n = model.num_layers
  if not isinstance(n, (int, np.integer)) or n < 0:
    raise LeakjaxError(
      f'this model declares num_layers={n!r}; layer specs need it',
      'pass num_layers= to from_functions / from_flax',
    )
  return int(n)


def parse_layer(model: Model, layer: Layer) -> Layer:
  """Validates a layer spec: an int in [0, num_layers] (or its string), or 'last'."""
  if isinstance(layer, str):
    if layer == LAST:
      return LAST
    if not re.fullmatch(r'\d+', layer.strip()):
      raise LeakjaxError(
        f'layer {layer!r} is not an integer or "last"',
        'pass layers like 0,5,10,last',
      )
    layer = int(layer)
  n = _num_layers(model)
  if not isinstance(layer, (int, np.integer)) or not 0 <= layer <= n:
    raise LeakjaxError(
      f'layer {layer!r} is outside 0..{n} for a model with {n} blocks',
      f'pick layers in 0..{n} or "last"',
    )
  return int(layer)


def _shapes(tree):
  """`tree` as `jax.ShapeDtypeStruct`s (works on tracers), for eval_shape."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@dataclasses.dataclass
class _Call:
  """One module `__call__` seen by :func:`_recorder`, in call order."""

  index: int
  path: ModulePath
  cls: str
  arg: object = None  # first positional argument
  out: object = None  # output (its first element if a tuple)


def _recorder(calls: list[_Call]):
  """A linen interceptor appending every module `__call__` to `calls`."""

  def record(next_fun, args, kwargs, context):
    if context.method_name != '__call__':
      return next_fun(*args, **kwargs)
    call = _Call(
      len(calls),
      tuple(context.module.path),
      type(context.module).__name__,
      args[0] if args else None,
    )
    calls.append(call)
    out = next_fun(*args, **kwargs)
    call.out = out[0] if isinstance(out, tuple) and out else out
    return out

  return record


def _module_calls_in_head(model: Model, params) -> list[_Call]:
  """Every module `__call__` inside `Model.lm_head` (traced, no compute)."""
  dim = model.hidden_size
  if not isinstance(dim, (int, np.integer)) or dim < 1:
    raise LeakjaxError(
      f'this model declares hidden_size={dim!r}; the final norm needs it',
      'pass hidden_size= to from_functions / from_flax',
    )
  calls: list[_Call] = []

  def run(p):
    with nn.intercept_methods(_recorder(calls)):
      return model.lm_head(p, jnp.zeros((1, 1, dim), jnp.float32))

  jax.eval_shape(run, _shapes(params))
  return [dataclasses.replace(c, arg=None, out=None) for c in calls]


def final_norm_path(model: Model, params) -> ModulePath | None:
  """Module path of the final norm (GPT-2's `ln_f`, Llama's `final_norm`).

  Found as the first module whose class name contains `Norm` among those
  `Model.lm_head` calls; None if the head calls modules but no norm (the
  LSTMs).

  Raises:
    LeakjaxError: if `lm_head` runs no Flax module at all (e.g. a model
      from plain functions): its final norm cannot be told from the head.
  """
  calls = _module_calls_in_head(model, params)
  if not calls:
    raise LeakjaxError(
      "this model's lm_head runs no Flax module, so its final norm cannot"
      ' be separated from the head',
      'use apply_final_norm=True and integer layers (not "last"), or build'
      ' the model with from_flax',
    )
  for call in calls:
    if 'Norm' in call.cls:
      return call.path
  return None


def _within(path: ModulePath, param_path: Sequence[str]) -> bool:
  """Whether the module at `path` holds the parameter at `param_path`."""
  prefix = tuple(param_path[: len(path)])
  return 0 < len(path) < len(param_path) and prefix == path


def _block_chain(
  calls: list[_Call], n: int, shape: tuple[int, ...], anchors
) -> tuple[ModulePath, ...] | None:
  """The `n` block calls of a `hidden_states` trace, see the module doc."""

  def residual(c: _Call) -> bool:
    return all(
      tuple(getattr(x, 'shape', ())) == shape
      and jnp.issubdtype(x.dtype, jnp.floating)
      for x in (c.arg, c.out)
    )

  def holds(c: _Call, layer: int) -> bool:
    return layer >= len(anchors) or all(
      _within(c.path, p) for p in anchors[layer]
    )

  order = lambda c: (len(c.path), c.index)
  for first in sorted(
    (c for c in calls if residual(c) and holds(c, 0)), key=order
  ):
    chain = [first]
    while len(chain) < n:
      last = chain[-1]
      nxt = [
        c
        for c in calls
        if c.index > last.index
        and c.arg is last.out
        and residual(c)
        and c.path[: len(last.path)] != last.path
      ]
      if not nxt:
        break
      chain.append(min(nxt, key=order))
    paths = tuple(c.path for c in chain)
    if (
      len(chain) == n
      and len(set(paths)) == n
      and all(holds(c, i) for i, c in enumerate(chain))
    ):
      return paths
  return None


def block_paths(model: Model, params) -> tuple[ModulePath, ...]:
  """Module paths of the transformer blocks, in order (`h_0`, `h_1`, ...).

  Block 0 is the outermost module call of `Model.hidden_states` that maps
  `[B, T, D]` to `[B, T, D]` and holds every kernel of the declared
  `paths.attention_inputs[0]`; block i + 1 is the outermost later call that
  reads block i's output (and holds `attention_inputs[i + 1]` if declared).
  Found by tracing `hidden_states` on a dummy input (no compute), so it
  works under `jit` with traced `params`.

  Raises:
    LeakjaxError: if the model declares no `attention_inputs` or
      `num_layers`, or no chain of `num_layers` distinct module calls fits
      (e.g. blocks that are not Flax modules, or stacked with `nn.scan`).
  """
  n = _num_layers(model)
  anchors = model.paths.attention_inputs
  if not anchors:
    raise LeakjaxError(
      'this model declares no attention_inputs, so its transformer blocks'
      ' cannot be located for a per-layer intervention',
      "declare attention_inputs= (the first blocks' attention kernels) when"
      ' building the model',
    )
  if n == 0:
    return ()
  found = []

  def run(p):
    calls: list[_Call] = []
    ids = jnp.zeros((1, 2), jnp.int32)
    with nn.intercept_methods(_recorder(calls)):
      hs = model.hidden_states(p, ids, jnp.ones((1, 2), jnp.int32))
    found.append(_block_chain(calls, n, tuple(hs.shape[1:]), anchors))
    return hs

  jax.eval_shape(run, _shapes(params))
  if found[0] is None:
    raise LeakjaxError(
      f'cannot locate the {n} transformer blocks of this model: no chain of'
      f' {n} Flax module calls in hidden_states starts at the module holding'
      f' {"/".join(anchors[0][0])} and passes the hidden state on',
      'per-layer interventions need each block to be a Flax module called on'
      " the previous block's output",
    )
  return found[0]


def _intercept(path: ModulePath, *, before=None, after=None, skip=False):
  """A linen interceptor acting on the `__call__` of the module at `path`.

  `before` maps the first positional argument, `after` the output (the
  first element if it is a tuple); `skip` returns the (mapped) input
  unchanged instead of running the module.
  """

  def interceptor(next_fun, args, kwargs, context):
    if context.method_name != '__call__' or tuple(context.module.path) != path:
      return next_fun(*args, **kwargs)
    if before is not None:
      args = (before(args[0]),) + tuple(args[1:])
    if skip:
      return args[0]
    out = next_fun(*args, **kwargs)
    if after is None:
      return out
    if isinstance(out, tuple):
      return (after(out[0]),) + tuple(out[1:])
    return after(out)

  return interceptor


def final_norm(
  model: Model, params, hidden: Float[Array, '*batch D']
) -> Float[Array, '*batch D']:
  """The model's final norm alone: `[..., D] -> [..., D]`.

  Runs `Model.lm_head` and keeps the norm's output; under `jit` the unused
  head matmul is removed by XLA. Identity if the head has no final norm.
  """
  path = final_norm_path(model, params)
  if path is None:
    return hidden
  captured = []

  def grab(x):
    captured.append(x)
    return x

  with nn.intercept_methods(_intercept(path, after=grab)):
    model.lm_head(params, hidden)
  return captured[0]


def layer_states(
  model: Model, params, ids, mask, layers: Sequence[Layer]
) -> jax.Array:
  """Hidden states `H^i` of the requested layers, `[len(layers), B, T, D]`.

  Args:
    model: the target model.
    params: its parameters.
    ids: int32 `[B, T]`.
    mask: `[B, T]`, 1 for real tokens.
    layers: ints in [0, num_layers] (0 = embedding output, i = output of
      block i without final norm) or 'last' (final norm of block L's output,
      Hugging Face's last `hidden_states` entry).
  """
  layers = [parse_layer(model, layer) for layer in layers]
  hs = model.hidden_states(params, ids, mask)  # [L + 1, B, T, D]
  out = []
  for layer in layers:
    out.append(
      final_norm(model, params, hs[-1]) if layer == LAST else hs[layer]
    )
  return jnp.stack(out)


def layer_states_of_many(
  model: Model, params, ids, mask, layers: Sequence[Layer], *, batch: int = 16
) -> np.ndarray:
  """:func:`layer_states` of many texts, `batch` rows per forward pass (one
  compile per batch shape), float32 numpy `[len(layers), N, T, D]`. A host
  loop, for runners; `layers` may be strings ('25', 'last')."""
  fn = jitted(layer_states, static_argnames=('model', 'layers'))
  wanted = tuple(LAST if x == LAST else int(x) for x in layers)
  parts = [
    np.asarray(
      fn(
        model,
        params,
        jnp.asarray(ids[s : s + batch]),
        jnp.asarray(mask[s : s + batch]),
        wanted,
      ),
      np.float32,
    )
    for s in range(0, len(ids), batch)
  ]
  return np.concatenate(parts, axis=1)


# --------------------------------------------------------------- BEI, HEI
def head_logits(
  model: Model, params, hidden: jax.Array, *, apply_final_norm: bool = False
) -> Float[Array, '*batch V']:
  """`logits(H) = H w + b` (Eq. 4), float32 `[..., vocab]`.

  Args:
    model: the target model.
    params: its parameters.
    hidden: `[..., D]`.
    apply_final_norm: run the final norm first (i.e. `Model.lm_head`); the
      default False is the paper's BEI, see the module docstring.
  """
  path = None if apply_final_norm else final_norm_path(model, params)
  if path is None:
    return model.lm_head(params, hidden)
  with nn.intercept_methods(_intercept(path, skip=True)):
    return model.lm_head(params, hidden)


def bei_ids(
  model: Model, params, hidden: jax.Array, *, apply_final_norm: bool = False
) -> Int[Array, '*batch']:
  """Base Embed Inversion (Sec. 4.1, Eq. 8): int32 argmax ids `[...]`.

  Softmax is monotone, so `argmax(softmax(logits)) = argmax(logits)`.
  """
  logits = head_logits(model, params, hidden, apply_final_norm=apply_final_norm)
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def cosine_scores(
  hidden: Float[Array, '*batch D'],
  embeddings: Float[Array, 'V D'],
  *,
  eps: float = 1e-8,
) -> Float[Array, '*batch V']:
  """`W H^T / (|W| |H|)` of Eq. 9: `[..., D] x [V, D] -> [..., V]` float32."""
  h = hidden.astype(jnp.float32)
  w = embeddings.astype(jnp.float32)
  h = h / jnp.maximum(jnp.linalg.norm(h, axis=-1, keepdims=True), eps)
  w = w / jnp.maximum(jnp.linalg.norm(w, axis=-1, keepdims=True), eps)
  return jnp.einsum('...d,vd->...v', h, w)


def _inverse_row_norms(embeddings: jax.Array, eps: float = 1e-8) -> jax.Array:
  w = embeddings.astype(jnp.float32)
  return 1.0 / jnp.maximum(jnp.linalg.norm(w, axis=-1), eps)  # [V]


def hei_ids(
  hidden: Float[Array, '*batch D'], embeddings: Float[Array, 'V D']
) -> Int[Array, '*batch']:
  """Hotmap Embed Inversion (Sec. 4.2, Eq. 9): int32 ids `[...]`.

  The vocabulary entry whose embedding has the largest cosine similarity
  with each position of `hidden` `[..., D]`; `embeddings` is the model's
  input embedding matrix `[V, D]` (`Model.word_embeddings`). Dividing by
  `|H_t|` does not change the argmax over v, so this is one matmul
  `H W^T` (`2 * prod(...) * V * D` FLOPs) scaled by `1 / |W_v|`.
  """
  scores = jnp.einsum(
    '...d,vd->...v', hidden.astype(jnp.float32), embeddings.astype(jnp.float32)
  )
  return jnp.argmax(scores * _inverse_row_norms(embeddings), axis=-1).astype(
    jnp.int32
  )


def has_tied_linear_head(model: Model) -> bool:
  """True if `logits = norm(H) W^T` with W the input embedding, no bias.

  Read from the declared facts `tie_word_embeddings` and `paths`.
  """
  return bool(
    model.tie_word_embeddings
    and model.paths.lm_head is None
    and model.paths.output_bias is None
  )


def tied_bei_hei_ids(
  hidden: Float[Array, '*batch D'], embeddings: Float[Array, 'V D']
) -> tuple[Int[Array, '*batch'], Int[Array, '*batch']]:
  """BEI and HEI ids from one shared matmul, for tied-head models.

  When :func:`has_tied_linear_head`, BEI without the final norm is
  `argmax_v H W_v` and HEI is `argmax_v H W_v / |W_v|`: both read the same
  scores `H W^T`, so this halves the cost of running both.

  Returns:
    `(bei_ids, hei_ids)`, each int32 `[...]`.
  """
  scores = jnp.einsum(
    '...d,vd->...v', hidden.astype(jnp.float32), embeddings.astype(jnp.float32)
  )
  bei = jnp.argmax(scores, axis=-1).astype(jnp.int32)
  hei = jnp.argmax(scores * _inverse_row_norms(embeddings), axis=-1).astype(
    jnp.int32
  )
  return bei, hei


def bei_hei_ids(
  model: Model, params, hidden: jax.Array
) -> tuple[Int[Array, '*batch'], Int[Array, '*batch']]:
  """BEI (no final norm, the paper's) and HEI ids of `hidden [..., D]`.

  Equal to `(bei_ids(model, params, hidden), hei_ids(hidden, W))`; with a
  tied linear head (:func:`has_tied_linear_head`) both come from the one
  matmul of :func:`tied_bei_hei_ids`. Pure: jit it with `model` static.

  Returns:
    `(bei_ids, hei_ids)`, each int32 `[...]`.
  """
  emb = model.word_embeddings(params)
  if has_tied_linear_head(model):
    return tied_bei_hei_ids(hidden, emb)
  return bei_ids(model, params, hidden), hei_ids(hidden, emb)


def decode_ids(tokenizer, ids, mask) -> list[str]:
  """Decodes each row of `ids [B, T]` over its real (mask=1) positions."""
  ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
  return [tokenizer.decode(row[m].tolist()) for row, m in zip(ids, mask)]


# ------------------------------------------ running the model from layer i
def logits_with_transform(
  model: Model,
  params,
  ids,
  mask,
  *,
  layer: Layer,
  transform: Callable[[jax.Array], jax.Array],
) -> jax.Array:
  """Logits `[B, T, vocab]` when `H^layer` is replaced by `transform(H^layer)`.

  This is the defended model of Sec. 5.3: the user transforms the hidden
  states of layer i before the provider runs the rest of the model.

  Args:
    model: the target model.
    params: its parameters.
    ids: int32 `[B, T]`.
    mask: `[B, T]`.
    layer: 0..num_layers or 'last' (transform after the final norm).
    transform: `[B, T, D] -> [B, T, D]`.
  """
  layer = parse_layer(model, layer)
  n = _num_layers(model)
  if layer == LAST or layer == n:
    norm = final_norm_path(model, params)
    if norm is None:
      hidden = model.hidden_states(params, ids, mask)[-1]
      return model.lm_head(params, transform(hidden))
    where = dict(after=transform) if layer == LAST else dict(before=transform)
    interceptor = _intercept(norm, **where)
  else:
    interceptor = _intercept(
      block_paths(model, params)[layer], before=transform
    )
  with nn.intercept_methods(interceptor):
    return model.logits(params, ids, mask)


def hidden_with_transform(
  model: Model,
  params,
  ids,
  mask,
  *,
  transform: Callable[[jax.Array], jax.Array],
) -> jax.Array:
  """The last block's output `[B, T, D]` when `H^0` is replaced by
  `transform(H^0)`: the model read as a stack of blocks over given inputs
  (Embed Parrot's pretrained Decode Model, Sec. 4.3).

  Args:
    model: a model with `hidden_states` and declared `attention_inputs`.
    params: its parameters (traced params are fine).
    ids: int32 `[B, T]`: the ids whose `H^0` is handed to `transform`.
    mask: `[B, T]`.
    transform: `H^0 [B, T, D] -> [B, T, D]`.
  """
  interceptor = _intercept(block_paths(model, params)[0], before=transform)
  with nn.intercept_methods(interceptor):
    return model.hidden_states(params, ids, mask)[-1]


def logits_from_hidden(
  model: Model, params, hidden: jax.Array, mask, *, layer: Layer = 0
) -> jax.Array:
  """Runs the model from given `H^layer` `[B, T, D]` to logits `[B, T, V]`.

  E.g. `layer=0` feeds (soft) input embeddings, as the EP+PPL loss of
  Sec. 4.3 does. Blocks before `layer` run on dummy ids and are discarded.
  """
  ids = jnp.zeros(hidden.shape[:2], jnp.int32)
  return logits_with_transform(
    model,
    params,
    ids,
    mask,
    layer=layer,
    transform=lambda h: hidden.astype(h.dtype),
  )


def sequence_nll(
  logits: Float[Array, 'B T V'], ids, mask
) -> tuple[Float[Array, ' B'], Float[Array, ' B']]:
  """Summed next-token NLL and token count per row, each float32 `[B]`.

  Perplexity over a corpus is `exp(sum(nll) / sum(count))`.
  """
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  weights = jnp.asarray(mask)[:, 1:].astype(jnp.float32)
  return (nll * weights).sum(-1), weights.sum(-1)


__all__ = [
  'LAST',
  'layer_states_of_many',
  'parse_layer',
  'block_paths',
  'final_norm_path',
  'final_norm',
  'layer_states',
  'head_logits',
  'bei_ids',
  'cosine_scores',
  'hei_ids',
  'has_tied_linear_head',
  'tied_bei_hei_ids',
  'bei_hei_ids',
  'decode_ids',
  'logits_with_transform',
  'hidden_with_transform',
  'logits_from_hidden',
  'sequence_nll',
]
