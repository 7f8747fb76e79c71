"""Device meshes for data-parallel candidate scoring.

Every batched kernel in leakjax (beam search, reorder scoring, differential
scores, HEI) maps over a leading candidate/batch axis. To scale past one
device the caller places that axis on a `jax.sharding.Mesh` axis named
`'data'` and replicates the model parameters; `jit` then partitions the
kernel. Nothing inside a kernel needs to know.

>>> mesh = make_mesh('data:8')                          # doctest: +SKIP
>>> ids = shard_batch(ids, mesh)                        # doctest: +SKIP
>>> params = replicate(params, mesh)                    # doctest: +SKIP
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from leakjax.errors import LeakjaxError

DATA_AXIS = 'data'


def make_mesh(spec: str | None = None, devices=None) -> Mesh:
  """Builds a mesh from a flag string.

  Args:
    spec: `None` or `'data:-1'` (all devices on the data axis), `'data:N'`
      (the first N devices), or two axes `'data:N,model:M'` (model axis for
      parameters too large to replicate).
    devices: defaults to `jax.devices()` (all hosts' devices on a pod).

  Returns:
    A `Mesh` with axis names from the spec.
  """
  devices = list(jax.devices() if devices is None else devices)
  spec = spec or f'{DATA_AXIS}:-1'
  names, sizes = [], []
  for part in spec.split(','):
    name, _, size = part.partition(':')
    if not name or not size.lstrip('-').isdigit():
      raise LeakjaxError(
        f'bad --mesh {spec!r}', "write it as 'data:N' or 'data:N,model:M'"
      )
    names.append(name.strip())
    sizes.append(int(size))
  if sizes.count(-1) > 1:
    raise LeakjaxError(f'bad --mesh {spec!r}: only one axis may be -1')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    sizes[sizes.index(-1)] = len(devices) // known
  total = math.prod(sizes)
  if total < 1 or total > len(devices):
    raise LeakjaxError(
      f'--mesh {spec!r} needs {total} devices, {len(devices)} are visible',
      'use fewer devices or check jax.devices()',
    )
  grid = np.asarray(devices[:total], dtype=object).reshape(sizes)
  return Mesh(grid, tuple(names))


def data_mesh(spec: str | None) -> Mesh | None:
  """An experiment's `--mesh` flag: a mesh with a `'data'` axis, or None.

  None or '' (flag absent) means no sharding. Raises LeakjaxError before
  any work for a malformed spec, more devices than are visible, or a mesh
  without a `'data'` axis (the experiments split candidates over it).
  """
  if not spec:
    return None
  mesh = make_mesh(spec)
  if DATA_AXIS not in mesh.shape:
    raise LeakjaxError(
      f'--mesh {spec!r} has no {DATA_AXIS!r} axis',
      f'write it as {DATA_AXIS}:N (candidates are split over it)',
    )
  return mesh


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Shards axis 0 over `'data'`, replicates the other axes."""
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def _put(x, sharding: NamedSharding) -> jax.Array:
  """`x` placed with `sharding`, also when the mesh spans several hosts.

  `jax.device_put` of a process's own array reaches only that process's
  devices. On a multi-host mesh every process holds the whole array (each
  computes the whole run), so each builds its devices' shards from it
  (`jax.make_array_from_callback`), and the result is one global array.
  """
  if sharding.is_fully_addressable or (
    isinstance(x, jax.Array) and not x.is_fully_addressable
  ):
    return jax.device_put(x, sharding)
  host = np.asarray(jax.device_get(x))
  return jax.make_array_from_callback(
    host.shape, sharding, lambda index: host[index]
  )


def shard_batch(tree, mesh: Mesh | None):
  """Places every leaf's leading axis on the mesh's data axis.

  The leading axis must be divisible by the data-axis size; use
  :func:`pad_to_multiple` first. With `mesh=None` the tree is returned as is.
  The mesh may span several processes (each passes the same `tree`).
  """
  if mesh is None:
    return tree
  n = mesh.shape[DATA_AXIS]

  def place(x):
    x = jax.numpy.asarray(x)
    if x.ndim == 0:
      return _put(x, replicated(mesh))
    if x.shape[0] % n:
      raise LeakjaxError(
        f'batch of {x.shape[0]} does not split over {n} devices',
        'pad the batch with pad_to_multiple',
      )
    return _put(x, batch_sharding(mesh, x.ndim))

  return jax.tree.map(place, tree)


def replicate(tree, mesh: Mesh | None):
  """Copies every leaf to all devices of the mesh (model parameters),
  across processes when the mesh spans several."""
  if mesh is None:
    return tree
  sharding = replicated(mesh)
  return jax.tree.map(lambda x: _put(x, sharding), tree)


def to_host(tree):
  """NumPy copies of a kernel's outputs (a runner's read-back).

  A leaf split over a mesh that spans several processes is gathered from
  all of them (`process_allgather`, a collective: every process calls it,
  as every process runs the same loop); other leaves are copied from
  their devices.
  """
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))

  return jax.tree.map(get, tree)


def pad_to_multiple(x, multiple: int, axis: int = 0):
  """Pads `x` along `axis` with copies of its last entry to a multiple.

  Returns `(padded, n)` with `n` the original length, so callers slice the
  result back with `[:n]`. Repeating a real row (not zeros) keeps padded
  candidates valid inputs for every kernel.
  """
  x = np.asarray(x) if not isinstance(x, jax.Array) else x
  n = x.shape[axis]
  extra = (-n) % multiple
  if extra == 0:
    return x, n
  last = jax.numpy.take(x, jax.numpy.array([n - 1] * extra), axis=axis)
  return jax.numpy.concatenate([jax.numpy.asarray(x), last], axis=axis), n


def data_size(mesh: Mesh | None) -> int:
  return 1 if mesh is None else mesh.shape[DATA_AXIS]


def check_data_axis(mesh: Mesh | None) -> None:
  """Raises LeakjaxError if `mesh` is given but has no `'data'` axis."""
  if mesh is not None and DATA_AXIS not in mesh.shape:
    raise LeakjaxError(
      f'the mesh has axes {tuple(mesh.shape)}, none named {DATA_AXIS!r}',
      f"build it with make_mesh('{DATA_AXIS}:N')",
    )


def constrain_batch(tree, mesh: Mesh | None):
  """Inside a kernel: every leaf's leading axis split over `'data'`.

  The `jax.lax.with_sharding_constraint` counterpart of :func:`shard_batch`
  (the leading axis must divide evenly); a no-op with `mesh=None`.
  """
  if mesh is None:
    return tree
  return jax.tree.map(
    lambda x: jax.lax.with_sharding_constraint(x, batch_sharding(mesh, x.ndim)),
    tree,
  )


def constrain_replicated(tree, mesh: Mesh | None):
  """Inside a kernel: every leaf on all devices (model parameters)."""
  if mesh is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, replicated(mesh))
