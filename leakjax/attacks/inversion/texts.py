"""The texts of the inversion experiment: tokenized splits and model samples.

:func:`load_splits` reads every corpus, holds out `test_fraction` of it
(Wan et al. Sec. 5.1.1) and draws `num_test` held-out texts per corpus and
`num_train` training texts of the one that trains Embed Parrot;
:func:`model_samples` draws extra training sentences from the target
itself (data-free augmentation, ours).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei
from leakjax.errors import LeakjaxError
from leakjax.models import Model, sampling

if TYPE_CHECKING:
  from leakjax.attacks.inversion.runner import InversionConfig


@dataclasses.dataclass
class Split:
  """Tokenized texts of one corpus split.

  Attributes:
    texts: the raw texts.
    ids: int32 `[N, T]`, right-padded.
    mask: int32 `[N, T]`, 1 for real tokens (BOS included).
    score_mask: int32 `[N, T]`, the positions that are reconstructed and
      scored (BOS excluded).
    references: the decoded real tokens (the text the attack must recover).
  """

  texts: list[str]
  ids: np.ndarray
  mask: np.ndarray
  score_mask: np.ndarray
  references: list[str]

  @property
  def lengths(self) -> np.ndarray:
    return self.score_mask.sum(1)

  def first(self, n: int) -> Split:
    """The split's first `n` texts."""
    return Split(
      self.texts[:n],
      self.ids[:n],
      self.mask[:n],
      self.score_mask[:n],
      self.references[:n],
    )


def load_texts(name: str, path: str, split_sentences: bool) -> list[str]:
  """A corpus' texts, deduplicated in file order."""
  texts = data_lib.load_corpus(path)
  if split_sentences:
    texts = [
      s
      for t in texts
      if not t.startswith('=')
      for s in data_lib.split_sentences(t)
      if len(s.split()) >= 4
    ]
  texts = list(dict.fromkeys(texts))
  if len(texts) < 2:
    raise LeakjaxError(
      f'corpus {name} ({path}) has {len(texts)} distinct texts',
      'use a larger corpus',
    )
  return texts


def make_split(tokenizer, texts: Sequence[str], cfg: InversionConfig) -> Split:
  """`texts` tokenized to at most `cfg.max_length` tokens; texts with no
  scored token are dropped."""
  ids, mask, _ = data_lib.encode_corpus(
    tokenizer, texts, cfg.max_length, add_bos=cfg.add_bos, truncate=True
  )
  score_mask = mask.copy()
  if cfg.add_bos and tokenizer.bos_id is not None:
    score_mask[:, 0] = 0
  keep = score_mask.sum(1) > 0
  ids, mask, score_mask = ids[keep], mask[keep], score_mask[keep]
  texts = [t for t, k in zip(texts, keep) if k]
  refs = bei_hei.decode_ids(tokenizer, ids, score_mask)
  return Split(list(texts), ids, mask, score_mask, refs)


def sample_texts(
  items: list[str], n: int, rng: np.random.Generator
) -> list[str]:
  """`n` of `items` drawn by `rng` without replacement, in their order
  (all of them when `n` covers them, and then no draw from `rng`)."""
  if n >= len(items):
    return list(items)
  return [items[i] for i in sorted(rng.choice(len(items), n, replace=False))]


def disjoint_draw(
  items: list[str], taken: Sequence[str], n: int, seed: int
) -> list[str]:
  """`n` of `items` that are not in `taken` (by text, so a repeated text
  is in one draw only), drawn by their own generator (`[seed, 1]`): the
  draw of `taken` and everything drawn after it stay as they were."""
  drop = set(taken)
  rest = [t for t in items if t not in drop]
  if len(rest) < n:
    raise LeakjaxError(
      f'{len(rest)} held-out texts outside the dev draw, fewer than'
      f' --num_test={n}',
      'lower --num_test or raise --test_fraction',
    )
  return sample_texts(rest, n, np.random.default_rng([seed, 1]))


