r"""The GBoard attack experiment (Suliman & Leith) on real SMS messages.

End to end, without the oracles of the authors' code (the word threshold
and the number of sentences are chosen without the true text); read
top-down from :func:`run_gboard_experiment`:

1. :func:`load_corpora`: client pool of 4-word SMS `ham` sentences
   (Sec. 4.1) and public pre-training text kept disjoint by message.
2. :func:`pretrain`: θ0, the GBoard-shaped CIFG-LSTM (V=9502, D=96, 670
   units, projection, tied embeddings, output bias; Sec. 2.3) trained on
   the public text, cached in `<workdir>/pretrain`.
3. :func:`make_datasets` and :func:`trajectory` / :func:`snapshots`: the
   victim clients, datasets of n_k sentences trained with
   :func:`leakjax.fl.client_update`, SGD η = 0.001 (Sec. 4.1), θ1 taken
   after E epochs of one trajectory (E=1, B=full is FedSGD); DPSGD-like
   noise (Algorithm 3) on its own trajectories, single noise (Algorithm 4)
   added to the noise-free θ1.
4. :func:`attack`: word recovery (Algorithm 2, the no-oracle rules, the
   oracle cut) and sentence reconstruction (Sec. 3.2) with FedSGD scaling
   (Sec. 4.3.2) and the keep rules, one result row per scale.

Python loops, files and logs live here; the kernels of
:mod:`leakjax.attacks.gboard` stay pure. Summaries, tables and plots are
the caller's (experiments/gboard_report.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import time
import zlib
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import data as data_lib
from leakjax import fl, io, models, sharding
from leakjax import metrics as metrics_lib
from leakjax import train as train_lib
from leakjax.attacks.gboard import mixture, thresholds, update
from leakjax.attacks.gboard import reconstruct as reconstruct_lib
from leakjax.errors import LeakjaxError, check_positive
from leakjax.fl import defenses as defenses_lib
from leakjax.models import lstm
from leakjax.tokenization import WordTokenizer, split_words

NOISES = ('none', 'dpsgd', 'single')
LOSSES = ('sentence_sum', 'token_mean', 'batch_sum')
NO_ORACLE_RULES = ('auto', 'fdr', 'universal', 'zero')  # --threshold_rule
SMS_DEFAULT = 'sms-spam'
PUBLIC_DEFAULT = (
  ('wikitext', 'wikitext-2-valid'),
  ('enron', 'film-enron'),
)


@dataclasses.dataclass(frozen=True)
class GboardConfig:
  """Everything that determines the results (written to config.json).

  Attributes:
    sms: UCI SMS Spam Collection .tsv: client data (ham) and public
      pre-training text.
    public: name=path,... more public pre-training corpora (WikiText
      paragraphs are split into sentences).
    public_limit: Sentences kept per extra public corpus.
    vocab_size: V incl. <UNK>, <S> (Sec. 2.3).
    embed_dim: D (Sec. 2.3).
    units: CIFG units (Sec. 2.3).
    pretrain_steps: Adam steps for θ0.
    pretrain_batch_size: Sentences per step.
    pretrain_lr: Peak Adam learning rate.
    pretrain_max_length: Words per pre-training sentence (<S> included).
    pretrain_eval: Held-out public sentences for the perplexity.
    sentence_length: Words per client sentence (Sec. 4.1: 4).
    client_pool: Distinct client sentences; their messages are kept out of
      pre-training.
    num_sentences: Dataset sizes n_k (Sec. 4.1).
    num_datasets: Datasets per n_k.
    epochs: E at which θ1 is attacked (one trajectory; sorted, distinct).
    batch_sizes: B; full = n_k.
    max_sentence_epochs: Skip E with n_k * E above this (compute budget).
    learning_rate: Client SGD η (Sec. 4.1).
    loss: Client loss: sentence_sum (per-sentence sum over words, Sec.
      3.1, averaged over the batch), token_mean (the token mean of
      fl.client_update) or batch_sum (the sum over words and batch, a
      Keras reduction=SUM; Table 1 cannot tell it from sentence_sum, B = 1
      there).
    dpsgd_sigmas: σ of DPSGD-like noise (Algorithm 3).
    dpsgd_runs: n_k:B[:max E] of the DPSGD-like trajectories.
    single_sigmas: σ of single noise on θ1 (Algorithm 4).
    scales: FedSGD scaling s of θ1 + s(θ1 − θ0) (Sec. 4.3.2).
    threshold_rule: No-oracle word recovery, one of auto, fdr, universal,
      zero: auto = gboard.recover_words_auto (bias + rows), else the bias
      threshold of gboard.choose_threshold.
    fdr_q: Level of the fdr rule.
    keep_rule: How many reconstructions to keep without n_k (cover, words
      or gap: gboard.KEEP_RULES).
    seed: Random seed.
    heldout_from_seed: out-of-sample runs: the client pool is drawn from
      the sentences that the run with this seed (and this client_pool) did
      NOT use, so that rules whose constants were chosen on that run meet
      client sentences they have never seen. None: no exclusion. The SMS
      ham set has 750 distinct 4-word sentences, so after a pool of 400
      at most 350 remain.
  """

  sms: str = SMS_DEFAULT
  public: tuple[tuple[str, str], ...] = PUBLIC_DEFAULT
  public_limit: int = 12000
  vocab_size: int = 9502
  embed_dim: int = 96
  units: int = 670
  pretrain_steps: int = 1500
  pretrain_batch_size: int = 64
  pretrain_lr: float = 3e-3
  pretrain_max_length: int = 24
  pretrain_eval: int = 800
  sentence_length: int = 4
  client_pool: int = 400
  num_sentences: tuple[int, ...] = (16, 32, 64, 128, 256)
  num_datasets: int = 1
  epochs: tuple[int, ...] = (1, 50, 100, 1000)
  batch_sizes: tuple[str, ...] = ('full', '32')
  max_sentence_epochs: int = 70000
  learning_rate: float = 1e-3
  loss: str = 'sentence_sum'
  dpsgd_sigmas: tuple[float, ...] = (0.001, 0.01, 0.1)
  dpsgd_runs: tuple[tuple[int, str, int], ...] = (
    (16, 'full', 10**9),
    (64, '32', 100),
  )
  single_sigmas: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2)
  scales: tuple[float, ...] = (0.0, 10.0, 100.0, 1000.0)
  threshold_rule: str = 'auto'
  fdr_q: float = 0.05
  keep_rule: str = 'cover'
  seed: int = 0
  heldout_from_seed: int | None = None

  def __post_init__(self):
    for name, allowed in (
      ('loss', LOSSES),
      ('threshold_rule', NO_ORACLE_RULES),
      ('keep_rule', reconstruct_lib.KEEP_RULES),
    ):
      if getattr(self, name) not in allowed:
        raise LeakjaxError(
          f'--{name}={getattr(self, name)!r} is not one of {", ".join(allowed)}'
        )
    for b in self.batch_sizes + tuple(r[1] for r in self.dpsgd_runs):
      if b != 'full' and not (b.isdigit() and int(b) > 0):
        raise LeakjaxError(
          f'batch size {b!r} is neither "full" nor a positive int',
          'pass e.g. --batch_sizes=full,32',
        )
    # <UNK> and <S> take two ids: three is the smallest vocabulary with a word.
    check_positive(self, 'vocab_size', minimum=3)
    check_positive(
      self,
      'embed_dim',
      'units',
      'pretrain_batch_size',
      'pretrain_max_length',
      'pretrain_eval',
      'client_pool',
      'num_sentences',
      'num_datasets',
      'max_sentence_epochs',
      'public_limit',
    )
    check_positive(self, 'pretrain_steps', minimum=0)
    if not self.epochs or min(self.epochs) < 1:
      raise LeakjaxError(f'--epochs={self.epochs} must be >= 1')
    # One trajectory grows through the epochs: sorted, each once.
    object.__setattr__(self, 'epochs', tuple(sorted(set(self.epochs))))
    if max(self.num_sentences) > self.client_pool:
      raise LeakjaxError(
        f'n_k={max(self.num_sentences)} is more than the'
        f' client pool ({self.client_pool})',
        'raise --client_pool',
      )
    if self.sentence_length < 2:
      raise LeakjaxError('--sentence_length must be >= 2')


def parse_public(spec: str) -> tuple[tuple[str, str], ...]:
  """`'name=path,...'` (the `--public` flag) -> `((name, path), ...)`."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(','))):
    if '=' not in part:
      raise LeakjaxError(f'--public entry {part!r} is not name=path')
    name, path = part.split('=', 1)
    out.append((name.strip(), path.strip()))
  return tuple(out)


