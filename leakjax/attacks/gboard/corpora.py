"""The corpora of the GBoard experiment and θ0 pre-trained on their public part.

:func:`load_corpora` draws the client pool of `sentence_length`-word SMS
`ham` sentences (Suliman & Leith Sec. 4.1) and keeps every message holding
one of them out of the public pre-training text; :func:`pretrain` trains
θ0, the GBoard-shaped CIFG-LSTM (Sec. 2.3), on that public text, once,
cached in `<workdir>/pretrain`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import io, models
from leakjax import train as train_lib
from leakjax.errors import LeakjaxError
from leakjax.models import lstm
from leakjax.tokenization import WordTokenizer, split_words

if TYPE_CHECKING:
  from leakjax.attacks.gboard.runner import GboardConfig


def sentence_words(text: str) -> tuple[str, ...]:
  """Lower-cased words of `text`, punctuation dropped (client sentences)."""
  return tuple(split_words(text, lowercase=True, punctuation=False))


@dataclasses.dataclass
class Corpora:
  """Client pool and public text, disjoint by message."""

  pool: list[tuple[str, ...]]  # distinct client sentences, as words
  public_train: list[str]
  public_eval: list[str]
  sms_eval: list[str]  # the SMS part of public_eval
  counts: dict[str, int]


def load_public_corpus(
  name: str, path: str, limit: int, rng: np.random.Generator
) -> list[str]:
  """Sentences of one extra public corpus (WikiText headings dropped)."""
  texts = data_lib.load_corpus(path)
  sentences = []
  for t in texts:
    t = t.strip()
    if not t or re.fullmatch(r'=.*=', t):  # WikiText heading
      continue
    t = (
      t.replace('<unk>', ' ')
      .replace(' @-@ ', '-')
      .replace(' @,@ ', ',')
      .replace(' @.@ ', '.')
    )
    sentences.extend(data_lib.split_sentences(t))
  sentences = [s for s in sentences if len(sentence_words(s)) >= 2]
  if not sentences:
    raise LeakjaxError(f'public corpus {name} ({path}) has no sentences')
  if len(sentences) > limit:
    keep = rng.choice(len(sentences), limit, replace=False)
    sentences = [sentences[i] for i in sorted(keep)]
  return sentences


def load_corpora(cfg: GboardConfig) -> Corpora:
  """Client pool of 4-word ham sentences; public text without their messages.

  The pool holds `client_pool` distinct sentences of exactly
  `sentence_length` words drawn from the ham messages. Every message that
  contains a pool sentence is private: none of its sentences goes into
  pre-training, and neither does any other occurrence of a pool sentence.
  """
  rng = np.random.default_rng([cfg.seed, 1])
  ham = data_lib.load_corpus(cfg.sms, label=('Label', 'ham'))
  spam = data_lib.load_corpus(cfg.sms, label=('Label', 'spam'))
  by_sentence: dict[tuple[str, ...], list[int]] = {}
  for m, msg in enumerate(ham):
    for s in data_lib.split_sentences(msg):
      w = sentence_words(s)
      if len(w) == cfg.sentence_length:
        by_sentence.setdefault(w, []).append(m)
  distinct = sorted(by_sentence)
  if len(distinct) < cfg.client_pool:
    raise LeakjaxError(
      f'{cfg.sms} has {len(distinct)} distinct {cfg.sentence_length}-word'
      f' ham sentences, fewer than --client_pool={cfg.client_pool}',
      'lower --client_pool',
    )
  candidates = np.arange(len(distinct))
  if cfg.heldout_from_seed is not None:
    # The pool the run with that seed drew first from its own generator.
    seen = np.random.default_rng([cfg.heldout_from_seed, 1]).permutation(
      len(distinct)
    )[: cfg.client_pool]
    candidates = np.setdiff1d(candidates, seen)
    if len(candidates) < max(cfg.num_sentences):
      raise LeakjaxError(
        f'after the pool of seed {cfg.heldout_from_seed},'
        f' {len(candidates)} distinct client sentences remain, fewer than'
        f' n_k={max(cfg.num_sentences)}',
        'lower --num_sentences or --client_pool',
      )
  pick = candidates[rng.permutation(len(candidates))[: cfg.client_pool]]
  pool = [distinct[i] for i in pick]
  pool_set = set(pool)
  private = {m for w in pool for m in by_sentence[w]}
  sms_public = []
  for m, msg in enumerate(ham):
    if m not in private:
      sms_public.extend(s for s in data_lib.split_sentences(msg))
  for msg in spam:
    sms_public.extend(data_lib.split_sentences(msg))
  sms_public = [
    s
    for s in sms_public
    if len(sentence_words(s)) >= 2 and sentence_words(s) not in pool_set
  ]
  extra = []
  counts = {
    'sms_public': len(sms_public),
    'client_pool': len(pool),
    'private_messages': len(private),
  }
  for name, path in cfg.public:
    sents = load_public_corpus(name, path, cfg.public_limit, rng)
    counts[name] = len(sents)
    extra.extend(s for s in sents if sentence_words(s) not in pool_set)
  # Held-out sentences: half SMS (the client's domain), half the rest.
  sms_perm = rng.permutation(len(sms_public))
  n_sms_eval = min(cfg.pretrain_eval // 2, len(sms_public) // 5)
  sms_eval = [sms_public[i] for i in sms_perm[:n_sms_eval]]
  sms_train = [sms_public[i] for i in sms_perm[n_sms_eval:]]
  extra_perm = rng.permutation(len(extra))
  n_extra_eval = min(cfg.pretrain_eval - n_sms_eval, len(extra) // 5)
  extra_eval = [extra[i] for i in extra_perm[:n_extra_eval]]
  extra_train = [extra[i] for i in extra_perm[n_extra_eval:]]
  train = sms_train + extra_train
  train = [train[i] for i in rng.permutation(len(train))]
  return Corpora(
    pool=pool,
    public_train=train,
    public_eval=sms_eval + extra_eval,
    sms_eval=sms_eval,
    counts=counts,
  )


# ---------------------------------------------------------------- pretrain
def pretrain(cfg: GboardConfig, corpora: Corpora, workdir: Path):
  """θ0; trained once and cached in `workdir/pretrain`.

  Returns:
    `(model, params0, info)`: the CIFG-LSTM (no weights; its tokenizer is
    built from the public text), θ0, and facts about the pre-training.
  """
  tokenizer = WordTokenizer.build(corpora.public_train, cfg.vocab_size)
  if tokenizer.vocab_size != cfg.vocab_size:
    raise LeakjaxError(
      f'the public corpus has only {tokenizer.vocab_size - 2} distinct'
      f' words, fewer than --vocab_size={cfg.vocab_size} - 2',
      'lower --vocab_size or add public text',
    )
  model_cfg = lstm.CIFGConfig(
    vocab_size=cfg.vocab_size,
    embed_dim=cfg.embed_dim,
    units=cfg.units,
    proj_dim=cfg.embed_dim,
  )
  model, params = lstm.init_model(
    model_cfg, key=jax.random.key(cfg.seed), tokenizer=tokenizer
  )
  train_cfg = train_lib.TrainConfig(
    optimizer='adam',
    learning_rate=cfg.pretrain_lr,
    schedule='linear',
    warmup_steps=min(100, cfg.pretrain_steps // 10),
    batch_size=cfg.pretrain_batch_size,
    max_length=cfg.pretrain_max_length,
    num_steps=cfg.pretrain_steps,
    grad_clip_norm=1.0,
    eval_every=max(cfg.pretrain_steps // 5, 1),
    seed=cfg.seed,
    checkpoint_every=max(cfg.pretrain_steps // 5, 1),
    log_every=max(cfg.pretrain_steps // 20, 1),
  )
  start = time.time()
  result = train_lib.train(
    model,
    params,
    corpora.public_train,
    corpora.public_eval,
    train_cfg,
    workdir=workdir / 'pretrain',
  )
  seconds = time.time() - start
  timing = workdir / 'pretrain' / 'seconds.json'  # of the run that trained
  if result.step > result.start_step or not timing.exists():
    if io.is_primary():
      io.atomic_write_text(timing, json.dumps({'seconds': seconds}))
  else:
    seconds = json.loads(timing.read_text())['seconds']
  params = result.params
  sms_ppl = (
    train_lib.evaluate(
      model,
      params,
      data_lib.batches(
        tokenizer, corpora.sms_eval, 64, cfg.pretrain_max_length, shuffle=False
      ),
    )['perplexity']
    if corpora.sms_eval
    else math.nan
  )
  info = {
    'eval_perplexity': result.best_eval['perplexity'],
    'sms_eval_perplexity': sms_ppl,
    'steps': result.step,
    'seconds': seconds,
    'num_params': models.num_params(params),
    'train_sentences': len(corpora.public_train),
    'eval_sentences': len(corpora.public_eval),
  }
  logging.info('θ0: %s', info)
  return model, params, info
