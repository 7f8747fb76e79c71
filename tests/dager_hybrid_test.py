"""The hybrid of FILM and DAGER (leakjax.attacks.dager.hybrid).

Kernels against NumPy (bigram counts, the top-direction span), then the
search on tiny random models (GPT-2 with learned positions, Llama with
RoPE; vocab 101, width 32, 2 blocks, from dager_test.py) fed the FedSGD
gradient of a 2-sentence batch that starts with a common BOS, shortlisting
every candidate (16): below the rank limit the span term decides every
step, so the first search must return one sentence of the batch token for
token and the second, which penalises the first one's bigrams, the other.
"""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dager_test import D, V, pad, tiny  # the same tiny models

from leakjax import fl
from leakjax._jit import jitted
from leakjax.attacks.dager import hybrid
from leakjax.attacks.dager import search as sr
from leakjax.attacks.dager.pipeline import head_path
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import get_path

# The kernels as the host loop calls them: the loop's own jitted wrappers
# (`leakjax._jit.jitted`, cached per kernel and options), the model and the
# settings static.
hybrid_search = jitted(
  hybrid.hybrid_search, static_argnames=('model', 'config')
)
hybrid_beams = jitted(hybrid.hybrid_beams, static_argnames=('model', 'config'))
block_span = jitted(
  hybrid.block_span, static_argnames=('model', 'block', 'drop', 'span_config')
)
span_candidates = jitted(
  hybrid.span_candidates, static_argnames=('model', 'span_config')
)
select_by_gradient = jitted(
  hybrid.select_by_gradient, static_argnames=('k', 'max_swaps')
)
pool_head_gradients = jitted(
  hybrid.pool_head_gradients, static_argnames=('model',)
)
raw_head_rows = jitted(hybrid.raw_head_rows, static_argnames=('model',))
start_counts = jitted(hybrid.start_counts, static_argnames=('dims',))

BOS = V - 1
END = 99  # what the search is told is the sentence end ('.')
# Distinct tokens per sentence (no repeats, so the bigram ban is harmless),
# each ending with END: the last token has no gradient, so which sentence
# end comes last is the LM's call, as '.' is on a real model.
_PERM = (1 + np.random.default_rng(1).permutation(V - 3)).tolist()
ROWS = [[BOS] + _PERM[:7] + [END], [BOS] + _PERM[8:13] + [END]]
# Below the rank limit a true extension's span term is ~log(0.035 / 1e-6)
# ~ 10 per token, so the penalty on an earlier sentence's bigrams must be
# of that size to move the second search to the other sentence.
CONFIG = hybrid.HybridConfig(
  beams=4,
  shortlist=16,
  max_length=12,
  weight_lm=0.1,
  weight_diverse=20.0,
  bag_bucket=8,
  span_block=1,  # the tiny models have two blocks
  # Below the limit a wrong extension is far from the span: with a low
  # reference every wrong continuation scores below a sentence end (0).
  reference_quantile=0.1,
  end_as_best=False,
  weight_head=0.0,  # the span alone decides (the head term: test below)
  head_sample_length=12,  # the tiny models' context is 16
)


def numpy_bigram_counts(last, candidates, taken, taken_length, skip=None):
  skip = np.ones(len(taken), int) if skip is None else np.maximum(skip, 1)
  out = np.zeros((len(last), len(candidates)), np.int64)
  for k, a in enumerate(last):
    for c, b in enumerate(candidates):
      for row, n, s in zip(taken, taken_length, skip):
        out[k, c] += sum(
          row[p] == a and row[p + 1] == b for p in range(s, n - 1)
        )
  return out


def test_bigram_counts_match_numpy():
  rng = np.random.default_rng(0)
  taken = rng.integers(0, 6, (5, 9)).astype(np.int32)
  taken_length = np.array([9, 4, 0, 2, 7], np.int32)
  last = rng.integers(0, 6, 7).astype(np.int32)
  candidates = np.arange(6, dtype=np.int32)
  got = hybrid.bigram_counts(
    jnp.asarray(last),
    jnp.asarray(candidates),
    jnp.asarray(taken),
    jnp.asarray(taken_length),
  )
  want = numpy_bigram_counts(last, candidates, taken, taken_length)
  np.testing.assert_array_equal(np.asarray(got), want)
  assert want.sum() > 0  # the draw holds bigrams to count
  # Skipping each row's first few bigrams (0 counts as 1: BOS's).
  skip = np.array([3, 0, 2, 1, 5], np.int32)
  got = hybrid.bigram_counts(
    *(jnp.asarray(x) for x in (last, candidates, taken, taken_length, skip))
  )
  fewer = numpy_bigram_counts(last, candidates, taken, taken_length, skip)
  np.testing.assert_array_equal(np.asarray(got), fewer)
  assert 0 < fewer.sum() < want.sum()


def test_top_span_projects_on_the_top_singular_vectors():
  grad = np.random.default_rng(0).normal(size=(12, 20)).astype(np.float32)
  span = hybrid.top_span(jnp.asarray(grad), 4)
  u = np.linalg.svd(grad.astype(np.float64))[0][:, :8]
  got = np.asarray(span.basis, np.float64)
  np.testing.assert_allclose(got @ got.T, u @ u.T, atol=1e-5)
  assert int(span.rank) == 8 and not bool(span.valid)


@functools.cache
def gradient(family):
  model, params = tiny(family)
  ids, mask = pad(ROWS)
  return fl.client_gradient(
    model, params, ids, mask, defense=fl.Defense(), key=jax.random.key(0)
  )


