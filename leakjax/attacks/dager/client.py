"""DAGER's client: consecutive batches, defenses, what the client sends.

* :func:`consecutive_batches` -- batch k holds sentences `[k b, (k + 1) b)`;
* :func:`parse_defense` -- `none`, `freeze` (FILM Sec. 5), `noise:S`
  (GBoard Algorithm 4), `fedavg:E:B` (DAGER's FedAvg setting, Petrov et al.
  Table 4);
* :func:`client_view` / :func:`batch_gradient` -- what the client sends,
  as a gradient (:func:`leakjax.fl.client_gradient` or
  :func:`leakjax.fl.client_update`, jitted here with the model static).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import fl
from leakjax._jit import jitted
from leakjax.errors import LeakjaxError

if TYPE_CHECKING:
  from leakjax.attacks.dager.runner import DagerConfig


def parse_defense(spec: str) -> tuple[str, tuple[float, ...]]:
  """'none' | 'freeze' | 'noise:S' | 'fedavg:E:B' -> (kind, values)."""
  kind, _, rest = spec.partition(':')
  try:
    values = tuple(float(v) for v in rest.split(':')) if rest else ()
  except ValueError:
    values = (math.nan,)
  ok = (
    (kind in ('none', 'freeze') and not values)
    or (kind == 'noise' and len(values) == 1 and values[0] >= 0)
    or (
      kind == 'fedavg'
      and len(values) == 2
      and all(v >= 1 and v == int(v) for v in values)
    )
  )
  if not ok:
    raise LeakjaxError(
      f'bad defense {spec!r}', 'use none, freeze, noise:<std> or fedavg:<E>:<B>'
    )
  return kind, values


def consecutive_batches(
  sentences: Sequence[str], b: int, num: int, first: int = 0
) -> list[tuple[int, list[str]]]:
  """Batches `first .. first + num - 1` of b consecutive sentences."""
  out = []
  for k in range(first, first + num):
    rows = list(sentences[k * b : (k + 1) * b])
    if len(rows) < b:
      raise LeakjaxError(
        f'{len(sentences)} sentences hold no batch {k} of size {b}',
        'use more data, fewer --num_batches or smaller --batch_sizes',
      )
    out.append((k, rows))
  return out


def client_view(model, params, ids, mask, spec: str, cfg: DagerConfig, *, key):
  """What the client sends under defense `spec`, as a gradient."""
  kind, values = parse_defense(spec)
  if kind == 'fedavg':
    return send(
      model,
      params,
      ids,
      mask,
      fl.Defense(),
      fedavg=(int(values[0]), int(values[1])),
      learning_rate=cfg.fedavg_lr,
      key=key,
    )
  defense = {
    'none': fl.Defense,
    'freeze': lambda: fl.freeze_embeddings(model),
    'noise': lambda: fl.single_noise(values[0]),
  }[kind]()
  return send(model, params, ids, mask, defense, key=key)


def send(
  model,
  params,
  ids,
  mask,
  defense: fl.Defense,
  *,
  fedavg: tuple[int, int] | None = None,
  learning_rate: float = 1e-4,
  key,
):
  """What a client defended by `defense` sends, as a gradient: its FedSGD
  gradient, or with `fedavg=(E, B)` its FedAvg update after E local epochs
  of batch B at `learning_rate`, divided by `-learning_rate x steps`
  (DAGER's FedAvg setting, Petrov et al. Table 4)."""
  # The runner jits the client's step once per process (`jitted`): each
  # model and defense compiles once.
  if fedavg is not None:
    epochs, batch = fedavg
    config = fl.ClientConfig(
      epochs=epochs,
      batch_size=batch,
      learning_rate=learning_rate,
      defense=defense,
    )
    update = jitted(fl.client_update, static_argnames=fl.CLIENT_UPDATE_STATIC)
    result = update(model, params, ids, mask, config, key=key)
    steps = epochs * -(-ids.shape[0] // batch)
    scale = -1.0 / (learning_rate * steps)
    return jax.tree.map(lambda d: d * scale, result.update)
  gradient = jitted(
    fl.client_gradient, static_argnames=fl.CLIENT_GRADIENT_STATIC
  )
  return gradient(
    model,
    params,
    ids,
    mask,
    defense=defense,
    key=key,
    # 32 sentences at a time: the same gradient up to float rounding, in
    # bounded memory (one pass holds every sentence's activations at once).
    microbatch=min(ids.shape[0], 32),
  )


def batch_key(cfg: DagerConfig, b: int, index: int) -> jax.Array:
  """The key of batch `index` of size b: the client's noise and FILM's
  draws."""
  return jax.random.key(cfg.seed * 1_000_003 + b * 1009 + index)


def padded_batch(model, texts, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Token ids and mask of `texts` (BOS first), right-padded to at least
  `width` tokens: padding changes no gradient, and one width for every
  batch is one compile."""
  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
  width = max(ids.shape[1], width)
  ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])))
  mask = np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
  return ids, mask


def batch_gradient(model, params, texts, b, index, spec, cfg):
  """What the client of batch `index` (`texts`, size b) sends under
  defense `spec`, with the batch's token ids and mask (padded to one
  width for every batch: padding changes no gradient, and one width is
  one compile)."""
  ids, mask = padded_batch(model, texts, cfg.max_length or cfg.max_tokens + 1)
  key = batch_key(cfg, b, index)
  grads = client_view(
    model, params, jnp.asarray(ids), jnp.asarray(mask), spec, cfg, key=key
  )
  jax.block_until_ready(grads)
  return grads, ids, mask


__all__ = [
  'batch_gradient',
  'batch_key',
  'client_view',
  'consecutive_batches',
  'padded_batch',
  'parse_defense',
  'send',
]
