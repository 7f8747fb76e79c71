"""Tokenizers: GPT-2 byte-level BPE (offline), HF tokenizer.json, GGUF, words.

Every tokenizer in leakjax is a :class:`Tokenizer`: `encode`/`decode`, batch
encoding to right-padded int32 arrays with a mask, and the id <-> token maps
that attacks need (e.g. FILM's capital-letter start tokens). Subword
tokenizers wrap a Hugging Face `tokenizers.Tokenizer`; the word-level
tokenizer of the LSTM models is :class:`WordTokenizer`.
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from leakjax.errors import LeakjaxError

_GPT2_FILES = ('vocab.json', 'merges.txt')


def _gpt2_vocab_dir() -> Path:
  """Finds the vendored GPT-2 vocabulary (third_party/gpt2)."""
  candidates = []
  if os.environ.get('LEAKJAX_GPT2_VOCAB_DIR'):
    candidates.append(Path(os.environ['LEAKJAX_GPT2_VOCAB_DIR']))
  candidates.append(
    Path(__file__).resolve().parents[1] / 'third_party' / 'gpt2'
  )
  candidates.append(Path(sys.prefix) / 'share' / 'leakjax' / 'gpt2')
  for c in candidates:
    if all((c / f).is_file() for f in _GPT2_FILES):
      return c
  raise LeakjaxError(
    'GPT-2 vocabulary not found in ' + ', '.join(map(str, candidates)),
    'reinstall leakjax or set LEAKJAX_GPT2_VOCAB_DIR to a folder with'
    ' vocab.json and merges.txt',
  )


class Tokenizer:
  """A subword tokenizer (wraps `tokenizers.Tokenizer`).

  Attributes:
    vocab_size: number of ids (including special tokens).
    bos_id / eos_id / pad_id / unk_id: special ids or None.
  """

  def __init__(
    self,
    backend,
    *,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
    unk_id: int | None = None,
    name: str = 'bpe',
  ):
    self._tok = backend
    self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
    self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
    # Padding positions are masked out everywhere, so any id works; default to
    # eos (GPT-2 convention) or 0.
    self.pad_id = pad_id if pad_id is not None else (eos_id or 0)
    self.name = name
    self._vocab = None

  @property
  def backend(self):
    """The wrapped `tokenizers.Tokenizer`."""
    return self._tok

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    if add_bos:
      if self.bos_id is None:
        raise LeakjaxError(f'tokenizer {self.name} has no BOS token')
      ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    return self._tok.decode(
      [int(i) for i in ids], skip_special_tokens=skip_special
    )

  def id_to_token(self, i: int) -> str:
    return self._tok.id_to_token(int(i))

  def token_to_id(self, token: str) -> int | None:
    return self._tok.token_to_id(token)

  def token_strings(self) -> list[str]:
    """The decoded text of every id (e.g. 'ĠHello' -> ' Hello'), cached."""
    if self._vocab is None:
      self._vocab = [self._tok.decode([i]) for i in range(self.vocab_size)]
    return self._vocab

  def encode_batch(
    self,
    texts: Sequence[str],
    *,
    max_length: int | None = None,
    add_bos: bool = False,
    truncate: bool = False,
  ) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded `(ids, mask)`, both int32 `[len(texts), T]`."""
    if add_bos and self.bos_id is None:
      raise LeakjaxError(f'tokenizer {self.name} has no BOS token')
    encoded = self._tok.encode_batch(list(texts), add_special_tokens=False)
    bos = [self.bos_id] if add_bos else []
    return pad_batch(
      [bos + e.ids for e in encoded],
      pad_id=self.pad_id,
      max_length=max_length,
      truncate=truncate,
    )

  def __repr__(self):
    return f'Tokenizer({self.name}, vocab_size={self.vocab_size})'