def search(family, taken_rows, config=CONFIG, kernel=hybrid_search):
  model, params = tiny(family)
  grads = gradient(family)
  span2 = block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  assert bool(span2.valid)  # 13 input positions < d = 32
  # The batch's tokens and three that are not in it.
  real = sorted({v for r in ROWS for v in r[1:]} | set(_PERM[20:23]))
  cands = np.asarray(real + [0] * (-len(real) % 8), np.int32)
  valid = np.arange(len(cands)) < len(real)
  is_end = (cands == END) & valid
  taken = np.zeros((len(ROWS), CONFIG.max_length), np.int32)
  taken_len = np.zeros((len(ROWS),), np.int32)
  for i, r in enumerate(taken_rows):
    taken[i, : len(r)] = r
    taken_len[i] = len(r)
  row, length, score = kernel(
    model,
    params,
    span2,
    jnp.asarray(cands),
    jnp.asarray(valid),
    jnp.asarray(is_end),
    jnp.asarray(taken),
    jnp.asarray(taken_len),
    jnp.asarray(BOS, jnp.int32),
    config=config.search,
  )
  assert np.isfinite(float(score))
  return np.asarray(row)[: int(length)].tolist()


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_search_recovers_each_sentence_in_turn(family):
  first = search(family, [])
  assert first in ROWS
  second = search(family, [first])
  assert second in ROWS and second != first


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_start_penalty_moves_the_next_search_to_another_first_word(family):
  # Without penalties the second search repeats the first sentence; the
  # first-word penalty alone (BOS bigrams are not in the bigram penalty)
  # sends it to the other sentence.
  free = dataclasses.replace(CONFIG, weight_diverse=0.0)
  first = search(family, [], free)
  assert search(family, [first], free) == first
  start = dataclasses.replace(free, weight_start=50.0)
  second = search(family, [first], start)
  assert second in ROWS and second[1] != first[1]


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_default_search_leaves_the_end_to_the_lm(family):
  # The default scores a sentence end like the best continuation: every
  # token with a gradient still comes from the span, but where the
  # sentence ends is the (here random) LM's call.
  default = hybrid.HybridConfig()
  config = dataclasses.replace(
    CONFIG,
    weight_diverse=default.weight_diverse,
    reference_quantile=default.reference_quantile,
    end_as_best=default.end_as_best,
  )
  got = search(family, [], config)
  assert got[-1] == END
  assert any(got[:-1] == row[: len(got) - 1] for row in ROWS)


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_beams_are_ranked_and_lead_with_the_search_sentence(family):
  # hybrid_beams returns every final beam, best first; its first row is
  # hybrid_search's sentence, and the others differ from it.
  model, params = tiny(family)
  grads = gradient(family)
  span2 = block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  real = sorted({v for r in ROWS for v in r[1:]} | set(_PERM[20:23]))
  cands = np.asarray(real + [0] * (-len(real) % 8), np.int32)
  valid = np.arange(len(cands)) < len(real)
  args = (
    model,
    params,
    span2,
    jnp.asarray(cands),
    jnp.asarray(valid),
    jnp.asarray((cands == END) & valid),
    jnp.zeros((1, CONFIG.max_length), jnp.int32),
    jnp.zeros((1,), jnp.int32),
    jnp.asarray(BOS, jnp.int32),
  )
  row, length, score = hybrid_search(*args, config=CONFIG.search)
  rows, lengths, keys = map(
    np.asarray, hybrid_beams(*args, config=CONFIG.search)
  )
  assert rows.shape == (CONFIG.beams, CONFIG.max_length)
  np.testing.assert_array_equal(rows[0], np.asarray(row))
  assert lengths[0] == int(length) and keys[0] == pytest.approx(float(score))
  assert np.all(np.diff(keys[np.isfinite(keys)]) <= 0)
  best = rows[0][: lengths[0]].tolist()
  assert best in ROWS
  others = [
    rows[k][: lengths[k]].tolist()
    for k in range(1, CONFIG.beams)
    if np.isfinite(keys[k])
  ]
  assert others and all(o != best for o in others)


def test_pool_variants_hold_each_searchs_alternatives_once():
  model, _ = tiny('gpt2')
  config = dataclasses.replace(CONFIG, cuts=False)
  seqs = [[BOS, 1, 2, END], [BOS, 3, 4, END]]
  alternatives = [[[BOS, 1, 5, END], [BOS, 1, 2, END]], []]
  variants, owner = hybrid.pool_variants(model, seqs, config, alternatives)
  assert variants == [seqs[0], [BOS, 1, 5, END], seqs[1]]
  assert owner == [0, 0, 1]
  assert hybrid.pool_variants(model, seqs, config) == (seqs, [0, 1])


@pytest.mark.slow
def test_search_compiles_once_for_new_taken_rows():
  search('gpt2', [])
  size = hybrid_search._cache_size()
  search('gpt2', [ROWS[0]])
  assert hybrid_search._cache_size() == size


@pytest.mark.slow
def test_host_settings_never_recompile_the_search():
  # The kernel's static config holds only what it reads: the selection's
  # and the host loop's settings give the same SearchConfig, so the search
  # compiles once and returns the same sentence, bit for bit.
  first = search('gpt2', [])
  size = hybrid_search._cache_size()
  host = dataclasses.replace(
    CONFIG,
    oversample=2.0,
    cuts=True,
    pool_beams=2,
    select_weight=1.0,
    select_whiten=True,
    start_dims=4,
    head_samples=8,
    bag_bucket=16,
  )
  assert host.search == CONFIG.search and hash(host.search) == hash(
    CONFIG.search
  )
  assert search('gpt2', [], config=host) == first
  assert hybrid_search._cache_size() == size
  # A setting the kernel reads does compile anew.
  search('gpt2', [], config=dataclasses.replace(CONFIG, weight_span=0.5))
  assert hybrid_search._cache_size() == size + 1
  assert set(f.name for f in dataclasses.fields(hybrid.SearchConfig)) < set(
    f.name for f in dataclasses.fields(hybrid.HybridConfig)
  )


