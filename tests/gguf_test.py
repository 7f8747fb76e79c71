"""GGUF loading: tiny files we write in llama.cpp's layout, and SmolLM2."""

import dataclasses
import functools
import importlib.util
import random
import time

import gguf
import jax
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QT

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import gguf as leakjax_gguf
from leakjax.models import llama
from tests.model_variants_test import LLAMA3

# ------------------------------------------------------ a tiny vocabulary
SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
MERGES = [
  'Ġ t',
  'h e',
  'Ġt he',
  'i n',
  'Ġ a',
  'e r',
  'o n',
  'Ġ s',
  'r e',
  'a t',
  'Ġ o',
  'e n',
  'Ġ w',
  'Ġa n',
  'Ġan d',
  'i s',
  'Ġ 1',
  'Ġ Â',
]


def _byte_tokens():
  return list(leakjax_gguf._byte_alphabet().values())


def _tiny_vocab():
  tokens = SPECIALS + _byte_tokens()
  for merge in MERGES:
    tokens.append(merge.replace(' ', ''))
  types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
  return tokens, types


TOKENS, TOKEN_TYPES = _tiny_vocab()
VOCAB = len(TOKENS)  # 277


def _hf_model(tied: bool, seed: int = 0, kind: str = 'plain'):
  """A tiny transformers model over the tiny vocabulary, weights large
  enough that every term matters. kind: 'plain' Llama (RoPE base 5000),
  'llama3' / 'linear' (scaled RoPE, base ROPE_THETA) or 'qwen2'."""
  common = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=64,
    tie_word_embeddings=tied,
    bos_token_id=1,
    eos_token_id=2,
    attn_implementation='eager',
  )
  cls = transformers.LlamaForCausalLM
  if kind == 'plain':
    config = transformers.LlamaConfig(**common, rope_theta=5000.0)
  elif kind == 'qwen2':
    config = transformers.Qwen2Config(**common, rope_theta=ROPE_THETA)
    cls = transformers.Qwen2ForCausalLM
  else:
    rope = {'rope_type': 'linear', 'factor': 4.0, 'rope_theta': ROPE_THETA}
    config = transformers.LlamaConfig(
      **common, rope_scaling=LLAMA3 if kind == 'llama3' else rope
    )
  torch.manual_seed(seed)
  model = cls(config).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if 'norm' in name else 0.1 * noise)
  return model


# The llama3 scaling of the HF variants' tests: head_dim 16 with theta 500
# puts wavelengths below, between and above its cut-offs, and the 48 test
# positions pass its original context of 32.
ROPE_THETA = LLAMA3['rope_theta']


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """What llama.cpp's convert_hf_to_gguf.py does to q/k rows."""
  return (
    w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
    .swapaxes(1, 2)
    .reshape(w.shape)
  )


_TO_GGUF = {
  'input_layernorm': 'attn_norm',
  'post_attention_layernorm': 'ffn_norm',
  'self_attn.q_proj': 'attn_q',
  'self_attn.k_proj': 'attn_k',
  'self_attn.v_proj': 'attn_v',
  'self_attn.o_proj': 'attn_output',
  'mlp.gate_proj': 'ffn_gate',
  'mlp.up_proj': 'ffn_up',
  'mlp.down_proj': 'ffn_down',
}


def _gguf_name(hf_name: str) -> str:
  fixed = {
    'model.embed_tokens.weight': 'token_embd.weight',
    'model.norm.weight': 'output_norm.weight',
    'lm_head.weight': 'output.weight',
  }
  if hf_name in fixed:
    return fixed[hf_name]
  _, _, layer, rest = hf_name.split('.', 3)
  module, part = rest.rsplit('.', 1)  # part: weight or bias
  return f'blk.{layer}.{_TO_GGUF[module]}.{part}'


