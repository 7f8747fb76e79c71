"""Federated clients, their defenses, DP accounting and simulated training.

What an eavesdropper sees is what a client sends:

* :func:`client_gradient` -- FedSGD, the gradient of one padded batch
  (pure: the caller jits it with `static_argnames=CLIENT_GRADIENT_STATIC`);
* :func:`client_update` -- FedAvg local training (E epochs, batch B, any
  optax optimizer) in one `lax.scan`, returning θ1 and Δ = θ1 − θ0;
* :class:`Defense` -- :func:`freeze_embeddings` (FILM Sec. 5),
  :func:`dp_sgd` (Abadi et al.), :func:`dpsgd_like_noise` and
  :func:`single_noise` (GBoard Algorithms 3, 4), :func:`gradient_pruning`
  (Zhu et al.), combined with `|`; they apply to FedSGD and FedAvg alike;
* :func:`epsilon`, :func:`sigma_for_epsilon` -- DP-SGD accounting;
* :func:`fl_round`, :func:`train_federated` -- N clients with server
  averaging (FILM Eq. 3), snapshots θ^t for attacks at iteration t;
* :func:`make_python_loop_client_update` -- the same client update as a
  Python loop over one jitted step (the reference and benchmark peer).

>>> model, params = leakjax.models.load('smollm2-135m')  # doctest: +SKIP
>>> config = fl.ClientConfig(epochs=1, batch_size=32, learning_rate=1e-3,
...                          defense=fl.dp_sgd(1.0, 1.1))   # doctest: +SKIP
>>> result = fl.client_update(model, params, ids, mask, config,
...                           key=jax.random.key(0))        # doctest: +SKIP
"""

from leakjax.fl.accounting import epsilon, sigma_for_epsilon
from leakjax.fl.batching import ClientData, client_data, stack_clients
from leakjax.fl.client import (
  CLIENT_GRADIENT_STATIC,
  CLIENT_UPDATE_STATIC,
  ClientConfig,
  ClientResult,
  client_gradient,
  client_update,
)
from leakjax.fl.defenses import (
  Defense,
  combine,
  dp_sgd,
  dpsgd_like_noise,
  freeze_embeddings,
  gradient_pruning,
  prune_by_magnitude,
  single_noise,
)
from leakjax.fl.reference import make_python_loop_client_update
from leakjax.fl.simulation import (
  FederatedRun,
  RoundResult,
  fl_round,
  train_federated,
)

__all__ = [
  'CLIENT_GRADIENT_STATIC',
  'CLIENT_UPDATE_STATIC',
  'ClientConfig',
  'ClientData',
  'ClientResult',
  'Defense',
  'FederatedRun',
  'RoundResult',
  'client_data',
  'client_gradient',
  'client_update',
  'combine',
  'dp_sgd',
  'dpsgd_like_noise',
  'epsilon',
  'fl_round',
  'freeze_embeddings',
  'gradient_pruning',
  'make_python_loop_client_update',
  'prune_by_magnitude',
  'sigma_for_epsilon',
  'single_noise',
  'stack_clients',
  'train_federated',
]