def parse_dpsgd_runs(values: Sequence[str]) -> tuple[tuple[int, str, int], ...]:
  """`['n_k:B[:max E]', ...]` (the `--dpsgd_runs` flag) -> typed triples."""
  out = []
  for v in values:
    parts = v.split(':')
    if len(parts) == 2:
      parts.append(str(10**9))
    if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit():
      raise LeakjaxError(
        f'--dpsgd_runs entry {v!r} is not n_k:B[:max E]',
        'pass e.g. 16:full,64:32:100',
      )
    out.append((int(parts[0]), parts[1], int(parts[2])))
  return tuple(out)


def load_config(workdir: str | Path) -> GboardConfig:
  """The :class:`GboardConfig` of a run, from `<workdir>/config.json`."""
  stored = json.loads((io.as_path(workdir) / 'config.json').read_text())

  def tupled(value):
    return tuple(map(tupled, value)) if isinstance(value, list) else value

  return GboardConfig(**{k: tupled(v) for k, v in stored.items()})


# -------------------------------------------------------------------- data
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


# ------------------------------------------------------------- client runs
@dataclasses.dataclass
class Dataset:
  n_k: int
  index: int
  sentences: list[tuple[str, ...]]
  ids: np.ndarray  # int32 [n_k, L + 1], <S> first
  true_words: set[str]


