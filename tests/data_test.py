"""Tests for leakjax.data: corpus loading, sentences, splits, batches."""

import json

import numpy as np
import pytest

from leakjax import data, datasets
from leakjax.errors import LeakjaxError
from leakjax.tokenization import WordTokenizer


def _cached(*names):
  """Whether the named data sets are in the local cache (no download)."""
  try:
    for name in names:
      datasets.path(name, download=False)
  except LeakjaxError:
    return False
  return True


def write(tmp_path, name, content, mode='w'):
  path = tmp_path / name
  if mode == 'wb':
    path.write_bytes(content)
  else:
    path.write_text(content, encoding='utf-8')
  return path


# ------------------------------------------------------------------ loading
def test_txt_skips_blank_lines_and_strips(tmp_path):
  path = write(tmp_path, 'c.txt', ' first line \n\n   \nsecond\r\nthird\n')
  assert data.load_corpus(path) == ['first line', 'second', 'third']
  assert data.load_corpus(str(path), limit=2) == ['first line', 'second']


def test_txt_rejects_column(tmp_path):
  path = write(tmp_path, 'c.txt', 'a\n')
  with pytest.raises(LeakjaxError, match='no columns'):
    data.load_corpus(path, column='text')


def test_json_list_of_strings(tmp_path):
  path = write(tmp_path, 'c.json', json.dumps(['One.', '', 'Two. Three.']))
  assert data.load_corpus(path) == ['One.', 'Two. Three.']


def test_json_objects_default_and_named_column(tmp_path):
  items = [
    {'text': 'hi there', 'who': 'a', 'n': 1},
    {'text': 'bye', 'who': 'b', 'n': 2},
    {'text': 'again', 'who': 'a', 'n': 3},
  ]
  path = write(tmp_path, 'c.json', json.dumps(items))
  assert data.load_corpus(path) == ['hi there', 'bye', 'again']
  assert data.load_corpus(path, label=('who', 'a')) == ['hi there', 'again']
  assert data.load_corpus(path, column='who') == ['a', 'b', 'a']
  assert data.load_corpus(path, label=('n', ['1', '2'])) == ['hi there', 'bye']
  with pytest.raises(LeakjaxError, match="no field 'body'"):
    data.load_corpus(path, column='body')
  with pytest.raises(LeakjaxError, match='not text'):
    data.load_corpus(path, column='n')


def test_jsonl(tmp_path):
  path = write(
    tmp_path, 'c.jsonl', '{"sentence": "x y"}\n\n{"sentence": "z"}\n'
  )
  assert data.load_corpus(path) == ['x y', 'z']
  bad = write(tmp_path, 'bad.jsonl', '{"sentence": "x"}\n{oops\n')
  with pytest.raises(LeakjaxError, match='line 2'):
    data.load_corpus(bad)


@pytest.mark.parametrize(
  'content, match',
  [
    ('[1, 2', 'not valid JSON'),
    ('{"text": "a"}', 'not a list'),
    ('[{"a": 1}, "b"]', 'mixes JSON types'),
    ('[{"body": "a"}]', 'no text field'),
    ('[]', 'no non-empty example'),
    ('["", "  "]', 'no non-empty example'),
  ],
)
def test_json_errors(tmp_path, content, match):
  path = write(tmp_path, 'c.json', content)
  with pytest.raises(LeakjaxError, match=match):
    data.load_corpus(path)


SMS = (
  'Label\tSMS\n'
  'ham\tGo until jurong point, "crazy".. Available\n'
  'spam\tFree entry in 2 a wkly comp\n'
  'ham\tOk lar... Joking wif u oni...\n'
)


def test_tsv_label_filter_and_literal_quotes(tmp_path):
  path = write(tmp_path, 'sms.tsv', SMS)
  assert data.load_corpus(path) == [
    'Go until jurong point, "crazy".. Available',
    'Free entry in 2 a wkly comp',
    'Ok lar... Joking wif u oni...',
  ]
  ham = data.load_corpus(path, label=('Label', 'ham'))
  assert ham == [
    'Go until jurong point, "crazy".. Available',
    'Ok lar... Joking wif u oni...',
  ]
  assert data.load_corpus(path, column='Label', limit=2) == ['ham', 'spam']


