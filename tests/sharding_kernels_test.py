"""Every batched attack kernel gives the same result sharded over 8 devices.

Scale-out: candidate scoring shards along the candidate/batch axis
of a `('data',)` mesh with the parameters replicated, and nothing inside a
kernel knows. With the 8 fake CPU devices of conftest.py, each kernel runs
once on one device and once with its batch axis split over all eight
(`leakjax.sharding.shard_batch` + `replicate`), under the same `jax.jit`;
the outputs must be identical (ids, tokens) or equal to float32 rounding
(scores: a per-device batch of 2 rows tiles the matmuls differently from a
batch of 16), and must really be spread over the 8 devices.

Kernels: FILM beam search (`attacks.film.bag_beam_search`, the
search axis), the reorder scorer (`attacks.film.reorder_scores`,
per-candidate gradient norms), differential scores (`attacks.differential.
differential_score`, the sequence axis), the differential-rank search
(`attacks.differential.rank_beam_search(mesh=...)`, the beam rows of every
step, also as the experiment runs it) and embedding inversion
(`attacks.inversion`: hidden states of a batch, then BEI and HEI
ids) and the exact inversion's candidate checks (`attacks.inversion.exact`,
the candidate axis of every check; whole inversions equal).
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import sharding
from leakjax.attacks import differential as dlib
from leakjax.attacks.differential import evaluation
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder
from leakjax.attacks.inversion import bei_hei as ei
from leakjax.attacks.inversion import exact as ex
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, lstm
from leakjax.tokenization import WordTokenizer

NUM_DEVICES = 8


@pytest.fixture(scope='module')
def tiny():
  """`(model, params)` of the tiny GPT-2."""
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


@pytest.mark.slow
def test_beam_search_sharded_over_searches(tiny, mesh):
  model, params = tiny
  rng = np.random.default_rng(0)
  bag = np.unique(rng.integers(0, 512, 40)).astype(np.int32)
  # One search per start token (prompt length 2), 8 searches.
  prompts = [[int(bag[0]), int(t)] for t in bag[1 : NUM_DEVICES + 1]]
  prompts, prompt_mask = bs.prompt_batches(prompts, pad_to=NUM_DEVICES)
  config = bs.BeamSearchConfig(
    num_beams=4, length=6, ngram_size=2, ngram_penalty=math.inf
  )

  def search(params, prompts, prompt_mask):
    result = bs.bag_beam_search(
      model,
      params,
      prompts,
      jnp.asarray(bag),
      config=config,
      prompt_mask=prompt_mask,
    )
    return result.tokens, result.scores

  (tok1, score1), (tok8, score8) = _run_both(
    search, params, (prompts, prompt_mask), mesh
  )
  _assert_spread(tok8)
  assert tok1.shape == (NUM_DEVICES, 4, 2 + 6)
  np.testing.assert_array_equal(tok1, tok8)
  np.testing.assert_allclose(score1, score8, rtol=1e-5)
  assert np.isfinite(np.asarray(score1)).all()


@pytest.mark.slow
def test_reorder_scores_sharded_over_candidates(tiny, mesh):
  model, params = tiny
  ids, mask = _batch(2 * NUM_DEVICES, 12, seed=1)
  score = functools.partial(reorder.candidate_scores, model, beta=1.0)
  (s1, p1, n1), (s8, p8, n8) = _run_both(score, params, (ids, mask), mesh)
  _assert_spread(n8)
  np.testing.assert_allclose(n1, n8, rtol=1e-5)
  np.testing.assert_allclose(p1, p8, rtol=1e-5)
  np.testing.assert_allclose(s1, s8, rtol=1e-5)
  assert len(set(np.round(np.asarray(n1), 6))) > 1  # norms differ per row


@pytest.mark.slow
def test_differential_scores_sharded_over_sequences(tiny, mesh):
  model, params = tiny
  # M' = M with perturbed weights (an "update"), same architecture.
  leaves, tree = jax.tree.flatten(params)
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

  pair = (params, params_prime)
  (ds1, rel1), (ds8, rel8) = _run_both(scores, pair, (ids, mask), mesh)
  _assert_spread(ds8)
  # Per-device batches of 2 rows block the matmuls differently from one
  # batch of 16: float32 rounding, amplified by the sums of (M'-M)/M.
  np.testing.assert_allclose(ds1, ds8, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(rel1, rel8, rtol=1e-4, atol=1e-5)
  assert np.abs(np.asarray(ds1)).max() > 0  # the two snapshots differ


def test_embedding_inversion_sharded_over_batch(tiny, mesh):
  model, params = tiny
  ids, mask = _batch(NUM_DEVICES, 10, seed=3)

  def invert(params, ids, mask):
    states = ei.layer_states(model, params, ids, mask, (0, 1, 'last'))
    emb = model.word_embeddings(params)
    return ei.hei_ids(states, emb), ei.bei_ids(model, params, states)

  (hei1, bei1), (hei8, bei8) = _run_both(invert, params, (ids, mask), mesh)
  # states [layers, B, T, D]: the batch is axis 1 of the outputs.
  assert hei8.shape == (3, NUM_DEVICES, 10)
  assert len(hei8.sharding.device_set) == NUM_DEVICES
  np.testing.assert_array_equal(hei1, hei8)
  np.testing.assert_array_equal(bei1, bei8)
  # HEI at layer 0 reads the input embeddings (plus positions): mostly right.
  assert (np.asarray(hei1[0]) == ids).mean() > 0.5


@pytest.mark.slow
@pytest.mark.parametrize('family', ['llama', 'gpt2'])
def test_exact_inversion_checks_sharded_over_candidates(mesh, family):
  from tests import inversion_exact_test as ie  # pylint: disable=g-import-not-at-top

  model, params = ie.MODELS[family]()
  ids = np.asarray(jax.random.randint(jax.random.key(4), (1, 7), 0, 200))
  states = ie.observed_states(model, params, ids, 3)
  # Random proposals: the search goes down the vocabulary, in chunks of 4
  # and 20 candidates, rounded up to whole shards of 8.
  rng = np.random.default_rng(0)
  scores = rng.standard_normal((1, 7, model.vocab_size)).astype(np.float32)
  config = ex.ExactConfig(first_chunk=4, chunk=20)
  run = functools.partial(
    ex.invert, model, layer=3, scores=scores, config=config
  )
  one = run(params, states, np.asarray([7]))
  split = run(params, states, np.asarray([7]), mesh=mesh)
  assert split[0].ids == one[0].ids == ids[0].tolist()
  assert split[0].checked == one[0].checked and max(one[0].checked) > 1
  assert split[0].decided == one[0].decided
  # The check itself: the candidates spread over the 8 devices.
  cache = model.init_stream_cache(params, 1, 8, layer=3)
  for tok in ids[0, :3]:
    _, cache = model.stream_decode(params, cache, jnp.asarray([[tok]]), layer=3)
  cands = np.arange(16, dtype=np.int32)
  check = functools.partial(ex.check_candidates, model, layer=3)
  single, sharded = _run_both(
    lambda p, c: check(p, cache, c, jnp.asarray(states[0, 3])),
    params,
    (cands,),
    mesh,
  )
  _assert_spread(sharded)
  np.testing.assert_allclose(single, sharded, rtol=1e-5, atol=1e-5)


def _random_lstm(seed: int, vocab: int = 37):
  """`(model, params)`: a tiny word LSTM with O(1) random weights, so DS
  differs a lot per word. Every seed gives the same (equal) model."""
  config = lstm.LSTMConfig(
    vocab_size=vocab, embed_dim=8, hidden_size=16, num_layers=2
  )
  words = WordTokenizer.build([' '.join(f'w{i}' for i in range(vocab))], vocab)
  model, params = lstm.init_model(
    config, key=jax.random.key(seed), tokenizer=words
  )
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [
    x + 0.8 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)
  ]
  return model, jax.tree.unflatten(tree, leaves)


def _head_rows(jitted, args, vocab: int = 37, **kwargs) -> set[int]:
  """Row counts of the `[rows, vocab]` output-layer matmuls, per device."""
  hlo = jitted.lower(*args, **kwargs).compile().as_text()
  return {int(r) for r in re.findall(rf'f32\[(\d+),{vocab}\]\S* dot\(', hlo)}


@pytest.mark.slow
@pytest.mark.parametrize(
  'groups,score,context,tokens,chunk_rows',
  [
    # Whole vocabulary, beams 37/18/9: no width divides 8, padded chunks.
    (1, 'ds', (1,), None, None),
    # Group beam search over a subset T, a known prefix, several chunks.
    (2, 'rel_ds', (1, 5), tuple(range(2, 31)), 5),
  ],
)
def test_differential_rank_search_sharded_over_beams(
  mesh, groups, score, context, tokens, chunk_rows
):
  (m, params), (_, params_prime) = _random_lstm(0), _random_lstm(1)
  num_tokens = m.vocab_size if tokens is None else len(tokens)
  widths = dlib.halving_widths(num_tokens, 3, num_groups=groups)
  tokens = None if tokens is None else jnp.asarray(tokens, jnp.int32)

  def search(params, params_prime, context, *, mesh=None):
    result = dlib.rank_beam_search(
      m,
      m,
      params,
      params_prime,
      context,
      tokens,
      widths=widths,
      length=3,
      num_groups=groups,
      score=score,
      chunk_rows=chunk_rows,
      mesh=mesh,
    )
    return result.sequences, result.ds, result.rel_ds

  context = jnp.asarray(context, jnp.int32)
  single = jax.jit(search)
  sharded = jax.jit(functools.partial(search, mesh=mesh))
  seq1, ds1, rel1 = single(params, params_prime, context)
  seq8, ds8, rel8 = sharded(params, params_prime, context)

  # The candidate scoring really is split: each device decodes 1/8 of the
  # (padded) beam rows of a chunk.
  args = (params, params_prime, context)
  rows1, rows8 = _head_rows(single, args), _head_rows(sharded, args)
  assert max(rows1) > NUM_DEVICES, rows1
  assert max(rows8) <= -(-max(rows1) // NUM_DEVICES), (rows1, rows8)
  assert seq1.shape == (groups, widths[-1] // groups, 3)
  np.testing.assert_array_equal(seq1, seq8)
  np.testing.assert_allclose(ds1, ds8, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(rel1, rel8, rtol=1e-5, atol=1e-6)
  # Non-trivial: distinct sequences with distinct, sorted scores.
  ranked = np.asarray(ds1 if score == 'ds' else rel1)
  distinct = {tuple(s) for s in np.asarray(seq1).reshape(-1, 3)}
  assert len(distinct) == widths[-1]
  assert (np.diff(ranked, axis=-1) <= 0).all()
  assert np.unique(ranked).size == ranked.size


def test_differential_rank_search_rejects_a_mesh_without_data_axis(mesh):
  m, params = _random_lstm(0, vocab=7)
  other = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ('model',))
  with pytest.raises(LeakjaxError, match="'data'"):
    dlib.rank_beam_search(
      m,
      m,
      params,
      params,
      jnp.array([1]),
      widths=(7,),
      length=1,
      mesh=other,
    )


@pytest.mark.slow
def test_differential_experiment_shards_ds_and_dr_search(mesh):
  (m, params), (_, params_prime) = _random_lstm(0), _random_lstm(1)
  cfg = dlib.DifferentialConfig(data='', vocab_size=37, min_width=16)
  one, eight = evaluation.Attack(m, cfg), evaluation.Attack(m, cfg, mesh)
  bos = m.tokenizer.bos_id
  ids = np.asarray(
    [[bos, 3, 4, 5, 6, 7], [bos, 9, 8, 7, 6, 5], [bos, 2, 2, 2, 2, 2]], np.int32
  )  # 3 rows: padded to 8
  s1 = one.scores(params, params_prime, ids, 1)
  s8 = eight.scores(params, params_prime, ids, 1)
  assert s8.ds.shape == (3,)
  np.testing.assert_allclose(s1.ds, s8.ds, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(s1.rel_ds, s8.rel_ds, rtol=1e-5, atol=1e-6)
  found1 = one.search(params, params_prime, [bos, 3], 3)  # widths 37/18/16
  found8 = eight.search(params, params_prime, [bos, 3], 3)
  assert found1.sequences.shape == (1, 16, 3)
  np.testing.assert_array_equal(found1.sequences, found8.sequences)
  np.testing.assert_allclose(found1.ds, found8.ds, rtol=1e-5, atol=1e-6)
  assert np.unique(np.asarray(found1.ds)).size == 16
  # The experiment's jitted search splits the 37 beam rows of step 2 (padded
  # to 40) over 8 devices.
  args = (m, params, params_prime, jnp.asarray([bos, 3], jnp.int32))
  search = jax.jit(
    evaluation.search_sequences, static_argnames=evaluation.SEARCH_STATIC
  )
  rows = _head_rows(search, args, **eight.search_options(3))
  assert max(rows) == 40 // NUM_DEVICES


@pytest.mark.parametrize(
  'spec,match',
  [
    ('data:16', 'needs 16 devices, 8 are visible'),
    ('model:2', "no 'data' axis"),
    ('data:x', 'bad --mesh'),
  ],
)
def test_differential_experiment_mesh_errors(mesh, spec, match):
  with pytest.raises(LeakjaxError, match=match):
    sharding.data_mesh(spec)
  assert sharding.data_mesh(None) is None
  assert dict(sharding.data_mesh('data:4').shape) == {'data': 4}
