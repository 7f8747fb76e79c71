"""Tests for leakjax.fl.simulation: server averaging and snapshots."""

import functools

import fl_fixtures as fx
import jax
import numpy as np
import pytest

from leakjax import fl
from leakjax.errors import LeakjaxError

FEDSGD = fl.ClientConfig.fedsgd(0.1)
ROUND = fx.jit(fl.fl_round, static_argnames=('model', 'config'))


@functools.cache
def three_clients():
  """CIFG clients with 5, 2 and 4 sentences (stacked to 5 rows)."""
  model, params = fx.model('cifg')
  ids, mask = fx.sentences(model, n=11, seed=3)
  parts = [(ids[:5], mask[:5]), (ids[5:7], mask[5:7]), (ids[7:], mask[7:])]
  return model, params, parts, fl.stack_clients(parts)


@pytest.mark.slow
def test_round_is_example_weighted_average_of_client_updates():
  """FILM Eq. 3 with FedSGD clients: θ + Σ_k (n_k / n) Δ_k."""
  model, params, parts, data = three_clients()
  key = jax.random.key(4)
  result = ROUND(model, params, data, FEDSGD, key=key)
  np.testing.assert_allclose(
    result.client_weights, np.array([5, 2, 4]) / 11, rtol=1e-6
  )
  updates = [
    fx.UPDATE(
      model, params, ids, mask, FEDSGD, key=jax.random.fold_in(key, k)
    ).update
    for k, (ids, mask) in enumerate(parts)
  ]
  expected = fx.tree_map_np(
    lambda p, *us: (
      p + sum(np.float32(n / 11) * u for n, u in zip((5, 2, 4), us))
    ),
    params,
    *updates,
  )
  fx.assert_trees_close(result.params, expected, atol=1e-6)
  assert fx.tree_max_abs_diff(result.params, params) > 1e-3


@pytest.mark.slow
def test_round_with_one_client_is_that_clients_update():
  model, params, parts, _ = three_clients()
  ids, mask = parts[0]
  config = fl.ClientConfig(epochs=2, batch_size=2, learning_rate=0.1)
  key = jax.random.key(5)
  result = ROUND(model, params, fl.stack_clients([parts[0]]), config, key=key)
  client = fx.UPDATE(
    model, params, ids, mask, config, key=jax.random.fold_in(key, 0)
  )
  fx.assert_trees_close(result.params, client.params, atol=1e-6)
  np.testing.assert_allclose(
    result.client_losses[0], np.nanmean(client.losses), rtol=1e-6
  )


def test_train_federated_snapshots_are_the_models_at_iteration_t():
  """With all clients and FedSGD (no randomness), θ^{t+1} is one fl_round
  applied to the snapshot θ^t."""
  model, params, _, data = three_clients()
  run = fl.train_federated(
    model,
    params,
    data,
    3,
    FEDSGD,
    key=jax.random.key(0),
    snapshot_every=1,
  )
  assert sorted(run.snapshots) == [0, 1, 2, 3]
  fx.assert_trees_equal(run.snapshots[0], params)
  fx.assert_trees_equal(run.snapshots[3], run.params)
  for t in range(3):
    step = ROUND(model, run.snapshots[t], data, FEDSGD, key=jax.random.key(9))
    fx.assert_trees_close(run.snapshots[t + 1], step.params, atol=1e-6)
  np.testing.assert_array_equal(run.client_ids, [[0, 1, 2]] * 3)
  assert run.losses.shape == (3,) and np.all(np.diff(run.losses) < 0)


@pytest.mark.slow
def test_train_federated_samples_clients_and_learns():
  model, params, _, data = three_clients()
  config = fl.ClientConfig(epochs=2, batch_size=2, learning_rate=0.5)
  run = fl.train_federated(
    model,
    params,
    data,
    6,
    config,
    key=jax.random.key(1),
    clients_per_round=2,
    snapshot_every=4,
  )
  assert sorted(run.snapshots) == [0, 4, 6]
  assert run.client_ids.shape == (6, 2)
  assert all(
    len(set(r)) == 2 and set(r) <= {0, 1, 2} for r in run.client_ids.tolist()
  )
  assert len({tuple(sorted(r)) for r in run.client_ids.tolist()}) > 1
  assert run.losses[-1] < run.losses[0]
  with pytest.raises(LeakjaxError, match='clients_per_round'):
    fl.train_federated(
      model,
      params,
      data,
      1,
      config,
      key=jax.random.key(1),
      clients_per_round=4,
    )
