"""Simulated federated training: rounds of N clients and server averaging.

One round (:func:`fl_round`) sends θ^t to N clients, each runs
:func:`leakjax.fl.client_update` on its own data, and the server applies
the example-weighted average of their updates:

    θ^{t+1} = θ^t + η_s · Σ_k (n_k / Σ_j n_j) · Δ_k.

With FedSGD clients (Δ_k = −η ∇L(B_k)) and η_s = 1 this is FILM Eq. 3,
θ^{t+1} = θ^t − η Σ_k w_k ∇L(B_k), with the sum weighted by each client's
share of the examples (FILM's unweighted sum over N equal batches is the
same step with η scaled by N; FedAvg, McMahan et al. 2017, weights by n_k).

:func:`train_federated` runs rounds and keeps snapshots θ^t, so that an
attack can be run on the model "during federated training" at any
iteration t (FILM Sec. 6.2, Fig. 4). Rounds are a Python loop over one
jitted round (compiled once); clients within a round are a `lax.scan`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from leakjax._jit import jitted
from leakjax.errors import LeakjaxError
from leakjax.fl.batching import ClientData
from leakjax.fl.client import DEFAULT_CLIENT, ClientConfig, client_update
from leakjax.models.protocol import Model

PyTree = Any
WEIGHTINGS = ('examples', 'uniform')


@flax.struct.dataclass
class RoundResult:
  """One round's outcome.

  Attributes:
    params: θ^{t+1}.
    update: the server's aggregate Σ_k w_k Δ_k (before η_s).
    client_losses: float32 `[N]`, each client's mean local loss.
    client_weights: float32 `[N]`, the w_k used (sum to 1 unless no client
      had data).
  """

  params: PyTree
  update: PyTree
  client_losses: jax.Array
  client_weights: jax.Array


def _client_weights(num_examples: jax.Array, weighting: str) -> jax.Array:
  n = num_examples.astype(jnp.float32)
  if weighting == 'uniform':
    n = (n > 0).astype(jnp.float32)
  return n / jnp.maximum(n.sum(), 1.0)


def fl_round(
  model: Model,
  params: PyTree,
  clients: ClientData,
  config: ClientConfig = DEFAULT_CLIENT,
  *,
  key,
  server_learning_rate: float = 1.0,
  weighting: str = 'examples',
) -> RoundResult:
  """One round of federated training with the clients in `clients`.

  Args:
    model: any leakjax model.
    params: the global model θ^t.
    clients: stacked :class:`ClientData` (ids/mask `[N, n, T]`), e.g. from
      :func:`leakjax.fl.stack_clients`.
    config: every client's local training (FedSGD: `ClientConfig.fedsgd`).
    key: PRNG key; client k uses `fold_in(key, k)`.
    server_learning_rate: η_s.
    weighting: 'examples' (w_k ∝ n_k, FedAvg) or 'uniform' (w_k = 1/N).

  Returns:
    A :class:`RoundResult` with θ^{t+1}.
  """
  if weighting not in WEIGHTINGS:
    raise LeakjaxError(
      f'weighting {weighting!r} is not one of {WEIGHTINGS}',
      "use 'examples' or 'uniform'",
    )
  if clients.ids.ndim != 3:
    raise LeakjaxError(
      f'clients.ids has shape {tuple(clients.ids.shape)},'
      ' expected [clients, sentences, time]',
      'stack clients with leakjax.fl.stack_clients',
    )
  num_clients = clients.ids.shape[0]
  weights = _client_weights(clients.num_examples, weighting)  # [N]

  def one_client(total, xs):
    k, ids, mask, n, w = xs
    result = client_update(
      model,
      params,
      ids,
      mask,
      config,
      key=jax.random.fold_in(key, k),
      num_examples=n,
    )
    total = jax.tree.map(
      lambda a, u: a + w.astype(u.dtype) * u, total, result.update
    )
    return total, jnp.nanmean(result.losses)

  zeros = jax.tree.map(jnp.zeros_like, params)
  update, losses = lax.scan(
    one_client,
    zeros,
    (
      jnp.arange(num_clients),
      clients.ids,
      clients.mask,
      clients.num_examples,
      weights,
    ),
  )
  new_params = jax.tree.map(
    lambda p, u: p + jnp.asarray(server_learning_rate, u.dtype) * u,
    params,
    update,
  )
  return RoundResult(
    params=new_params,
    update=update,
    client_losses=losses,
    client_weights=weights,
  )


# The static arguments of `_sampled_round` under `jax.jit` (`simulate` jits it).
_ROUND_STATIC = (
  'model',
  'config',
  'clients_per_round',
  'server_learning_rate',
  'weighting',
)


def _sampled_round(
  model,
  params,
  data: ClientData,
  key,
  t,
  *,
  config,
  clients_per_round,
  server_learning_rate,
  weighting,
):
  """Round t of :func:`train_federated`: sample N of K clients, fl_round.

  Module-level and jitted with static settings, so repeated calls of
  train_federated with the same model and settings compile once.
  """
  num_total = data.ids.shape[0]
  select_key, clients_key = jax.random.split(jax.random.fold_in(key, t))
  if clients_per_round == num_total:
    ids = jnp.arange(num_total)
  else:
    ids = jax.random.choice(
      select_key, num_total, (clients_per_round,), replace=False
    )
  chosen = jax.tree.map(lambda x: x[ids], data)  # [K, ...] -> [N, ...]
  result = fl_round(
    model,
    params,
    chosen,
    config,
    key=clients_key,
    server_learning_rate=server_learning_rate,
    weighting=weighting,
  )
  loss = jnp.nansum(result.client_losses * result.client_weights)
  return result.params, loss, ids


@dataclasses.dataclass
class FederatedRun:
  """The outcome of :func:`train_federated`.

  Attributes:
    params: θ^T after all rounds.
    snapshots: {t: θ^t} for t = 0, k, 2k, ... <= rounds (k = snapshot_every),
      θ^t being the global model that round t's clients receive (so the
      gradients an eavesdropper sees at iteration t are computed at it).
    losses: float `[rounds]`, the weighted mean client loss of each round.
    client_ids: int `[rounds, clients_per_round]`, who took part.
  """

  params: PyTree
  snapshots: dict[int, PyTree]
  losses: np.ndarray
  client_ids: np.ndarray


def train_federated(
  model: Model,
  params: PyTree,
  client_datasets: ClientData,
  rounds: int,
  config: ClientConfig = DEFAULT_CLIENT,
  *,
  key,
  clients_per_round: int | None = None,
  snapshot_every: int | None = None,
  server_learning_rate: float = 1.0,
  weighting: str = 'examples',
  log_every: int = 0,
  callback: Callable[[int, PyTree], None] | None = None,
) -> FederatedRun:
  """Federated training for `rounds` rounds, keeping snapshots θ^t.

  Round t samples `clients_per_round` of the K clients without replacement
  (key `fold_in(key, t)`; all K every round if None) and runs
  :func:`fl_round`.

  Args:
    model: any leakjax model.
    params: θ^0 (random init or a public pre-trained model, FILM Sec. 3.2).
    client_datasets: stacked :class:`ClientData` of the K clients.
    rounds: T, the number of rounds (iterations).
    config: local training of every client.
    key: PRNG key.
    clients_per_round: N <= K; None means all.
    snapshot_every: keep θ^t for t divisible by this (and t = 0); None keeps
      only θ^0 and θ^T.
    server_learning_rate: η_s.
    weighting: 'examples' or 'uniform', see :func:`fl_round`.
    log_every: log the loss, rate and ETA every this many rounds (0: never).
    callback: called as `callback(t, θ^{t+1})` after each round.

  Returns:
    A :class:`FederatedRun`.
  """
  num_total = client_datasets.num_clients
  n_round = num_total if clients_per_round is None else clients_per_round
  if not 1 <= n_round <= num_total:
    raise LeakjaxError(
      f'clients_per_round={clients_per_round} but there are'
      f' {num_total} clients',
      'pass 1 <= N <= K',
    )
  if rounds < 0:
    raise LeakjaxError(f'rounds must be >= 0, got {rounds}', 'pass T >= 0')
  if snapshot_every is not None and snapshot_every < 1:
    raise LeakjaxError(
      f'snapshot_every must be >= 1, got {snapshot_every}',
      'pass a positive interval or None',
    )

  round_fn = functools.partial(
    jitted(_sampled_round, static_argnames=_ROUND_STATIC),
    model,
    config=config,
    clients_per_round=n_round,
    server_learning_rate=server_learning_rate,
    weighting=weighting,
  )
  snapshots = {0: params}
  losses, client_ids = [], []
  start = time.time()
  for t in range(rounds):
    params, loss, ids = round_fn(params, client_datasets, key, t)
    losses.append(loss)
    client_ids.append(ids)
    if snapshot_every is not None and (t + 1) % snapshot_every == 0:
      snapshots[t + 1] = params
    if callback is not None:
      callback(t, params)
    if log_every and (t + 1) % log_every == 0:
      elapsed = time.time() - start
      rate = (t + 1) / elapsed
      logging.info(
        'round %d/%d loss %.4f (%.2f rounds/s, ETA %.0fs)',
        t + 1,
        rounds,
        float(loss),
        rate,
        (rounds - t - 1) / rate,
      )
  snapshots[rounds] = params
  return FederatedRun(
    params=params,
    snapshots=snapshots,
    losses=np.asarray(jax.device_get(losses), np.float64).reshape(rounds),
    client_ids=np.asarray(jax.device_get(client_ids), np.int64).reshape(
      rounds, n_round
    ),
  )


__all__ = ['fl_round', 'RoundResult', 'train_federated', 'FederatedRun']
