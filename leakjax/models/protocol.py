"""The model protocol every leakjax attack uses.

A language model is pure functions over an explicit params pytree plus a few
static facts. :class:`LanguageModel` is the contract; :class:`Model` is the one
implementation, built by our families (:func:`leakjax.models.load`) and by
:mod:`leakjax.models.custom` (both exported by :mod:`leakjax.models`):

* :func:`from_functions` -- your own `logits(params, ids, mask)` (and, if you
  have them, `init_cache` / `decode`; without them decoding recomputes the
  prefix, which is exact and slower);
* :func:`from_flax` -- your own Flax linen module.

A model holds no arrays and compares and hashes by value, so it is a valid
static argument of `jax.jit`: new params of the same shapes never recompile,
and the jit cache never keeps weights alive.

>>> model, params = leakjax.models.load('smollm2-135m')         # doctest: +SKIP
>>> logits = jax.jit(model.logits)(params, ids, mask)           # doctest: +SKIP
>>> cache = model.init_cache(params, batch_size=8, max_length=40)  # doctest: +SKIP
>>> logits, cache = model.decode(params, cache, ids[:, :3])     # doctest: +SKIP

Shapes: `ids` is int32 `[batch, time]`; `mask` is `[batch, time]` with 1 for
real tokens and 0 for padding (right padding). Padding never influences real
positions. A decoding cache is a pytree whose every leaf has the batch as its
leading axis, so reordering beams is `jax.tree.map(lambda x: x[idx], cache)`;
rows may sit at different positions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, runtime_checkable

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from leakjax.errors import LeakjaxError, check_token_ids

PyTree = Any
ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ParamPaths:
  """Where attacks find the parameters that leak, as paths of dict keys.

  Attributes:
    word_embeddings: the input token embedding matrix, `[vocab, dim]`.
    position_embeddings: learned position embeddings `[max_len, dim]`
      (GPT-2), or None.
    lm_head: an untied output projection laid out `[dim, vocab]` (a Dense
      kernel); None when the head is tied to `word_embeddings` or absent.
    output_bias: the output bias `[vocab]` (the LSTM families), or None.
    attention_inputs: for the first blocks, in order, the paths of the
      kernels that read the block's (normalised) input: Llama's q/k/v
      projections `[dim, dim]`, Flax's stock `[dim, heads, head_dim]`
      DenseGeneral kernels, GPT-2's fused `c_attn` `[dim, 3 * dim]`. Span
      tests (the tied bag of words, DAGER) use the gradients of these, as
      :meth:`Model.attention_input_kernels` lays them out; `()` when the
      model declares none.
    attention_parts: parallel to `attention_inputs`, per kernel '' (its
      trailing axes are flattened) or the order of a fused kernel's q/k/v
      slices along axis 1 ('qkv', ...); `()` when every kernel is plain.
    last_layers: the subtrees whose gradient FILM's reordering scores (the
      last block and the final norm: one backward pass through one block);
      `()` means every parameter.
  """

  word_embeddings: ParamPath
  position_embeddings: ParamPath | None = None
  lm_head: ParamPath | None = None
  output_bias: ParamPath | None = None
  attention_inputs: tuple[tuple[ParamPath, ...], ...] = ()
  last_layers: tuple[ParamPath, ...] = ()
  attention_parts: tuple[tuple[str, ...], ...] = ()

  def parts(self, block: int, kernel: int) -> str:
    """'' for a plain kernel, else the fused kernel's slice order."""
    if block < len(self.attention_parts):
      return self.attention_parts[block][kernel]
    return ''


