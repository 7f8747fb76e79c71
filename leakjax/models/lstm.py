"""Word-level LSTM language models: GBoard's CIFG-LSTM and a standard LSTM.

Both families share one recurrent layer (:func:`lstm_layer`, a `lax.scan`
over time) with two switches: a coupled input-forget gate (CIFG) and an
optional output projection `units -> proj_dim`.

* :class:`CIFGConfig` -- the GBoard next-word model (Suliman & Leith
  Sec. 2.3): V=9502 words, D=96 embeddings, one CIFG layer of 670 units
  without peepholes, projected 670 -> 96, logits `z = W h + b` with `W` the
  input embedding (tied) and an output bias `b`.
* :class:`LSTMConfig` -- the word-level LSTMs of the differential-score paper
  (Zanella-Beguelin et al. 2020, Sec. 4.1): :meth:`LSTMConfig.ptb_small`,
  :meth:`LSTMConfig.medium_512` and :meth:`LSTMConfig.wikitext_512`.

`Model.hidden_states` is `[layers + 1, batch, time, hidden_size]`: index 0
the embeddings (zero-padded on the right when `embed_dim < hidden_size`, as
in `medium_512`), index k the (projected) output `h_t` of layer k. The
GBoard cell state `C_t` (670 wide) is not part of it.

Parameters (the params pytree), with `G` gates (3 for CIFG, 4 for LSTM), `U`
units and `P` the layer output width (`proj_dim`, or `U` without
projection)::

  embed/embedding        [vocab, embed_dim]
  layer_{k}/kernel_x     [in_k, G*U]   gate columns [i|g|o] or [i|f|g|o]
  layer_{k}/kernel_h     [P, G*U]
  layer_{k}/bias         [G*U]
  layer_{k}/proj         [U, P]        only with a projection
  head/kernel            [P, vocab]    only when untied
  head/bias              [vocab]

Checkpoints are directories with `config.json` (`model_type`
'leakjax_cifg_lstm' or 'leakjax_lstm'), `model.safetensors` (PyTorch-style
`[out, in]` tensors, names from :func:`tensor_specs`) and `words.json`
(:class:`leakjax.tokenization.WordTokenizer`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from leakjax import io as io_lib
from leakjax.errors import LeakjaxError
from leakjax.models import hf_checkpoint
from leakjax.models.protocol import Bound, Model, ParamPaths, PyTree
from leakjax.tokenization import WordTokenizer

MODEL_TYPES = {'cifg_lstm': 'leakjax_cifg_lstm', 'lstm': 'leakjax_lstm'}
WORDS_FILE = 'words.json'


# ----------------------------------------------------------------- configs
@dataclasses.dataclass(frozen=True)
class CIFGConfig:
  """GBoard's CIFG-LSTM next-word model (Suliman & Leith Sec. 2.3).

  Attributes:
    vocab_size: words including `<UNK>` and `<S>` (V=9502).
    embed_dim: input embedding width (D=96).
    units: LSTM cell width, the size of the state `C_t` (670).
    proj_dim: width of the projected output `h_t` (96 = D, so that the
      output matrix can be the input embedding); None for no projection.
    num_layers: stacked CIFG layers (GBoard: 1).
    tie_word_embeddings: logits `W h + b` with `W` the input embedding.
  """

  vocab_size: int = 9502
  embed_dim: int = 96
  units: int = 670
  proj_dim: int | None = 96
  num_layers: int = 1
  tie_word_embeddings: bool = True

  family = 'cifg_lstm'
  cifg = True
  dropout_keep = 1.0

  def __post_init__(self):
    _validate(self, self.units, self.proj_dim)

  @classmethod
  def gboard(cls) -> CIFGConfig:
    """The extracted GBoard model's shape (Suliman & Leith Sec. 2.3)."""
    return cls()

  @property
  def output_dim(self) -> int:
    """Width of each layer's output (`proj_dim`, or `units`)."""
    return self.proj_dim or self.units

  @property
  def hidden_size(self) -> int:
    """Width of `Model.hidden_states` and of `lm_head`'s input."""
    return self.output_dim

  @property
  def max_length(self) -> None:
    return None  # a recurrence has no context limit


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
  """A word-level LSTM language model (standard LSTM cell, no projection).

  Attributes:
    vocab_size: words including `<UNK>` and `<S>`.
    embed_dim: input embedding width.
    hidden_size: LSTM cell and output width of every layer.
    num_layers: stacked LSTM layers.
    dropout_keep: keep probability of the dropout on every layer's input and
      on the last layer's output (the non-recurrent connections); used only
      by `Model.train_logits`. 1.0 means no dropout.
    tie_word_embeddings: use the input embedding as the softmax matrix; needs
      `embed_dim == hidden_size`.
  """

  vocab_size: int
  embed_dim: int
  hidden_size: int
  num_layers: int = 1
  dropout_keep: float = 1.0
  tie_word_embeddings: bool = False

  family = 'lstm'
  cifg = False
  proj_dim = None

  def __post_init__(self):
    _validate(self, self.hidden_size, None)
    if not 0.0 < self.dropout_keep <= 1.0:
      raise LeakjaxError(
        f'dropout_keep={self.dropout_keep} is not a probability in (0, 1]',
        'pass a keep probability such as 0.9',
      )

  @classmethod
  def ptb_small(cls, vocab_size: int = 10_000) -> LSTMConfig:
    """2 layers, 200-dim embeddings and states, no regularization.

    Zanella-Beguelin et al. Sec. 4.1 (Penn Treebank), the small configuration
    of Zaremba et al., whose softmax is not tied to the embedding.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=200,
      hidden_size=200,
      num_layers=2,
      dropout_keep=1.0,
      tie_word_embeddings=False,
    )

  @classmethod
  def medium_512(cls, vocab_size: int = 10_000) -> LSTMConfig:
    """1 layer, 512-dim states, 160-dim embeddings, dropout keep 0.9.

    Zanella-Beguelin et al. Sec. 4.1 (Reddit, model (1)). The paper names no
    projection layer, so the 512-dim LSTM output feeds an untied softmax
    `[512, vocab]` (with bias) directly; tying is impossible as 160 != 512.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=160,
      hidden_size=512,
      num_layers=1,
      dropout_keep=0.9,
      tie_word_embeddings=False,
    )

  @classmethod
  def wikitext_512(cls, vocab_size: int = 20_000) -> LSTMConfig:
    """2 layers, 512-dim states and embeddings, dropout keep 0.9.

    Zanella-Beguelin et al. Sec. 4.1 (Wikitext-103); untied as in the paper.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=512,
      hidden_size=512,
      num_layers=2,
      dropout_keep=0.9,
      tie_word_embeddings=False,
    )

  @property
  def units(self) -> int:
    return self.hidden_size

  @property
  def output_dim(self) -> int:
    return self.hidden_size

  @property
  def max_length(self) -> None:
    return None  # a recurrence has no context limit


LSTMFamilyConfig = CIFGConfig | LSTMConfig


def _validate(config, units: int, proj_dim: int | None) -> None:
  name = type(config).__name__
  sizes = dict(
    vocab_size=config.vocab_size,
    embed_dim=config.embed_dim,
    units=units,
    num_layers=config.num_layers,
  )
  if proj_dim is not None:
    sizes['proj_dim'] = proj_dim
  for field, value in sizes.items():
    if (
      not isinstance(value, (int, np.integer))
      or isinstance(value, bool)
      or value < 1
    ):
      raise LeakjaxError(f'{name}.{field}={value!r} must be a positive int')
  out = proj_dim or units
  if config.tie_word_embeddings and config.embed_dim != out:
    raise LeakjaxError(
      f'{name}: tied embeddings need embed_dim ({config.embed_dim}) equal'
      f' to the output width ({out})',
      'set tie_word_embeddings=False or make the widths equal',
    )


# ------------------------------------------------------------------ kernel
@struct.dataclass
class LSTMState:
  """The recurrent state of one layer (float32)."""

  c: jax.Array  # float32 [batch, units]: the cell state C_t
  h: jax.Array  # float32 [batch, out]: the (projected) output h_t


@struct.dataclass
class LSTMCache:
  """Decoding cache: every leaf has the batch as its leading axis."""

  layers: tuple[LSTMState, ...]  # one state per layer
  index: jax.Array  # int32 [batch]: tokens consumed so far


def num_gates(cifg: bool) -> int:
  return 3 if cifg else 4


def _step(weights, state: LSTMState, gates_x, *, cifg: bool):
  """One time step given `gates_x = x_t W_x + b`, float32 [batch, G*U]."""
  kernel_h = weights['kernel_h']
  gates = gates_x + jnp.dot(state.h.astype(kernel_h.dtype), kernel_h).astype(
    jnp.float32
  )
  if cifg:
    i, g, o = jnp.split(gates, 3, axis=-1)  # [B, 3U] -> 3 x [B, U]
    i = jax.nn.sigmoid(i)
    f = 1.0 - i  # the coupled input-forget gate
  else:
    i, f, g, o = jnp.split(gates, 4, axis=-1)  # [B, 4U] -> 4 x [B, U]
    i, f = jax.nn.sigmoid(i), jax.nn.sigmoid(f)
  c = f * state.c + i * jnp.tanh(g)
  m = jax.nn.sigmoid(o) * jnp.tanh(c)
  if 'proj' in weights:
    proj = weights['proj']
    h = jnp.dot(m.astype(proj.dtype), proj).astype(jnp.float32)
  else:
    h = m
  return LSTMState(c=c, h=h), h


def _input_gates(weights, x) -> jax.Array:
  kernel_x = weights['kernel_x']
  out = jnp.dot(x.astype(kernel_x.dtype), kernel_x) + weights['bias']
  return out.astype(jnp.float32)


def lstm_cell(weights, state: LSTMState, x, *, cifg: bool):
  """One step of the (CIFG-)LSTM; returns `(new_state, h_t)`.

  With `x_t` the input `[batch, in]`, `h_{t-1}` the previous (projected)
  output and `W_*x`, `W_*h`, `b_*` the column blocks of `kernel_x`,
  `kernel_h`, `bias`::

    i_t = sigmoid(x_t W_ix + h_{t-1} W_ih + b_i)
    f_t = 1 - i_t                                   (CIFG: coupled gate)
    f_t = sigmoid(x_t W_fx + h_{t-1} W_fh + b_f)    (standard LSTM)
    g_t = tanh(x_t W_gx + h_{t-1} W_gh + b_g)
    o_t = sigmoid(x_t W_ox + h_{t-1} W_oh + b_o)
    c_t = f_t * c_{t-1} + i_t * g_t
    m_t = o_t * tanh(c_t)
    h_t = m_t W_p     (with a projection, as in LSTMP; else h_t = m_t)

  No peepholes. Gate column order is `[i|g|o]` (CIFG) or `[i|f|g|o]`.
  Suliman & Leith Sec. 2.3 say the state is "linearly projected down to an
  output vector h_t" of size D; like the LSTMP cell (Sak et al. 2014) and
  TFLite's LSTM op we project `m_t` (not `c_t`) and feed the projected
  `h_t` back as the recurrent input. Matmuls run in the weights' dtype, the
  gates and state in float32.

  Args:
    weights: dict with `kernel_x [in, G*U]`, `kernel_h [P, G*U]`,
      `bias [G*U]` and optionally `proj [U, P]`.
    state: the previous :class:`LSTMState`.
    x: the input `[batch, in]`.
    cifg: coupled input-forget gate (3 gates) instead of 4 gates.

  Returns:
    `(state_t, h_t)` with `h_t` float32 `[batch, P]`.
  """
  return _step(weights, state, _input_gates(weights, x), cifg=cifg)


@functools.partial(jax.jit, static_argnames=('cifg',))
def lstm_layer(weights, xs, state: LSTMState, *, cifg: bool):
  """Runs :func:`lstm_cell` over time with `lax.scan`.

  Jitted so that eager callers (e.g. a Python decoding loop) compile the scan
  once per shape instead of on every call; inside a caller's `jit` it is
  inlined.

  Args:
    weights: as in :func:`lstm_cell`.
    xs: inputs `[batch, time, in]`.
    state: the state before the first step.
    cifg: coupled input-forget gate.

  Returns:
    `(hs, final_state)`: outputs float32 `[batch, time, P]` and the state.
  """
  # One big matmul for the input contributions of all steps; the scan body
  # then only does the recurrent [B, P] x [P, G*U] matmul.
  gates_x = _input_gates(weights, xs)  # [B, T, G*U]
  step = lambda s, g: _step(weights, s, g, cifg=cifg)
  state, hs = jax.lax.scan(step, state, jnp.swapaxes(gates_x, 0, 1))
  return jnp.swapaxes(hs, 0, 1), state  # [T, B, P] -> [B, T, P]


def zero_state(
  config: LSTMFamilyConfig, batch_size: int
) -> tuple[LSTMState, ...]:
  """All-zero states of every layer, float32."""
  return tuple(
    LSTMState(
      c=jnp.zeros((batch_size, config.units), jnp.float32),
      h=jnp.zeros((batch_size, config.output_dim), jnp.float32),
    )
    for _ in range(config.num_layers)
  )


# ------------------------------------------------------------------ module
class LSTMLayer(nn.Module):
  """One (CIFG-)LSTM layer's parameters around :func:`lstm_layer`."""

  in_features: int
  units: int
  proj_dim: int | None
  cifg: bool
  param_dtype: Any = jnp.float32

  def setup(self):
    gates = num_gates(self.cifg) * self.units
    out = self.proj_dim or self.units
    dense_init = nn.initializers.lecun_normal()
    bias_init = nn.initializers.zeros
    if not self.cifg:
      bias_init = _forget_bias_init(self.units)
    self.kernel_x = self.param(
      'kernel_x', dense_init, (self.in_features, gates), self.param_dtype
    )
    self.kernel_h = self.param(
      'kernel_h', dense_init, (out, gates), self.param_dtype
    )
    self.bias = self.param('bias', bias_init, (gates,), self.param_dtype)
    if self.proj_dim is not None:
      self.proj = self.param(
        'proj', dense_init, (self.units, self.proj_dim), self.param_dtype
      )

  def weights(self) -> dict[str, jax.Array]:
    """The parameters as :func:`lstm_cell` takes them."""
    w = {
      'kernel_x': self.kernel_x,
      'kernel_h': self.kernel_h,
      'bias': self.bias,
    }
    if self.proj_dim is not None:
      w['proj'] = self.proj
    return w

  def __call__(self, xs, state: LSTMState):
    return lstm_layer(self.weights(), xs, state, cifg=self.cifg)