def make_datasets(cfg: GboardConfig, pool, tokenizer) -> list[Dataset]:
  out = []
  for n_k in cfg.num_sentences:
    for d in range(cfg.num_datasets):
      rng = np.random.default_rng([cfg.seed, 2, n_k, d])
      pick = rng.choice(len(pool), n_k, replace=False)
      sents = [pool[i] for i in pick]
      ids = np.asarray(
        [tokenizer.encode(' '.join(s), add_bos=True) for s in sents], np.int32
      )
      out.append(
        Dataset(
          n_k=n_k,
          index=d,
          sentences=sents,
          ids=ids,
          true_words={w for s in sents for w in s},
        )
      )
  return out


def _batch_size(b: str, n_k: int) -> int | None:
  return None if b == 'full' or int(b) >= n_k else int(b)


_CHUNKS = (50, 10, 1)  # epochs per client_update call: few compilations


def _chunks(total: int) -> list[int]:
  out = []
  for c in _CHUNKS:
    while total >= c:
      out.append(c)
      total -= c
  return out


@functools.partial(jax.jit, static_argnames=('model', 'config'))
def _client_update(model, params, ids, config, key) -> fl.ClientResult:
  """:func:`leakjax.fl.client_update` without padding, jitted.

  `model` and `config` are static: one compilation per model and client
  config, whatever the parameters.
  """
  return fl.client_update(model, params, ids, None, config, key=key)