def write_gguf(
  path,
  hf_model,
  *,
  qtype=QT.F32,
  arch='llama',
  pre='smollm',
  edit=None,
  rope_freqs=None,
):
  """Writes `hf_model` as llama.cpp would: GGUF names, q/k rows permuted
  for the 'llama' architecture (not for 'qwen2'), and `rope_freqs` (the
  per-frequency divisors of Llama 3.1's scaling) as a tensor."""
  c = hf_model.config
  writer = gguf.GGUFWriter(str(path), arch)
  writer.add_name('tiny-test')
  writer.add_block_count(c.num_hidden_layers)
  writer.add_context_length(c.max_position_embeddings)
  writer.add_embedding_length(c.hidden_size)
  writer.add_feed_forward_length(c.intermediate_size)
  writer.add_head_count(c.num_attention_heads)
  writer.add_head_count_kv(c.num_key_value_heads)
  writer.add_rope_freq_base(c.rope_parameters['rope_theta'])
  if rope_freqs is not None:
    writer.add_tensor('rope_freqs.weight', np.asarray(rope_freqs, np.float32))
  writer.add_layer_norm_rms_eps(c.rms_norm_eps)
  writer.add_rope_dimension_count(
    getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads
  )
  writer.add_vocab_size(VOCAB)
  writer.add_tokenizer_model('gpt2')
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(TOKENS)
  writer.add_token_types(TOKEN_TYPES)
  writer.add_token_merges(MERGES)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  if edit is not None:
    edit(writer)
  for name, tensor in hf_model.state_dict().items():
    if name == 'lm_head.weight' and c.tie_word_embeddings:
      continue
    w = tensor.numpy().astype(np.float32)
    if arch == 'llama' and name.endswith('q_proj.weight'):
      w = llama_cpp_permute(w, c.num_attention_heads)
    elif arch == 'llama' and name.endswith('k_proj.weight'):
      w = llama_cpp_permute(w, c.num_key_value_heads)
    if w.ndim == 2 and qtype != QT.F32:
      writer.add_tensor(
        _gguf_name(name), gguf.quants.quantize(w, qtype), raw_dtype=qtype
      )
    else:
      writer.add_tensor(_gguf_name(name), w)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


def transformers_gguf_model(path):
  """transformers' own GGUF loading of `path`, float32, eager attention.

  `from_pretrained(gguf_file=...)` insists on `accelerate`; without it we
  call the loader it is built on (`load_gguf_checkpoint`).
  """
  if importlib.util.find_spec('accelerate') is not None:
    return transformers.AutoModelForCausalLM.from_pretrained(
      path.parent,
      gguf_file=path.name,
      dtype=torch.float32,
      attn_implementation='eager',
    ).eval()
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

  config = transformers.AutoConfig.from_pretrained(
    path.parent, gguf_file=path.name
  )
  config._attn_implementation = 'eager'  # pylint: disable=protected-access
  model = transformers.LlamaForCausalLM(config).eval()
  tensors = load_gguf_checkpoint(
    str(path), return_tensors=True, model_to_load=model
  )['tensors']
  missing, unexpected = model.load_state_dict(tensors, strict=False)
  assert not unexpected, unexpected
  assert set(missing) <= {'lm_head.weight'}, missing
  if config.tie_word_embeddings:
    model.lm_head.weight = model.model.embed_tokens.weight
  return model


@functools.partial(jax.jit, static_argnames=('model',))
def _logits(model, params, ids):
  return model.logits(params, ids)


def _torch_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.numpy()


def _ids(batch, time_, seed=0):
  return np.random.default_rng(seed).integers(
    0, VOCAB, (batch, time_), dtype=np.int32
  )


