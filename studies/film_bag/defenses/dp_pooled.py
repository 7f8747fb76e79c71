"""How much any bag attack, pooling the whole gradient, can recover under DP-SGD.

`studies.film_bag.defenses.dp_bound` bounds attacks that read one
embedding row at a time. An
attack could instead pool every coordinate that a token moves: its row,
the first layer's projections (the input span that DAGER reads), every
later layer. This script bounds all such attacks on the same batches,
model, clip norm and σ as the committed DP-SGD run (`config.json`,
`dp_sigma.json` in `reports/film_bag/defenses/`).

The bound. DP-SGD sends `S(D) + N(0, σ²C² I)` over all parameters, with
`S(D)` the sum of the per-example gradients clipped to norm C (Abadi et
al. 2016). Take a token type v of the batch D and the batch D' in which
every occurrence of v is replaced by another token v' (so v is absent from
D'). The Neyman-Pearson test of D' against D, knowing both, is a matched
filter along `S(D) - S(D')`: its statistic is N(μ_v, 1) under D and
N(0, 1) under D', with

    μ_v = |S(D) - S(D')| / (σC).

Any attack's decision "v is in the batch" is a test of D against D', so at
the false-positive rate it has on v in the world D', its true-positive
rate on v is at most that of this matched filter (Dong, Roth & Su 2022,
f-DP: the Gaussian mechanism's trade-off curve is Φ(Φ⁻¹(1-α) - μ)). To
turn this into a bag precision, the script assumes that the attack's
false-positive rate is the same on every absent vocabulary token (its rate
on v in D'), and scores the oracle with one threshold over all V rows as
`dp_bound` does: batch tokens N(μ_v, 1), the other V - |bag| rows N(0, 1).
That is in the attacker's favour twice: it knows D and D' exactly, and each
absent token is as easy to reject as v is in D'.

Decisions where the setting is open:
* v' is the candidate closest to v in the sense of the bound (the smallest
  |S(D) - S(D')|, so the tightest bound among those tried) out of four: the
  LM's three most likely tokens at v's first occurrence (the sentences the
  model finds as plausible as the real one) and one draw from the training
  split's token frequencies. The bound holds for each candidate; the
  closest gives the smallest μ. The swap changes v's rows as input and as the
  next-token target, which is what the presence of v changes.
* `types_per_batch` token types are sampled from each batch's bag
  (uniformly, seeded), not all of them: the per-example gradients dominate
  the cost. The bag's beginning-of-sequence token is skipped (every sentence
  has it).
* μ_v is split by where the difference lies (the tied embedding matrix, the
  first layer's q/k/v kernels, the rest of the first layer, layers 1-29 and
  the final norm): the parts' squares add up to μ_v², so each part is the
  oracle of an attack that reads only that part.
* Also reported: μ of a whole example (|clip g| / (σC) = 1/σ for a clipped
  example), the most any test on one example can have at one step.

Usage (repository root; ~15 min on the 2-core CPU):
  python -m studies.film_bag.defenses.dp_pooled
  python -m studies.film_bag.defenses.dp_pooled --reuse   # re-analyse
writes `reports/film_bag/defenses/dp_pooled.json`.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from scipy import stats

from leakjax import data as data_lib
from leakjax import fl, models
from leakjax.attacks.film import client, runner
from studies import report_dir
from studies.film_bag.defenses import dp_bound

REPORT = report_dir(__file__)
TYPES_PER_BATCH = 24
LM_CANDIDATES = 3
PARTS = ('embedding', 'layer0_qkv', 'layer0_rest', 'later_layers')


def part_of(path: tuple[str, ...]) -> str:
  if path[0] == 'embed':
    return 'embedding'
  if path[0] == 'layers_0':
    if path[1] == 'attn' and path[2] in ('q_proj', 'k_proj', 'v_proj'):
      return 'layer0_qkv'
    return 'layer0_rest'
  return 'later_layers'


def leaf_parts(params) -> list[str]:
  return [
    part_of(tuple(k.key for k in p))
    for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]


def make_gradient(model, clip: float):
  """A jitted clipped per-example gradient (one row, C-clipped, no noise)."""
  defense = fl.dp_sgd(clip, 0.0, microbatch=1)

  @jax.jit
  def grad(params, ids, mask):
    return fl.client_gradient(
      model, params, ids, mask, defense=defense, key=jax.random.key(0)
    )

  return grad


@jax.jit
def leaf_sq_norms(tree):
  return jnp.stack(
    [jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)]
  )


@jax.jit
def add(a, b):
  return jax.tree.map(jnp.add, a, b)


@jax.jit
def sub(a, b):
  return jax.tree.map(jnp.subtract, a, b)


def pad(ids: np.ndarray, mask: np.ndarray, pad_id: int):
  width = -(-ids.shape[1] // 8) * 8
  extra = ((0, 0), (0, width - ids.shape[1]))
  return (
    np.pad(ids, extra, constant_values=pad_id),
    np.pad(mask, extra),
  )


def replacements(v, encoded, params, logits, unigram, rng) -> list[int]:
  """The candidates for v': the LM's `LM_CANDIDATES` most likely tokens at
  v's first occurrence (other than v), then one unigram draw."""
  for ids, mask in encoded:
    hit = np.flatnonzero((ids[0] == v) & (mask[0] > 0))
    if hit.size:
      pos = int(hit[0])
      break
  row = np.asarray(logits(params, jnp.asarray(ids), jnp.asarray(mask)))[0]
  # The logits at pos - 1 predict the token at pos (pos >= 1: BOS is skipped).
  order = np.argsort(-row[pos - 1])
  out = [int(t) for t in order[: LM_CANDIDATES + 1] if t != v][:LM_CANDIDATES]
  p = unigram.copy()
  p[[v, *out]] = 0.0
  out.append(int(rng.choice(len(p), p=p / p.sum())))
  return out