def trajectory(
  model,
  params0,
  ids,
  cfg: GboardConfig,
  *,
  batch: str,
  step_noise: float,
  epochs: Sequence[int],
  key,
):
  """Yields `(E, θ1)` after each E in `epochs`, one growing trajectory.

  Each `client_update` call runs a chunk of epochs (fresh shuffles and
  noise keys per call), so θ1 after E epochs is a draw of Algorithm 1 (or
  3) with E epochs.
  """
  n_k, length = ids.shape[0], ids.shape[1] - 1
  per_sentence = {
    'sentence_sum': length,
    'token_mean': 1,
    'batch_sum': length * (_batch_size(batch, n_k) or n_k),
  }[cfg.loss]
  params, done = params0, 0
  ids = jnp.asarray(ids)
  for target in epochs:
    for chunk in _chunks(target - done):
      client = update.client_config(
        chunk,
        _batch_size(batch, n_k),
        learning_rate=cfg.learning_rate,
        words_per_sentence=per_sentence,
        step_noise=step_noise,
      )
      params = _client_update(
        model, params, ids, client, jax.random.fold_in(key, done)
      ).params
      done += chunk
    yield target, params


def snapshots(
  model,
  params0,
  ids,
  cfg: GboardConfig,
  *,
  batch: str,
  step_noise: float,
  epochs: Sequence[int],
  key,
  folder: Path,
  name: str,
):
  """:func:`trajectory`, with every θ1 saved under `folder` and reused.

  A re-run (e.g. after changing an attack) loads the saved θ1 instead of
  training again.
  """
  files = [folder / f'{name}_E{e}.safetensors' for e in epochs]
  if all(f.exists() for f in files):
    for e, f in zip(epochs, files):
      yield e, update.load_snapshot(f, params0)
    return
  for (e, params1), f in zip(
    trajectory(
      model,
      params0,
      ids,
      cfg,
      batch=batch,
      step_noise=step_noise,
      epochs=epochs,
      key=key,
    ),
    files,
  ):
    if io.is_primary():
      update.save_snapshot(f, params1)
    yield e, params1


# ----------------------------------------------------------------- attacks
@functools.partial(jax.jit, static_argnames=('q',))
def _recover_words_auto(delta, rows, candidates, rows0=None, bias0=None, *, q):
  """:func:`gboard.recover_words_auto`, jitted: its EM loop compiles once
  (twice: with and without θ0's rows), not per update."""
  return mixture.recover_words_auto(
    delta, rows, candidates, rows0=rows0, bias0=bias0, q=q
  )


