"""Scores and result rows of the inversion experiment.

:func:`score_texts` gives every metric of Wan et al. Sec. 5.1.3 per text;
a :class:`Recorder` turns scores into one `results.jsonl` row per cell
(means over the texts) and the summary keys
`metric@key=value,...`, and reads a cell back instead when the run
resumes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from leakjax import io, metrics
from leakjax.attacks.inversion import bei_hei
from leakjax.attacks.inversion.texts import Split
from leakjax.errors import LeakjaxError

if TYPE_CHECKING:
  from leakjax.attacks.inversion.runner import InversionConfig

METRICS = ('f1', 'rouge1', 'rougeL', 'sbert')
# Table 5 / Table 8 token-length buckets, [lo, hi).
BUCKETS = ((1, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 256))


def score_texts(
  predictions: Sequence[str],
  references: Sequence[str],
  embedder: metrics.SentenceEmbedder | None = None,
) -> dict[str, np.ndarray]:
  """Every metric of Sec. 5.1.3 per pair: `{'f1', 'rouge1', 'rougeL'[, 'sbert']}`.

  The SQuAD token F1, ROUGE-1 and ROUGE-L F-measures (rouge-score's
  default tokenizer, no stemming) and the Sentence-BERT cosine.

  Args:
    predictions: reconstructed texts.
    references: the original texts, same length.
    embedder: a :class:`leakjax.metrics.SentenceEmbedder`; None skips the
      'sbert' entry.

  Returns:
    A dict of float64 arrays `[len(predictions)]`.
  """
  if len(predictions) != len(references):
    raise LeakjaxError(
      f'{len(predictions)} predictions but {len(references)} references'
    )
  pairs = list(zip(predictions, references))
  rouge = [
    metrics.rouge_scores(p, r, stemmer=False, types=('rouge1', 'rougeL'))
    for p, r in pairs
  ]
  out = {
    'f1': np.array([metrics.token_f1(p, r) for p, r in pairs]),
    'rouge1': np.array([s['rouge1'] for s in rouge]),
    'rougeL': np.array([s['rougeL'] for s in rouge]),
  }
  if embedder is not None:
    out['sbert'] = embedder.similarity(predictions, references).astype(
      np.float64
    )
  return out


class Scorer:
  """Per-text metrics, with Sentence-BERT on the first `sbert_limit` texts."""

  def __init__(self, cfg: InversionConfig):
    self.embedder = metrics.SentenceEmbedder() if cfg.sbert else None
    self.limit = cfg.sbert_limit

  def __call__(
    self, preds: Sequence[str], refs: Sequence[str]
  ) -> dict[str, np.ndarray]:
    scores = score_texts(preds, refs)
    sb = np.full(len(preds), np.nan)
    if self.embedder is not None:
      k = min(self.limit, len(preds))
      sb[:k] = self.embedder.similarity(list(preds[:k]), list(refs[:k]))
    scores['sbert'] = sb
    return scores


def _mean(x: np.ndarray) -> float:
  x = x[~np.isnan(x)]
  return float(x.mean()) if len(x) else float('nan')


def row_summary(scores: dict[str, np.ndarray]) -> dict[str, float]:
  """The mean of every metric over the texts (NaN entries left out)."""
  return {m: _mean(scores[m]) for m in METRICS}


def bucket_name(lo: int, hi: int) -> str:
  """The `bucket` value of token lengths [lo, hi)."""
  return f'{lo}-{hi}'


class Recorder:
  """Writes one results row per cell and fills the summary from it.

  A cell already in the writer's rows (a resumed run) is read back, not
  scored again; every recorded cell's metrics go to :attr:`summary` as
  `metric@key=value,...`.
  """

  def __init__(self, writer: io.ExperimentWriter, scorer: Scorer, tokenizer):
    self.writer = writer
    self.scorer = scorer
    self.tokenizer = tokenizer
    self.summary: dict[str, float] = {}

  def record(
    self, kind: str, scores: dict[str, np.ndarray], **params
  ) -> dict[str, Any]:
    """The row of cell `(kind, **params)`: the stored one, or a new row
    of the means of `scores`."""
    writer = self.writer
    row = writer.done(kind=kind, **params)
    if row is None:
      writer.add_result(
        {
          'kind': kind,
          **params,
          **row_summary(scores),
          'n': int(len(scores['f1'])),
        }
      )
      row = writer.results[-1]  # as stored: NaN (no SBERT) became None
    for m in METRICS:
      if row.get(m) is not None:
        self.summary[io.summary_key(m, **params)] = float(row[m])
    return row

  def all_done(self, rows: Sequence[dict[str, Any]]) -> bool:
    """True (and summary filled) if every row in `rows` was recorded."""
    if any(self.writer.done(**r) is None for r in rows):
      return False
    for r in rows:
      self.record(r['kind'], {}, **{k: v for k, v in r.items() if k != 'kind'})
    return True

  def score_ids(self, pred_ids, split: Split, kind: str, **params):
    """Records the cell of predicted ids `pred_ids` of `split`.

    Returns:
      `(row, fresh)`: `fresh` is `(predictions, scores)`, or None when the
      cell was recorded already.
    """
    if self.writer.done(kind=kind, **params) is not None:
      return self.record(kind, {}, **params), None
    preds = bei_hei.decode_ids(self.tokenizer, pred_ids, split.score_mask)
    scores = self.scorer(preds, split.references)
    return self.record(kind, scores, **params), (preds, scores)
