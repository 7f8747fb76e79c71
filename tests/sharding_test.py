"""Tests for leakjax.sharding (8 fake CPU devices from conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import LeakjaxError, sharding


def test_eight_fake_devices():
  assert len(jax.devices()) == 8


@pytest.mark.parametrize(
  'spec,shape',
  [
    (None, {'data': 8}),
    ('data:4', {'data': 4}),
    ('data:-1,model:2', {'data': 4, 'model': 2}),
  ],
)
def test_make_mesh(spec, shape):
  assert dict(sharding.make_mesh(spec).shape) == shape


@pytest.mark.parametrize('spec', ['data', 'data:16', 'data:-1,model:-1', ':2'])
def test_make_mesh_errors(spec):
  with pytest.raises(LeakjaxError, match='mesh'):
    sharding.make_mesh(spec)


def test_sharded_matmul_equals_single_device():
  mesh = sharding.make_mesh('data:8')
  x = jax.random.normal(jax.random.key(0), (16, 5))
  w = jax.random.normal(jax.random.key(1), (5, 3))
  f = jax.jit(lambda w, x: jnp.tanh(x @ w))
  got = f(sharding.replicate(w, mesh), sharding.shard_batch(x, mesh))
  assert len(got.sharding.device_set) == 8
  np.testing.assert_allclose(got, f(w, x), rtol=1e-6)


def test_pad_to_multiple_and_indivisible_error():
  x = jnp.arange(10).reshape(5, 2)
  padded, n = sharding.pad_to_multiple(x, 4)
  assert n == 5 and padded.shape == (8, 2)
  np.testing.assert_array_equal(padded[5:], np.tile(x[-1], (3, 1)))
  with pytest.raises(LeakjaxError, match='does not split'):
    sharding.shard_batch(x, sharding.make_mesh('data:4'))
  assert sharding.shard_batch(x, None) is x
