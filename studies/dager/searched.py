"""The searches of a hybrid run as searched, before the selection.

A run with `--hybrid_cuts` (or `--hybrid_oversample`, or
`--hybrid_start_dims`) records, per batch, the searched sentences
(`searched_ids`) beside the kept ones (`recovered`). This scores the
first b searches as they came out (what the hybrid returns without the
selection) as the experiment scores its own rows
(`leakjax.attacks.dager.runner.batch_scores`: every original against its
best prediction, Porter stemming; exact on token ids), beside the row's
own scores of the kept sentences, with the mean length in words of
each. With more searches than b it also counts the kept sentences that
came from the searches past the first b (`kept_beyond_b`): each kept
sentence is traced to the search whose variant it is
(`hybrid.pool_variants`, the selection's own pool).

Writes `searched.json` beside the results (per batch, and the means over
batches). Takes seconds (only the tokenizer works).
Usage (repository root):
  python -m studies.dager.searched --results=reports/dager/hybrid_evidence/results.jsonl
"""

import json
from pathlib import Path

import numpy as np
from absl import app, flags

from leakjax.attacks.dager import hybrid, runner
from studies.dager.selection import mean
from studies.dager.study import load_run


def words(texts: list[str]) -> float:
  return float(np.mean([len(t.split()) for t in texts]))


def kept_searches(model, config, row) -> list[int]:
  """The search each kept sentence of `row` is a variant of (in the
  order of `row['recovered']`), from the selection's pool: the searched
  sentences and the other beams the row records, with `config.cuts` their
  cuts."""
  tok = model.tokenizer
  variants, owner = hybrid.pool_variants(
    model, row['searched_ids'], config, row.get('alternative_ids')
  )
  free: dict[str, list[int]] = {}
  for v, o in zip(variants, owner):
    free.setdefault(tok.decode(v, skip_special=True).strip(), []).append(o)
  out = []
  for text in row['recovered']:
    owners = [o for o in free.get(text, []) if o not in out]
    if not owners:
      raise ValueError(f'kept sentence {text!r} is no variant of a search')
    out.append(owners[0])
  return out


def define_flags() -> None:
  flags.DEFINE_string(
    'results',
    None,
    "A hybrid run's results.jsonl (rows with searched_ids).",
    required=True,
  )


def main(argv):
  del argv
  results = flags.FLAGS.results
  cfg, model, _, rows = load_run(results)
  config = runner.hybrid_config(cfg)
  tok = model.tokenizer
  per = []
  for row in sorted(rows, key=lambda r: (r['b'], r['batch'])):
    b = row['b']
    ids = row['searched_ids'][:b]
    texts = [tok.decode(s, skip_special=True).strip() for s in ids]
    true, mask = tok.encode_batch(list(row['originals']), add_bos=True)
    true = [t[: int(m.sum())].tolist() for t, m in zip(true, mask)]
    searched = runner.batch_scores(row['originals'], texts, true, ids)
    searched['words'] = words(texts)
    kept = {k: row[k] for k in ('rouge1', 'rouge2', 'rougeL', 'exact')}
    kept['words'] = words(row['recovered'])
    if len(row['searched_ids']) > b:
      kept['kept_beyond_b'] = sum(
        o >= b for o in kept_searches(model, config, row)
      )
    per.append(
      {
        'b': b,
        'batch': row['batch'],
        'searched': searched,
        'kept': kept,
      }
    )
  out = {'batches': per, 'mean': mean(per)}
  target = Path(results).parent / 'searched.json'
  target.write_text(json.dumps(out, indent=2) + '\n')
  print(json.dumps(out['mean'], indent=2))


if __name__ == '__main__':
  define_flags()
  app.run(main)
