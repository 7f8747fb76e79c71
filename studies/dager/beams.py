"""What the hybrid's searches hold beyond their best beams.

The hybrid's selection (`HybridConfig.cuts`) chooses among each search's
best beam cut at its word boundaries; with ideal cuts ROUGE-L could reach
0.482 on the b = 64 batches of `hybrid_cuts/`, short of 0.5. This study
asks whether the searches' other beams raise that ceiling. For each batch
of a hybrid run (`results.jsonl` rows with `searched_ids`) it re-runs the
searches with `HybridConfig.pool_beams` = the run's beams
(:func:`leakjax.attacks.dager.hybrid.search_sentences`, which returns
each search's other live beams), checks that the best beams are the run's
searched sentences, and scores, each original against its best candidate
chosen with the original in hand (ROUGE-L as the experiment scores it:
full batch, Porter stemming):

* `searched`: the searched sentences;
* `cuts`: their cuts (the selection's pool with `--hybrid_cuts`);
* `beams_cuts`: every live beam's cuts (the pool with
  `--hybrid_pool_beams`).

These are upper bounds: an original may take a candidate that another
original also takes. Beside each, `assigned`: the best ROUGE-L with one
candidate per search and one search per original (an assignment on the
originals x searches matrix of best scores), a value a selection that keeps
one variant per search can reach.

Writes `beams.json` beside the results (per batch and the means), after
each batch; a re-run computes only the batches it lacks. About 10 min a
b = 64 batch on the 2-core CPU.
Usage (repository root):
  python -m studies.dager.beams --results=reports/dager/hybrid_cuts/results.jsonl --batches=0
"""

import dataclasses
from pathlib import Path

import numpy as np
from absl import app, flags
from scipy.optimize import linear_sum_assignment

from leakjax import metrics
from leakjax.attacks.dager import client, hybrid, runner
from studies.dager.study import load_run, run_batches

POOLS = ('searched', 'cuts', 'beams_cuts')


def ceilings(originals, texts, owner, searches) -> dict:
  """`upper` (each original's best candidate) and `assigned` (one
  candidate per search, one search per original) ROUGE-L."""
  full = metrics.rouge_matrix(
    originals, texts, stemmer=True, types=('rougeL',)
  )['rougeL']
  owner = np.asarray(owner)
  best = np.full((len(originals), searches), 0.0)
  for j in range(searches):
    mine = owner == j
    if mine.any():
      best[:, j] = full[:, mine].max(1)
  rows, cols = linear_sum_assignment(best, maximize=True)
  return {
    'upper': float(full.max(1).mean()),
    'assigned': float(best[rows, cols].sum() / len(originals)),
    'candidates': len(texts),
  }


def study(model, params, cfg, row) -> dict:
  b = row['b']
  config = dataclasses.replace(
    runner.hybrid_config(cfg), pool_beams=cfg.hybrid.beams
  )
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], b, row['batch'], row['defense'], cfg
  )
  found = hybrid.search_sentences(model, params, grads, b, config=config)
  tok = model.tokenizer
  decode = lambda v: tok.decode(v, skip_special=True).strip()  # noqa: E731
  plain = dataclasses.replace(config, cuts=False)
  cut = dataclasses.replace(config, cuts=True)
  pools = {
    'searched': hybrid.pool_variants(model, found.sequences, plain),
    'cuts': hybrid.pool_variants(model, found.sequences, cut),
    'beams_cuts': hybrid.pool_variants(
      model, found.sequences, cut, found.alternatives
    ),
  }
  out = {
    'b': b,
    'batch': row['batch'],
    'matches_run': found.sequences == row['searched_ids'],
    'live_beams': float(np.mean([1 + len(a) for a in found.alternatives])),
    'search_seconds': found.seconds['search'],
  }
  for name, (variants, owner) in pools.items():
    out[name] = ceilings(
      row['originals'], [decode(v) for v in variants], owner, b
    )
  return out


def mean(per: list[dict]) -> dict:
  out = {'batches': len(per)}
  out['matches_run'] = all(p['matches_run'] for p in per)
  for name in POOLS:
    out[name] = {
      k: float(np.mean([p[name][k] for p in per]))
      for k in ('upper', 'assigned', 'candidates')
    }
  return out


def define_flags() -> None:
  flags.DEFINE_string(
    'results',
    None,
    "A hybrid run's results.jsonl (rows with searched_ids).",
    required=True,
  )
  flags.DEFINE_list('batches', [], 'Batch indices to study (default: all).')


def main(argv):
  del argv
  f = flags.FLAGS
  cfg, model, params, rows = load_run(f.results)
  if f.batches:
    keep = {int(x) for x in f.batches}
    rows = [r for r in rows if r['batch'] in keep]
  target = Path(f.results).parent / 'beams.json'
  run_batches(rows, target, lambda row: study(model, params, cfg, row), mean)


if __name__ == '__main__':
  define_flags()
  app.run(main)
