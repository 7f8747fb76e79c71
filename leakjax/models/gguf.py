"""Llama-architecture models (and Qwen2) from llama.cpp's GGUF files.

Reads the file with :class:`leakjax.models.gguf_file.GGUFFile` (memory-mapped,
no pickles), dequantizes every tensor to float32 (Q4_0, Q4_1 and Q8_0 in
threads with :mod:`leakjax.models.gguf_blocks`, other types with
`gguf.quants`), undoes llama.cpp's layout
changes and hands HF-named tensors to :mod:`leakjax.models.llama`, which
checks names and shapes. The config and the tokenizer come from the file's
metadata, so a GGUF is self-contained. Architectures: `llama` (Llama 1-3.x,
SmolLM, Mistral; Llama 3.1's RoPE scaling as llama.cpp writes it, a
`rope_freqs` tensor of per-frequency divisors; linear RoPE scaling) and
`qwen2` (Qwen2 / Qwen2.5: q/k/v biases, q/k rows not permuted, since
llama.cpp runs Qwen2 with the NeoX rotation, HF's `rotate_half`):

>>> model, params = load_gguf('SmolLM2-135M-Instruct.Q4_1.gguf')  # doctest: +SKIP
>>> model.tokenizer.encode('Hello world')                  # doctest: +SKIP
[19556, 905]

Nothing is cached on disk; loading the 135M SmolLM2 takes a few seconds.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from leakjax.errors import LeakjaxError
from leakjax.models import gguf_blocks, llama
from leakjax.models.gguf_file import GGUFFile
from leakjax.models.protocol import Model, PyTree

# What we dequantize (`gguf_blocks` the legacy block types, `gguf.quants`
# the others) and our tests check.
SUPPORTED_TYPES = ('F32', 'F16', 'BF16', 'Q8_0', 'Q4_0', 'Q4_1', 'Q4_K', 'Q6_K')

# GGUF per-layer tensor name -> HF name (N = layer index).
_LAYER_NAMES = {
  'attn_norm': 'input_layernorm',
  'ffn_norm': 'post_attention_layernorm',
  'attn_q': 'self_attn.q_proj',
  'attn_k': 'self_attn.k_proj',
  'attn_v': 'self_attn.v_proj',
  'attn_output': 'self_attn.o_proj',
  'ffn_gate': 'mlp.gate_proj',
  'ffn_up': 'mlp.up_proj',
  'ffn_down': 'mlp.down_proj',
}
_GLOBAL_NAMES = {
  'token_embd.weight': 'model.embed_tokens.weight',
  'output_norm.weight': 'model.norm.weight',
  'output.weight': 'lm_head.weight',
}
_LAYER_RE = re.compile(r'blk\.(\d+)\.(\w+)\.(weight|bias)')
# general.architecture -> the attention biases of the HF model. llama.cpp
# permutes q/k rows for 'llama' only (its RoPE pairs adjacent dims there).
ARCHITECTURES = {'llama': 'none', 'qwen2': 'qkv'}
_ROPE_FREQS = 'rope_freqs.weight'


def _reader(path: Path) -> GGUFFile:
  if not path.is_file():
    raise LeakjaxError(f'GGUF file {path} does not exist', 'check the path')
  try:
    return GGUFFile(path)
  except Exception as e:  # LeakjaxError, OSError, ...
    raise LeakjaxError(
      f'{path} is not a readable GGUF file ({e})',
      'the file is corrupt or not GGUF',
    ) from None


def _meta(reader, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  return default if field is None else field.contents()


# ---------------------------------------------------------------- tensors
def dequantize(tensor, source: str = 'GGUF') -> np.ndarray:
  """A GGUF tensor (:class:`GGUFFile`'s or `GGUFReader`'s) as float32
  numpy, in numpy (HF) axis order.

  GGUF lists dims fastest-first (`[in, out]` for a weight); the reader's
  `data` and the result are `[out, in]`, like a torch Linear weight.

  Raises:
    LeakjaxError: the tensor's quantisation type is not supported.
  """
  from gguf import quants  # pylint: disable=g-import-not-at-top

  kind = tensor.tensor_type.name
  if kind not in SUPPORTED_TYPES:
    raise LeakjaxError(
      f'{source}: tensor {tensor.name} is stored as {kind}, which leakjax'
      f' cannot dequantize (supported: {", ".join(SUPPORTED_TYPES)})',
      'requantize the model (e.g. llama.cpp llama-quantize to Q8_0 or Q4_K_M)',
    )
  if kind in gguf_blocks.BLOCK_BYTES:  # the same bits, in threads
    out = gguf_blocks.dequantize(tensor.data, kind)
  else:
    out = quants.dequantize(tensor.data, tensor.tensor_type)
  want = tuple(int(d) for d in reversed(tensor.shape))
  return np.asarray(out, np.float32).reshape(want)


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation (its RoPE pairs adjacent dims).

  llama.cpp's converter applies, per head,
  `w.reshape(n_heads, 2, head_dim // 2, in).swapaxes(1, 2)`; this is the
  inverse, giving HF's `rotate_half` layout.
  """
  out_dim = w.shape[0]
  head_dim = out_dim // n_heads
  # [n_heads * hd, in] -> [n_heads, hd // 2, 2, in] -> [n_heads, 2, hd//2, in]
  return (
    w.reshape(n_heads, head_dim // 2, 2, *w.shape[1:])
    .swapaxes(1, 2)
    .reshape(w.shape)
  )


def hf_tensors(
  reader, config: llama.LlamaConfig, source: str = 'GGUF'
) -> dict[str, np.ndarray]:
  """All tensors of a llama GGUF, dequantized and renamed to HF names.

  Names we do not know are kept as they are, so that the name check in
  `hf_checkpoint.params_from_hf` reports them as unused.
  """
  permuted = _meta(reader, 'general.architecture') == 'llama'
  tensors = {}
  for t in reader.tensors:
    if t.name == _ROPE_FREQS:  # read into the config
      continue
    name = _GLOBAL_NAMES.get(t.name)
    value = None
    if name is None:
      match = _LAYER_RE.fullmatch(t.name)
      if match and match.group(2) in _LAYER_NAMES:
        layer, kind, part = match.groups()
        name = f'model.layers.{layer}.{_LAYER_NAMES[kind]}.{part}'
        if permuted and part == 'weight' and kind in ('attn_q', 'attn_k'):
          heads = (
            config.num_attention_heads
            if kind == 'attn_q'
            else config.num_key_value_heads
          )
          w = dequantize(t, source)
          if w.ndim != 2 or w.shape[0] != heads * config.head_dim:
            raise LeakjaxError(
              f'{source}: tensor {t.name} has shape {w.shape}, expected'
              f' {heads * config.head_dim} rows',
              'the file does not match its own metadata',
            )
          value = unpermute_rows(w, heads)
    if name is None:
      name = t.name
    tensors[name] = dequantize(t, source) if value is None else value
  return tensors


# ----------------------------------------------------------------- config
def config_from_metadata(reader, source: str = 'GGUF') -> llama.LlamaConfig:
  """A :class:`LlamaConfig` from the file's `<architecture>.*` metadata."""
  arch = _meta(reader, 'general.architecture')
  if arch not in ARCHITECTURES:
    raise LeakjaxError(
      f'{source} has general.architecture={arch!r}; leakjax reads'
      f' {", ".join(repr(a) for a in ARCHITECTURES)} GGUF files',
      'use the HF checkpoint of this model, if leakjax reads its family',
    )

  def meta(key, default=None):
    return _meta(reader, f'{arch}.{key}', default)

  def need(key):
    value = meta(key)
    if value is None:
      raise LeakjaxError(
        f'{source} lacks metadata {arch}.{key}',
        'the file is incomplete; re-convert it',
      )
    return value

  if (meta('expert_count') or 0) > 0:
    raise LeakjaxError(
      f'{source} is a mixture-of-experts model',
      'leakjax supports dense Llama models only',
    )
  tensors = {t.name: t for t in reader.tensors}
  rope = _rope_from_metadata(meta, tensors, source)
  if 'token_embd.weight' not in tensors:
    raise LeakjaxError(
      f'{source} has no token_embd.weight tensor',
      'the file is incomplete; re-convert it',
    )
  vocab, hidden = (int(d) for d in reversed(tensors['token_embd.weight'].shape))
  heads = int(need('attention.head_count'))
  head_dim = meta('attention.key_length')
  head_dim = (
    int(head_dim) if head_dim else int(need('embedding_length')) // heads
  )
  rope_dims = meta('rope.dimension_count')
  if rope_dims is not None and int(rope_dims) != head_dim:
    raise LeakjaxError(
      f'{source} rotates {rope_dims} of {head_dim} head dims (partial'
      ' RoPE), which leakjax does not support'
    )
  return llama.LlamaConfig(
    vocab_size=vocab,
    hidden_size=int(need('embedding_length')),
    intermediate_size=int(need('feed_forward_length')),
    num_hidden_layers=int(need('block_count')),
    num_attention_heads=heads,
    num_key_value_heads=int(meta('attention.head_count_kv', heads)),
    head_dim=head_dim,
    rms_norm_eps=float(meta('attention.layer_norm_rms_epsilon', 1e-5)),
    rope_theta=float(meta('rope.freq_base', 10000.0)),
    max_position_embeddings=int(meta('context_length', 2048)),
    tie_word_embeddings='output.weight' not in tensors,
    bos_token_id=_meta(reader, 'tokenizer.ggml.bos_token_id'),
    eos_token_id=_meta(reader, 'tokenizer.ggml.eos_token_id'),
    attention_bias=ARCHITECTURES[arch],
    **rope,
  )


def _rope_from_metadata(meta, tensors, source: str) -> dict[str, Any]:
  """The LlamaConfig RoPE fields: plain, linear scaling (`rope.scaling.*`
  metadata), or per-frequency divisors (a `rope_freqs` tensor; llama.cpp
  writes Llama 3.1's scaling this way). YaRN and LongRoPE are refused."""
  scaling = meta('rope.scaling.type')
  freqs = tensors.get(_ROPE_FREQS)
  if scaling in (None, 'none') and freqs is None:
    return {}
  if scaling == 'linear' and freqs is None:
    factor = float(meta('rope.scaling.factor', 0.0))
    if factor <= 0:
      raise LeakjaxError(
        f'{source} has linear RoPE scaling without a positive'
        ' rope.scaling.factor',
        'the file is incomplete; re-convert it',
      )
    return {'rope_type': 'linear', 'rope_factor': factor}
  if scaling in (None, 'none'):
    factors = dequantize(freqs, source).reshape(-1)
    return {
      'rope_type': 'factors',
      'rope_freq_factors': tuple(float(f) for f in factors),
    }
  raise LeakjaxError(
    f'{source} uses RoPE scaling {scaling!r}'
    + (' with a rope_freqs tensor' if freqs is not None else '')
    + ', which leakjax does not support',
    'leakjax reads plain, linear and Llama 3.1 (rope_freqs) RoPE',
  )


# -------------------------------------------------------------- tokenizer
def _byte_alphabet() -> dict[int, str]:
  """GPT-2's byte -> printable character map of byte-level BPE."""
  printable = [
    *range(ord('!'), ord('~') + 1),
    *range(ord('¡'), ord('¬') + 1),
    *range(ord('®'), ord('ÿ') + 1),
  ]
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


# Pre-tokenizer split patterns by `tokenizer.ggml.pre` (llama.cpp's names).
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"
  r'|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+'
  r'|\s+(?!\S)|\s+'
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r'\p{N}{1,3}', r'\p{N}')
_SPLITS = {
  'llama-bpe': _LLAMA3_SPLIT,
  'llama3': _LLAMA3_SPLIT,
  'llama-v3': _LLAMA3_SPLIT,
  'smaug-bpe': _LLAMA3_SPLIT,
  'qwen2': _QWEN2_SPLIT,
}