def swap_type(v, encoded, clean, params, grad, logits, unigram, rng, parts):
  """|S(D) - S(D')| for each candidate v', split by part."""
  candidates = []
  for w in replacements(v, encoded, params, logits, unigram, rng):
    diff = None
    occurrences = 0
    for (ids, mask), g in zip(encoded, clean):
      hit = (ids == v) & (mask > 0)
      if not hit.any():
        continue
      occurrences += int(hit.sum())
      swapped = np.where(hit, w, ids)
      d = sub(g, grad(params, jnp.asarray(swapped), jnp.asarray(mask)))
      diff = d if diff is None else add(diff, d)
    sq = np.asarray(leaf_sq_norms(diff))
    by_part = {k: 0.0 for k in PARTS}
    for x, k in zip(sq.tolist(), parts):
      by_part[k] += x
    candidates.append(
      {
        'replacement': w,
        'diff_norm': float(np.sqrt(sq.sum())),
        **{f'diff_norm_{k}': float(np.sqrt(x)) for k, x in by_part.items()},
      }
    )
  closest = min(candidates, key=lambda c: c['diff_norm'])
  return {
    'token': v,
    'occurrences': occurrences,
    **closest,
    'candidates': candidates,
  }


def measure(cfg) -> tuple[list[dict], int]:
  texts = data_lib.load_corpus(cfg.data)
  model, params = models.load(cfg.model)
  sentences = runner.private_sentences(cfg, texts, model.tokenizer)
  train, _ = data_lib.train_eval_split(
    sentences, cfg.eval_fraction, seed=cfg.seed
  )
  tok = model.tokenizer
  ids_all, mask_all = tok.encode_batch(train, add_bos=False)
  counts = np.bincount(
    ids_all[mask_all > 0],
    minlength=models.get_path(params, model.paths.word_embeddings).shape[0],
  )
  unigram = counts / counts.sum()
  bos = getattr(tok, 'bos_id', None)
  grad = make_gradient(model, cfg.dp_clip)
  logits = jax.jit(model.logits)
  parts = leaf_parts(params)
  b = cfg.batch_sizes[0]
  vocab = int(models.get_path(params, model.paths.word_embeddings).shape[0])
  rng = np.random.default_rng([cfg.seed, 7])
  out = []
  for index in range(cfg.num_batches):
    start = time.perf_counter()
    batch = [
      train[i] for i in client.draw_batch(len(train), b, index, cfg.seed)
    ]
    encoded = []
    for text in batch:
      ids, mask = tok.encode_batch([text], add_bos=True)
      encoded.append(pad(ids, mask, tok.pad_id))
    clean = [grad(params, jnp.asarray(i), jnp.asarray(m)) for i, m in encoded]
    bag = sorted(
      set().union(*(set(i[m > 0].tolist()) for i, m in encoded)) - {bos}
    )
    chosen = rng.choice(bag, size=min(TYPES_PER_BATCH, len(bag)), replace=False)
    rows = []
    for v in chosen.tolist():
      rows.append(
        swap_type(v, encoded, clean, params, grad, logits, unigram, rng, parts)
      )
    out.append({'batch': index, 'bag_size': len(bag), 'types': rows})
    norms = np.asarray([r['diff_norm'] for r in rows])
    print(
      f"batch {index}: bag {len(bag)}, {len(rows)} types, |S(D)-S(D')|"
      f' median {np.median(norms):.4f} max {norms.max():.4f}'
      f' ({time.perf_counter() - start:.0f} s)',
      file=sys.stderr,
    )
  return out, vocab


