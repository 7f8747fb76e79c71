"""Exact inversion of hidden states (Nikolaou et al., arXiv 2510.15511):
the kernel against a NumPy reference, tiny models inverted exactly, and
planted near-ties reported undecided rather than guessed."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax.attacks.inversion import (
  bei_hei,
  embed_parrot,
  exact,
  softmax_inverse,
)
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, llama


@functools.lru_cache(maxsize=None)
def tiny_llama():
  config = llama.LlamaConfig(
    vocab_size=200,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
  )
  return llama.init_model(config, key=jax.random.key(0))


@functools.lru_cache(maxsize=None)
def tiny_gpt2():
  return gpt2.init_model(gpt2.GPT2Config.tiny(n_layer=3), key=jax.random.key(1))


MODELS = {'llama': tiny_llama, 'gpt2': tiny_gpt2}


def observed_states(model, params, ids, layer):
  mask = jnp.ones(ids.shape, jnp.int32)
  return np.asarray(
    bei_hei.layer_states(model, params, jnp.asarray(ids), mask, (layer,))[0]
  )


def hei_scores(model, params, states):
  return np.asarray(
    exact.proposal_scores(jnp.asarray(states), model.word_embeddings(params))
  )


@pytest.mark.slow
@pytest.mark.parametrize('layer', [0, 2, 'last'])
@pytest.mark.parametrize('family', sorted(MODELS))
def test_the_checks_are_the_distances_of_each_rows_states(family, layer):
  # NumPy reference: the full rows' hidden states (no cache).
  model, params = MODELS[family]()
  prefix = np.asarray([[5, 17, 99]])
  cands = np.asarray([4, 8, 15, 16, 23, 42])
  rows = np.concatenate([np.repeat(prefix, 6, 0), cands[:, None]], 1)
  observed = observed_states(
    model, params, np.asarray([[5, 17, 99, 23]]), layer
  )
  states = observed_states(model, params, rows, layer)[:, 3]
  want = np.linalg.norm(states - observed[0, 3][None], axis=-1)
  cache = model.init_stream_cache(
    params, 1, 8, layer=exact._layer_index(model, layer)
  )
  full = model.init_cache(params, 1, 8)
  for tok in prefix[0]:
    cache, full, logp = exact.commit(
      model, params, cache, full, jnp.asarray([tok]), layer
    )
  dist = exact.check_candidates(
    model, params, cache, jnp.asarray(cands), jnp.asarray(observed[0, 3]), layer
  )
  np.testing.assert_allclose(np.asarray(dist), want, rtol=1e-4, atol=1e-4)
  assert np.asarray(dist)[4] < 1e-4  # 23 is the observed token
  logits = np.asarray(model.logits(params, prefix))[0, -1]
  ref = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
  np.testing.assert_allclose(np.asarray(logp), ref, rtol=1e-4, atol=1e-4)
  # One row of guesses: each guess's distance to its own position.
  guesses = np.asarray([23, 7, 7])
  row = np.concatenate([prefix[0], guesses])[None]
  row_states = observed_states(model, params, row, layer)[0, 3:]
  obs = np.concatenate([observed[0, 3:], observed[0, 3:], observed[0, 3:]])
  got = exact.check_guesses(
    model, params, cache, jnp.asarray(guesses), jnp.asarray(obs), layer
  )
  np.testing.assert_allclose(
    np.asarray(got),
    np.linalg.norm(row_states - obs, axis=-1),
    rtol=1e-4,
    atol=1e-4,
  )


@pytest.mark.parametrize('family', sorted(MODELS))
@pytest.mark.slow
def test_the_check_vmaps_over_sentences(family):
  # Three sentences, each its own cached prefix and observed state, checked
  # in one vmapped, jitted call: the same distances as one call each.
  model, params = MODELS[family]()
  layer = 2
  prefixes = np.asarray([[5, 17, 99], [3, 3, 60], [150, 2, 41]])
  cands = jnp.asarray([4, 8, 15, 16, 23, 42])
  truth = np.asarray([23, 4, 42])
  rows = np.concatenate([prefixes, truth[:, None]], 1)
  observed = jnp.asarray(observed_states(model, params, rows, layer)[:, 3])
  caches = []
  for prefix in prefixes:
    cache = model.init_stream_cache(params, 1, 8, layer=layer)
    _, cache = model.stream_decode(
      params, cache, jnp.asarray(prefix[None]), layer=layer
    )
    caches.append(cache)
  one_each = np.stack(
    [
      exact.check_candidates(model, params, c, cands, o, layer)
      for c, o in zip(caches, observed, strict=True)
    ]
  )
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *caches)
  batched = jax.jit(
    jax.vmap(
      lambda c, o: exact.check_candidates(model, params, c, cands, o, layer)
    )
  )(stacked, observed)
  np.testing.assert_allclose(
    np.asarray(batched), one_each, rtol=1e-5, atol=1e-5
  )
  # Each sentence's true token is its nearest candidate.
  assert (
    np.asarray(cands)[np.asarray(batched).argmin(1)].tolist() == truth.tolist()
  )


@pytest.mark.slow
@pytest.mark.parametrize('family', sorted(MODELS))
@pytest.mark.parametrize('layer', [1, 3, 'last'])
def test_tiny_models_are_inverted_exactly(family, layer):
  # HEI's ranking is poor past layer 0 on a random model: the search goes
  # down the vocabulary, and the states still pick out every token.
  model, params = MODELS[family]()
  vocab = model.vocab_size
  ids = np.asarray(jax.random.randint(jax.random.key(5), (2, 7), 0, vocab))
  states = observed_states(model, params, ids, layer)
  scores = hei_scores(model, params, states)
  config = exact.ExactConfig(first_chunk=8, chunk=64)
  for row in range(2):
    got = exact.invert_sentence(
      model,
      params,
      states[row],
      7,
      layer=layer,
      scores=scores[row],
      config=config,
    )
    assert got.ids == ids[row].tolist()
    assert all(got.decided)
    assert min(got.checked) >= 1


@pytest.mark.slow
def test_the_proposals_order_checks_the_best_first():
  # The true token ranked 5th by the proposals: found in the first chunk.
  model, params = tiny_llama()
  ids = np.asarray([[7, 11, 13, 17, 19]])
  states = observed_states(model, params, ids, 2)
  scores = np.zeros((5, model.vocab_size), np.float32)
  for t in range(5):
    scores[t, (ids[0, t] + np.arange(1, 5)) % 200] = 1.0  # 4 wrong first
    scores[t, ids[0, t]] = 0.5
  got = exact.invert_sentence(
    model,
    params,
    states[0],
    5,
    layer=2,
    scores=scores,
    config=exact.ExactConfig(first_chunk=8, chunk=32, prior_top=0),
  )
  assert got.ids == ids[0].tolist()
  assert got.checked == [5] * 5


@pytest.mark.parametrize('prior_top', [0, 4, 16])
@pytest.mark.parametrize('ties', [False, True])
def test_the_proposal_head_is_the_orders_first_entries(prior_top, ties):
  rng = np.random.default_rng(prior_top)
  for trial in range(20):
    v = int(rng.integers(5, 400))
    scores = rng.standard_normal(v).astype(np.float32)
    prior = rng.standard_normal(v).astype(np.float32)
    if ties:  # many equal values, so the heads' boundaries fall in ties
      scores, prior = np.round(scores), np.round(prior * 2)
    config = exact.ExactConfig(
      first_chunk=int(rng.integers(1, 12)), prior_top=prior_top
    )
    for with_prior in (prior, None):
      full = exact.proposal_order(scores, with_prior, config)
      for n in (1, config.first_chunk, 40):
        head = exact.proposal_head(scores, with_prior, config, n)
        assert len(head) >= min(n, v), (trial, n)
        np.testing.assert_array_equal(head, full[: len(head)])


@pytest.mark.slow
def test_a_planted_near_tie_is_undecided_not_guessed():
  # Tokens 40 and 41 share one embedding: their states are identical, so
  # nothing tells them apart and the position is reported undecided.
  model, params = tiny_llama()
  emb = model.word_embeddings(params)

  def twin(leaf):
    if leaf.shape == emb.shape and bool(jnp.all(leaf == emb)):
      return leaf.at[41].set(leaf[40])
    return leaf

  params = jax.tree.map(twin, params)
  ids = np.asarray([[3, 9, 40, 12, 5]])
  states = observed_states(model, params, ids, 2)
  scores = hei_scores(model, params, states)[0]
  got = exact.invert_sentence(
    model,
    params,
    states[0],
    5,
    layer=2,
    scores=scores,
    config=exact.ExactConfig(first_chunk=8, chunk=64),
  )
  assert got.decided[2] is False and got.ids[2] in (40, 41)
  assert all(got.decided[t] for t in (0, 1, 3, 4))
  assert [got.ids[t] for t in (0, 1, 3, 4)] == [3, 9, 12, 5]


@pytest.mark.slow
def test_the_nearest_rule_recovers_noisy_states():
  model, params = tiny_gpt2()
  ids = np.asarray(jax.random.randint(jax.random.key(8), (1, 6), 0, 512))
  states = observed_states(model, params, ids, 2)
  noisy = states + 1e-3 * np.asarray(
    jax.random.normal(jax.random.key(9), states.shape)
  )
  scores = hei_scores(model, params, noisy)
  strict = exact.invert_sentence(
    model,
    params,
    noisy[0],
    6,
    layer=2,
    scores=scores[0],
    config=exact.ExactConfig(rel_tol=1e-7, chunk=128),
  )
  assert not all(strict.decided)  # the tolerance rule refuses noise
  got = exact.invert_sentence(
    model,
    params,
    noisy[0],
    6,
    layer=2,
    scores=scores[0],
    config=exact.ExactConfig(rule='nearest', chunk=128),
  )
  assert got.ids == ids[0].tolist() and all(got.decided)


def _noisy_llama_sentence(rel: float):
  """A BOS-first sentence of the tiny Llama (BOS id 1) and its layer-2
  states with Gaussian noise of `rel` x their rms on every coordinate."""
  model, params = tiny_llama()
  model = dataclasses.replace(model, tokenizer=types.SimpleNamespace(bos_id=1))
  ids = np.asarray([[1, 3, 9, 40, 12, 5, 77, 150]])
  states = observed_states(model, params, ids, 2)
  std = rel * float(np.sqrt(np.mean(states[0, 1:] ** 2)))
  noise = np.asarray(jax.random.normal(jax.random.key(9), states.shape))
  return model, params, ids[0], states[0] + std * noise[0]


@pytest.mark.slow
def test_the_calibrated_rule_reads_the_noise_off_the_bos():
  model, params, ids, noisy = _noisy_llama_sentence(0.2)
  scores = hei_scores(model, params, noisy)
  run = functools.partial(
    exact.invert_sentence, model, params, noisy, 8, layer=2, scores=scores
  )
  nearest = run(config=exact.ExactConfig(rule='nearest', chunk=64))
  # The gap rule cannot tell at this noise: it checks the whole vocabulary.
  assert max(nearest.checked) == 200 and not all(nearest.decided)
  calibrated = exact.ExactConfig(rule='calibrated', chunk=32, noise_confirm=64)
  got = run(config=calibrated)
  assert got.ids == ids.tolist() and all(got.decided)
  # Position 1 the whole vocabulary's table; then each position the
  # nearest of its first chunk, within the early tolerance, or (positions
  # 2 and 5) the nearest of the first noise_confirm, every candidate
  # compared counted.
  assert got.checked == [1, 200, 64, 32, 32, 64, 32, 32]
  # With the true token of position 3 out of the budget, no candidate is
  # within the tolerance: the nearest is taken, undecided.
  hidden = scores.copy()
  hidden[3, ids[3]] = -1e9
  cut = run(
    scores=hidden,
    config=dataclasses.replace(calibrated, max_candidates=64, noise_confirm=72),
  )
  assert cut.decided[3] is False and cut.ids[3] != ids[3]
  assert cut.checked[3] == 64


def test_the_calibrated_rule_keeps_the_tolerance_rules_floor():
  # A BOS sent exactly, the rest moved by far less than the tolerance
  # rule's 1e-3 (rounding of another batch): the BOS's residual alone
  # would give a tolerance of 0, which no candidate meets.
  model, params, ids, clean = _noisy_llama_sentence(0.0)
  noisy = clean.copy()
  noisy[1:] += 3e-5 * float(np.abs(clean[1:]).max())
  got = exact.invert_sentence(
    model,
    params,
    noisy,
    8,
    layer=2,
    scores=hei_scores(model, params, noisy),
    config=exact.ExactConfig(rule='calibrated', noise_confirm=64),
  )
  assert got.ids == ids.tolist() and all(got.decided)
  # The BOS, the first position's table (the vocabulary), then each
  # position's first chunk (128 candidates).
  assert got.checked == [1, 200] + [128] * 6


def test_the_calibrated_rule_never_accepts_a_proposal_unseen():
  # Position 3's state lies between the true token's and a wrong one's,
  # nearer the true one; the wrong one is proposed first and is within
  # any tolerance. The speculative row of the tolerance rule would take
  # it; the calibrated rule compares it with the rest of its chunk.
  model, params, ids, noisy = _noisy_llama_sentence(0.05)
  wrong_ids = ids.copy()
  wrong_ids[3] = 120
  clean = observed_states(model, params, ids[None], 2)[0]
  wrong = observed_states(model, params, wrong_ids[None], 2)[0]
  noisy[3] = noisy[3] + 0.3 * (wrong[3] - clean[3])
  scores = hei_scores(model, params, noisy).copy()
  scores[3, 120] = 10.0  # the first proposal
  wide = exact.ExactConfig(
    rule='calibrated', chunk=32, noise_z_early=1e5, noise_z=1e5
  )
  got = exact.invert_sentence(
    model, params, noisy, 8, layer=2, scores=scores, config=wide
  )
  assert got.ids == ids.tolist()
  d = np.linalg.norm(noisy[3] - np.stack([clean[3], wrong[3]]), axis=-1)
  assert (
    d[0]
    < d[1]
    <= exact.noise_tolerance_of(
      [float(np.sum((noisy[0] - clean[0]) ** 2))], 1e5, noisy.shape[-1]
    )
  )


@pytest.mark.parametrize('layer', [2, 'last'])
@pytest.mark.parametrize('family', sorted(MODELS))
@pytest.mark.slow
def test_the_first_position_table_is_every_tokens_state_after_the_bos(
  family, layer
):
  # NumPy reference: the full rows [BOS, token] of every token (no cache).
  model, params = MODELS[family]()
  model = dataclasses.replace(model, tokenizer=types.SimpleNamespace(bos_id=1))
  table = exact.first_states(model, params, layer, chunk=48)
  vocab = model.vocab_size
  rows = np.stack([np.ones(vocab, np.int64), np.arange(vocab)], 1)
  want = observed_states(model, params, rows, layer)[:, 1]
  assert table.shape == want.shape
  np.testing.assert_allclose(table, want, rtol=1e-4, atol=1e-4)


def test_the_calibrated_rule_compares_every_token_at_the_first_position():
  # The true first token last in the order and past the budget: the
  # table still holds its state, so it is found, and computed once for
  # all the rows of invert.
  model, params, ids, noisy = _noisy_llama_sentence(0.2)
  scores = hei_scores(model, params, noisy).copy()
  scores[1, ids[1]] = -1e9
  config = exact.ExactConfig(
    rule='calibrated', chunk=32, noise_confirm=64, max_candidates=64
  )
  calls = []
  table = exact.first_states(model, params, 2)

  def counted(*args, **kwargs):
    calls.append(1)
    return table

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(exact, 'first_states', counted)
    got = exact.invert(
      model,
      params,
      np.stack([noisy, noisy]),
      np.asarray([8, 8]),
      layer=2,
      scores=np.stack([scores, scores]),
      config=config,
    )
  assert len(calls) == 1
  for inv in got:
    assert inv.ids == ids.tolist() and inv.decided[1]
    assert inv.checked[1] == model.vocab_size


@pytest.mark.parametrize('k', [1, 16])
def test_the_noise_tolerance_covers_the_true_residual(k):
  # Residuals of i.i.d. Gaussian noise on D coordinates: the true token's
  # squared residual is within z standard deviations of the estimate from
  # k others about Phi(z) of the time (a normal approximation of the
  # chi-square), for any sigma; more residuals, a tighter tolerance.
  dim, z = 576, 2.0
  rng = np.random.default_rng(0)
  sigma = 3.0
  noise = sigma * rng.standard_normal((4000, k + 1, dim))
  sq = np.sum(noise**2, axis=-1)
  within = [
    sq[i, -1] <= exact.noise_tolerance_of(sq[i, :-1], z, dim) ** 2
    for i in range(len(sq))
  ]
  assert abs(np.mean(within) - 0.977) < 0.012
  est = [dim * sigma**2] * k
  assert exact.noise_tolerance_of(est * 2, z, dim) < exact.noise_tolerance_of(
    est, z, dim
  )


def test_the_calibrated_rule_needs_a_bos():
  model, params = tiny_llama()
  states = observed_states(model, params, np.asarray([[3, 9, 40]]), 2)
  with pytest.raises(LeakjaxError, match='no BOS'):
    exact.invert_sentence(
      model,
      params,
      states[0],
      3,
      layer=2,
      scores=hei_scores(model, params, states)[0],
      config=exact.ExactConfig(rule='calibrated'),
    )


@pytest.mark.parametrize(
  'changes',
  [dict(rule='closest'), dict(rel_tol=0.0), dict(gap=1.0), dict(chunk=0)],
)
def test_bad_settings_are_refused(changes):
  with pytest.raises(LeakjaxError):
    exact.ExactConfig(**changes)


@pytest.mark.slow
@pytest.mark.parametrize('prefix', [False, True])
@pytest.mark.parametrize('layer', [0, 2, 3])
@pytest.mark.parametrize('family', sorted(MODELS))
def test_stream_decode_in_two_chunks_equals_hidden_states(
  family, layer, prefix
):
  model, params = MODELS[family]()
  if prefix:  # a model without its own cache recomputes the prefix
    model = model.replace(
      stream_cache_fn=None, stream_decode_fn=None, stream_candidates_fn=None
    )
  ids = np.asarray(jax.random.randint(jax.random.key(5), (2, 7), 0, 200))
  want = np.asarray(model.hidden_states(params, ids))[layer]
  cache = model.init_stream_cache(params, 2, 10, layer=layer)
  first, cache = model.stream_decode(params, cache, ids[:, :3], layer=layer)
  second, _ = model.stream_decode(params, cache, ids[:, 3:], layer=layer)
  got = np.concatenate([first, second], axis=1)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['native', 'broadcast', 'no_cache'])
@pytest.mark.parametrize('layer', [0, 2, 3])
@pytest.mark.parametrize('family', sorted(MODELS))
def test_stream_candidates_are_each_rows_own_states(family, layer, kind):
  # Alternatives after one cached prefix: each candidate's state equals its
  # own full row's, whether the family reads the prefix in place (native),
  # the cache is copied per candidate, or the prefix is recomputed.
  model, params = MODELS[family]()
  if kind != 'native':
    model = model.replace(stream_candidates_fn=None)
  if kind == 'no_cache':
    model = model.replace(stream_cache_fn=None, stream_decode_fn=None)
  prefix = np.asarray([[5, 17, 99, 3]])
  cands = np.asarray([4, 8, 15, 16, 23, 42, 199])
  rows = np.concatenate([np.repeat(prefix, len(cands), 0), cands[:, None]], 1)
  want = np.asarray(model.hidden_states(params, rows))[layer][:, -1]
  cache = model.init_stream_cache(params, 1, 9, layer=layer)
  _, cache = model.stream_decode(params, cache, prefix, layer=layer)
  got = jax.jit(model.stream_candidates, static_argnames='layer')(
    params, cache, jnp.asarray(cands), layer=layer
  )
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('family', sorted(MODELS))
def test_stream_candidates_need_a_one_row_stream_cache(family):
  model, params = MODELS[family]()
  cache = model.init_stream_cache(params, 2, 9, layer=2)
  with pytest.raises(LeakjaxError, match='one row'):
    model.stream_candidates(params, cache, jnp.asarray([1, 2]), layer=2)
  with pytest.raises(LeakjaxError, match='needs stream_decode'):
    model.replace(
      stream_cache_fn=None, stream_decode_fn=None
    )  # the family's candidates read its own stream cache


@pytest.mark.slow
def test_twins_are_every_token_within_the_tolerance():
  # The projection window finds exactly what a full scan finds.
  rng = np.random.default_rng(1)
  emb = rng.standard_normal((3000, 16)).astype(np.float32)
  emb[7] = emb[3]
  emb[9] = emb[3] * (1 + 2e-4)
  emb[11] = emb[3] + 0.01 * np.linalg.norm(emb[3]) / 4  # outside 1e-3
  twins = exact._Twins(emb, 1e-3)
  for tok in (3, 7, 9, 11, 0, 100):
    d = np.linalg.norm(emb - emb[tok], axis=1)
    want = np.flatnonzero(d <= 1e-3 * np.linalg.norm(emb[tok]))
    assert twins(tok).tolist() == want[want != tok].tolist()
  assert twins(3).tolist() == [7, 9]


def _mixed_llama():
  # The tiny Llama with its block matrices doubled: deep enough states that
  # a linear read-out misranks some tokens (at init the blocks barely touch
  # the residual stream and every read-out is perfect).
  model, params = tiny_llama()
  params = {
    k: jax.tree.map(lambda x: 2 * x if x.ndim == 2 else x, v)
    if k.startswith('layers')
    else v
    for k, v in params.items()
  }
  return model, params


@pytest.mark.slow
def test_the_softmax_inverse_ranks_held_out_tokens_higher_than_the_ridge():
  model, params = _mixed_llama()
  rng = np.random.default_rng(0)

  def texts(n):
    ids = rng.integers(0, model.vocab_size, (n, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    hidden, h0 = bei_hei.layer_states_of_many(
      model, params, ids, mask, ('3', '0')
    )
    return ids, mask, hidden, h0

  ids, mask, hidden, h0 = texts(100)
  test_ids, _, test_hidden, _ = texts(30)
  stats = embed_parrot.feature_stats(hidden, mask)
  ridge = embed_parrot.ridge_solution(hidden, h0, mask, stats)
  embeddings = model.word_embeddings(params)
  config = softmax_inverse.SoftmaxInverseConfig(steps=150, batch_size=256)
  soft = softmax_inverse.fit(
    hidden, ids, mask, stats, ridge, embeddings, config
  )

  def mean_rank(kernel, bias):
    scores = np.asarray(
      exact.proposal_scores(
        jnp.asarray(test_hidden.reshape(-1, hidden.shape[-1])),
        embeddings,
        kernel,
        bias,
        stats['input_shift'],
        stats['input_scale'],
      )
    )
    true = test_ids.reshape(-1)
    return np.mean(scores > scores[np.arange(len(true)), true][:, None]) * 200

  ridge_rank, soft_rank = mean_rank(*ridge), mean_rank(*soft)
  assert ridge_rank > 0.2  # the ridge misranks held-out tokens
  assert soft_rank < 0.85 * ridge_rank
  # The same training is the same inverse.
  again = softmax_inverse.fit(
    hidden, ids, mask, stats, ridge, embeddings, config
  )
  np.testing.assert_array_equal(again[0], soft[0])


@pytest.mark.parametrize(
  'changes', [dict(steps=0), dict(learning_rate=0.0), dict(pull=-1.0)]
)
def test_bad_softmax_inverse_settings_are_refused(changes):
  with pytest.raises(LeakjaxError):
    softmax_inverse.SoftmaxInverseConfig(**changes)


def test_the_softmax_inverse_needs_a_token():
  model, params = tiny_llama()
  zeros = np.zeros((2, 4), np.int32)
  hidden = np.zeros((2, 4, 32), np.float32)
  stats = {'input_shift': np.zeros(32), 'input_scale': np.ones(32)}
  ridge = (np.eye(32, dtype=np.float32), np.zeros(32, np.float32))
  with pytest.raises(LeakjaxError, match='no token'):
    softmax_inverse.fit(
      hidden, zeros, zeros, stats, ridge, model.word_embeddings(params)
    )
