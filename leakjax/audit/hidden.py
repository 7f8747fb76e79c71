"""Hidden states sent to a model provider, and what the provider reads back.

The user runs the model's first layers and sends the hidden states `H^i`
of one layer (split inference, Wan et al. 2024 Sec. 3); the provider holds
the model. Attacks, cheapest first:

* `bei` -- Base Embed Inversion (Sec. 4.1): the LM head on `H^i`;
* `hei` -- Hotmap Embed Inversion (Sec. 4.2): the nearest input embedding;
* `ridge` -- a linear inverse `H^i -> H^0` fitted by ridge regression on
  the states of the attacker's own text, then HEI on its output: Embed
  Parrot's linear skip (:func:`leakjax.attacks.inversion.embed_parrot.
  ridge_solution`) without the decoder. Decision: the attacker's text is
  the user's sentences that are neither attacked nor held out (an attacker
  with text of the same kind: the worst case) and sentences the provider
  samples from the model it holds (:func:`attacker_samples`: free to it,
  and they make the exact search's proposals far better, see
  `reports/audit/attacker_text/`). The L2 penalty keeps the fit defined
  with fewer tokens than features; without any text the attack is
  skipped.
* `exact` -- exact inversion by sequential verification (Nikolaou et al.,
  arXiv 2510.15511; :mod:`leakjax.attacks.inversion.exact`): candidates
  proposed by the softmax inverse trained from the ridge one
  (:mod:`leakjax.attacks.inversion.softmax_inverse`) and checked one
  position at a time against the sent states. On the model's own states
  it accepts a candidate within the tolerance (the gap rule on a bfloat16
  model's, rounded past it); under `noise:S` (Gaussian)
  the calibrated rule, which reads the noise's size off the residuals of
  the BOS and of the positions accepted before (the gap rule for a model
  without a BOS), taking the nearest of the
  first `EXACT_BUDGET` candidates of a position (undecided) when none is
  accepted; at the first position after the BOS it compares every token
  (:func:`leakjax.attacks.inversion.exact.first_states`, once a call).

Scores are Wan et al.'s (Sec. 5.1.3): each text against its own
reconstruction, position by position, ROUGE-1/L without stemming
(:func:`leakjax.attacks.inversion.scoring.score_texts`), BOS not scored;
`exact` is every scored token recovered.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from leakjax._jit import jitted
from leakjax.attacks.dager import client as dager_client
from leakjax.attacks.inversion import (
  bei_hei,
  embed_parrot,
  exact,
  softmax_inverse,
)
from leakjax.attacks.inversion import scoring as inversion_scoring
from leakjax.attacks.inversion import texts as inversion_texts
from leakjax.errors import LeakjaxError

ATTACKS = ('bei', 'hei', 'ridge', 'exact')
EXACT_BUDGET = 1024  # candidates per position on noisy states


@dataclasses.dataclass(frozen=True)
class Inverse:
  """The fitted linear inverses of one layer (`ridge` and the softmax
  inverse `exact` proposes from), or why there are none."""

  kernel: np.ndarray | None
  bias: np.ndarray | None
  stats: dict[str, np.ndarray] | None
  note: str = ''
  softmax: tuple[np.ndarray, np.ndarray] | None = None


def _layer(layer: str):
  return layer if layer == 'last' else int(layer)


def states(model, params, ids, mask, layer: str) -> jax.Array:
  """`H^layer` of a batch, float32 `[B, T, D]`."""
  fn = jitted(bei_hei.layer_states, static_argnames=('model', 'layers'))
  out = fn(model, params, jnp.asarray(ids), jnp.asarray(mask), (_layer(layer),))
  return out[0].astype(jnp.float32)


def attacker_samples(model, params, num: int, length: int, seed: int):
  """`num` sentences the provider samples from the model (rows of `length`
  tokens from BOS, temperature 1, top-p 0.95: the inversion experiment's
  defaults; :func:`leakjax.attacks.inversion.texts.model_samples`)."""
  if not num:
    return []
  try:
    return inversion_texts.model_samples(
      model, params, num, length=length, key=jax.random.PRNGKey(seed)
    )
  except LeakjaxError as e:
    raise LeakjaxError(
      f'the hidden-state attacker could not sample text from the model ({e})',
      "pass --attacker_samples=0 to fit on the user's sentences alone",
    ) from e


def fit_inverse(
  model, params, attacker: Sequence[str], layer: str, width: int
) -> Inverse:
  """The ridge inverse of `layer` fitted on the attacker's texts."""
  if not attacker:
    return Inverse(None, None, None, 'no attacker text to fit on')
  ids, mask = dager_client.padded_batch(model, attacker, width)
  # The layer and its target H^0 from one pass, 16 texts at a time.
  hidden, target = bei_hei.layer_states_of_many(
    model, params, ids, mask, (layer, 0)
  )
  stats = embed_parrot.feature_stats(hidden, mask)
  kernel, bias = embed_parrot.ridge_solution(hidden, target, mask, stats)
  trained = np.asarray(mask).copy()
  if model.tokenizer.bos_id is not None:
    trained[:, 0] = 0  # the BOS is never searched
  soft = softmax_inverse.fit(
    hidden,
    ids,
    trained,
    stats,
    (kernel, bias),
    model.word_embeddings(params),
  )
  return Inverse(kernel, bias, stats, softmax=soft)


