"""Tiny models, data and shared jitted client functions for the fl tests.

Cached at module level so that the fl test files (one pytest process) build
each model once and reuse each compiled program.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import fl
from leakjax.models import gpt2, lstm

# A 1-layer GPT-2 (tied head, ~15k parameters: enough entries for the noise
# statistics) and GBoard's tied CIFG-LSTM shrunk (lstm_test.py's shape).
TINY_GPT2 = gpt2.GPT2Config.tiny(
  vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=8
)
TINY_CIFG = lstm.CIFGConfig(vocab_size=13, embed_dim=6, units=7, proj_dim=6)
TINY_CIFG_UNTIED = lstm.CIFGConfig(
  vocab_size=13, embed_dim=6, units=7, proj_dim=6, tie_word_embeddings=False
)
CONFIGS = {
  'gpt2': TINY_GPT2,
  'cifg': TINY_CIFG,
  'cifg_untied': TINY_CIFG_UNTIED,
}
FAMILIES = ('gpt2', 'cifg')


@functools.cache
def model(name: str):
  """`(model, params)` of the tiny model `name` (built once per process)."""
  config = CONFIGS[name]
  if name == 'gpt2':
    return gpt2.init_model(config, key=jax.random.key(0))
  m, params = lstm.init_model(config, key=jax.random.key(0))
  # O(1) random weights (as lstm_test.random_model) so gradients are not
  # tiny; drawn with NumPy, which compiles nothing.
  rng = np.random.default_rng(100)
  params = jax.tree.map(
    lambda x: jnp.asarray(0.5 * rng.normal(size=x.shape), jnp.float32), params
  )
  return m, params


def sentences(m, n: int, time: int = 8, seed: int = 1):
  """`n` random sentences of lengths 2..time, right-padded: (ids, mask)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, m.vocab_size, (n, time)).astype(np.int32)
  lengths = rng.integers(2, time + 1, n)
  lengths[0] = time  # one full-length sentence
  mask = (np.arange(time)[None] < lengths[:, None]).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask)


# Tests compile at LLVM optimization level 0: half the compile time, same
# numerics (no fast-math either way). Exact equalities compare programs
# compiled with these same options, with XLA's fusion emitters on (the
# suite turns them off elsewhere, see conftest.py): without them the
# `lax.scan` of local steps and the loop of one jitted step round one
# parameter in 78 differently (3.7e-9).
FAST_COMPILE = {
  'xla_backend_optimization_level': 0,
  'xla_cpu_use_fusion_emitters': True,
}
jit = functools.partial(jax.jit, compiler_options=FAST_COMPILE)

# One jit object per client function: compiled programs are shared by tests.
GRADIENT = jit(
  fl.client_gradient, static_argnames=('model', 'defense', 'dropout')
)
UPDATE = jit(fl.client_update, static_argnames=('model', 'config'))


# Host-side (NumPy) tree arithmetic: eager jnp ops would compile one tiny
# XLA program per op and leaf shape.
def np_tree(tree):
  return jax.tree.map(np.asarray, tree)


def tree_map_np(fn, *trees):
  return jax.tree.map(lambda *xs: fn(*map(np.asarray, xs)), *trees)


@functools.partial(jit, static_argnames=('model',))
def loss_and_grad(model, params, ids, mask):
  """`value_and_grad(model.loss)`: the plain reference gradient."""
  return jax.value_and_grad(model.loss)(params, ids, mask)


# DP-SGD on the tiny GPT-2, shared by the client and defense tests (one
# compiled program): C = 0.05, sigma = 1.
GPT2_DP = fl.dp_sgd(0.05, 1.0)


def tree_max_abs_diff(a, b) -> float:
  diffs = tree_map_np(lambda x, y: float(np.max(np.abs(x - y))), a, b)
  return max(jax.tree.leaves(diffs))


def sgd_step(params, grads, lr):
  """θ − η·g, in float32 NumPy."""
  return tree_map_np(lambda p, g: p - np.float32(lr) * g, params, grads)


def assert_trees_close(actual, expected, *, atol, rtol=0.0):
  jax.tree.map(
    lambda x, y: np.testing.assert_allclose(
      np.asarray(x), np.asarray(y), atol=atol, rtol=rtol
    ),
    actual,
    expected,
  )


def assert_trees_equal(actual, expected):
  jax.tree.map(
    lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)),
    actual,
    expected,
  )