@pytest.mark.slow
def test_kernels_run_eagerly_and_under_a_users_own_jit():
  # The kernels are plain functions: called eagerly, or jitted by the
  # user, they give what the host loop's wrappers give.
  first = search('gpt2', [])
  own = jax.jit(hybrid.hybrid_search, static_argnames=('model', 'config'))
  assert search('gpt2', [], kernel=own) == first
  assert search('gpt2', [], kernel=hybrid.hybrid_search) == first
  model, params = tiny('gpt2')
  grads = gradient('gpt2')
  config = hybrid.HybridConfig().span
  np.testing.assert_array_equal(
    np.asarray(hybrid.span_candidates(model, params, grads, config)),
    np.asarray(span_candidates(model, params, grads, config)),
  )
  eager = hybrid.block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  jit = block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  assert int(eager.rank) == int(jit.rank) and bool(eager.valid)
  cands = jnp.arange(V, dtype=jnp.int32)
  np.testing.assert_array_equal(
    np.asarray(hybrid.raw_head_rows(model, grads, cands)),
    np.asarray(raw_head_rows(model, grads, cands)),
  )
  rng = np.random.default_rng(0)
  features = jnp.asarray(rng.normal(size=(14, 20)) + 0.3)
  target = jnp.asarray(rng.normal(size=20) + 1.0)
  np.testing.assert_array_equal(
    np.asarray(hybrid.select_by_gradient(features, target, 5)),
    np.asarray(select_by_gradient(features, target, 5)),
  )


def test_config_and_recover_refuse_bad_input():
  with pytest.raises(LeakjaxError, match='shortlist'):
    hybrid.HybridConfig(shortlist=0)
  with pytest.raises(LeakjaxError, match='reference_quantile'):
    hybrid.HybridConfig(reference_quantile=1.5)
  with pytest.raises(LeakjaxError, match='span_block'):
    hybrid.HybridConfig(span_block=0)
  with pytest.raises(LeakjaxError, match='head_samples'):
    hybrid.HybridConfig(head_samples=1)
  with pytest.raises(LeakjaxError, match='head_shrinkage'):
    hybrid.HybridConfig(head_shrinkage=-0.1)
  with pytest.raises(LeakjaxError, match='weight_start'):
    hybrid.HybridConfig(weight_start=-1.0)
  with pytest.raises(LeakjaxError, match='oversample'):
    hybrid.HybridConfig(oversample=0.5)
  with pytest.raises(LeakjaxError, match='pool_beams'):
    hybrid.HybridConfig(beams=4, pool_beams=5)
  with pytest.raises(LeakjaxError, match='pool_beams'):
    hybrid.HybridConfig(pool_beams=0)
  model, params = tiny('gpt2')
  with pytest.raises(LeakjaxError, match='num_sentences'):
    hybrid.recover(model, params, gradient('gpt2'), 0)
  with pytest.raises(LeakjaxError, match='BOS'):  # no tokenizer
    hybrid.recover(model, params, gradient('gpt2'), 2)


@pytest.mark.slow
def test_span_candidates_are_the_filter_or_the_closest_tokens():
  model, params = tiny('gpt2')
  grads = gradient('gpt2')
  config = hybrid.HybridConfig().span
  mask, res, _ = sr.token_filter(model, params, grads, config=config)
  got = span_candidates(model, params, grads, config)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(mask))
  assert np.asarray(got).sum() == len({v for r in ROWS for v in r[:-1]})
  # A full-rank block-1 gradient: no gap, so the closest tokens, as many
  # as the rank limit allows (0.97 d = 31 of d = 32).
  noisy = jax.tree.map(
    lambda g: g + 1e-2 * jax.random.normal(jax.random.key(1), g.shape), grads
  )
  _, res, span1 = sr.token_filter(model, params, noisy, config=config)
  assert not bool(span1.valid)
  got = np.asarray(span_candidates(model, params, noisy, config))
  k = min(int(span1.rank), int(config.max_rank_fraction * D))
  np.testing.assert_array_equal(
    np.flatnonzero(got), np.sort(np.argsort(np.asarray(res))[:k])
  )


def head_matrix(model, params):
  w = np.asarray(get_path(params, head_path(model)), np.float64)
  return w.T if model.paths.lm_head is not None else w  # [V, d]


@pytest.mark.parametrize('family', ('gpt2', 'llama'))
@pytest.mark.slow
def test_head_readout_reads_the_head_input_back_from_the_logits(family):
  model, params = tiny(family)
  w = head_matrix(model, params)
  readout = np.asarray(hybrid.head_readout(model, params), np.float64)
  h = np.random.default_rng(0).normal(size=(5, D))
  np.testing.assert_allclose((h @ w.T) @ readout, h, atol=1e-4)
  # The model's own logits lie in the head's range (no bias): reading the
  # input back and applying the head gives them again.
  ids, mask = pad(ROWS)
  z = np.asarray(model.logits(params, ids, mask), np.float64)
  np.testing.assert_allclose(z @ readout @ w.T, z, atol=1e-4)


