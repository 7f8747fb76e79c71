"""Your own model as a :class:`leakjax.models.Model`, and the checks of it.

* :func:`from_functions` -- your own pure `logits(params, ids, mask)` (and,
  if you have them, `init_cache` / `decode`);
* :func:`from_flax` -- your own Flax linen module;
* :class:`FusedKernel` -- a fused q/k/v kernel in `attention_inputs`;
* :func:`check_params` -- whether a params pytree fits a model's declared
  facts (every path present, the vocabulary, the attention layouts).

**The attention layouts.** `attention_inputs` lists, for the first blocks,
the kernels that read the block's normalised input. Each entry is a path of
a kernel whose first axis is the width `dim`; trailing axes are flattened,
so every layout people use is declared by its path alone:

* `[dim, dim]` or `[dim, out]`: `nn.Dense` q/k/v (Llama's, ours);
* `[dim, heads, head_dim]`: Flax's stock `nn.MultiHeadDotProductAttention`
  (linen) and `nnx.MultiHeadAttention`, whose q/k/v are `DenseGeneral` /
  `LinearGeneral` (e.g. `'block_0/attn/query/kernel'`);
* a fused kernel `[dim, 3 * dim]` (GPT-2's `c_attn`) or
  `[dim, 3, heads, head_dim]`, by its path, or as
  `FusedKernel(path, parts='qkv')` saying which slice is q, k and v (the
  slices along axis 1, in that order); its shape is then checked too.

:meth:`leakjax.models.Model.attention_input_kernels` turns the declared
kernels (or their gradients) into the one `[dim, out]` matrix the span
tests read: each kernel reshaped to `[dim, -1]`, a fused kernel's parts put
in q, k, v order, side by side. Reshaping keeps the column space, which is
all the span tests use, so the attacks never see the layout.

**When shapes are checked.** A model holds no arrays, so its declared
paths can only be checked against params: :func:`from_functions` and
:func:`from_flax` check them when given `params=` (an example params pytree,
or its `jax.eval_shape`), and every attack's host entry point checks the
params it is given before any work (:func:`leakjax.checks.check_inputs`).
Either way a mismatch is one :class:`LeakjaxError` naming the path and the
expected shape.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, Callable

import jax

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import (
  Bound,
  FirstLayerInputs,
  Model,
  ParamPath,
  ParamPaths,
)

QKV = 'qkv'


@dataclasses.dataclass(frozen=True)
class FusedKernel:
  """A fused attention-input kernel in `attention_inputs`, and its parts.

  Attributes:
    path: the kernel's path, `[dim, n * out]` (n slices side by side along
      axis 1) or `[dim, n, heads, head_dim]` (axis 1 indexes the slices).
    parts: which slice is which, in order: 'qkv' (the usual), 'kqv', ...;
      a subset such as 'qk' for a kernel that holds only those.
  """

  path: ParamPath | str
  parts: str = QKV

  def __post_init__(self):
    parts = self.parts
    if (
      not isinstance(parts, str)
      or not parts
      or set(parts) - set(QKV)
      or len(set(parts)) != len(parts)
    ):
      raise LeakjaxError(
        f'FusedKernel parts={parts!r} must name each of q, k, v at most'
        ' once, in the order of the slices',
        "e.g. parts='qkv' for a kernel [dim, 3 * dim] holding q | k | v",
      )


def _path(p, what: str) -> ParamPath | None:
  if p is None:
    return None
  if isinstance(p, str):
    p = tuple(p.split('/'))
  if not isinstance(p, (tuple, list)):
    raise LeakjaxError(
      f'{what} must be a path of dict keys, got {p!r}',
      "e.g. ('embed', 'embedding') or 'embed/embedding'",
    )
  p = tuple(p)
  if not p or not all(isinstance(k, str) and k for k in p):
    raise LeakjaxError(
      f'{what} must be a path of dict keys, got {p!r}',
      "e.g. ('embed', 'embedding') or 'embed/embedding'",
    )
  return p


def _attention(attention_inputs) -> tuple[tuple, tuple]:
  """`(paths, parts)` per block: paths of dict keys and '' or fused parts."""
  paths, parts = [], []
  for b, layer in enumerate(attention_inputs):
    if isinstance(layer, (str, FusedKernel)):
      raise LeakjaxError(
        f'attention_inputs[{b}] must be the tuple of block {b} kernels, got'
        f' {layer!r}',
        "e.g. attention_inputs=(('h_0/q/kernel', 'h_0/k/kernel',"
        " 'h_0/v/kernel'), ...), one tuple per block",
      )
    block_paths, block_parts = [], []
    for i, entry in enumerate(layer):
      what = f'attention_inputs[{b}][{i}]'
      if isinstance(entry, FusedKernel):
        block_paths.append(_path(entry.path, what))
        block_parts.append(entry.parts)
      else:
        block_paths.append(_path(entry, what))
        block_parts.append('')
    paths.append(tuple(block_paths))
    parts.append(tuple(block_parts))
  if not any(p for block in parts for p in block):
    parts = []  # all plain: the default
  return tuple(paths), tuple(parts)


def check_paths(
  word_embeddings,
  position_embeddings=None,
  lm_head=None,
  output_bias=None,
  attention_inputs=(),
  last_layers=(),
) -> ParamPaths:
  """:class:`ParamPaths` from user declarations (strings or key tuples).

  Raises:
    LeakjaxError: a path is not a path of dict keys, or `attention_inputs`
      is not one tuple of kernels per block.
  """
  if word_embeddings is None:
    raise LeakjaxError(
      'word_embeddings is required', 'give the path of the [vocab, dim] matrix'
    )
  paths, parts = _attention(attention_inputs)
  return ParamPaths(
    word_embeddings=_path(word_embeddings, 'word_embeddings'),
    position_embeddings=_path(position_embeddings, 'position_embeddings'),
    lm_head=_path(lm_head, 'lm_head'),
    output_bias=_path(output_bias, 'output_bias'),
    attention_inputs=paths,
    attention_parts=parts,
    last_layers=tuple(_path(p, 'last_layers') for p in last_layers),
  )


# ------------------------------------------------------------------ checks
def _shape(x) -> tuple[int, ...] | None:
  shape = getattr(x, 'shape', None)
  return None if shape is None else tuple(shape)


def _at(params, path: ParamPath, what: str, fact: str, argument: str = ''):
  """`params` at `path`, or a LeakjaxError naming the path and the fact
  (declared through `argument=`, by default the fact's name)."""
  node = params
  for depth, key in enumerate(path):
    if not isinstance(node, Mapping) or key not in node:
      where = '/'.join(path[: depth + 1])
      fix = f'pass the path of this tensor in {what} as {argument or fact}='
      if (
        depth == 0
        and isinstance(params, Mapping)
        and list(params) == ['params']
        and isinstance(params['params'], Mapping)
        and key in params['params']
      ):
        fix = f"did you pass {{'params': {what}}}? pass {what}['params']"
      elif isinstance(node, Mapping):
        shown = ', '.join(repr(k) for k in list(node)[:6])
        fix = f'{fix} (keys here: {shown})'
      raise LeakjaxError(
        f'{fact} {"/".join(path)!r} is not in {what}: no {where!r}', fix
      )
    node = node[key]
  return node


def _kernel_problem(shape, dim: int, parts: str) -> str | None:
  """Why a declared attention kernel's shape does not fit, or None."""
  if shape is None or len(shape) < 2 or shape[0] != dim:
    if parts:
      return (
        f'[{dim}, {len(parts)} * out] or [{dim}, {len(parts)}, heads,'
        ' head_dim] (a fused kernel reading the block input)'
      )
    return (
      f'[{dim}, ...] (a kernel reading the block input: [{dim}, out],'
      f' [{dim}, heads, head_dim] or a fused [{dim}, 3 * out])'
    )
  n = len(parts)
  if n and len(shape) == 2 and shape[1] % n:
    return f'[{dim}, {n} * out]: {shape[1]} does not split into {n} slices'
  if n and len(shape) > 2 and shape[1] != n:
    return f'[{dim}, {n}, heads, head_dim] (axis 1 indexes {parts!r})'
  return None


def check_params(model: Model, params, what: str = 'params') -> None:
  """Raises LeakjaxError unless `params` fits `model`'s declared facts.

  Shapes only (no values are read), so `jax.eval_shape` output works too.
  Checks that every declared path is in `params`, that the word embeddings
  are `[vocab_size, dim]` (and an untied head `[dim, vocab_size]`, an
  output bias `[vocab_size]`), and that each declared attention kernel has
  the width `dim` (`model.hidden_size`, else the embedding's) as its first
  axis, a :class:`FusedKernel` also its parts on axis 1.
  """
  paths = model.paths
  emb = _shape(_at(params, paths.word_embeddings, what, 'word_embeddings'))
  where = '/'.join(paths.word_embeddings)
  if emb is None or len(emb) != 2:
    raise LeakjaxError(
      f'the word embeddings {where!r} have shape {emb}; expected [vocab, dim]',
      'pass the path of the input embedding matrix as word_embeddings=',
    )
  if emb[0] != model.vocab_size:
    raise LeakjaxError(
      f'vocab_size={model.vocab_size} but the word embeddings {where!r} have'
      f' {emb[0]} rows',
      f'pass vocab_size={emb[0]} (token ids index the embedding rows)',
    )
  dim = model.hidden_size or emb[1]
  for fact, argument, want in (
    ('lm_head', 'lm_head_path', '[dim, vocab]'),
    ('output_bias', 'output_bias', '[vocab]'),
  ):
    path = getattr(paths, fact)
    if path is None:
      continue
    shape = _shape(_at(params, path, what, fact, argument))
    if not shape or shape[-1] != model.vocab_size:
      raise LeakjaxError(
        f'{fact} {"/".join(path)!r} has shape {shape}; expected {want} with'
        f' vocab {model.vocab_size}',
        f'pass the path of the output {want} tensor as {argument}=',
      )
  if paths.position_embeddings is not None:
    shape = _shape(
      _at(params, paths.position_embeddings, what, 'position_embeddings')
    )
    if shape is None or len(shape) != 2 or shape[1] != emb[1]:
      raise LeakjaxError(
        f'position_embeddings {"/".join(paths.position_embeddings)!r} has'
        f' shape {shape}; expected [max_length, {emb[1]}]',
        'pass the path of the learned position embeddings, or None',
      )
  for b, block in enumerate(paths.attention_inputs):
    for i, path in enumerate(block):
      name = f'attention_inputs[{b}][{i}]'
      shape = _shape(_at(params, path, what, name, 'attention_inputs'))
      problem = _kernel_problem(shape, dim, paths.parts(b, i))
      if problem is not None:
        raise LeakjaxError(
          f'{name} {"/".join(path)!r} has shape {shape}; expected {problem}',
          'declare the q/k/v kernels that read the block input (not the'
          ' output projection); FusedKernel(path, parts) for a fused one',
        )
  for path in paths.last_layers:
    _at(params, path, what, 'last_layers')


# ------------------------------------------------------------ constructors
def from_functions(
  logits: Callable[..., jax.Array],
  *,
  vocab_size: int,
  word_embeddings: ParamPath | str,
  hidden_size: int | None = None,
  num_layers: int | None = None,
  max_length: int | None = None,
  tie_word_embeddings: bool = False,
  decode: Callable[..., Any] | None = None,
  init_cache: Callable[..., Any] | None = None,
  hidden_states: Callable[..., jax.Array] | None = None,
  lm_head: Callable[..., jax.Array] | None = None,
  first_layer_inputs: Callable[..., FirstLayerInputs] | None = None,
  block_inputs: Callable[..., jax.Array] | None = None,
  position_embeddings: ParamPath | str | None = None,
  lm_head_path: ParamPath | str | None = None,
  output_bias: ParamPath | str | None = None,
  attention_inputs: tuple = (),
  last_layers: tuple = (),
  tokenizer: Any = None,
  params: Any = None,
) -> Model:
  """A :class:`Model` from your own pure functions.

  Args:
    logits: `(params, ids [b, t], mask [b, t] or None) -> [b, t, vocab]`.
      It must be causal (position t sees tokens <= t) for decoding.
    vocab_size: number of token ids (the word embedding's rows).
    word_embeddings: path of the input embedding `[vocab, dim]` in params.
    hidden_size, num_layers, max_length: facts some attacks read.
    tie_word_embeddings: whether the head reuses `word_embeddings`.
    decode, init_cache: `(params, cache, ids) -> (logits, cache)` and
      `(params, batch_size, max_length) -> cache`, both or neither; without
      them decoding writes the new tokens after the prefix and re-runs
      `logits` over the whole buffer (exact, O(n) per step).
    hidden_states: `(params, ids, mask) -> [layers + 1, b, t, d]` (needed by
      embedding inversion and DAGER's last-token completion).
    lm_head: `(params, hidden [..., d]) -> [..., vocab]`.
    first_layer_inputs: `params -> FirstLayerInputs` (needed by span tests).
    block_inputs: `(params, ids, mask, layer) -> [b, t, d]`, the normalised
      input of block `layer` (needed by DAGER's layer-2 search; see
      :meth:`Model.block_inputs`).
    position_embeddings, lm_head_path, output_bias, last_layers: paths
      ('a/b' strings or key tuples), see :class:`ParamPaths`.
    attention_inputs: per block, a tuple of the kernels that read the
      block's normalised input: paths, or :class:`FusedKernel` (module
      docstring: every Flax layout works).
    tokenizer: host-side tokenizer, or None.
    params: an example params pytree (or its `jax.eval_shape`): if given,
      every declared path and shape is checked now (:func:`check_params`);
      the attacks check the params they get anyway.

  The model compares by these functions' identity: define them once (not a
  new lambda per call) so that jitted attacks compile once.
  """
  model = Model(
    vocab_size=vocab_size,
    logits_fn=logits,
    paths=check_paths(
      word_embeddings,
      position_embeddings,
      lm_head_path,
      output_bias,
      attention_inputs,
      last_layers,
    ),
    hidden_size=hidden_size,
    num_layers=num_layers,
    max_length=max_length,
    tie_word_embeddings=tie_word_embeddings,
    decode_fn=decode,
    init_cache_fn=init_cache,
    hidden_fn=hidden_states,
    head_fn=lm_head,
    first_layer_fn=first_layer_inputs,
    block_input_fn=block_inputs,
    tokenizer=tokenizer,
  )
  if params is not None:
    check_params(model, params)
  return model


def _takes_mask(fn) -> bool:
  """Whether a module method accepts a second argument after `ids`."""
  params = [
    p
    for p in inspect.signature(fn).parameters.values()
    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
  ]
  return len(params) >= 3  # self, ids, mask


def _flax_call(module, method, takes_mask, params, ids, mask=None):
  args = (ids, mask) if takes_mask else (ids,)
  return module.apply({'params': params}, *args, method=method)


def _flax_method(module, name, params, *args):
  return module.apply({'params': params}, *args, method=name)


def _method(module, name: str, argument: str):
  """`name` checked to be a method of `module`'s class."""
  if not callable(getattr(type(module), name, None)):
    raise LeakjaxError(
      f'{type(module).__name__} has no method {name!r}',
      f'pass {argument}= the name of a method of the module, or a function',
    )
  return name


def from_flax(
  module,
  *,
  vocab_size: int,
  word_embeddings: ParamPath | str,
  method: str = '__call__',
  decode_method: str | None = None,
  init_cache: Callable[..., Any] | None = None,
  hidden_states_method: str | None = None,
  lm_head_method: str | None = None,
  first_layer_inputs: str | Callable[..., FirstLayerInputs] | None = None,
  block_inputs: str | Callable[..., jax.Array] | None = None,
  hidden_size: int | None = None,
  num_layers: int | None = None,
  max_length: int | None = None,
  tie_word_embeddings: bool = False,
  position_embeddings: ParamPath | str | None = None,
  lm_head_path: ParamPath | str | None = None,
  output_bias: ParamPath | str | None = None,
  attention_inputs: tuple = (),
  last_layers: tuple = (),
  tokenizer: Any = None,
  params: Any = None,
) -> Model:
  """A :class:`Model` from your own Flax linen module.

  Methods are named (strings), so the model compares by the module's value:
  two equal modules give equal models, and jitted attacks compile once.

  Args:
    module: a linen module; `module.apply({'params': params}, ids)` (or
      `(ids, mask)` if its method takes a second argument) returns logits
      `[b, t, vocab]`.
    vocab_size: number of token ids (the word embedding's rows).
    word_embeddings: path of the input embedding `[vocab, dim]` in params.
    method: the name of the logits method.
    decode_method: name of a method `(cache, ids) -> (logits, cache)`; with
      it, `init_cache(params, batch_size, max_length)` is required.
    init_cache: see above.
    hidden_states_method: name of a method `(ids[, mask]) -> [layers + 1,
      b, t, d]`, or None (needed by embedding inversion and DAGER's
      last-token completion).
    lm_head_method: name of a method `(hidden) -> logits`, or None.
    first_layer_inputs: the name of a method `() -> FirstLayerInputs` (it
      reads the module's own parameters), or a function `params ->
      FirstLayerInputs`; needed by the span tests (the tied bag, DAGER).
    block_inputs: the name of a method `(ids, mask, layer) -> [b, t, d]`,
      or a function `(params, ids, mask, layer) -> [b, t, d]`: the
      normalised input of block `layer` (DAGER's layer-2 search).
    hidden_size, num_layers, max_length, tie_word_embeddings,
      position_embeddings, lm_head_path, output_bias, attention_inputs,
      last_layers, tokenizer, params: as in :func:`from_functions`.
  """
  fn = getattr(type(module), method, None)
  if fn is None:
    raise LeakjaxError(
      f'{type(module).__name__} has no method {method!r}',
      'pass method= the name of the logits method',
    )
  decode = hidden = head = None
  if decode_method is not None:
    _method(module, decode_method, 'decode_method')
    decode = Bound(_flax_method, (module, decode_method))
  if hidden_states_method is not None:
    _method(module, hidden_states_method, 'hidden_states_method')
    takes_mask = _takes_mask(getattr(type(module), hidden_states_method))
    hidden = Bound(_flax_call, (module, hidden_states_method, takes_mask))
  if lm_head_method is not None:
    _method(module, lm_head_method, 'lm_head_method')
    head = Bound(_flax_method, (module, lm_head_method))
  if isinstance(first_layer_inputs, str):
    _method(module, first_layer_inputs, 'first_layer_inputs')
    first_layer_inputs = Bound(_flax_method, (module, first_layer_inputs))
  if isinstance(block_inputs, str):
    _method(module, block_inputs, 'block_inputs')
    block_inputs = Bound(_flax_method, (module, block_inputs))
  return from_functions(
    Bound(_flax_call, (module, method, _takes_mask(fn))),
    vocab_size=vocab_size,
    word_embeddings=word_embeddings,
    hidden_size=hidden_size,
    num_layers=num_layers,
    max_length=max_length,
    tie_word_embeddings=tie_word_embeddings,
    decode=decode,
    init_cache=init_cache,
    hidden_states=hidden,
    lm_head=head,
    first_layer_inputs=first_layer_inputs,
    block_inputs=block_inputs,
    position_embeddings=position_embeddings,
    lm_head_path=lm_head_path,
    output_bias=output_bias,
    attention_inputs=attention_inputs,
    last_layers=last_layers,
    tokenizer=tokenizer,
    params=params,
  )


__all__ = [
  'FusedKernel',
  'check_params',
  'check_paths',
  'from_flax',
  'from_functions',
]
