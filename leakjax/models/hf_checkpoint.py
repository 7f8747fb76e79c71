"""Reading and writing Hugging Face-format checkpoints (safetensors).

One explicit name map per family (`hf_name -> TensorSpec`) converts between
the flat HF tensor names and our nested Flax params. Loading checks every
tensor against the shapes of `jax.eval_shape(init)` and fails with one line
on missing, unused or mis-shaped tensors and on NaN/inf values. Pickled
`.bin` checkpoints are refused unless torch can read them with
`weights_only=True` (which never runs pickled code).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from leakjax.errors import LeakjaxError
from leakjax.io import as_path, atomic_write_bytes, atomic_write_text


def _identity(x: np.ndarray) -> np.ndarray:
  return x


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """How one HF tensor maps to one leaf of our params.

  Attributes:
    path: keys into the Flax params dict.
    to_flax: HF array -> our array (e.g. a transpose).
    to_hf: our array -> HF array (inverse of `to_flax`).
  """

  path: tuple[str, ...]
  to_flax: Callable[[np.ndarray], np.ndarray] = _identity
  to_hf: Callable[[np.ndarray], np.ndarray] = _identity


def transpose() -> dict[str, Callable[[np.ndarray], np.ndarray]]:
  """Spec kwargs for a torch Linear weight `[out, in]` <-> Dense `[in, out]`."""
  return dict(to_flax=lambda w: w.T, to_hf=lambda w: w.T)


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
  """Reads `directory/config.json` with clear errors."""
  directory = Path(directory)
  if not directory.exists():
    raise LeakjaxError(
      f'checkpoint path {directory} does not exist', 'check the path'
    )
  f = directory / 'config.json'
  if not f.is_file():
    raise LeakjaxError(
      f'{directory} has no config.json',
      'point at a Hugging Face checkpoint directory',
    )
  try:
    return json.loads(f.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise LeakjaxError(f'cannot read {f}: {e}') from None


def read_tensors(directory: str | os.PathLike) -> dict[str, np.ndarray]:
  """All tensors of an HF checkpoint directory as float32/int numpy arrays.

  Reads `model.safetensors`, or the shards listed in
  `model.safetensors.index.json`; falls back to `pytorch_model.bin` only via
  `torch.load(weights_only=True)`.
  """
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  directory = Path(directory)
  single = directory / 'model.safetensors'
  index = directory / 'model.safetensors.index.json'
  files: list[Path]
  if single.is_file():
    files = [single]
  elif index.is_file():
    shards = sorted(set(json.loads(index.read_text())['weight_map'].values()))
    files = [directory / s for s in shards]
  elif (directory / 'pytorch_model.bin').is_file():
    return _read_torch_bin(directory / 'pytorch_model.bin')
  else:
    raise LeakjaxError(
      f'{directory} has no weights (model.safetensors or pytorch_model.bin)',
      'point at a complete checkpoint directory',
    )
  tensors: dict[str, np.ndarray] = {}
  for f in files:
    if not f.is_file():
      raise LeakjaxError(f'weight shard {f} is missing')
    try:
      loaded = _load_safetensors_any_dtype(f, load_file)
    except LeakjaxError:
      raise
    except Exception as e:  # safetensors raises its own error types
      raise LeakjaxError(
        f'cannot read {f}: {e}', 'the file is corrupt; re-export it'
      ) from None
    tensors.update(loaded)
  return tensors


def _load_safetensors_any_dtype(path: Path, load_file) -> dict[str, np.ndarray]:
  try:
    return dict(load_file(str(path)))
  except (TypeError, ValueError) as e:
    if 'bf16' not in str(e).lower() and 'bfloat' not in str(e).lower():
      raise
  # numpy has no bfloat16: go through torch.
  from safetensors.torch import load_file as load_torch  # pylint: disable=g-import-not-at-top

  return {k: v.float().numpy() for k, v in load_torch(str(path)).items()}


def _read_torch_bin(path: Path) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise LeakjaxError(
      f'{path} is a pickled PyTorch checkpoint; leakjax never unpickles',
      'convert it to model.safetensors, or install torch so it can be read'
      ' with torch.load(weights_only=True)',
    ) from None
  try:
    state = torch.load(str(path), map_location='cpu', weights_only=True)
  except Exception as e:  # torch raises UnpicklingError and others
    raise LeakjaxError(
      f'{path} cannot be loaded with torch.load(weights_only=True)'
      f' ({_unpickling_reason(e)}); leakjax never runs pickled code',
      'convert it to model.safetensors where you trust its source',
    ) from None
  return {
    k: v.float().numpy() if v.is_floating_point() else v.numpy()
    for k, v in state.items()
  }


def _unpickling_reason(error: Exception) -> str:
  """What torch refused, without its advice to retry unsafely.

  torch's message suggests `weights_only=False` or allowlisting the
  file's globals, both of which run code from the file; only the first
  sentence of its diagnosis (`WeightsUnpickler error: ...`) or the
  exception type is kept.
  """
  text = str(error)
  marker = 'WeightsUnpickler error:'
  if marker in text:
    detail = text.split(marker, 1)[1].strip().splitlines()[0]
    detail = detail.split('. ', 1)[0].rstrip('.')  # its first sentence
    return f'{type(error).__name__}: {detail}'[:300]
  first = text.strip().splitlines()[0] if text.strip() else ''
  if 'weights_only' in first:  # advice, not a diagnosis
    first = ''
  return (
    f'{type(error).__name__}: {first}'[:300] if first else type(error).__name__
  )


def _shapes_by_path(tree) -> dict[tuple[str, ...], tuple[int, ...]]:
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out[tuple(k.key for k in path)] = tuple(leaf.shape)
  return out


def params_from_hf(
  tensors: Mapping[str, np.ndarray],
  specs: Mapping[str, TensorSpec],
  abstract_params,
  *,
  ignore: Sequence[str] = (),
  source: str = 'checkpoint',
  dtype=np.float32,
):
  """Builds nested params from HF tensors, checking names and shapes.

  Args:
    tensors: flat HF name -> array.
    specs: HF name -> TensorSpec, one entry per tensor the model needs.
    abstract_params: `jax.eval_shape(init)` params (shapes to check against).
    ignore: regexes of HF names that may be present and are not used (e.g.
      attention-mask buffers).
    source: file name for error messages.
    dtype: float dtype of the returned params.

  Returns:
    The nested params dict (numpy arrays).
  """
  expected = _shapes_by_path(abstract_params)
  missing = [n for n in specs if n not in tensors]
  if missing:
    raise LeakjaxError(
      f'{source} is missing {len(missing)} tensors: {", ".join(missing[:5])}'
      + (' ...' if len(missing) > 5 else ''),
      'the checkpoint does not match its config.json',
    )
  unused = [
    n
    for n in tensors
    if n not in specs and not any(re.fullmatch(p, n) for p in ignore)
  ]
  if unused:
    raise LeakjaxError(
      f'{source} has {len(unused)} tensors the model does not use: '
      + ', '.join(sorted(unused)[:5])
      + (' ...' if len(unused) > 5 else ''),
      'the checkpoint is of another architecture or config',
    )
  covered = {s.path for s in specs.values()}
  if covered != set(expected):
    raise AssertionError(
      f'name map does not cover params: {sorted(set(expected) ^ covered)[:5]}'
    )
  params: dict[str, Any] = {}
  for name, spec in specs.items():
    value = np.asarray(spec.to_flax(np.asarray(tensors[name])))
    want = expected[spec.path]
    if tuple(value.shape) != want:
      raise LeakjaxError(
        f'{source}: tensor {name} has shape {tuple(tensors[name].shape)},'
        f' the model expects {want} (after conversion)',
        'the checkpoint does not match its config.json',
      )
    if value.dtype.kind == 'f':
      if not np.isfinite(value).all():
        raise LeakjaxError(
          f'{source}: tensor {name} contains NaN/inf',
          'the checkpoint is corrupt; re-export it',
        )
      value = value.astype(dtype)
    node = params
    for key in spec.path[:-1]:
      node = node.setdefault(key, {})
    node[spec.path[-1]] = value
  return params


def params_to_hf(
  params, specs: Mapping[str, TensorSpec]
) -> dict[str, np.ndarray]:
  """Inverse of `params_from_hf`: flat HF name -> float32 numpy array."""
  out = {}
  for name, spec in specs.items():
    node = params
    for key in spec.path:
      node = node[key]
    out[name] = np.ascontiguousarray(
      spec.to_hf(np.asarray(node, dtype=np.float32))
    )
  return out


def write_checkpoint(
  directory: str | os.PathLike,
  tensors: Mapping[str, np.ndarray],
  config: Mapping[str, Any],
) -> None:
  """Writes `config.json` + `model.safetensors` atomically."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top

  directory = as_path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  atomic_write_bytes(
    directory / 'model.safetensors',
    save(dict(tensors), metadata={'format': 'pt'}),
  )
  atomic_write_text(
    directory / 'config.json',
    json.dumps(dict(config), indent=2, sort_keys=True),
  )