def test_whitening_matches_numpy():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6)) + 3.0
  mean, white = hybrid.whitening(jnp.asarray(x, jnp.float32), 0.1)
  cov = np.cov(x.T)
  cov += 0.1 * np.trace(cov) / 6 * np.eye(6)
  white = np.asarray(white, np.float64)
  np.testing.assert_allclose(np.asarray(mean), x.mean(0), rtol=1e-5)
  np.testing.assert_allclose(white, white.T, atol=1e-5)
  np.testing.assert_allclose(white @ cov @ white, np.eye(6), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_head_score_names_each_next_token(family):
  model, params = tiny(family)
  grads = gradient(family)
  cands = np.arange(V - 1, dtype=np.int32)  # every token but BOS
  config = CONFIG
  score = functools.partial(
    hybrid.head_score,
    model,
    params,
    grads,
    jnp.asarray(cands),
    jnp.asarray(BOS, jnp.int32),
    key=jax.random.key(0),
    config=config,
  )
  head = score()
  # The rows against NumPy: negated, centred on μ, whitened, unit norm.
  g = head_matrix(model, grads)[cands]
  mu = np.asarray(head.mean, np.float64)
  white = np.asarray(head.whiten, np.float64)
  rows = -g
  rows = rows - np.outer(rows @ mu / (mu @ mu), mu)
  rows = rows @ white
  norm = np.linalg.norm(rows, axis=1, keepdims=True)
  rows = rows / norm
  np.testing.assert_allclose(np.asarray(head.rows), rows, rtol=1e-4, atol=1e-5)
  # Padding marks change no row.
  valid = np.arange(len(cands)) < 50
  half = score(valid=jnp.asarray(valid))
  np.testing.assert_allclose(np.asarray(half.rows), rows, rtol=1e-4, atol=1e-5)
  # Given the true prefix, the true next token scores highest among the
  # 100 candidates at every position, except after BOS, where the two
  # sentences' first tokens share the one context (rank 0 or 1).
  ids, mask = pad(ROWS)
  z = model.logits(params, ids, mask)
  for r, row in enumerate(ROWS):
    for t in range(len(row) - 1):
      h = z[r, t][None].astype(jnp.float32) @ head.readout
      score = np.asarray(head.scores(h))[0]
      rank = int((score > score[row[t + 1]]).sum())
      assert rank <= (1 if t == 0 else 0), (r, t, rank)


def every_token():
  """Every token but BOS as candidates (padded to a multiple of 8) and
  which are real."""
  real = np.arange(1, V - 1, dtype=np.int32)
  real = np.concatenate([real, np.zeros(-len(real) % 8, np.int32)])
  return real, np.arange(len(real)) < V - 2


def head_search(family, real, valid, head, config, is_start=None):
  """One hybrid search over `real` with the head term `head` and nothing
  taken before; the sentence's token ids."""
  model, params = tiny(family)
  grads = gradient(family)
  span2 = block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  row, length, _ = hybrid_search(
    model,
    params,
    span2,
    jnp.asarray(real),
    jnp.asarray(valid),
    jnp.asarray((real == END) & valid),
    jnp.zeros((2, config.max_length), jnp.int32),
    jnp.zeros((2,), jnp.int32),
    jnp.asarray(BOS, jnp.int32),
    is_start,
    head,
    config=config.search,
  )
  return np.asarray(row)[: int(length)].tolist()


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_head_term_alone_recovers_a_sentence(family):
  # No span term and no LM: the head gradient alone must lead the search
  # through one sentence of the batch, its end included (the end's own
  # row scores it).
  config = dataclasses.replace(
    CONFIG,
    weight_head=10.0,
    weight_span=0.0,
    weight_lm=0.0,
  )
  model, params = tiny(family)
  real, valid = every_token()
  head = hybrid.head_score(
    model,
    params,
    gradient(family),
    jnp.asarray(real),
    jnp.asarray(BOS, jnp.int32),
    key=jax.random.key(0),
    config=config,
  )
  config = dataclasses.replace(config, shortlist=8)
  assert head_search(family, real, valid, head, config) in ROWS


def match(features, target, chosen):
  s = features[list(chosen)].sum(0)
  return (s @ target) / np.linalg.norm(s) / np.linalg.norm(target)


def test_select_by_gradient_is_at_least_greedy_and_swap_optimal():
  rng = np.random.default_rng(0)
  features = rng.normal(size=(14, 20)) + 0.3
  target = rng.normal(size=20) + 1.0
  got = np.asarray(
    select_by_gradient(jnp.asarray(features), jnp.asarray(target), 5)
  ).tolist()
  assert got == sorted(got) and len(set(got)) == 5
  # Greedy forward selection, by brute force.
  greedy = []
  for _ in range(5):
    rest = [j for j in range(14) if j not in greedy]
    greedy.append(
      max(rest, key=lambda j: match(features, target, greedy + [j]))
    )
  assert match(features, target, got) >= match(features, target, greedy) - 1e-6
  # No single swap improves the result.
  best = match(features, target, got)
  for i in got:
    for j in set(range(14)) - set(got):
      swapped = [x for x in got if x != i] + [j]
      assert match(features, target, swapped) <= best + 1e-5


def test_select_by_gradient_finds_a_planted_set_among_near_copies():
  # The target is the sum of rows 2, 5 and 9 (scaled: the number of
  # targets is unknown); noisy copies of them do not displace them.
  rng = np.random.default_rng(0)
  for trial in range(5):
    base = rng.normal(size=(10, 40))
    copies = base[[2, 5, 9]] + 0.3 * rng.normal(size=(3, 40))
    pool = np.concatenate([base, copies])
    target = 0.1 * base[[2, 5, 9]].sum(0)
    got = select_by_gradient(jnp.asarray(pool), jnp.asarray(target), 3)
    assert np.asarray(got).tolist() == [2, 5, 9], trial


@pytest.mark.parametrize('family', ('gpt2', 'llama'))
@pytest.mark.slow
def test_pool_gradients_sum_to_the_batch_gradient(family):
  # Each sentence's own head gradient, summed over the batch and divided by
  # its N = 14 targets, is the FedSGD gradient's (negated) head rows: with
  # the tied GPT-2 that includes the input embeddings' part.
  model, params = tiny(family)
  cands = jnp.arange(V, dtype=jnp.int32)
  width = CONFIG.max_length
  tokens = np.zeros((len(ROWS), width), np.int32)
  for i, row in enumerate(ROWS):
    tokens[i, : len(row)] = row
  lengths = jnp.asarray([len(r) for r in ROWS], jnp.int32)
  pool = np.asarray(
    pool_head_gradients(model, params, jnp.asarray(tokens), lengths, cands),
    np.float64,
  )
  assert pool.shape == (2, V, D)
  n = sum(len(r) - 1 for r in ROWS)
  raw = np.asarray(raw_head_rows(model, gradient(family), cands))
  np.testing.assert_allclose(pool.sum(0) / n, raw, atol=2e-6)
  # One sentence alone does not explain the whole gradient.
  assert np.abs(pool[0] / n - raw).max() > 1e-3


def test_select_with_groups_takes_one_row_per_group_and_is_swap_optimal():
  # Rows 2k and 2k+1 form group k (a sentence and its cut). The target is
  # the sum of rows 0, 1 and 6: unconstrained, both rows of group 0 are
  # chosen; with the groups, one of them and row 6.
  rng = np.random.default_rng(3)
  features = rng.normal(size=(12, 30))
  groups = np.arange(12) // 2
  target = features[[0, 1, 6]].sum(0)
  free = np.asarray(
    select_by_gradient(jnp.asarray(features), jnp.asarray(target), 3)
  ).tolist()
  assert free == [0, 1, 6]
  got = np.asarray(
    select_by_gradient(
      jnp.asarray(features),
      jnp.asarray(target),
      3,
      groups=jnp.asarray(groups, jnp.int32),
    )
  ).tolist()
  assert len({groups[j] for j in got}) == 3 and 6 in got
  assert got[0] in (0, 1)
  # No swap that keeps one row per group improves the result.
  best = match(features, target, got)
  for i in got:
    for j in set(range(12)) - set(got):
      swapped = [x for x in got if x != i] + [j]
      if len({groups[x] for x in swapped}) == 3:
        assert match(features, target, swapped) <= best + 1e-5
  # Groups of single rows are the unconstrained selection.
  same = select_by_gradient(
    jnp.asarray(features),
    jnp.asarray(target),
    3,
    groups=jnp.arange(12, dtype=jnp.int32),
  )
  assert np.asarray(same).tolist() == free


def test_cut_variants_cut_at_word_boundaries_and_close_with_an_end():
  is_end = np.zeros(20, bool)
  is_end[[15, 16]] = True
  cuttable = np.ones(20, bool)
  cuttable[11] = False  # a word piece: no cut before it
  seq = [0, 10, 11, 12, 13, 16]
  got = hybrid.cut_variants(
    seq, is_end=is_end, cuttable=cuttable, end_id=15, min_length=3
  )
  assert got == [[0, 10, 11, 16], [0, 10, 11, 12, 16], seq]
  # A sentence that ran to the length limit: cuts end with `end_id`, the
  # sentence itself stays as searched; min_length drops the shortest cut.
  got = hybrid.cut_variants(
    seq[:-1], is_end=is_end, cuttable=cuttable, end_id=15, min_length=5
  )
  assert got == [[0, 10, 11, 12, 15], [0, 10, 11, 12, 13]]


def _pool_tokens(rows):
  """`(tokens [P, max_length], lengths [P])` of `rows`, zero padded."""
  tokens = np.zeros((len(rows), CONFIG.max_length), np.int32)
  for i, row in enumerate(rows):
    tokens[i, : len(row)] = row
  return tokens, np.asarray([len(r) for r in rows], np.int32)


@pytest.mark.slow
@pytest.mark.parametrize(
  'chunk,transformed', ((2, False), (4, False), (2, True), (64, False))
)
def test_pool_gram_is_the_weighted_features_gram(chunk, transformed):
  # Three sentences in chunks of 2 (the last one padded) or 4, or of 64,
  # which a pool of three pads only to 8: the Gram and projections of the
  # weighted, flattened head rows (times a random transform when given),
  # from NumPy.
  model, params = tiny('gpt2')
  tokens, lengths = _pool_tokens([ROWS[0], ROWS[1], ROWS[0][:5] + [END]])
  cands = jnp.arange(V, dtype=jnp.int32)
  rng = np.random.default_rng(0)
  weights = rng.uniform(0.5, 2.0, size=(2, V)).astype(np.float32)
  target = rng.normal(size=(V, D)).astype(np.float32)
  transform = rng.normal(size=(D, D)).astype(np.float32) / np.sqrt(D)
  gram, along = hybrid.pool_gram(
    model,
    params,
    tokens,
    lengths,
    cands,
    jnp.asarray(target),
    jnp.asarray(weights),
    chunk=chunk,
    transform=jnp.asarray(transform) if transformed else None,
  )
  feats = np.asarray(
    pool_head_gradients(
      model, params, jnp.asarray(tokens), jnp.asarray(lengths), cands
    ),
    np.float64,
  )
  if transformed:
    feats = feats @ transform
  assert gram.shape == (2, 3, 3) and along.shape == (2, 3)
  for w in range(2):
    flat = (feats * weights[w][None, :, None]).reshape(3, -1)
    want = flat @ flat.T
    np.testing.assert_allclose(gram[w], want, rtol=1e-4, atol=1e-6 * want.max())
    np.testing.assert_allclose(
      along[w],
      flat @ (target * weights[w][:, None]).ravel(),
      rtol=1e-4,
      atol=1e-7,
    )


@pytest.mark.slow
def test_pool_gram_computes_each_chunk_on_its_shortest_buffer(
  monkeypatch, caplog
):
  # Rows sorted shortest first, chunks of 2: the two short rows (6 and 7
  # tokens) on an 8-token buffer, the long one (9) and its padding copy on
  # the pool's 12, two sentences a map step; the Gram comes back in the
  # caller's order, equal to the rows' on the full buffer. Each chunk's
  # progress is logged (here every chunk: no wait between lines).
  from leakjax.attacks.dager.hybrid import selection

  monkeypatch.setattr(selection, '_LOG_EVERY_S', 0.0)
  # absl's own logger too: a test before this one in the same process may
  # have left it above INFO.
  caplog.set_level(logging.INFO)
  caplog.set_level(logging.INFO, logger='absl')

  model, params = tiny('gpt2')
  tokens, lengths = _pool_tokens([ROWS[0], ROWS[0][:5] + [END], ROWS[1]])
  cands = jnp.arange(V, dtype=jnp.int32)
  seen = []

  def recording(model, params, tokens, lengths, candidates, *, batch_size=1):
    seen.append((tokens.shape, batch_size))
    return hybrid.pool_head_gradients(
      model, params, tokens, lengths, candidates, batch_size=batch_size
    )

  monkeypatch.setattr(selection, 'pool_head_gradients', recording)
  ones = np.ones((1, V), np.float32)
  gram, _ = hybrid.pool_gram(
    model,
    params,
    tokens,
    lengths,
    cands,
    jnp.zeros((V, D)),
    ones,
    chunk=2,
  )
  assert sorted(seen) == [((2, 8), 2), ((2, 12), 2)]
  assert 'rows of 2/3 sentences' in caplog.text
  assert 'rows of 3/3 sentences' in caplog.text
  feats = np.asarray(
    pool_head_gradients(
      model, params, jnp.asarray(tokens), jnp.asarray(lengths), cands
    ),
    np.float64,
  ).reshape(3, -1)
  want = feats @ feats.T
  np.testing.assert_allclose(gram[0], want, rtol=1e-4, atol=1e-6 * want.max())


def test_pool_head_gradients_batched_map_equals_one_at_a_time():
  model, params = tiny('llama')
  tokens, lengths = _pool_tokens(
    [ROWS[0], ROWS[1], ROWS[0][:5] + [END], ROWS[1][:4] + [END]]
  )
  lengths = jnp.asarray(lengths)
  cands = jnp.arange(V, dtype=jnp.int32)
  one = pool_head_gradients(model, params, jnp.asarray(tokens), lengths, cands)
  for batch in (2, 4):
    got = jitted(
      hybrid.pool_head_gradients, static_argnames=('model', 'batch_size')
    )(model, params, jnp.asarray(tokens), lengths, cands, batch_size=batch)
    np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-7)
  with pytest.raises(LeakjaxError, match='batch_size'):
    hybrid.pool_head_gradients(
      model, params, jnp.asarray(tokens), lengths, cands, batch_size=0
    )


