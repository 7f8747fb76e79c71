"""The Llama-family checkpoints users bring, against transformers.

Llama 3.x RoPE scaling ('llama3', and 'linear'), HF Llama with attention
biases, Qwen2 / Qwen2.5 (q/k/v biases; tied and untied heads), Mistral
(sliding window no shorter than the context) and Gemma (GeGLU, RMSNorm
scaling by 1 + weight, embeddings times sqrt(d), tied head): each a tiny random model
saved by transformers (PyTorch, float32) and loaded by `leakjax.models.load`;
logits and the gradients of the next-token loss must agree.
"""

import functools

import jax
import numpy as np
import pytest
import torch
import transformers
from torch_reference import torch_lm_loss_backward

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import llama
from leakjax.models.protocol import get_path

VOCAB, LENGTH = 97, 48
COMMON = dict(
  vocab_size=VOCAB,
  hidden_size=64,
  intermediate_size=128,
  num_hidden_layers=2,
  num_attention_heads=4,
  num_key_value_heads=2,
  max_position_embeddings=256,
  rms_norm_eps=1e-5,
  attn_implementation='eager',
)
# The original context (32) is shorter than the 48 test positions, and
# head_dim 16 with theta 500 gives wavelengths (6.3, 13, 28, 59, ...
# positions) below, between and above the llama3 cut-offs 32 / 4 = 8 and
# 32 / 1 = 32, so all three branches of the scaling are compared.
LLAMA3 = {
  'rope_type': 'llama3',
  'factor': 8.0,
  'low_freq_factor': 1.0,
  'high_freq_factor': 4.0,
  'original_max_position_embeddings': 32,
  'rope_theta': 500.0,
}
VARIANTS = {
  'llama3_rope': (
    transformers.LlamaConfig,
    transformers.LlamaForCausalLM,
    dict(rope_scaling=LLAMA3),
  ),
  'linear_rope': (
    transformers.LlamaConfig,
    transformers.LlamaForCausalLM,
    dict(rope_scaling={'rope_type': 'linear', 'factor': 4.0}),
  ),
  'llama_attention_bias': (
    transformers.LlamaConfig,
    transformers.LlamaForCausalLM,
    dict(attention_bias=True),
  ),
  'qwen2_untied': (
    transformers.Qwen2Config,
    transformers.Qwen2ForCausalLM,
    dict(tie_word_embeddings=False),
  ),
  'qwen2_tied': (
    transformers.Qwen2Config,
    transformers.Qwen2ForCausalLM,
    dict(tie_word_embeddings=True),
  ),
  'mistral': (
    transformers.MistralConfig,
    transformers.MistralForCausalLM,
    dict(sliding_window=256),
  ),
  'llama_gelu': (
    transformers.LlamaConfig,
    transformers.LlamaForCausalLM,
    dict(hidden_act='gelu'),  # exact (erf) GELU in the gated MLP
  ),
  'gemma': (
    transformers.GemmaConfig,
    transformers.GemmaForCausalLM,
    # pad_token_id None: torch's embedding would drop the input-side
    # gradient of the padding row (nn.Embedding's padding_idx), which no
    # JAX gradient does.
    dict(head_dim=16, hidden_act='gelu_pytorch_tanh', pad_token_id=None),
  ),
}


@functools.cache
def pair(name, directory):
  config_cls, model_cls, extra = VARIANTS[name]
  torch.manual_seed(0)
  hf_model = model_cls(config_cls(**COMMON, **extra)).eval()
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():  # weights large enough that every term matters
    for pname, p in hf_model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if 'norm' in pname else 0.1 * noise)
  hf_model.save_pretrained(directory)
  model, params = models.load(directory)
  return model, params, hf_model


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
  directory = tmp_path_factory.mktemp(request.param)
  return request.param, *pair(request.param, str(directory))


def _ids(seed=0):
  return (
    np.random.default_rng(seed).integers(0, VOCAB, (2, LENGTH)).astype(np.int32)
  )


def test_config_read(variant):
  name, model, params, _ = variant
  c = model.config
  assert c.rope_type == {'llama3_rope': 'llama3', 'linear_rope': 'linear'}.get(
    name, 'default'
  )
  assert c.attention_bias == (
    'qkvo'
    if name == 'llama_attention_bias'
    else 'qkv'
    if name.startswith('qwen2')
    else 'none'
  )
  q = params['layers_0']['attn']['q_proj']
  assert ('bias' in q) == (c.attention_bias != 'none')
  assert ('bias' in params['layers_0']['attn']['o_proj']) == (
    c.attention_bias == 'qkvo'
  )