def invert_exactly(
  model, params, hidden, mask, layer: str, inverse: Inverse, *, noisy: bool
) -> np.ndarray:
  """Token ids `[B, T]` the exact search reads from states `[B, T, D]`
  (real lengths from `mask`; padding positions stay 0)."""
  hidden = np.asarray(hidden, np.float32)
  propose = jitted(exact.proposal_scores)
  kernel, bias = inverse.softmax
  config = exact.ExactConfig()
  if noisy:
    rule = 'nearest' if model.tokenizer.bos_id is None else 'calibrated'
    config = exact.ExactConfig(rule=rule, max_candidates=EXACT_BUDGET)
  else:
    rule = exact.own_states_rule(model.word_embeddings(params).dtype)
    if rule != 'tolerance':  # a bfloat16 model's: with the audit's budget
      config = exact.ExactConfig(rule=rule, max_candidates=EXACT_BUDGET)
  first = None
  if config.rule == 'calibrated':  # one table for every row
    first = exact.first_states(model, params, _layer(layer))
  lengths = np.asarray(mask).sum(1)
  out = np.zeros(hidden.shape[:2], np.int32)
  for r in range(len(hidden)):
    scores = propose(
      jnp.asarray(hidden[r]),
      model.word_embeddings(params),
      kernel,
      bias,
      inverse.stats['input_shift'],
      inverse.stats['input_scale'],
    )
    (found,) = exact.invert(
      model,
      params,
      hidden[r : r + 1],
      lengths[r : r + 1],
      layer=_layer(layer),
      scores=np.asarray(scores)[None],
      config=config,
      first=first,
    )
    out[r, : len(found.ids)] = found.ids
  return out


def invert(
  model, params, hidden: jax.Array, attack: str, inverse: Inverse | None = None
) -> np.ndarray:
  """Token ids `[B, T]` the attack `attack` reads from states `[B, T, D]`."""
  if attack == 'bei':
    fn = jitted(bei_hei.bei_ids, static_argnames=('model',))
    return np.asarray(fn(model, params, hidden))
  embeddings = model.word_embeddings(params)
  if attack == 'ridge':
    x = (hidden - inverse.stats['input_shift']) / inverse.stats['input_scale']
    hidden = x @ inverse.kernel + inverse.bias
  return np.asarray(jitted(bei_hei.hei_ids)(hidden, embeddings))


def score(model, texts: Sequence[str], ids, mask, predicted) -> dict[str, Any]:
  """Wan et al.'s scores of `predicted` ids against the batch's own."""
  score_mask = np.asarray(mask).copy()
  if model.tokenizer.bos_id is not None:
    score_mask[:, 0] = 0
  refs = bei_hei.decode_ids(model.tokenizer, ids, score_mask)
  preds = bei_hei.decode_ids(model.tokenizer, predicted, score_mask)
  scores = inversion_scoring.score_texts(preds, refs)
  real = score_mask.astype(bool)
  same = [
    bool(np.array_equal(np.asarray(predicted)[r][real[r]], ids[r][real[r]]))
    for r in range(len(texts))
  ]
  return {
    'rouge1': float(np.mean(scores['rouge1'])),
    'rougeL': float(np.mean(scores['rougeL'])),
    'exact': float(np.mean(same)),
    'recovered': preds,
    'matched': preds,
    'exact_each': same,
  }


def noisy(hidden: jax.Array, std: float, key) -> jax.Array:
  """`noise:S` on hidden states: N(0, S^2) added to every coordinate."""
  return hidden + std * jax.random.normal(key, hidden.shape, hidden.dtype)


__all__ = [
  'ATTACKS',
  'Inverse',
  'attacker_samples',
  'fit_inverse',
  'invert',
  'invert_exactly',
  'noisy',
  'score',
  'states',
]