@pytest.mark.parametrize('panel', (3, 4, 8, 256))
def test_features_gram_by_panels(monkeypatch, panel):
  # Panels of 3 rows over 8 (the last one overlapping the one before), of 4,
  # of all 8: the weighted Gram and projections of NumPy, per weighting.
  from leakjax.attacks.dager.hybrid import selection

  monkeypatch.setattr(selection, '_GRAM_PANEL', panel)
  rng = np.random.default_rng(7)
  feats = rng.normal(size=(8, 5, 3)).astype(np.float32)
  target = rng.normal(size=(5, 3)).astype(np.float32)
  weights = rng.uniform(0.5, 2.0, size=(2, 5)).astype(np.float32)
  gram, along = selection.features_gram(
    jnp.asarray(feats), jnp.asarray(target), jnp.asarray(weights)
  )
  for w in range(2):
    flat = (feats * weights[w][None, :, None]).reshape(8, -1)
    np.testing.assert_allclose(gram[w], flat @ flat.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
      along[w],
      flat @ (target * weights[w][:, None]).ravel(),
      rtol=1e-5,
      atol=1e-5,
    )


@pytest.mark.parametrize(
  'width,row_bytes,chunk,want',
  (
    (8, 1 << 20, 64, 8),  # 96 tokens a step, at most 8 sentences
    (16, 1 << 20, 64, 4),
    (24, 1 << 20, 64, 4),
    (32, 1 << 20, 64, 2),
    (41, 1 << 20, 64, 2),
    (64, 1 << 20, 64, 1),
    (8, 1 << 28, 64, 4),  # 1 GiB of [V, d] gradients at most
    (8, 1 << 31, 64, 1),
    (8, 1 << 20, 6, 2),  # a power of two that divides the chunk
  ),
)
def test_map_batch(width, row_bytes, chunk, want):
  from leakjax.attacks.dager.hybrid.selection import _map_batch

  assert _map_batch(width, row_bytes, chunk) == want