def reconstruct_candidates(
  model,
  params0,
  params1,
  words: np.ndarray,
  *,
  length: int,
  bos_id: int,
  mesh=None,
) -> reconstruct_lib.Reconstruction:
  """:func:`gboard.reconstruct_sentences` (jitted) for the recovered `words`.

  The candidate axis (one start word per recovered word) is padded to a
  power of two, then to a multiple of the mesh's data axis, and placed on
  that axis; θ0, θ1 and the allowed-word mask are replicated. Each
  candidate's generation and score only read its own row, so the result
  equals the one-device result (tested in tests/gboard_test.py).

  Args:
    model: the model (a static argument of the kernel).
    params0: θ0.
    params1: θ1 (or the scaled θ1).
    words: bool `[vocab]`, the recovered words.
    length: words per sentence.
    bos_id: the `<S>` id.
    mesh: a mesh with a 'data' axis, or None for one device.

  Returns:
    The :class:`gboard.Reconstruction` (`scores` -inf on padding).
  """
  count = int(np.count_nonzero(words))
  slots = 1 << max(math.ceil(math.log2(max(count, 1))), 0)
  n = sharding.data_size(mesh)
  starts, valid = reconstruct_lib.padded_indices(words, size=-(-slots // n) * n)
  starts, valid = sharding.shard_batch(
    (jnp.asarray(starts), jnp.asarray(valid)), mesh
  )
  params0, params1, allowed = sharding.replicate(
    (params0, params1, jnp.asarray(words)), mesh
  )
  return reconstruct_lib.reconstruct_sentences(
    model,
    params0,
    params1,
    starts,
    valid,
    allowed,
    length=length,
    bos_id=bos_id,
  )


def attack(
  model,
  params0,
  params1,
  ds: Dataset,
  cfg: GboardConfig,
  *,
  scales: Sequence[float] = (0.0,),
  reconstruct: bool = True,
  save_delta: Path | None = None,
  mesh=None,
) -> list[dict[str, Any]]:
  """Word recovery and sentence reconstruction on one θ1; rows per scale.

  `model` holds no parameters and compares by value: it is a static
  argument of the jitted kernels, which compile once per shape.
  """
  tok = model.tokenizer
  vocab = tok.words
  vocab_set = set(vocab[2:])
  candidates = thresholds.candidate_mask(
    tok.vocab_size, (tok.unk_id, tok.bos_id)
  )
  delta = update.bias_update(model, params0, params1)
  if save_delta is not None and io.is_primary():
    io.save_npy(save_delta, np.asarray(delta))
  center, scale = thresholds.robust_noise_scale(delta, candidates)
  row: dict[str, Any] = {
    'noise_center': float(center),
    'noise_scale': float(scale),
  }
  masks = {}
  for rule in ('zero', 'fdr', 'universal'):
    thr = thresholds.choose_threshold(
      delta, rule, q=cfg.fdr_q, candidates=candidates
    )
    masks[rule] = np.asarray(thresholds.recover_words(delta, thr, candidates))
    m = metrics_lib.word_metrics(
      [vocab[k] for k in np.flatnonzero(masks[rule])], ds.true_words, vocab_set
    )
    row.update({f'{rule}_{k}': v for k, v in dataclasses.asdict(m).items()})
    row[f'{rule}_threshold'] = float(thr)
  delta_np = np.asarray(delta)
  thr, f1 = thresholds.oracle_threshold(
    delta_np, vocab, ds.true_words, np.asarray(candidates)
  )
  row.update(oracle_threshold=thr, oracle_f1=f1)
  rows_update = update.output_rows_update(model, params0, params1)
  rows0 = update.output_rows(model, params0)
  bias0 = update.output_bias(model, params0)
  auto = np.asarray(
    _recover_words_auto(
      delta, rows_update, candidates, rows0=rows0, bias0=bias0, q=cfg.fdr_q
    )
  )
  # The same rule with the older row-residual rescue, for comparison.
  old = np.asarray(
    _recover_words_auto(delta, rows_update, candidates, q=cfg.fdr_q)
  )
  row['rescue_f1'] = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(old)], ds.true_words, vocab_set
  ).f1
  row['num_convex'] = int(
    thresholds.convexity_violations(
      delta, rows_update, rows0, bias0, candidates
    ).sum()
  )
  masks['auto'] = auto
  m = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(auto)], ds.true_words, vocab_set
  )
  row.update({f'auto_{k}': v for k, v in dataclasses.asdict(m).items()})
  row['drift_to_noise'] = float(thresholds.drift_to_noise(delta, candidates))
  row['num_rescued'] = int(
    thresholds.rescued_words(delta, rows_update, candidates).sum()
  )
  # The bias + rows (Stouffer) branch of the auto rule on its own.
  z = thresholds.stouffer_scores(delta, rows_update, candidates)
  thr = thresholds.choose_threshold(
    z, 'fdr', q=cfg.fdr_q, candidates=candidates
  )
  mask = np.asarray(thresholds.recover_words(z, thr, candidates) & (delta > 0))
  row['stouffer_f1'] = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(mask)], ds.true_words, vocab_set
  ).f1
  # The best F1 over all cuts of that score among rising biases (uses the
  # truth; tells a weak score from a weak cut).
  z_rose = np.where(np.asarray(delta) > 0, np.asarray(z), -np.inf)
  row['stouffer_oracle_f1'] = thresholds.oracle_threshold(
    z_rose, vocab, ds.true_words, np.asarray(candidates)
  )[1]
  rule = cfg.threshold_rule
  row.update(
    f1=row[f'{rule}_f1'],
    f1_upper=row[f'{rule}_f1_upper'],
    precision=row[f'{rule}_precision'],
    recall=row[f'{rule}_recall'],
  )
  if not reconstruct:
    return [row]
  words = masks[rule]
  rows = []
  if not words.any():
    for s in scales:
      rows.append(
        {
          **row,
          'scale': s,
          'num_candidates': 0,
          'levenshtein': 0.0,
          'levenshtein_recall': 0.0,
          'exact_fraction': 0.0,
          'recon_f1': 0.0,
          'num_kept': 0,
          'examples': [],
          **{
            f'levenshtein_{k}': 0.0
            for k in reconstruct_lib.KEEP_RULES + ('topn',)
          },
        }
      )
    return rows
  num_valid = int(words.sum())
  refs = ds.sentences
  for s in scales:
    p1 = params1 if s == 0 else update.scale_update(params0, params1, s)
    t0 = time.perf_counter()
    out = jax.block_until_ready(
      reconstruct_candidates(
        model,
        params0,
        p1,
        words,
        length=cfg.sentence_length,
        bos_id=tok.bos_id,
        mesh=mesh,
      )
    )
    seconds = time.perf_counter() - t0  # includes a compile per new M
    tokens, scores = sharding.to_host((out.tokens, out.scores))
    as_words = lambda idx, tokens=tokens: [
      tuple(vocab[t] for t in tokens[i, 1:]) for i in idx
    ]
    order = np.argsort(-scores, kind='stable')[:num_valid]
    keep = {'topn': order[: ds.n_k]}
    for k in reconstruct_lib.KEEP_RULES:
      keep[k] = reconstruct_lib.select_sentences(tokens, scores, words, rule=k)
    lev = {
      k: metrics_lib.best_match_ratios(as_words(v), refs)
      for k, v in keep.items()
    }
    kept_w = as_words(keep[cfg.keep_rule])
    recall_view = metrics_lib.best_match_ratios(refs, kept_w)
    rows.append(
      {
        **row,
        'scale': s,
        'num_candidates': num_valid,
        'padded_candidates': len(tokens),
        'reconstruct_seconds': seconds,
        'num_kept': len(kept_w),
        **{f'num_kept_{k}': len(v) for k, v in keep.items()},
        'levenshtein': float(lev[cfg.keep_rule].mean()) if len(kept_w) else 0.0,
        **{
          f'levenshtein_{k}': float(v.mean()) if len(v) else 0.0
          for k, v in lev.items()
        },
        'levenshtein_recall': float(recall_view.mean()),
        'exact_fraction': float((recall_view == 100.0).mean()),
        # F1 of the distinct words of the kept sentences.
        'recon_f1': metrics_lib.f1_score(
          *metrics_lib.set_precision_recall(
            (w for c in kept_w for w in c), ds.true_words
          )
        ),
        'examples': [' '.join(w) for w in kept_w[:8]],
      }
    )
  return rows