# ------------------------------------------------------------ dequantize
def _single_tensor_file(path, name, data, raw_dtype=None):
  writer = gguf.GGUFWriter(str(path), 'llama')
  writer.add_tensor(name, data, raw_dtype=raw_dtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return gguf.GGUFReader(str(path)).tensors[0]


# Worst error of a quantise/dequantise round trip, as a fraction of max|x|.
_ROUND_TRIP_TOL = {
  QT.F16: 1e-3,
  QT.BF16: 4e-3,
  QT.Q8_0: 1 / 127,
  QT.Q4_0: 1 / 8,
  QT.Q4_1: 1 / 15,
}


@pytest.mark.parametrize('qtype', list(_ROUND_TRIP_TOL), ids=lambda q: q.name)
def test_dequantize_round_trip(tmp_path, qtype):
  x = np.random.default_rng(0).normal(size=(3, 256)).astype(np.float32)
  x[1] *= 10  # blocks with different scales
  if qtype == QT.F16:
    stored, raw = x.astype(np.float16), None
  else:
    stored, raw = gguf.quants.quantize(x, qtype), qtype
  tensor = _single_tensor_file(tmp_path / 'x.gguf', 'x', stored, raw)
  assert tensor.tensor_type == qtype
  got = leakjax_gguf.dequantize(tensor)
  assert got.shape == (3, 256) and got.dtype == np.float32
  np.testing.assert_array_equal(
    got, gguf.quants.dequantize(stored, qtype).reshape(3, 256)
  )
  err = np.abs(got - x).max(axis=1) / np.abs(x).max(axis=1)
  assert (err <= _ROUND_TRIP_TOL[qtype]).all(), err
  assert err.max() > 0 or qtype == QT.F32


@pytest.mark.parametrize('qtype', [QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_k_quants_match_transformers_dequantizer(tmp_path, qtype):
  """gguf cannot quantize K-quants; check random blocks against torch's."""
  from transformers.integrations.gguf import dequant

  block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
  rng = np.random.default_rng(1)
  raw = rng.integers(0, 256, (4, block_bytes), dtype=np.uint8)
  scales = rng.uniform(0.01, 0.1, (4, 2)).astype(np.float16).view(np.uint8)
  if qtype == QT.Q4_K:  # d, dmin lead the block
    raw[:, 0:4] = scales
  else:  # Q6_K: d ends the block
    raw[:, 208:210] = scales[:, :2]
  tensor = _single_tensor_file(tmp_path / 'k.gguf', 'k', raw, qtype)
  got = leakjax_gguf.dequantize(tensor)
  assert got.shape == (4, 256)
  want = dequant.dequantize(torch.from_numpy(raw.reshape(-1)), int(qtype))
  np.testing.assert_allclose(
    got, want.numpy().reshape(4, 256), rtol=1e-6, atol=1e-6
  )
  assert np.abs(got).max() > 0


def test_unpermute_inverts_llama_cpp_permute():
  w = np.random.default_rng(2).normal(size=(4 * 16, 24)).astype(np.float32)
  permuted = llama_cpp_permute(w, 4)
  assert not np.array_equal(permuted, w)
  np.testing.assert_array_equal(leakjax_gguf.unpermute_rows(permuted, 4), w)


# ------------------------------------------------------------ tiny models
@pytest.fixture(scope='module')
def tiny_models():
  return {tied: _hf_model(tied) for tied in (False, True)}


@pytest.mark.parametrize('tied', [False, True], ids=['untied', 'tied'])
def test_f32_gguf_matches_source_and_transformers(tmp_path, tiny_models, tied):
  source = tiny_models[tied]
  path = write_gguf(tmp_path / 'tiny.gguf', source)
  model, params = models.load(path)  # dispatches on the .gguf suffix
  assert model.family == 'llama'
  assert model.config == llama.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=model.config.rms_norm_eps,
    rope_theta=5000.0,
    max_position_embeddings=64,
    tie_word_embeddings=tied,
    bos_token_id=1,
    eos_token_id=2,
  )
  assert abs(model.config.rms_norm_eps - 1e-5) < 1e-9
  assert model.tie_word_embeddings == tied
  assert (model.vocab_size, model.max_length) == (VOCAB, 64)
  ids = _ids(2, 10)
  got = np.asarray(_logits(model, params, ids))
  assert np.abs(got - _torch_logits(source, ids)).max() <= 1e-5
  theirs = transformers_gguf_model(path)
  assert np.abs(got - _torch_logits(theirs, ids)).max() <= 1e-5


@pytest.mark.parametrize(
  'qtype', [QT.Q8_0, QT.Q4_0, QT.Q4_1], ids=lambda q: q.name
)
def test_quantized_gguf_matches_numpy_reference(tmp_path, tiny_models, qtype):
  source = tiny_models[False]
  path = write_gguf(tmp_path / 'tiny.gguf', source, qtype=qtype)
  model, params = leakjax_gguf.load_gguf(path)
  # Reference: gguf's numpy dequantizer, un-permuted by llama.cpp's formula.
  reader = gguf.GGUFReader(str(path))
  raw = {
    t.name: gguf.quants.dequantize(t.data, t.tensor_type)
    for t in reader.tensors
  }
  c = source.config
  for hf_name, spec in llama.hf_name_map(model.config).items():
    want = raw[_gguf_name(hf_name)]
    for proj, heads in (
      ('q_proj', c.num_attention_heads),
      ('k_proj', c.num_key_value_heads),
    ):
      if hf_name.endswith(f'{proj}.weight'):
        inverse = np.argsort(llama_cpp_permute(np.arange(want.shape[0]), heads))
        want = want[inverse]
    got = spec.to_hf(np.asarray(models.get_path(params, spec.path)))
    np.testing.assert_array_equal(got, want, err_msg=hf_name)
  ids = _ids(2, 10, seed=1)
  got = np.asarray(_logits(model, params, ids))
  theirs = transformers_gguf_model(path)
  assert np.abs(got - _torch_logits(theirs, ids)).max() <= 1e-5
  # Quantisation changed the weights, not the function.
  exact = _torch_logits(source, ids)
  drift = np.sqrt(np.mean((got - exact) ** 2)) / exact.std()
  assert 0 < drift < (0.05 if qtype == QT.Q8_0 else 0.6), drift


SENTENCES = [
  'The theory and the practice at 10 and 1999.',
  'Hello, world! (she said) -- isn\'t it "fine"?',
  '  leading spaces\n\nand new lines\tand tabs  ',
  'Café naïve façade — 東京 🎉 ∑x²',
  'numbers: 3.14159, 2,718, -42 and 1e-9; 0x1F!',
  '<|im_start|>user\nhi there<|im_end|>',
]


def test_tiny_tokenizer_matches_transformers(tmp_path, tiny_models):
  # pre='gpt2': transformers does not implement 'smollm' (see below).
  path = write_gguf(tmp_path / 'tiny.gguf', tiny_models[True], pre='gpt2')
  ours = leakjax_gguf.load_gguf(path)[0].tokenizer
  theirs = transformers.AutoTokenizer.from_pretrained(
    tmp_path, gguf_file=path.name
  )
  assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, VOCAB)
  for text in SENTENCES:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False), text
    assert ours.decode(ids, skip_special=False) == text
  assert ours.encode(' the and') == [TOKENS.index('Ġthe'), TOKENS.index('Ġand')]