def _forget_bias_init(units: int):
  """Zeros, with 1 on the forget gate (columns [U, 2U) of [i|f|g|o])."""

  def init(key, shape, dtype=jnp.float32):
    del key
    return jnp.zeros(shape, dtype).at[units : 2 * units].set(1.0)

  return init


class LSTMLanguageModel(nn.Module):
  """Embedding -> stacked (CIFG-)LSTM layers -> `W h + b` logits."""

  config: LSTMFamilyConfig
  param_dtype: Any = jnp.float32

  def setup(self):
    cfg = self.config
    self.embed = nn.Embed(
      cfg.vocab_size,
      cfg.embed_dim,
      param_dtype=self.param_dtype,
      dtype=self.param_dtype,
    )
    self.layers = [
      LSTMLayer(
        cfg.embed_dim if k == 0 else cfg.output_dim,
        cfg.units,
        cfg.proj_dim,
        cfg.cifg,
        param_dtype=self.param_dtype,
        name=f'layer_{k}',
      )
      for k in range(cfg.num_layers)
    ]
    self.head = OutputLayer(
      cfg.output_dim,
      cfg.vocab_size,
      cfg.tie_word_embeddings,
      param_dtype=self.param_dtype,
    )
    # Non-recurrent dropout (Zaremba et al.; Zanella-Beguelin Sec. 4.1:
    # "dropout on inputs and outputs").
    self.dropout = nn.Dropout(rate=1.0 - cfg.dropout_keep)

  def create_params(self) -> None:
    """Touches every parameter; `init(key, method=create_params)` builds
    them without running the recurrence."""
    _ = self.embed.embedding
    for layer in self.layers:
      layer.weights()
    self.head.kernel_or_none()

  def __call__(self, ids, mask=None, *, deterministic: bool = True):
    """Logits float32 `[batch, time, vocab]`; `mask` is not needed.

    The recurrence runs forward, so right-padding never reaches real
    positions and `mask` only exists for the common interface.
    """
    del mask
    hs, _ = self._run(
      ids, zero_state(self.config, ids.shape[0]), deterministic=deterministic
    )
    return self.lm_head(self.dropout(hs[-1], deterministic=deterministic))

  def hidden_states(self, ids, mask=None):
    """`[layers + 1, batch, time, hidden_size]`; index 0 = embeddings.

    An embedding narrower than `hidden_size` (e.g. 160 < 512 in
    `LSTMConfig.medium_512`) is zero-padded on the right, which keeps norms
    and inner products of the embeddings.
    """
    del mask
    hs, _ = self._run(
      ids, zero_state(self.config, ids.shape[0]), deterministic=True
    )
    width = self.config.hidden_size
    if hs[0].shape[-1] > width:
      raise LeakjaxError(
        f'hidden_states needs embed_dim ({hs[0].shape[-1]}) <= hidden_size'
        f' ({width}) for a {self.config.family} model',
        'read the embeddings from Model.word_embeddings instead',
      )
    pad = width - hs[0].shape[-1]
    hs[0] = jnp.pad(hs[0], ((0, 0), (0, 0), (0, pad)))
    return jnp.stack(hs)

  def lm_head(self, h):
    """`[..., P] -> [..., vocab]` float32 logits `h W + b`."""
    return self.head(h, self.embed.embedding)

  def decode(self, ids, cache: LSTMCache):
    """Continues the recurrence from `cache` over `ids [batch, t]`."""
    hs, states = self._run(ids, cache.layers, deterministic=True)
    cache = LSTMCache(layers=states, index=cache.index + ids.shape[1])
    return self.lm_head(hs[-1]), cache

  def _run(self, ids, states, *, deterministic: bool):
    """Returns per-layer outputs `[embeddings, h_1, ...]` and final states."""
    x = self.embed(ids).astype(jnp.float32)  # [B, T, E]
    hs, finals = [x], []
    for layer, state in zip(self.layers, states):
      x, state = layer(self.dropout(x, deterministic=deterministic), state)
      hs.append(x)
      finals.append(state)
    return hs, tuple(finals)