def test_head_transform_centres_and_whitens_like_the_head_term():
  rng = np.random.default_rng(4)
  rows = rng.normal(size=(6, D))
  mean = rng.normal(size=D)
  a = rng.normal(size=(D, D))
  whiten = a @ a.T / D + np.eye(D)
  got = rows @ np.asarray(
    hybrid.head_transform(jnp.asarray(mean), jnp.asarray(whiten)), np.float64
  )
  centred = rows - np.outer(rows @ mean / (mean @ mean), mean)
  np.testing.assert_allclose(got, centred @ whiten, rtol=1e-4, atol=1e-4)


def numpy_start_counts(rows, first, samples, prior, valid, b, dims):
  u = np.linalg.svd(samples, full_matrices=False)[2][:dims]
  h = first - u.T @ (u @ first)
  r = rows - (rows @ u.T) @ u
  a = np.where(valid, r @ h / (h @ h), 0.0)
  p = np.where(valid, prior, 0.0)
  n = b * (1 - p.sum()) / a.sum()
  return np.where(valid, n * a + b * p, 0.0), n


def test_start_counts_read_planted_counts_and_match_numpy():
  # Rows built as the docstring says a batch's are: (c − b p) h0 / N plus
  # other contexts' head inputs, here drawn from the samples' 12-dim
  # subspace, so that projecting out 12 directions recovers c exactly.
  rng = np.random.default_rng(0)
  d, c_num, n_targets, b = 24, 10, 57.0, 8
  basis = np.linalg.qr(rng.normal(size=(d, 12)))[0].T  # [12, d]
  samples = rng.normal(size=(200, 12)) @ basis
  first = rng.normal(size=d)
  prior = rng.dirichlet(np.ones(c_num + 5))[:c_num]
  counts = np.array([3, 2, 1, 1, 0, 1, 0, 0, 0, 0], np.float64)
  others = rng.normal(size=(c_num, 12)) @ basis
  rows = np.outer(counts - b * prior, first) / n_targets + others
  valid = np.ones(c_num, bool)
  got, n = start_counts(
    *(jnp.asarray(x, jnp.float32) for x in (rows, first, samples, prior)),
    jnp.asarray(valid),
    b,
    dims=12,
  )
  np.testing.assert_allclose(np.asarray(got), counts, atol=1e-3)
  assert float(n) == pytest.approx(n_targets, rel=1e-3)
  # Fewer directions than the contexts span: not exact, but the same
  # arithmetic as NumPy's, and invalid candidates count 0.
  valid[-2:] = False
  got, n = start_counts(
    *(jnp.asarray(x, jnp.float32) for x in (rows, first, samples, prior)),
    jnp.asarray(valid),
    b,
    dims=5,
  )
  want, want_n = numpy_start_counts(rows, first, samples, prior, valid, b, 5)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-3)
  assert float(n) == pytest.approx(want_n, rel=1e-3)
  assert np.all(np.asarray(got)[-2:] == 0)