def test_numeric_characters_split_like_llama_cpp(tmp_path, tiny_models):
  """llama.cpp's 'smollm' pre-tokenizer isolates every \\p{N} character.

  (transformers' GGUF converter does not know 'smollm' and falls back to
  GPT-2's split, so it differs from llama.cpp on e.g. ' ½'; we follow
  llama.cpp and SmolLM's own tokenizer.json, `Digits(individual_digits)`.)
  """
  path = write_gguf(tmp_path / 'tiny.gguf', tiny_models[True])
  tok = leakjax_gguf.load_gguf(path)[0].tokenizer
  pieces = [tok.id_to_token(i) for i in tok.encode(' 1 ½ x²')]
  assert pieces == ['Ġ', '1', 'Ġ', 'Â', '½', 'Ġ', 'x', 'Â', '²']
  gpt2 = write_gguf(tmp_path / 'gpt2pre.gguf', tiny_models[True], pre='gpt2')
  tok = leakjax_gguf.load_gguf(gpt2)[0].tokenizer
  pieces = [tok.id_to_token(i) for i in tok.encode(' 1 ½ x²')]
  assert pieces == ['Ġ1', 'ĠÂ', '½', 'Ġ', 'x', 'Â', '²']


def test_unsupported_architecture_raises(tmp_path, tiny_models):
  path = write_gguf(tmp_path / 'gpt2.gguf', tiny_models[True], arch='gpt2')
  with pytest.raises(LeakjaxError, match="'gpt2'"):
    leakjax_gguf.load_gguf(path)


