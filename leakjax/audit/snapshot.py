"""Two snapshots of a model: what the differential rank search reads off
the model before and after fine-tuning on the user's sentences.

Zanella-Beguelin et al. (CCS 2020), Algorithm 1: a beam search over token
sequences for the highest differential score (the log-probability gain
from the first model to the second). Decision: the search extracts
`snapshot_length`-token sequences after BOS with a constant beam of
`snapshot_beams` (the paper's halving schedule starts at the whole
vocabulary, Sec. 3.2, too wide for a transformer's caches); the user's
sentences are the canaries, and an opening counts as recovered when its
first `snapshot_length` tokens are among the extracted sequences.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from leakjax._jit import jitted
from leakjax.attacks.differential import rank_search
from leakjax.audit import scoring


def openings(tokenizer, texts: Sequence[str], length: int) -> list[list[int]]:
  """The first `length` token ids of each text (after BOS; shorter texts
  whole)."""
  return [tokenizer.encode(t)[:length] for t in texts]


def attack(model, params, tuned, texts: Sequence[str], cfg) -> dict[str, Any]:
  """One `snapshot` row: the search between `params` (before) and `tuned`
  (after fine-tuning on `texts`), scored on the texts' openings."""
  start = time.perf_counter()
  tok = model.tokenizer
  bos = tok.bos_id if tok.bos_id is not None else 0
  length = cfg.snapshot_length
  search = jitted(
    rank_search.rank_beam_search,
    static_argnames=('model', 'model_prime', 'widths', 'length'),
  )
  result = search(
    model,
    model,
    params,
    tuned,
    jnp.asarray([bos], jnp.int32),
    widths=(cfg.snapshot_beams,) * length,
    length=length,
  )
  found = np.asarray(result.sequences[0])  # [W, n], best first
  extracted = {tuple(row) for row in found.tolist()}
  targets = openings(tok, texts, length)
  originals = [tok.decode(t) for t in targets]
  recovered = [tok.decode(row) for row in found[: len(texts)].tolist()]
  each = [tuple(t) in extracted for t in targets]
  scores = scoring.describe(
    originals, recovered, scoring.entities_of(originals)
  )
  from leakjax import metrics  # pylint: disable=g-import-not-at-top

  rouge = metrics.rouge_matrix(originals, recovered, stemmer=True)
  return {
    'attack': 'differential',
    'exact': float(np.mean(each)),
    'rouge1': float(np.asarray(rouge['rouge1']).max(1).mean()),
    'rougeL': float(np.asarray(rouge['rougeL']).max(1).mean()),
    'originals': originals,
    'recovered': recovered,
    **scores,
    'exact_each': each,
    'note': f'openings of {length} tokens',
    'seconds': time.perf_counter() - start,
  }


__all__ = ['attack', 'openings']