# ---------------------------------------------------------------- the run
def plan_trajectories(
  cfg: GboardConfig, ds: Dataset
) -> list[tuple[str, str, float, list[int]]]:
  """The trajectories of one dataset: `(batch, noise, sigma, epochs)`.

  E with `n_k * E > max_sentence_epochs` is skipped (E=1 never is); B >= n_k
  is full-batch training and runs once; each `dpsgd_runs` entry of this
  n_k adds one trajectory per σ, up to its max E.
  """
  epochs = [
    e for e in cfg.epochs if e == 1 or ds.n_k * e <= cfg.max_sentence_epochs
  ]
  plans, seen = [], set()
  for b in cfg.batch_sizes:
    # B >= n_k is full-batch training: run it once (Fig. 2's n_k=16, B=16).
    if _batch_size(b, ds.n_k) not in seen:
      seen.add(_batch_size(b, ds.n_k))
      plans.append((b, 'none', 0.0, epochs))
  for n_k, b, max_epochs in cfg.dpsgd_runs:
    if n_k == ds.n_k:
      for sigma in cfg.dpsgd_sigmas:
        plans.append(
          (b, 'dpsgd', sigma, [e for e in epochs if e <= max_epochs] or [1])
        )
  return plans


@dataclasses.dataclass
class GboardRun:
  """What :func:`run_gboard_experiment` leaves for the report."""

  writer: io.ExperimentWriter  # config.json, results.jsonl (every row)
  corpora: Corpora
  pretrain_info: dict[str, Any]  # from :func:`pretrain`
  model: models.Model  # θ0's model (no weights), with its tokenizer
  datasets: list[Dataset]


