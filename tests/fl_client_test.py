"""Tests for leakjax.fl.client and leakjax.fl.batching."""

import fl_fixtures as fx
import jax
import numpy as np
import optax
import pytest

from leakjax import fl
from leakjax.errors import LeakjaxError
from leakjax.fl import batching

LR = 0.1
# θ1 = θ0 − η·g computed in two XLA programs agrees to float32 rounding.
ATOL = 1e-7


@pytest.mark.slow
@pytest.mark.parametrize('family', fx.FAMILIES)
def test_fedsgd_update_is_theta0_minus_lr_gradient(family):
  model, params = fx.model(family)
  ids, mask = fx.sentences(model, n=5)
  grad = fx.GRADIENT(model, params, ids, mask)
  result = fx.UPDATE(
    model,
    params,
    ids,
    mask,
    fl.ClientConfig.fedsgd(LR),
    key=jax.random.key(0),
  )

  # The gradient is that of Model.loss (pad targets masked) ...
  loss, reference = fx.loss_and_grad(model, params, ids, mask)
  fx.assert_trees_close(grad, reference, atol=ATOL)
  assert max(np.abs(g).max() for g in jax.tree.leaves(fx.np_tree(grad))) > 1e-3
  # ... and FedAvg with E=1, B=all is one SGD step with it.
  fx.assert_trees_close(result.params, fx.sgd_step(params, grad, LR), atol=ATOL)
  fx.assert_trees_close(
    result.update,
    fx.tree_map_np(lambda g: np.float32(-LR) * g, grad),
    atol=ATOL,
  )
  assert result.losses.shape == (1,)
  np.testing.assert_allclose(result.losses[0], loss, rtol=1e-6)


@pytest.mark.parametrize('family', fx.FAMILIES)
def test_pad_tokens_do_not_change_the_gradient(family):
  model, params = fx.model(family)
  ids, mask = fx.sentences(model, n=5)
  other = np.where(mask == 1, ids, (np.asarray(ids) + 3) % model.vocab_size)
  assert not np.array_equal(other, ids)
  fx.assert_trees_equal(
    fx.GRADIENT(model, params, other, mask),
    fx.GRADIENT(model, params, ids, mask),
  )


@pytest.mark.slow
@pytest.mark.parametrize('family', fx.FAMILIES)
@pytest.mark.parametrize('chunk', [2, 3])
def test_microbatched_gradient_is_the_batch_gradient(family, chunk):
  # 5 rows of different lengths: chunks hold different token counts, and
  # chunk 2 / 3 leave a filler row at the end.
  model, params = fx.model(family)
  ids, mask = fx.sentences(model, n=5)
  assert len(set(np.asarray(mask).sum(1).tolist())) > 1
  whole = fx.GRADIENT(model, params, ids, mask)
  parts = jax.jit(fl.client_gradient, static_argnames=('model', 'microbatch'))(
    model, params, ids, mask, microbatch=chunk
  )
  fx.assert_trees_close(parts, whole, atol=5e-7, rtol=1e-5)
  # Algorithm 3 noise (same key) is added once, after accumulation.
  noisy = fl.Defense(step_noise_std=0.01)
  key = jax.random.key(3)
  fx.assert_trees_close(
    fl.client_gradient(
      model, params, ids, mask, defense=noisy, key=key, microbatch=chunk
    ),
    fl.client_gradient(model, params, ids, mask, defense=noisy, key=key),
    atol=5e-7,
    rtol=1e-5,
  )
  with pytest.raises(LeakjaxError, match='microbatch'):
    fl.client_gradient(model, params, ids, mask, microbatch=0)


@pytest.mark.slow
def test_fedsgd_equals_fedavg_one_step_with_dp_sgd():
  """Same key => client_gradient and client_update draw the same noise."""
  model, params = fx.model('gpt2')
  ids, mask = fx.sentences(model, n=4)
  defense = fx.GPT2_DP
  key = jax.random.key(7)
  grad = fx.GRADIENT(model, params, ids, mask, defense=defense, key=key)
  result = fx.UPDATE(
    model, params, ids, mask, fl.ClientConfig.fedsgd(LR, defense), key=key
  )
  fx.assert_trees_close(result.params, fx.sgd_step(params, grad, LR), atol=ATOL)
  # The noise is really there (σC/B = 0.0125 per entry vs ~1e-3 gradients).
  clean = fx.GRADIENT(model, params, ids, mask)
  assert fx.tree_max_abs_diff(grad, clean) > 0.03


@pytest.mark.slow
def test_scan_equals_python_loop_of_jitted_steps():
  """E=2, B=3 over 7 sentences (batches 3, 3, 1), Adam, DP-SGD in
  microbatches of 2, GBoard step noise, single noise and pruning."""
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=7)
  defense = (
    fl.dp_sgd(0.05, 0.5, microbatch=2)
    | fl.dpsgd_like_noise(1e-3)
    | fl.single_noise(1e-4)
    | fl.gradient_pruning(0.5)
  )
  config = fl.ClientConfig(
    epochs=2,
    batch_size=3,
    learning_rate=0.01,
    optimizer=optax.adam,
    defense=defense,
  )
  key = jax.random.key(3)
  scan = fx.UPDATE(model, params, ids, mask, config, key=key)
  loop = fl.make_python_loop_client_update(model, params, config, jit=fx.jit)
  looped = loop(params, ids, mask, key=key)
  assert scan.losses.shape == (6,)
  np.testing.assert_array_equal(scan.losses, looped.losses)
  fx.assert_trees_equal(scan.params, looped.params)
  fx.assert_trees_equal(scan.update, looped.update)


