"""GPT-2 (Radford et al. 2019) as a Flax linen module, with HF checkpoint I/O.

The module reproduces transformers' `GPT2LMHeadModel` numerically (fp32
logits; tests/gpt2_test.py compares them): learned position embeddings,
pre-norm blocks, a final `ln_f` and an LM head tied to the word embeddings
(or an untied `lm_head`).
Our GPT-2 has no dropout, also when it is trained.

>>> model, params = init_model(GPT2Config.tiny(), key=jax.random.key(0))
>>> model.logits(params, jnp.zeros((2, 5), jnp.int32)).shape
(2, 5, 512)

Parameter tree (`h_0` ... `h_{n_layer-1}` are the blocks; Dense kernels are
`[in, out]`, exactly the layout of HF's `Conv1D` weights)::

  wte/embedding [vocab, dim]      wpe/embedding [n_positions, dim]
  h_i/ln_1/{scale,bias}           h_i/attn/c_attn/{kernel,bias} [dim, 3*dim]
  h_i/attn/c_proj/{kernel,bias}   h_i/ln_2/{scale,bias}
  h_i/mlp/c_fc/{kernel,bias}      h_i/mlp/c_proj/{kernel,bias}
  ln_f/{scale,bias}               lm_head/kernel [dim, vocab] (untied only)

Inputs are right-padded: `mask` `[batch, time]` is 1 for real tokens, and
real tokens sit at positions 0 .. length-1, as in transformers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from leakjax.errors import LeakjaxError, check_length
from leakjax.io import as_path, atomic_write_text
from leakjax.models import hf_checkpoint
from leakjax.models._gpt2_config import _GPT2_VOCAB_SIZE, GPT2Config
from leakjax.models._gpt2_layers import (
  Block,
  GPT2LMHeadModel,
  KVCache,
  init_cache,
)
from leakjax.models._shared_prefix import one_row
from leakjax.models.hf_checkpoint import TensorSpec
from leakjax.models.protocol import (
  Bound,
  FirstLayerInputs,
  Model,
  ParamPaths,
  PyTree,
)
from leakjax.tokenization import (
  Tokenizer,
  check_vocab,
  gpt2_tokenizer,
  tokenizer_from_file,
)

# HF buffers that hold the causal mask, not weights (older transformers).
_IGNORED_HF_TENSORS = (r'transformer\.h\.\d+\.attn\.(masked_)?bias',)


def _check_ids(ids, mask, config: GPT2Config, what: str = 'the input') -> None:
  """Static-shape checks; shapes are concrete even under jit."""
  if len(ids.shape) != 2:
    raise LeakjaxError(
      f'{what} ids have shape {tuple(ids.shape)}, expected [batch, time]',
      'add a batch axis',
    )
  if mask is not None and tuple(mask.shape) != tuple(ids.shape):
    raise LeakjaxError(
      f'mask shape {tuple(mask.shape)} differs from ids shape'
      f' {tuple(ids.shape)}',
      'pass the mask of these ids',
    )
  check_length(ids.shape[1], config.n_positions, what)


def _gpt2_logits(config: GPT2Config, params, ids, mask=None):
  _check_ids(ids, mask, config)
  return GPT2LMHeadModel(config).apply({'params': params}, ids, mask)


def _gpt2_hidden(config: GPT2Config, params, ids, mask=None):
  _check_ids(ids, mask, config)
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, mask, method=GPT2LMHeadModel.hidden_states
  )


def _gpt2_head(config: GPT2Config, params, hidden):
  return GPT2LMHeadModel(config).apply(
    {'params': params}, hidden, method=GPT2LMHeadModel.head
  )


def _gpt2_init_cache(config: GPT2Config, params, batch_size, max_length):
  del params
  return init_cache(config, batch_size, max_length)


def _gpt2_decode(config: GPT2Config, params, cache, ids):
  _check_ids(ids, None, config, 'the decoded chunk')
  check_length(ids.shape[1], cache.max_length, 'the decoded chunk')
  if not isinstance(cache.index, jax.core.Tracer):
    check_length(
      int(np.max(np.asarray(cache.index))) + ids.shape[1],
      cache.max_length,
      'the decoding cache after this step',
    )
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, cache, method=GPT2LMHeadModel.decode
  )


def _layer_norm_fn(x, ln, eps):
  """`_layer_norm` (flax LayerNorm) as a function of its params."""
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), -1, keepdims=True)
  y = (x32 - mean) * lax.rsqrt(var + eps)
  return (y * ln['scale'] + ln['bias']).astype(ln['scale'].dtype)


def _check_block(config: GPT2Config, layer: int):
  if not 0 <= layer < config.n_layer:
    raise LeakjaxError(
      f'block {layer} does not exist; the model has {config.n_layer} blocks',
      f'pass 0 <= layer < {config.n_layer}',
    )


def _gpt2_block_inputs(config: GPT2Config, params, ids, mask, layer):
  _check_ids(ids, mask, config)
  _check_block(config, layer)
  stream = GPT2LMHeadModel(config).apply(
    {'params': params},
    ids,
    mask,
    layer,
    method=GPT2LMHeadModel.hidden_states,
  )[-1]
  ln = params[f'h_{layer}']['ln_1']
  return _layer_norm_fn(stream, ln, config.layer_norm_epsilon)


def _check_stream(config: GPT2Config, layer: int):
  if not 0 <= layer <= config.n_layer:
    raise LeakjaxError(
      f'hidden state {layer} does not exist; the model has'
      f' {config.n_layer} blocks',
      f'pass 0 <= layer <= {config.n_layer}',
    )


def _gpt2_stream_cache(
  config: GPT2Config, params, batch_size, max_length, layer
):
  del params
  _check_stream(config, layer)
  full = init_cache(config, batch_size, max_length)
  return KVCache(
    keys=full.keys[:layer], values=full.values[:layer], index=full.index
  )


def _check_stream_cache(config: GPT2Config, cache, layer: int):
  _check_stream(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this stream cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_stream_cache(..., layer=layer)',
    )


def _gpt2_stream_decode(config: GPT2Config, params, cache, ids, layer):
  _check_ids(ids, None, config, 'the decoded chunk')
  _check_stream_cache(config, cache, layer)
  if layer == 0:  # no block runs: token + position embeddings
    positions = cache.index[:, None] + jnp.arange(ids.shape[1])[None]
    x = params['wte']['embedding'][ids] + params['wpe']['embedding'][positions]
    return x, cache.replace(index=cache.index + ids.shape[1])
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, cache, method=GPT2LMHeadModel.decode_stream
  )


def _gpt2_stream_candidates(config: GPT2Config, params, cache, ids, layer):
  _check_ids(ids[:, None], None, config, 'the candidates')
  _check_stream_cache(config, cache, layer)
  one_row(cache.index)
  return GPT2LMHeadModel(config).apply(
    {'params': params}, ids, cache, method=GPT2LMHeadModel.stream_candidates
  )


def _gpt2_block_cache(
  config: GPT2Config, params, batch_size, max_length, layer
):
  _check_block(config, layer)
  return _gpt2_stream_cache(config, params, batch_size, max_length, layer)


def _gpt2_block_decode(config: GPT2Config, params, cache, ids, layer):
  _check_block(config, layer)
  if len(cache.keys) != layer:
    raise LeakjaxError(
      f'this block cache holds {len(cache.keys)} blocks, not {layer}',
      'make it with init_block_cache(..., layer=layer)',
    )
  x, new = _gpt2_stream_decode(config, params, cache, ids, layer)
  ln = params[f'h_{layer}']['ln_1']
  return _layer_norm_fn(x, ln, config.layer_norm_epsilon), new


def _gpt2_first_layer(config: GPT2Config, params) -> FirstLayerInputs:
  ln = params['h_0']['ln_1']
  return FirstLayerInputs(
    tokens=params['wte']['embedding'],
    positions=params['wpe']['embedding'],
    scale=ln['scale'],
    bias=ln['bias'],
    eps=config.layer_norm_epsilon,
    kind='layer',
  )


def make_model(config: GPT2Config, tokenizer=None) -> Model:
  """GPT-2 of `config` as a :class:`leakjax.models.Model` (no weights).

  `decode(params, cache, ids)` appends `ids [batch, t]` at each row's
  `cache.index` (positions index .. index+t-1) with causal attention over the
  cache and returns `(logits [batch, t, vocab], new_cache)`. It assumes the
  rows have no padding: prefill a batch with prompts of one length (or
  prefill rows separately and concatenate their caches, which may then sit
  at different indices). Writing past the cache's `max_length` raises
  LeakjaxError when the index is concrete; under jit it is not checked.

  `train_logits` equals `logits`: our GPT-2 has no dropout.

  Args:
    config: the model's config.
    tokenizer: a :class:`leakjax.tokenization.Tokenizer` or None.

  Returns:
    A Model with family 'gpt2'; equal configs give equal models.
  """
  check_vocab(tokenizer, config.vocab_size)
  paths = ParamPaths(
    word_embeddings=('wte', 'embedding'),
    position_embeddings=('wpe', 'embedding'),
    lm_head=None if config.tie_word_embeddings else ('lm_head', 'kernel'),
    attention_inputs=tuple(
      ((f'h_{i}', 'attn', 'c_attn', 'kernel'),)
      for i in range(min(4, config.n_layer))
    ),
    last_layers=((f'h_{config.n_layer - 1}',), ('ln_f',)),
  )
  return Model(
    vocab_size=config.vocab_size,
    hidden_size=config.hidden_size,
    num_layers=config.num_layers,
    max_length=config.n_positions,
    tie_word_embeddings=config.tie_word_embeddings,
    family='gpt2',
    config=config,
    tokenizer=tokenizer,
    paths=paths,
    logits_fn=Bound(_gpt2_logits, (config,)),
    hidden_fn=Bound(_gpt2_hidden, (config,)),
    head_fn=Bound(_gpt2_head, (config,)),
    init_cache_fn=Bound(_gpt2_init_cache, (config,)),
    decode_fn=Bound(_gpt2_decode, (config,)),
    first_layer_fn=Bound(_gpt2_first_layer, (config,)),
    block_input_fn=Bound(_gpt2_block_inputs, (config,)),
    block_cache_fn=Bound(_gpt2_block_cache, (config,)),
    block_decode_fn=Bound(_gpt2_block_decode, (config,)),
    stream_cache_fn=Bound(_gpt2_stream_cache, (config,)),
    stream_decode_fn=Bound(_gpt2_stream_decode, (config,)),
    stream_candidates_fn=Bound(_gpt2_stream_candidates, (config,)),
  )


def _init_params(config: GPT2Config, key):
  module = GPT2LMHeadModel(config)
  return module.init(key, jnp.zeros((1, 1), jnp.int32))['params']


def init_model(
  config: GPT2Config, *, key, tokenizer=None, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """A randomly initialized GPT-2 with transformers' initialization.

  Weights and embeddings are normal(initializer_range), biases 0, LayerNorm
  scales 1, and the residual projections (`c_proj`) normal(initializer_range
  / sqrt(2 * n_layer)) (GPT-2 Sec. 2.3).

  Args:
    config: the architecture; its `dtype` is replaced by `dtype`.
    key: a `jax.random.key`.
    tokenizer: attached to the model (must fit in `config.vocab_size`).
    dtype: parameter and activation dtype.

  Returns:
    `(model, params)`, the model with family 'gpt2'.
  """
  config = dataclasses.replace(config, dtype=jnp.dtype(dtype).name)
  params = jax.jit(functools.partial(_init_params, config))(key)
  return make_model(config, tokenizer), params


# -------------------------------------------------------- HF checkpoints
def hf_name_map(config: GPT2Config) -> dict[str, TensorSpec]:
  """transformers `GPT2LMHeadModel` tensor name -> where it goes in params.

  Names carry the `transformer.` prefix; `lm_head.weight` ([vocab, dim]) is
  only listed when the head is untied. HF's `Conv1D` weights are already
  `[in, out]`, so only `lm_head` is transposed.
  """
  specs = {
    'transformer.wte.weight': TensorSpec(('wte', 'embedding')),
    'transformer.wpe.weight': TensorSpec(('wpe', 'embedding')),
    'transformer.ln_f.weight': TensorSpec(('ln_f', 'scale')),
    'transformer.ln_f.bias': TensorSpec(('ln_f', 'bias')),
  }
  per_layer = {
    'ln_1.weight': ('ln_1', 'scale'),
    'ln_1.bias': ('ln_1', 'bias'),
    'attn.c_attn.weight': ('attn', 'c_attn', 'kernel'),
    'attn.c_attn.bias': ('attn', 'c_attn', 'bias'),
    'attn.c_proj.weight': ('attn', 'c_proj', 'kernel'),
    'attn.c_proj.bias': ('attn', 'c_proj', 'bias'),
    'ln_2.weight': ('ln_2', 'scale'),
    'ln_2.bias': ('ln_2', 'bias'),
    'mlp.c_fc.weight': ('mlp', 'c_fc', 'kernel'),
    'mlp.c_fc.bias': ('mlp', 'c_fc', 'bias'),
    'mlp.c_proj.weight': ('mlp', 'c_proj', 'kernel'),
    'mlp.c_proj.bias': ('mlp', 'c_proj', 'bias'),
  }
  for i in range(config.n_layer):
    for hf_name, path in per_layer.items():
      specs[f'transformer.h.{i}.{hf_name}'] = TensorSpec((f'h_{i}', *path))
  if not config.tie_word_embeddings:
    specs['lm_head.weight'] = TensorSpec(
      ('lm_head', 'kernel'), **hf_checkpoint.transpose()
    )
  return specs


def _canonical_tensors(
  tensors: Mapping[str, np.ndarray], config: GPT2Config, source: str
) -> dict[str, np.ndarray]:
  """Adds the `transformer.` prefix (GPT2Model checkpoints lack it) and drops
  a tied `lm_head.weight` after checking it equals `wte`."""
  out: dict[str, np.ndarray] = {}
  for name, value in tensors.items():
    canonical = (
      name
      if name.startswith(('transformer.', 'lm_head.'))
      else f'transformer.{name}'
    )
    if canonical in out:
      raise LeakjaxError(
        f'{source} holds {canonical} twice (with and without the'
        ' transformer. prefix)',
        'the checkpoint is corrupt; re-export it',
      )
    out[canonical] = value
  if config.tie_word_embeddings and 'lm_head.weight' in out:
    head = out.pop('lm_head.weight')
    wte = out.get('transformer.wte.weight')
    if wte is not None and not np.array_equal(head, wte):
      raise LeakjaxError(
        f'{source}: lm_head.weight differs from wte.weight although'
        ' config.json has tie_word_embeddings=true',
        'set "tie_word_embeddings": false in config.json',
      )
  return out


def _directory_tokenizer(
  directory: Path, config: GPT2Config
) -> Tokenizer | None:
  """The checkpoint's tokenizer: tokenizer.json, else vocab.json +
  merges.txt, else OpenAI's GPT-2 BPE if the model has room for its 50257
  ids, else None (e.g. a tiny random model)."""
  if (directory / 'tokenizer.json').is_file():
    tokenizer = tokenizer_from_file(directory / 'tokenizer.json')
  elif all((directory / f).is_file() for f in ('vocab.json', 'merges.txt')):
    tokenizer = gpt2_tokenizer(directory)
  elif config.vocab_size >= _GPT2_VOCAB_SIZE:
    tokenizer = gpt2_tokenizer()
  else:
    return None
  check_vocab(tokenizer, config.vocab_size, what=f'model in {directory}')
  return tokenizer


def from_hf_directory(
  path: str | os.PathLike, config_dict: Mapping[str, Any], *, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """Loads a transformers GPT-2 checkpoint directory.

  Reads `model.safetensors`, its shards, or `pytorch_model.bin` (only with
  `torch.load(weights_only=True)`). Tensor names may carry the
  `transformer.` prefix (GPT2LMHeadModel) or not (GPT2Model); attention-mask
  buffers are ignored; a tied `lm_head.weight` must equal `wte`. Every shape
  is checked against the config, and missing, unused or non-finite tensors
  raise LeakjaxError.

  Args:
    path: the checkpoint directory.
    config_dict: its parsed config.json.
    dtype: parameter and activation dtype.

  Returns:
    `(model, params)`: a Model with family 'gpt2' and the directory's
    tokenizer (see `_directory_tokenizer`).
  """
  path = Path(path)
  config = dataclasses.replace(
    GPT2Config.from_hf_dict(config_dict), dtype=jnp.dtype(dtype).name
  )
  # The tokenizer check is cheap: do it before reading the weights.
  tokenizer = _directory_tokenizer(path, config)
  source = str(path)
  tensors = _canonical_tensors(hf_checkpoint.read_tensors(path), config, source)
  abstract = jax.eval_shape(
    functools.partial(_init_params, config), jax.random.key(0)
  )
  params = hf_checkpoint.params_from_hf(
    tensors,
    hf_name_map(config),
    abstract,
    ignore=_IGNORED_HF_TENSORS,
    source=source,
    dtype=config.jnp_dtype,
  )
  params = jax.tree.map(jnp.asarray, params)
  return make_model(config, tokenizer), params


def to_hf_directory(
  model: Model, params: PyTree, directory: str | os.PathLike
) -> None:
  """Writes `model` as a transformers `GPT2LMHeadModel` directory.

  Writes `params` as config.json, model.safetensors (float32; a tied head is not
  stored, as transformers does) and, if the model has a subword tokenizer,
  tokenizer.json + tokenizer_config.json. The directory loads with
  `GPT2LMHeadModel.from_pretrained` (and `AutoTokenizer.from_pretrained`)
  and with `leakjax.models.load`.
  """
  if model.family != 'gpt2':
    raise LeakjaxError(
      f'to_hf_directory needs a gpt2 model, got {model.family}',
      'use leakjax.models.save',
    )
  config: GPT2Config = model.config
  directory = as_path(directory)
  tensors = hf_checkpoint.params_to_hf(params, hf_name_map(config))
  hf_checkpoint.write_checkpoint(directory, tensors, config.to_hf_dict())
  tokenizer = model.tokenizer
  if tokenizer is None:
    return
  if not hasattr(tokenizer, 'backend'):
    raise LeakjaxError(
      f'cannot save a {type(tokenizer).__name__} with a GPT-2 model',
      'attach a subword Tokenizer or None',
    )
  atomic_write_text(directory / 'tokenizer.json', tokenizer.backend.to_str())
  special = {}
  for key in ('bos', 'eos', 'unk', 'pad'):
    i = getattr(tokenizer, f'{key}_id', None)
    if i is not None:
      special[f'{key}_token'] = tokenizer.id_to_token(i)
  # PreTrainedTokenizerFast loads tokenizer.json as it is; without a class,
  # transformers would pick GPT2Tokenizer, which assumes GPT-2's BPE.
  tokenizer_config = {
    **special,
    'model_max_length': config.n_positions,
    'tokenizer_class': 'PreTrainedTokenizerFast',
  }
  atomic_write_text(
    directory / 'tokenizer_config.json',
    json.dumps(tokenizer_config, indent=2, sort_keys=True),
  )


__all__ = [
  'Block',
  'GPT2Config',
  'GPT2LMHeadModel',
  'KVCache',
  'init_cache',
  'init_model',
  'make_model',
  'hf_name_map',
  'from_hf_directory',
  'to_hf_directory',
]