# llama.cpp pre types that split off every numeric character (\p{N}) before
# GPT-2's split, like SmolLM's `Digits(individual_digits=True)`.
_DIGITS_THEN_GPT2 = (
  'smollm',
  'starcoder',
  'refact',
  'command-r',
  'codeshell',
  'exaone',
  'minerva',
)


def _pre_tokenizer(pre: str | None):
  """The `tokenizers` pre-tokenizer for a byte-level vocabulary, or None."""
  from tokenizers import Regex, pre_tokenizers  # pylint: disable=g-import-not-at-top

  gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in (None, '', 'default', 'gpt2', 'gpt-2'):
    return gpt2
  if pre in _DIGITS_THEN_GPT2:
    return pre_tokenizers.Sequence(
      [pre_tokenizers.Split(Regex(r'\p{N}'), behavior='isolated'), gpt2]
    )
  if pre in _SPLITS:
    return pre_tokenizers.Sequence(
      [
        pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior='isolated'),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
      ]
    )
  return None


def _byte_level_backend(reader, pre_tokenizer):
  """A byte-level BPE `tokenizers.Tokenizer` from the GGUF vocabulary."""
  from tokenizers import AddedToken, decoders, models  # pylint: disable=g-import-not-at-top
  from tokenizers import Tokenizer as HFTokenizer

  tokens = list(_meta(reader, 'tokenizer.ggml.tokens'))
  kinds = list(_meta(reader, 'tokenizer.ggml.token_type') or [1] * len(tokens))
  merges = _meta(reader, 'tokenizer.ggml.merges')
  if not merges:
    raise LeakjaxError(
      'the GGUF byte-level vocabulary has no merges',
      'the file is incomplete; re-convert it',
    )
  alphabet = _byte_alphabet()
  allowed = set(alphabet.values())

  def spell(token: str) -> str:
    # Tokens are stored in the byte alphabet; respell any that are not.
    if set(token) <= allowed:
      return token
    return ''.join(alphabet[b] for b in token.encode('utf-8'))

  vocab = {spell(tok): i for i, tok in enumerate(tokens)}
  pairs = [tuple(m.split(' ', 1)) for m in merges]
  backend = HFTokenizer(models.BPE(vocab, pairs))
  backend.pre_tokenizer = pre_tokenizer
  backend.decoder = decoders.ByteLevel()
  control = [
    AddedToken(tok, normalized=False, special=True)
    for tok, kind in zip(tokens, kinds)
    if kind == 3 and set(tok) <= allowed
  ]  # 3: CONTROL
  if control:
    backend.add_special_tokens(control)
  user = [
    AddedToken(tok, normalized=False, special=False)
    for tok, kind in zip(tokens, kinds)
    if kind == 4
  ]  # USER_DEFINED
  if user:
    backend.add_tokens(user)
  return backend