@pytest.mark.slow
def test_minibatch_fedavg_matches_sgd_on_model_loss():
  """E=2, B=3 over 7 sentences equals SGD steps on `Model.loss` of the
  scheduled batches; the last batch of each epoch is a batch of 1."""
  model, params0 = fx.model('cifg')
  ids, mask = fx.sentences(model, n=7)
  config = fl.ClientConfig(epochs=2, batch_size=3, learning_rate=LR)
  key = jax.random.key(5)
  result = fx.UPDATE(model, params0, ids, mask, config, key=key)

  shuffle_key = jax.random.split(key, 3)[0]
  schedule = batching.batch_schedule(7, epochs=2, batch_size=3, key=shuffle_key)
  params = params0
  for rows, weights in zip(
    np.asarray(schedule.indices), np.asarray(schedule.weights)
  ):
    rows = rows[weights > 0]  # the real rows: a smaller last batch
    _, g = fx.loss_and_grad(model, params, ids[rows], mask[rows])
    params = fx.sgd_step(params, g, LR)
  fx.assert_trees_close(result.params, params, atol=1e-6)
  assert fx.tree_max_abs_diff(result.params, params0) > 1e-2


@pytest.mark.slow
def test_padded_client_equals_unpadded_and_skips_empty_batches():
  """A client of 2 sentences stored in 8 rows (num_examples=2) with B=4:
  each epoch has one real batch and one empty one, which must not move
  Adam (a zero-gradient Adam step would)."""
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=8)
  config = fl.ClientConfig(
    epochs=2, batch_size=4, learning_rate=0.05, optimizer=optax.adam
  )
  key = jax.random.key(11)
  padded = fx.UPDATE(model, params, ids, mask, config, key=key, num_examples=2)
  alone = fx.UPDATE(model, params, ids[:2], mask[:2], config, key=key)
  np.testing.assert_array_equal(
    np.isnan(padded.losses), [False, True, False, True]
  )
  fx.assert_trees_close(padded.params, alone.params, atol=1e-6)
  np.testing.assert_allclose(padded.losses[::2], alone.losses, rtol=1e-5)


@pytest.mark.slow
def test_client_update_traces_once_for_new_keys_and_sizes():
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=6)
  config = fl.ClientConfig(epochs=1, batch_size=4)
  traces = []

  def update(params, ids, mask, key, num_examples):
    traces.append(1)
    return fl.client_update(
      model, params, ids, mask, config, key=key, num_examples=num_examples
    )

  jitted = fx.jit(update)
  for seed, n in [(0, 6), (1, 3), (2, 5)]:
    jitted(params, ids, mask, jax.random.key(seed), n)
  assert len(traces) == 1


# ---------------------------------------------------------------- batching
def test_schedule_covers_every_example_once_per_epoch():
  schedule = batching.batch_schedule(
    10, epochs=3, batch_size=4, key=jax.random.key(0)
  )
  indices = np.asarray(schedule.indices).reshape(3, 3, 4)
  weights = np.asarray(schedule.weights).reshape(3, 3, 4)
  np.testing.assert_array_equal(weights.sum(-1), [[4, 4, 2]] * 3)
  orders = []
  for e in range(3):
    real = indices[e][weights[e] > 0]
    np.testing.assert_array_equal(np.sort(real), np.arange(10))
    orders.append(tuple(real))
  assert len(set(orders)) == 3  # reshuffled every epoch


def test_schedule_with_padding_rows_and_single_batch():
  schedule = batching.batch_schedule(
    8, epochs=2, batch_size=3, key=jax.random.key(1), num_examples=5
  )
  indices = np.asarray(schedule.indices)
  weights = np.asarray(schedule.weights)
  assert indices.shape == (6, 3)  # ceil(8 / 3) = 3 batches per epoch
  assert set(indices[weights > 0].tolist()) == set(range(5))
  assert indices.max() < 5  # filler slots point at real rows
  np.testing.assert_array_equal(weights.sum(-1), [3, 2, 0, 3, 2, 0])

  one = batching.batch_schedule(
    5, epochs=2, batch_size=None, key=jax.random.key(1)
  )
  np.testing.assert_array_equal(one.indices, [np.arange(5)] * 2)
  np.testing.assert_array_equal(one.weights, np.ones((2, 5)))
  assert batching.num_local_steps(256, epochs=5, batch_size=32) == 40
  assert batching.num_local_steps(16, epochs=5, batch_size=32) == 5


def test_stack_clients_pads_sizes_and_lengths():
  data = fl.stack_clients(
    [
      (np.ones((2, 3), np.int32), np.ones((2, 3), np.int32)),
      (np.full((4, 5), 2, np.int32), None),
    ]
  )
  assert data.ids.shape == (2, 4, 5)
  np.testing.assert_array_equal(data.num_examples, [2, 4])
  assert int(data.mask[0].sum()) == 6 and int(data.mask[1].sum()) == 20


@pytest.mark.slow
def test_bad_inputs_raise_leakjax_error():
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=3)
  with pytest.raises(LeakjaxError, match='epochs'):
    fl.ClientConfig(epochs=0)
  with pytest.raises(LeakjaxError, match='batch_size'):
    fl.ClientConfig(batch_size=0)
  with pytest.raises(LeakjaxError, match='mask shape'):
    fl.client_gradient(model, params, ids, mask[:, :3])
  with pytest.raises(LeakjaxError, match='key'):
    fl.client_gradient(model, params, ids, mask, defense=fl.single_noise(0.1))
  with pytest.raises(LeakjaxError, match='not in the model'):
    fl.client_gradient(
      model,
      params,
      ids,
      mask,
      defense=fl.Defense(frozen=(('wte', 'embedding'),)),
    )
