"""How much the hybrid's sentence ends cost: ROUGE-L with ideal cuts.

The hybrid (`hybrid/results.jsonl`, its default settings, b = 32 and 64
past the rank limit) returns sentences longer than the batch's. For each
batch this recomputes the full-batch ROUGE-L (each original against its
best recovered sentence, Porter stemming, as the experiment scores it) and
an upper bound on what better sentence ends alone could give: each
original against the best *word prefix* of any recovered sentence (the
cut chosen with the original in hand, so a ceiling, not an attack).

Writes `reports/dager/truncation_bound.json`: per b and batch the
committed and recomputed ROUGE-L, the bound, and the mean number of words
of the originals and of the recovered sentences; per b the means over
batches.

Usage (repository root):
  python -m studies.dager.truncation_bound
"""

import json

import numpy as np
from absl import app

from leakjax import metrics
from studies import report_dir

REPORT = report_dir(__file__)


def prefixes(sentence: str) -> list[str]:
  words = sentence.split()
  return [' '.join(words[:k]) for k in range(1, len(words) + 1)]


def bound(originals: list[str], recovered: list[str]) -> np.ndarray:
  """Per original, the best ROUGE-L over every word prefix of every
  recovered sentence."""
  cuts = [p for r in recovered for p in prefixes(r)]
  m = metrics.rouge_matrix(originals, cuts, stemmer=True, types=('rougeL',))
  return m['rougeL'].max(1)


def main(argv):
  del argv
  rows = [json.loads(line) for line in (REPORT / 'hybrid/results.jsonl').open()]
  out = {}
  for b in sorted({r['b'] for r in rows}):
    per = []
    for r in sorted((r for r in rows if r['b'] == b), key=lambda r: r['batch']):
      full = metrics.rouge_matrix(
        r['originals'], r['recovered'], stemmer=True, types=('rougeL',)
      )['rougeL'].max(1)
      per.append(
        dict(
          batch=r['batch'],
          rougeL=r['rougeL'],
          rougeL_recomputed=float(full.mean()),
          rougeL_ideal_cuts=float(bound(r['originals'], r['recovered']).mean()),
          words_original=float(
            np.mean([len(s.split()) for s in r['originals']])
          ),
          words_recovered=float(
            np.mean([len(s.split()) for s in r['recovered']])
          ),
        )
      )
      print(b, per[-1])
    mean = {
      k: float(np.mean([p[k] for p in per])) for k in per[0] if k != 'batch'
    }
    out[f'b={b}'] = dict(batches=per, mean=mean)
  path = REPORT / 'truncation_bound.json'
  path.write_text(json.dumps(out, indent=2) + '\n')
  print(json.dumps({k: v['mean'] for k, v in out.items()}, indent=2))


if __name__ == '__main__':
  app.run(main)