def _transformers_backend(path: Path, kind: str, pre: str | None):
  """Falls back on transformers' GGUF tokenizer converter."""
  try:
    from transformers.integrations.gguf import gguf_tokenizer_mapping as tm  # pylint: disable=g-import-not-at-top

    arch, tokenizer_dict, _ = tm.get_gguf_tokenizer(str(path))
    backend, _ = tm.convert_gguf_tokenizer(arch, tokenizer_dict)
    return backend
  except Exception as e:  # ImportError, ValueError, API changes
    raise LeakjaxError(
      f'cannot build the tokenizer of {path} (tokenizer.ggml.model={kind!r},'
      f' pre={pre!r}): {type(e).__name__}: {e}',
      'install a transformers version that reads this GGUF tokenizer',
    ) from None


def tokenizer_from_metadata(reader, path: Path):
  """A :class:`leakjax.tokenization.Tokenizer` from the GGUF metadata."""
  from leakjax.tokenization import Tokenizer  # pylint: disable=g-import-not-at-top

  kind = _meta(reader, 'tokenizer.ggml.model')
  if kind is None or 'tokenizer.ggml.tokens' not in reader.fields:
    logging.warning('%s has no tokenizer metadata; loading without one', path)
    return None
  pre = _meta(reader, 'tokenizer.ggml.pre')
  pre_tokenizer = _pre_tokenizer(pre) if kind == 'gpt2' else None
  if pre_tokenizer is not None:
    backend = _byte_level_backend(reader, pre_tokenizer)
  else:
    backend = _transformers_backend(path, kind, pre)
  return Tokenizer(
    backend,
    bos_id=_meta(reader, 'tokenizer.ggml.bos_token_id'),
    eos_id=_meta(reader, 'tokenizer.ggml.eos_token_id'),
    pad_id=_meta(reader, 'tokenizer.ggml.padding_token_id'),
    unk_id=_meta(reader, 'tokenizer.ggml.unknown_token_id'),
    name=_meta(reader, 'general.name') or path.stem,
  )


