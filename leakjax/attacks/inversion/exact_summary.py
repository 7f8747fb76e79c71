"""The exact-inversion experiment's scores and summary keys
(:mod:`.exact_runner`'s module docstring names them)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from leakjax import io
from leakjax.attacks.inversion import bei_hei, exact
from leakjax.attacks.inversion import exact_perturb as perturb
from leakjax.attacks.inversion import scoring as inversion_scoring
from leakjax.attacks.inversion import texts as texts_lib

SHOWN = 4  # recovered texts kept per results row (for the report)
EXACT_KEYS = ('candidates_per_token', 'seconds_per_sentence', 'undecided')


def search_facts(found: Sequence[exact.Inversion], score_mask) -> dict:
  """The exact search's cost over the scored positions of every text."""
  checked, decided = [], []
  for inv, m in zip(found, np.asarray(score_mask).astype(bool)):
    scored = np.flatnonzero(m[: len(inv.ids)])
    checked += [inv.checked[j] for j in scored]
    decided += [inv.decided[j] for j in scored]
  checked = np.asarray(checked or [0], np.float64)
  return {
    'candidates_per_token': float(np.median(checked)),
    'candidates_mean': float(np.mean(checked)),
    'candidates_max': int(np.max(checked)),
    'seconds_per_sentence': float(np.mean([inv.seconds for inv in found])),
    'undecided': float(1 - np.mean(decided)) if decided else 0.0,
  }


def score(tokenizer, data: texts_lib.Split, predicted) -> dict[str, Any]:
  """Wan et al.'s scores (Sec. 5.1.3) of `predicted [N, W]` ids, and the
  fraction of texts recovered token for token (scored positions)."""
  predicted = np.asarray(predicted)
  preds = bei_hei.decode_ids(tokenizer, predicted, data.score_mask)
  scores = inversion_scoring.score_texts(preds, data.references)
  real = data.score_mask.astype(bool)
  same = [
    bool(np.array_equal(predicted[r][real[r]], data.ids[r][real[r]]))
    for r in range(len(preds))
  ]
  return {
    'exact': float(np.mean(same)),
    'rouge1': float(np.mean(scores['rouge1'])),
    'rougeL': float(np.mean(scores['rougeL'])),
    'exact_each': same,
    'num_texts': len(preds),
    'recovered': preds[:SHOWN],
  }


def key_params(row: Mapping[str, Any]) -> dict[str, str]:
  """The summary key's parameters of a results row."""
  params = dict(
    attack=row['attack'],
    data=row['data'],
    layer=row['layer'],
    split=row['split'],
  )
  params.update(perturb.parse(row['perturbation']).summary_params())
  return params


def summarize(
  rows: Sequence[Mapping[str, Any]], facts: Mapping[str, Any] | None = None
) -> dict[str, float]:
  """summary.json's keys (module docstring) from the results rows."""
  out: dict[str, float] = {}
  for row in rows:
    if row.get('kind') != 'attack':
      continue
    params = key_params(row)
    metrics = ('exact', 'rouge1', 'rougeL')
    if row['attack'] == 'exact':
      metrics += EXACT_KEYS
    for metric in metrics:
      out[io.summary_key(metric, **params)] = float(row[metric])
  for split, counts in (facts or {}).get('num_texts', {}).items():
    for name, n in counts.items():
      out[io.summary_key('num_texts', data=name, split=split)] = n
  if facts and 'num_attacker' in facts:
    out['num_attacker'] = facts['num_attacker']
  return out


__all__ = [
  'EXACT_KEYS',
  'SHOWN',
  'key_params',
  'score',
  'search_facts',
  'summarize',
]
