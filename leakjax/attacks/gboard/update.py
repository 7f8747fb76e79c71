"""Reading a client's update: the output bias, the tied output rows, θ1.

Part of :mod:`leakjax.attacks.gboard` (the package docstring has the
method). The server holds θ0 and θ1; everything the word rules read is the
change of the output bias (`b1 - b0`, Algorithm 2's d) and of the output
matrix as rows per word. Also: θ snapshots on disk, the FedSGD scaling of
Sec. 4.3.2 and the client of Sec. 4.1 / 6.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from leakjax import fl
from leakjax import io as io_lib
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, PyTree, get_path


def _require_bias(model: Model) -> None:
  if model.paths.output_bias is None:
    raise LeakjaxError(
      'this model declares no output bias to read words from'
      f' (model.paths.output_bias is None; family {model.family})',
      'use a CIFG-LSTM / LSTM model (leakjax.models.lstm)',
    )


def bias_update(
  model: Model, params0: PyTree, params1: PyTree
) -> Float[Array, ' V']:
  """`b1 - b0`, the output-bias change, float32 `[vocab]` (Algorithm 2's d).

  Args:
    model: a model with an output bias (`model.paths.output_bias`).
    params0: the global parameters θ0.
    params1: the client's parameters θ1 (or θ0 + a transmitted update).

  Returns:
    float32 `[vocab]`; positive entries are the candidate typed words.
  """
  _require_bias(model)
  path = model.paths.output_bias
  return get_path(params1, path).astype(jnp.float32) - get_path(
    params0, path
  ).astype(jnp.float32)


def output_rows(model: Model, params: PyTree) -> Float[Array, 'V D']:
  """The output matrix as rows per word, float32 `[vocab, D]`.

  The tied matrix is the word embedding; an untied head (`[D, vocab]`) is
  transposed so that row k always belongs to word k.
  """
  if model.paths.lm_head is None:
    return get_path(params, model.paths.word_embeddings).astype(jnp.float32)
  return get_path(params, model.paths.lm_head).astype(jnp.float32).T


def output_bias(model: Model, params: PyTree) -> Float[Array, ' V']:
  """The output bias, float32 `[vocab]`."""
  _require_bias(model)
  return get_path(params, model.paths.output_bias).astype(jnp.float32)


def output_rows_update(
  model: Model, params0: PyTree, params1: PyTree
) -> Float[Array, 'V D']:
  """`W1 - W0` of the output matrix as rows per word, float32 `[vocab, D]`."""
  return output_rows(model, params1) - output_rows(model, params0)


def save_snapshot(path: str | os.PathLike, params: PyTree) -> None:
  """Writes a params pytree (θ0, θ1) to a safetensors file, atomically.

  :func:`leakjax.io.save_pytree`: each leaf under its key path, dtypes
  kept; :func:`load_snapshot` reads it back into the structure of a
  template.
  """
  io_lib.save_pytree(path, params)


def load_snapshot(path: str | os.PathLike, like: PyTree) -> PyTree:
  """Reads a :func:`save_snapshot` file into the tree structure of `like`.

  Args:
    path: the safetensors file.
    like: a params pytree of the same structure, shapes and dtypes (e.g.
      θ0).

  Returns:
    The params pytree, leaves as jax arrays.

  Raises:
    LeakjaxError: the file cannot be read or holds other params.
  """
  return io_lib.load_pytree(path, like, what=f'snapshot {path}')


def scale_update(params0: PyTree, params1: PyTree, scale: float) -> PyTree:
  """`θ1 + s (θ1 − θ0)` (Sec. 4.3.2): for FedSGD a step of `η (1 + s)`."""
  return jax.tree.map(lambda a, b: b + scale * (b - a), params0, params1)


def client_config(
  epochs: int,
  batch_size: int | None,
  *,
  learning_rate: float = 1e-3,
  words_per_sentence: int = 1,
  step_noise: float = 0.0,
  update_noise: float = 0.0,
) -> fl.ClientConfig:
  """The client of Sec. 4.1 / 6 as a :class:`leakjax.fl.ClientConfig`.

  :func:`leakjax.fl.client_update` minimises the mean cross-entropy over
  all target words of a batch. Sec. 3.1 writes the loss of a text as the
  *sum* over its words, `J_{1:T} = Σ_t J_t` (and Table 1's update
  `η (p - 1)` per word of a one-sentence batch is that sum's step). For
  sentences of exactly `T = words_per_sentence` targets, the sum per
  sentence averaged over the batch is `T` times the token mean, so SGD with
  `η T` on the token mean is that loss with `η`; Algorithm 3's noise
  `η N(0, σ)` then needs `σ / T` on the gradient. `words_per_sentence=1`
  is the plain token mean.

  Args:
    epochs: E.
    batch_size: B sentences; None is the whole dataset.
    learning_rate: η (Sec. 4.1: 0.001).
    words_per_sentence: T, see above.
    step_noise: σ of Algorithm 3 ("DPSGD-like": θ ← θ − η∇ℓ + η N(0, σ)).
    update_noise: σ of Algorithm 4 ("single noise": θ1 + N(0, σ)).

  Returns:
    A ClientConfig with plain SGD.
  """
  if words_per_sentence < 1:
    raise LeakjaxError(
      f'words_per_sentence must be >= 1, got {words_per_sentence}'
    )
  defense = fl.Defense(
    step_noise_std=step_noise / words_per_sentence,
    update_noise_std=update_noise,
  )
  return fl.ClientConfig(
    epochs=epochs,
    batch_size=batch_size,
    learning_rate=learning_rate * words_per_sentence,
    defense=defense,
  )


__all__ = [
  'bias_update',
  'client_config',
  'load_snapshot',
  'output_bias',
  'output_rows',
  'output_rows_update',
  'save_snapshot',
  'scale_update',
]
