r"""The GBoard attack experiment (Suliman & Leith) on real SMS messages.

End to end, without the oracles of the authors' code (the word threshold
and the number of sentences are chosen without the true text); read
top-down from :func:`run`:

1. :func:`corpora.load_corpora`: client pool of 4-word SMS `ham` sentences
   (Sec. 4.1) and public pre-training text kept disjoint by message.
2. :func:`corpora.pretrain`: θ0, the GBoard-shaped CIFG-LSTM (V=9502,
   D=96, 670 units, projection, tied embeddings, output bias; Sec. 2.3)
   trained on the public text, cached in `<workdir>/pretrain`.
3. :func:`clients.make_datasets` and :func:`clients.plan_trajectories`:
   the victim clients, datasets of n_k sentences trained with
   :func:`leakjax.fl.client_update`, SGD η = 0.001 (Sec. 4.1), θ1 taken
   after E epochs of one trajectory (E=1, B=full is FedSGD); DPSGD-like
   noise (Algorithm 3) on its own trajectories, single noise (Algorithm 4)
   added to the noise-free θ1.
4. :func:`sweep.attack_trajectory` and :func:`sweep.attack`: word recovery
   (Algorithm 2, the no-oracle rules, the oracle cut) and sentence
   reconstruction (Sec. 3.2) with FedSGD scaling (Sec. 4.3.2) and the keep
   rules, one result row per scale.

The runner contract (shared with the FILM and DAGER runners):
`run(config, writer)`. The workdir is the writer's (`writer.workdir`), not
a config field: config.json holds only what determines the results, so the
same config in another folder is the same run. θ0's checkpoints go to
`<workdir>/pretrain`, θ1 snapshots to `<workdir>/snapshots`, the bias
updates of DPSGD-like runs to `<workdir>/deltas`.

Python loops, files and logs live here and in the sibling modules; the
kernels of :mod:`leakjax.attacks.gboard` stay pure. Summaries, tables and
plots are the caller's (experiments/gboard_report.py).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import jax
from absl import logging

from leakjax import io, models
from leakjax.attacks.gboard import clients, sweep
from leakjax.attacks.gboard import corpora as corpora_lib
from leakjax.attacks.gboard import reconstruct as reconstruct_lib
from leakjax.errors import LeakjaxError, check_positive

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
    dtype: float32 or bfloat16: the clients' local training and the attack
      run on θ0 cast to it (:func:`leakjax.models.cast`). Decision: the
      pre-training of θ0 stays float32 (how the model was trained before
      the round is the setup, not the attack). bfloat16 is for
      accelerators (`reports/dtype/`).
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
    preset: the named preset the config started from
      (:mod:`leakjax.attacks.gboard.presets`), recorded; None: none. Not
      compared: two configs whose other fields agree give the same run.
  """

  sms: str = SMS_DEFAULT
  public: tuple[tuple[str, str], ...] = PUBLIC_DEFAULT
  public_limit: int = 12000
  vocab_size: int = 9502
  embed_dim: int = 96
  dtype: str = 'float32'
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
  preset: str | None = dataclasses.field(default=None, compare=False)

  def __post_init__(self):
    models.parameter_dtype(self.dtype)
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


def run(
  config: GboardConfig, writer: io.ExperimentWriter, *, mesh=None
) -> GboardRun:
  """Runs the whole sweep, resuming from the writer's `results.jsonl`.

  Every attack row goes to `writer` as it is computed; summaries, tables
  and plots are left to the caller.

  Args:
    config: the experiment.
    writer: the run's writer (opened on the workdir with `config`); rows
      it already holds are not recomputed, and θ0, the θ1 snapshots and
      the DPSGD-like bias updates are kept under `writer.workdir`.
    mesh: `--mesh` (see :func:`leakjax.sharding.data_mesh`): places the
      sentence candidates on its data axis; it does not change any
      result, so it is not part of the config.

  Returns:
    The rows (`writer.results`) and what the report needs besides.
  """
  corpora = corpora_lib.load_corpora(config)
  logging.info('corpora: %s', corpora.counts)
  model, params0, pre_info = corpora_lib.pretrain(
    config, corpora, writer.workdir
  )
  datasets = clients.make_datasets(config, corpora.pool, model.tokenizer)
  model, params0 = models.cast(model, params0, config.dtype)
  key = jax.random.key(config.seed)
  start = time.time()
  plans = [(ds, clients.plan_trajectories(config, ds)) for ds in datasets]
  counter = io.Progress(sum(len(p) for _, p in plans))
  for ds, plan in plans:
    for batch, noise, sigma, epochs in plan:
      t0 = time.time()
      if not sweep.attack_trajectory(
        model,
        params0,
        ds,
        (batch, noise, sigma, epochs),
        config,
        writer,
        key=key,
        mesh=mesh,
      ):
        counter.skipped()
        continue
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


@dataclasses.dataclass
class GboardRun:
  """What :func:`run` leaves for the report."""

  writer: io.ExperimentWriter  # config.json, results.jsonl (every row)
  corpora: corpora_lib.Corpora
  pretrain_info: dict[str, Any]  # from :func:`corpora.pretrain`
  model: models.Model  # θ0's model (no weights), with its tokenizer
  datasets: list[clients.Dataset]


def writer_inputs(config: GboardConfig) -> dict[str, str]:
  """The run's input files by name, for :class:`leakjax.io.ExperimentWriter`
  (their sha256 go to provenance.json)."""
  return {
    'sms': config.sms,
    **{f'public:{name}': path for name, path in config.public},
  }


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
