"""GPT-2 against transformers' PyTorch GPT2LMHeadModel, plus checkpoint I/O.

Reference models are tiny random HF models built from a config (no network):
their weights are perturbed so that no bias is 0 and no LayerNorm scale is 1,
saved with `save_pretrained` and loaded with `leakjax.models.load`.
"""

import dataclasses
import functools
import json
import math
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as tok_models
from tokenizers import pre_tokenizers

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, llama
from leakjax.models.protocol import get_path
from leakjax.tokenization import Tokenizer, gpt2_tokenizer

VOCAB = 101
N_POSITIONS = 16
BATCH, TIME = 3, 12
LOGITS_ATOL = 1e-5
GRAD_RTOL = 1e-4


def _hf_config(**overrides):
  kwargs = dict(
    vocab_size=VOCAB,
    n_positions=N_POSITIONS,
    n_embd=32,
    n_layer=2,
    n_head=4,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    bos_token_id=None,
    eos_token_id=None,
    attn_implementation='eager',
  )
  return transformers.GPT2Config(**{**kwargs, **overrides})


def _torch_model(seed=0, **overrides):
  torch.manual_seed(seed)
  model = transformers.GPT2LMHeadModel(_hf_config(**overrides))
  with torch.no_grad():  # make biases and LayerNorm params non-trivial
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model.eval()


