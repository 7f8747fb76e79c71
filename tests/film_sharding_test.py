"""FILM's kernels split their candidates over a mesh (scale-out).

With the 8 fake CPU devices of conftest.py, the beam search splits the k
beams of one search (FILM's default single prompt pool) over a `('data',)`
mesh, and each reordering step its C candidates, with the parameters
replicated (`film.recover(mesh=...)`). Every result must equal the
unsharded run: the same tokens and sentences, scores equal to float32
rounding (a per-device batch of one row tiles the matmuls differently from
a batch of eight). Beam and candidate counts that 8 does not divide are
padded inside the kernels; those cases are tested too. The compiled beam
search is checked to really decode ceil(k/8) beams per device.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax import fl
from leakjax.attacks import film
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2
from leakjax.tokenization import WordTokenizer

NUM_DEVICES = 8
VOCAB = 120


def _sharpen(model_params, factor: float = 4.0):
  """Weights x4: clearly separated scores, so that no ties decide a run."""
  model, params = model_params
  params = jax.tree.map(lambda x: x * factor if x.ndim == 2 else x, params)
  return model, params


@functools.cache
def tiny():
  """`(model, params)`."""
  return _sharpen(
    gpt2.init_model(
      gpt2.GPT2Config.tiny(vocab_size=VOCAB, n_positions=32, n_layer=1),
      key=jax.random.key(3),
    )
  )


def _head_rows(jitted, *args) -> set[int]:
  """Row counts of the `[rows, vocab]` LM-head matmuls (per device)."""
  hlo = jitted.lower(*args).compile().as_text()
  found = re.findall(rf'f32\[(?:(\d+),)?{VOCAB}\]\S* dot\(', hlo)
  return {int(r or 1) for r in found}


@pytest.mark.slow
@pytest.mark.parametrize(
  'num_beams,num_groups',
  [
    (6, 2),  # padded to 8 with dead beams; diverse groups
    (16, 4),  # two beams per device
  ],
)
def test_beam_search_splits_beams_of_one_search(mesh, num_beams, num_groups):
  model, params = tiny()
  config = bs.BeamSearchConfig(
    num_beams=num_beams,
    num_groups=num_groups,
    diversity_penalty=0.5,
    length=6,
  )
  # FILM's default: every prompt in one pool, so S = 1 and only the beam
  # axis can be split. Z = 8 prompts (the prefill is split too).
  prompts = jnp.asarray([[[1, 10 + i] for i in range(8)]], jnp.int32)
  bag = jnp.arange(10, 40, dtype=jnp.int32)
  prior = jnp.asarray([[1, 10, 11, 12, 0, 0, 0, 0]], jnp.int32)
  prior_lengths = jnp.asarray([4], jnp.int32)

  def search(params, prompts, bag, *, mesh=None):
    out = bs.bag_beam_search(
      model,
      params,
      prompts,
      bag,
      config=config,
      prior=prior,
      prior_lengths=prior_lengths,
      mesh=mesh,
    )
    return out.tokens, out.scores

  single = jax.jit(search)
  sharded = jax.jit(functools.partial(search, mesh=mesh))
  args = (params, prompts, bag)
  tok1, score1 = single(*args)
  tok8, score8 = sharded(*args)
  assert tok8.shape == tok1.shape == (1, num_beams, 2 + 6)
  np.testing.assert_array_equal(tok1, tok8)
  np.testing.assert_allclose(score1, score8, rtol=1e-5, atol=1e-5)
  # Non-trivial: all beams alive, distinct, with distinct scores.
  assert np.isfinite(np.asarray(score1)).all()
  assert len({tuple(t) for t in np.asarray(tok1[0]).tolist()}) == num_beams
  assert np.unique(np.asarray(score1)).size == num_beams
  # Really split: the decode step runs ceil(k/8) rows per device.
  rows1, rows8 = _head_rows(single, *args), _head_rows(sharded, *args)
  assert num_beams in rows1, rows1
  assert max(rows8) < min(rows1), (rows1, rows8)
  assert -(-num_beams // NUM_DEVICES) in rows8, rows8


def test_beam_search_rejects_a_mesh_without_data_axis(mesh):
  model, params = tiny()
  other = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ('model',))
  with pytest.raises(LeakjaxError, match="none named 'data'"):
    bs.bag_beam_search(
      model,
      params,
      jnp.asarray([[[1, 10]]]),
      jnp.arange(10, 20),
      config=bs.BeamSearchConfig(num_beams=2, length=2),
      mesh=other,
    )


def _candidates(num: int, width: int = 12, seed: int = 0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (num, width)).astype(np.int32)
  lengths = rng.integers(4, width + 1, num)
  mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
  return jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.slow
@pytest.mark.parametrize(
  'num,chunk',
  [
    (5, None),  # padded to 8
    (13, 1),  # padded to 16; each device maps over its 2 rows one by one
  ],
)
def test_candidate_scores_split_candidates(mesh, num, chunk):
  model, params = tiny()
  ids, mask = _candidates(num, seed=num)
  score = functools.partial(ro.candidate_scores, model, beta=1.0, chunk=chunk)
  s1, p1, n1 = jax.jit(score)(params, ids, mask)
  s8, p8, n8 = jax.jit(functools.partial(score, mesh=mesh))(params, ids, mask)
  assert s8.shape == (num,)
  np.testing.assert_allclose(n1, n8, rtol=1e-5)
  np.testing.assert_allclose(p1, p8, rtol=1e-5)
  np.testing.assert_allclose(s1, s8, rtol=1e-5)
  assert np.unique(np.round(np.asarray(n1), 5)).size == num  # per row


TEXTS = (
  'Anna Berg moved the Oslo meeting to Friday .',
  'Please call Tom Reed about the Denver contract .',
)


@functools.cache
def tiny_with_words():
  """A GPT-2 over a cased word vocabulary (capitalised start words).

  Returns:
    `(model, params)`.
  """
  filler = 'a an of in on at was is it we they said Monday May'
  words = WordTokenizer.build(
    [*TEXTS, filler], 64, lowercase=False, punctuation=True
  )
  config = gpt2.GPT2Config.tiny(vocab_size=64, n_positions=32, n_layer=1)
  return _sharpen(
    gpt2.init_model(config, key=jax.random.key(0), tokenizer=words)
  )


@pytest.mark.slow
def test_recover_with_mesh_equals_one_device(mesh):
  model, params = tiny_with_words()
  ids, mask = model.tokenizer.encode_batch(list(TEXTS), add_bos=True)
  grads = jax.jit(functools.partial(fl.client_gradient, model))(
    params, jnp.asarray(ids), jnp.asarray(mask)
  )
  config = film.FilmAttackConfig(
    # 6 beams and 5 candidates: both padded to 8 on the mesh.
    beam=bs.BeamSearchConfig(num_beams=6, length=8, prior_penalty=100.0),
    reorder=ro.ReorderConfig(phrase_steps=2, token_steps=3, num_candidates=5),
    repetitions=2,
    reorder_top=2,
  )
  run = functools.partial(film.recover, model, params, grads, config=config)
  one = run(key=jax.random.key(0))
  eight = run(key=jax.random.key(0), mesh=mesh)
  np.testing.assert_array_equal(one.bag.ids, eight.bag.ids)
  assert one.num_prompts == eight.num_prompts > 1
  assert len(one.recoveries) == len(eight.recoveries) == 2
  assert one.sentences == eight.sentences
  assert one.recoveries[0].beam_text != one.recoveries[1].beam_text
  for a, b in zip(one.recoveries, eight.recoveries, strict=True):
    assert a.tokens == b.tokens
    assert a.beam_text == b.beam_text
    np.testing.assert_allclose(a.beam_score, b.beam_score, rtol=1e-5)
    np.testing.assert_allclose(a.prior_score, b.prior_score, rtol=1e-5)
    np.testing.assert_allclose(
      a.initial_prior_score, b.initial_prior_score, rtol=1e-5
    )
  # The reordering (C = 5 candidates per step) accepted a move.
  assert any(r.prior_score < r.initial_prior_score for r in one.recoveries)
