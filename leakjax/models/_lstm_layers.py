"""The (CIFG-)LSTM kernel and the Flax modules of the LSTM language models.

:func:`lstm_cell` is one time step, :func:`lstm_layer` a `lax.scan` of it
over time; :class:`LSTMLanguageModel` stacks the layers between the
embedding and the output layer.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from leakjax.errors import LeakjaxError
from leakjax.models._lstm_config import LSTMFamilyConfig


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


def lstm_layer(weights, xs, state: LSTMState, *, cifg: bool):
  """Runs :func:`lstm_cell` over time with `lax.scan`.

  Pure: the caller jits the model that runs it (`cifg` static).

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
