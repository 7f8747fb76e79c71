"""Tests for leakjax.tokenization."""

import json

import numpy as np
import pytest

from leakjax import LeakjaxError, tokenization


@pytest.fixture(scope='module')
def gpt2():
  return tokenization.gpt2_tokenizer()


def test_gpt2_hello_world(gpt2):
  assert gpt2.encode('Hello world') == [15496, 995]
  assert gpt2.vocab_size == 50257
  assert gpt2.eos_id == 50256


def test_gpt2_roundtrip_unicode(gpt2):
  text = ' Caf\u00e9 na\u00efve \u2014 1234 emojis \U0001f600!'
  assert gpt2.decode(gpt2.encode(text)) == text


def test_gpt2_matches_transformers_vocab(gpt2):
  transformers = pytest.importorskip('transformers')
  from tokenizers import Tokenizer as HFTokenizer

  ref = transformers.PreTrainedTokenizerFast(
    tokenizer_object=HFTokenizer.from_str(gpt2.backend.to_str())
  )
  text = "The quick brown fox, 2 dogs & Enron's CEO."
  assert ref(text)['input_ids'] == gpt2.encode(text)


def test_encode_batch_pads_right(gpt2):
  ids, mask = gpt2.encode_batch(['Hello world', 'Hi'])
  assert ids.dtype == np.int32 and ids.shape == (2, 2)
  np.testing.assert_array_equal(mask, [[1, 1], [1, 0]])
  assert ids[1, 1] == gpt2.pad_id


def test_encode_batch_too_long(gpt2):
  with pytest.raises(LeakjaxError, match='max_length=2'):
    gpt2.encode_batch(['one two three four'], max_length=2)
  ids, mask = gpt2.encode_batch(
    ['one two three four'], max_length=2, truncate=True
  )
  assert ids.shape == (1, 2) and mask.sum() == 2


def test_empty_batch(gpt2):
  with pytest.raises(LeakjaxError, match='empty'):
    gpt2.encode_batch([])


def test_token_strings(gpt2):
  strings = gpt2.token_strings()
  assert strings[15496] == 'Hello' and strings[995] == ' world'


def test_tokenizer_from_file_roundtrip(gpt2, tmp_path):
  gpt2.backend.save(str(tmp_path / 'tokenizer.json'))
  (tmp_path / 'tokenizer_config.json').write_text(
    json.dumps({'eos_token': '<|endoftext|>'})
  )
  tok = tokenization.tokenizer_from_file(tmp_path / 'tokenizer.json')
  assert tok.encode('Hello world') == [15496, 995]
  assert tok.eos_id == 50256


def test_tokenizer_from_missing_file(tmp_path):
  with pytest.raises(LeakjaxError, match='does not exist'):
    tokenization.tokenizer_from_file(tmp_path / 'nope.json')


def test_check_vocab(gpt2):
  tokenization.check_vocab(gpt2, 50304)  # padded rows are fine
  with pytest.raises(LeakjaxError, match='50257 tokens'):
    tokenization.check_vocab(gpt2, 1000)


def test_word_tokenizer_build_and_encode(tmp_path):
  corpus = ['The cat sat on the mat.', 'the dog sat', 'A cat!']
  tok = tokenization.WordTokenizer.build(corpus, vocab_size=6)
  # <UNK>, <S>, then by frequency (ties alphabetical): the(3) cat(2) sat(2) a
  assert tok.words == ['<UNK>', '<S>', 'the', 'cat', 'sat', 'a']
  assert tok.encode('The cat ate', add_bos=True) == [1, 2, 3, 0]
  assert tok.decode([1, 2, 3]) == 'the cat'
  tok.save(tmp_path / 'words.json')
  again = tokenization.WordTokenizer.load(tmp_path / 'words.json')
  assert again.words == tok.words and again.encode('a dog') == [5, 0]


def test_word_tokenizer_options():
  cased = tokenization.WordTokenizer.build(
    ['Hi, Bob.'], 10, lowercase=False, punctuation=True
  )
  assert set(cased.words[2:]) == {'Hi', ',', 'Bob', '.'}
  assert tokenization.split_words(
    "Don't stop!", lowercase=True, punctuation=False
  ) == ["don't", 'stop']


def test_word_tokenizer_errors(tmp_path):
  with pytest.raises(LeakjaxError, match='no words'):
    tokenization.WordTokenizer.build(['', '  ...  '], 10)
  (tmp_path / 'bad.json').write_text('{"words": 3}')
  with pytest.raises(LeakjaxError, match='not a leakjax word vocabulary'):
    tokenization.WordTokenizer.load(tmp_path / 'bad.json')
  with pytest.raises(LeakjaxError, match='does not exist'):
    tokenization.WordTokenizer.load(tmp_path / 'missing.json')


def test_sentence_end_mask():
  class Tok:
    def token_strings(self):
      return ['a', '.', ' ?', '!.', ',', ' the', '...', '']

  assert tokenization.sentence_end_mask(Tok()).tolist() == [
    False,
    True,
    True,
    True,
    False,
    False,
    True,
    False,
  ]
  # A model with more rows than tokens: the extra ids end nothing.
  padded = tokenization.sentence_end_mask(Tok(), vocab_size=10)
  assert padded.shape == (10,) and not padded[8:].any()


def test_sentence_end_mask_of_gpt2_is_its_definition(gpt2):
  # Every GPT-2 token whose stripped text is made of '.', '!' and '?' only,
  # checked character by character.
  strings = gpt2.token_strings()
  want = [
    bool(s.strip()) and all(ch in '.!?' for ch in s.strip()) for s in strings
  ]
  got = tokenization.sentence_end_mask(gpt2)
  assert got.tolist() == want
  assert sum(want) == 46  # '!', '.', '?', '..', ' .', '...', '!!', ...
  assert got[gpt2.token_to_id('.')] and not got[gpt2.token_to_id(',')]
