"""Does SipIt's gradient policy belong in the exact search's order?

SipIt (Nikolaou et al., arXiv 2510.15511) picks each next candidate of a
position with a gradient policy: a continuous input vector `e` is moved by
gradient steps on `||H^l(prefix, e) - observed||^2`, and the nearest
embedding row not yet checked is the next candidate. Our order
(:func:`exact.proposal_order`) puts the softmax inverse's and the LM
prior's best first and then interleaves the two rankings. This study asks,
on the dev split of the experiment's flags (texts no test number comes
from), with the true prefix given, how far down each ranking puts the true
token:

* `gradient`: the embedding rows by L2 distance to `e` after `--steps`
  gradient steps (the policy with `e` frozen after those steps; the paper's
  policy keeps stepping between candidates, which this does not measure);
* `softmax`, `prior`, `order`: as in :mod:`.proposals`;
* `order_gradient`: the library's order with the gradient ranking as a
  third interleaved ranking (a token's place: the best of `3 r_softmax`,
  `3 r_prior + 1`, `3 r_gradient + 2`, after the same head).

Decisions where the paper's text was not at hand: `e` starts at the mean
embedding row (no information about the token); each step moves it by
`--step_size` times the mean row norm along the normalised negative
gradient, decayed linearly to zero over the steps. The gradient is taken
through the model's own embedding table: `e` replaces row 0, which only
the candidate reads (the prefix is in the cache).

Writes `reports/inversion_exact/gradient_policy/summary.json` with
`METRIC@data=C,layer=L,ranking=R` for METRIC in `top1`, `top128`,
`mean_rank`, `max_rank`, `num_tokens@data=C,layer=L` and
`seconds_per_token@data=C,layer=L` (the gradient steps' wall time).

  python -m studies.inversion_exact.gradient_policy --layers=10,25
"""

import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import studies
import studies.inversion_exact as study
from experiments import inversion_exact
from leakjax import io, models
from leakjax.attacks.inversion import exact, exact_runner
from studies.inversion_exact import proposals

REPORT = Path(__file__).resolve().parents[2] / 'reports' / 'inversion_exact'
RANKINGS = ('gradient', 'softmax', 'prior', 'order', 'order_gradient')


def descend(
  model, params, cache, observed, *, layer, steps: int, step_size: float
) -> jax.Array:
  """`e [D]` after `steps` normalised gradient steps on the squared
  distance between the state of `e` put after the one-row stream `cache`
  and `observed [D]` (module docstring)."""
  path = model.paths.word_embeddings
  table = models.get_path(params, path)
  slot = jnp.asarray([0])
  scale = step_size * jnp.mean(jnp.linalg.norm(table, axis=-1))

  def loss(e):
    tree = models.set_path(params, path, table.at[0].set(e.astype(table.dtype)))
    state = exact.candidate_states(model, tree, cache, slot, layer)[0]
    return jnp.sum(jnp.square(state - observed))

  def step(e, k):
    g = jax.grad(loss)(e)
    size = scale * (1.0 - k / steps)
    return e - size * g / (jnp.linalg.norm(g) + 1e-12), None

  e0 = jnp.mean(table, axis=0).astype(jnp.float32)
  e, _ = jax.lax.scan(step, e0, jnp.arange(steps, dtype=jnp.float32))
  return e


def gradient_ranking(table: np.ndarray, e: np.ndarray) -> np.ndarray:
  """Negative L2 distance of every row to `e` (higher: checked first)."""
  return -np.linalg.norm(table - e[None], axis=-1)


