"""Llama vs transformers' LlamaForCausalLM on tiny random models."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from torch_reference import torch_lm_loss_backward

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import hf_checkpoint, llama
from leakjax.models.protocol import get_path

VOCAB, MAX_LEN = 200, 32


def _hf_config(tied: bool) -> transformers.LlamaConfig:
  return transformers.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=5000.0,
    rms_norm_eps=1e-5,
    max_position_embeddings=MAX_LEN,
    tie_word_embeddings=tied,
    attn_implementation='eager',
  )


def _randomize(hf_model: torch.nn.Module, seed: int) -> None:
  """Weights large enough that attention and norms matter (HF init is 0.02)."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in hf_model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      p.copy_(1.0 + 0.1 * noise if 'norm' in name else 0.1 * noise)


@pytest.fixture(scope='module')
def make_pair(tmp_path_factory):
  """tied -> (our model, its params, HF model, checkpoint dir), same weights."""
  cache = {}

  def make(tied: bool):
    if tied not in cache:
      torch.manual_seed(0)
      hf_model = transformers.LlamaForCausalLM(_hf_config(tied)).eval()
      _randomize(hf_model, seed=1)
      directory = tmp_path_factory.mktemp('hf_llama')
      hf_model.save_pretrained(directory)
      cache[tied] = (*models.load(directory), hf_model, directory)
    return cache[tied]

  return make


@pytest.fixture(params=[False, True], ids=['untied', 'tied'])
def pair(request, make_pair):
  """Both head variants (for tests where tying matters)."""
  return make_pair(request.param)


@pytest.fixture
def untied(make_pair):
  """The untied model only (tests where tying does not matter)."""
  return make_pair(False)


# Jitted model functions: the model is a static (hashable) argument, so each
# shape compiles once for every model of the same config.
@functools.partial(jax.jit, static_argnames=('model',))
def _logits(model, params, ids, mask=None):
  return model.logits(params, ids, mask)


@functools.partial(jax.jit, static_argnames=('model',))
def _hidden_states(model, params, ids, mask=None):
  return model.hidden_states(params, ids, mask)


@functools.partial(jax.jit, static_argnames=('model',))
def _decode(model, params, cache, ids):
  return model.decode(params, cache, ids)


