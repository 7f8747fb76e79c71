"""Every batched attack kernel gives the same result sharded over 8 devices.

Issue 8 (scale-out): candidate scoring shards along the candidate/batch axis
of a `('data',)` mesh with the parameters replicated, and nothing inside a
kernel knows. With the 8 fake CPU devices of conftest.py, each kernel runs
once on one device and once with its batch axis split over all eight
(`leakjax.sharding.shard_batch` + `replicate`), under the same `jax.jit`;
the outputs must be identical (ids, tokens) or equal to float32 rounding
(scores: a per-device batch of 2 rows tiles the matmuls differently from a
batch of 16), and must really be spread over the 8 devices.

Kernels: FILM beam search (`attacks.beam_search`, the search axis), the
reorder scorer (`attacks.reorder.candidate_scores`, per-candidate gradient
norms), differential scores (`attacks.differential.differential_score`, the
sequence axis), and embedding inversion (`attacks.embedding_inversion`:
hidden states of a batch, then BEI and HEI ids).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import sharding
from leakjax.models import gpt2

NUM_DEVICES = 8


@pytest.fixture(scope='module')
def mesh():
  if jax.device_count() < NUM_DEVICES:
    pytest.skip('needs the 8 fake CPU devices of conftest.py')
  return sharding.make_mesh(f'data:{NUM_DEVICES}')


@pytest.fixture(scope='module')
def model():
  return gpt2.init_model(gpt2.GPT2Config.tiny(), key=jax.random.key(0))


def _batch(num: int, width: int, *, seed: int, vocab: int = 512):
  """Random ids `[num, width]` and a right-padded mask of lengths >= 4."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, (num, width)).astype(np.int32)
  lengths = rng.integers(4, width + 1, num)
  mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
  return ids, mask


def _run_both(fn, params, batch, mesh):
  """`(one device, sharded)` outputs of `jit(fn)(params, *batch)`."""
  jitted = jax.jit(fn)
  single = jax.block_until_ready(jitted(params, *batch))
  sharded = jax.block_until_ready(
    jitted(sharding.replicate(params, mesh), *sharding.shard_batch(batch, mesh))
  )
  return single, sharded


def _assert_spread(x):
  assert len(x.sharding.device_set) == NUM_DEVICES, x.sharding


def test_beam_search_sharded_over_searches(model, mesh):
  bs = pytest.importorskip('leakjax.attacks.beam_search')
  rng = np.random.default_rng(0)
  bag = np.unique(rng.integers(0, 512, 40)).astype(np.int32)
  # One search per start token (prompt length 2), 8 searches.
  prompts = [[int(bag[0]), int(t)] for t in bag[1 : NUM_DEVICES + 1]]
  prompts, prompt_mask = bs.prompt_batches(prompts, pad_to=NUM_DEVICES)
  config = bs.BeamSearchConfig(
    num_beams=4, length=6, ngram_size=2, ngram_penalty=math.inf
  )

  def search(params, prompts, prompt_mask):
    result = bs.beam_search(
      model,
      params,
      prompts,
      jnp.asarray(bag),
      config=config,
      prompt_mask=prompt_mask,
    )
    return result.tokens, result.scores

  (tok1, score1), (tok8, score8) = _run_both(
    search, model.params, (prompts, prompt_mask), mesh
  )
  _assert_spread(tok8)
  assert tok1.shape == (NUM_DEVICES, 4, 2 + 6)
  np.testing.assert_array_equal(tok1, tok8)
  np.testing.assert_allclose(score1, score8, rtol=1e-5)
  assert np.isfinite(np.asarray(score1)).all()


def test_reorder_scores_sharded_over_candidates(model, mesh):
  reorder = pytest.importorskip('leakjax.attacks.reorder')
  ids, mask = _batch(2 * NUM_DEVICES, 12, seed=1)
  score = functools.partial(reorder.candidate_scores, model, beta=1.0)
  (s1, p1, n1), (s8, p8, n8) = _run_both(score, model.params, (ids, mask), mesh)
  _assert_spread(n8)
  np.testing.assert_allclose(n1, n8, rtol=1e-5)
  np.testing.assert_allclose(p1, p8, rtol=1e-5)
  np.testing.assert_allclose(s1, s8, rtol=1e-5)
  assert len(set(np.round(np.asarray(n1), 6))) > 1  # norms differ per row


def test_differential_scores_sharded_over_sequences(model, mesh):
  dlib = pytest.importorskip('leakjax.attacks.differential')
  # M' = M with perturbed weights (an "update"), same architecture.
  leaves, tree = jax.tree.flatten(model.params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  params_prime = jax.tree.unflatten(
    tree,
    [x + 0.05 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)],
  )
  ids, mask = _batch(2 * NUM_DEVICES, 10, seed=2)

  def scores(params_pair, ids, mask):
    out = dlib.differential_score(
      model, model, params_pair[0], params_pair[1], ids, mask
    )
    return out.ds, out.rel_ds

  params = (model.params, params_prime)
  (ds1, rel1), (ds8, rel8) = _run_both(scores, params, (ids, mask), mesh)
  _assert_spread(ds8)
  # Per-device batches of 2 rows block the matmuls differently from one
  # batch of 16: float32 rounding, amplified by the sums of (M'-M)/M.
  np.testing.assert_allclose(ds1, ds8, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(rel1, rel8, rtol=1e-4, atol=1e-5)
  assert np.abs(np.asarray(ds1)).max() > 0  # the two snapshots differ


def test_embedding_inversion_sharded_over_batch(model, mesh):
  ei = pytest.importorskip('leakjax.attacks.embedding_inversion')
  ids, mask = _batch(NUM_DEVICES, 10, seed=3)

  def invert(params, ids, mask):
    states = ei.layer_states(model, params, ids, mask, (0, 1, 'last'))
    emb = model.word_embeddings(params)
    return ei.hei_ids(states, emb), ei.bei_ids(model, params, states)

  (hei1, bei1), (hei8, bei8) = _run_both(
    invert, model.params, (ids, mask), mesh
  )
  # states [layers, B, T, D]: the batch is axis 1 of the outputs.
  assert hei8.shape == (3, NUM_DEVICES, 10)
  assert len(hei8.sharding.device_set) == NUM_DEVICES
  np.testing.assert_array_equal(hei1, hei8)
  np.testing.assert_array_equal(bei1, bei8)
  # HEI at layer 0 reads the input embeddings (plus positions): mostly right.
  assert (np.asarray(hei1[0]) == ids).mean() > 0.5