def run_gboard_experiment(
  cfg: GboardConfig, workdir: str | Path, *, mesh=None
) -> GboardRun:
  """Runs the whole sweep, resuming from `<workdir>/results.jsonl`.

  Every attack row goes to `results.jsonl` as it is computed; summaries,
  tables and plots are left to the caller. `mesh` (from `--mesh`, see
  :func:`leakjax.sharding.data_mesh`) places the sentence candidates on
  its data axis; it does not change any result, so it is not part of the
  config.
  """
  workdir = io.as_path(workdir)
  writer = io.ExperimentWriter(
    workdir,
    cfg,
    inputs={
      'sms': cfg.sms,
      **{f'public:{name}': path for name, path in cfg.public},
    },
  )
  corpora = load_corpora(cfg)
  logging.info('corpora: %s', corpora.counts)
  model, params0, pre_info = pretrain(cfg, corpora, workdir)
  tok = model.tokenizer
  datasets = make_datasets(cfg, corpora.pool, tok)
  key = jax.random.key(cfg.seed)
  start = time.time()
  plans = [(ds, plan_trajectories(cfg, ds)) for ds in datasets]
  counter = io.Progress(sum(len(p) for _, p in plans))
  for ds, plan in plans:
    for batch, noise, sigma, epochs in plan:
      where = dict(
        kind='attack',
        n_k=ds.n_k,
        dataset=ds.index,
        B=batch,
        noise=noise,
        sigma=sigma,
      )
      if writer.done(**where, E=epochs[-1]):
        counter.skipped()
        continue
      t0 = time.time()
      name = f'n{ds.n_k}_d{ds.index}_B{batch}_{noise}_{sigma:g}'
      tkey = jax.random.fold_in(key, zlib.crc32(name.encode()) % (1 << 30))
      for e, params1 in snapshots(
        model,
        params0,
        ds.ids,
        cfg,
        batch=batch,
        step_noise=sigma if noise == 'dpsgd' else 0.0,
        epochs=epochs,
        key=tkey,
        folder=workdir / 'snapshots',
        name=name,
      ):
        fedsgd = e == 1 and _batch_size(batch, ds.n_k) is None
        scales = cfg.scales if (fedsgd and noise == 'none') else (0.0,)
        delta_file = (
          workdir / 'deltas' / f'{name}_E{e}.npy' if noise == 'dpsgd' else None
        )
        for r in attack(
          model,
          params0,
          params1,
          ds,
          cfg,
          scales=scales,
          save_delta=delta_file,
          mesh=mesh,
        ):
          writer.add_result({**where, 'E': e, **r})
        if noise == 'none':
          for i, s in enumerate(cfg.single_sigmas):
            noisy = jax.tree.map(
              jnp.add,
              params1,
              defenses_lib.gaussian_noise_like(
                params1, s, key=jax.random.fold_in(tkey, 1000 * e + i)
              ),
            )
            for r in attack(model, params0, noisy, ds, cfg, mesh=mesh):
              writer.add_result(
                {**where, 'noise': 'single', 'sigma': s, 'E': e, **r}
              )
      counter.computed()
      logging.info(
        '[%s] n_k=%d d=%d B=%s %s σ=%g: E=%s in %.0fs (total %.0fs)',
        counter.describe(),
        ds.n_k,
        ds.index,
        batch,
        noise,
        sigma,
        epochs,
        time.time() - t0,
        time.time() - start,
      )
  return GboardRun(
    writer=writer,
    corpora=corpora,
    pretrain_info=pre_info,
    model=model,
    datasets=datasets,
  )
