"""The corpus of the canary experiment: sentences, their split, packed rows.

:func:`prepare_corpus` reads the corpus into sentences, splits them into
the training set D, a held-out set (the perplexity column of Table 1) and
the D_extra pool (RQ1), and builds the word vocabulary of D; it raises on
an empty corpus or a vocabulary smaller than `vocab_size`, before a run
touches its workdir. :func:`pack_rows` packs whole sentences into the
training rows of the LSTM.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Sequence

import numpy as np

from leakjax import data as data_lib
from leakjax.errors import LeakjaxError
from leakjax.tokenization import WordTokenizer

if TYPE_CHECKING:
  from leakjax.attacks.differential.runner import DifferentialConfig


@dataclasses.dataclass
class Corpus:
  """The sentences of one run, split once."""

  train: list[str]  # D
  eval: list[str]  # held out, for perplexity
  extra: list[str]  # the D_extra pool (RQ1)


def read_sentences(
  path: str,
  *,
  max_sentences: int | None,
  seed: int,
  column: str | None = None,
  label: str | None = None,
) -> list[str]:
  """Sentences of a paragraph-per-line corpus, shuffled (seeded).

  WikiText headings (` = Title = `) are dropped and its `<unk>` marker
  becomes the word `unk` (a word of the vocabulary like any other).
  """
  paragraphs = data_lib.load_corpus(path, column=column, label=label)
  sentences = []
  for p in paragraphs:
    if re.fullmatch(r'=.*=', p):  # WikiText heading
      continue
    sentences.extend(
      s.replace('<unk>', 'unk') for s in data_lib.split_sentences(p)
    )
  if not sentences:
    raise LeakjaxError(f'{path} has no sentences', 'pass a text corpus')
  order = np.random.default_rng([seed, 1]).permutation(len(sentences))
  sentences = [sentences[i] for i in order]
  return sentences[:max_sentences] if max_sentences else sentences


def split_corpus(sentences: Sequence[str], cfg: DifferentialConfig) -> Corpus:
  """Held-out sentences first, then D_extra, the rest is D."""
  n = len(sentences)
  num_eval = max(1, round(n * cfg.eval_fraction))
  num_extra = round(n * cfg.extra_fraction)
  return Corpus(
    eval=list(sentences[:num_eval]),
    extra=list(sentences[num_eval : num_eval + num_extra]),
    train=list(sentences[num_eval + num_extra :]),
  )


def pack_rows(
  tokenizer: WordTokenizer, sentences: Sequence[str], width: int, *, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Packs whole sentences (`<S>` + words) into rows of `width` tokens.

  Best-fit decreasing: each sentence goes to the fullest row it fits, so
  rows are ~all real tokens (an LSTM reads rows left to right, so a packed
  sentence sees the previous one as context, as in PTB-style training on a
  continuous stream). Sentences longer than `width` are cut.

  Returns:
    `(ids, mask)` int32 `[rows, width]`, rows shuffled with `seed`.
  """
  seqs = [([tokenizer.bos_id] + tokenizer.encode(s))[:width] for s in sentences]
  seqs = [s for s in seqs if len(s) >= 2]
  if not seqs:
    raise LeakjaxError('no sentence has a word', 'check the corpus')
  seqs.sort(key=len, reverse=True)
  rows: list[list[int]] = []
  by_room: list[list[int]] = [[] for _ in range(width + 1)]  # room -> rows
  for s in seqs:
    room = next((r for r in range(len(s), width + 1) if by_room[r]), None)
    if room is None:
      rows.append(list(s))
      by_room[width - len(s)].append(len(rows) - 1)
    else:
      row = by_room[room].pop()
      rows[row].extend(s)
      by_room[room - len(s)].append(row)
  order = np.random.default_rng(seed).permutation(len(rows))
  ids = np.full((len(rows), width), tokenizer.pad_id, np.int32)
  mask = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(order):
    ids[i, : len(rows[r])] = rows[r]
    mask[i, : len(rows[r])] = 1
  return ids, mask


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedCorpus:
  """A run's corpus, read, split and tokenized once."""

  sentences: list[str]  # every sentence read, shuffled (provenance 'texts')
  corpus: Corpus  # D, held-out, D_extra
  tokenizer: WordTokenizer  # the `vocab_size` words of D


def prepare_corpus(cfg: DifferentialConfig) -> PreparedCorpus:
  """Reads, splits and tokenizes `cfg.data`.

  Raises:
    LeakjaxError: the corpus has no sentence, or D fewer distinct words
      than the vocabulary needs.
  """
  sentences = read_sentences(
    cfg.data,
    max_sentences=cfg.max_sentences,
    seed=cfg.seed,
    column=cfg.data_column,
    label=cfg.data_label,
  )
  corpus = split_corpus(sentences, cfg)
  tokenizer = WordTokenizer.build(corpus.train, cfg.vocab_size)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise LeakjaxError(
      f'the training set has only {tokenizer.vocab_size - 2} distinct'
      f' words, fewer than vocab_size={cfg.vocab_size} - 2',
      'lower --vocab_size',
    )
  return PreparedCorpus(sentences=sentences, corpus=corpus, tokenizer=tokenizer)
