"""How much private text an attack recovered: one implementation of each metric.

* :mod:`.rouge` -- :func:`rouge_scores` / :func:`rouge_matrix`, ROUGE F-measures;
  the types and Porter stemming are arguments (FILM and DAGER: ROUGE-1/2/L,
  stemmed; Embed Parrot: ROUGE-1/L, not stemmed);
* :mod:`.entities` -- :func:`named_entities` and :func:`nerr`, the
  named-entity recovery ratio (FILM Sec. 6.1);
* :mod:`.matching` -- :func:`best_of_batch` and :func:`sentence_matching`,
  FILM's single- and multi-sentence scores of a batch (Sec. 6.2);
* :mod:`.overlap` -- :func:`f1_score`, set and bag precision/recall
  (:func:`bag_precision_recall`, FILM Sec. 6.3; :func:`word_metrics`,
  GBoard Sec. 4.2), the SQuAD :func:`token_f1` and the best-F1 oracle
  threshold :func:`oracle_f1_cut`;
* :mod:`.edit` -- word-level :func:`levenshtein_distance`,
  :func:`levenshtein_ratio` and :func:`best_match_ratios` (GBoard Sec. 4.2);
* :mod:`.sbert` -- :class:`SentenceEmbedder` / :func:`sbert_similarity`,
  the Sentence-BERT cosine (Wan et al. 2024, Sec. 5.1.3).

All of them run on the host (strings, sets, NumPy).

>>> from leakjax import metrics
>>> metrics.rouge_scores('the cat sat', 'the cat sat down', stemmer=False)['rougeL']
0.8571428571428571
>>> metrics.token_f1('The cat sat.', 'a cat sat down')
0.8
>>> metrics.levenshtein_ratio(['a', 'b', 'c', 'd'], ['a', 'x', 'c', 'd'])
75.0
"""

from leakjax.metrics import edit, entities, matching, overlap, rouge, sbert
from leakjax.metrics.edit import (
  best_match_ratios,
  levenshtein_distance,
  levenshtein_ratio,
)
from leakjax.metrics.entities import ENTITY_TYPES, named_entities, nerr
from leakjax.metrics.matching import (
  LEAK_THRESHOLD,
  best_of_batch,
  sentence_matching,
  sentence_matching_by_count,
)
from leakjax.metrics.overlap import (
  F1Cut,
  WordMetrics,
  bag_precision_recall,
  f1_score,
  oracle_f1_cut,
  set_precision_recall,
  token_f1,
  word_metrics,
)
from leakjax.metrics.rouge import ROUGE_TYPES, rouge_matrix, rouge_scores
from leakjax.metrics.sbert import SentenceEmbedder, sbert_similarity

__all__ = [
  'ENTITY_TYPES',
  'F1Cut',
  'LEAK_THRESHOLD',
  'ROUGE_TYPES',
  'SentenceEmbedder',
  'WordMetrics',
  'bag_precision_recall',
  'best_match_ratios',
  'best_of_batch',
  'edit',
  'entities',
  'f1_score',
  'levenshtein_distance',
  'levenshtein_ratio',
  'matching',
  'named_entities',
  'nerr',
  'oracle_f1_cut',
  'overlap',
  'rouge',
  'rouge_matrix',
  'rouge_scores',
  'sbert',
  'sbert_similarity',
  'sentence_matching',
  'sentence_matching_by_count',
  'set_precision_recall',
  'token_f1',
  'word_metrics',
]