# ------------------------------------------------------------------- load
def load_gguf(
  path: str | os.PathLike, *, dtype=jnp.float32
) -> tuple[Model, PyTree]:
  """Loads a llama-architecture GGUF file as a :class:`Model`.

  Args:
    path: the `.gguf` file.
    dtype: parameter dtype (weights are dequantized to float32 first).

  Returns:
    `(model, params)`: a :class:`Model` of family 'llama' with the file's
    tokenizer, and its params.

  Raises:
    LeakjaxError: another architecture, an unsupported quantisation type,
      RoPE scaling other than linear and rope_freqs, or tensors that do not
      match the metadata.
  """
  from leakjax.tokenization import check_vocab  # pylint: disable=g-import-not-at-top

  path = Path(path)
  reader = _reader(path)
  config = config_from_metadata(reader, str(path))
  tensors = hf_tensors(reader, config, str(path))
  params = llama.params_from_hf_tensors(
    tensors, config, dtype=dtype, source=str(path)
  )
  del tensors
  tokenizer = tokenizer_from_metadata(reader, path)
  check_vocab(tokenizer, config.vocab_size, str(path))
  return llama.from_params(config, params, tokenizer)


__all__ = [
  'load_gguf',
  'dequantize',
  'unpermute_rows',
  'hf_tensors',
  'config_from_metadata',
  'tokenizer_from_metadata',
  'ARCHITECTURES',
  'SUPPORTED_TYPES',
]
