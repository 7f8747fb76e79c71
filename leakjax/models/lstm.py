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

import jax
import jax.numpy as jnp

from leakjax import io as io_lib
from leakjax._jit import jitted
from leakjax.errors import LeakjaxError
from leakjax.models import hf_checkpoint
from leakjax.models._lstm_config import (
  CIFGConfig,
  LSTMConfig,
  LSTMFamilyConfig,
)
from leakjax.models._lstm_layers import (
  LSTMCache,
  LSTMLanguageModel,
  LSTMState,
  lstm_cell,
  lstm_layer,
  zero_state,
)
from leakjax.models.protocol import Bound, Model, ParamPaths, PyTree
from leakjax.tokenization import WordTokenizer

MODEL_TYPES = {'cifg_lstm': 'leakjax_cifg_lstm', 'lstm': 'leakjax_lstm'}
WORDS_FILE = 'words.json'


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
  params = jitted(_init_params, static_argnums=(0, 1))(config, dtype, key)
  return make_model(config, tokenizer, dtype=dtype), params


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