def _ids(batch, time, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(0, VOCAB, (batch, time)).astype(np.int32)


def _hf_logits(hf_model, ids, mask=None):
  with torch.no_grad():
    out = hf_model(
      torch.tensor(ids, dtype=torch.long),
      attention_mask=None if mask is None else torch.tensor(mask),
      output_hidden_states=True,
    )
  return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


def test_config_round_trip():
  config = llama.LlamaConfig.from_hf_dict(_hf_config(False).to_dict())
  assert config.rope_theta == 5000.0 and config.num_key_value_heads == 2
  assert config.head_dim == 16 and not config.tie_word_embeddings
  assert llama.LlamaConfig.from_hf_dict(config.to_hf_dict()) == config
  # transformers 4.x spelling: top-level rope_theta, rope_scaling None.
  legacy = dict(config.to_hf_dict())
  del legacy['rope_parameters']
  legacy['rope_theta'] = 123.0
  assert llama.LlamaConfig.from_hf_dict(legacy).rope_theta == 123.0


def test_loaded_params_and_paths(pair):
  ours, params, hf_model, _ = pair
  state = hf_model.state_dict()
  for name, spec in llama.hf_name_map(ours.config).items():
    np.testing.assert_array_equal(
      spec.to_hf(np.asarray(get_path(params, spec.path))),
      state[name].numpy(),
      err_msg=name,
    )
  assert ours.family == 'llama'
  assert ours.word_embeddings(params).shape == (VOCAB, 64)
  assert (ours.vocab_size, ours.hidden_size, ours.num_layers) == (VOCAB, 64, 2)
  assert ours.max_length == MAX_LEN
  assert ours.tie_word_embeddings == ours.config.tie_word_embeddings
  if ours.config.tie_word_embeddings:
    assert ours.paths.lm_head is None
  else:
    assert get_path(params, ours.paths.lm_head).shape == (64, VOCAB)
  # The model holds no weights; loading again gives an equal model.
  assert not hasattr(ours, 'params') and not hasattr(ours, 'module')
  assert ours == llama.make_model(ours.config)


@pytest.mark.slow
@pytest.mark.parametrize(
  'tied,jit',
  [(False, False), (False, True), (True, True)],
  ids=['untied-eager', 'untied-jit', 'tied-jit'],
)
def test_logits_and_hidden_states_match_transformers(make_pair, tied, jit):
  ours, params, hf_model, _ = make_pair(tied)
  ids = _ids(2, 11)
  want, want_hidden = _hf_logits(hf_model, ids)
  logits_fn = functools.partial(_logits, ours) if jit else ours.logits
  got = np.asarray(logits_fn(params, ids))
  assert got.dtype == np.float32
  diff = np.abs(got - want).max()
  assert diff <= 1e-5, diff
  hidden = np.asarray(ours.hidden_states(params, ids))
  assert hidden.shape == (3, 2, 11, 64)
  # HF's last hidden state is after the final norm; ours is before it.
  for i in range(2):
    np.testing.assert_allclose(hidden[i], want_hidden[i], atol=1e-5)
  np.testing.assert_allclose(
    np.asarray(ours.lm_head(params, hidden[-1])), got, atol=1e-5
  )


def test_padding_mask_matches_transformers_and_isolates_padding(untied):
  ours, params, hf_model, _ = untied
  ids = _ids(2, 9, seed=3)
  mask = np.ones_like(ids)
  mask[1, 5:] = 0
  want, _ = _hf_logits(hf_model, ids, mask)
  got = np.asarray(ours.logits(params, ids, mask))
  real = mask.astype(bool)
  diff = np.abs(got - want)[real].max()
  assert diff <= 1e-5, diff
  # Padding positions never influence real ones.
  other = ids.copy()
  other[1, 5:] = (other[1, 5:] + 7) % VOCAB
  got2 = np.asarray(ours.logits(params, other, mask))
  np.testing.assert_array_equal(got2[real], got[real])


@pytest.mark.slow
def test_gradients_match_transformers(pair):
  ours, params, hf_model, _ = pair
  ids = _ids(2, 10, seed=5)
  torch_loss = torch_lm_loss_backward(hf_model, ids, VOCAB)
  our_loss, grads = jax.value_and_grad(ours.loss)(params, ids)
  assert abs(float(our_loss) - torch_loss) <= 1e-5
  hf_params = dict(hf_model.named_parameters())
  worst = 0.0
  for name, spec in llama.hf_name_map(ours.config).items():
    want = hf_params[name].grad.numpy()
    got = spec.to_hf(np.asarray(get_path(grads, spec.path)))
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    worst = max(worst, rel)
    assert rel <= 1e-4, (name, rel)
  assert worst > 0  # the comparison saw real gradients


@pytest.mark.slow
def test_decode_matches_full_forward_eager(untied):
  ours, params, _, _ = untied
  ids = _ids(3, 6, seed=7)
  full = np.asarray(ours.logits(params, ids))
  cache = ours.init_cache(params, batch_size=3, max_length=8)
  assert all(x.shape[0] == 3 for x in jax.tree.leaves(cache))
  first, cache = ours.decode(params, cache, ids[:, :5])
  second, cache = ours.decode(params, cache, ids[:, 5:])
  np.testing.assert_allclose(
    np.concatenate([first, second], 1), full, atol=1e-5
  )
  np.testing.assert_array_equal(np.asarray(cache.index), [6, 6, 6])


@pytest.mark.slow
def test_decode_matches_full_forward_jit(pair):
  ours, params, _, _ = pair
  ids = _ids(3, 12, seed=7)
  full = np.asarray(_logits(ours, params, ids))
  # compiles for t=5 and t=1 only
  decode = functools.partial(_decode, ours)
  cache = ours.init_cache(params, batch_size=3, max_length=16)
  pieces = []
  for start, stop in [(0, 5), (5, 6), (6, 11), (11, 12)]:
    step, cache = decode(params, cache, ids[:, start:stop])
    pieces.append(np.asarray(step))
  np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(cache.index), [12, 12, 12])

  # Reordering the batch (as beam search does) reorders the results.
  order = np.array([2, 0, 1])
  cache = ours.init_cache(params, batch_size=3, max_length=16)
  _, prefix = decode(params, cache, ids[:, :5])
  reordered = jax.tree.map(lambda x: x[order], prefix)
  step, _ = decode(params, reordered, ids[order, 5:6])
  np.testing.assert_allclose(np.asarray(step), full[order, 5:6], atol=1e-5)

  # Rows may sit at different positions: the index is per row.
  index = np.array([5, 4, 3], np.int32)
  rows = np.arange(3)
  step, cache = decode(
    params,
    prefix.replace(index=jnp.asarray(index)),
    ids[rows, index][:, None],
  )
  np.testing.assert_allclose(
    np.asarray(step)[:, 0], full[rows, index], atol=1e-5
  )
  np.testing.assert_array_equal(np.asarray(cache.index), index + 1)