class OutputLayer(nn.Module):
  """`z = h W + b` with `W` the embedding (tied) or its own kernel."""

  in_features: int
  vocab_size: int
  tied: bool
  param_dtype: Any = jnp.float32

  def setup(self):
    self.bias = self.param(
      'bias', nn.initializers.zeros, (self.vocab_size,), self.param_dtype
    )
    if not self.tied:
      self.kernel = self.param(
        'kernel',
        nn.initializers.lecun_normal(),
        (self.in_features, self.vocab_size),
        self.param_dtype,
      )

  def kernel_or_none(self) -> jax.Array | None:
    return None if self.tied else self.kernel

  def __call__(self, h, embedding):
    kernel = embedding.T if self.tied else self.kernel  # [D, vocab]
    logits = jnp.dot(h.astype(kernel.dtype), kernel) + self.bias
    return logits.astype(jnp.float32)


# ------------------------------------------------------------------- model
def init_model(
  config: LSTMFamilyConfig,
  *,
  key: jax.Array,
  tokenizer: WordTokenizer | None = None,
  dtype=jnp.float32,
) -> tuple[Model, PyTree]:
  """A randomly initialized model (forget-gate bias 1 for standard LSTMs).

  Args:
    config: a :class:`CIFGConfig` or :class:`LSTMConfig`.
    key: PRNG key for the initialization.
    tokenizer: its word vocabulary, or None; its size must be
      `config.vocab_size`.
    dtype: parameter dtype.

  Returns:
    `(model, params)`, the model of family 'cifg_lstm' or 'lstm'.
  """
  params = _init_params(config, dtype, key)
  return make_model(config, tokenizer, dtype=dtype), params


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init_params(config: LSTMFamilyConfig, dtype, key):
  module = LSTMLanguageModel(config, param_dtype=dtype)
  return module.init(key, method=LSTMLanguageModel.create_params)['params']