def test_tsv_errors(tmp_path):
  path = write(tmp_path, 'sms.tsv', SMS)
  with pytest.raises(LeakjaxError, match="no column 'Text'.*Label, SMS"):
    data.load_corpus(path, column='Text')
  with pytest.raises(LeakjaxError, match="no label column 'Kind'"):
    data.load_corpus(path, label=('Kind', 'ham'))
  with pytest.raises(LeakjaxError, match='values: ham, spam'):
    data.load_corpus(path, label=('Label', 'hm'))
  ragged = write(tmp_path, 'r.tsv', 'a\tb\nx\ty\tz\n')
  with pytest.raises(LeakjaxError, match='line 2 has 3'):
    data.load_corpus(ragged)
  with pytest.raises(LeakjaxError, match='empty'):
    data.load_corpus(write(tmp_path, 'e.tsv', '\n'))
  with pytest.raises(LeakjaxError, match='no non-empty example'):
    data.load_corpus(write(tmp_path, 'h.tsv', 'Label\tSMS\n'))


def test_path_errors(tmp_path):
  with pytest.raises(LeakjaxError, match='does not exist'):
    data.load_corpus(tmp_path / 'missing.txt')
  with pytest.raises(LeakjaxError, match='does not exist'):
    data.load_corpus('./nope')
  with pytest.raises(LeakjaxError, match="unsupported extension '.csv'"):
    data.load_corpus(write(tmp_path, 'c.csv', 'a,b\n'))
  with pytest.raises(LeakjaxError, match='is a directory'):
    data.load_corpus(tmp_path)
  with pytest.raises(LeakjaxError, match='not UTF-8'):
    data.load_corpus(write(tmp_path, 'b.txt', b'ok\n\xff\xfe bad\n', 'wb'))
  with pytest.raises(LeakjaxError, match='limit must be positive'):
    data.load_corpus(write(tmp_path, 'a.txt', 'a\n'), limit=0)


def test_hub_name_offline_is_one_line_error(monkeypatch):
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  with pytest.raises(LeakjaxError, match='could not be loaded') as e:
    data.load_corpus('hub:leakjax-test/surely-not-a-dataset')
  assert '\n' not in str(e.value)


def test_a_bare_unknown_name_is_neither_file_nor_data_set():
  with pytest.raises(LeakjaxError, match='hub:NAME') as e:
    data.load_corpus('leakjax-test/surely-not-a-dataset')
  assert 'film-enron' in str(e.value)


def test_hub_spec_config_split_column_label(tmp_path, monkeypatch):
  pytest.importorskip('datasets')
  monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
  monkeypatch.setenv('HF_DATASETS_CACHE', str(tmp_path / 'hf'))
  folder = tmp_path / 'corpus'  # load_dataset reads a local folder too
  folder.mkdir()
  (folder / 'train.csv').write_text('body,kind\nfirst row,a\nsecond,b\n')
  (folder / 'test.csv').write_text('body,kind\nheld out,a\n')
  hub = f'hub:{folder}'
  assert data.load_corpus(hub, column='body') == ['first row', 'second']
  assert data.load_corpus(f'{hub}::test', column='body') == ['held out']
  assert data.load_corpus(hub, split='test', column='body') == ['held out']
  assert data.load_corpus(hub, column='body', label='kind=b') == ['second']
  with pytest.raises(LeakjaxError, match='no column'):
    data.load_corpus(hub, column='text')
  with pytest.raises(LeakjaxError, match='split validation'):
    data.load_corpus(f'{hub}::validation', column='body')
  with pytest.raises(LeakjaxError, match='is not hub:NAME'):
    data.load_corpus('hub:a:b:c:d')


def test_hub_revision_is_parsed_and_passed_to_load_dataset(
  tmp_path, monkeypatch
):
  datasets = pytest.importorskip('datasets')
  assert data._parse_hub('hub:org/name@abc123:cfg:test') == (
    'org/name',
    'abc123',
    'cfg',
    'test',
  )
  assert data._parse_hub('hub:org/name') == ('org/name', None, None, None)
  for bad in ('hub:org/name@', 'hub:@abc', 'hub:a@b:c:d:e'):
    with pytest.raises(LeakjaxError, match='is not hub:NAME'):
      data.load_corpus(bad)
  calls = []

  def fake_load(name, config=None, *, split=None, revision=None):
    calls.append((name, config, split, revision))
    return datasets.Dataset.from_dict({'text': [f'row of {revision}']})

  monkeypatch.setattr(datasets, 'load_dataset', fake_load)
  monkeypatch.setattr(data, '_hub_unreachable', lambda: False)
  got = data.load_corpus('hub:org/name@abc123:cfg', split='test')
  assert got == ['row of abc123']
  assert calls == [('org/name', 'cfg', 'test', 'abc123')]
  # A local folder has no revisions: refused before load_dataset runs.
  with pytest.raises(LeakjaxError, match='local folder'):
    data.load_corpus(f'hub:{tmp_path}@abc123')
  assert len(calls) == 1


