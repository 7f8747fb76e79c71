"""Client datasets as fixed-shape arrays, and the local mini-batch schedule.

A client's data is a padded batch of sentences, `ids [n, T]` and
`mask [n, T]` (1 = real token, right padding). To put clients with
different numbers of sentences in one array (and one compiled program),
:class:`ClientData` also records `num_examples`: rows `[0, num_examples)`
are the client's sentences, later rows are padding and are never trained on.

Mini-batches (GBoard Algorithm 1: "split dataset into batches of size B",
E epochs). Every epoch reshuffles the real rows with its own key
(`fold_in(key, epoch)`) and cuts them into `ceil(n / B)` batches of B rows
in order; the last batch holds the `n mod B` remaining rows and is filled up
to B with weight-0 slots, so it acts as a smaller batch (the loss averages
over its real tokens only), like `dataset.batch(B)` without
`drop_remainder`. Shapes stay fixed, so all steps run in one `lax.scan`.
`B >= n` (or B=None) gives one batch per epoch holding every example; it is
not shuffled, as order does not change its gradient. GBoard uses B=32 with
n_k in {16, ..., 256} (Sec. 4.3, Fig. 2), e.g. n_k=16 gives one batch of 16.

Weight-0 slots point at a real row (the epoch's first), so the model never
runs on an all-padding row; their loss weight is 0, so they contribute
nothing. A batch with no real row at all (only when `num_examples < n`) is
skipped by the client: no gradient, no optimizer step, no noise.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from leakjax.errors import LeakjaxError


@flax.struct.dataclass
class ClientData:
  """One or several clients' sentences (a leading client axis when stacked).

  Attributes:
    ids: int32 `[..., n, T]` token ids.
    mask: int32 `[..., n, T]`, 1 for real tokens, 0 for padding.
    num_examples: int32 `[...]`; rows `[0, num_examples)` are real sentences.
  """

  ids: jax.Array
  mask: jax.Array
  num_examples: jax.Array

  @property
  def num_clients(self) -> int:
    """Size of the leading client axis (stacked data only)."""
    if self.ids.ndim != 3:
      raise LeakjaxError(
        'this ClientData holds a single client',
        'stack several with stack_clients',
      )
    return self.ids.shape[0]


def client_data(ids, mask=None, num_examples: int | None = None) -> ClientData:
  """Wraps one client's padded sentences `ids, mask [n, T]`."""
  ids, mask = check_batch(ids, mask)
  n = ids.shape[0] if num_examples is None else num_examples
  if not 0 <= n <= ids.shape[0]:
    raise LeakjaxError(
      f'num_examples={n} but the client has {ids.shape[0]} rows',
      'pass 0 <= num_examples <= rows',
    )
  return ClientData(ids=ids, mask=mask, num_examples=jnp.asarray(n, jnp.int32))


def stack_clients(
  clients: Sequence[ClientData | tuple], *, pad_id: int = 0
) -> ClientData:
  """Pads clients to a common `[n_max, T_max]` and stacks them.

  Args:
    clients: `ClientData` or `(ids, mask)` pairs, one per client; they may
      have different numbers of sentences and lengths.
    pad_id: token id for padding positions (masked out anyway).

  Returns:
    ClientData with ids/mask `[N, n_max, T_max]` and num_examples `[N]`.
  """
  if not clients:
    raise LeakjaxError('no clients to stack', 'pass at least one client')
  clients = [
    c if isinstance(c, ClientData) else client_data(*c) for c in clients
  ]
  n_max = max(c.ids.shape[0] for c in clients)
  t_max = max(c.ids.shape[1] for c in clients)

  def pad(x, value):
    x = np.asarray(x)
    return np.pad(
      x,
      ((0, n_max - x.shape[0]), (0, t_max - x.shape[1])),
      constant_values=value,
    )

  return ClientData(
    ids=jnp.asarray(np.stack([pad(c.ids, pad_id) for c in clients])),
    mask=jnp.asarray(np.stack([pad(c.mask, 0) for c in clients])),
    num_examples=jnp.asarray([int(c.num_examples) for c in clients], jnp.int32),
  )


