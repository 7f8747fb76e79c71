"""The GBoard experiment's summary.json: means over the client datasets of
each setting, keyed `metric@B=..,E=..,n_k=..,noise=..,sigma=..[,scale=..]`,
and the lookups the report's tables and figures make in it.
"""

from __future__ import annotations

import math

import numpy as np

from leakjax import io
from leakjax.attacks.gboard import GboardConfig

_MEANS = (
  'f1',
  'f1_upper',
  'precision',
  'recall',
  'zero_f1',
  'universal_f1',
  'fdr_f1',
  'auto_f1',
  'oracle_f1',
  'stouffer_f1',
  'rescue_f1',
  'num_convex',
  'num_rescued',
  'drift_to_noise',
  'auto_num_recovered',
  'coverage',
  'levenshtein',
  'levenshtein_topn',
  'levenshtein_cover',
  'levenshtein_words',
  'levenshtein_gap',
  'levenshtein_recall',
  'recon_f1',
  'num_kept',
  'exact_fraction',
  'zero_num_recovered',
  'fdr_num_recovered',
)
_SUMMARY_NAMES = {'coverage': 'vocab_coverage'}


def group_key(r) -> tuple:
  return (r['B'], r['E'], r['n_k'], r['noise'], r['sigma'], r.get('scale', 0.0))


def summarize(results, pre_info, cfg: GboardConfig) -> dict[str, float]:
  """Means over datasets, keyed `metric@B=..,E=..,n_k=..,noise=..,sigma=..`.

  A full-batch run with n_k <= B is also reported under that B (it is the
  same training: Fig. 2b's n_k=16 with B=16).
  """
  groups: dict[tuple, list] = {}
  for r in results:
    if r.get('kind') != 'attack':
      continue
    groups.setdefault(group_key(r), []).append(r)
    if r['B'] == 'full':
      for b in cfg.batch_sizes:
        if b != 'full' and int(b) >= r['n_k']:
          groups.setdefault(group_key({**r, 'B': b}), []).append(r)
  summary: dict[str, float] = {
    'theta0_eval_perplexity': float(pre_info['eval_perplexity']),
    'theta0_sms_perplexity': float(pre_info['sms_eval_perplexity']),
  }
  for (b, e, n_k, noise, sigma, scale), rows in sorted(
    groups.items(), key=lambda kv: str(kv[0])
  ):
    params = dict(B=b, E=e, n_k=n_k, noise=noise, sigma=sigma)
    if scale:
      params['scale'] = scale
    for m in _MEANS:
      vals = [r[m] for r in rows if m in r and r[m] is not None]
      if vals and (
        not scale or m.startswith(('lev', 'recon', 'num_kept', 'exact'))
      ):  # noqa: E127
        summary[io.summary_key(_SUMMARY_NAMES.get(m, m), **params)] = float(
          np.mean(vals)
        )
  return summary


def is_alias(b: str, n_k: int) -> bool:
  """B >= n_k: the full-batch run, listed once in the tables."""
  return b != 'full' and int(b) >= n_k


def scaling_levenshtein(summary, cfg, n_k) -> list:
  """Noise-free FedSGD Levenshtein at n_k for each scale of Sec. 4.3.2."""
  return [
    get_metric(
      summary,
      'levenshtein',
      B='full',
      E=1,
      n_k=n_k,
      noise='none',
      sigma=0.0,
      **({'scale': s} if s else {}),
    )
    for s in cfg.scales
  ]


def get_metric(summary, metric, **params):
  """The summary's value of `metric` at `params`; NaN where the run has
  none."""
  return summary.get(io.summary_key(metric, **params), math.nan)