def test_label_string_form(tmp_path):
  path = write(tmp_path, 's.tsv', 'Label\tSMS\nham\thi\nspam\twin\nx\tyo\n')
  assert data.parse_label('Label=ham, x') == ('Label', ('ham', 'x'))
  assert data.load_corpus(path, label='Label=ham,x') == ['hi', 'yo']
  for bad in ('Label', '=ham', 'Label='):
    with pytest.raises(LeakjaxError, match='FIELD=VALUE'):
      data.parse_label(bad)


# -------------------------------------------------------------- sentences
@pytest.mark.parametrize(
  'text, expected',
  [
    (
      'Mr. Smith went home. He slept! Did he? Yes.',
      ['Mr. Smith went home.', 'He slept!', 'Did he?', 'Yes.'],
    ),
    (
      'J. R. R. Tolkien wrote it in 1937. "Really?" she asked. (It was.) Ok.',
      [
        'J. R. R. Tolkien wrote it in 1937.',
        '"Really?" she asked.',
        '(It was.)',
        'Ok.',
      ],
    ),
    (
      'We met at 5 p.m. Monday, e.g. at home. Then 3.5 km later we left',
      ['We met at 5 p.m. Monday, e.g. at home.', 'Then 3.5 km later we left'],
    ),
    (
      'It is a species of lobster . It may grow to 60 cm .',  # WikiText style
      ['It is a species of lobster .', 'It may grow to 60 cm .'],
    ),
    ('no capital after. so one', ['no capital after. so one']),
    ('Wait... What?!  Done', ['Wait...', 'What?!', 'Done']),
    ('', []),
    ('   ', []),
  ],
)
def test_split_sentences(text, expected):
  assert data.split_sentences(text) == expected


def test_preprocess_sentences_keeps_short_distinct_sentences():
  tok = WordTokenizer.build(['a'], 10)  # every word counts as one token
  texts = [
    'One two three. One two three. A much longer sentence than four words.',
    'Four five six. Seven eight.',
  ]
  kept = data.preprocess_sentences(texts, tok, max_tokens=4)
  assert kept == ['One two three.', 'Four five six.', 'Seven eight.']
  assert (
    data.preprocess_sentences(texts, tok, max_tokens=4, max_sentences=2)
    == kept[:2]
  )
  # The perplexity filter needs both the bound and the function.
  ppl = lambda ts: [1.0 if t.startswith('Seven') else 9.0 for t in ts]
  assert data.preprocess_sentences(
    texts, tok, max_tokens=4, max_perplexity=5.0, perplexity_fn=ppl
  ) == ['Seven eight.']
  assert (
    data.preprocess_sentences(texts, tok, max_tokens=4, perplexity_fn=ppl)
    == kept
  )
  with pytest.raises(LeakjaxError, match='largest batch size 4'):
    data.preprocess_sentences(texts, tok, max_tokens=4, min_sentences=4)


# ---------------------------------------------------------------- splitting
def test_train_eval_split_is_deterministic_partition():
  items = [f'item {i}' for i in range(50)]
  train, held = data.train_eval_split(items, 0.2, seed=3)
  assert len(held) == 10 and len(train) == 40
  assert sorted(train + held) == sorted(items)
  # Both parts keep the original order.
  assert train == [x for x in items if x in set(train)]
  assert held == [x for x in items if x in set(held)]
  assert data.train_eval_split(items, 0.2, seed=3) == (train, held)
  assert data.train_eval_split(items, 0.2, seed=4)[1] != held


def test_train_eval_split_edges():
  assert data.train_eval_split(['a', 'b'], 0.01, seed=0)[1] != []  # >= 1
  assert data.train_eval_split(['a', 'b'], 0.0, seed=0) == (['a', 'b'], [])
  with pytest.raises(LeakjaxError, match='cannot split 1'):
    data.train_eval_split(['a'], 0.5, seed=0)
  with pytest.raises(LeakjaxError, match=r'\[0, 1\)'):
    data.train_eval_split(['a', 'b'], 1.0, seed=0)


