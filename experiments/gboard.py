r"""GBoard next-word-prediction attack (Suliman & Leith) on real SMS messages.

End to end, without the oracles of the authors' code (the word threshold
and the number of sentences are chosen without the true text):

1. θ0: the GBoard-shaped CIFG-LSTM (V=9502, D=96, 670 units, projection,
   tied embeddings, output bias; Sec. 2.3) pre-trained on public text:
   SMS messages that are not client data (ham and spam), WikiText-2
   sentences and Enron sentences. Trained once, cached in
   `<workdir>/pretrain` (a re-run resumes or reuses it).
2. Client data: 4-word sentences of real SMS `ham` messages (Sec. 4.1),
   from a pool whose messages are kept out of pre-training; datasets of n_k
   sentences, `<S>` prepended.
3. Client updates with :func:`leakjax.fl.client_update`, SGD η = 0.001
   (Sec. 4.1): B ∈ {full, 32}; every epoch is one call, and θ1 is attacked
   after E ∈ {1, 50, 100, 1000} epochs of one trajectory (E=1, B=full is
   FedSGD). Local DP: DPSGD-like noise (Algorithm 3) on its own
   trajectories; single noise (Algorithm 4) added to the noise-free θ1.
4. Attacks (:mod:`leakjax.attacks.gboard`): word recovery with Algorithm 2
   (threshold 0), the no-oracle threshold rule and the oracle threshold;
   sentence reconstruction (Sec. 3.2) from the rule's words, FedSGD scaling
   (Sec. 4.3.2), ranking by relative perplexity change, and the number of
   sentences chosen by the 'cover' rule (also reported: top-n_k).

  python -m experiments.gboard --flagfile=experiments/configs/gboard_sms.flags
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
from absl import flags, logging

from experiments import common
from leakjax import data as data_lib
from leakjax import fl, io, models, sharding
from leakjax import train as train_lib
from leakjax.attacks import gboard
from leakjax.errors import LeakjaxError
from leakjax.fl import defenses as defenses_lib
from leakjax.models import lstm
from leakjax.tokenization import WordTokenizer, split_words

FLAGS = flags.FLAGS
NOISES = ('none', 'dpsgd', 'single')
SMS_DEFAULT = '../shared/data/sms_spam/SMSSpamCollection.tsv'
PUBLIC_DEFAULT = (
  'wikitext=../shared/data/wikitext-2/valid.txt,'
  'enron=../shared/data/enron_film/dataset.json'
)


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
  """The experiment's own flags (common ones: experiments.common)."""
  d = dict(flag_values=fv)
  flags.DEFINE_string(
    'sms',
    SMS_DEFAULT,
    'UCI SMS Spam Collection .tsv:'
    ' client data (ham) and public pre-training text.',
    **d,
  )
  flags.DEFINE_string(
    'public',
    PUBLIC_DEFAULT,
    'name=path,... more public pre-training corpora'
    ' (WikiText paragraphs are split into sentences).',
    **d,
  )
  flags.DEFINE_integer(
    'public_limit', 12000, 'Sentences kept per extra public corpus.', **d
  )
  flags.DEFINE_integer(
    'vocab_size', 9502, 'V incl. <UNK>, <S> (Sec. 2.3).', **d
  )
  flags.DEFINE_integer('embed_dim', 96, 'D (Sec. 2.3).', **d)
  flags.DEFINE_integer('units', 670, 'CIFG units (Sec. 2.3).', **d)
  flags.DEFINE_integer('pretrain_steps', 1500, 'Adam steps for θ0.', **d)
  flags.DEFINE_integer('pretrain_batch_size', 64, 'Sentences per step.', **d)
  flags.DEFINE_float('pretrain_lr', 3e-3, 'Peak Adam learning rate.', **d)
  flags.DEFINE_integer(
    'pretrain_max_length',
    24,
    'Words per pre-training sentence (<S> included).',
    **d,
  )
  flags.DEFINE_integer(
    'pretrain_eval', 800, 'Held-out public sentences for the perplexity.', **d
  )
  flags.DEFINE_integer(
    'sentence_length', 4, 'Words per client sentence (Sec. 4.1: 4).', **d
  )
  flags.DEFINE_integer(
    'client_pool',
    400,
    'Distinct client sentences; their messages are kept out of pre-training.',
    **d,
  )
  flags.DEFINE_list(
    'num_sentences',
    ['16', '32', '64', '128', '256'],
    'Dataset sizes n_k (Sec. 4.1).',
    **d,
  )
  flags.DEFINE_integer('num_datasets', 1, 'Datasets per n_k.', **d)
  flags.DEFINE_list(
    'epochs',
    ['1', '50', '100', '1000'],
    'E at which θ1 is attacked (one trajectory).',
    **d,
  )
  flags.DEFINE_list('batch_sizes', ['full', '32'], 'B; full = n_k.', **d)
  flags.DEFINE_integer(
    'max_sentence_epochs',
    70000,
    'Skip E with n_k * E above this (compute budget).',
    **d,
  )
  flags.DEFINE_float('learning_rate', 1e-3, 'Client SGD η (Sec. 4.1).', **d)
  flags.DEFINE_enum(
    'loss',
    'sentence_sum',
    ['sentence_sum', 'token_mean', 'batch_sum'],
    'Client loss: per-sentence sum over words (Sec. 3.1)'
    ' averaged over the batch, the token mean of'
    ' fl.client_update, or the sum over words and batch'
    ' (a Keras reduction=SUM; Table 1 cannot tell it from'
    ' sentence_sum, B = 1 there).',
    **d,
  )
  flags.DEFINE_list(
    'dpsgd_sigmas',
    ['0.001', '0.01', '0.1'],
    'σ of DPSGD-like noise (Algorithm 3).',
    **d,
  )
  flags.DEFINE_list(
    'dpsgd_runs',
    ['16:full', '64:32:100'],
    'n_k:B[:max E] of the DPSGD-like trajectories.',
    **d,
  )
  flags.DEFINE_list(
    'single_sigmas',
    ['1e-5', '1e-4', '1e-3', '1e-2'],
    'σ of single noise on θ1 (Algorithm 4).',
    **d,
  )
  flags.DEFINE_list(
    'scales',
    ['0', '10', '100', '1000'],
    'FedSGD scaling s of θ1 + s(θ1 − θ0) (Sec. 4.3.2).',
    **d,
  )
  flags.DEFINE_enum(
    'threshold_rule',
    'auto',
    ['auto', 'fdr', 'universal', 'zero'],
    'No-oracle word recovery: auto = gboard.'
    'recover_words_auto (bias + rows), else the bias'
    ' threshold of gboard.choose_threshold.',
    **d,
  )
  flags.DEFINE_float('fdr_q', 0.05, 'Level of the fdr rule.', **d)
  flags.DEFINE_enum(
    'keep_rule',
    'cover',
    list(gboard.KEEP_RULES),
    'How many reconstructions to keep without n_k.',
    **d,
  )


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything that determines the results (written to config.json)."""

  sms: str
  public: tuple[tuple[str, str], ...]
  public_limit: int
  vocab_size: int
  embed_dim: int
  units: int
  pretrain_steps: int
  pretrain_batch_size: int
  pretrain_lr: float
  pretrain_max_length: int
  pretrain_eval: int
  sentence_length: int
  client_pool: int
  num_sentences: tuple[int, ...]
  num_datasets: int
  epochs: tuple[int, ...]
  batch_sizes: tuple[str, ...]
  max_sentence_epochs: int
  learning_rate: float
  loss: str
  dpsgd_sigmas: tuple[float, ...]
  dpsgd_runs: tuple[tuple[int, str, int], ...]
  single_sigmas: tuple[float, ...]
  scales: tuple[float, ...]
  threshold_rule: str
  fdr_q: float
  keep_rule: str
  seed: int

  def __post_init__(self):
    for b in self.batch_sizes + tuple(r[1] for r in self.dpsgd_runs):
      if b != 'full' and not (b.isdigit() and int(b) > 0):
        raise LeakjaxError(
          f'batch size {b!r} is neither "full" nor a positive int',
          'pass e.g. --batch_sizes=full,32',
        )
    if not self.epochs or min(self.epochs) < 1:
      raise LeakjaxError(f'--epochs={self.epochs} must be >= 1')
    if max(self.num_sentences) > self.client_pool:
      raise LeakjaxError(
        f'n_k={max(self.num_sentences)} is more than the'
        f' client pool ({self.client_pool})',
        'raise --client_pool',
      )
    if self.sentence_length < 2:
      raise LeakjaxError('--sentence_length must be >= 2')


def _ints(values, name) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise LeakjaxError(f'--{name}={values} must be integers') from None


def _floats(values, name) -> tuple[float, ...]:
  try:
    return tuple(float(v) for v in values)
  except ValueError:
    raise LeakjaxError(f'--{name}={values} must be numbers') from None


def _parse_named(spec: str) -> tuple[tuple[str, str], ...]:
  out = []
  for part in filter(None, (p.strip() for p in spec.split(','))):
    if '=' not in part:
      raise LeakjaxError(f'--public entry {part!r} is not name=path')
    name, path = part.split('=', 1)
    out.append((name.strip(), path.strip()))
  return tuple(out)


def _parse_runs(values) -> tuple[tuple[int, str, int], ...]:
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


def config_from_flags(fv: flags.FlagValues = FLAGS) -> Config:
  """Builds the frozen config from parsed flags."""
  return Config(
    sms=fv.sms,
    public=_parse_named(fv.public),
    public_limit=fv.public_limit,
    vocab_size=fv.vocab_size,
    embed_dim=fv.embed_dim,
    units=fv.units,
    pretrain_steps=fv.pretrain_steps,
    pretrain_batch_size=fv.pretrain_batch_size,
    pretrain_lr=fv.pretrain_lr,
    pretrain_max_length=fv.pretrain_max_length,
    pretrain_eval=fv.pretrain_eval,
    sentence_length=fv.sentence_length,
    client_pool=fv.client_pool,
    num_sentences=_ints(fv.num_sentences, 'num_sentences'),
    num_datasets=fv.num_datasets,
    epochs=tuple(sorted(set(_ints(fv.epochs, 'epochs')))),
    batch_sizes=tuple(fv.batch_sizes),
    max_sentence_epochs=fv.max_sentence_epochs,
    learning_rate=fv.learning_rate,
    loss=fv.loss,
    dpsgd_sigmas=_floats(fv.dpsgd_sigmas, 'dpsgd_sigmas'),
    dpsgd_runs=_parse_runs(fv.dpsgd_runs),
    single_sigmas=_floats(fv.single_sigmas, 'single_sigmas'),
    scales=_floats(fv.scales, 'scales'),
    threshold_rule=fv.threshold_rule,
    fdr_q=fv.fdr_q,
    keep_rule=fv.keep_rule,
    seed=fv.seed,
  )


# -------------------------------------------------------------------- data
def _split(text: str) -> tuple[str, ...]:
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
  sentences = [s for s in sentences if len(_split(s)) >= 2]
  if not sentences:
    raise LeakjaxError(f'public corpus {name} ({path}) has no sentences')
  if len(sentences) > limit:
    keep = rng.choice(len(sentences), limit, replace=False)
    sentences = [sentences[i] for i in sorted(keep)]
  return sentences


def load_corpora(cfg: Config) -> Corpora:
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
      w = _split(s)
      if len(w) == cfg.sentence_length:
        by_sentence.setdefault(w, []).append(m)
  distinct = sorted(by_sentence)
  if len(distinct) < cfg.client_pool:
    raise LeakjaxError(
      f'{cfg.sms} has {len(distinct)} distinct {cfg.sentence_length}-word'
      f' ham sentences, fewer than --client_pool={cfg.client_pool}',
      'lower --client_pool',
    )
  pick = rng.permutation(len(distinct))[: cfg.client_pool]
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
    s for s in sms_public if len(_split(s)) >= 2 and _split(s) not in pool_set
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
    extra.extend(s for s in sents if _split(s) not in pool_set)
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
def pretrain(cfg: Config, corpora: Corpora, workdir: Path):
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
    io.atomic_write_text(timing, json.dumps({'seconds': seconds}))
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


def make_datasets(cfg: Config, pool, tokenizer) -> list[Dataset]:
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
  cfg: Config,
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
      client = gboard.client_config(
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
  cfg: Config,
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
  files = [folder / f'{name}_E{e}.npz' for e in epochs]
  if all(f.exists() for f in files):
    for e, f in zip(epochs, files):
      yield e, gboard.load_snapshot(f, params0)
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
    gboard.save_snapshot(f, params1)
    yield e, params1


# ----------------------------------------------------------------- attacks
@functools.partial(jax.jit, static_argnames=('q',))
def _recover_words_auto(delta, rows, candidates, rows0=None, bias0=None, *, q):
  """:func:`gboard.recover_words_auto`, jitted: its EM loop compiles once
  (twice: with and without θ0's rows), not per update."""
  return gboard.recover_words_auto(
    delta, rows, candidates, rows0=rows0, bias0=bias0, q=q
  )


make_mesh = sharding.data_mesh  # `--mesh`; kept as this module's name


def reconstruct_candidates(
  model,
  params0,
  params1,
  words: np.ndarray,
  *,
  length: int,
  bos_id: int,
  mesh=None,
) -> gboard.Reconstruction:
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
  starts, valid = gboard.padded_indices(words, size=-(-slots // n) * n)
  starts, valid = sharding.shard_batch(
    (jnp.asarray(starts), jnp.asarray(valid)), mesh
  )
  params0, params1, allowed = sharding.replicate(
    (params0, params1, jnp.asarray(words)), mesh
  )
  return gboard.reconstruct_sentences(
    model,
    params0,
    params1,
    starts,
    valid,
    allowed,
    length=length,
    bos_id=bos_id,
  )


def _token_f1(cands: Sequence[Sequence[str]], true_words: set[str]) -> float:
  words = {w for c in cands for w in c}
  hits = len(words & true_words)
  if not hits:
    return 0.0
  p, r = hits / len(words), hits / len(true_words)
  return 2 * p * r / (p + r)


def attack(
  model,
  params0,
  params1,
  ds: Dataset,
  cfg: Config,
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
  candidates = gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  delta = gboard.bias_update(model, params0, params1)
  if save_delta is not None:
    save_delta.parent.mkdir(parents=True, exist_ok=True)
    np.save(save_delta, np.asarray(delta))
  center, scale = gboard.robust_noise_scale(delta, candidates)
  row: dict[str, Any] = {
    'noise_center': float(center),
    'noise_scale': float(scale),
  }
  masks = {}
  for rule in ('zero', 'fdr', 'universal'):
    thr = gboard.choose_threshold(
      delta, rule, q=cfg.fdr_q, candidates=candidates
    )
    masks[rule] = np.asarray(gboard.recover_words(delta, thr, candidates))
    m = gboard.word_metrics(
      [vocab[k] for k in np.flatnonzero(masks[rule])], ds.true_words, vocab_set
    )
    row.update({f'{rule}_{k}': v for k, v in dataclasses.asdict(m).items()})
    row[f'{rule}_threshold'] = float(thr)
  delta_np = np.asarray(delta)
  thr, f1 = gboard.oracle_threshold(
    delta_np, vocab, ds.true_words, np.asarray(candidates)
  )
  row.update(oracle_threshold=thr, oracle_f1=f1)
  rows_update = gboard.output_rows_update(model, params0, params1)
  rows0 = gboard.output_rows(model, params0)
  bias0 = gboard.output_bias(model, params0)
  auto = np.asarray(
    _recover_words_auto(
      delta, rows_update, candidates, rows0=rows0, bias0=bias0, q=cfg.fdr_q
    )
  )
  # The same rule with the older row-residual rescue, for comparison.
  old = np.asarray(
    _recover_words_auto(delta, rows_update, candidates, q=cfg.fdr_q)
  )
  row['rescue_f1'] = gboard.word_metrics(
    [vocab[k] for k in np.flatnonzero(old)], ds.true_words, vocab_set
  ).f1
  row['num_convex'] = int(
    gboard.convexity_violations(
      delta, rows_update, rows0, bias0, candidates
    ).sum()
  )
  masks['auto'] = auto
  m = gboard.word_metrics(
    [vocab[k] for k in np.flatnonzero(auto)], ds.true_words, vocab_set
  )
  row.update({f'auto_{k}': v for k, v in dataclasses.asdict(m).items()})
  row['drift_to_noise'] = float(gboard.drift_to_noise(delta, candidates))
  row['num_rescued'] = int(
    gboard.rescued_words(delta, rows_update, candidates).sum()
  )
  # The bias + rows (Stouffer) branch of the auto rule on its own.
  z = gboard.stouffer_scores(delta, rows_update, candidates)
  thr = gboard.choose_threshold(z, 'fdr', q=cfg.fdr_q, candidates=candidates)
  mask = np.asarray(gboard.recover_words(z, thr, candidates) & (delta > 0))
  row['stouffer_f1'] = gboard.word_metrics(
    [vocab[k] for k in np.flatnonzero(mask)], ds.true_words, vocab_set
  ).f1
  # The best F1 over all cuts of that score among rising biases (uses the
  # truth; tells a weak score from a weak cut).
  z_rose = np.where(np.asarray(delta) > 0, np.asarray(z), -np.inf)
  row['stouffer_oracle_f1'] = gboard.oracle_threshold(
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
          **{f'levenshtein_{k}': 0.0 for k in gboard.KEEP_RULES + ('topn',)},
        }
      )
    return rows
  num_valid = int(words.sum())
  refs = ds.sentences
  for s in scales:
    p1 = params1 if s == 0 else gboard.scale_update(params0, params1, s)
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
    tokens, scores = np.asarray(out.tokens), np.asarray(out.scores)
    as_words = lambda idx, tokens=tokens: [
      tuple(vocab[t] for t in tokens[i, 1:]) for i in idx
    ]
    order = np.argsort(-scores, kind='stable')[:num_valid]
    keep = {'topn': order[: ds.n_k]}
    for k in gboard.KEEP_RULES:
      keep[k] = gboard.select_sentences(tokens, scores, words, rule=k)
    lev = {
      k: gboard.best_match_ratios(as_words(v), refs) for k, v in keep.items()
    }
    kept_w = as_words(keep[cfg.keep_rule])
    recall_view = gboard.best_match_ratios(refs, kept_w)
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
        'recon_f1': _token_f1(kept_w, ds.true_words),
        'examples': [' '.join(w) for w in kept_w[:8]],
      }
    )
  return rows


# ---------------------------------------------------------------- the run
def _plan(cfg: Config, ds: Dataset):
  """The trajectories of one dataset: (batch, noise, sigma, epochs)."""
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


def run_experiment(
  cfg: Config, workdir: str | Path, *, mesh=None
) -> dict[str, float]:
  """Runs the whole sweep (resuming from `results.jsonl`); returns summary.

  `mesh` (from `--mesh`, see :func:`make_mesh`) places the sentence
  candidates on its data axis; it does not change any result, so it is
  not part of the config.
  """
  workdir = Path(workdir)
  writer = io.ExperimentWriter(workdir, cfg)
  corpora = load_corpora(cfg)
  logging.info('corpora: %s', corpora.counts)
  model, params0, pre_info = pretrain(cfg, corpora, workdir)
  tok = model.tokenizer
  datasets = make_datasets(cfg, corpora.pool, tok)
  key = jax.random.key(cfg.seed)
  start = time.time()
  for ds in datasets:
    for batch, noise, sigma, epochs in _plan(cfg, ds):
      where = dict(
        kind='attack',
        n_k=ds.n_k,
        dataset=ds.index,
        B=batch,
        noise=noise,
        sigma=sigma,
      )
      if writer.done(**where, E=epochs[-1]):
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
      logging.info(
        'n_k=%d d=%d B=%s %s σ=%g: E=%s in %.0fs (total %.0fs)',
        ds.n_k,
        ds.index,
        batch,
        noise,
        sigma,
        epochs,
        time.time() - t0,
        time.time() - start,
      )
  summary = summarize(writer.results, pre_info, cfg)
  md = render_markdown(cfg, summary, writer, corpora, pre_info, model, datasets)
  writer.write_summary(summary, md)
  return summary


# ----------------------------------------------------------------- summary
_MEANS = (
  'f1',
  'f1_upper',
  'precision',
  'recall',
  'zero_f1',
  'universal_f1',
  'fdr_f1',
  'auto_f1',
  'oracle_f1',
  'stouffer_f1',
  'rescue_f1',
  'num_convex',
  'num_rescued',
  'drift_to_noise',
  'auto_num_recovered',
  'coverage',
  'levenshtein',
  'levenshtein_topn',
  'levenshtein_cover',
  'levenshtein_words',
  'levenshtein_gap',
  'levenshtein_recall',
  'recon_f1',
  'num_kept',
  'exact_fraction',
  'zero_num_recovered',
  'fdr_num_recovered',
)
_SUMMARY_NAMES = {'coverage': 'vocab_coverage'}


def _group_key(r) -> tuple:
  return (r['B'], r['E'], r['n_k'], r['noise'], r['sigma'], r.get('scale', 0.0))


def summarize(results, pre_info, cfg: Config) -> dict[str, float]:
  """Means over datasets, keyed `metric@B=..,E=..,n_k=..,noise=..,sigma=..`.

  A full-batch run with n_k <= B is also reported under that B (it is the
  same training: Fig. 2b's n_k=16 with B=16).
  """
  groups: dict[tuple, list] = {}
  for r in results:
    if r.get('kind') != 'attack':
      continue
    groups.setdefault(_group_key(r), []).append(r)
    if r['B'] == 'full':
      for b in cfg.batch_sizes:
        if b != 'full' and int(b) >= r['n_k']:
          groups.setdefault(_group_key({**r, 'B': b}), []).append(r)
  summary: dict[str, float] = {
    'theta0_eval_perplexity': float(pre_info['eval_perplexity']),
    'theta0_sms_perplexity': float(pre_info['sms_eval_perplexity']),
  }
  for (b, e, n_k, noise, sigma, scale), rows in sorted(
    groups.items(), key=lambda kv: str(kv[0])
  ):
    params = dict(B=b, E=e, n_k=n_k, noise=noise, sigma=sigma)
    if scale:
      params['scale'] = scale
    for m in _MEANS:
      vals = [r[m] for r in rows if m in r and r[m] is not None]
      if vals and (
        not scale or m.startswith(('lev', 'recon', 'num_kept', 'exact'))
      ):  # noqa: E127
        summary[io.summary_key(_SUMMARY_NAMES.get(m, m), **params)] = float(
          np.mean(vals)
        )
  return summary


def _is_alias(b: str, n_k: int) -> bool:
  """B >= n_k: the full-batch run, listed once in the tables."""
  return b != 'full' and int(b) >= n_k


def _get(summary, metric, **params):
  return summary.get(io.summary_key(metric, **params), math.nan)


def render_markdown(
  cfg: Config, summary, writer, corpora, pre_info, model, datasets
) -> str:
  res = [r for r in writer.results if r.get('kind') == 'attack']
  counts = ', '.join(f'{k}: {v:,}' for k, v in corpora.counts.items())
  lines = [
    '# GBoard next-word-prediction attack (Suliman & Leith) on SMS',
    '',
    f'θ0: CIFG-LSTM V={cfg.vocab_size}, D={cfg.embed_dim},'
    f' {cfg.units} units ({pre_info["num_params"]:,} parameters), Adam'
    f' {pre_info["steps"]} steps ({pre_info["seconds"] / 60:.0f} min)'
    f' on {pre_info["train_sentences"]:,}'
    f' public sentences ({counts}).'
    f' Held-out perplexity {pre_info["eval_perplexity"]:.1f} (public'
    f' mix), {pre_info["sms_eval_perplexity"]:.1f} (public SMS).',
    '',
    f'Client: {cfg.sentence_length}-word SMS ham sentences, SGD'
    f' η={cfg.learning_rate}, loss `{cfg.loss}`; no-oracle threshold'
    f' rule `{cfg.threshold_rule}` (q={cfg.fdr_q}), keep rule'
    f' `{cfg.keep_rule}`.',
    '',
  ]
  # Word recovery table (noise-free).
  rows = []
  for b in cfg.batch_sizes:
    for e in cfg.epochs:
      for n_k in cfg.num_sentences:
        if _is_alias(b, n_k):
          continue
        p = dict(B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        f1 = _get(summary, 'f1', **p)
        if math.isnan(f1):
          continue
        up = _get(summary, 'f1_upper', **p)
        rows.append(
          [
            b,
            e,
            n_k,
            _get(summary, 'zero_f1', **p),
            _get(summary, 'fdr_f1', **p),
            _get(summary, 'rescue_f1', **p),
            _get(summary, 'num_convex', **p),
            f1,
            _get(summary, 'oracle_f1', **p),
            up,
            f1 / up,
            _get(summary, 'recon_f1', **p),
            _get(summary, 'levenshtein_cover', **p),
            _get(summary, 'levenshtein_words', **p),
            _get(summary, 'levenshtein_gap', **p),
            _get(summary, 'levenshtein_topn', **p),
            _get(summary, 'levenshtein_recall', **p),
            _get(summary, 'num_kept', **p),
          ]
        )
  lines += [
    '## Word recovery and reconstruction, no noise (Figs. 2, 3)',
    '',
    'F1 over distinct words ("rule" = the no-oracle rule'
    f' `{cfg.threshold_rule}`; "bias fdr" = the bias threshold'
    ' alone; "old" = the rule with the row-residual rescue instead'
    ' of the convexity test; "convex flags" = words whose bias fell'
    ' that the convexity test adds; B >= n_k is listed only as'
    ' B=full); "upper" = F1 of'
    ' returning exactly the'
    ' true in-vocabulary words. Lev. = mean over kept'
    ' reconstructions of the best word-level Levenshtein ratio'
    ' against the true sentences (Sec. 4.2), for each keep rule;'
    ' "recall" = mean over true sentences of their best kept'
    ' reconstruction; "recon F1" = word F1 of the kept'
    f' reconstructions ({cfg.keep_rule} rule, Fig. 3 x-axis).',
    '',
    io.markdown_table(
      [
        'B',
        'E',
        'n_k',
        'F1 Alg.2',
        'F1 bias fdr',
        'F1 bias+row rescue (old)',
        'convex flags',
        'F1 rule',
        'F1 oracle bias cut',
        'F1 upper',
        'rule/upper',
        'recon F1',
        'Lev. cover',
        'Lev. words',
        'Lev. gap',
        'Lev. top-n_k',
        'Lev. recall',
        'kept',
      ],
      rows,
    ),
  ]
  # Scaling.
  rows = []
  for n_k in cfg.num_sentences:
    vals = [
      _get(
        summary,
        'levenshtein',
        B='full',
        E=1,
        n_k=n_k,
        noise='none',
        sigma=0.0,
        **({'scale': s} if s else {}),
      )
      for s in cfg.scales
    ]
    rows.append([n_k] + vals)
  lines += [
    '## FedSGD with scaling θ1 + s(θ1 − θ0) (Sec. 4.3.2, Fig. 4)',
    '',
    io.markdown_table(['n_k'] + [f's={s:g}' for s in cfg.scales], rows),
  ]
  # DP.
  rows = []
  for noise, sigmas in (
    ('dpsgd', cfg.dpsgd_sigmas),
    ('single', cfg.single_sigmas),
  ):
    for b in cfg.batch_sizes:
      for e in cfg.epochs:
        for n_k in cfg.num_sentences:
          for s in sigmas:
            p = dict(B=b, E=e, n_k=n_k, noise=noise, sigma=s)
            f1 = _get(summary, 'f1', **p)
            if math.isnan(f1) or _is_alias(b, n_k):
              continue
            up = _get(summary, 'f1_upper', **p)
            rows.append(
              [
                noise,
                f'{s:g}',
                b,
                e,
                n_k,
                _get(summary, 'zero_f1', **p),
                _get(summary, 'fdr_f1', **p),
                _get(summary, 'stouffer_f1', **p),
                f1,
                _get(summary, 'oracle_f1', **p),
                f1 / up,
                _get(summary, 'levenshtein', **p),
              ]
            )
  lines += [
    '## Local DP (Sec. 6, Figs. 5-7)',
    '',
    io.markdown_table(
      [
        'noise',
        'σ',
        'B',
        'E',
        'n_k',
        'F1 Alg.2',
        'F1 bias fdr',
        'F1 bias+rows',
        'F1 rule',
        'F1 oracle bias cut',
        'rule/upper',
        'Lev. (kept)',
      ],
      rows,
    ),
  ]
  plots = make_plots(cfg, summary, writer, res, model, datasets)
  lines += ['## Plots', ''] + [f'![{p}]({p})' for p in plots]
  # Examples.
  ex = [
    r
    for r in res
    if r['noise'] == 'none'
    and r['E'] == max(r2['E'] for r2 in res)
    and r.get('examples')
  ]
  if ex:
    r = ex[0]
    lines += [
      '',
      f'## Example reconstructions (n_k={r["n_k"]}, B={r["B"]},'
      f' E={r["E"]}, top of the ranking)',
      '',
    ]
    lines += [f'- {t}' for t in r['examples']]
  return '\n'.join(lines) + '\n'


def make_plots(cfg, summary, writer, res, model, datasets):
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  names = []
  colors = {
    n: plt.cm.viridis(i / max(len(cfg.num_sentences) - 1, 1))
    for i, n in enumerate(cfg.num_sentences)
  }
  # Fig. 2: F1 vs E, per B.
  fig, axes = plt.subplots(
    1,
    len(cfg.batch_sizes),
    figsize=(5 * len(cfg.batch_sizes), 3.6),
    squeeze=False,
  )
  for ax, b in zip(axes[0], cfg.batch_sizes):
    for n_k in cfg.num_sentences:
      es = [
        e
        for e in cfg.epochs
        if not math.isnan(
          _get(summary, 'f1', B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        )
      ]
      if not es:
        continue
      f1 = [
        _get(summary, 'f1', B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        for e in es
      ]
      up = [
        _get(summary, 'f1_upper', B=b, E=e, n_k=n_k, noise='none', sigma=0.0)
        for e in es
      ]
      ax.plot(es, f1, 'o-', color=colors[n_k], label=f'n_k={n_k}')
      ax.plot(es, up, '--', color=colors[n_k], alpha=0.5)
    ax.set_xscale('log')
    ax.set_ylim(0, 1.02)
    ax.set_xlabel('local epochs E')
    ax.set_ylabel('word F1 (no oracle)')
    ax.set_title(f'B={b} (dashed: F1 upper bound)')
    ax.legend(fontsize=7)
  names.append(writer.save_figure(fig, 'fig2_word_recovery.png'))
  plt.close(fig)
  # Fig. 3: Levenshtein vs reconstruction F1 per E.
  es = [e for e in cfg.epochs if e > 1] or list(cfg.epochs)
  fig, axes = plt.subplots(
    1, len(es), figsize=(4 * len(es), 3.6), squeeze=False
  )
  for ax, e in zip(axes[0], es):
    for r in res:
      if (
        r['E'] == e
        and r['noise'] == 'none'
        and r.get('scale', 0) == 0
        and 'levenshtein' in r
      ):
        ax.scatter(
          r['recon_f1'],
          r['levenshtein'],
          color=colors[r['n_k']],
          marker='o' if r['B'] == 'full' else 's',
          s=30,
        )
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 102)
    ax.set_xlabel('F1 of reconstructed tokens')
    ax.set_ylabel('mean Levenshtein ratio')
    ax.set_title(f'E={e} (o: B=full, s: B=32)')
  for n_k in cfg.num_sentences:
    axes[0][0].scatter([], [], color=colors[n_k], label=f'n_k={n_k}')
  axes[0][0].legend(fontsize=7)
  names.append(writer.save_figure(fig, 'fig3_sentence_reconstruction.png'))
  plt.close(fig)
  # Fig. 4: FedSGD scaling.
  fig, ax = plt.subplots(figsize=(5, 3.6))
  for n_k in cfg.num_sentences:
    vals = [
      _get(
        summary,
        'levenshtein',
        B='full',
        E=1,
        n_k=n_k,
        noise='none',
        sigma=0.0,
        **({'scale': s} if s else {}),
      )
      for s in cfg.scales
    ]
    ax.plot(
      [max(s, 0.1) for s in cfg.scales],
      vals,
      'o-',
      color=colors[n_k],
      label=f'n_k={n_k}',
    )
  ax.set_xscale('log')
  ax.set_xlabel('scale s (0 plotted at 0.1)')
  ax.set_ylabel('mean Levenshtein ratio')
  ax.set_title('FedSGD reconstruction with scaling')
  ax.legend(fontsize=7)
  names.append(writer.save_figure(fig, 'fig4_fedsgd_scaling.png'))
  plt.close(fig)
  # Fig. 5: DPSGD-like: Alg. 2 vs rule, and sorted magnitudes.
  dp = [r for r in res if r['noise'] == 'dpsgd']
  if dp:
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
    for col, metric, title in (
      (0, 'zero_f1', '(a) Algorithm 2 (cut 0)'),
      (2, 'f1', '(c) no-oracle threshold'),
    ):
      ax = axes[col]
      for b, n_k in sorted({(r['B'], r['n_k']) for r in dp}):
        for e in sorted({r['E'] for r in dp}):
          xs = [
            s
            for s in cfg.dpsgd_sigmas
            if not math.isnan(
              _get(summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s)
            )
          ]
          if xs:
            ax.plot(
              xs,
              [
                _get(summary, metric, B=b, E=e, n_k=n_k, noise='dpsgd', sigma=s)
                for s in xs
              ],
              'o-',
              label=f'B={b} n_k={n_k} E={e}',
            )
      ax.set_xscale('log')
      ax.set_ylim(0, 1.02)
      ax.set_xlabel('σ (DPSGD-like)')
      ax.set_ylabel('word F1')
      ax.set_title(title)
      ax.legend(fontsize=6)
    _magnitude_plot(axes[1], cfg, model, datasets, writer.workdir)
    names.append(writer.save_figure(fig, 'fig5_dpsgd_threshold.png'))
    plt.close(fig)
  # Fig. 6: both local DP methods, F1 (rule) vs σ.
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, noise, sigmas in (
    (axes[0], 'dpsgd', cfg.dpsgd_sigmas),
    (axes[1], 'single', cfg.single_sigmas),
  ):
    keys = sorted(
      {(r['B'], r['n_k'], r['E']) for r in res if r['noise'] == noise}
    )
    for b, n_k, e in keys:
      ys = [
        _get(summary, 'f1', B=b, E=e, n_k=n_k, noise=noise, sigma=s)
        for s in sigmas
      ]
      ax.plot(sigmas, ys, 'o-', label=f'B={b} n_k={n_k} E={e}')
    ax.set_xscale('log')
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f'σ ({noise})')
    ax.set_ylabel('word F1 (no oracle)')
    ax.legend(fontsize=5, ncol=2)
  names.append(writer.save_figure(fig, 'fig6_local_dp_words.png'))
  plt.close(fig)
  # Fig. 7: reconstruction under local DP.
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, noise, sigmas in (
    (axes[0], 'dpsgd', cfg.dpsgd_sigmas),
    (axes[1], 'single', cfg.single_sigmas),
  ):
    keys = sorted(
      {
        (r['B'], r['n_k'], r['E'])
        for r in res
        if r['noise'] == noise and r['E'] > 1
      }
    )
    for b, n_k, e in keys:
      ys = [
        _get(summary, 'levenshtein', B=b, E=e, n_k=n_k, noise=noise, sigma=s)
        for s in sigmas
      ]
      ax.plot(sigmas, ys, 'o-', label=f'B={b} n_k={n_k} E={e}')
    ax.set_xscale('log')
    ax.set_ylim(0, 102)
    ax.set_xlabel(f'σ ({noise})')
    ax.set_ylabel('mean Levenshtein ratio')
    ax.legend(fontsize=5, ncol=2)
  names.append(writer.save_figure(fig, 'fig7_local_dp_sentences.png'))
  plt.close(fig)
  return names


def _magnitude_plot(ax, cfg, model, datasets, workdir: Path):
  """Fig. 5b: sorted positive bias updates, typed vs not, one DPSGD run."""
  if not cfg.dpsgd_runs or not cfg.dpsgd_sigmas:
    return
  n_k, b, _ = max(cfg.dpsgd_runs)
  ds = next((d for d in datasets if d.n_k == n_k), None)
  sigma = sorted(cfg.dpsgd_sigmas)[len(cfg.dpsgd_sigmas) // 2]
  files = sorted(
    (workdir / 'deltas').glob(f'n{n_k}_d0_B{b}_dpsgd_{sigma:g}_E*.npy'),
    key=lambda f: int(f.stem.rsplit('_E', 1)[1]),
  )
  if ds is None or not files:
    return
  e = int(files[-1].stem.rsplit('_E', 1)[1])
  delta = np.load(files[-1])
  tok = model.tokenizer
  cand = np.asarray(
    gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  )
  pos = np.flatnonzero((delta > 0) & cand)
  order = pos[np.argsort(-delta[pos])]
  typed = np.array([tok.words[k] in ds.true_words for k in order], bool)
  x = np.arange(1, len(order) + 1)
  ax.scatter(
    x[~typed], delta[order][~typed], s=3, color='tab:red', label='not typed'
  )
  ax.scatter(
    x[typed], delta[order][typed], s=3, color='tab:blue', label='typed'
  )
  rule = 'fdr' if cfg.threshold_rule == 'auto' else cfg.threshold_rule
  thr = float(
    gboard.choose_threshold(
      jnp.asarray(delta), rule, q=cfg.fdr_q, candidates=jnp.asarray(cand)
    )
  )
  oracle, _ = gboard.oracle_threshold(delta, tok.words, ds.true_words, cand)
  ax.axhline(thr, color='k', label=f'bias cut ({rule})')
  ax.axhline(oracle, color='k', ls=':', label='oracle')
  ax.set_xscale('log')
  ax.set_xlabel('rank of positive b1 - b0')
  ax.set_ylabel('b1 - b0')
  ax.set_title(f'(b) DPSGD-like σ={sigma:g}, B={b}, n_k={n_k}, E={e}')
  ax.legend(fontsize=6)


def main(argv):
  del argv
  cfg = config_from_flags(FLAGS)
  summary = run_experiment(cfg, FLAGS.workdir, mesh=make_mesh(FLAGS.mesh))
  for k in sorted(summary):
    if k.startswith(('f1@', 'levenshtein@')) and 'noise=none' in k:
      print(f'{k}: {summary[k]:.3f}')
  print(f'Wrote {FLAGS.workdir}/summary.json')


if __name__ == '__main__':
  define_flags()
  common.define_common_flags('/tmp/leakjax_gboard')
  common.run(main)