def _batch(seed=0, batch=BATCH, time=TIME):
  """Random ids and a right-padding mask with rows of different lengths."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (batch, time)).astype(np.int32)
  lengths = np.linspace(time, 2, batch).astype(int)
  mask = (np.arange(time)[None] < lengths[:, None]).astype(np.int32)
  return ids, mask


def _torch_logits(torch_model, ids, mask=None):
  with torch.no_grad():
    out = torch_model(
      input_ids=torch.tensor(ids, dtype=torch.long),
      attention_mask=None if mask is None else torch.tensor(mask),
    )
  return out.logits.numpy()


def _max_diff(a, b, mask=None):
  diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
  if mask is not None:
    diff = diff[np.asarray(mask).astype(bool)]
  return float(diff.max())


@pytest.fixture(scope='module')
def torch_model():
  return _torch_model()


@pytest.fixture(scope='module')
def hf_dir(torch_model, tmp_path_factory):
  directory = tmp_path_factory.mktemp('hf_gpt2')
  torch_model.save_pretrained(directory)
  return directory


@pytest.fixture(scope='module')
def loaded(hf_dir):
  """`(model, params)` of the reference checkpoint."""
  return models.load(hf_dir)


# Jitted model functions: the model is a static (hashable) argument, so each
# shape compiles once for every model of the same config.
@functools.partial(jax.jit, static_argnames=('model',))
def _logits(model, params, ids, mask=None):
  return model.logits(params, ids, mask)


@functools.partial(jax.jit, static_argnames=('model',))
def _decode(model, params, cache, ids):
  return model.decode(params, cache, ids)


@functools.partial(jax.jit, static_argnames=('model',))
def _hidden_states(model, params, ids, mask=None):
  return model.hidden_states(params, ids, mask)


@pytest.fixture
def ckpt(hf_dir, tmp_path):
  """A writable copy of the reference checkpoint."""
  return shutil.copytree(hf_dir, tmp_path / 'ckpt')


def _edit_tensors(directory, edit):
  f = directory / 'model.safetensors'
  tensors = load_file(str(f))
  edit(tensors)
  save_file(tensors, str(f), metadata={'format': 'pt'})


# ----------------------------------------------------------- numerics
@pytest.mark.slow
@pytest.mark.parametrize('padded', [False, True])
@pytest.mark.parametrize('jit', [False, True])
def test_logits_match_transformers(loaded, torch_model, padded, jit):
  model, params = loaded
  ids, mask = _batch()
  mask = mask if padded else None
  fn = functools.partial(_logits, model) if jit else model.logits
  ours = fn(
    params, jnp.asarray(ids), None if mask is None else jnp.asarray(mask)
  )
  assert ours.shape == (BATCH, TIME, VOCAB) and ours.dtype == jnp.float32
  theirs = _torch_logits(torch_model, ids, mask)
  assert _max_diff(ours, theirs, mask) <= LOGITS_ATOL


def test_padding_never_changes_real_positions(loaded):
  model, params = loaded
  ids, mask = _batch()
  other = np.where(mask == 1, ids, (ids + 7) % VOCAB)  # new pad ids
  a = _logits(model, params, jnp.asarray(ids), jnp.asarray(mask))
  b = _logits(model, params, jnp.asarray(other), jnp.asarray(mask))
  assert _max_diff(a, b, mask) == 0.0
  # With right padding, causality alone hides pads from real positions; the
  # mask only changes the padded positions, which never see other pads.
  unmasked = _logits(model, params, jnp.asarray(other))
  assert _max_diff(a, unmasked, mask) <= LOGITS_ATOL
  assert _max_diff(b, unmasked, 1 - mask) > 1e-3


def test_gradients_match_transformers(loaded, torch_model):
  model, params = loaded
  ids, mask = _batch(seed=1)
  loss, grads = jax.jit(jax.value_and_grad(model.loss))(
    params, jnp.asarray(ids), jnp.asarray(mask)
  )

  torch_model.zero_grad()
  logits = torch_model(
    input_ids=torch.tensor(ids, dtype=torch.long),
    attention_mask=torch.tensor(mask),
  ).logits
  logp = torch.log_softmax(logits[:, :-1], dim=-1)
  targets = torch.tensor(ids[:, 1:], dtype=torch.long)
  nll = -logp.gather(-1, targets[..., None])[..., 0]
  weights = torch.tensor(mask[:, 1:], dtype=torch.float32)
  torch_loss = (nll * weights).sum() / weights.sum()
  torch_loss.backward()
  assert abs(float(loss) - torch_loss.item()) <= 1e-5

  torch_grads = dict(torch_model.named_parameters())
  specs = gpt2.hf_name_map(model.config)
  assert set(specs) == set(torch_grads)  # every parameter is compared
  for name, spec in specs.items():
    theirs = spec.to_flax(torch_grads[name].grad.numpy())
    ours = np.asarray(get_path(grads, spec.path))
    scale = max(float(np.abs(theirs).max()), 1e-12)
    assert _max_diff(ours, theirs) / scale <= GRAD_RTOL, name


def test_hidden_states_match_transformers(loaded, torch_model):
  model, params = loaded
  ids, mask = _batch(seed=2)
  raw_blocks = []  # each block's output, before HF applies ln_f to the last
  hooks = [
    block.register_forward_hook(
      lambda m, i, out: raw_blocks.append(
        (out[0] if isinstance(out, tuple) else out).detach().numpy()
      )
    )
    for block in torch_model.transformer.h
  ]
  try:
    with torch.no_grad():
      out = torch_model(
        input_ids=torch.tensor(ids, dtype=torch.long),
        attention_mask=torch.tensor(mask),
        output_hidden_states=True,
      )
  finally:
    for h in hooks:
      h.remove()
  theirs = [h.numpy() for h in out.hidden_states]
  hs = _hidden_states(model, params, jnp.asarray(ids), jnp.asarray(mask))
  n_layer = model.config.n_layer
  assert model.num_layers == n_layer
  assert hs.shape == (n_layer + 1, BATCH, TIME, model.hidden_size)
  assert model.hidden_size == model.config.hidden_size
  assert len(theirs) == n_layer + 1
  for i in range(n_layer):  # HF's entries 0..n_layer-1 are raw
    assert _max_diff(hs[i], theirs[i], mask) <= LOGITS_ATOL, i
  for i in range(n_layer):
    assert _max_diff(hs[i + 1], raw_blocks[i], mask) <= LOGITS_ATOL, i
  # HF's last entry has ln_f applied; ours does not.
  ln_f = params['ln_f']
  x = np.asarray(hs[-1], np.float64)
  normed = (x - x.mean(-1, keepdims=True)) / np.sqrt(
    x.var(-1, keepdims=True) + model.config.layer_norm_epsilon
  ) * np.asarray(ln_f['scale']) + np.asarray(ln_f['bias'])
  assert _max_diff(normed, theirs[-1], mask) <= LOGITS_ATOL
  logits = _logits(model, params, jnp.asarray(ids), jnp.asarray(mask))
  head = jax.jit(model.lm_head)(params, hs[-1])
  assert _max_diff(head, logits) <= 1e-6


# ----------------------------------------------------------- decoding
@pytest.mark.slow
@pytest.mark.parametrize('jit', [False, True])
def test_decode_matches_logits(loaded, jit):
  model, params = loaded
  ids, _ = _batch(seed=3)
  ids = jnp.asarray(ids)
  full = _logits(model, params, ids)
  decode = functools.partial(_decode, model) if jit else model.decode
  cache = model.init_cache(params, BATCH, TIME + 2)
  logits, cache = decode(params, cache, ids[:, :3])
  pieces = [logits]
  for t in range(3, TIME):
    logits, cache = decode(params, cache, ids[:, t : t + 1])
    pieces.append(logits)
  assert np.array_equal(cache.index, np.full(BATCH, TIME))
  assert _max_diff(jnp.concatenate(pieces, axis=1), full) <= LOGITS_ATOL


def test_decode_rows_at_different_positions(loaded):
  model, params = loaded
  ids, _ = _batch(seed=4)
  ids = jnp.asarray(ids)
  _, short = _decode(
    model, params, model.init_cache(params, BATCH, TIME + 2), ids[:, :3]
  )
  _, long = _decode(
    model, params, model.init_cache(params, BATCH, TIME + 2), ids[:, :5]
  )
  # Row 1 from the 5-token prefill, rows 0 and 2 from the 3-token one.
  take_long = jnp.arange(BATCH) == 1
  cache = jax.tree.map(
    lambda a, b: jnp.where(
      take_long.reshape((-1,) + (1,) * (a.ndim - 1)), b, a
    ),
    short,
    long,
  )
  assert cache.index.tolist() == [3, 5, 3]
  positions = jnp.array([3, 5, 3])
  step = ids[jnp.arange(BATCH), positions][:, None]  # [batch, 1]
  logits, cache = _decode(model, params, cache, step)
  full = _logits(model, params, ids)
  expected = full[jnp.arange(BATCH), positions]  # [batch, vocab]
  assert _max_diff(logits[:, 0], expected) <= LOGITS_ATOL
  assert cache.index.tolist() == [4, 6, 4]


def test_cache_reorders_like_beams(loaded):
  model, params = loaded
  ids, _ = _batch(seed=5)
  ids = jnp.asarray(ids)
  cache = model.init_cache(params, BATCH, TIME + 2)
  for leaf in jax.tree.leaves(cache):
    assert leaf.shape[0] == BATCH
  _, cache = _decode(model, params, cache, ids[:, :3])
  order = jnp.array([2, 0, 0])
  cache = jax.tree.map(lambda x: x[order], cache)
  logits, _ = _decode(model, params, cache, ids[order, 3:4])
  full = _logits(model, params, ids[order])
  assert _max_diff(logits[:, 0], full[:, 3]) <= LOGITS_ATOL


# ---------------------------------------------------- checkpoint I/O
def test_save_loads_in_transformers_and_leakjax(loaded, tmp_path):
  model, params = loaded
  ids, mask = _batch(seed=6)
  models.save(model, params, tmp_path / 'out')
  config = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert config['model_type'] == 'gpt2'
  assert config['architectures'] == ['GPT2LMHeadModel']
  reloaded_torch = transformers.GPT2LMHeadModel.from_pretrained(
    tmp_path / 'out'
  ).eval()
  ours = _logits(model, params, jnp.asarray(ids), jnp.asarray(mask))
  theirs = _torch_logits(reloaded_torch, ids, mask)
  assert _max_diff(ours, theirs, mask) <= LOGITS_ATOL
  again, again_params = models.load(tmp_path / 'out')
  assert again.config == model.config
  assert again == model and hash(again) == hash(model)
  jax.tree.map(np.testing.assert_array_equal, again_params, params)


def test_tokenizer_is_saved_and_loaded(tmp_path):
  words = ['<unk>', '<eos>', 'the', 'cat', 'sat']
  backend = HFTokenizer(
    tok_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>')
  )
  backend.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer = Tokenizer(backend, eos_id=1, unk_id=0, name='five')
  config = gpt2.GPT2Config.tiny(vocab_size=VOCAB, n_layer=1)
  model, params = gpt2.init_model(
    config, key=jax.random.key(0), tokenizer=tokenizer
  )
  models.save(model, params, tmp_path)
  assert (tmp_path / 'tokenizer.json').is_file()
  again, _ = models.load(tmp_path)
  assert again.tokenizer.encode('the cat sat') == [2, 3, 4]
  assert again.tokenizer.eos_id == 1
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
  assert hf_tokenizer('the cat sat')['input_ids'] == [2, 3, 4]


def test_untied_head(tmp_path):
  torch_model = _torch_model(seed=7, tie_word_embeddings=False)
  torch_model.save_pretrained(tmp_path / 'hf')
  model, params = models.load(tmp_path / 'hf')
  assert not model.config.tie_word_embeddings
  assert not model.tie_word_embeddings
  assert model.paths.lm_head == ('lm_head', 'kernel')
  head = get_path(params, model.paths.lm_head)
  assert head.shape == (32, VOCAB)
  assert not np.allclose(head.T, model.word_embeddings(params))
  ids, mask = _batch(seed=7)
  ours = model.logits(params, jnp.asarray(ids), jnp.asarray(mask))
  assert (
    _max_diff(ours, _torch_logits(torch_model, ids, mask), mask) <= LOGITS_ATOL
  )
  models.save(model, params, tmp_path / 'out')
  reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / 'out')
  assert (
    _max_diff(ours, _torch_logits(reloaded.eval(), ids, mask), mask)
    <= LOGITS_ATOL
  )


def test_names_without_transformer_prefix(ckpt, loaded):
  model, params = loaded

  def strip(tensors):
    for name in list(tensors):
      tensors[name.removeprefix('transformer.')] = tensors.pop(name)

  _edit_tensors(ckpt, strip)
  assert 'wte.weight' in load_file(str(ckpt / 'model.safetensors'))
  again, again_params = models.load(ckpt)
  assert again == model
  jax.tree.map(np.testing.assert_array_equal, again_params, params)


def test_sharded_checkpoint(torch_model, loaded, tmp_path):
  model, params = loaded
  torch_model.save_pretrained(tmp_path, max_shard_size='20KB')
  assert (tmp_path / 'model.safetensors.index.json').is_file()
  assert not (tmp_path / 'model.safetensors').exists()
  again, again_params = models.load(tmp_path)
  assert again == model
  jax.tree.map(np.testing.assert_array_equal, again_params, params)


def test_pytorch_bin_loads_with_weights_only(
  torch_model, loaded, hf_dir, tmp_path
):
  model, params = loaded
  shutil.copy(hf_dir / 'config.json', tmp_path / 'config.json')
  # state_dict() also holds the tied lm_head.weight.
  assert 'lm_head.weight' in torch_model.state_dict()
  torch.save(torch_model.state_dict(), tmp_path / 'pytorch_model.bin')
  again, again_params = models.load(tmp_path)
  assert again == model
  jax.tree.map(np.testing.assert_array_equal, again_params, params)


def test_bfloat16(hf_dir, loaded):
  model, params = loaded
  ids, mask = _batch(seed=8)
  low, low_params = models.load(hf_dir, dtype=jnp.bfloat16)
  assert low.config.dtype == 'bfloat16'
  assert low != model  # another compute dtype, another static model
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(low_params))
  ref = _logits(model, params, jnp.asarray(ids), jnp.asarray(mask))
  out = _logits(low, low_params, jnp.asarray(ids), jnp.asarray(mask))
  assert out.dtype == jnp.float32
  assert _max_diff(out, ref, mask) <= 0.05 * float(jnp.abs(ref).max())
  cache = low.init_cache(low_params, BATCH, 4)
  assert cache.keys[0].dtype == jnp.bfloat16


# ------------------------------------------------------- init, config
def test_init_model_follows_gpt2_init():
  config = gpt2.GPT2Config.tiny()
  model, params = gpt2.init_model(config, key=jax.random.key(0))
  p = jax.tree.map(np.asarray, params)
  assert np.std(p['wte']['embedding']) == pytest.approx(0.02, rel=0.1)
  assert np.std(p['h_0']['attn']['c_attn']['kernel']) == (
    pytest.approx(0.02, rel=0.1)
  )
  residual_std = 0.02 / math.sqrt(2 * config.n_layer)
  for block in ('attn', 'mlp'):
    assert np.std(p['h_1'][block]['c_proj']['kernel']) == (
      pytest.approx(residual_std, rel=0.1)
    )
  assert np.abs(p['h_0']['mlp']['c_fc']['bias']).max() == 0.0
  assert np.abs(p['ln_f']['scale'] - 1).max() == 0.0
  assert 'lm_head' not in p
  assert model.family == 'gpt2' and model.paths.lm_head is None
  assert model.config.max_length == config.n_positions
  assert model.max_length == config.n_positions
  assert (model.vocab_size, model.hidden_size, model.num_layers) == (
    config.vocab_size,
    config.n_embd,
    config.n_layer,
  )
  assert model.tie_word_embeddings
  # The weights are only in `params`; the model is static and hashable.
  assert not hasattr(model, 'params') and not hasattr(model, 'module')
  assert hash(model) == hash(gpt2.make_model(model.config))


# ------------------------------------------- static model, compile once
def _tiny_config(family, **overrides):
  if family == 'gpt2':
    return gpt2.GPT2Config.tiny(vocab_size=VOCAB, **overrides)
  return llama.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=N_POSITIONS,
    **overrides,
  )


_FAMILIES = {'gpt2': gpt2, 'llama': llama}


@pytest.mark.slow
@pytest.mark.parametrize('family', ['gpt2', 'llama'])
def test_equal_configs_give_equal_models_that_compile_once(family):
  lib = _FAMILIES[family]
  config = _tiny_config(family)
  # Two models from equal (not identical) configs.
  a = lib.make_model(config)
  b = lib.make_model(dataclasses.replace(config))
  assert a is not b and a.config is not b.config
  assert a == b and hash(a) == hash(b)
  # The tokenizer is host-side, not part of the model's identity.
  assert a.replace(tokenizer=object()) == a
  # init_model hands back an equal model beside its params.
  m1, p1 = lib.init_model(config, key=jax.random.key(1))
  m2, p2 = lib.init_model(dataclasses.replace(config), key=jax.random.key(2))
  assert m1 == m2 == a and hash(m1) == hash(m2) == hash(a)
  assert jax.tree.structure(p1) == jax.tree.structure(p2)
  assert all(
    x.shape == y.shape and x.dtype == y.dtype
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2))
  )
  assert not np.array_equal(m1.word_embeddings(p1), m2.word_embeddings(p2))
  # Another config (here of the same param shapes) is another model, and
  # another static argument.
  eps = 'layer_norm_epsilon' if family == 'gpt2' else 'rms_norm_eps'
  other_config = _tiny_config(family, **{eps: 1e-3})
  other, other_params = lib.init_model(other_config, key=jax.random.key(3))
  assert other != a

  traces = []
  chex.clear_trace_counter()  # chex counts per definition site

  @functools.partial(jax.jit, static_argnames=('model',))
  @chex.assert_max_traces(n=2)  # m1 (= m2) and `other`
  def loss(model, params, ids):
    traces.append(model)  # runs once per trace, never per call
    return model.loss(params, ids)

  ids = jnp.asarray(_batch(seed=9)[0])
  loss1 = loss(m1, p1, ids)
  loss2 = loss(m2, p2, ids)  # equal model, new params of the same shapes
  assert traces == [m1]  # compiled once
  assert float(loss1) != float(loss2)  # ... and used the new params
  np.testing.assert_allclose(loss1, m1.loss(p1, ids), rtol=1e-5)
  np.testing.assert_allclose(loss2, m2.loss(p2, ids), rtol=1e-5)
  loss(other, other_params, ids)  # a different model does trace again
  assert traces == [m1, other]


def test_small_preset_has_124m_params():
  abstract = jax.eval_shape(
    lambda: gpt2._init_params(gpt2.GPT2Config.small(), jax.random.key(0))
  )
  assert sum(x.size for x in jax.tree.leaves(abstract)) == 124_439_808


def test_config_round_trips_through_hf_dict():
  config = gpt2.GPT2Config.tiny(
    tie_word_embeddings=False, n_inner=48, activation_function='gelu'
  )
  assert gpt2.GPT2Config.from_hf_dict(config.to_hf_dict()) == config
  hf_default = transformers.GPT2Config().to_dict()
  assert gpt2.GPT2Config.from_hf_dict(hf_default) == gpt2.GPT2Config.small()


# ------------------------------------------------------------ errors
def test_missing_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop('transformer.h.1.mlp.c_fc.bias'))
  with pytest.raises(
    LeakjaxError,
    match=r'missing 1 tensors: transformer'
    r'\.h\.1\.mlp\.c_fc\.bias',
  ):
    models.load(ckpt)


def test_extra_tensor(ckpt):
  _edit_tensors(
    ckpt,
    lambda t: t.update(
      {'transformer.h.0.attn.q_proj.weight': np.zeros((2, 2), np.float32)}
    ),
  )
  with pytest.raises(
    LeakjaxError,
    match=r'does not use: transformer\.h\.0'
    r'\.attn\.q_proj\.weight',
  ):
    models.load(ckpt)


def test_misshaped_tensor(ckpt):
  _edit_tensors(
    ckpt,
    lambda t: t.update(
      {'transformer.wpe.weight': np.zeros((8, 32), np.float32)}
    ),
  )
  with pytest.raises(LeakjaxError, match=r'wpe\.weight has shape \(8, 32\)'):
    models.load(ckpt)


def test_nan_tensor(ckpt):
  def poison(tensors):
    tensors['transformer.h.0.ln_2.bias'][3] = np.nan

  _edit_tensors(ckpt, poison)
  with pytest.raises(LeakjaxError, match=r'ln_2\.bias contains NaN'):
    models.load(ckpt)


def test_tied_head_that_differs_from_wte(ckpt):
  _edit_tensors(
    ckpt,
    lambda t: t.update({'lm_head.weight': t['transformer.wte.weight'] + 1.0}),
  )
  with pytest.raises(LeakjaxError, match='differs from wte'):
    models.load(ckpt)


def test_directory_without_weights(ckpt):
  (ckpt / 'model.safetensors').unlink()
  with pytest.raises(LeakjaxError, match='has no weights'):
    models.load(ckpt)


def test_nonexistent_path(tmp_path):
  with pytest.raises(LeakjaxError, match='does not exist'):
    models.load(tmp_path / 'no' / 'such' / 'dir')


def test_tokenizer_larger_than_vocab(ckpt):
  (ckpt / 'tokenizer.json').write_text(gpt2_tokenizer().backend.to_str())
  with pytest.raises(
    LeakjaxError, match=f'tokenizer has 50257 tokens .* {VOCAB} embedding'
  ):
    models.load(ckpt)


def test_sequence_longer_than_context(loaded):
  model, params = loaded
  ids = jnp.zeros((1, N_POSITIONS + 1), jnp.int32)
  match = f'{N_POSITIONS + 1} tokens but the model context is {N_POSITIONS}'
  with pytest.raises(LeakjaxError, match=match):
    model.logits(params, ids)
  with pytest.raises(LeakjaxError, match=match):
    _hidden_states(model, params, ids)
  with pytest.raises(LeakjaxError, match='decoding cache'):
    model.init_cache(params, 1, N_POSITIONS + 1)
  cache = model.init_cache(params, 1, 4).replace(
    index=jnp.array([3], jnp.int32)
  )
  with pytest.raises(LeakjaxError, match='decoding cache after this step'):
    model.decode(params, cache, ids[:, :2])


def test_bad_config():
  with pytest.raises(LeakjaxError, match='not divisible'):
    gpt2.GPT2Config.tiny(n_embd=30, n_head=4)
  with pytest.raises(LeakjaxError, match='not supported'):
    gpt2.GPT2Config.tiny(activation_function='mish2')