def _lstm_apply(config, dtype, method, params, *args, **kwargs):
  module = LSTMLanguageModel(config, param_dtype=dtype)
  return module.apply({'params': params}, *args, method=method, **kwargs)


def _lstm_logits(config, dtype, params, ids, mask=None):
  return _lstm_apply(config, dtype, None, params, ids, mask)


def _lstm_train_logits(config, dtype, params, ids, mask, key):
  return _lstm_apply(
    config, dtype, None, params, ids, mask, deterministic=False,
    rngs={'dropout': key},
  )  # fmt: skip


def _lstm_hidden(config, dtype, params, ids, mask=None):
  return _lstm_apply(
    config, dtype, LSTMLanguageModel.hidden_states, params, ids, mask
  )


def _lstm_head(config, dtype, params, hidden):
  return _lstm_apply(config, dtype, LSTMLanguageModel.lm_head, params, hidden)


def _lstm_init_cache(config, params, batch_size, max_length=None):
  del params, max_length  # the state has a fixed size
  return LSTMCache(
    layers=zero_state(config, batch_size),
    index=jnp.zeros((batch_size,), jnp.int32),
  )


def _lstm_decode(config, dtype, params, cache, ids):
  return _lstm_apply(
    config, dtype, LSTMLanguageModel.decode, params, ids, cache
  )


