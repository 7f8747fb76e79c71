"""What the hybrid's selection keeps, against what it could keep.

For each b = 64 batch of a hybrid run that searched more sentences than b
(`results.jsonl` rows with `searched_ids`: `--hybrid_oversample > 1`), this
recomputes the batch's gradient, the candidates and every searched
sentence's cuts at word boundaries (`hybrid.pool_variants`), their own
head-matrix gradients once, and compares:

* `first_b`: the first b searches as searched. A search sees only the
  searches before it, so this is the default hybrid on that batch;
* `oversample`: b of all the searched sentences, by gradient matching;
* `cuts_first_b`: one cut (or the whole sentence) of each of the first b
  searches, by gradient matching: the cuts without extra searches;
* `cuts_oversample`: at most one variant per search, of all searches;

each with the head rows weighted by `|row|^(−q)` for q in 0, 0.5, 1
(`HybridConfig.select_weight`), and the ceilings: each original against
its best searched sentence, and against its best variant (chosen with the
original in hand). ROUGE as the experiment scores it (full batch, Porter
stemming). `matches_run` says whether the run's own selection is the
cell of its settings.

Writes `selection.json` beside the results (per batch, and the means over
batches), after each batch; a re-run computes only the batches it lacks.
With `--whiten` every row is matched centred and whitened as the head term
is (`hybrid.head_transform`, `HybridConfig.select_whiten`), into
`selection_whiten.json`.
Usage (repository root):
  python -m studies.dager.selection --results=reports/dager/hybrid_cuts/results.jsonl
  python -m studies.dager.selection --results=reports/dager/hybrid_cuts/results.jsonl --whiten
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax import metrics
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.recovery import bag as bow
from studies.dager.study import load_run, run_batches

POWERS = (0.0, 0.5, 1.0)
POOLS = ('first_b', 'oversample', 'cuts_first_b', 'cuts_oversample')


def scores(originals, texts):
  m = metrics.rouge_matrix(originals, texts, stemmer=True)
  return {k: float(v.max(1).mean()) for k, v in m.items()}


def study(model, params, cfg, row, whiten: bool = False) -> dict:
  b, pool = row['b'], row['searched_ids']
  config = runner.hybrid_config(cfg)
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], b, row['batch'], row['defense'], cfg
  )
  bag = bow.extract_bag(model, params, grads)
  _, padded, valid = hybrid.candidate_tokens(model, params, grads, bag, config)
  cut = dataclasses.replace(config, cuts=True)
  variants, owner = hybrid.pool_variants(model, pool, cut)
  owner = np.asarray(owner)
  whole = np.array([v == list(pool[o]) for v, o in zip(variants, owner)])
  transform = (
    hybrid.model_head_transform(model, params, config) if whiten else None
  )
  gram, along = hybrid.pool_grams(
    model,
    params,
    grads,
    variants,
    padded,
    valid,
    POWERS,
    config.max_length,
    transform=transform,
  )
  tok = model.tokenizer
  texts = [tok.decode(v, skip_special=True).strip() for v in variants]
  rows = {
    'oversample': np.flatnonzero(whole),
    'cuts_first_b': np.flatnonzero(owner < b),
    'cuts_oversample': np.arange(len(variants)),
  }
  first = [int(np.flatnonzero(whole & (owner == j))[0]) for j in range(b)]
  out = {
    'b': b,
    'batch': row['batch'],
    'searched': len(pool),
    'variants': len(variants),
    'first_b': scores(row['originals'], [texts[i] for i in first]),
  }
  run_texts = sorted(row['recovered'])
  select = jax.jit(hybrid.select_from_gram, static_argnames=('k', 'max_swaps'))
  for q, (g, a) in zip(POWERS, zip(gram, along)):
    cell = {}
    for name, idx in rows.items():
      chosen = select(
        jnp.asarray(g[np.ix_(idx, idx)]),
        jnp.asarray(a[idx]),
        b,
        groups=jnp.asarray(owner[idx], jnp.int32),
      )
      keep = idx[np.asarray(chosen)]
      picked = [texts[i] for i in keep]
      cell[name] = scores(row['originals'], picked)
      cell[name]['words'] = float(np.mean([len(t.split()) for t in picked]))
      setting = (config.cuts, config.select_weight, config.select_whiten) == (
        name == 'cuts_oversample',
        q,
        whiten,
      )
      if setting and name in ('oversample', 'cuts_oversample'):
        cell[name]['matches_run'] = sorted(picked) == run_texts
    out[f'q={q:g}'] = cell
  full = metrics.rouge_matrix(
    row['originals'], texts, stemmer=True, types=('rougeL',)
  )['rougeL']
  out['ceiling_searched_rougeL'] = float(full[:, whole].max(1).mean())
  out['ceiling_variants_rougeL'] = float(full.max(1).mean())
  return out


def mean(per: list[dict]) -> dict:
  def walk(items):
    first = items[0]
    if isinstance(first, dict):
      return {
        k: walk([i[k] for i in items]) for k in first if k not in ('b', 'batch')
      }
    if isinstance(first, bool):
      return all(items)
    return float(np.mean(items))

  return walk(per)


def define_flags() -> None:
  flags.DEFINE_string(
    'results',
    None,
    "A hybrid run's results.jsonl (rows with searched_ids).",
    required=True,
  )
  flags.DEFINE_string(
    'out',
    None,
    'Output JSON (default: selection.json, or selection_whiten.json with'
    ' --whiten, beside --results).',
  )
  flags.DEFINE_bool(
    'whiten',
    False,
    'Match the rows centred and whitened (hybrid.head_transform).',
  )


def main(argv):
  del argv
  f = flags.FLAGS
  cfg, model, params, rows = load_run(f.results)
  default = 'selection_whiten.json' if f.whiten else 'selection.json'
  target = Path(f.out or Path(f.results).parent / default)
  run_batches(
    rows,
    target,
    lambda row: study(model, params, cfg, row, whiten=f.whiten),
    mean,
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