def check_batch(ids, mask=None) -> tuple[jax.Array, jax.Array]:
  """Validates `ids [n, T]` and `mask`; returns int32 arrays (mask of ones
  when None)."""
  ids = jnp.asarray(ids)
  if ids.ndim != 2:
    raise LeakjaxError(
      f'client ids have shape {tuple(ids.shape)}, expected [sentences, time]',
      'pad the sentences to one length',
    )
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise LeakjaxError(
      f'client ids have dtype {ids.dtype}', 'pass integer token ids'
    )
  if ids.shape[0] == 0:
    raise LeakjaxError(
      'the client has no sentences', 'give every client at least one sentence'
    )
  if mask is None:
    mask = jnp.ones(ids.shape, jnp.int32)
  mask = jnp.asarray(mask)
  if mask.shape != ids.shape:
    raise LeakjaxError(
      f'mask shape {tuple(mask.shape)} differs from ids shape'
      f' {tuple(ids.shape)}',
      'pass the mask of these ids',
    )
  return ids.astype(jnp.int32), mask.astype(jnp.int32)


@flax.struct.dataclass
class BatchSchedule:
  """Which rows each local step trains on.

  Attributes:
    indices: int32 `[steps, batch]`, rows of the client's `ids`.
    weights: float32 `[steps, batch]`, 1 for a real example, 0 for a slot
      that only fills the last batch of an epoch up to the batch size.
  """

  indices: jax.Array
  weights: jax.Array


def effective_batch_size(num_rows: int, batch_size: int | None) -> int:
  """B, capped at the number of rows (None: all rows)."""
  if batch_size is None:
    return num_rows
  if batch_size < 1:
    raise LeakjaxError(
      f'batch_size must be >= 1, got {batch_size}',
      'pass a positive batch size or None for all',
    )
  return min(batch_size, num_rows)


def num_local_steps(
  num_rows: int, *, epochs: int, batch_size: int | None
) -> int:
  """E * ceil(n / B): the number of local steps of one client update."""
  b = effective_batch_size(num_rows, batch_size)
  return epochs * (-(-num_rows // b))


def batch_schedule(
  num_rows: int,
  *,
  epochs: int,
  batch_size: int | None,
  key: jax.Array,
  num_examples=None,
) -> BatchSchedule:
  """The mini-batches of E local epochs (see the module docstring).

  Args:
    num_rows: n, rows of the client's data (static).
    epochs: E >= 1 (static).
    batch_size: B, or None for all rows (static).
    key: shuffling key; epoch e uses `fold_in(key, e)`.
    num_examples: real rows (may be traced); None means all `num_rows`.

  Returns:
    A :class:`BatchSchedule` with `E * ceil(n / B)` steps of B slots.
  """
  if epochs < 1:
    raise LeakjaxError(
      f'epochs must be >= 1, got {epochs}', 'train for at least one local epoch'
    )
  b = effective_batch_size(num_rows, batch_size)
  num_batches = -(-num_rows // b)
  slots = num_batches * b
  real = num_rows if num_examples is None else num_examples
  rows = jnp.arange(num_rows)

  def epoch(e):
    if num_batches == 1:
      order = rows  # one batch: order does not change the gradient
    else:
      u = jax.random.uniform(jax.random.fold_in(key, e), (num_rows,))
      # Real rows first, in random order; padding rows (>= real) last.
      order = jnp.argsort(jnp.where(rows < real, u, 2.0))
    order = jnp.concatenate(
      [order, jnp.zeros((slots - num_rows,), order.dtype)]
    )  # [slots]
    is_real = jnp.arange(slots) < real
    indices = jnp.where(is_real, order, order[0])
    # [slots] -> [num_batches, b]
    return (
      indices.reshape(num_batches, b).astype(jnp.int32),
      is_real.reshape(num_batches, b).astype(jnp.float32),
    )

  indices, weights = jax.vmap(epoch)(jnp.arange(epochs))
  # [epochs, num_batches, b] -> [epochs * num_batches, b]
  return BatchSchedule(
    indices=indices.reshape(-1, b), weights=weights.reshape(-1, b)
  )


__all__ = [
  'ClientData',
  'client_data',
  'stack_clients',
  'BatchSchedule',
  'batch_schedule',
  'num_local_steps',
  'check_batch',
]