def make_model(
  config: LSTMFamilyConfig,
  tokenizer: WordTokenizer | None = None,
  *,
  dtype=jnp.float32,
) -> Model:
  """`LSTMLanguageModel(config)` as a :class:`Model` (no weights)."""
  _check_tokenizer(tokenizer, config.vocab_size, 'model')
  dtype = jnp.dtype(dtype)
  static = (config, dtype)
  paths = ParamPaths(
    word_embeddings=('embed', 'embedding'),
    lm_head=None if config.tie_word_embeddings else ('head', 'kernel'),
    output_bias=('head', 'bias'),
  )
  return Model(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_layers=config.num_layers,
    max_length=None,
    tie_word_embeddings=config.tie_word_embeddings,
    family=config.family,
    config=config,
    tokenizer=tokenizer,
    paths=paths,
    logits_fn=Bound(_lstm_logits, static),
    hidden_fn=Bound(_lstm_hidden, static),
    head_fn=Bound(_lstm_head, static),
    init_cache_fn=Bound(_lstm_init_cache, (config,)),
    decode_fn=Bound(_lstm_decode, static),
    train_logits_fn=(
      Bound(_lstm_train_logits, static) if config.dropout_keep < 1.0 else None
    ),
  )


def _check_tokenizer(tokenizer, vocab_size: int, what: str) -> None:
  if tokenizer is not None and tokenizer.vocab_size != vocab_size:
    raise LeakjaxError(
      f'the word vocabulary has {tokenizer.vocab_size} words but the {what}'
      f' has vocab_size={vocab_size}',
      'use the words.json saved with this checkpoint',
    )


