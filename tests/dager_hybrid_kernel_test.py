"""The hybrid's search step (leakjax.attacks.dager.hybrid.kernel) on the
tiny models of dager_hybrid_test.py: the first step grown from the one
live beam equals the step from `beams` copies of it, and with
`prior_start` the one decode of both contexts reads each beam's LM prior
and head input from its own context, as separate forward passes do.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dager_hybrid_test import BOS, CONFIG, END, ROWS, block_span, gradient
from dager_test import D, tiny

from leakjax.attacks.dager import hybrid
from leakjax.errors import LeakjaxError

pytestmark = pytest.mark.slow  # each test compiles the step twice (10-14 s)

OTHER = 7  # the prior's first token (`prior_start`)
SETTINGS = dataclasses.replace(
  CONFIG, weight_head=2.0, prior_start=OTHER, shortlist=8
).search


def _inputs(family):
  model, params = tiny(family)
  grads = gradient(family)
  span2 = block_span(model, grads, 1, CONFIG.span_dims, CONFIG.span)
  real = sorted({v for r in ROWS for v in r[1:]})
  cands = jnp.asarray(real, jnp.int32)
  valid = jnp.ones(len(real), bool)
  is_end = cands == END
  taken = jnp.zeros((2, CONFIG.max_length), jnp.int32)
  taken_len = jnp.zeros((2,), jnp.int32)
  rng = np.random.default_rng(0)
  head = hybrid.HeadScore(
    readout=hybrid.head_readout(model, params),
    mean=jnp.zeros(D),
    whiten=jnp.eye(D),
    rows=jnp.asarray(rng.normal(size=(len(real), D)), jnp.float32),
  )
  return model, params, (span2, cands, valid, is_end, taken, taken_len), head


def _steps(family, first_beams, steps):
  model, params, common, head = _inputs(family)
  step = jax.jit(
    hybrid.hybrid_step, static_argnames=('model', 'config', 'shortlist')
  )
  state = hybrid.init_state(
    model,
    params,
    jnp.asarray(BOS, jnp.int32),
    first_beams,
    SETTINGS.max_length,
    SETTINGS.span_block,
    head,
    SETTINGS.prior_start,
  )
  state = step(
    model,
    params,
    *common,
    state,
    config=SETTINGS,
    shortlist=common[1].shape[0],
    head=head,
  )
  for _ in range(steps):
    state = step(model, params, *common, state, config=SETTINGS, head=head)
  return model, params, head, state


@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_first_step_from_the_live_beam_equals_the_step_from_every_beam(family):
  # hybrid_beams starts from one beam; the step from `beams` copies of BOS
  # (all but one dead) picks the same entries, so every later step agrees.
  *_, one = _steps(family, 1, 3)
  *_, every = _steps(family, SETTINGS.beams, 3)
  assert one.tokens.shape == every.tokens.shape == (SETTINGS.beams, 12)
  for name in ('tokens', 'length', 'alive', 'finished', 'step'):
    np.testing.assert_array_equal(
      np.asarray(getattr(one, name)), np.asarray(getattr(every, name)), name
    )
  np.testing.assert_array_equal(np.asarray(one.logp), np.asarray(every.logp))
  np.testing.assert_array_equal(np.asarray(one.head), np.asarray(every.head))
  alive = np.asarray(one.alive)
  assert alive.sum() > 1
  # Below the rank limit a true extension's residual to the span is float
  # rounding (~1e-6 relative), so its log, the span term, moves by tenths
  # when the block pass runs on another number of rows.
  np.testing.assert_allclose(
    np.asarray(one.score)[alive], np.asarray(every.score)[alive], atol=0.5
  )


@pytest.mark.parametrize('family', ('gpt2', 'llama'))
def test_one_decode_keeps_each_context_apart(family):
  # With prior_start the cache holds the beams on BOS's context, then on
  # the prior's: after three steps (beams reordered on the way) each live
  # beam's LM prior is the model's on [OTHER] + its tokens and its head
  # input the readout of the model's logits on [BOS] + its tokens.
  model, params, head, state = _steps(family, 1, 3)
  assert jax.tree.leaves(state.cache)[0].shape[0] == 2 * SETTINGS.beams
  tokens, length = np.asarray(state.tokens), np.asarray(state.length)

  def last_logits(prefix):
    ids = jnp.asarray([prefix], jnp.int32)
    z = model.logits(params, ids, jnp.ones(ids.shape, jnp.int32))[0, -1]
    return z.astype(jnp.float32)

  checked = 0
  for b in np.flatnonzero(np.asarray(state.alive & ~state.finished)):
    row = tokens[b, 1 : length[b]].tolist()
    np.testing.assert_allclose(
      np.asarray(state.logp[b]),
      np.asarray(jax.nn.log_softmax(last_logits([OTHER, *row]))),
      atol=1e-4,
    )
    np.testing.assert_allclose(
      np.asarray(state.head[b]),
      np.asarray(last_logits([BOS, *row]) @ head.readout),
      atol=1e-4,
    )
    checked += 1
  assert checked > 1
  # A state built for one context is refused by a step that reads two.
  _, _, common, _ = _inputs(family)
  single = hybrid.init_state(
    model, params, jnp.asarray(BOS, jnp.int32), SETTINGS.beams, 12, 1, head
  )
  with pytest.raises(LeakjaxError, match='prior_start'):
    hybrid.hybrid_step(model, params, *common, single, config=SETTINGS)
