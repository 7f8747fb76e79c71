"""What a defended client sends: the defense of a spec, the DP noise, the
gradient or update the attacker reads.

* :func:`noise_multiplier` -- the DP-SGD noise multiplier of `dp:EPS` over
  the audit's fine-tuning run (Abadi et al. 2016, RDP accounting);
* :func:`make_defense` -- the :class:`leakjax.fl.Defense` of a spec;
* :func:`sent_gradient` -- the FedSGD gradient or the FedAvg update
  (divided by `-lr x steps`, DAGER's FedAvg setting, Petrov et al.
  Table 4) the attacker reads, built by DAGER's client so that the audit's
  numbers equal DAGER's experiment's on the same batch.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from leakjax import fl
from leakjax.attacks.dager import client as dager_client
from leakjax.audit.config import AuditConfig, parse_defense

# Per-example gradients this many at a time under DP-SGD: the memory of
# this many copies of the model (on CPU 2 at a time also ran faster than 8).
DP_MICROBATCH = 2


def noise_multiplier(cfg: AuditConfig, epsilon: float, num_train: int) -> float:
  """The noise multiplier sigma of DP-SGD at (`epsilon`, `dp_delta`) over
  `finetune_steps` steps at sampling rate finetune_batch_size / N.

  Decision: the audit's privacy budget is the fine-tuning run whose cost
  it measures; a client's gradient or update in the leakage cells is one
  step of that run and carries the same per-step noise (FILM Sec. 6.3
  calibrates the same way, for its training run).
  """
  rate = min(1.0, cfg.finetune_batch_size / num_train)
  return fl.sigma_for_epsilon(
    epsilon, rate, max(1, cfg.finetune_steps), cfg.dp_delta
  )


def make_defense(
  model, spec: str, cfg: AuditConfig, *, num_train: int
) -> tuple[fl.Defense, float | None]:
  """The defense of `spec` and its DP noise multiplier (None: no DP)."""
  kind, value = parse_defense(spec)
  if kind == 'none':
    return fl.Defense(), None
  if kind == 'freeze':
    return fl.freeze_embeddings(model), None
  if kind == 'prune':
    return fl.gradient_pruning(value), None
  if kind == 'noise':
    return fl.single_noise(value), None
  sigma = noise_multiplier(cfg, value, num_train)
  return fl.dp_sgd(cfg.dp_clip, sigma, microbatch=DP_MICROBATCH), sigma


def local_batch(cfg: AuditConfig, b: int) -> int:
  """The FedAvg client's minibatch: its b sentences in `local_steps` steps
  (fewer when b < local_steps)."""
  return max(1, math.ceil(b / cfg.local_steps))


def sent_gradient(
  model, params, ids, mask, artefact: str, defense: fl.Defense, cfg, *, key
):
  """What the client of one batch sends under `defense`, as a gradient:
  `artefact` 'gradient' (FedSGD) or 'update' (FedAvg: one epoch of
  :func:`local_batch` minibatches at `local_learning_rate`)."""
  fedavg = None
  if artefact == 'update':
    fedavg = (1, local_batch(cfg, ids.shape[0]))
  grads = dager_client.send(
    model,
    params,
    jnp.asarray(ids),
    jnp.asarray(mask),
    defense,
    fedavg=fedavg,
    learning_rate=cfg.local_learning_rate,
    key=key,
  )
  jax.block_until_ready(grads)
  return grads


__all__ = [
  'DP_MICROBATCH',
  'local_batch',
  'make_defense',
  'noise_multiplier',
  'sent_gradient',
]