@flax.struct.dataclass
class FirstLayerInputs:
  """What the first block's attention projections read for each token.

  The input of token `v` at position `t` is
  `norm(tokens[v] + positions[t]) * scale + bias`, with `norm` a LayerNorm
  (`kind='layer'`: centred, divided by the std) or an RMSNorm (`'rms'`).
  Pre-norm transformers (GPT-2, Llama, Qwen, Mistral, ...) all fit.

  Attributes:
    tokens: float `[vocab, dim]`, the token embeddings.
    positions: float `[max_len, dim]` added before the norm, or None
      (rotary models apply positions after the projection).
    scale: float `[dim]`, the norm's gain.
    bias: float `[dim]` or None (RMSNorm has none).
    eps: the norm's epsilon.
    kind: 'layer' or 'rms'.
  """

  tokens: Float[Array, 'V d']
  positions: Float[Array, 'P d'] | None
  scale: Float[Array, ' d']
  bias: Float[Array, ' d'] | None
  eps: float = flax.struct.field(pytree_node=False)
  kind: str = flax.struct.field(pytree_node=False)


@runtime_checkable
class LanguageModel(Protocol):
  """The contract between a language model and every leakjax attack.

  All methods are pure functions of an explicit `params` pytree, so callers
  may `jax.jit`, `jax.grad` and `jax.vmap` them; the attributes are static
  facts (plain Python values), never family names for attacks to branch on.

  Attributes:
    vocab_size: number of token ids.
    hidden_size: width of the hidden states (None if unknown).
    num_layers: number of blocks (None if unknown).
    max_length: longest sequence the model accepts, None if unbounded.
    tie_word_embeddings: whether the output head is the input embedding.
    paths: where the embeddings, head and first attention kernels sit in
      the params pytree, see :class:`ParamPaths`.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer` or None (host side,
      not part of the model's identity).
  """

  vocab_size: int
  hidden_size: int | None
  num_layers: int | None
  max_length: int | None
  tie_word_embeddings: bool
  paths: ParamPaths
  tokenizer: Any

  def logits(self, params, ids, mask=None) -> Float[Array, 'b t V']:
    """Next-token logits, float32 `[batch, time, vocab]`."""
    ...

  def token_log_probs(
    self, params, ids, mask=None
  ) -> Float[Array, 'b t_minus_1']:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, `[batch, time - 1]`."""
    ...

  def init_cache(self, params, batch_size: int, max_length: int) -> PyTree:
    """An empty decoding cache for `batch_size` rows of `max_length` tokens."""
    ...

  def decode(self, params, cache, ids) -> tuple[Float[Array, 'b t V'], PyTree]:
    """Appends `ids [batch, t]` to the cache: `(logits [batch, t, V], cache)`."""
    ...


# ----------------------------------------------------------------- helpers
def _check_concrete_ids(ids, vocab_size: int) -> None:
  """`check_token_ids` on concrete ids; traced ids (inside jit) pass."""
  if not isinstance(ids, jax.core.Tracer):
    check_token_ids(ids, vocab_size)


@dataclasses.dataclass(frozen=True)
class Bound:
  """`fn` with leading static arguments, compared and hashed by value.

  `functools.partial` compares by identity; a model built twice from the
  same config must be the same static argument, so our families bind their
  configs with this instead.
  """

  fn: Callable[..., Any]
  static: tuple[Any, ...] = ()

  def __call__(self, *args, **kwargs):
    return self.fn(*self.static, *args, **kwargs)


def get_path(tree: PyTree, path: ParamPath) -> jax.Array:
  """Returns `tree[path[0]][path[1]]...`."""
  for key in path:
    tree = tree[key]
  return tree


def set_path(tree: PyTree, path: ParamPath, value) -> PyTree:
  """Returns a copy of nested dict `tree` with `value` at `path`."""
  if not path:
    return value
  new = dict(tree)
  new[path[0]] = set_path(tree[path[0]], path[1:], value)
  return new


def num_params(params: PyTree) -> int:
  """Number of scalars in a params pytree."""
  return sum(x.size for x in jax.tree_util.tree_leaves(params))


def lm_loss(logits, ids, mask=None) -> jax.Array:
  """Mean next-token cross-entropy; pad targets (mask=0) are excluded.

  Args:
    logits: `[batch, time, vocab]` from `Model.logits`.
    ids: `[batch, time]` int token ids.
    mask: `[batch, time]` 1 for real tokens; None means all real.

  Returns:
    Scalar float32 loss averaged over all real target tokens of the batch.
  """
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
  if mask is None:
    return nll.mean()
  weights = mask[:, 1:].astype(jnp.float32)
  return (nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def require_family(model: Model, *families: str) -> None:
  """Raises LeakjaxError unless `model.family` is one of `families`.

  For weight converters only: attacks read declared facts, not families.
  """
  if model.family not in families:
    raise LeakjaxError(
      f'this needs a {" or ".join(families)} model, got {model.family}',
      'load a model of a supported family',
    )


# ------------------------------------------------ decoding without a cache
@flax.struct.dataclass
class PrefixCache:
  """The decoding state of a model without a KV cache: the tokens so far.

  Attributes:
    ids: int32 `[batch, max_length]`, the tokens written so far (0 after).
    index: int32 `[batch]`, how many tokens each row holds.
  """

  ids: Int[Array, 'b n']
  index: Int[Array, ' b']


def _prefix_init_cache(params, batch_size: int, max_length: int) -> PrefixCache:
  del params
  return PrefixCache(
    ids=jnp.zeros((batch_size, max_length), jnp.int32),
    index=jnp.zeros((batch_size,), jnp.int32),
  )


def _prefix_decode(logits_fn, params, cache: PrefixCache, ids):
  """Writes `ids` after each row's prefix and re-runs the whole prefix."""
  b, t = ids.shape
  n = cache.ids.shape[1]
  pos = cache.index[:, None] + jnp.arange(t, dtype=jnp.int32)  # [b, t]
  new_ids = cache.ids.at[jnp.arange(b)[:, None], pos].set(ids.astype(jnp.int32))
  length = cache.index + t
  mask = (jnp.arange(n)[None, :] < length[:, None]).astype(jnp.int32)
  logits = logits_fn(params, new_ids, mask)  # [b, n, V]
  out = jnp.take_along_axis(logits, pos[..., None], axis=1)  # [b, t, V]
  return out, PrefixCache(ids=new_ids, index=length)