def test_unsupported_quant_type_raises(tmp_path, tiny_models):
  path = tmp_path / 'q5.gguf'
  write_gguf(path, tiny_models[True], qtype=QT.Q5_0)
  with pytest.raises(LeakjaxError, match='Q5_0'):
    leakjax_gguf.load_gguf(path)


# ------------------------------------- Llama 3.1 RoPE, linear RoPE, Qwen2
def _llama3_divisors(config) -> np.ndarray:
  """What llama.cpp stores as rope_freqs: plain / llama3 frequencies,
  the llama3 ones from transformers' own RoPE initialiser."""
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

  scaled, _ = ROPE_INIT_FUNCTIONS['llama3'](config, 'cpu')
  dim = config.head_dim
  plain = 1.0 / (ROPE_THETA ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
  return (plain / scaled.double().numpy()).astype(np.float32)


def test_llama31_rope_freqs_gguf_matches_transformers(tmp_path):
  source = _hf_model(False, kind='llama3')
  divisors = _llama3_divisors(source.config)
  assert divisors.min() == pytest.approx(1.0) and divisors.max() == 8.0
  path = write_gguf(tmp_path / 'l31.gguf', source, rope_freqs=divisors)
  model, params = leakjax_gguf.load_gguf(path)
  assert model.config.rope_type == 'factors'
  np.testing.assert_allclose(model.config.rope_freq_factors, divisors)
  ids = _ids(2, 48)
  got = np.asarray(_logits(model, params, ids))
  want = _torch_logits(source, ids)
  assert np.abs(got - want).max() <= 1e-5
  # The same file read without its rope_freqs is far off: they matter.
  plain = dataclasses.replace(
    model.config, rope_type='default', rope_freq_factors=None
  )
  off = np.asarray(_logits(llama.from_params(plain, params)[0], params, ids))
  assert np.abs(off - want).max() > 0.1
  with pytest.raises(LeakjaxError, match='no HF'):
    model.config.to_hf_dict()


def test_linear_rope_gguf_matches_transformers(tmp_path):
  source = _hf_model(False, kind='linear')

  def linear(writer):
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(4.0)

  path = write_gguf(tmp_path / 'linear.gguf', source, edit=linear)
  model, params = leakjax_gguf.load_gguf(path)
  assert (model.config.rope_type, model.config.rope_factor) == ('linear', 4.0)
  ids = _ids(2, 48)
  got = np.asarray(_logits(model, params, ids))
  assert np.abs(got - _torch_logits(source, ids)).max() <= 1e-5


def test_qwen2_gguf_matches_transformers(tmp_path):
  source = _hf_model(False, kind='qwen2')
  path = write_gguf(tmp_path / 'qwen2.gguf', source, arch='qwen2', pre='qwen2')
  model, params = models.load(path)
  assert model.config.attention_bias == 'qkv'
  ids = _ids(2, 48)
  got = np.asarray(_logits(model, params, ids))
  assert np.abs(got - _torch_logits(source, ids)).max() <= 1e-5
  theirs = transformers_gguf_model(path)  # transformers' own GGUF reader
  assert np.abs(got - _torch_logits(theirs, ids)).max() <= 1e-5


def test_rope_scaling_and_bad_files_raise(tmp_path, tiny_models):
  path = write_gguf(
    tmp_path / 'scaled.gguf',
    tiny_models[True],
    edit=lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
  )
  with pytest.raises(LeakjaxError, match="RoPE scaling 'yarn'"):
    leakjax_gguf.load_gguf(path)
  path = write_gguf(
    tmp_path / 'no_factor.gguf',
    tiny_models[True],
    edit=lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
  )
  with pytest.raises(LeakjaxError, match='rope.scaling.factor'):
    leakjax_gguf.load_gguf(path)
  junk = tmp_path / 'junk.gguf'
  junk.write_bytes(b'not a gguf file at all')
  with pytest.raises(LeakjaxError, match='not a readable GGUF'):
    models.load(junk)
  with pytest.raises(LeakjaxError, match='does not exist'):
    models.load(tmp_path / 'missing.gguf')


# ---------------------------------------------------------- real SmolLM2
@pytest.fixture(scope='module')
def smollm2():
  """(model, params, load seconds, GGUF path); skipped without the package."""
  try:
    path = models.smollm2_gguf_path()
  except LeakjaxError as e:
    pytest.skip(f'SmolLM2 GGUF not installed ({e})')
  start = time.perf_counter()
  model, params = models.load(models.SMOLLM2_ALIAS)
  return model, params, time.perf_counter() - start, path


@pytest.fixture(scope='module')
def smollm2_transformers(smollm2):
  return transformers_gguf_model(smollm2[3])


SMOLLM2_TEXT = 'The capital of France is Paris, and it is famous for its food.'


@pytest.mark.slow
def test_smollm2_config_and_load_time(smollm2):
  model, params, seconds, _ = smollm2
  c = model.config
  assert (
    c.num_layers,
    c.hidden_size,
    c.num_attention_heads,
    c.num_key_value_heads,
    c.vocab_size,
  ) == (30, 576, 9, 3, 49152)
  assert c.tie_word_embeddings and c.rope_theta == 100000.0
  assert model.paths.lm_head is None
  assert (model.vocab_size, model.hidden_size, model.num_layers) == (
    49152,
    576,
    30,
  )
  assert model.tie_word_embeddings
  assert 134_000_000 < models.num_params(params) < 135_000_000
  print(f'SmolLM2 load: {seconds:.1f} s')
  assert seconds < 60


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2, smollm2_transformers):
  model, params = smollm2[:2]
  ids = np.array([model.tokenizer.encode(SMOLLM2_TEXT)], np.int32)
  got = np.asarray(model.logits(params, ids))
  want = _torch_logits(smollm2_transformers, ids)
  diff = np.abs(got - want).max()
  print(f'SmolLM2 max-abs logits diff vs transformers: {diff:.2e}')
  assert diff <= 1e-3, diff


