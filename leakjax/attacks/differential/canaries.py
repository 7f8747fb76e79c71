"""Canaries of Zanella-Beguelin et al. (CCS 2020), Sec. 4.4.

A canary is a 5-word phrase whose words come from given frequency quintiles
of the training set's vocabulary (the paper's profiles: all low, low to high,
mixed, high to low). :func:`make_canaries` draws or checks them;
:func:`canary_copies` is the update `D' \\ D` that inserts a canary `k` times.
Host-side NumPy/string code: canaries are built once per experiment.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from leakjax.errors import LeakjaxError
from leakjax.tokenization import WordTokenizer

# Quintiles of D's vocabulary by frequency, 0 = most frequent fifth
# (Sec. 4.4: "all tokens are from the least frequent quintile").
PROFILES = {
  'all_low': (4, 4, 4, 4, 4),
  'low_to_high': (4, 3, 2, 1, 0),
  'mixed': (2, 0, 4, 1, 3),  # one word from each quintile
  'high_to_low': (0, 1, 2, 3, 4),
}
CANARY_LENGTH = 5  # Sec. 4.4: "we fix the length of the canary phrase to 5"


@dataclasses.dataclass(frozen=True)
class Canary:
  kind: str  # a key of PROFILES
  text: str  # five words
  ids: tuple[int, ...]  # their ids
  quintiles: tuple[int, ...]  # measured quintile of each word
  counts: tuple[int, ...]  # each word's count in D


def word_quintile(tokenizer: WordTokenizer, word_id: int) -> int:
  """0 (most frequent fifth of the vocabulary) .. 4 (least frequent)."""
  num_words = tokenizer.vocab_size - 2  # words are ranked after 2 specials
  return min(4, (word_id - 2) * 5 // num_words)


def make_canaries(
  tokenizer: WordTokenizer,
  train: Sequence[str],
  *,
  canary_types: Sequence[str],
  phrases: Sequence[str] = (),
  seed: int,
) -> list[Canary]:
  """The canaries: given phrases (checked) or random words per quintile.

  Args:
    tokenizer: the vocabulary of D, words ranked by frequency.
    train: D's sentences (a canary must not occur in them).
    canary_types: keys of :data:`PROFILES`, one canary each.
    phrases: one phrase per canary type, checked against its profile;
      empty: distinct random words (not `unk`) from the profile's quintiles.
    seed: the random words' seed.

  Returns:
    One :class:`Canary` per type, in order.
  """
  counts = getattr(tokenizer, 'counts', {})
  rng = np.random.default_rng([seed, 2])
  text_d = ' ' + ' '.join(' '.join(tokenizer.split(s)) for s in train) + ' '
  canaries = []
  for n, kind in enumerate(canary_types):
    profile = PROFILES[kind]
    if phrases:
      words = tokenizer.split(phrases[n])
    else:  # random words, distinct, not `unk`
      words = []
      for q in profile:
        pool = [
          i
          for i in range(2, tokenizer.vocab_size)
          if word_quintile(tokenizer, i) == q
          and tokenizer.words[i] != 'unk'
          and tokenizer.words[i] not in words
        ]
        words.append(tokenizer.words[int(rng.choice(pool))])
    if len(words) != CANARY_LENGTH:
      raise LeakjaxError(
        f'canary {phrases[n]!r} has {len(words)} words',
        f'use {CANARY_LENGTH} words',
      )
    ids = tuple(tokenizer.encode(' '.join(words)))
    if tokenizer.unk_id in ids:
      missing = [w for w, i in zip(words, ids) if i == tokenizer.unk_id]
      raise LeakjaxError(
        f'canary words {missing} are not in the vocabulary',
        'pick words that occur in the training set',
      )
    quintiles = tuple(word_quintile(tokenizer, i) for i in ids)
    if quintiles != profile:
      raise LeakjaxError(
        f'canary {" ".join(words)!r} has word quintiles {quintiles}, but'
        f' {kind} needs {profile} (0 = most frequent)',
        'pick words of the right frequency, or omit --canaries',
      )
    text = ' '.join(words)
    if f' {text} ' in text_d:
      raise LeakjaxError(
        f'canary {text!r} occurs in the training set', 'pick another phrase'
      )
    canaries.append(
      Canary(
        kind=kind,
        text=text,
        ids=ids,
        quintiles=quintiles,
        counts=tuple(int(counts.get(w, 0)) for w in words),
      )
    )
  return canaries


def canary_copies(canaries: Sequence[Canary], k: int) -> list[str]:
  """`k` copies of each canary's text: the update `D' \\ D` (Sec. 4.2)."""
  return [c.text for c in canaries for _ in range(k)]


def hamming_close(
  found: np.ndarray, others: Sequence[Sequence[int]], max_distance: int = 2
) -> np.ndarray:
  """bool [S]: found sequences within `max_distance` of any of `others`."""
  close = np.zeros(len(found), bool)
  for o in others:
    close |= (found != np.asarray(o)[None]).sum(-1) <= max_distance
  return close


__all__ = [
  'CANARY_LENGTH',
  'PROFILES',
  'Canary',
  'canary_copies',
  'hamming_close',
  'make_canaries',
  'word_quintile',
]
