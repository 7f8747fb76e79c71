"""Orbax checkpoints of :func:`leakjax.train.fit` under `workdir/checkpoint/`.

Also the atomic replacement of `workdir/model/` and the data fingerprint a
resumed run must share with the run it resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import io as io_lib
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, PyTree
from leakjax.train.config import TrainConfig

# Fields that change nothing about the trained parameters: a resumed run may
# use other values.
_RESUME_FREE_FIELDS = ('log_every', 'checkpoint_every')
_STATE_VERSION = 3


def data_fingerprint(*arrays) -> str:
  """A short hash of arrays' shapes and bytes (for `fit(fingerprint=...)`)."""
  digest = hashlib.sha256()
  for a in arrays:
    digest.update(str(a.shape).encode())
    digest.update(np.ascontiguousarray(a).tobytes())
  return digest.hexdigest()[:32]


def _config_dict(config: TrainConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


_CHECKPOINT = 'checkpoint'
# The marker written last into a directory on an object store, where
# directories cannot be renamed atomically (see _replace_directory).
_COMPLETE = '.complete'


def _checkpoint_manager(workdir):
  """The orbax manager of `workdir/checkpoint/`. Only JAX process 0 gets
  here (see :func:`fit`), so it is the manager's one active process."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  directory = workdir / _CHECKPOINT
  if (directory / 'train_state.json').exists():
    raise LeakjaxError(
      f'{directory} holds a checkpoint of an earlier leakjax version',
      'use a new workdir or delete the old checkpoint folder',
    )
  # orbax refuses to create the folder when only some processes take part.
  directory.mkdir(parents=True, exist_ok=True)
  return ocp.CheckpointManager(
    directory,
    options=ocp.CheckpointManagerOptions(
      max_to_keep=1,
      enable_async_checkpointing=True,
      create=False,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
        primary_host=0,
        active_processes={0} if jax.process_count() > 1 else None,
      ),
    ),
  )


def _host_tree(tree: PyTree) -> PyTree:
  """NumPy copies of `tree`'s leaves: what orbax writes in the background
  while the step donates the device buffers."""
  return jax.tree.map(lambda x: np.array(jax.device_get(x)), tree)


def _write_checkpoint(
  manager, params, opt_state, best_params, state: dict[str, Any]
) -> None:
  """Saves step `state['step']` (asynchronously; one step is kept).

  The checkpoint of a finished run holds no optimizer state: it never steps
  again, and Adam's two moments would double or triple its size.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  items = {
    'params': ocp.args.PyTreeSave(_host_tree(params)),
    'state': ocp.args.JsonSave(json.loads(json.dumps(state))),
  }
  if not state['finished']:
    items['opt_state'] = ocp.args.PyTreeSave(_host_tree(opt_state))
  best = state['best']
  if best_params is not None and best is not None:
    if best['step'] != state['step']:
      items['best'] = ocp.args.PyTreeSave(_host_tree(best_params))
  manager.save(state['step'], args=ocp.args.Composite(**items), force=True)


