"""Test setup: 8 fake CPU devices (sharding is tested on every run)."""

import os

# Must run before jax is imported anywhere.
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_default_matmul_precision', 'highest')


NUM_FAKE_DEVICES = 8


@pytest.fixture(scope='module')
def mesh():
  """A `data:8` mesh over the fake CPU devices (sharded-vs-single tests)."""
  from leakjax import sharding  # pylint: disable=g-import-not-at-top

  if jax.device_count() < NUM_FAKE_DEVICES:
    pytest.skip('needs the 8 fake CPU devices set up above')
  return sharding.make_mesh(f'data:{NUM_FAKE_DEVICES}')
