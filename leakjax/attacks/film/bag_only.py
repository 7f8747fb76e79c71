"""`--mode=bag`: the bag of words alone, without the sentence search.

FILM Table 4 (precision and recall of the bag under gradient pruning and
DP-SGD) and the tied-embedding comparison: for each defense, each bag
method that applies (:func:`leakjax.recovery.bag.extract_bag`), plus
the norm-threshold baseline at its best threshold
(:func:`oracle_norm_threshold`, an oracle that knows the batch).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from leakjax import metrics, models
from leakjax.attacks.film import client
from leakjax.recovery import bag as bow


def bag_batch(
  model, params, texts, b, cfg, *, num_train, index, microbatch=None
):
  """Bag-only rows (one per defense x method) for one batch."""
  rows = []
  key = jax.random.fold_in(
    jax.random.fold_in(jax.random.key(cfg.seed), b), index
  )
  for spec in cfg.defenses:
    defense, noise = client.make_defense(
      model, spec, cfg, num_train=num_train, b=b
    )
    start = time.perf_counter()
    grads, ids, mask = client.client_gradient(
      model, params, texts, defense, key, microbatch
    )
    # Dispatch is asynchronous: wait, so that grad_s is the gradient's time.
    grads = jax.block_until_ready(grads)
    grad_s = time.perf_counter() - start
    truth = client.true_tokens(ids, mask)
    kind, _ = client.parse_defense(spec)
    tied = model.paths.lm_head is None
    if kind in ('dp', 'dpsigma'):
      methods = ['dp']
    elif kind == 'prune':
      methods = ['nonzero'] + (['tied'] if tied else [])
    else:
      methods = ['tied', 'norm'] if tied else ['nonzero']
    rows_grad = jax.device_get(
      models.get_path(grads, model.paths.word_embeddings)
    )
    for method in methods:
      start = time.perf_counter()
      bag = bow.extract_bag(
        model,
        params,
        grads,
        method=method,
        noise_std=noise,
        config=bow.TiedBagConfig(norm_z=cfg.norm_z),
      )
      p, r = metrics.bag_precision_recall(bag.ids, truth)
      row = {
        'b': b,
        'batch': index,
        'defense': spec,
        'method': method,
        'bag_precision': p,
        'bag_recall': r,
        'bag_size': len(bag.ids),
        'true_bag_size': len(truth),
        'grad_seconds': grad_s,
        'bag_seconds': time.perf_counter() - start,
      }
      rows.append({**row, **span_fields(bag)})
    if kind == 'none' and tied:
      # The baseline at its best threshold (an oracle: it knows the truth).
      p, r = oracle_norm_threshold(np.asarray(rows_grad), truth)
      rows.append(
        {
          'b': b,
          'batch': index,
          'defense': spec,
          'method': 'norm_oracle',
          'bag_precision': p,
          'bag_recall': r,
          'true_bag_size': len(truth),
        }
      )
  return rows


def span_fields(bag) -> dict[str, Any]:
  """The span test's rank and validity for a results row (all the bag has
  to go on when the embeddings are frozen); none without evidence."""
  if bag.evidence is None:
    return {}
  return {
    'span_rank': int(bag.evidence.span_rank),
    'span_valid': bool(bag.evidence.span_valid),
  }


def oracle_norm_threshold(
  grad_rows: np.ndarray, truth: set[int]
) -> tuple[float, float]:
  """Precision/recall of the norm threshold with the best F1 (oracle)."""
  norms = np.linalg.norm(grad_rows.astype(np.float64), axis=1)
  labels = np.zeros(len(norms), bool)
  labels[list(truth)] = True
  cut = metrics.oracle_f1_cut(norms, labels, num_true=len(truth))
  return cut.precision, cut.recall


__all__ = ['bag_batch', 'oracle_norm_threshold', 'span_fields']
