"""Llama-architecture decoder (Llama 2/3.x, SmolLM2, Qwen2/2.5, Mistral without windows).

Pre-norm blocks of grouped-query attention with rotary position embeddings
(Hugging Face's `rotate_half` layout) and a SwiGLU MLP, RMSNorm everywhere,
and a tied or untied LM head. Numerics follow transformers'
`LlamaForCausalLM` (tests/llama_test.py compares the fp32 logits).

>>> config = LlamaConfig(vocab_size=200, hidden_size=64,
...                      intermediate_size=128, num_hidden_layers=2,
...                      num_attention_heads=4, num_key_value_heads=2)
>>> model, params = init_model(config, key=jax.random.key(0))
>>> model.logits(params, jnp.zeros((1, 5), jnp.int32)).shape
(1, 5, 200)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from leakjax.errors import LeakjaxError, check_length, check_token_ids
from leakjax.models import hf_checkpoint
from leakjax.models._llama_config import LlamaConfig
from leakjax.models._llama_layers import Llama, LlamaCache, _norm
from leakjax.models._shared_prefix import one_row
from leakjax.models.hf_checkpoint import TensorSpec
from leakjax.models.protocol import (
  Bound,
  FirstLayerInputs,
  Model,
  ParamPaths,
  PyTree,
  require_family,
)
from leakjax.models.rope import rope_inv_freq

FAMILY = 'llama'


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_ids(config: LlamaConfig, ids, what='input'):
  check_length(ids.shape[-1], config.max_position_embeddings, f'the {what}')
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)


def _llama_logits(config: LlamaConfig, dtype, params, ids, mask=None):
  _check_ids(config, ids)
  return Llama(config, dtype=dtype).apply({'params': params}, ids, mask)


def _llama_hidden(config: LlamaConfig, dtype, params, ids, mask=None):
  _check_ids(config, ids)
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, mask, method=Llama.hidden_states
  )


def _llama_head(config: LlamaConfig, dtype, params, hidden):
  return Llama(config, dtype=dtype).apply(
    {'params': params}, hidden, method=Llama.head
  )


def _llama_init_cache(
  config: LlamaConfig, dtype, params, batch_size: int, max_length: int
) -> LlamaCache:
  del params
  check_length(max_length, config.max_position_embeddings, 'the decoding cache')
  shape = (
    batch_size,
    max_length,
    config.num_key_value_heads,
    config.head_dim,
  )
  empty = tuple(
    jnp.zeros(shape, dtype) for _ in range(config.num_hidden_layers)
  )
  return LlamaCache(
    keys=empty, values=empty, index=jnp.zeros((batch_size,), jnp.int32)
  )


def _llama_decode(config: LlamaConfig, dtype, params, cache: LlamaCache, ids):
  max_len = cache.keys[0].shape[1]
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)
  # Under jit the index is unknown; writes past the end are then clamped.
  start = (
    int(np.max(np.asarray(cache.index))) if _is_concrete(cache.index) else 0
  )
  if start + ids.shape[1] > max_len:
    raise LeakjaxError(
      f'the decoding cache holds {max_len} tokens; appending'
      f' {ids.shape[1]} at position {start} overflows it',
      'make a longer cache with init_cache(params, batch_size, max_length)',
    )
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, cache, method=Llama.decode
  )


def _check_block(config: LlamaConfig, layer: int):
  if not 0 <= layer < config.num_hidden_layers:
    raise LeakjaxError(
      f'block {layer} does not exist; the model has'
      f' {config.num_hidden_layers} blocks',
      f'pass 0 <= layer < {config.num_hidden_layers}',
    )


def _llama_block_inputs(config: LlamaConfig, dtype, params, ids, mask, layer):
  _check_ids(config, ids)
  _check_block(config, layer)
  stream = Llama(config, dtype=dtype).apply(
    {'params': params}, ids, mask, layer, method=Llama.hidden_states
  )[-1]
  scale = params[f'layers_{layer}']['attn_norm']['scale']
  return _norm(config, stream, scale)


def _check_stream(config: LlamaConfig, layer: int):
  if not 0 <= layer <= config.num_hidden_layers:
    raise LeakjaxError(
      f'hidden state {layer} does not exist; the model has'
      f' {config.num_hidden_layers} blocks',
      f'pass 0 <= layer <= {config.num_hidden_layers}',
    )


def _llama_stream_cache(
  config: LlamaConfig, dtype, params, batch_size, max_length, layer
):
  _check_stream(config, layer)
  full = _llama_init_cache(config, dtype, params, batch_size, max_length)
  return LlamaCache(
    keys=full.keys[:layer], values=full.values[:layer], index=full.index
  )


def _check_stream_cache(config: LlamaConfig, cache, layer: int):
  _check_stream(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this stream cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_stream_cache(..., layer=layer)',
    )


def _llama_stream_decode(config: LlamaConfig, dtype, params, cache, ids, layer):
  _check_stream_cache(config, cache, layer)
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)
  if layer == 0:  # no block runs: the embeddings
    x = Llama(config, dtype=dtype).apply(
      {'params': params}, ids, method=Llama.embed_ids
    )
    return x, cache.replace(index=cache.index + ids.shape[1])
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, cache, method=Llama.decode_stream
  )


def _llama_stream_candidates(
  config: LlamaConfig, dtype, params, cache, ids, layer
):
  _check_stream_cache(config, cache, layer)
  one_row(cache.index)
  if _is_concrete(ids):
    check_token_ids(ids, config.vocab_size)
  return Llama(config, dtype=dtype).apply(
    {'params': params}, ids, cache, method=Llama.stream_candidates
  )


def _llama_block_cache(
  config: LlamaConfig, dtype, params, batch_size, max_length, layer
):
  _check_block(config, layer)
  return _llama_stream_cache(
    config, dtype, params, batch_size, max_length, layer
  )


def _llama_block_decode(config: LlamaConfig, dtype, params, cache, ids, layer):
  _check_block(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this block cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_block_cache(..., layer=layer)',
    )
  x, new = _llama_stream_decode(config, dtype, params, cache, ids, layer)
  scale = params[f'layers_{layer}']['attn_norm']['scale']
  return _norm(config, x, scale), new


def _llama_first_layer(config: LlamaConfig, params) -> FirstLayerInputs:
  tokens = params['embed']['embedding']
  if config.embedding_scale:
    tokens = tokens * jnp.asarray(config.hidden_size**0.5, tokens.dtype)
  scale = params['layers_0']['attn_norm']['scale']
  if config.norm_offset:
    scale = config.norm_offset + scale.astype(jnp.float32)
  return FirstLayerInputs(
    tokens=tokens,
    positions=None,
    scale=scale,
    bias=None,
    eps=config.rms_norm_eps,
    kind='rms',
  )


def make_model(
  config: LlamaConfig, tokenizer=None, *, dtype=jnp.float32
) -> Model:
  """Llama of `config` as a :class:`Model` (no weights).

  Args:
    config: the architecture.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer` or None.
    dtype: the compute dtype, which must be the dtype of the params'
      embedding matrix; logits are float32.

  Returns:
    A Model with family 'llama'; equal configs and dtypes give equal models.
  """
  dtype = jnp.dtype(dtype)
  paths = ParamPaths(
    word_embeddings=('embed', 'embedding'),
    lm_head=None if config.tie_word_embeddings else ('lm_head', 'kernel'),
    attention_inputs=tuple(
      tuple(
        (f'layers_{i}', 'attn', n, 'kernel')
        for n in ('q_proj', 'k_proj', 'v_proj')
      )
      for i in range(min(4, config.num_hidden_layers))
    ),
    last_layers=((f'layers_{config.num_hidden_layers - 1}',), ('final_norm',)),
  )
  static = (config, dtype)
  return Model(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_layers=config.num_layers,
    max_length=config.max_position_embeddings,
    tie_word_embeddings=config.tie_word_embeddings,
    family=FAMILY,
    config=config,
    tokenizer=tokenizer,
    paths=paths,
    logits_fn=Bound(_llama_logits, static),
    hidden_fn=Bound(_llama_hidden, static),
    head_fn=Bound(_llama_head, static),
    init_cache_fn=Bound(_llama_init_cache, static),
    decode_fn=Bound(_llama_decode, static),
    first_layer_fn=Bound(_llama_first_layer, (config,)),
    block_input_fn=Bound(_llama_block_inputs, static),
    block_cache_fn=Bound(_llama_block_cache, static),
    block_decode_fn=Bound(_llama_block_decode, static),
    stream_cache_fn=Bound(_llama_stream_cache, static),
    stream_decode_fn=Bound(_llama_stream_decode, static),
    stream_candidates_fn=Bound(_llama_stream_candidates, static),
  )


def abstract_params(config: LlamaConfig, dtype=jnp.float32):
  """Shapes/dtypes of the params, via `jax.eval_shape` (no compute)."""
  module = Llama(config, dtype=dtype)
  ids = jnp.zeros((1, 1), jnp.int32)
  return jax.eval_shape(
    lambda k: module.init(k, ids)['params'], jax.random.key(0)
  )


def init_model(
  config: LlamaConfig, *, key, tokenizer=None, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """A randomly initialised model (normal(0.02) weights, unit norms).

  Returns:
    `(model, params)`.
  """
  module = Llama(config, dtype=dtype)
  # One compiled init instead of one eager op per parameter.
  init = jax.jit(lambda k: module.init(k, jnp.zeros((1, 1), jnp.int32)))
  return make_model(config, tokenizer, dtype=dtype), init(key)['params']


def from_params(config: LlamaConfig, params, tokenizer=None):
  """`(model, params)` for Llama weights of any dtype (the embedding's)."""
  params = jax.tree.map(jnp.asarray, params)
  dtype = params['embed']['embedding'].dtype
  return make_model(config, tokenizer, dtype=dtype), params


# ----------------------------------------------------------- HF weights
_BIASED = {
  'none': (),
  'qkv': ('q_proj', 'k_proj', 'v_proj'),
  'qkvo': ('q_proj', 'k_proj', 'v_proj', 'o_proj'),
}


def hf_name_map(config: LlamaConfig) -> dict[str, TensorSpec]:
  """HF tensor name -> our param path, one entry per parameter."""
  t = hf_checkpoint.transpose()
  specs = {
    'model.embed_tokens.weight': TensorSpec(('embed', 'embedding')),
    'model.norm.weight': TensorSpec(('final_norm', 'scale')),
  }
  for i in range(config.num_hidden_layers):
    hf, ours = f'model.layers.{i}', f'layers_{i}'
    specs[f'{hf}.input_layernorm.weight'] = TensorSpec(
      (ours, 'attn_norm', 'scale')
    )
    specs[f'{hf}.post_attention_layernorm.weight'] = TensorSpec(
      (ours, 'mlp_norm', 'scale')
    )
    for proj in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
      specs[f'{hf}.self_attn.{proj}.weight'] = TensorSpec(
        (ours, 'attn', proj, 'kernel'), **t
      )
      if proj in _BIASED[config.attention_bias]:
        specs[f'{hf}.self_attn.{proj}.bias'] = TensorSpec(
          (ours, 'attn', proj, 'bias')
        )
    for proj in ('gate_proj', 'up_proj', 'down_proj'):
      specs[f'{hf}.mlp.{proj}.weight'] = TensorSpec(
        (ours, 'mlp', proj, 'kernel'), **t
      )
  if not config.tie_word_embeddings:
    specs['lm_head.weight'] = TensorSpec(('lm_head', 'kernel'), **t)
  return specs


# Buffers some exports include and we recompute.
_IGNORED_HF = (
  r'model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq',
  r'model\.rotary_emb\.inv_freq',
)


def params_from_hf_tensors(
  tensors: Mapping[str, np.ndarray],
  config: LlamaConfig,
  *,
  dtype=jnp.float32,
  source: str = 'checkpoint',
):
  """HF-named tensors -> our params, checking names and shapes."""
  ignore = list(_IGNORED_HF)
  if config.tie_word_embeddings:
    ignore.append(r'lm_head\.weight')  # a copy of the embeddings, if saved
  return hf_checkpoint.params_from_hf(
    tensors,
    hf_name_map(config),
    abstract_params(config),
    ignore=ignore,
    source=source,
    dtype=dtype,
  )


def from_hf_directory(
  path: str | os.PathLike, config_dict: Mapping[str, Any], *, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """Loads an HF Llama checkpoint directory (+ `tokenizer.json` if present).

  Args:
    path: folder with `config.json` and `model.safetensors` (or shards).
    config_dict: the parsed `config.json`.
    dtype: parameter dtype.

  Returns:
    `(model, params)`, the model of family 'llama'.
  """
  from leakjax import tokenization  # pylint: disable=g-import-not-at-top

  path = Path(path)
  config = LlamaConfig.from_hf_dict(config_dict)
  params = params_from_hf_tensors(
    hf_checkpoint.read_tensors(path), config, dtype=dtype, source=str(path)
  )
  tokenizer = None
  if (path / 'tokenizer.json').is_file():
    tokenizer = tokenization.tokenizer_from_file(path / 'tokenizer.json')
    if tokenizer.bos_id is None:
      tokenizer.bos_id = config.bos_token_id
    if tokenizer.eos_id is None:
      tokenizer.eos_id = config.eos_token_id
    tokenization.check_vocab(tokenizer, config.vocab_size, str(path))
  return from_params(config, params, tokenizer)


def to_hf_directory(
  model: Model, params: PyTree, directory: str | os.PathLike
) -> None:
  """Writes `model` with `params` so that transformers' `LlamaForCausalLM` loads it.

  Writes `config.json`, `model.safetensors` and, when the model has a
  subword tokenizer, `tokenizer.json` + `tokenizer_config.json`.
  """
  from leakjax.io import as_path, atomic_write_text  # pylint: disable=g-import-not-at-top

  require_family(model, FAMILY)
  directory = as_path(directory)
  config: LlamaConfig = model.config
  tensors = hf_checkpoint.params_to_hf(params, hf_name_map(config))
  hf_config = config.to_hf_dict()
  tok = model.tokenizer
  backend = getattr(tok, 'backend', None)
  if tok is not None and getattr(tok, 'pad_id', None) is not None:
    hf_config['pad_token_id'] = tok.pad_id
  hf_checkpoint.write_checkpoint(directory, tensors, hf_config)
  if backend is None:
    return
  atomic_write_text(directory / 'tokenizer.json', backend.to_str())
  special = {}
  for key in ('bos', 'eos', 'pad', 'unk'):
    i = getattr(tok, f'{key}_id', None)
    if i is not None:
      special[f'{key}_token'] = tok.id_to_token(i)
  atomic_write_text(
    directory / 'tokenizer_config.json',
    json.dumps(
      {
        'tokenizer_class': 'PreTrainedTokenizerFast',
        'model_max_length': config.max_position_embeddings,
        **special,
      },
      indent=2,
    ),
  )


__all__ = [
  'LlamaConfig',
  'LlamaCache',
  'Llama',
  'init_model',
  'make_model',
  'from_params',
  'hf_name_map',
  'from_hf_directory',
  'to_hf_directory',
  'params_from_hf_tensors',
  'abstract_params',
  'rope_inv_freq',
]
