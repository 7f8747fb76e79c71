"""The hybrid's kept sentences refined by exact gradient matching.

For each batch of a hybrid run whose rows hold the searched sentences
(`searched_ids`: `--hybrid_oversample > 1` or `--hybrid_cuts`), this
recomputes the batch's gradient and candidates, finds the run's kept
sentences among the searches' cuts (`hybrid.pool_variants`, matched by
their text), and runs `hybrid.refine` from them: sweeps of single-token
substitutions and deletions, each kept only if it raises the match between
the observed head gradient and the sum of the kept sentences' own (rows
centred and whitened by `hybrid.model_head_transform` unless
`--nowhiten`; `--lm` adds the LM's log-probability, `refine_lm`). It
records ROUGE before and after (full batch, Porter stemming, as the
experiment scores it), `exact` (the fraction of originals recovered word
for word, as text), the objective after each sweep, and the seconds.

Writes `refine.json` beside the results after each batch; a re-run
computes only the batches it lacks.
Usage (repository root):
  python -m studies.dager.refine --results=reports/dager/hybrid_cuts/results.jsonl
"""

import dataclasses
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from leakjax import metrics
from leakjax.attacks.common import bag as bow
from leakjax.attacks.dager import client, hybrid, runner
from studies.dager.study import load_run, run_batches


@dataclasses.dataclass(frozen=True)
class RefineSettings:
  """The study's settings (its flags).

  Attributes:
    sweeps: `HybridConfig.refine`, sweeps of single-token edits.
    proposals: `HybridConfig.refine_proposals`, edits per sentence and
      sweep whose exact gradient is computed.
    select_weight: `HybridConfig.select_weight`; None keeps the run's.
    lm: `HybridConfig.refine_lm`, the weight of the LM's log-probability.
    whiten: match the rows centred and whitened (`hybrid.head_transform`).
  """

  sweeps: int = 3
  proposals: int = 16
  select_weight: float | None = None
  lm: float = 0.0
  whiten: bool = True


def scores(originals, texts):
  m = metrics.rouge_matrix(originals, texts, stemmer=True)
  out = {k: float(v.max(1).mean()) for k, v in m.items()}
  norm = [' '.join(t.split()) for t in texts]
  out['exact'] = float(
    np.mean([' '.join(o.split()) in norm for o in originals])
  )
  return out


def kept_sentences(model, row, config):
  """The run's kept sentences as token ids: the cut variants of its
  searches whose decoded text is a recovered sentence."""
  tok = model.tokenizer
  cut = dataclasses.replace(config, cuts=True)
  variants, _ = hybrid.pool_variants(model, row['searched_ids'], cut)
  by_text = {}
  for v in variants:
    by_text.setdefault(tok.decode(v, skip_special=True).strip(), v)
  missing = [t for t in row['recovered'] if t not in by_text]
  if missing:
    raise SystemExit(f'{len(missing)} kept sentences are no cut of a search')
  return [by_text[t] for t in row['recovered']]


def study(model, params, cfg, row, settings: RefineSettings) -> dict:
  b = row['b']
  config = dataclasses.replace(
    runner.hybrid_config(cfg),
    refine=settings.sweeps,
    refine_proposals=settings.proposals,
  )
  config = dataclasses.replace(config, refine_lm=settings.lm)
  if settings.select_weight is not None:
    config = dataclasses.replace(config, select_weight=settings.select_weight)
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], b, row['batch'], row['defense'], cfg
  )
  bag = bow.extract_bag(model, params, grads)
  _, padded, valid = hybrid.candidate_tokens(model, params, grads, bag, config)
  start = kept_sentences(model, row, config)
  tok = model.tokenizer
  t0 = time.perf_counter()
  per_sweep = []

  def texts_of(seqs):
    return [tok.decode(s, skip_special=True).strip() for s in seqs]

  transform = None
  if settings.whiten:
    transform = hybrid.model_head_transform(model, params, config)
  refined, info = hybrid.refine(
    model,
    params,
    grads,
    start,
    padded=padded,
    valid=valid,
    config=config,
    transform=transform,
  )
  seconds = time.perf_counter() - t0
  before = scores(row['originals'], texts_of(start))
  after = scores(row['originals'], texts_of(refined))
  per_sweep.append(info)
  return {
    'b': b,
    'batch': row['batch'],
    'sweeps': settings.sweeps,
    'proposals': settings.proposals,
    'whiten': settings.whiten,
    'lm': settings.lm,
    'select_weight': config.select_weight,
    'run': {k: row[k] for k in ('rouge1', 'rouge2', 'rougeL', 'exact')},
    'before': before,
    'after': after,
    'objective': info['objective'],
    'edits': info['edits'],
    'changed': int(sum(a != s for a, s in zip(refined, start))),
    'words_before': float(np.mean([len(t.split()) for t in texts_of(start)])),
    'words_after': float(np.mean([len(t.split()) for t in texts_of(refined)])),
    'seconds': seconds,
    'recovered': texts_of(refined),
  }


def mean(per: list[dict]) -> dict:
  keys = ('before', 'after', 'run')
  out = {
    k: {m: float(np.mean([p[k][m] for p in per])) for m in per[0][k]}
    for k in keys
  }
  out['seconds'] = float(np.mean([p['seconds'] for p in per]))
  return out


def define_flags() -> None:
  flags.DEFINE_string(
    'results',
    None,
    "A hybrid run's results.jsonl (rows with searched_ids).",
    required=True,
  )
  flags.DEFINE_string(
    'out', None, 'Output JSON (default: refine.json beside --results).'
  )
  flags.DEFINE_integer('sweeps', 3, 'HybridConfig.refine: sweeps of edits.')
  flags.DEFINE_integer(
    'proposals', 16, 'HybridConfig.refine_proposals: edits per sentence.'
  )
  flags.DEFINE_float(
    'select_weight', None, "HybridConfig.select_weight (default: the run's)."
  )
  flags.DEFINE_float('lm', 0.0, 'HybridConfig.refine_lm.')
  flags.DEFINE_bool(
    'whiten',
    True,
    'Match the rows centred and whitened (hybrid.head_transform).',
  )
  flags.DEFINE_list('batches', None, 'Batch indices to study (default: all).')


def main(argv):
  del argv
  f = flags.FLAGS
  settings = RefineSettings(
    sweeps=f.sweeps,
    proposals=f.proposals,
    select_weight=f.select_weight,
    lm=f.lm,
    whiten=f.whiten,
  )
  cfg, model, params, rows = load_run(f.results)
  if f.batches:
    keep = {int(i) for i in f.batches}
    rows = [r for r in rows if r['batch'] in keep]
  target = Path(f.out or Path(f.results).parent / 'refine.json')
  run_batches(
    rows,
    target,
    lambda row: study(model, params, cfg, row, settings),
    mean,
    shown=lambda p: {k: v for k, v in p.items() if k != 'recovered'},
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