def test_allocate_starts_hands_out_the_largest_counts_first():
  counts = np.array([2.6, 0.9, 1.2, 5.0])
  allowed = np.array([True, True, False, True])
  # 5.0 → 4.0 → 3.0 → 2.0 (each pick uses one), then 2.6, then 2.0.
  picks = hybrid.allocate_starts(counts, allowed, 5)
  assert picks.tolist() == [3, 3, 3, 0, 3]
  with pytest.raises(LeakjaxError, match='start a sentence'):
    hybrid.allocate_starts(counts, np.zeros(4, bool), 2)


@pytest.mark.slow
def test_estimated_starts_name_both_sentences_first_tokens():
  # The tiny Llama (RoPE: BOS's head input is the same in every sentence,
  # as on SmolLM2): the two largest estimated counts over every token but
  # BOS are the two sentences' first tokens. (The tiny GPT-2's random
  # learned positions blur its estimate; not used here.)
  model, params = tiny('llama')
  cands = np.arange(V - 1, dtype=np.int32)
  counts, share, _ = hybrid.estimate_starts(
    model,
    params,
    gradient('llama'),
    jnp.asarray(cands),
    jnp.ones(len(cands), bool),
    jnp.asarray(BOS, jnp.int32),
    2,
    key=jax.random.key(0),
    config=dataclasses.replace(CONFIG, start_dims=4),
  )
  picks = hybrid.allocate_starts(
    np.asarray(counts), np.ones(len(cands), bool), 2
  )
  assert sorted(cands[picks].tolist()) == sorted(r[1] for r in ROWS)
  # The share explained by the first targets lies along BOS's head input.
  share = np.asarray(share, np.float64)
  assert np.linalg.matrix_rank(share, tol=1e-6 * np.abs(share).max()) == 1


