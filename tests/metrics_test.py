"""Tests of leakjax.attacks.film.metrics (FILM Sec. 6.1-6.3 metrics)."""

import math

import numpy as np
import pytest

from leakjax.attacks.film import metrics
from leakjax.errors import LeakjaxError


def test_rouge_uses_stemming_and_f_measure():
  s = metrics.rouge('the cats sat', 'the cat sat')
  assert s['rouge1'] == pytest.approx(1.0)  # cats -> cat
  assert s['rouge2'] == pytest.approx(1.0)
  s = metrics.rouge('the cat', 'the cat sat on the mat')
  # P = 2/2, R = 2/6 -> F = 0.5
  assert s['rouge1'] == pytest.approx(0.5)
  assert s['rougeL'] == pytest.approx(0.5)
  assert s['rouge2'] == pytest.approx(2 * 1 * 0.2 / 1.2)


def test_rouge_matrix_matches_pairs():
  refs = ['a b c d', 'e f g']
  preds = ['a b', 'e f g', 'x']
  m = metrics.rouge_matrix(refs, preds)
  assert m['rougeL'].shape == (2, 3)
  for i, r in enumerate(refs):
    for j, p in enumerate(preds):
      assert m['rouge1'][i, j] == pytest.approx(metrics.rouge(p, r)['rouge1'])
  assert m['rouge1'][1, 1] == 1.0 and m['rouge1'][0, 2] == 0.0


def test_nerr_counts_verbatim_entities_on_word_boundaries():
  ents = {'Anna Berg', 'Oslo'}
  assert metrics.nerr(ents, 'Anna Berg flew to Oslo.') == 1.0
  assert metrics.nerr(ents, 'Annas Berg flew to Oslos.') == 0.0
  assert metrics.nerr(ents, 'Berg went to Oslo') == 0.5
  assert math.isnan(metrics.nerr(set(), 'anything'))


def test_named_entities_keeps_appendix_b1_types():
  ents = metrics.named_entities(
    ['Victor Lang flew to Houston for Enron on Monday.']
  )
  assert 'Victor Lang' in ents[0]
  assert 'Houston' in ents[0]
  assert not any('Monday' in e for e in ents[0])  # DATE is not a B.1 type


def test_best_of_batch_takes_the_best_original_per_metric():
  originals = [
    'Greg Hall sent the report to Boston.',
    'The weather was cold all week.',
  ]
  pred = 'The weather was cold all week in Boston.'
  out = metrics.best_of_batch(originals, pred)
  direct = [metrics.rouge(pred, o) for o in originals]
  for name in metrics.ROUGE_TYPES:
    assert out[name] == pytest.approx(max(d[name] for d in direct))
  assert out['match'] == 1
  # NERR: only the first original has entities; Boston is recovered.
  ents = metrics.named_entities(originals)
  expected = metrics.nerr(ents[0], pred)
  assert out['nerr'] == pytest.approx(expected)
  assert 0 < out['nerr'] < 1


def test_best_of_batch_nerr_is_nan_without_entities():
  out = metrics.best_of_batch(
    ['it was cold.'], 'it was cold.', entities=[set()]
  )
  assert math.isnan(out['nerr'])
  assert out['rougeL'] == 1.0
  with pytest.raises(LeakjaxError):
    metrics.best_of_batch([], 'x')


def test_sentence_matching_table3_definitions():
  originals = [
    'alpha beta gamma delta',
    'one two three four',
    'red green blue yellow',
  ]
  preds = ['alpha beta gamma delta', 'zzz yyy', 'one two three four']
  out = metrics.sentence_matching(originals, preds)
  assert out['recall'] == pytest.approx(2 / 3)
  assert out['precision'] == pytest.approx(2 / 3)
  assert metrics.sentence_matching(originals, []) == {
    'recall': 0.0,
    'precision': 0.0,
  }


def test_sentence_matching_by_count_is_matching_of_each_prefix():
  originals = [
    'alpha beta gamma delta',
    'one two three four',
    'red green blue yellow',
  ]
  preds = ['alpha beta gamma delta', 'zzz yyy', 'one two three four']
  out = metrics.sentence_matching_by_count(originals, preds, [1, 2, 3])
  assert out[1] == {'recall': pytest.approx(1 / 3), 'precision': 1.0}
  assert out[2] == {'recall': pytest.approx(1 / 3), 'precision': 0.5}
  for k in (1, 2, 3):
    assert out[k] == metrics.sentence_matching(originals, preds[:k])
  with pytest.raises(LeakjaxError, match='count 4'):
    metrics.sentence_matching_by_count(originals, preds, [4])


def test_bag_precision_recall():
  assert metrics.bag_precision_recall([1, 2, 3, 4], [3, 4, 5]) == (0.5, 2 / 3)
  assert metrics.bag_precision_recall([], [1]) == (1.0, 0.0)
  assert metrics.bag_precision_recall(np.array([7]), {7}) == (1.0, 1.0)


def test_missing_spacy_model_is_a_clear_error(monkeypatch):
  import spacy  # pylint: disable=g-import-not-at-top

  def fail(*args, **kwargs):
    raise OSError('not found')

  monkeypatch.setattr(spacy, 'load', fail)
  metrics.load_spacy.cache_clear()
  try:
    with pytest.raises(LeakjaxError, match='pip install'):
      metrics.load_spacy('no_such_model')
  finally:
    metrics.load_spacy.cache_clear()
