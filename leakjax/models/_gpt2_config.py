"""GPT-2 hyperparameters: :class:`GPT2Config` and its HF `config.json` form."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from leakjax.errors import LeakjaxError

# transformers' ACT2FN names -> jax functions. 'gelu_new', 'gelu_fast' and
# 'gelu_pytorch_tanh' are all the tanh approximation of GELU.
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  'gelu_new': functools.partial(jax.nn.gelu, approximate=True),
  'gelu_fast': functools.partial(jax.nn.gelu, approximate=True),
  'gelu_pytorch_tanh': functools.partial(jax.nn.gelu, approximate=True),
  'gelu': functools.partial(jax.nn.gelu, approximate=False),
  'quick_gelu': lambda x: x * jax.nn.sigmoid(1.702 * x),
  'relu': jax.nn.relu,
  'silu': jax.nn.silu,
  'swish': jax.nn.silu,
  'tanh': jnp.tanh,
}
_DTYPES = ('float32', 'bfloat16', 'float16')
# GPT-2's BPE has 50257 ids; its <|endoftext|> is the last one.
_GPT2_VOCAB_SIZE = 50257
# HF config aliases (GPT2Config.attribute_map) -> our field names.
_HF_ALIASES = {
  'hidden_size': 'n_embd',
  'max_position_embeddings': 'n_positions',
  'num_attention_heads': 'n_head',
  'num_hidden_layers': 'n_layer',
}


@dataclasses.dataclass(frozen=True)
class GPT2Config:
  """GPT-2 hyperparameters, named as in transformers' `GPT2Config`.

  Attributes:
    vocab_size: rows of the word embedding (and of the LM head).
    n_positions: context length (rows of the position embedding).
    n_embd: model width.
    n_layer: number of transformer blocks.
    n_head: attention heads; must divide `n_embd`.
    n_inner: MLP width; None means `4 * n_embd`.
    activation_function: a transformers activation name, e.g. 'gelu_new'.
    layer_norm_epsilon: LayerNorm epsilon.
    initializer_range: std of the normal init of weights and embeddings.
    scale_attn_weights: divide attention scores by sqrt(head_dim).
    scale_attn_by_inverse_layer_idx: also divide them by (layer index + 1).
    tie_word_embeddings: the LM head is the transposed word embedding.
    bos_token_id: written to config.json for transformers.
    eos_token_id: written to config.json for transformers.
    dtype: name of the parameter and activation dtype ('float32',
      'bfloat16' or 'float16'); attention softmax, LayerNorm statistics and
      the returned logits are always float32.
  """

  vocab_size: int = _GPT2_VOCAB_SIZE
  n_positions: int = 1024
  n_embd: int = 768
  n_layer: int = 12
  n_head: int = 12
  n_inner: int | None = None
  activation_function: str = 'gelu_new'
  layer_norm_epsilon: float = 1e-5
  initializer_range: float = 0.02
  scale_attn_weights: bool = True
  scale_attn_by_inverse_layer_idx: bool = False
  tie_word_embeddings: bool = True
  bos_token_id: int | None = _GPT2_VOCAB_SIZE - 1
  eos_token_id: int | None = _GPT2_VOCAB_SIZE - 1
  dtype: str = 'float32'

  def __post_init__(self):
    for name in ('vocab_size', 'n_positions', 'n_embd', 'n_layer', 'n_head'):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise LeakjaxError(
          f'GPT-2 config: {name}={getattr(self, name)!r} must be a positive'
          ' integer',
          'fix config.json',
        )
    if self.n_embd % self.n_head:
      raise LeakjaxError(
        f'GPT-2 config: n_embd={self.n_embd} is not divisible by'
        f' n_head={self.n_head}',
        'fix config.json',
      )
    if self.activation_function not in _ACTIVATIONS:
      raise LeakjaxError(
        f'GPT-2 config: activation_function={self.activation_function!r}'
        ' is not supported',
        'use one of ' + ', '.join(sorted(_ACTIVATIONS)),
      )
    if self.dtype not in _DTYPES:
      raise LeakjaxError(
        f'GPT-2 config: dtype={self.dtype!r} is not supported',
        'use one of ' + ', '.join(_DTYPES),
      )

  # Properties every leakjax config has (see base.Model).
  @property
  def hidden_size(self) -> int:
    return self.n_embd

  @property
  def num_layers(self) -> int:
    return self.n_layer

  @property
  def max_length(self) -> int:
    return self.n_positions

  @property
  def head_dim(self) -> int:
    return self.n_embd // self.n_head

  @property
  def inner_size(self) -> int:
    return self.n_inner if self.n_inner is not None else 4 * self.n_embd

  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  # Presets.
  @classmethod
  def small(cls, **overrides) -> GPT2Config:
    """OpenAI's GPT-2 small (124M parameters)."""
    return cls(**overrides)

  @classmethod
  def medium(cls, **overrides) -> GPT2Config:
    """OpenAI's GPT-2 medium (355M parameters)."""
    return cls(**{'n_embd': 1024, 'n_layer': 24, 'n_head': 16, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> GPT2Config:
    """A 2-layer, 64-wide model for tests and quick experiments."""
    defaults = dict(
      vocab_size=512,
      n_positions=64,
      n_embd=64,
      n_layer=2,
      n_head=4,
      bos_token_id=None,
      eos_token_id=None,
    )
    return cls(**{**defaults, **overrides})

  # HF config.json <-> GPT2Config.
  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> GPT2Config:
    """Reads the fields we use from a transformers `config.json` dict.

    Unknown keys (dropout rates, summary_* heads, ...) are ignored; features
    we do not implement (cross-attention) raise LeakjaxError.
    """
    d = dict(d)
    for alias, name in _HF_ALIASES.items():
      if alias in d and name not in d:
        d[name] = d[alias]
    if d.get('add_cross_attention'):
      raise LeakjaxError(
        'GPT-2 config has add_cross_attention=true, which'
        ' leakjax does not implement',
        'use a decoder-only GPT-2 checkpoint',
      )
    fields = {f.name for f in dataclasses.fields(cls)} - {'dtype'}
    return cls(**{k: v for k, v in d.items() if k in fields})

  def to_hf_dict(self) -> dict[str, Any]:
    """A transformers `config.json` dict for `GPT2LMHeadModel`.

    Dropout rates are 0 because this model has no dropout; `dtype` is
    float32 because :func:`to_hf_directory` writes float32 tensors.
    """
    return {
      'model_type': 'gpt2',
      'architectures': ['GPT2LMHeadModel'],
      'vocab_size': self.vocab_size,
      'n_positions': self.n_positions,
      'n_embd': self.n_embd,
      'n_layer': self.n_layer,
      'n_head': self.n_head,
      'n_inner': self.n_inner,
      'activation_function': self.activation_function,
      'layer_norm_epsilon': self.layer_norm_epsilon,
      'initializer_range': self.initializer_range,
      'scale_attn_weights': self.scale_attn_weights,
      'scale_attn_by_inverse_layer_idx': self.scale_attn_by_inverse_layer_idx,
      'reorder_and_upcast_attn': False,
      'add_cross_attention': False,
      'tie_word_embeddings': self.tie_word_embeddings,
      'bos_token_id': self.bos_token_id,
      'eos_token_id': self.eos_token_id,
      'resid_pdrop': 0.0,
      'embd_pdrop': 0.0,
      'attn_pdrop': 0.0,
      'use_cache': True,
      'dtype': 'float32',
    }