# ----------------------------------------------------------------- batching
@pytest.fixture(name='tokenizer')
def fixture_tokenizer():
  return WordTokenizer.build(['the cat sat on the mat', 'a dog ran'], 20)


def test_encode_corpus_bos_width_and_truncation(tokenizer):
  texts = ['the cat sat on the mat', 'a dog', 'cat']
  ids, mask, cut = data.encode_corpus(tokenizer, texts, 16)
  assert ids.shape == mask.shape == (3, 7) and ids.dtype == np.int32
  np.testing.assert_array_equal(mask.sum(1), [7, 3, 2])
  assert (ids[:, 0] == tokenizer.bos_id).all() and cut == 0
  assert ids[1, :3].tolist() == [1] + tokenizer.encode('a dog')
  assert (ids[mask == 0] == tokenizer.pad_id).all()
  ids, mask, cut = data.encode_corpus(tokenizer, texts, 3, add_bos=False)
  assert ids.shape == (3, 3) and cut == 1
  assert ids[0].tolist() == tokenizer.encode('the cat sat')
  with pytest.raises(LeakjaxError, match='1 of 3 examples are longer'):
    data.encode_corpus(tokenizer, texts, 3, truncate=False)
  with pytest.raises(LeakjaxError, match='empty'):
    data.encode_corpus(tokenizer, [], 3)


@pytest.mark.parametrize('drop_remainder', [False, True])
def test_batch_indices_cover_each_example_once(drop_remainder):
  epochs = [
    data.batch_indices(10, 4, seed=1, epoch=e, drop_remainder=drop_remainder)
    for e in (0, 1)
  ]
  for rows in epochs:
    assert len(rows) == (2 if drop_remainder else 3)
    assert all(r.shape == (4,) for r in rows)
    flat = np.concatenate(rows)
    real = flat[flat >= 0]
    assert len(set(real.tolist())) == len(real)
    assert len(real) == (8 if drop_remainder else 10)
  assert not np.array_equal(
    np.concatenate(epochs[0]), np.concatenate(epochs[1])
  )
  again = data.batch_indices(
    10, 4, seed=1, epoch=0, drop_remainder=drop_remainder
  )
  np.testing.assert_array_equal(
    np.concatenate(again), np.concatenate(epochs[0])
  )
  ordered = data.batch_indices(10, 4, seed=1, shuffle=False)
  assert np.concatenate(ordered).tolist() == list(range(10)) + [-1, -1]


def test_take_batch_masks_filler_rows():
  ids = np.arange(12, dtype=np.int32).reshape(3, 4) + 1
  mask = np.ones_like(ids)
  got_ids, got_mask = data.take_batch(ids, mask, np.array([2, -1, 0]))
  assert got_ids.tolist() == [[9, 10, 11, 12], [0, 0, 0, 0], [1, 2, 3, 4]]
  assert got_mask.tolist() == [[1] * 4, [0] * 4, [1] * 4]


def test_batches_have_one_shape(tokenizer):
  texts = ['the cat sat', 'a dog ran on the mat', 'the mat', 'cat', 'dog a']
  got = list(data.batches(tokenizer, texts, 2, 32, seed=0))
  assert len(got) == 3
  assert {(i.shape, m.shape) for i, m in got} == {((2, 7), (2, 7))}
  assert sum(int(m[:, 0].sum()) for _, m in got) == 5  # one filler row
  got = list(
    data.batches(
      tokenizer, texts, 2, 4, drop_remainder=True, shuffle=False, seed=0
    )
  )
  assert len(got) == 2 and got[0][0].shape == (2, 4)


# --------------------------------------------------------------- real files
@pytest.mark.skipif(
  not _cached('sms-spam', 'film-enron', 'wikitext-2-valid'),
  reason='real corpora not fetched (python -m leakjax.data fetch)',
)
def test_real_corpora_load_by_name():
  ham = data.load_corpus('sms-spam', label=('Label', 'ham'))
  assert len(ham) == 4827
  spam = data.load_corpus('sms-spam', label=('Label', 'spam'))
  assert len(spam) == 747
  enron = data.load_corpus('film-enron')
  assert len(enron) == 31797
  assert enron[0].startswith('Don and rogers have decided')
  wiki = data.load_corpus('wikitext-2-valid')
  sentences = [s for p in wiki for s in data.split_sentences(p)]
  assert len(sentences) > 3 * len(wiki) > 3000
