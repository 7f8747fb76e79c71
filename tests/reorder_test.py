"""Tests of leakjax.attacks.film.reorder (FILM Sec. 4.4)."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, lm_loss

VOCAB = 100


@functools.cache
def tiny():
  """`(model, params)`."""
  return gpt2.init_model(
    gpt2.GPT2Config.tiny(vocab_size=VOCAB, n_positions=32, n_layer=1),
    key=jax.random.key(5),
  )


TOKENS = jnp.asarray(
  [1, 40, 11, 12, 13, 14, 15, 16, 17, 18, 0, 0, 0], jnp.int32
)
LENGTH = 10


@pytest.mark.parametrize('seed', range(6))
def test_permute_phrases_permutes_pieces_after_the_prefix(seed):
  fn = jax.jit(
    functools.partial(ro.permute_phrases, fixed=2, min_cuts=2, max_cuts=4)
  )
  out = np.asarray(fn(jax.random.key(seed), TOKENS, LENGTH))
  assert list(out[:2]) == [1, 40]
  assert list(out[LENGTH:]) == [0, 0, 0]
  assert sorted(out[2:LENGTH]) == list(range(11, 19))
  # Pieces keep their inner order: at most 4 cuts -> at most 5 runs.
  runs = 1 + sum(out[i + 1] != out[i] + 1 for i in range(2, LENGTH - 1))
  assert runs <= 5


def test_permute_phrases_moves_something():
  moved = [
    not np.array_equal(
      ro.permute_phrases(
        jax.random.key(s), TOKENS, LENGTH, fixed=2, min_cuts=3, max_cuts=5
      ),
      TOKENS,
    )
    for s in range(10)
  ]
  assert sum(moved) >= 8


def test_edit_tokens_swap_delete_insert():
  bag = jnp.asarray([70, 71, 72])
  kinds = collections.Counter()
  for s in range(40):
    out, n = ro.edit_tokens(
      jax.random.key(s),
      TOKENS,
      jnp.int32(LENGTH),
      bag,
      jnp.ones(3, bool),
      fixed=2,
    )
    out, n = np.asarray(out), int(n)
    assert list(out[:2]) == [1, 40] and not out[n:].any()
    body = collections.Counter(out[2:n].tolist())
    orig = collections.Counter(np.asarray(TOKENS)[2:LENGTH].tolist())
    if n == LENGTH:
      assert body == orig
      kinds['swap'] += 1
    elif n == LENGTH - 1:
      assert sum((orig - body).values()) == 1 and not body - orig
      kinds['delete'] += 1
    else:
      assert n == LENGTH + 1
      extra = body - orig
      assert sum(extra.values()) == 1 and set(extra) <= {70, 71, 72}
      kinds['insert'] += 1
  assert min(kinds.values()) >= 5


def test_edit_tokens_respects_full_rows():
  full = jnp.arange(1, 9, dtype=jnp.int32)
  padded = jnp.zeros((16,), jnp.int32).at[:8].set(full)

  def edit(seed, tokens, **limit):
    return ro.edit_tokens(
      jax.random.key(seed),
      tokens,
      jnp.int32(8),
      jnp.asarray([50]),
      jnp.ones(1, bool),
      fixed=1,
      **limit,
    )

  grew = 0
  for s in range(20):
    out, n = edit(s, full)
    assert int(n) <= 8
    # A wider buffer with the same limit: the same move, the same row.
    wide, m = edit(s, padded, max_length=jnp.int32(8))
    assert int(m) == int(n)
    assert np.array_equal(np.asarray(wide)[:8], out)
    # Without the limit the same buffer takes the insertions.
    grew += int(edit(s, padded)[1]) == 9
  assert grew >= 3


def test_truncate_at_first_sentence_end():
  is_end = jnp.zeros(VOCAB, bool).at[13].set(True).at[16].set(True)
  out, n = ro.truncate_at_punctuation(
    TOKENS, jnp.int32(LENGTH), is_end, fixed=2
  )
  assert int(n) == 5 and list(np.asarray(out)[:6]) == [1, 40, 11, 12, 13, 0]
  out, n = ro.truncate_at_punctuation(
    TOKENS, jnp.int32(LENGTH), jnp.zeros(VOCAB, bool), fixed=2
  )
  assert int(n) == LENGTH


@pytest.mark.slow
def test_candidate_scores_match_one_gradient_per_candidate():
  model, params = tiny()
  ids = jnp.asarray([[1, 5, 6, 7, 0], [1, 7, 6, 5, 9], [1, 9, 9, 0, 0]])
  mask = (jnp.arange(5)[None] < jnp.asarray([4, 5, 3])[:, None]).astype(
    jnp.int32
  )
  paths = ro.default_grad_paths(model)
  assert paths == (('h_0',), ('ln_f',))
  fn = jax.jit(functools.partial(ro.candidate_scores, model, beta=2.0))
  scores, ppl, norm = fn(params, ids, mask)

  @jax.jit
  def one(params, ids1, mask1):  # the plain per-candidate gradient
    def loss(p):
      return lm_loss(
        model.logits(p, ids1[None], mask1[None]), ids1[None], mask1[None]
      )

    return jax.value_and_grad(loss)(params)

  for i in range(3):
    value, g = one(params, ids[i], mask[i])
    sub = [g['h_0'], g['ln_f']]
    want = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(sub)))
    assert float(ppl[i]) == pytest.approx(float(jnp.exp(value)), rel=1e-4)
    assert float(norm[i]) == pytest.approx(float(want), rel=1e-4)
    assert float(scores[i]) == pytest.approx(
      float(ppl[i] + 2 * norm[i]), rel=1e-5
    )
  chunked = ro.candidate_scores(model, params, ids, mask, beta=2.0, chunk=2)
  np.testing.assert_allclose(
    np.asarray(chunked[0]), np.asarray(scores), rtol=1e-5
  )


@pytest.mark.slow
def test_reorder_only_improves_and_reports_the_final_score():
  model, params = tiny()
  config = ro.ReorderConfig(
    phrase_steps=3, token_steps=3, num_candidates=4, min_cuts=1, max_cuts=3
  )
  is_end = jnp.zeros(VOCAB, bool).at[15].set(True)
  fn = jax.jit(functools.partial(ro.reorder, model, config=config))
  state = fn(
    params,
    TOKENS,
    jnp.int32(LENGTH),
    jnp.asarray([30, 31]),
    key=jax.random.key(0),
    is_end=is_end,
  )
  assert int(state.step) == 1 + 3 + 3
  assert float(state.score) <= float(state.initial_score)
  n = int(state.length)
  toks = np.asarray(state.tokens)
  assert list(toks[:2]) == [1, 40] and not toks[n:].any()
  # S of the result and of the input, in one jitted call.
  width = TOKENS.shape[0]
  both = jnp.stack([jnp.asarray(toks), TOKENS])
  masks = (jnp.arange(width)[None] < jnp.asarray([[n], [LENGTH]])).astype(
    jnp.int32
  )
  s, _, _ = jax.jit(functools.partial(ro.candidate_scores, model))(
    params, both, masks
  )
  assert float(s[0]) == pytest.approx(float(state.score), rel=1e-4)
  assert float(s[1]) == pytest.approx(float(state.initial_score), rel=1e-4)
  # Same key, same result; explicit keys only.
  again = fn(
    params,
    TOKENS,
    jnp.int32(LENGTH),
    jnp.asarray([30, 31]),
    key=jax.random.key(0),
    is_end=is_end,
  )
  assert np.array_equal(np.asarray(again.tokens), toks)


def _padding_case():
  """`(params, config, is_end, jitted reorder, bag)` of the padding tests:
  4 + 12 steps of 4 candidates, token 15 ends a sentence."""
  model, params = tiny()
  config = ro.ReorderConfig(
    phrase_steps=4, token_steps=12, num_candidates=4, min_cuts=1, max_cuts=3
  )
  is_end = jnp.zeros(VOCAB, bool).at[15].set(True)
  fn = jax.jit(functools.partial(ro.reorder, model, config=config))
  return params, config, is_end, fn, jnp.asarray([30, 31, 11, 12])


@pytest.mark.slow
def test_a_padded_buffer_changes_no_result():
  """A buffer padded past `max_length` reorders exactly as the unpadded one.

  The FILM pipeline pads every sentence to a multiple of 8 tokens to compile
  the reordering once per bucket; the insertion limit stays `max_length`.
  """
  params, _, is_end, fn, bag = _padding_case()
  width = TOKENS.shape[0]  # 13: room for 3 insertions
  padded = jnp.zeros((32,), jnp.int32).at[:width].set(TOKENS)
  for seed in range(6):
    args = dict(key=jax.random.key(seed), is_end=is_end)
    exact = fn(params, TOKENS, jnp.int32(LENGTH), bag, **args)
    wide = fn(
      params,
      padded,
      jnp.int32(LENGTH),
      bag,
      max_length=jnp.int32(width),
      **args,
    )
    n = int(exact.length)
    assert int(wide.length) == n <= width
    assert np.array_equal(np.asarray(wide.tokens)[:width], exact.tokens)
    assert not np.asarray(wide.tokens)[width:].any()
    # The scores agree to float32 rounding of the longer masked sums.
    assert float(wide.score) == pytest.approx(float(exact.score), rel=2e-6)
    assert float(wide.initial_score) == pytest.approx(
      float(exact.initial_score), rel=2e-6
    )
    assert int(wide.accepted) == int(exact.accepted)


@pytest.mark.slow
def test_a_padded_bag_changes_no_result():
  """A bag padded with masked copies of its first id (as the FILM pipeline
  pads it, to a multiple of `bag_bucket`) reorders exactly as the unpadded
  one: an insertion draws from the same ids with the same key (the draws of
  a `[M]` shape agree on their common prefix, and masked ids are never
  drawn), so sentences and scores are equal bit for bit."""
  params, _, is_end, fn, bag = _padding_case()
  padded = jnp.full((256,), bag[0]).at[: bag.shape[0]].set(bag)
  mask = jnp.arange(256) < bag.shape[0]
  for seed in range(6):
    args = dict(key=jax.random.key(seed), is_end=is_end)
    exact = fn(params, TOKENS, jnp.int32(LENGTH), bag, **args)
    wide = fn(params, TOKENS, jnp.int32(LENGTH), padded, bag_mask=mask, **args)
    for a, b in zip(jax.tree.leaves(wide), jax.tree.leaves(exact)):
      np.testing.assert_array_equal(a, b)
  # Each move alone: the same candidate for every key, insertions included.
  edit = jax.jit(
    jax.vmap(
      functools.partial(ro.edit_tokens, fixed=2), in_axes=(0,) + (None,) * 4
    )
  )
  keys = jax.random.split(jax.random.key(7), 300)
  a, a_len = edit(keys, TOKENS, LENGTH, bag, jnp.ones(bag.shape, bool))
  b, b_len = edit(keys, TOKENS, LENGTH, padded, mask)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a_len, b_len)
  grown = np.asarray(a_len) > LENGTH
  assert grown.sum() > 50  # about a third of the moves insert
  # 30 and 31 are bag ids that the sentence lacks: drawn from the bag.
  assert {30, 31} <= set(np.asarray(a)[grown].ravel().tolist())


@pytest.mark.slow
@pytest.mark.parametrize('length,max_length', [(10, 13), (6, 30)])
def test_reordering_in_stages_is_the_one_buffer_loop(length, max_length):
  """Stretches in narrow buffers make the moves of one wide buffer.

  At max_length 13 the insertions run into the limit; at 30 a 6-token
  sentence runs its first stretches in 8 tokens and its token-wise ones in
  buffers that grow with it, never in the 32 of the one-buffer loop.
  """
  params, config, is_end, fn, bag = _padding_case()
  wide = -(-max_length // 8) * 8
  padded = jnp.zeros((wide,), jnp.int32).at[:length].set(TOKENS[:length])
  widths = []
  for seed in range(6):
    args = dict(
      key=jax.random.key(seed), is_end=is_end, max_length=jnp.int32(max_length)
    )
    exact = fn(params, padded, jnp.int32(length), bag, **args)

    def run(toks, n, state, stop, args=args):
      widths.append((stop, toks.shape[0]))
      return fn(
        params,
        jnp.asarray(toks),
        jnp.int32(n),
        bag,
        state=state,
        stop=jnp.int32(stop),
        **args,
      )

    staged = ro.reorder_in_stages(
      run,
      TOKENS[:length].tolist(),
      config=config,
      max_length=max_length,
      min_steps=4,
    )
    n = int(exact.length)
    assert int(staged.length) == n
    assert np.array_equal(
      np.asarray(staged.tokens)[:n], np.asarray(exact.tokens)[:n]
    )
    assert not np.asarray(staged.tokens)[n:].any()
    assert int(staged.step) == int(exact.step) == 1 + 4 + 12
    assert int(staged.accepted) == int(exact.accepted)
    assert float(staged.score) == pytest.approx(float(exact.score), rel=2e-6)
    assert float(staged.initial_score) == pytest.approx(
      float(exact.initial_score), rel=2e-6
    )
  # Step 0 in the one buffer, then narrower ones for the short sentence.
  assert {w for stop, w in widths if stop == 1} == {wide}
  later = {w for stop, w in widths if stop > 1}
  if max_length == 30:
    assert max(later) < wide and min(later) == 8
  else:
    assert later == {16}


def test_stretches_cover_every_step_once():
  config = ro.ReorderConfig(phrase_steps=5, token_steps=19)
  assert ro.stretches(config, 8, min_steps=5) == [
    (0, 1, 0, False),
    (1, 6, 0, True),
    (6, 14, 8, True),
    (14, 22, 8, True),
    (22, 25, 3, True),
  ]
  # Short stages run in the one buffer, the token-wise steps in one go.
  assert ro.stretches(config, 8, min_steps=20) == [
    (0, 1, 0, False),
    (1, 6, 0, False),
    (6, 25, 19, False),
  ]
  none = ro.ReorderConfig(phrase_steps=0, token_steps=0)
  assert ro.stretches(none, 8) == [(0, 1, 0, False)]


def test_short_stages_run_in_the_one_buffer():
  """Below min_steps every stretch calls the one-buffer program."""
  config = ro.ReorderConfig(phrase_steps=10, token_steps=10)
  calls = []

  def run(toks, n, state, stop):
    calls.append((toks.shape[0], state.tokens.shape[0], stop))
    return state.replace(step=jnp.int32(stop))

  out = ro.reorder_in_stages(
    run, TOKENS[:LENGTH].tolist(), config=config, max_length=18, min_steps=11
  )
  assert calls == [(24, 24, 1), (24, 24, 11), (24, 24, 21)]
  assert int(out.step) == 21 and int(out.length) == LENGTH


def test_every_stage_is_narrowed_by_default():
  """The quickstart's stages of 10 steps: after step 0, each stretch in the
  narrowest buffer its sentence fits (benchmarks/README.md, FILM's
  reordering in stages, has the runs that chose this)."""
  assert ro.MIN_STAGE_STEPS == 1
  config = ro.ReorderConfig(phrase_steps=10, token_steps=10)
  assert ro.stretches(config, 8) == [
    (0, 1, 0, False),
    (1, 11, 0, True),
    (11, 19, 8, True),
    (19, 21, 2, True),
  ]
  calls = []

  def run(toks, n, state, stop):
    calls.append((toks.shape[0], state.tokens.shape[0], stop))
    return state.replace(step=jnp.int32(stop))

  ro.reorder_in_stages(
    run, TOKENS[:LENGTH].tolist(), config=config, max_length=18
  )
  # Step 0 in the one buffer (18 -> 24), then each stretch's reach (LENGTH
  # = 10 plus its growth, at most 18) rounded up to a multiple of 8.
  assert calls == [(24, 24, 1), (16, 16, 11), (24, 24, 19), (16, 16, 21)]


def test_a_state_in_another_buffer_is_refused():
  model, params = tiny()
  config = ro.ReorderConfig(phrase_steps=1, token_steps=1, num_candidates=2)
  buffer = jnp.zeros((16,), jnp.int32).at[:LENGTH].set(TOKENS[:LENGTH])
  state = ro.initial_state(buffer, LENGTH)
  with pytest.raises(LeakjaxError, match='same width'):
    ro.reorder(
      model,
      params,
      TOKENS,
      jnp.int32(LENGTH),
      jnp.asarray([30]),
      key=jax.random.key(0),
      config=config,
      state=state,
    )
