"""FILM's numbers: the paper's tables and the statistics of our rows.

The paper's Enron, defense and multi-sentence results (Gupta et al.,
"Recovering Private Text in Federated Learning of Language Models",
NeurIPS 2022) that :mod:`experiments.film_report` and
:mod:`experiments.film_plots` print beside ours, and the mean, std and
best of a field over rows (NERR is None for batches whose sentences name
no entity: such rows are left out).
"""

from __future__ import annotations

import math

import numpy as np

# FILM Table 10, Enron Email rows: mean over 20 batches (best in brackets
# in the paper): b -> (ROUGE-1, ROUGE-2, ROUGE-L, NERR).
PAPER_TABLE10_ENRON = {
  1: (0.73, 0.45, 0.61, 0.34),
  16: (0.41, 0.20, 0.31, 0.40),
  64: (0.37, 0.18, 0.29, 0.35),
  128: (0.37, 0.19, 0.29, 0.38),
}
# FILM Table 9 (Enron, FILM row) adds b = 4: (R-1, R-2, R-L, NERR).
PAPER_TABLE9_ENRON = {4: (0.54, 0.32, 0.44, 0.66)}
# FILM Table 4 (GPT-2, WikiText-103, b = 16): defense -> (precision, recall).
PAPER_TABLE4 = {
  'none': (1.00, 1.00),
  'prune:0.9': (1.00, 1.00),
  'prune:0.99': (1.00, 1.00),
  'prune:0.999': (1.00, 0.98),
  'prune:0.9999': (1.00, 0.90),
  'dp:15': (0.97, 0.49),
  'dp:10': (0.88, 0.17),
  'dp:5': (0.29, 0.01),
  'dp:1': (0.00, 0.00),
}
# FILM Tables 4a/4b (GPT-2 fine-tuned on WikiText-103): defense -> test
# perplexity of the model trained under it.
PAPER_TABLE4_PERPLEXITY = {
  'none': 11.46,
  'prune:0.9': 11.57,
  'prune:0.99': 12.77,
  'prune:0.999': 15.34,
  'prune:0.9999': 19.21,
  'dp:15': 11.98,
  'dp:10': 12.86,
  'dp:5': 14.32,
  'dp:1': 16.31,
}
# FILM Table 5: (init, embeddings) -> test perplexity on WikiText-103 and
# Enron.
PAPER_TABLE5 = {
  ('random', 'none'): {'wikitext': 27.31, 'enron': 15.16},
  ('random', 'freeze'): {'wikitext': 118.69, 'enron': 69.17},
  ('pretrained', 'none'): {'wikitext': 11.40, 'enron': 7.09},
  ('pretrained', 'freeze'): {'wikitext': 11.48, 'enron': 7.30},
}
# FILM Table 3 (GPT-2, WikiText-103, b = 16): repetitions of the beam
# search -> (recall, precision) of ROUGE-L > 0.25, means over batches.
PAPER_TABLE3 = {
  1: (0.03, 0.50),
  5: (0.13, 0.36),
  10: (0.19, 0.28),
  20: (0.25, 0.21),
  50: (0.30, 0.12),
  100: (0.34, 0.07),
}


def values(rows, field):
  # NERR is None for batches whose sentences have no named entity.
  return [
    r[field]
    for r in rows
    if r.get(field) is not None
    and not (isinstance(r[field], float) and math.isnan(r[field]))
  ]


def mean_std(rows, field):
  vals = values(rows, field)
  if not vals:
    return float('nan'), float('nan')
  return float(np.mean(vals)), float(np.std(vals))


def best(rows, field):
  vals = values(rows, field)
  return float(np.max(vals)) if vals else float('nan')


def paper_points(bs) -> dict[int, tuple[float, ...]]:
  """The paper's Enron means (FILM Table 10; b = 4: Table 9) at the batch
  sizes from the smallest to the largest of `bs`: the paper is drawn over
  the run's range only."""
  paper = {**PAPER_TABLE10_ENRON, **PAPER_TABLE9_ENRON}
  if not bs:
    return {}
  return {b: paper[b] for b in sorted(paper) if min(bs) <= b <= max(bs)}