@pytest.mark.slow
def test_smollm2_prefers_natural_text(smollm2):
  model, params = smollm2[:2]
  words = SMOLLM2_TEXT.rstrip('.').split()
  shuffled = words[:]
  random.Random(0).shuffle(shuffled)
  assert shuffled != words
  ids, mask = model.tokenizer.encode_batch(
    [' '.join(words) + '.', ' '.join(shuffled) + '.']
  )
  logp = np.asarray(model.token_log_probs(params, ids, mask))
  real = mask[:, 1:].astype(bool)
  ppl = [float(np.exp(-logp[i][real[i]].mean())) for i in range(2)]
  print(f'SmolLM2 perplexity natural {ppl[0]:.1f} vs shuffled {ppl[1]:.1f}')
  assert ppl[1] >= 10 * ppl[0], ppl


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers(smollm2):
  model, _, _, path = smollm2
  theirs = transformers.AutoTokenizer.from_pretrained(
    path.parent, gguf_file=path.name
  )
  ours = model.tokenizer
  assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, 49152)
  for text in SENTENCES + [SMOLLM2_TEXT, 'In 2024, 1234567 people paid $3.50']:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False), text
    assert ours.decode(ids, skip_special=False) == text
  # Where transformers (no 'smollm' pre-tokenizer) and llama.cpp differ, we
  # split like llama.cpp: ' ½' is ' ' + '½', not ' \xc2' + '\xbd'.
  assert [ours.id_to_token(i) for i in ours.encode(' ½')] == ['Ġ', 'Â½']
