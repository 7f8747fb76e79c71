"""Tests of leakjax.attacks.film.beam_search (FILM Sec. 4.3, Alg. 1).

The kernel (KV cache, `lax.while_loop`, vmap over searches) is compared
with a plain-Python beam search that rescores whole sequences with
`model.logits` at every step.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax.attacks.film import beam_search as bs
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, llama
from leakjax.tokenization import gpt2_tokenizer

VOCAB = 120


@functools.cache
def tiny(family):
  """`(model, params)`."""
  if family == 'gpt2':
    return gpt2.init_model(
      gpt2.GPT2Config.tiny(vocab_size=VOCAB, n_positions=32, n_layer=1),
      key=jax.random.key(3),
    )
  config = llama.LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
  )
  model, params = llama.init_model(config, key=jax.random.key(4))
  # Sharper predictions than the 0.02 init, so that scores differ clearly.
  params = jax.tree.map(lambda x: x * 4 if x.ndim == 2 else x, params)
  return model, params


SEARCH = jax.jit(bs.bag_beam_search, static_argnames=('model', 'config'))


@functools.partial(jax.jit, static_argnames=('model',))
def _next_log_probs(model, params, ids, lengths):
  """log p(next | seq) for right-padded rows: one compilation per shape."""
  width = ids.shape[1]
  mask = (jnp.arange(width)[None] < lengths[:, None]).astype(jnp.int32)
  logits = model.logits(params, ids, mask)
  last = logits[jnp.arange(ids.shape[0]), lengths - 1]
  return jax.nn.log_softmax(last, -1)


def reference(model, params, prompts, bag, config, prior=()):
  """Alg. 1 with groups, written out with full-sequence rescoring."""
  width = len(prompts[0]) + config.length

  def logp_fn(seqs):
    ids = np.zeros((len(seqs), width), np.int32)
    for i, q in enumerate(seqs):
      ids[i, : len(q)] = q
    lengths = np.asarray([len(q) for q in seqs], np.int32)
    return _next_log_probs(
      model, params, jnp.asarray(ids), jnp.asarray(lengths)
    )

  def penalty(seq, cand):
    n = config.ngram_size
    if n == 0 or len(seq) < n - 1:
      return 0.0
    ctx = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
    gram = ctx + (cand,)
    grams = {tuple(seq[j - n + 1 : j + 1]) for j in range(n - 1, len(seq))}
    pen = config.ngram_penalty if gram in grams else 0.0
    for p in prior:
      pg = {tuple(p[j - n + 1 : j + 1]) for j in range(n - 1, len(p))}
      if gram in pg:
        pen += config.prior_penalty
    return pen

  def select(sources, shared):
    kg, g = config.beams_per_group, config.num_groups
    logps = np.asarray(logp_fn([s for s, _ in sources]))
    used = np.zeros(len(bag))
    out = []
    for group in range(g):
      lo, hi = (0, len(sources)) if shared else (group * kg, (group + 1) * kg)
      cands = []
      for si in range(lo, hi):
        seq, score = sources[si]
        for m, tok in enumerate(bag):
          total = score + logps[si, tok] - penalty(seq, tok)
          cands.append(
            (
              total - config.diversity_penalty * used[m],
              (si - lo) * len(bag) + m,
              total,
              seq + [tok],
              m,
            )
          )
      cands.sort(key=lambda c: (-c[0], c[1]))
      for c in cands[:kg]:
        out.append((c[3], c[2]))
        if g > 1:
          used[c[4]] += 1
    return out

  starts = []
  for p in prompts:
    lp = np.asarray(
      jax.nn.log_softmax(model.logits(params, jnp.asarray([p]))[0], -1)
    )
    starts.append(
      (list(p), float(sum(lp[t - 1, p[t]] for t in range(1, len(p)))))
    )
  beams = select(starts, shared=True)
  for _ in range(config.length - 1):
    beams = select(beams, shared=False)
  beams.sort(key=lambda b: -b[1])
  return beams


CASES = [
  ('gpt2', bs.BeamSearchConfig(num_beams=4, length=5)),
  (
    'llama',
    bs.BeamSearchConfig(num_beams=4, length=5, ngram_size=1, ngram_penalty=1.5),
  ),
  (
    'llama',
    bs.BeamSearchConfig(
      num_beams=6, num_groups=3, diversity_penalty=0.7, length=4
    ),
  ),
]


@pytest.mark.slow
@pytest.mark.parametrize('family,config', CASES)
def test_kernel_matches_python_reference(family, config):
  model, params = tiny(family)
  prompts = [[1, 5], [1, 9], [1, 17]]
  bag = [5, 9, 17, 22, 23, 40, 41, 60]
  out = SEARCH(
    model, params, jnp.asarray([prompts]), jnp.asarray(bag), config=config
  )
  ref = reference(model, params, prompts, bag, config)
  assert out.tokens.shape == (1, config.num_beams, 2 + config.length)
  got = [
    (list(map(int, t)), float(s))
    for t, s in zip(out.tokens[0], out.scores[0], strict=True)
  ]
  for (gt, gs), (rt, rs) in zip(got, ref, strict=True):
    assert gt == rt
    assert gs == pytest.approx(rs, abs=1e-4)
  # Every generated token comes from the bag.
  assert set(np.asarray(out.tokens[0, :, 2:]).ravel()) <= set(bag)


@pytest.mark.slow
@pytest.mark.parametrize('family', ['gpt2', 'llama'])
def test_traced_length_in_a_wider_buffer_matches_reference(family):
  """`num_steps` tokens into a `length`-token buffer: the beams of a
  search of length `num_steps`, and one compilation for every length."""
  model, params = tiny(family)
  buffer = bs.BeamSearchConfig(num_beams=4, length=8, ngram_size=2)
  prompts = [[1, 5], [1, 9], [1, 17]]
  bag = [5, 9, 17, 22, 23, 40, 41, 60]
  traces = []

  def search(params, prompts, bag, steps):
    traces.append(1)  # once per compilation
    return bs.bag_beam_search(
      model, params, prompts, bag, config=buffer, num_steps=steps
    )

  fn = jax.jit(search)
  for steps in (3, 5, 8):
    out = fn(params, jnp.asarray([prompts]), jnp.asarray(bag), steps)
    assert out.tokens.shape == (1, 4, 2 + 8)
    assert not np.asarray(out.tokens[0, :, 2 + steps :]).any()
    config = dataclasses.replace(buffer, length=steps)
    ref = reference(model, params, prompts, bag, config)
    for t, sc, (rt, rs) in zip(out.tokens[0], out.scores[0], ref, strict=True):
      assert list(map(int, t[: 2 + steps])) == rt
      assert float(sc) == pytest.approx(rs, abs=1e-4)
  assert len(traces) == 1
  with pytest.raises(LeakjaxError, match='num_steps must be in'):
    bs.bag_beam_search(
      model,
      params,
      jnp.asarray([prompts]),
      jnp.asarray(bag),
      config=buffer,
      num_steps=9,
    )


@pytest.mark.slow
def test_prior_ngrams_are_penalised_and_match_reference():
  model, params = tiny('llama')
  config = bs.BeamSearchConfig(num_beams=4, length=4, prior_penalty=3.0)
  prompts = [[1, 5], [1, 9]]
  bag = [5, 9, 17, 22, 23, 40]
  first = reference(model, params, prompts, bag, config)[0][0]
  prior = np.zeros((2, 6), np.int32)
  prior[0] = first
  out = bs.bag_beam_search(
    model,
    params,
    jnp.asarray([prompts]),
    jnp.asarray(bag),
    config=config,
    prior=jnp.asarray(prior),
    prior_lengths=jnp.asarray([6, 0]),
  )
  ref = reference(model, params, prompts, bag, config, prior=[first])
  assert list(map(int, out.tokens[0, 0])) == ref[0][0]
  assert float(out.scores[0, 0]) == pytest.approx(ref[0][1], abs=1e-4)
  assert ref[0][0] != first


@pytest.mark.slow
def test_scores_are_log_probabilities_without_repeats():
  model, params = tiny('gpt2')
  config = CASES[0][1]  # bigram ban; compiled already
  out = SEARCH(
    model,
    params,
    jnp.asarray([[[1, 7], [1, 8], [1, 9]]] * 2),
    jnp.arange(10, 18),
    config=config,
  )
  ids = out.tokens.reshape(-1, out.tokens.shape[-1])
  logp = model.token_log_probs(params, ids).sum(-1)
  np.testing.assert_allclose(
    np.asarray(logp).reshape(2, 4), np.asarray(out.scores), atol=1e-4
  )
  for seq in np.asarray(ids):
    grams = list(zip(seq[:-1], seq[1:], strict=True))
    assert len(grams) == len(set(grams))
  # Best first within each search.
  assert np.all(np.diff(np.asarray(out.scores), axis=1) <= 0)


def test_ngram_followers():
  seq = jnp.asarray([4, 5, 6, 4, 5, 0, 0])
  cands = jnp.asarray([5, 6, 7, 4])
  got = bs.ngram_followers(seq, 5, jnp.asarray([4]), cands)
  assert list(map(bool, got)) == [True, False, False, False]
  got = bs.ngram_followers(seq, 5, jnp.asarray([5]), cands)
  assert list(map(bool, got)) == [False, True, False, False]
  got = bs.ngram_followers(seq, 3, jnp.zeros((0,), jnp.int32), cands)
  assert list(map(bool, got)) == [True, True, False, True]


@pytest.mark.slow
def test_one_compilation_for_bags_of_one_size():
  model, params = tiny('gpt2')
  config = bs.BeamSearchConfig(num_beams=2, length=3)
  traces = []

  def search(params, prompts, bag):
    traces.append(1)  # runs once per compilation
    return bs.bag_beam_search(model, params, prompts, bag, config=config)

  fn = jax.jit(search)
  for bag in ([10, 11, 12, 13], [20, 21, 22, 23], [5, 6, 7, 8]):
    fn(params, jnp.asarray([[[1, bag[0]]]]), jnp.asarray(bag))
  # New params of the same shapes reuse the compiled search.
  fn(
    jax.tree.map(lambda x: x + 1, params),
    jnp.asarray([[[1, 5]]]),
    jnp.asarray([5, 6, 7, 8]),
  )
  assert len(traces) == 1


def test_rebuilt_model_reuses_the_compiled_search():
  model, params = tiny('gpt2')
  config = bs.BeamSearchConfig(num_beams=2, length=3)
  again = gpt2.make_model(model.config)
  assert again == model and hash(again) == hash(model)
  args = (params, jnp.asarray([[[1, 10]]]), jnp.asarray([10, 11, 12, 13]))
  SEARCH(model, *args, config=config)
  size = SEARCH._cache_size()  # pylint: disable=protected-access
  SEARCH(again, *args, config=config)
  assert SEARCH._cache_size() == size  # pylint: disable=protected-access


@pytest.mark.slow
def test_sharded_searches_equal_one_device():
  if jax.device_count() < 2:
    pytest.skip('needs several (fake) devices')
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top

  from leakjax import sharding  # pylint: disable=g-import-not-at-top

  model, params = tiny('llama')
  config = bs.BeamSearchConfig(num_beams=2, length=3)
  n = 2 * (jax.device_count() // 2)
  mesh = sharding.make_mesh(f'data:{n}')
  prompts = jnp.asarray([[[1, 5 + i]] for i in range(n)])
  bag = jnp.arange(5, 5 + n + 4)
  single = SEARCH(model, params, prompts, bag, config=config)
  sharded_prompts = jax.device_put(
    prompts, NamedSharding(mesh, PartitionSpec('data'))
  )
  multi = SEARCH(model, params, sharded_prompts, bag, config=config)
  np.testing.assert_array_equal(
    np.asarray(single.tokens), np.asarray(multi.tokens)
  )
  np.testing.assert_allclose(
    np.asarray(single.scores), np.asarray(multi.scores), atol=1e-5
  )


def test_prompts_from_capitalised_bag_tokens():
  tok = gpt2_tokenizer()
  bag = tok.encode('The cat met Anna in Oslo.') + tok.encode('Hello')
  prompts = bs.make_prompts(tok, bag)
  firsts = {tok.decode([p[1]]) for p in prompts}
  assert firsts == {'The', 'Hello'}  # ' Anna', ' Oslo' start with a space
  assert all(p[0] == tok.bos_id for p in prompts)
  assert bs.make_prompts(tok, tok.encode(' the cat')) == [[tok.bos_id]]
  arr, mask = bs.prompt_batches(prompts + [[tok.bos_id, 5]], per_search=2)
  assert arr.shape == (2, 2, 2) and mask.tolist() == [
    [True, True],
    [True, False],
  ]
  arr, mask = bs.prompt_batches(prompts, per_search=1, pad_to=4)
  assert arr.shape == (4, 1, 2) and mask.sum() == 2


def test_best_sequences_deduplicates_and_drops_dead_beams():
  result = bs.BeamResult(
    tokens=jnp.asarray([[[1, 2], [1, 3]], [[1, 2], [1, 4]]]),
    scores=jnp.asarray([[-1.0, -3.0], [-1.0, -math.inf]]),
    prompt_length=1,
  )
  best = bs.best_sequences(result)
  assert best == [(-1.0, [1, 2]), (-3.0, [1, 3])]


@pytest.mark.slow
def test_a_padded_bag_changes_no_result():
  """The FILM pipeline pads the bag to a multiple of `bag_bucket` with
  copies of its first id, masked out: the search returns the same beams
  with the same scores, bit for bit, including searches with fewer bag
  tokens than beams (dead beams) and a diversity penalty."""
  model, params = tiny('llama')
  prompts = jnp.asarray([[[1, 5], [1, 9], [1, 17]]])
  bag = np.asarray([5, 9, 17, 22, 23, 40, 41, 60], np.int32)
  padded = np.full((64,), bag[0], np.int32)
  padded[: len(bag)] = bag
  mask = np.arange(64) < len(bag)
  for config in (
    bs.BeamSearchConfig(num_beams=12, length=3),
    bs.BeamSearchConfig(
      num_beams=6, num_groups=3, diversity_penalty=0.7, length=4
    ),
  ):
    exact = SEARCH(model, params, prompts, jnp.asarray(bag), config=config)
    wide = SEARCH(
      model,
      params,
      prompts,
      jnp.asarray(padded),
      bag_mask=jnp.asarray(mask),
      config=config,
    )
    np.testing.assert_array_equal(wide.tokens, exact.tokens)
    np.testing.assert_array_equal(wide.scores, exact.scores)
