"""The victim clients of the GBoard experiment: datasets and their θ1.

A client holds n_k sentences of the pool (:func:`make_datasets`) and trains
θ0 with :func:`leakjax.fl.client_update`, SGD η = 0.001 (Suliman & Leith
Sec. 4.1); θ1 is taken after E epochs of one growing trajectory
(:func:`trajectory`; E=1, B=full is FedSGD), with DPSGD-like noise
(Algorithm 3) on its own trajectories. :func:`plan_trajectories` lists the
trajectories of one dataset; :func:`snapshots` saves every θ1 under the
workdir and reuses it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import fl, io
from leakjax._jit import jitted
from leakjax.attacks.gboard import update

if TYPE_CHECKING:
  from leakjax.attacks.gboard.runner import GboardConfig


@dataclasses.dataclass
class Dataset:
  """One client's dataset: n_k pool sentences (the `index`-th draw)."""

  n_k: int
  index: int
  sentences: list[tuple[str, ...]]
  ids: np.ndarray  # int32 [n_k, L + 1], <S> first
  true_words: set[str]


def make_datasets(cfg: GboardConfig, pool, tokenizer) -> list[Dataset]:
  """`num_datasets` datasets per n_k, each drawn from `pool` by its own seed."""
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


def minibatch_size(b: str, n_k: int) -> int | None:
  """The client's batch size for the flag value `b`; None: full batch."""
  return None if b == 'full' or int(b) >= n_k else int(b)


_CHUNKS = (50, 10, 1)  # epochs per client_update call: few compilations


def _chunks(total: int) -> list[int]:
  out = []
  for c in _CHUNKS:
    while total >= c:
      out.append(c)
      total -= c
  return out


def _client_update(model, params, ids, config, key) -> fl.ClientResult:
  """:func:`leakjax.fl.client_update` without padding; :func:`trajectory`
  jits it with `model` and `config` static: one compilation per model and
  client config, whatever the parameters.
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
    'batch_sum': length * (minibatch_size(batch, n_k) or n_k),
  }[cfg.loss]
  params, done = params0, 0
  ids = jnp.asarray(ids)
  client_update = jitted(_client_update, static_argnames=('model', 'config'))
  for target in epochs:
    for chunk in _chunks(target - done):
      client = update.client_config(
        chunk,
        minibatch_size(batch, n_k),
        learning_rate=cfg.learning_rate,
        words_per_sentence=per_sentence,
        step_noise=step_noise,
      )
      params = client_update(
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
    if minibatch_size(b, ds.n_k) not in seen:
      seen.add(minibatch_size(b, ds.n_k))
      plans.append((b, 'none', 0.0, epochs))
  for n_k, b, max_epochs in cfg.dpsgd_runs:
    if n_k == ds.n_k:
      for sigma in cfg.dpsgd_sigmas:
        plans.append(
          (b, 'dpsgd', sigma, [e for e in epochs if e <= max_epochs] or [1])
        )
  return plans