def test_save_load_round_trip_with_tokenizer(pair, tmp_path):
  from tokenizers import Tokenizer as HFTokenizer
  from tokenizers import models as tok_models
  from tokenizers import pre_tokenizers

  from leakjax.tokenization import Tokenizer

  ours, params, _, _ = pair
  vocab = {f'w{i}': i for i in range(VOCAB - 3)}
  vocab.update({'<unk>': VOCAB - 3, '<s>': VOCAB - 2, '</s>': VOCAB - 1})
  backend = HFTokenizer(tok_models.WordLevel(vocab, unk_token='<unk>'))
  backend.pre_tokenizer = pre_tokenizers.Whitespace()
  tok = Tokenizer(backend, bos_id=VOCAB - 2, eos_id=VOCAB - 1, name='words')
  models.save(ours.replace(tokenizer=tok), params, tmp_path)
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['model_type'] == 'llama'

  hf_model = transformers.LlamaForCausalLM.from_pretrained(
    tmp_path, dtype=torch.float32, attn_implementation='eager'
  ).eval()
  ids = _ids(2, 7, seed=11)
  want, _ = _hf_logits(hf_model, ids)
  got = np.asarray(ours.logits(params, ids))
  assert np.abs(got - want).max() <= 1e-5

  again, again_params = models.load(tmp_path)
  assert again.config == ours.config
  assert again == ours and hash(again) == hash(ours)
  for a, b in zip(jax.tree.leaves(again_params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert again.tokenizer.encode('w5 w17 zzz') == [5, 17, VOCAB - 3]
  assert (again.tokenizer.bos_id, again.tokenizer.eos_id) == (
    VOCAB - 2,
    VOCAB - 1,
  )


def _rewrite(src, dst, edit_tensors=None, edit_config=None):
  tensors = dict(hf_checkpoint.read_tensors(src))
  config = hf_checkpoint.read_config(src)
  if edit_tensors:
    edit_tensors(tensors)
  if edit_config:
    edit_config(config)
  hf_checkpoint.write_checkpoint(dst, tensors, config)
  return dst


@pytest.mark.parametrize(
  'edit,message',
  [
    (lambda t: t.pop('model.layers.1.mlp.up_proj.weight'), 'missing 1'),
    (lambda t: t.update(extra=np.zeros(3, np.float32)), 'does not use'),
    (
      lambda t: t.update({'model.norm.weight': np.ones(63, np.float32)}),
      'model.norm.weight has shape',
    ),
    (
      lambda t: t['model.layers.0.self_attn.k_proj.weight'].__setitem__(
        (0, 0), np.nan
      ),
      'NaN',
    ),
  ],
)
def test_bad_tensors_raise(untied, tmp_path, edit, message):
  _, _, _, directory = untied
  bad = _rewrite(directory, tmp_path, edit_tensors=edit)
  with pytest.raises(LeakjaxError, match=message):
    models.load(bad)


@pytest.mark.parametrize(
  'key,value,message',
  [
    ('rope_scaling', {'rope_type': 'yarn', 'factor': 2.0}, 'yarn'),
    (
      'rope_parameters',
      {'rope_type': 'dynamic', 'factor': 8.0, 'rope_theta': 5e5},
      'dynamic',
    ),
    (
      'rope_parameters',
      {'rope_type': 'llama3', 'factor': 8.0, 'rope_theta': 5e5},
      'original_max_position_embeddings',
    ),
    ('mlp_bias', True, 'mlp_bias'),
    ('hidden_act', 'relu2', 'relu2'),
  ],
)
def test_unsupported_config_raises(untied, tmp_path, key, value, message):
  _, _, _, directory = untied
  bad = _rewrite(
    directory, tmp_path, edit_config=lambda c: c.__setitem__(key, value)
  )
  with pytest.raises(LeakjaxError, match=message):
    models.load(bad)


def test_too_long_and_out_of_range_inputs_raise(untied):
  ours, params, _, _ = untied
  too_long = _ids(1, MAX_LEN + 1)
  with pytest.raises(LeakjaxError, match='context is 32'):
    ours.logits(params, too_long)
  with pytest.raises(LeakjaxError, match='context is 32'):
    _hidden_states(ours, params, too_long)
  with pytest.raises(LeakjaxError, match='context is 32'):
    ours.init_cache(params, 1, MAX_LEN + 1)
  cache = ours.init_cache(params, 1, 4)
  with pytest.raises(LeakjaxError, match='decoding cache'):
    ours.decode(params, cache, _ids(1, 5))
  _, cache = ours.decode(params, cache, _ids(1, 3))
  with pytest.raises(LeakjaxError, match='decoding cache'):
    ours.decode(params, cache, _ids(1, 2))
  with pytest.raises(LeakjaxError, match='out of range'):
    ours.logits(params, np.array([[1, VOCAB]], np.int32))


@pytest.mark.slow
def test_init_model_and_bfloat16(untied):
  ours, params, _, _ = untied
  config = ours.config
  fresh, fresh_params = llama.init_model(
    config, key=jax.random.key(0), dtype=jnp.bfloat16
  )
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(fresh_params))
  assert jax.tree.structure(fresh_params) == jax.tree.structure(params)
  # The compute dtype is part of the model; the config alone is not.
  assert fresh == llama.make_model(config, dtype=jnp.bfloat16)
  assert fresh != ours and fresh.config == ours.config
  # The test model's weights in bfloat16 give nearly the fp32 logits.
  half, half_params = llama.from_params(
    config, jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  )
  assert half == fresh
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(half_params))
  ids = _ids(2, 8)
  logits = _logits(half, half_params, ids)
  assert logits.dtype == jnp.float32 and logits.shape == (2, 8, VOCAB)
  want = np.asarray(_logits(ours, params, ids))
  err = np.abs(np.asarray(logits) - want).max() / want.std()
  assert 0 < err < 0.1, err