def test_first_layer_inputs_are_block_0s_inputs(variant):
  # What the span tests read (FILM's tied bag, DAGER's token filter):
  # RMSNorm(tokens[v]) · scale must be block 0's attention input.
  name, model, params, _ = variant
  inputs = model.first_layer_inputs(params)
  ids = _ids(seed=7)
  e = np.asarray(inputs.tokens, np.float64)[ids]
  want = e / np.sqrt((e * e).mean(-1, keepdims=True) + inputs.eps)
  want = want * np.asarray(inputs.scale, np.float64)
  got = np.asarray(model.block_inputs(params, ids, layer=0))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  gemma = name == 'gemma'
  assert model.config.embedding_scale == gemma
  assert model.config.norm_offset == (1.0 if gemma else 0.0)
  assert model.config.hidden_act == (
    'gelu_tanh' if gemma else 'gelu' if name == 'llama_gelu' else 'silu'
  )


@pytest.mark.slow
def test_logits_match_transformers(variant):
  name, model, params, hf_model = variant
  ids = _ids()
  with torch.no_grad():
    want = hf_model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  got = np.asarray(jax.jit(model.logits)(params, ids))
  # Measured max |diff| 1.9e-6 to 2.9e-6 over the variants (|logits| <= 3.1);
  # RoPE without the scaling would be off by 2.3 (llama3) and 2.7 (linear).
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_gradients_match_transformers(variant):
  name, model, params, hf_model = variant
  ids = _ids(seed=3)
  torch_loss = torch_lm_loss_backward(hf_model, ids, VOCAB)
  our_loss, grads = jax.value_and_grad(model.loss)(params, ids)
  assert abs(float(our_loss) - torch_loss) <= 1e-5
  hf_params = dict(hf_model.named_parameters())
  names = llama.hf_name_map(model.config)
  assert any(n.endswith('q_proj.bias') for n in names) == (
    model.config.attention_bias != 'none'
  )
  for hf_name, spec in names.items():
    want = hf_params[hf_name].grad.numpy()
    got = spec.to_hf(np.asarray(get_path(grads, spec.path)))
    np.testing.assert_allclose(
      got, want, atol=1e-4 * np.abs(want).max(), rtol=0, err_msg=hf_name
    )


@pytest.mark.slow
def test_save_load_round_trip(variant, tmp_path):
  name, model, params, _ = variant
  models.save(model, params, tmp_path / 'again')
  again, again_params = models.load(tmp_path / 'again')
  assert again.config == model.config
  ids = _ids(seed=5)
  np.testing.assert_array_equal(
    np.asarray(again.logits(again_params, ids)),
    np.asarray(model.logits(params, ids)),
  )


def test_llama3_scaling_changes_only_long_wavelengths():
  config = llama.LlamaConfig(
    vocab_size=8,
    hidden_size=64,
    intermediate_size=8,
    num_hidden_layers=1,
    num_attention_heads=4,
    rope_theta=500.0,
    rope_type='llama3',
    rope_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_position_embeddings=32,
  )
  plain = llama.rope_inv_freq(
    llama.LlamaConfig(**{**config.__dict__, 'rope_type': 'default'})
  )
  scaled = llama.rope_inv_freq(config)
  wavelen = 2 * np.pi / np.asarray(plain)
  short, long_ = wavelen < 32 / 4, wavelen > 32 / 1
  assert short.any() and long_.any() and (~short & ~long_).any()
  np.testing.assert_array_equal(scaled[short], plain[short])
  np.testing.assert_allclose(scaled[long_], plain[long_] / 8, rtol=1e-6)
  mid = ~short & ~long_
  assert ((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8)).all()


@pytest.mark.parametrize(
  'edit, message',
  [
    ({'rope_scaling': {'rope_type': 'yarn', 'factor': 4.0}}, 'yarn'),
    ({'rope_scaling': {'rope_type': 'longrope', 'factor': 4.0}}, 'longrope'),
    ({'attention_bias': 'some'}, 'attention_bias'),
  ],
)
def test_unsupported_variants_raise(edit, message):
  d = {**COMMON, 'model_type': 'llama', **edit}
  with pytest.raises(LeakjaxError, match=message):
    config = llama.LlamaConfig.from_hf_dict(d)
    if isinstance(edit.get('attention_bias'), str):
      llama.LlamaConfig(**{**config.__dict__, **edit})
