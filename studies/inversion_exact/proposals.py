"""How far down each proposal ranking puts the true token, given the prefix.

The exact search (:mod:`leakjax.attacks.inversion.exact`) checks candidates
in proposal order; its cost is the rank of the true token. On the dev split
of `experiments/configs/inversion_exact.flags` (texts the test numbers are
not reported on), for every scored position of every text, with the true
prefix given, the rank of the true token under

* `ridge`: the ridge inverse `H^l_t -> H^0_t` (Embed Parrot's linear
  skip), then HEI's cosine;
* `ridge_context`: the same fitted on `[H^l_t, H^l_{t+1}, H^l_{t-1}]`
  (the next position attends to token t: a contextual linear inverse);
* `softmax`: the library's inverse, the ridge map trained further as a
  classifier over the vocabulary (:mod:`softmax_inverse`), then the cosine;
* `prior`: the LM's next-token log-probability given the prefix;
* `order_ridge`: :func:`exact.proposal_order` on the ridge's cosine (the
  inverse's best four, the prior's best four, then the two rankings
  interleaved);
* `order`: the library's order, :func:`exact.proposal_order` on the
  softmax inverse's cosine.

The texts, layers and attacker's texts are the experiment's (its flags;
`--layers` picks the layers). Writes
`reports/inversion_exact/proposals/summary.json` with
`METRIC@data=C,layer=L,ranking=R` for METRIC in `top1` (rank 0), `top128`
(rank < 128), `mean_rank`, `max_rank`, and `num_tokens@data=C,layer=L`.

  python -m studies.inversion_exact.proposals --layers=10,25
"""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import studies
import studies.inversion_exact as study
from experiments import inversion_exact
from leakjax import io
from leakjax.attacks.inversion import (
  bei_hei,
  embed_parrot,
  exact,
  exact_runner,
  softmax_inverse,
)

REPORT = Path(__file__).resolve().parents[2] / 'reports' / 'inversion_exact'
RANKINGS = (
  'ridge',
  'ridge_context',
  'softmax',
  'prior',
  'order_ridge',
  'order',
)


def shifted(states: np.ndarray, mask: np.ndarray, k: int) -> np.ndarray:
  """`states[:, t + k]` at t (zeros outside the text)."""
  x = states * mask[..., None]
  out = np.zeros_like(x)
  if k > 0:
    out[:, :-k] = x[:, k:]
  else:
    out[:, -k:] = x[:, :k]
  return out


def context(states: np.ndarray, mask: np.ndarray) -> np.ndarray:
  return np.concatenate(
    [states, shifted(states, mask, 1), shifted(states, mask, -1)], -1
  )


def affine(stats, kernel, bias):
  return lambda x: (
    ((x - stats['input_shift']) / stats['input_scale']) @ kernel + bias
  )


def fit(features: np.ndarray, target: np.ndarray, mask: np.ndarray):
  """The library's ridge fit (:func:`embed_parrot.ridge_solution`)."""
  stats = embed_parrot.feature_stats(features, mask)
  return affine(
    stats, *embed_parrot.ridge_solution(features, target, mask, stats)
  )


def fit_softmax(features, target, data, embeddings):
  """The library's softmax inverse (:func:`softmax_inverse.fit`)."""
  stats = embed_parrot.feature_stats(features, data.mask)
  ridge = embed_parrot.ridge_solution(features, target, data.mask, stats)
  return affine(
    stats,
    *softmax_inverse.fit(
      features, data.ids, data.score_mask, stats, ridge, embeddings
    ),
  )


def states_of(model, params, ids, mask, layers) -> list[np.ndarray]:
  """`H^layer` of every text, float32 `[N, W, D]` per layer."""
  both = bei_hei.layer_states_of_many(model, params, ids, mask, layers)
  return [both[i] for i in range(len(layers))]


def rank_of(scores: np.ndarray, token: int) -> int:
  return int(np.sum(scores > scores[token]))


def add_rank_keys(out: dict, ranks, **at) -> np.ndarray:
  """Adds top1, top128, mean_rank and max_rank of the true tokens' `ranks`
  (0 = first) to `out` under the summary parameters `at`; returns them."""
  got = np.asarray(ranks)
  out[io.summary_key('top1', **at)] = float(np.mean(got == 0))
  out[io.summary_key('top128', **at)] = float(np.mean(got < 128))
  out[io.summary_key('mean_rank', **at)] = float(got.mean())
  out[io.summary_key('max_rank', **at)] = int(got.max())
  return got


def main(argv):
  del argv
  f = flags.FLAGS
  cfg, model, params, corpora = study.target_from_flags()
  drawn = exact_runner.draw_texts(cfg, model.tokenizer, corpora)
  embeddings = np.asarray(model.word_embeddings(params), np.float32)
  unit = embeddings / np.linalg.norm(embeddings, axis=-1, keepdims=True)
  order_config = exact.ExactConfig()
  attacker = drawn.attacker
  out: dict[str, float] = {}
  for layer in cfg.layers:
    hidden, h0 = states_of(
      model, params, attacker.ids, attacker.mask, (layer, '0')
    )
    inverses = {
      'ridge': fit(hidden, h0, attacker.mask),
      'ridge_context': fit(context(hidden, attacker.mask), h0, attacker.mask),
      'softmax': fit_softmax(hidden, h0, attacker, embeddings),
    }
    for name, data in drawn.splits['dev'].items():
      (states,) = states_of(model, params, data.ids, data.mask, (layer,))
      guesses = {
        'ridge': inverses['ridge'](states),
        'ridge_context': inverses['ridge_context'](context(states, data.mask)),
        'softmax': inverses['softmax'](states),
      }
      logits = np.asarray(model.logits(params, jnp.asarray(data.ids)))
      ranks = {r: [] for r in RANKINGS}
      for i in range(len(data.ids)):
        for t in np.flatnonzero(data.score_mask[i]):
          token = int(data.ids[i, t])
          cos = {
            k: unit @ (g[i, t] / np.linalg.norm(g[i, t]))
            for k, g in guesses.items()
          }
          prior = logits[i, t - 1]
          for inverse in guesses:
            ranks[inverse].append(rank_of(cos[inverse], token))
          ranks['prior'].append(rank_of(prior, token))
          for ranking, inverse in (
            ('order_ridge', 'ridge'),
            ('order', 'softmax'),
          ):
            order = exact.proposal_order(cos[inverse], prior, order_config)
            ranks[ranking].append(int(np.flatnonzero(order == token)[0]))
      for ranking, got in ranks.items():
        got = add_rank_keys(out, got, data=name, layer=layer, ranking=ranking)
      out[io.summary_key('num_tokens', data=name, layer=layer)] = len(got)
      print(
        name, layer, {k: round(float(np.mean(v)), 1) for k, v in ranks.items()}
      )
  studies.write_summary(f.out, out)


def define_flags() -> None:
  inversion_exact.define_flags()
  flags.DEFINE_string(
    'out', str(REPORT / 'proposals' / 'summary.json'), 'Output JSON.'
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