def _at_layer(fn, layer, params, ids, mask):
  return fn(params, ids, mask, layer)


def _hidden_at(fn, layer, params, ids, mask):
  return fn(params, ids, mask)[layer]


# -------------------------------------------------------------------- Model
@dataclasses.dataclass(frozen=True)
class Model:
  """A language model as pure functions plus static facts; no arrays.

  Implements :class:`LanguageModel`. Build one with :func:`from_functions`,
  :func:`from_flax` or :func:`leakjax.models.load` (which hands the params
  back beside it). Equal models (same functions, same facts) compare and
  hash equal, so a model is a valid `static_argnames` entry of `jax.jit`.

  Attributes:
    vocab_size, hidden_size, num_layers, max_length, tie_word_embeddings,
    paths, tokenizer: see :class:`LanguageModel`.
    family: a label for reports and converters ('gpt2', 'llama',
      'cifg_lstm', 'lstm', or 'custom'); attacks never branch on it.
    config: the family's frozen config dataclass, or None.
    logits_fn: `(params, ids, mask) -> [b, t, V]`.
    decode_fn, init_cache_fn: `(params, cache, ids) -> (logits, cache)` and
      `(params, batch_size, max_length) -> cache`, or None (then decoding
      recomputes the prefix with `logits_fn`).
    hidden_fn: `(params, ids, mask) -> [layers + 1, b, t, d]`, or None.
    head_fn: `(params, hidden [..., d]) -> [..., V]` (final norm + head).
    train_logits_fn: `(params, ids, mask, key)`, logits with dropout.
    first_layer_fn: `params -> FirstLayerInputs`, or None.
    block_input_fn: `(params, ids, mask, layer) -> [b, t, d]`, what block
      `layer`'s attention projections read (its normalised input), computed
      through blocks `0 .. layer - 1` only; or None.
    block_cache_fn, block_decode_fn: `(params, batch_size, max_length,
      layer) -> cache` and `(params, cache, ids, layer) -> ([b, t, d],
      cache)`, the same incrementally (a cache of the first `layer` blocks
      only), both or neither; without them :meth:`block_decode` recomputes
      the prefix with `block_input_fn`.
    stream_cache_fn, stream_decode_fn: `(params, batch_size, max_length,
      layer) -> cache` and `(params, cache, ids, layer) -> ([b, t, d],
      cache)`: the hidden states `H^layer` (as :meth:`hidden_states`)
      computed incrementally through the first `layer` blocks only, both
      or neither; without them :meth:`stream_decode` recomputes the prefix
      with `hidden_fn`.
    stream_candidates_fn: `(params, cache, ids [c], layer) -> [c, d]`,
      :meth:`stream_candidates` without copying the one-row cache, or None
      (then the cache is broadcast to c rows and :meth:`stream_decode` run).
  """

  vocab_size: int
  logits_fn: Callable[..., jax.Array] = dataclasses.field(repr=False)
  paths: ParamPaths = dataclasses.field(repr=False)
  hidden_size: int | None = None
  num_layers: int | None = None
  max_length: int | None = None
  tie_word_embeddings: bool = False
  family: str = 'custom'
  config: Any = None
  decode_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  init_cache_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  hidden_fn: Callable[..., jax.Array] | None = dataclasses.field(
    default=None, repr=False
  )
  head_fn: Callable[..., jax.Array] | None = dataclasses.field(
    default=None, repr=False
  )
  train_logits_fn: Callable[..., jax.Array] | None = dataclasses.field(
    default=None, repr=False
  )
  first_layer_fn: Callable[..., FirstLayerInputs] | None = dataclasses.field(
    default=None, repr=False
  )
  block_input_fn: Callable[..., jax.Array] | None = dataclasses.field(
    default=None, repr=False
  )
  block_cache_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  block_decode_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  stream_cache_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  stream_decode_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  stream_candidates_fn: Callable[..., Any] | None = dataclasses.field(
    default=None, repr=False
  )
  tokenizer: Any = dataclasses.field(
    default=None, compare=False, hash=False, repr=False
  )

  def __post_init__(self):
    if (self.decode_fn is None) != (self.init_cache_fn is None):
      raise LeakjaxError(
        'decode and init_cache come together',
        'pass both, or neither (decoding then recomputes the prefix)',
      )
    if (self.block_decode_fn is None) != (self.block_cache_fn is None):
      raise LeakjaxError(
        'block_decode and block_cache come together',
        'pass both, or neither (block_decode then recomputes the prefix)',
      )
    if (self.stream_decode_fn is None) != (self.stream_cache_fn is None):
      raise LeakjaxError(
        'stream_decode and stream_cache come together',
        'pass both, or neither (stream_decode then recomputes the prefix)',
      )
    if self.stream_candidates_fn is not None and self.stream_cache_fn is None:
      raise LeakjaxError(
        'stream_candidates needs stream_decode and stream_cache',
        'pass them as well',
      )
    if self.block_decode_fn is not None and self.block_input_fn is None:
      raise LeakjaxError(
        'block_decode needs block_inputs', 'pass block_inputs= as well'
      )
    if not isinstance(self.vocab_size, int) or self.vocab_size <= 0:
      raise LeakjaxError(
        f'vocab_size must be a positive int, got {self.vocab_size!r}'
      )

  # ---------------------------------------------------------------- compute
  def logits(self, params, ids, mask=None) -> Float[Array, 'b t V']:
    """Next-token logits, float32 `[batch, time, vocab]`.

    Concrete `ids` (outside `jax.jit`) must lie in `[0, vocab_size)`: an
    id outside it would index past the embedding table and give NaN or
    garbage logits silently. Traced ids are not checked.
    """
    _check_concrete_ids(ids, self.vocab_size)
    return self.logits_fn(params, ids, mask)

  def token_log_probs(
    self, params, ids, mask=None
  ) -> Float[Array, 'b t_minus_1']:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, `[batch, time - 1]`."""
    logp = jax.nn.log_softmax(self.logits(params, ids, mask)[:, :-1], axis=-1)
    return jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]

  def loss(self, params, ids, mask=None) -> jax.Array:
    """Mean next-token cross-entropy over real (mask=1) target positions."""
    return lm_loss(self.logits(params, ids, mask), ids, mask)

  def train_logits(self, params, ids, mask=None, *, key) -> jax.Array:
    """Logits with the model's training-time dropout (== `logits` if none)."""
    if self.train_logits_fn is None:
      return self.logits(params, ids, mask)
    return self.train_logits_fn(params, ids, mask, key)

  def init_cache(self, params, batch_size: int, max_length: int) -> PyTree:
    """An empty decoding cache; every leaf has leading axis `batch_size`."""
    if self.init_cache_fn is None:
      return _prefix_init_cache(params, batch_size, max_length)
    return self.init_cache_fn(params, batch_size, max_length)

  def decode(self, params, cache, ids) -> tuple[Float[Array, 'b t V'], PyTree]:
    """Appends `ids [batch, t]` at each row's position in `cache`.

    Returns `(logits [batch, t, vocab], new_cache)`; decoding a whole
    sequence equals :meth:`logits` on it.
    """
    _check_concrete_ids(ids, self.vocab_size)
    if self.decode_fn is None:
      return _prefix_decode(self.logits_fn, params, cache, ids)
    return self.decode_fn(params, cache, ids)

  def hidden_states(self, params, ids, mask=None) -> jax.Array:
    """All hidden states `[layers + 1, batch, time, hidden_size]`.

    Index 0 is the embedding output (GPT-2: with position embeddings),
    index i the output of block i, without the final norm.
    """
    if self.hidden_fn is None:
      raise LeakjaxError(
        'this model declares no hidden_states function',
        'pass hidden_states= to from_functions or'
        ' hidden_states_method= to from_flax',
      )
    _check_concrete_ids(ids, self.vocab_size)
    return self.hidden_fn(params, ids, mask)

  def lm_head(self, params, hidden) -> jax.Array:
    """Final norm (if any) + LM head: `[..., dim] -> [..., vocab]`."""
    if self.head_fn is None:
      raise LeakjaxError(
        'this model declares no lm_head function',
        'pass lm_head= to from_functions or lm_head_method= to from_flax',
      )
    return self.head_fn(params, hidden)

  def first_layer_inputs(self, params) -> FirstLayerInputs | None:
    """What block 0's attention reads per token (see :class:`FirstLayerInputs`)."""
    if self.first_layer_fn is None:
      return None
    return self.first_layer_fn(params)

  def block_inputs(self, params, ids, mask=None, *, layer: int) -> jax.Array:
    """What block `layer`'s attention projections read, `[b, t, d]`.

    The normalised input of block `layer` (its attention norm applied to
    the output of blocks `0 .. layer - 1`), the rows whose span the
    gradient of that block's q/k/v kernels is (DAGER's layer-`layer + 1`
    span test). Only the first `layer` blocks are computed.
    """
    if self.block_input_fn is None:
      raise LeakjaxError(
        'this model declares no block_inputs function',
        'pass block_inputs= (a function, or in from_flax a method name) to'
        ' from_functions / from_flax',
      )
    return self.block_input_fn(params, ids, mask, layer)

  def init_block_cache(
    self, params, batch_size: int, max_length: int, *, layer: int
  ) -> PyTree:
    """An empty cache for :meth:`block_decode` (batch-leading leaves)."""
    if self.block_cache_fn is None:
      return _prefix_init_cache(params, batch_size, max_length)
    return self.block_cache_fn(params, batch_size, max_length, layer)

  def block_decode(
    self, params, cache, ids, *, layer: int
  ) -> tuple[Float[Array, 'b t d'], PyTree]:
    """Appends `ids [b, t]`: `(block_inputs at those positions, cache)`.

    Decoding a whole sequence equals :meth:`block_inputs` on it.
    """
    if self.block_decode_fn is None:
      fn = self.block_input_fn
      if fn is None:
        self.block_inputs(params, ids, layer=layer)  # raises
      return _prefix_decode(Bound(_at_layer, (fn, layer)), params, cache, ids)
    return self.block_decode_fn(params, cache, ids, layer)

  def init_stream_cache(
    self, params, batch_size: int, max_length: int, *, layer: int
  ) -> PyTree:
    """An empty cache for :meth:`stream_decode` (batch-leading leaves)."""
    if self.stream_cache_fn is None:
      return _prefix_init_cache(params, batch_size, max_length)
    return self.stream_cache_fn(params, batch_size, max_length, layer)

  def stream_decode(
    self, params, cache, ids, *, layer: int
  ) -> tuple[Float[Array, 'b t d'], PyTree]:
    """Appends `ids [b, t]`: `(H^layer at those positions, cache)`.

    `layer` in `[0, num_layers]`, as an index of :meth:`hidden_states`
    (no final norm); only the first `layer` blocks run. Decoding a whole
    sequence equals `hidden_states(params, ids)[layer]`.
    """
    if self.stream_decode_fn is None:
      if self.hidden_fn is None:
        self.hidden_states(params, ids)  # raises
      fn = Bound(_hidden_at, (self.hidden_fn, layer))
      return _prefix_decode(fn, params, cache, ids)
    return self.stream_decode_fn(params, cache, ids, layer)

  def stream_candidates(
    self, params, cache, ids: Int[Array, ' c'], *, layer: int
  ) -> Float[Array, 'c d']:
    """`H^layer` of each of `ids [c]` put at the next position of the
    one-row stream `cache` (alternatives: each attends to the cached
    prefix and itself, never to another); the cache is not changed.

    Equals `stream_decode` of every id on its own copy of the cache.
    """
    if self.stream_candidates_fn is not None:
      return self.stream_candidates_fn(params, cache, ids, layer)
    c = ids.shape[0]
    rows = jax.tree.map(
      lambda x: jnp.broadcast_to(x, (c,) + x.shape[1:]), cache
    )
    states, _ = self.stream_decode(params, rows, ids[:, None], layer=layer)
    return states[:, 0]

  # ----------------------------------------------------------- parameters
  def attention_input_kernels(self, tree, block: int) -> jax.Array | None:
    """Block `block`'s declared attention-input kernels as one `[dim, out]`.

    `tree` is the params or a params-shaped gradient. Each kernel declared
    at `paths.attention_inputs[block]` is reshaped to `[dim, -1]` (Flax's
    `[dim, heads, head_dim]` to `[dim, heads * head_dim]`), a fused one's
    q/k/v slices put in q, k, v order, and the kernels laid side by side
    along axis 1: the one layout the span tests read (reshaping keeps the
    column space, all they use). None when the block declares none.
    """
    paths = self.paths.attention_inputs
    if len(paths) <= block or not paths[block]:
      return None
    mats = []
    for i, path in enumerate(paths[block]):
      kernel = get_path(tree, path)
      dim = kernel.shape[0]
      parts = self.paths.parts(block, i)
      if parts:  # [dim, n * out] or [dim, n, ...] -> q | k | v
        kernel = kernel.reshape(dim, len(parts), -1)
        kernel = kernel[
          :, [parts.index(p) for p in sorted(parts, key='qkv'.index)]
        ]
      mats.append(kernel.reshape(dim, -1))
    return jnp.concatenate(mats, axis=1)

  def word_embeddings(self, params) -> jax.Array:
    """The input embedding matrix `[vocab, dim]`."""
    return get_path(params, self.paths.word_embeddings)

  def replace(self, **changes) -> Model:
    """A copy with some fields replaced."""
    return dataclasses.replace(self, **changes)


__all__ = [
  'Bound',
  'FirstLayerInputs',
  'LanguageModel',
  'Model',
  'ParamPaths',
  'PrefixCache',
  'get_path',
  'lm_loss',
  'num_params',
  'require_family',
  'set_path',
]