def pad_batch(
  seqs: Sequence[Sequence[int]],
  *,
  pad_id: int = 0,
  max_length: int | None = None,
  truncate: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads id lists into `(ids, mask)` int32 arrays `[batch, T]`.

  T is `max_length` if given, else the longest sequence. A sequence longer
  than `max_length` raises LeakjaxError unless `truncate`.
  """
  if not seqs:
    raise LeakjaxError('nothing to encode: the batch is empty')
  longest = max(len(s) for s in seqs)
  width = max_length if max_length is not None else longest
  if longest > width and not truncate:
    raise LeakjaxError(
      f'a sequence has {longest} tokens, more than max_length={width}',
      'shorten the text or raise max_length',
    )
  ids = np.full((len(seqs), max(width, 1)), pad_id, np.int32)
  mask = np.zeros((len(seqs), max(width, 1)), np.int32)
  for row, s in enumerate(seqs):
    s = list(s)[:width]
    ids[row, : len(s)] = s
    mask[row, : len(s)] = 1
  return ids, mask


def gpt2_tokenizer(vocab_dir: str | os.PathLike | None = None) -> Tokenizer:
  """GPT-2 byte-level BPE; by default OpenAI's vendored files (offline).

  Args:
    vocab_dir: a folder with `vocab.json` and `merges.txt`; default the
      vendored `third_party/gpt2`.

  >>> gpt2_tokenizer().encode('Hello world')
  [15496, 995]
  """
  from tokenizers import Tokenizer as HFTokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers

  vocab_dir = Path(vocab_dir) if vocab_dir is not None else _gpt2_vocab_dir()
  for f in _GPT2_FILES:
    if not (vocab_dir / f).is_file():
      raise LeakjaxError(
        f'{vocab_dir} has no {f}',
        'point at a folder with vocab.json and merges.txt',
      )
  # NB: build the BPE model from the files directly. transformers 5's
  # GPT2TokenizerFast(vocab_file=..., merges_file=...) silently builds an
  # empty tokenizer.
  try:
    bpe = models.BPE.from_file(
      str(vocab_dir / 'vocab.json'), str(vocab_dir / 'merges.txt')
    )
  except Exception as e:  # tokenizers raises a bare Exception
    raise LeakjaxError(
      f'cannot read the BPE files in {vocab_dir}: {e}',
      'replace vocab.json/merges.txt',
    ) from None
  tok = HFTokenizer(bpe)
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  eos = tok.token_to_id('<|endoftext|>')
  if eos is not None:
    tok.add_special_tokens(['<|endoftext|>'])
  name = 'gpt2' if vocab_dir == _default_dir_or_none() else vocab_dir.name
  return Tokenizer(tok, bos_id=eos, eos_id=eos, pad_id=eos, name=name)


def _default_dir_or_none() -> Path | None:
  try:
    return _gpt2_vocab_dir()
  except LeakjaxError:
    return None


def tokenizer_from_file(path: str | os.PathLike) -> Tokenizer:
  """Loads a Hugging Face `tokenizer.json` (with special ids if known)."""
  from tokenizers import Tokenizer as HFTokenizer  # pylint: disable=g-import-not-at-top

  path = Path(path)
  if not path.is_file():
    raise LeakjaxError(f'tokenizer file {path} does not exist')
  try:
    tok = HFTokenizer.from_file(str(path))
  except Exception as e:  # tokenizers raises a bare Exception
    raise LeakjaxError(f'cannot read tokenizer {path}: {e}') from None
  specials = _special_ids_from_config(path.parent, tok)
  return Tokenizer(tok, name=path.parent.name, **specials)


def _special_ids_from_config(directory: Path, tok) -> dict[str, int | None]:
  """Reads bos/eos/pad/unk from tokenizer_config.json or config.json."""
  out: dict[str, int | None] = {}
  for fname in ('tokenizer_config.json', 'special_tokens_map.json'):
    f = directory / fname
    if not f.is_file():
      continue
    cfg = json.loads(f.read_text())
    for key in ('bos', 'eos', 'pad', 'unk'):
      token = cfg.get(f'{key}_token')
      if isinstance(token, dict):
        token = token.get('content')
      if isinstance(token, str) and tok.token_to_id(token) is not None:
        out.setdefault(f'{key}_id', tok.token_to_id(token))
  f = directory / 'config.json'
  if f.is_file():
    cfg = json.loads(f.read_text())
    for key in ('bos', 'eos', 'pad'):
      if isinstance(cfg.get(f'{key}_token_id'), int):
        out.setdefault(f'{key}_id', cfg[f'{key}_token_id'])
  return out


def check_vocab(tokenizer, vocab_size: int, what: str = 'model') -> None:
  """Raises LeakjaxError if the tokenizer cannot address the model's rows.

  A model may have more rows than the tokenizer has ids (GPT-2 checkpoints
  padded to a multiple of 64 are common), never fewer.
  """
  if tokenizer is not None and tokenizer.vocab_size > vocab_size:
    raise LeakjaxError(
      f'tokenizer has {tokenizer.vocab_size} tokens but the {what} has'
      f' {vocab_size} embedding rows',
      'use the tokenizer saved with this checkpoint',
    )


# Characters that end a sentence (FILM's truncation, Sec. 4.4 footnote 6;
# the sentence ends DAGER's hybrid searches beside the bag).
SENTENCE_END = '.!?'


def sentence_end_mask(tokenizer, vocab_size: int | None = None) -> np.ndarray:
  """bool `[V]`: tokens whose text is only sentence-ending punctuation.

  Args:
    tokenizer: anything with `token_strings()` (the text of every id).
    vocab_size: the mask's length (the model's embedding rows); default:
      the tokenizer's number of tokens. Ids past the tokenizer's are False.
  """
  strings = tokenizer.token_strings()
  size = vocab_size or len(strings)
  out = np.zeros((size,), bool)
  # A stripped token ends a sentence when it is not empty and stripping the
  # end characters empties it: one C-level pass per token, not a Python
  # loop over its characters.
  ends = [i for i, s in enumerate(strings[:size]) if _only_ends(s.strip())]
  out[ends] = True
  return out


def _only_ends(s: str) -> bool:
  return bool(s) and not s.strip(SENTENCE_END)


# ----------------------------------------------------------------- words
UNK, BOS = '<UNK>', '<S>'
_WORD_RE = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?|[^\sA-Za-z0-9]")


def split_words(text: str, *, lowercase: bool, punctuation: bool) -> list[str]:
  """Splits text into words (and punctuation marks if `punctuation`)."""
  if lowercase:
    text = text.lower()
  words = _WORD_RE.findall(text)
  if not punctuation:
    words = [w for w in words if w[0].isalnum()]
  return words


class WordTokenizer:
  """Word-level vocabulary for the LSTM models (GBoard, differential score).

  Ids: 0 = `<UNK>`, 1 = `<S>` (sentence start, used as BOS and padding),
  then words by decreasing corpus frequency. GBoard's V=9502 counts both
  specials (Suliman & Leith Sec. 2.3).
  """

  def __init__(
    self,
    words: Sequence[str],
    *,
    lowercase: bool = True,
    punctuation: bool = False,
  ):
    if len(words) < 2 or words[0] != UNK or words[1] != BOS:
      raise LeakjaxError(f'a word vocabulary must start with {UNK}, {BOS}')
    self.words = list(words)
    self.lowercase, self.punctuation = lowercase, punctuation
    self._index = {w: i for i, w in enumerate(self.words)}
    self.vocab_size = len(self.words)
    self.unk_id, self.bos_id = 0, 1
    self.eos_id, self.pad_id = None, 1
    self.name = 'words'

  @classmethod
  def build(
    cls,
    texts: Iterable[str],
    vocab_size: int,
    *,
    lowercase: bool = True,
    punctuation: bool = False,
  ) -> 'WordTokenizer':
    """The `vocab_size - 2` most frequent words of `texts` plus specials.

    Ties are broken alphabetically so the vocabulary is deterministic.
    """
    counts = collections.Counter()
    for t in texts:
      counts.update(
        split_words(t, lowercase=lowercase, punctuation=punctuation)
      )
    counts.pop(UNK, None)
    counts.pop(BOS, None)
    if not counts:
      raise LeakjaxError('cannot build a vocabulary: the corpus has no words')
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    words = [UNK, BOS] + [w for w, _ in ranked[: vocab_size - 2]]
    tok = cls(words, lowercase=lowercase, punctuation=punctuation)
    tok.counts = {w: c for w, c in ranked[: vocab_size - 2]}
    return tok

  def split(self, text: str) -> list[str]:
    return split_words(
      text, lowercase=self.lowercase, punctuation=self.punctuation
    )

  def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
    ids = [self._index.get(w, self.unk_id) for w in self.split(text)]
    return [self.bos_id] + ids if add_bos else ids

  def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
    words = [self.words[int(i)] for i in ids]
    if skip_special:
      words = [w for w in words if w != BOS]
    return ' '.join(words)

  def id_to_token(self, i: int) -> str:
    return self.words[int(i)]

  def token_to_id(self, token: str) -> int | None:
    return self._index.get(token)

  def token_strings(self) -> list[str]:
    return list(self.words)

  def encode_batch(
    self, texts, *, max_length=None, add_bos=False, truncate=False
  ):
    return pad_batch(
      [self.encode(t, add_bos=add_bos) for t in texts],
      pad_id=self.pad_id,
      max_length=max_length,
      truncate=truncate,
    )

  def save(self, path: str | os.PathLike) -> None:
    from leakjax.io import atomic_write_text  # pylint: disable=g-import-not-at-top

    atomic_write_text(
      path,
      json.dumps(
        {
          'type': 'words',
          'lowercase': self.lowercase,
          'punctuation': self.punctuation,
          'words': self.words,
        }
      ),
    )

  @classmethod
  def load(cls, path: str | os.PathLike) -> 'WordTokenizer':
    path = Path(path)
    if not path.is_file():
      raise LeakjaxError(f'word vocabulary {path} does not exist')
    try:
      d = json.loads(path.read_text())
      return cls(
        d['words'], lowercase=d['lowercase'], punctuation=d['punctuation']
      )
    except (KeyError, json.JSONDecodeError, TypeError) as e:
      raise LeakjaxError(
        f'{path} is not a leakjax word vocabulary ({e})',
        'rebuild it with WordTokenizer.build',
      ) from None

  def __repr__(self):
    return f'WordTokenizer(vocab_size={self.vocab_size})'