# ------------------------------------------------------------- checkpoints
def tensor_specs(
  config: LSTMFamilyConfig,
) -> dict[str, hf_checkpoint.TensorSpec]:
  """The name map: safetensors name -> params path (PyTorch `[out, in]`)."""
  spec, t = hf_checkpoint.TensorSpec, hf_checkpoint.transpose()
  specs = {'embedding.weight': spec(('embed', 'embedding'))}
  for k in range(config.num_layers):
    layer = f'layer_{k}'
    specs[f'lstm.weight_ih_l{k}'] = spec((layer, 'kernel_x'), **t)
    specs[f'lstm.weight_hh_l{k}'] = spec((layer, 'kernel_h'), **t)
    specs[f'lstm.bias_l{k}'] = spec((layer, 'bias'))
    if config.proj_dim is not None:
      specs[f'lstm.weight_hr_l{k}'] = spec((layer, 'proj'), **t)
  if not config.tie_word_embeddings:
    specs['output.weight'] = spec(('head', 'kernel'), **t)
  specs['output.bias'] = spec(('head', 'bias'))
  return specs


def config_to_dict(config: LSTMFamilyConfig) -> dict[str, Any]:
  """`config.json` contents: `model_type` plus the dataclass fields."""
  return {
    'model_type': MODEL_TYPES[config.family],
    **dataclasses.asdict(config),
  }