def model_samples(
  model: Model,
  params,
  num: int,
  *,
  length: int,
  key: jax.Array,
  start_id: int = -1,
  temperature: float = 1.0,
  top_p: float = 0.95,
  batch_size: int = 64,
) -> list[str]:
  """`num` distinct sentences sampled from the target.

  Rows of `length` tokens are drawn from `start_id` (-1: the tokenizer's
  BOS) by :func:`leakjax.models.sampling.sample` at `temperature` and
  nucleus `top_p`, `batch_size` at a time, decoded and cut into sentences
  (:func:`leakjax.data.split_sentences`). A row's last piece is dropped
  (the row's length, not the model, ended it), and so are pieces of fewer
  than 4 words (the rule the sentence-split corpora follow) and repeats.
  Rows are drawn until enough sentences are kept; the first `num` are
  returned, in order of drawing.
  """
  tok = model.tokenizer
  start = start_id if start_id >= 0 else tok.bos_id
  if start is None or not 0 <= start < model.vocab_size:
    raise LeakjaxError(
      f'no valid token to start the samples from (got {start})',
      'start from a token id of the vocabulary, e.g. the end-of-text id'
      ' (the inversion experiment: --sample_start_id=ID)',
    )
  prompt = jnp.full((batch_size, 1), start, jnp.int32)
  kept: dict[str, None] = {}
  started, rows = time.time(), 0
  draw = jitted(sampling.sample, static_argnames=sampling.SAMPLE_STATIC)
  while len(kept) < num:
    ids = draw(
      model,
      params,
      jax.random.fold_in(key, rows),
      prompt,
      num_tokens=length,
      temperature=temperature,
      top_p=top_p,
    )
    before = len(kept)
    for row in np.asarray(ids)[:, 1:]:
      text = tok.decode([int(t) for t in row])
      for sentence in data_lib.split_sentences(text)[:-1]:
        sentence = sentence.strip()
        if len(sentence.split()) >= 4:
          kept.setdefault(sentence)
    rows += batch_size
    if len(kept) == before:
      raise LeakjaxError(
        f'{batch_size} samples gave no new sentence of >= 4 words',
        'sample longer rows or at a higher temperature (the inversion'
        ' experiment: --max_length, --sample_temperature)',
      )
    logging.info(
      'model samples: %d/%d sentences from %d rows (%.0f s)',
      min(len(kept), num),
      num,
      rows,
      time.time() - started,
    )
  return list(kept)[:num]


def pad_to(x: np.ndarray, width: int, axis: int) -> np.ndarray:
  """`x` right-padded with zeros to `width` along `axis`."""
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, width - x.shape[axis])
  return np.pad(x, pad)


def concat_splits(a: Split, b: Split) -> Split:
  """The texts of `a`, then those of `b`, right-padded to the wider one."""
  width = max(a.ids.shape[1], b.ids.shape[1])
  cat = lambda x, y: np.concatenate([pad_to(x, width, 1), pad_to(y, width, 1)])
  return Split(
    a.texts + b.texts,
    cat(a.ids, b.ids),
    cat(a.mask, b.mask),
    cat(a.score_mask, b.score_mask),
    a.references + b.references,
  )


def load_splits(
  cfg: InversionConfig, tokenizer
) -> tuple[dict[str, Split], Split]:
  """Held-out test texts of every corpus, training texts of one.

  One generator seeded with `cfg.seed` draws, corpus by corpus in the
  order of `cfg.corpora`, the dev texts and (for `cfg.train_corpus`) the
  training texts. With `cfg.split == 'test'` the scored texts are instead
  :func:`disjoint_draw`'s, from the same held-out share without the dev
  texts; the training texts do not change.

  Returns:
    `(tests, train)`: corpus name -> its test :class:`Split`, and the
    training :class:`Split` of `cfg.train_corpus`.
  """
  rng = np.random.default_rng(cfg.seed)
  tests: dict[str, Split] = {}
  train_split = None
  for name, path in cfg.corpus_paths():
    texts = load_texts(name, path, name in cfg.sentence_split)
    train_texts, test_texts = data_lib.train_eval_split(
      texts, cfg.test_fraction, seed=cfg.seed
    )
    chosen = sample_texts(test_texts, cfg.num_test, rng)
    if cfg.split == 'test':
      chosen = disjoint_draw(test_texts, chosen, cfg.num_test, cfg.seed)
    tests[name] = make_split(tokenizer, chosen, cfg)
    if name == cfg.train_corpus:
      train_split = make_split(
        tokenizer, sample_texts(train_texts, cfg.num_train, rng), cfg
      )
  logging.info(
    'data: %s; train %d texts',
    {k: len(v.texts) for k, v in tests.items()},
    len(train_split.texts),
  )
  return tests, train_split