def order_with(
  scores: np.ndarray, prior: np.ndarray, third: np.ndarray, config
) -> np.ndarray:
  """The library's order's head, then three rankings interleaved (module
  docstring)."""
  head = exact.proposal_order(scores, prior, config)[
    : max(1, config.first_chunk // 2) + config.prior_top
  ]
  place = np.full(len(scores), np.iinfo(np.int64).max, np.int64)
  for offset, ranking in enumerate((scores, prior, third)):
    ranked = np.argsort(-ranking, kind='stable')
    place[ranked] = np.minimum(
      place[ranked], 3 * np.arange(len(ranked)) + offset
    )
  seen = np.zeros(len(scores), bool)
  seen[head] = True
  rest = np.argsort(place, kind='stable')
  return np.concatenate([head, rest[~seen[rest]]])


def measure(cfg, model, params, corpora, num_texts, steps, step_size) -> dict:
  """The summary keys (module docstring) of the first `num_texts` dev texts
  of each corpus."""
  drawn = exact_runner.draw_texts(cfg, model.tokenizer, corpora)
  table = np.asarray(model.word_embeddings(params), np.float32)
  unit = table / np.linalg.norm(table, axis=-1, keepdims=True)
  order_config = exact.ExactConfig()
  attacker = drawn.attacker
  prefix = jax.jit(model.stream_decode, static_argnames=('layer',))
  policy = jax.jit(
    descend, static_argnames=('model', 'layer', 'steps', 'step_size')
  )
  out: dict[str, float] = {}
  for layer in cfg.layers:
    hidden, h0 = proposals.states_of(
      model, params, attacker.ids, attacker.mask, (layer, '0')
    )
    softmax = proposals.fit_softmax(hidden, h0, attacker, table)
    for name, every in drawn.splits['dev'].items():
      data = every.first(num_texts)
      (states,) = proposals.states_of(
        model, params, data.ids, data.mask, (layer,)
      )
      guesses = softmax(states)
      logits = np.asarray(model.logits(params, jnp.asarray(data.ids)))
      ranks = {r: [] for r in RANKINGS}
      seconds = 0.0
      index = model.num_layers if layer == 'last' else int(layer)
      for i in range(len(data.ids)):
        cache = model.init_stream_cache(
          params, 1, 2 * data.ids.shape[1], layer=index
        )
        done = 0
        for t in np.flatnonzero(data.score_mask[i]):
          # The true prefix ids[:t] into the cache.
          _, cache = prefix(
            params, cache, jnp.asarray(data.ids[i : i + 1, done:t]), layer=index
          )
          done = t
          token = int(data.ids[i, t])
          start = time.perf_counter()
          e = np.asarray(
            policy(
              model,
              params,
              cache,
              jnp.asarray(states[i, t]),
              layer=layer,
              steps=steps,
              step_size=step_size,
            )
          )
          seconds += time.perf_counter() - start
          g = guesses[i, t]
          cos = unit @ (g / np.linalg.norm(g))
          prior = logits[i, t - 1]
          grad = gradient_ranking(table, e)
          order = exact.proposal_order(cos, prior, order_config)
          both = order_with(cos, prior, grad, order_config)
          ranks['gradient'].append(proposals.rank_of(grad, token))
          ranks['softmax'].append(proposals.rank_of(cos, token))
          ranks['prior'].append(proposals.rank_of(prior, token))
          ranks['order'].append(int(np.flatnonzero(order == token)[0]))
          ranks['order_gradient'].append(int(np.flatnonzero(both == token)[0]))
      for ranking, got in ranks.items():
        proposals.add_rank_keys(
          out, got, data=name, layer=layer, ranking=ranking
        )
      n = len(ranks['gradient'])
      out[io.summary_key('num_tokens', data=name, layer=layer)] = n
      out[io.summary_key('seconds_per_token', data=name, layer=layer)] = (
        seconds / n
      )
      print(
        name,
        layer,
        {k: round(float(np.mean(v)), 1) for k, v in ranks.items()},
        f'{seconds / n:.2f} s a token',
        flush=True,
      )
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  cfg, model, params, corpora = study.target_from_flags()
  out = measure(
    cfg,
    model,
    params,
    corpora,
    f.num_texts,
    f.steps,
    f.step_size,
  )
  studies.write_summary(f.out, out)


def define_flags() -> None:
  inversion_exact.define_flags()
  flags.DEFINE_integer('num_texts', 8, 'Dev texts of each corpus.')
  flags.DEFINE_integer('steps', 20, 'Gradient steps a position.')
  flags.DEFINE_float(
    'step_size', 0.5, 'First step, in units of the mean embedding row norm.'
  )
  flags.DEFINE_string(
    'out', str(REPORT / 'gradient_policy' / 'summary.json'), 'Output JSON.'
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
