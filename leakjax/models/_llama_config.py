"""Llama hyperparameters: :class:`LlamaConfig` and its HF `config.json` form."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from leakjax.errors import LeakjaxError

_HF_MODEL_TYPES = ('llama', 'mistral', 'qwen2', 'qwen2_no_bias', 'gemma')
HIDDEN_ACTS = ('silu', 'gelu_tanh', 'gelu')
# HF activation names -> ours.
_HF_ACTS = {
  'silu': 'silu',
  'swish': 'silu',
  'gelu_pytorch_tanh': 'gelu_tanh',
  'gelu_tanh': 'gelu_tanh',
  'gelu': 'gelu',
}
ATTENTION_BIASES = ('none', 'qkv', 'qkvo')
ROPE_TYPES = ('default', 'linear', 'llama3', 'factors')


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """Hyperparameters of a Llama-architecture model (HF field names).

  Attributes:
    vocab_size: rows of the embedding matrix.
    hidden_size: model width D.
    intermediate_size: width of the SwiGLU MLP.
    num_hidden_layers: number of transformer blocks.
    num_attention_heads: query heads H.
    num_key_value_heads: key/value heads (H for multi-head attention); must
      divide H.
    head_dim: per-head width; default `hidden_size // num_attention_heads`.
    rms_norm_eps: epsilon of every RMSNorm.
    rope_theta: RoPE base frequency.
    max_position_embeddings: context length (longest sequence accepted).
    tie_word_embeddings: whether the LM head is the embedding matrix.
    bos_token_id / eos_token_id: special ids, or None.
    attention_bias: which attention projections carry a bias: 'none'
      (Llama, SmolLM2, Mistral), 'qkv' (Qwen2 / Qwen2.5: q, k and v, not
      the output; Yang et al. 2024, arXiv 2407.10671, Sec. 2.2.1) or 'qkvo'
      (HF Llama's `attention_bias=true`).
    rope_type: 'default', 'linear' (positions divided by `rope_factor`),
      'llama3' (the frequency-dependent scaling of Llama 3.1; see
      :func:`rope_inv_freq`) or 'factors' (each frequency divided by its
      entry of `rope_freq_factors`: llama.cpp's `rope_freqs` tensor, how
      its GGUF files carry Llama 3.1's scaling).
    rope_factor, rope_low_freq_factor, rope_high_freq_factor,
      rope_original_max_position_embeddings: the scaling's parameters
      (HF `rope_scaling` / `rope_parameters` names without the prefix).
    rope_freq_factors: with rope_type 'factors', `head_dim // 2` positive
      divisors of the frequencies (a tuple, so that the config stays
      hashable).
    hidden_act: the gated MLP's activation: 'silu' (SwiGLU: Llama, Qwen2,
      Mistral), 'gelu_tanh' (GeGLU with tanh GELU: Gemma) or 'gelu'.
    norm_offset: every RMSNorm scales by `norm_offset + weight` (Gemma: 1,
      in float32 before casting back; Team Gemma 2024, arXiv 2403.08295,
      and HF's GemmaRMSNorm), else by the weight (0).
    embedding_scale: multiply the token embeddings by sqrt(hidden_size)
      (Gemma) before the first block; the tied head uses them unscaled.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int | None = None
  head_dim: int | None = None
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = False
  bos_token_id: int | None = 1
  eos_token_id: int | None = 2
  attention_bias: str = 'none'
  rope_type: str = 'default'
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position_embeddings: int | None = None
  rope_freq_factors: tuple[float, ...] | None = None
  hidden_act: str = 'silu'
  norm_offset: float = 0.0
  embedding_scale: bool = False

  def __post_init__(self):
    if self.hidden_act not in HIDDEN_ACTS:
      raise LeakjaxError(
        f'hidden_act={self.hidden_act!r} is not one of {", ".join(HIDDEN_ACTS)}'
      )
    if self.attention_bias not in ATTENTION_BIASES:
      raise LeakjaxError(
        f'attention_bias={self.attention_bias!r} is not one of'
        f' {", ".join(ATTENTION_BIASES)}'
      )
    if self.rope_type not in ROPE_TYPES:
      raise LeakjaxError(
        f'RoPE scaling of type {self.rope_type!r} is not supported',
        f'leakjax implements {", ".join(ROPE_TYPES)}',
      )
    if self.rope_type != 'default' and self.rope_factor <= 0:
      raise LeakjaxError(f'rope factor {self.rope_factor} must be positive')
    if self.rope_type == 'llama3' and (
      self.rope_original_max_position_embeddings is None
      or self.rope_high_freq_factor <= self.rope_low_freq_factor
    ):
      raise LeakjaxError(
        'llama3 RoPE scaling needs original_max_position_embeddings and'
        ' high_freq_factor > low_freq_factor',
        'fix the rope_scaling entry of config.json',
      )
    if self.num_key_value_heads is None:
      object.__setattr__(self, 'num_key_value_heads', self.num_attention_heads)
    if self.head_dim is None:
      if self.hidden_size % self.num_attention_heads:
        raise LeakjaxError(
          f'hidden_size={self.hidden_size} is not a multiple of'
          f' num_attention_heads={self.num_attention_heads}',
          'set head_dim explicitly',
        )
      object.__setattr__(
        self, 'head_dim', self.hidden_size // self.num_attention_heads
      )
    if self.num_attention_heads % self.num_key_value_heads:
      raise LeakjaxError(
        f'num_attention_heads={self.num_attention_heads} is not a multiple'
        f' of num_key_value_heads={self.num_key_value_heads}',
        'fix the model config',
      )
    if self.head_dim % 2:
      raise LeakjaxError(
        f'head_dim={self.head_dim} is odd; RoPE needs an even head_dim',
        'fix the model config',
      )
    factors = self.rope_freq_factors
    if (self.rope_type == 'factors') != (factors is not None):
      raise LeakjaxError(
        'rope_freq_factors go with rope_type factors, and only with it'
      )
    if factors is not None:
      factors = tuple(float(f) for f in factors)
      object.__setattr__(self, 'rope_freq_factors', factors)
      if len(factors) != self.head_dim // 2 or not all(f > 0 for f in factors):
        raise LeakjaxError(
          f'rope_freq_factors has {len(factors)} entries (all must be'
          f' positive); head_dim={self.head_dim} needs {self.head_dim // 2}',
          'the file does not match its own metadata',
        )

  @property
  def num_layers(self) -> int:
    return self.num_hidden_layers

  @property
  def max_length(self) -> int:
    return self.max_position_embeddings

  @property
  def num_groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_attention_heads // self.num_key_value_heads

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> LlamaConfig:
    """Reads an HF `config.json` dict, rejecting features we do not model.

    Accepts transformers 4.x (`rope_theta`, `rope_scaling`) and 5.x
    (`rope_parameters`) spellings.
    """
    model_type = d.get('model_type', 'llama')
    if model_type not in _HF_MODEL_TYPES:
      raise LeakjaxError(
        f'config model_type={model_type!r} is not a Llama model',
        'load it with its own family',
      )
    gemma = model_type == 'gemma'
    # Gemma's checkpoints name their activation `hidden_activation` (older
    # ones left it null and meant tanh GELU); the others `hidden_act`.
    act = d.get('hidden_activation') or d.get(
      'hidden_act', 'gelu_pytorch_tanh' if gemma else 'silu'
    )
    if act not in _HF_ACTS:
      raise LeakjaxError(
        f'hidden_act={act!r} is not supported',
        f'leakjax implements {", ".join(sorted(_HF_ACTS))}',
      )
    if d.get('mlp_bias'):
      raise LeakjaxError(
        'mlp_bias=true is not supported by leakjax Llama',
        'use a checkpoint without MLP biases',
      )
    if model_type == 'qwen2':  # q, k, v biases, always (Qwen2 Sec. 2.2.1)
      bias = 'qkv'
    else:
      bias = 'qkvo' if d.get('attention_bias') else 'none'
    rope_theta = d.get('rope_theta')
    scaling = {}
    for key in ('rope_scaling', 'rope_parameters'):
      rope = d.get(key)
      if rope is None:
        continue
      if not isinstance(rope, Mapping):
        raise LeakjaxError(f'{key}={rope!r} is not understood')
      kind = rope.get('rope_type', rope.get('type', 'default'))
      if kind not in ROPE_TYPES:
        raise LeakjaxError(
          f'{key} of type {kind!r} is not supported',
          f'leakjax implements RoPE {", ".join(ROPE_TYPES)}',
        )
      if kind != 'default':
        scaling = {
          'rope_type': kind,
          'rope_factor': float(rope.get('factor', 1.0)),
          'rope_low_freq_factor': float(rope.get('low_freq_factor', 1.0)),
          'rope_high_freq_factor': float(rope.get('high_freq_factor', 4.0)),
          'rope_original_max_position_embeddings': rope.get(
            'original_max_position_embeddings'
          ),
        }
      rope_theta = rope.get('rope_theta', rope_theta)
    missing = [
      k
      for k in (
        'vocab_size',
        'hidden_size',
        'intermediate_size',
        'num_hidden_layers',
        'num_attention_heads',
      )
      if k not in d
    ]
    if missing:
      raise LeakjaxError(
        f'config.json lacks {", ".join(missing)}',
        'use a complete Hugging Face config.json',
      )
    max_pos = int(d.get('max_position_embeddings', 2048))
    if d.get('sliding_window') and d.get('use_sliding_window', True):
      # Within one window, sliding-window attention is plain causal attention.
      max_pos = min(max_pos, int(d['sliding_window']))
    return cls(
      vocab_size=int(d['vocab_size']),
      hidden_size=int(d['hidden_size']),
      intermediate_size=int(d['intermediate_size']),
      num_hidden_layers=int(d['num_hidden_layers']),
      num_attention_heads=int(d['num_attention_heads']),
      num_key_value_heads=d.get('num_key_value_heads'),
      head_dim=d.get('head_dim'),
      rms_norm_eps=float(d.get('rms_norm_eps', 1e-6)),
      rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
      max_position_embeddings=max_pos,
      tie_word_embeddings=bool(d.get('tie_word_embeddings', False)),
      bos_token_id=_first_id(d.get('bos_token_id')),
      eos_token_id=_first_id(d.get('eos_token_id')),
      attention_bias=bias,
      hidden_act=_HF_ACTS[act],
      norm_offset=1.0 if gemma else 0.0,
      embedding_scale=gemma,
      **scaling,
    )

  def to_hf_dict(self) -> dict[str, Any]:
    """An HF `config.json` dict that transformers 4.x and 5.x both read
    (Qwen2's when the q/k/v projections alone carry biases)."""
    qwen = self.attention_bias == 'qkv'
    gemma = self.norm_offset == 1.0 and self.embedding_scale
    if (self.norm_offset, self.embedding_scale) not in (
      (0.0, False),
      (1.0, True),
    ):
      raise LeakjaxError(
        f'norm_offset={self.norm_offset} with embedding_scale='
        f'{self.embedding_scale} is neither Llama nor Gemma',
        'no HF config.json describes it',
      )
    if self.rope_type == 'factors':
      raise LeakjaxError(
        'per-frequency RoPE factors (a GGUF rope_freqs tensor) have no HF'
        ' config.json form',
        'export the HF checkpoint this GGUF was converted from instead',
      )
    rope = {'rope_type': self.rope_type, 'rope_theta': self.rope_theta}
    if self.rope_type != 'default':
      rope['factor'] = self.rope_factor
    if self.rope_type == 'llama3':
      rope.update(
        low_freq_factor=self.rope_low_freq_factor,
        high_freq_factor=self.rope_high_freq_factor,
        original_max_position_embeddings=(
          self.rope_original_max_position_embeddings
        ),
      )
    arch, model_type = (
      ('GemmaForCausalLM', 'gemma')
      if gemma
      else ('Qwen2ForCausalLM', 'qwen2')
      if qwen
      else ('LlamaForCausalLM', 'llama')
    )
    act = {'silu': 'silu', 'gelu_tanh': 'gelu_pytorch_tanh', 'gelu': 'gelu'}
    return {
      'architectures': [arch],
      'model_type': model_type,
      'vocab_size': self.vocab_size,
      'hidden_size': self.hidden_size,
      'intermediate_size': self.intermediate_size,
      'num_hidden_layers': self.num_hidden_layers,
      'num_attention_heads': self.num_attention_heads,
      'num_key_value_heads': self.num_key_value_heads,
      'head_dim': self.head_dim,
      'hidden_act': act[self.hidden_act],
      'rms_norm_eps': self.rms_norm_eps,
      'rope_theta': self.rope_theta,
      'rope_parameters': rope,
      'rope_scaling': None if self.rope_type == 'default' else rope,
      'use_sliding_window': False,
      'max_position_embeddings': self.max_position_embeddings,
      'tie_word_embeddings': self.tie_word_embeddings,
      'attention_bias': self.attention_bias == 'qkvo',
      'mlp_bias': False,
      'bos_token_id': self.bos_token_id,
      'eos_token_id': self.eos_token_id,
      'torch_dtype': 'float32',
    }


def _first_id(value) -> int | None:
  if isinstance(value, (list, tuple)):
    value = value[0] if value else None
  return None if value is None else int(value)
