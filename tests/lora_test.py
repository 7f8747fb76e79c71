"""Tests of the LoRA adapters (Hu et al. 2021; Wan et al. 2024, App. 7.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import lora
from leakjax import train as train_lib
from leakjax.errors import LeakjaxError
from leakjax.models import llama
from leakjax.models.protocol import lm_loss


def tiny():
  config = llama.LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    tie_word_embeddings=True,
  )
  model, params = llama.init_model(config, key=jax.random.key(0))
  # Larger token embeddings than normal(0.02): with the head tied and
  # frozen, LoRA on attention can then move the logits far enough to fit.
  params['embed']['embedding'] = params['embed']['embedding'] * 25.0
  return model, params


def batch():
  ids = jax.random.randint(jax.random.key(1), (4, 9), 0, 64)
  mask = jnp.ones((4, 9), jnp.int32).at[2, 6:].set(0)
  return lora.Batch(ids, mask)


@pytest.mark.slow
def test_targets_are_the_attention_projections_and_start_is_the_model():
  model, params = tiny()
  cfg = lora.LoraConfig(rank=2)
  paths = lora.target_paths(params, cfg)
  assert paths == [
    f'layers_{i}/attn/{p}/kernel'
    for i in range(2)
    for p in ('k_proj', 'o_proj', 'q_proj', 'v_proj')
  ]
  adapters = lora.init(params, cfg, key=jax.random.key(2))
  assert adapters['layers_0/attn/k_proj/kernel']['a'].shape == (16, 2)
  assert adapters['layers_0/attn/k_proj/kernel']['b'].shape == (2, 8)
  # b = 0: the merged model is the pretrained one, exactly.
  merged = lora.merge(params, adapters, cfg)
  jax.tree.map(np.testing.assert_array_equal, merged, params)


def test_merge_adds_the_scaled_low_rank_product_and_nothing_else():
  _, params = tiny()
  cfg = lora.LoraConfig(rank=3, alpha=6.0)
  adapters = lora.init(params, cfg, key=jax.random.key(2))
  rng = np.random.default_rng(0)
  adapters = {
    k: {'a': v['a'], 'b': jnp.asarray(rng.normal(size=v['b'].shape))}
    for k, v in adapters.items()
  }
  merged = lora.merge(params, adapters, cfg)
  q = params['layers_1']['attn']['q_proj']['kernel']
  ad = adapters['layers_1/attn/q_proj/kernel']
  want = np.asarray(q) + 2.0 * np.asarray(ad['a']) @ np.asarray(ad['b'])
  np.testing.assert_allclose(
    merged['layers_1']['attn']['q_proj']['kernel'], want, rtol=1e-5, atol=1e-6
  )
  np.testing.assert_array_equal(
    merged['layers_1']['mlp']['up_proj']['kernel'],
    params['layers_1']['mlp']['up_proj']['kernel'],
  )
  np.testing.assert_array_equal(
    merged['embed']['embedding'], params['embed']['embedding']
  )


@pytest.mark.slow
def test_adapter_gradient_is_the_chain_rule_of_the_kernel_gradient():
  # Independent reference: at b = 0, dL/db = scale * a^T dL/dW, with dL/dW
  # the full model's gradient; dL/da = 0.
  model, params = tiny()
  cfg = lora.LoraConfig(rank=2, alpha=4.0)
  adapters = lora.init(params, cfg, key=jax.random.key(3))
  b = batch()
  grads = jax.grad(lambda a: lora.LoraLoss(model, cfg)(a, params, b, None)[0])(
    adapters
  )
  full = jax.grad(lambda p: lm_loss(model.logits(p, b.ids, b.mask), *b))(params)
  for path in lora.target_paths(params, cfg):
    layer, _, proj, _ = path.split('/')
    g_w = np.asarray(full[layer]['attn'][proj]['kernel'])
    a = np.asarray(adapters[path]['a'])
    np.testing.assert_allclose(
      grads[path]['b'], cfg.scale * a.T @ g_w, rtol=1e-4, atol=1e-7
    )
    assert not np.any(np.asarray(grads[path]['a']))


@pytest.mark.slow
def test_fit_trains_only_the_adapters_and_lowers_the_loss():
  model, params = tiny()
  cfg = lora.LoraConfig(rank=4)
  adapters = lora.init(params, cfg, key=jax.random.key(4))
  b = batch()
  ids, mask = np.asarray(b.ids), np.asarray(b.mask)
  result = train_lib.fit(
    lora.LoraLoss(model, cfg),
    adapters,
    lambda rows: lora.Batch(jnp.asarray(ids[rows]), jnp.asarray(mask[rows])),
    len(ids),
    train_lib.TrainConfig(
      optimizer='adam',
      learning_rate=3e-2,
      batch_size=4,
      num_steps=60,
      log_every=20,
      weight_decay=0.0,
    ),
    frozen=params,
    progress=False,
  )
  losses = [h['loss'] for h in result.history]
  assert losses[-1] < 0.7 * losses[0], losses
  assert set(result.params) == set(adapters)
  tuned = lora.merge(params, result.params, cfg)
  np.testing.assert_array_equal(
    tuned['layers_0']['mlp']['down_proj']['kernel'],
    params['layers_0']['mlp']['down_proj']['kernel'],
  )
  assert not np.allclose(
    tuned['layers_0']['attn']['q_proj']['kernel'],
    params['layers_0']['attn']['q_proj']['kernel'],
  )


@pytest.mark.slow
def test_bad_settings_are_refused():
  _, params = tiny()
  with pytest.raises(LeakjaxError, match='no 2-D parameter'):
    lora.target_paths(params, lora.LoraConfig(targets='nothing_here'))
  with pytest.raises(LeakjaxError, match='rank'):
    lora.LoraConfig(rank=0)
  with pytest.raises(LeakjaxError, match='targets'):
    lora.LoraConfig(targets='(')
  with pytest.raises(LeakjaxError, match='lacks'):
    lora.merge(params, {'x/kernel': {'a': 0, 'b': 0}}, lora.LoraConfig())