def config_from_dict(config_dict: Mapping[str, Any]) -> LSTMFamilyConfig:
  """Inverse of :func:`config_to_dict`, with one-line errors."""
  d = dict(config_dict)
  model_type = d.pop('model_type', None)
  classes = {
    MODEL_TYPES['cifg_lstm']: CIFGConfig,
    MODEL_TYPES['lstm']: LSTMConfig,
  }
  if model_type not in classes:
    raise LeakjaxError(
      f'model_type={model_type!r} is not a leakjax LSTM',
      f'use one of {sorted(classes)}',
    )
  cls = classes[model_type]
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise LeakjaxError(
      f'config.json of a {model_type} has unknown fields {unknown}',
      f'allowed fields: {sorted(names)}',
    )
  try:
    return cls(**d)
  except TypeError as e:  # a required field is missing
    raise LeakjaxError(f'config.json of a {model_type}: {e}') from None


def to_directory(
  model: Model, params: PyTree, directory: str | os.PathLike
) -> None:
  """Writes config.json, model.safetensors and words.json (if a tokenizer)."""
  if model.family not in MODEL_TYPES:
    raise LeakjaxError(f'lstm.to_directory got a {model.family} model')
  directory = io_lib.as_path(directory)
  if model.tokenizer is not None:
    if not isinstance(model.tokenizer, WordTokenizer):
      raise LeakjaxError(
        f'an LSTM model needs a WordTokenizer, got {model.tokenizer!r}'
      )
    _check_tokenizer(model.tokenizer, model.config.vocab_size, 'model')
  tensors = hf_checkpoint.params_to_hf(params, tensor_specs(model.config))
  hf_checkpoint.write_checkpoint(
    directory, tensors, config_to_dict(model.config)
  )
  if model.tokenizer is not None:
    model.tokenizer.save(directory / WORDS_FILE)


def from_directory(
  path: str | os.PathLike,
  config_dict: Mapping[str, Any] | None = None,
  *,
  dtype=jnp.float32,
) -> tuple[Model, PyTree]:
  """Loads a directory written by :func:`to_directory`.

  Args:
    path: the checkpoint directory.
    config_dict: its parsed config.json (read from `path` if None).
    dtype: parameter dtype.

  Returns:
    `(model, params)`; the tokenizer is None if there is no words.json.
  """
  path = Path(path)
  if config_dict is None:
    config_dict = hf_checkpoint.read_config(path)
  config = config_from_dict(config_dict)
  tokenizer = None
  if (path / WORDS_FILE).exists():
    tokenizer = WordTokenizer.load(path / WORDS_FILE)
    _check_tokenizer(
      tokenizer, config.vocab_size, f'checkpoint {path}/config.json'
    )
  abstract = jax.eval_shape(
    functools.partial(_init_params, config, dtype), jax.random.key(0)
  )
  params = hf_checkpoint.params_from_hf(
    hf_checkpoint.read_tensors(path),
    tensor_specs(config),
    abstract,
    source=f'{path}/model.safetensors',
    dtype=dtype,
  )
  params = jax.tree.map(jnp.asarray, params)
  return make_model(config, tokenizer, dtype=dtype), params


__all__ = [
  'CIFGConfig',
  'LSTMConfig',
  'LSTMState',
  'LSTMCache',
  'LSTMLanguageModel',
  'lstm_cell',
  'lstm_layer',
  'zero_state',
  'init_model',
  'make_model',
  'tensor_specs',
  'config_to_dict',
  'config_from_dict',
  'to_directory',
  'from_directory',
]
