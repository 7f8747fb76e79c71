"""The one model interface that every leakjax attack uses.

A :class:`Model` bundles a Flax linen module, its parameters, its tokenizer
and its config. Every model family (GPT-2, Llama, CIFG-LSTM, word-level LSTM)
returns the same object from :func:`leakjax.models.load`, so attacks never
ask which family they got. All compute methods are pure functions of
`params` (passed explicitly), so callers may `jax.jit`, `jax.grad` and
`jax.vmap` them:

>>> logits = jax.jit(model.logits)(model.params, ids)          # doctest: +SKIP
>>> grads = jax.grad(lambda p: model.loss(p, ids, mask))(model.params)  # doctest: +SKIP

Shapes: `ids` is int32 `[batch, time]`; `mask` is `[batch, time]` with 1 for
real tokens and 0 for padding (right padding). Padding positions never
influence real positions.

Incremental decoding (beam search, greedy generation) uses a cache pytree
whose every leaf has the batch as its leading axis, so that reordering beams
is `jax.tree.map(lambda x: x[idx], cache)`:

>>> cache = model.init_cache(batch_size=8, max_length=40)      # doctest: +SKIP
>>> logits, cache = model.decode(model.params, ids[:, :3], cache)  # doctest: +SKIP
>>> logits, cache = model.decode(model.params, ids[:, 3:4], cache)  # doctest: +SKIP

`decode` on the whole sequence equals `logits` (tested for every family).
Rows may sit at different positions (`index` is per row): prefill prompts of
different lengths separately and select rows. Writing past `max_length` is
caught eagerly; under `jit` it is the caller's job to size the cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from leakjax.errors import LeakjaxError

PyTree = Any
ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ParamPaths:
  """Where attacks find the parameters that leak.

  Each is a path of dict keys into `Model.params`, or None when the family
  has no such parameter.

  Attributes:
    word_embeddings: the input token embedding matrix, `[vocab, dim]`.
    position_embeddings: learned position embeddings `[max_len, dim]` (GPT-2).
    lm_head: the untied output projection, always laid out `[dim, vocab]`
      (a Dense kernel); None when tied to `word_embeddings`.
    output_bias: the output bias `[vocab]` of the LSTM families (CIFG and
      word-level), None for the transformers (they have none).
  """

  word_embeddings: ParamPath
  position_embeddings: ParamPath | None = None
  lm_head: ParamPath | None = None
  output_bias: ParamPath | None = None


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


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A language model as pure functions plus its weights and tokenizer.

  Attributes:
    family: 'gpt2', 'llama', 'cifg_lstm' or 'lstm'.
    config: the family's frozen config dataclass. Every config has
      `vocab_size`, `hidden_size` (width of `hidden_states`), `num_layers`,
      `max_length` (context length, None for LSTMs) and `tie_word_embeddings`.
    module: the Flax linen module (`module.apply({'params': p}, ...)`).
    params: the parameters, the contents of `variables['params']`.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer`, or None.
    paths: where the leaking parameters sit, see :class:`ParamPaths`.
  """

  family: str
  config: Any
  module: Any
  params: PyTree
  tokenizer: Any
  paths: ParamPaths
  # Family-specific pure functions; use the methods below instead.
  _logits_fn: Callable[..., jax.Array] = dataclasses.field(repr=False)
  _hidden_fn: Callable[..., jax.Array] = dataclasses.field(repr=False)
  _head_fn: Callable[..., jax.Array] = dataclasses.field(repr=False)
  _init_cache_fn: Callable[..., PyTree] = dataclasses.field(repr=False)
  _decode_fn: Callable[..., tuple[jax.Array, PyTree]] = dataclasses.field(
    repr=False
  )
  # Optional: logits with dropout for training, (params, ids, mask, key).
  _train_logits_fn: Callable[..., jax.Array] | None = dataclasses.field(
    default=None, repr=False
  )

  # ---------------------------------------------------------------- compute
  def logits(self, params, ids, mask=None) -> jax.Array:
    """Next-token logits, float32 `[batch, time, vocab]`."""
    return self._logits_fn(params, ids, mask)

  def hidden_states(self, params, ids, mask=None) -> jax.Array:
    """All hidden states `[layers + 1, batch, time, hidden_size]`.

    Index 0 is the embedding output (for GPT-2 including position
    embeddings), index i the output of block i, without the final norm.
    """
    return self._hidden_fn(params, ids, mask)

  def lm_head(self, params, hidden) -> jax.Array:
    """Final norm (if any) + LM head: `[..., dim] -> [..., vocab]`."""
    return self._head_fn(params, hidden)

  def init_cache(self, batch_size: int, max_length: int) -> PyTree:
    """An empty decoding cache; every leaf has leading axis `batch_size`."""
    return self._init_cache_fn(batch_size, max_length)

  def decode(self, params, ids, cache) -> tuple[jax.Array, PyTree]:
    """Appends `ids [batch, t]` to the cache; returns logits `[batch, t, vocab]`."""
    return self._decode_fn(params, ids, cache)

  def train_logits(self, params, ids, mask=None, *, key) -> jax.Array:
    """Logits with the family's training-time dropout (== `logits` if none)."""
    if self._train_logits_fn is None:
      return self.logits(params, ids, mask)
    return self._train_logits_fn(params, ids, mask, key)

  def loss(self, params, ids, mask=None) -> jax.Array:
    """Mean next-token cross-entropy over real (mask=1) target positions."""
    return lm_loss(self.logits(params, ids, mask), ids, mask)

  def token_log_probs(self, params, ids, mask=None) -> jax.Array:
    """log p(ids[:, t] | ids[:, :t]) for t >= 1, `[batch, time - 1]`."""
    logp = jax.nn.log_softmax(self.logits(params, ids, mask)[:, :-1], axis=-1)
    return jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]

  # ----------------------------------------------------------- parameters
  def word_embeddings(self, params) -> jax.Array:
    """The input embedding matrix `[vocab, dim]`."""
    return get_path(params, self.paths.word_embeddings)

  def replace(self, **changes) -> Model:
    """A copy with some fields replaced (e.g. `params=new_params`)."""
    return dataclasses.replace(self, **changes)

  @property
  def num_params(self) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(self.params))

  def __repr__(self) -> str:
    return (
      f'Model(family={self.family!r}, params={self.num_params:,},'
      f' config={self.config})'
    )


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
  """Raises LeakjaxError if `model.family` is not one of `families`."""
  if model.family not in families:
    raise LeakjaxError(
      f'this needs a {" or ".join(families)} model, got {model.family}',
      'load a model of a supported family',
    )