def _restore_tree(manager, step: int, name: str, template: PyTree) -> PyTree:
  """Item `name` of checkpoint `step`, in the structure and dtypes of
  `template` (`jax.ShapeDtypeStruct`s), as `jax.Array`s."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  flat, treedef = jax.tree.flatten(template)
  like = jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), template)
  try:
    restored = manager.restore(
      step, args=ocp.args.Composite(**{name: ocp.args.PyTreeRestore(like)})
    )[name]
    leaves = jax.tree.leaves(restored)
    if len(leaves) != len(flat):
      raise ValueError(f'{len(leaves)} arrays, expected {len(flat)}')
    for leaf, t in zip(leaves, flat):
      if tuple(np.shape(leaf)) != tuple(t.shape):
        raise ValueError(f'shape {np.shape(leaf)}, expected {t.shape}')
  except (ValueError, KeyError, TypeError, FileNotFoundError) as e:
    raise LeakjaxError(
      f'cannot read {name} of checkpoint {manager.directory} step {step}: {e}',
      'it was written for another model; use a new workdir',
    ) from None
  return jax.tree.unflatten(
    treedef, [jnp.asarray(v, dtype=t.dtype) for v, t in zip(leaves, flat)]
  )


def checkpoint_state(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The training state (step, history, best eval, config, fingerprint,
  finished) of the last checkpoint under `workdir`, or None."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  workdir = io_lib.as_path(workdir)
  if not (workdir / _CHECKPOINT).exists():
    return None
  manager = _checkpoint_manager(workdir)
  try:
    step = manager.latest_step()
    if step is None:
      return None
    return manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.JsonRestore())
    )['state']
  finally:
    manager.close()


def checkpoint_params(workdir: str | os.PathLike, like: PyTree) -> PyTree:
  """The parameters of the last checkpoint under `workdir`, in the
  structure and dtypes of `like` (arrays or `jax.ShapeDtypeStruct`s)."""
  workdir = io_lib.as_path(workdir)
  if not (workdir / _CHECKPOINT).exists():
    raise LeakjaxError(f'{workdir} holds no checkpoint')
  manager = _checkpoint_manager(workdir)
  try:
    step = manager.latest_step()
    if step is None:
      raise LeakjaxError(f'{manager.directory} holds no checkpoint')
    return _restore_tree(
      manager, step, 'params', jax.eval_shape(lambda p: p, like)
    )
  finally:
    manager.close()


def _is_complete(directory) -> bool:
  """Whether `_replace_directory` finished writing `directory`."""
  if io_lib.is_local(directory):
    return directory.is_dir()
  return (directory / _COMPLETE).exists()


def _replace_directory(directory, write: Callable[[Any], None]) -> None:
  """Fills a new `directory` with `write(folder)`, replacing it atomically.

  Locally: writes a sibling `<name>.new` folder, then swaps it in with two
  renames. Object stores rename a folder by copying each file, so there the
  old folder is deleted, `write` fills `directory` itself and a `.complete`
  marker is written last (:func:`_is_complete`).
  """
  if not io_lib.is_local(directory):
    if directory.exists():
      directory.rmtree()
    directory.mkdir(parents=True, exist_ok=True)
    write(directory)
    io_lib.atomic_write_text(directory / _COMPLETE, '')
    return
  directory = Path(directory)
  new = directory.with_name(directory.name + '.new')
  old = directory.with_name(directory.name + '.old')
  shutil.rmtree(new, ignore_errors=True)
  new.mkdir(parents=True)
  write(new)
  shutil.rmtree(old, ignore_errors=True)
  if directory.exists():
    os.replace(directory, old)
  os.replace(new, directory)
  shutil.rmtree(old, ignore_errors=True)


def _save_directory(model: Model, params: PyTree, directory) -> None:
  """`leakjax.models.save` into `directory`, replacing it atomically."""
  from leakjax import models  # pylint: disable=g-import-not-at-top

  _replace_directory(
    directory, lambda folder: models.save(model, params, folder)
  )


def _read_checkpoint(
  manager,
  template: PyTree,
  optimizer,
  config: TrainConfig,
  fingerprint: str,
):
  """(params, opt_state, best_params, state) of the manager's last step,
  or None without one; params take the structure and dtypes of
  `template`; opt_state is None when the run had finished."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  step = manager.latest_step()
  if step is None:
    return None
  folder = manager.directory
  try:
    state = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.JsonRestore())
    )['state']
  except (OSError, ValueError, KeyError) as e:
    raise LeakjaxError(
      f'cannot read the state of {folder} step {step}: {e}',
      'delete the checkpoint folder to start over',
    ) from None
  if not isinstance(state, dict) or state.get('version') != _STATE_VERSION:
    raise LeakjaxError(
      f'{folder} was written by another leakjax version', 'use a new workdir'
    )
  old, new = state['config'], _config_dict(config)
  changed = sorted(
    k
    for k in set(old) | set(new)
    if k not in _RESUME_FREE_FIELDS and old.get(k) != new.get(k)
  )
  if changed:
    raise LeakjaxError(
      f'{folder} holds a run with a different config (changed:'
      f' {", ".join(changed)})',
      'use a new workdir or delete the old one',
    )
  if state['fingerprint'] != fingerprint:
    raise LeakjaxError(
      f'{folder} holds a run with another fingerprint (other data or'
      ' another starting point)',
      'use a new workdir or delete the old one',
    )
  template = jax.eval_shape(lambda p: p, template)
  params = _restore_tree(manager, step, 'params', template)
  opt_state = None  # a finished run takes no further step
  if not state['finished']:
    opt_state = _restore_tree(
      manager, step, 'opt_state', jax.eval_shape(optimizer.init, template)
    )
  best_params = None
  best = state['best']
  if best is not None and config.restore_best:
    if best['step'] == state['step']:
      best_params = jax.tree.map(jnp.copy, params)
    else:
      best_params = _restore_tree(manager, step, 'best', template)
  return params, opt_state, best_params, state
