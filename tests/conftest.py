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

jax.config.update('jax_default_matmul_precision', 'highest')