@pytest.mark.slow
@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_prior_start_reads_the_lm_from_its_own_context(family):
  # The LM prior comes from a context that starts with another token;
  # the head input (and the beams' tokens) stay on BOS's.
  model, params = tiny(family)
  readout = hybrid.head_readout(model, params)
  head = hybrid.HeadScore(
    readout=readout,
    mean=jnp.zeros(D),
    whiten=jnp.eye(D),
    rows=jnp.zeros((4, D)),
  )
  other = 7
  state = hybrid.init_state(
    model, params, jnp.asarray(BOS, jnp.int32), 2, 8, 1, head, other
  )

  def after(prefix):
    ids = jnp.asarray([prefix], jnp.int32)
    z = model.logits(params, ids, jnp.ones(ids.shape, jnp.int32))[0, -1]
    return z.astype(jnp.float32)

  np.testing.assert_allclose(
    np.asarray(state.logp[0]),
    np.asarray(jax.nn.log_softmax(after([other]))),
    atol=1e-4,
  )
  np.testing.assert_allclose(
    np.asarray(state.head[0]), np.asarray(after([BOS]) @ readout), atol=1e-4
  )
  # Below the rank limit the span still decides the whole search.
  config = dataclasses.replace(CONFIG, prior_start=other)
  assert search(family, [], config) in ROWS
  with pytest.raises(LeakjaxError, match='prior_start'):
    hybrid.HybridConfig(prior_start=-2)


@pytest.mark.slow
def test_evidence_matches_numpy_and_reads_a_planted_context():
  # HeadScore.evidence against its formula in NumPy, on rows built from a
  # tiny model's head readout: token 0 followed the context once (its row
  # holds (1 - p) H / N), token 1 followed another context once, token 2
  # followed many contexts. The ratio is positive for token 0 only, and
  # token 1's (a rare token whose row does not lie along H) is the lowest.
  model, params = tiny('llama')
  grads = gradient('llama')
  cands = jnp.arange(3, dtype=jnp.int32)
  head = hybrid.head_score(
    model,
    params,
    grads,
    cands,
    jnp.asarray(BOS, jnp.int32),
    key=jax.random.key(0),
    config=CONFIG,
    targets=40.0,
  )
  m = np.asarray(hybrid.head_transform(head.mean, head.whiten), np.float64)
  rng = np.random.default_rng(0)
  h = rng.normal(size=(2, D))  # two head inputs, as the search holds them
  hm = h @ m
  p = np.array([[0.1, 0.2, 0.05], [0.3, 0.1, 0.2]])
  n = 40.0
  other = rng.normal(size=(D,)) @ m
  many = rng.normal(size=(30, D)).sum(0) @ m / n
  rows = np.stack([(1 - p[0, 0]) * hm[0] / n, other / n, many])
  norm = np.linalg.norm(rows, axis=1)
  noise = norm**2 + np.median(norm) ** 2
  planted = head.replace(
    transformed=jnp.asarray(rows, jnp.float32),
    noise=jnp.asarray(noise, jnp.float32),
  )
  got = np.asarray(
    planted.evidence(jnp.asarray(h, jnp.float32), jnp.asarray(p, jnp.float32))
  )
  mu = (1 - p) / n
  want = (
    mu * (hm @ rows.T) - 0.5 * mu**2 * (hm**2).sum(1, keepdims=True)
  ) / noise
  np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6 * abs(want).max())
  assert got[0, 0] > 0 and got[0, 1] < 0 and got[0, 1] == got[0].min()
  # head_score's own fields: the unnormalised transformed rows and noise.
  raw = np.asarray(raw_head_rows(model, grads, cands), np.float64)
  r = raw @ m
  np.testing.assert_allclose(np.asarray(head.transformed), r, rtol=1e-3)
  rn = np.linalg.norm(r, axis=1)
  np.testing.assert_allclose(
    np.asarray(head.noise), rn**2 + np.median(rn) ** 2, rtol=1e-3
  )
  assert float(head.targets) == 40.0
  # Without `targets` the head term is the cosine alone.
  plain = hybrid.head_score(
    model,
    params,
    grads,
    cands,
    jnp.asarray(BOS, jnp.int32),
    key=jax.random.key(0),
    config=CONFIG,
  )
  assert plain.transformed is None and plain.targets is None
  np.testing.assert_allclose(np.asarray(plain.rows), np.asarray(head.rows))
  with pytest.raises(LeakjaxError, match='start_dims'):
    hybrid.HybridConfig(weight_evidence=1.0)
  with pytest.raises(LeakjaxError, match='weight_evidence'):
    hybrid.HybridConfig(weight_evidence=-1.0, start_dims=4)


@pytest.mark.slow
def test_evidence_leads_the_search_through_a_sentence():
  # With the span and the LM off and the cosine all but off, the ratio
  # alone (N from the starts' estimate) leads each search, given its
  # sentence's first token, through that sentence, end included. The
  # tiny Llama: the tiny GPT-2's random learned positions blur the
  # estimate of N (as of the starts, above).
  family = 'llama'
  config = dataclasses.replace(
    CONFIG,
    start_dims=4,
    weight_head=1e-6,
    weight_evidence=1.0,
    weight_span=0.0,
    weight_lm=0.0,
  )
  model, params = tiny(family)
  grads = gradient(family)
  real, valid = every_token()
  bos = jnp.asarray(BOS, jnp.int32)
  _, _, n = hybrid.estimate_starts(
    model,
    params,
    grads,
    jnp.asarray(real),
    jnp.asarray(valid),
    bos,
    2,
    key=jax.random.key(0),
    config=config,
  )
  true_n = sum(len(r) - 1 for r in ROWS)
  assert 0.5 * true_n < float(n) < 2 * true_n
  head = hybrid.head_score(
    model,
    params,
    grads,
    jnp.asarray(real),
    bos,
    key=jax.random.key(0),
    config=config,
    valid=jnp.asarray(valid),
    targets=n,
  )
  for want in ROWS:
    start = jnp.asarray(real == want[1])
    assert head_search(family, real, valid, head, config, start) == want