def oracle_pr(mu: np.ndarray, bag_size: int, vocab: int):
  """Expected precision / recall of the matched-filter oracle over thresholds.

  The sampled types' μ stand for the whole bag: a batch token passes
  threshold t with probability mean_v Φ(μ_v - t), an absent one with
  Φ(-t).
  """
  t = np.linspace(-2.0, 12.0, 2801)
  tpr = stats.norm.sf(t[:, None] - mu[None, :]).mean(1)
  tp = bag_size * tpr
  fp = (vocab - bag_size) * stats.norm.sf(t)
  precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1e-300), 1.0)
  return precision, tpr


def analyse(batches, vocab, sigmas) -> list[dict]:
  results = []
  for entry in sigmas:
    eps, sigma = entry['epsilon'], entry['sigma']
    target_p, target_r = dp_bound.PAPER.get(eps, (None, None))
    row = {
      'epsilon': eps,
      'sigma': sigma,
      'paper_precision': target_p,
      'paper_recall': target_r,
      'whole_example_mu': 1.0 / sigma,
    }
    for key in ('diff_norm', *(f'diff_norm_{k}' for k in PARTS)):
      name = 'all' if key == 'diff_norm' else key.removeprefix('diff_norm_')
      mus, got = [], []
      for bt in batches:
        # Each sampled type stands for its batch's bag (the other types of
        # the bag are taken to have the same distribution of μ).
        mu = np.asarray([t[key] for t in bt['types']]) / sigma
        mus.append(mu)
        p, r = oracle_pr(mu, bt['bag_size'], vocab)
        got.append(
          {
            'recall_at_paper_precision': (
              dp_bound.best_recall(p, r, target_p) if target_p else None
            ),
            'precision_at_paper_recall': (
              dp_bound.precision_at(p, r, target_r) if target_r else None
            ),
          }
        )
      mus = np.concatenate(mus)
      row[f'{name}_mu_median'] = float(np.median(mus))
      row[f'{name}_mu_max'] = float(mus.max())
      for k in ('recall_at_paper_precision', 'precision_at_paper_recall'):
        xs = [g[k] for g in got]
        row[f'{name}_{k}'] = None if xs[0] is None else float(np.mean(xs))
    results.append(row)
    print(json.dumps(row), file=sys.stderr)
  return results


def largest_sigma(batches, vocab, precision: float, recall: float) -> float:
  """The largest σ at which the whole-gradient oracle still reaches
  `precision` at `recall` (mean over batches; bisection on a log scale)."""

  def reaches(sigma):
    got = []
    for bt in batches:
      mu = np.asarray([t['diff_norm'] for t in bt['types']]) / sigma
      p, r = oracle_pr(mu, bt['bag_size'], vocab)
      got.append(dp_bound.best_recall(p, r, precision))
    return float(np.mean(got)) >= recall

  return dp_bound.largest_passing(reaches, 1e-3, 10.0)


def paper_rows(batches, vocab, sigmas) -> list[dict]:
  rows = []
  for eps, (p_t, r_t) in sorted(dp_bound.PAPER.items(), reverse=True):
    sigma = largest_sigma(batches, vocab, p_t, r_t)
    rows.append(
      {
        'epsilon': eps,
        'paper_precision': p_t,
        'paper_recall': r_t,
        'sigma_of_run': next(e['sigma'] for e in sigmas if e['epsilon'] == eps),
        'largest_sigma': sigma,
        # The ε that σ buys at the committed run's sampling rate and steps.
        'epsilon_needed': fl.epsilon(
          sigma,
          sigmas[0]['sampling_rate'],
          sigmas[0]['steps'],
          sigmas[0]['delta'],
        ),
      }
    )
    print(json.dumps(rows[-1]), file=sys.stderr)
  return rows


def define_flags() -> None:
  flags.DEFINE_bool(
    'reuse',
    False,
    "Re-analyse dp_pooled.json's measured types instead of measuring them.",
  )


def main(argv) -> None:
  del argv
  cfg = dp_bound.load_config()
  sigmas = json.loads((REPORT / 'dp_sigma.json').read_text())
  out_path = REPORT / 'dp_pooled.json'
  if flags.FLAGS.reuse:
    old = json.loads(out_path.read_text())
    batches, vocab = old['batches'], old['vocab']
  else:
    batches, vocab = measure(cfg)
  out = {
    **dp_bound.run_fields(cfg),
    'vocab': vocab,
    'types_per_batch': TYPES_PER_BATCH,
    'batches': batches,
    'epsilons': analyse(batches, vocab, sigmas),
    'paper_rows': paper_rows(batches, vocab, sigmas),
  }
  out_path.write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  define_flags()
  app.run(main)
