"""Fingerprints of a run: what went in, and where it ran.

Every experiment writes `provenance.json` beside its `config.json`:

* `inputs`: for each named input (the corpus, the model weights), its path
  and the sha256 of its bytes (a directory: of its files' names and bytes);
* `environment`: the leakjax version and git commit (when run from a
  checkout), Python and the versions of the numerical packages, and the
  JAX devices.

A run resumed in the same workdir is refused when an input's sha256 has
changed (rows of two corpora would otherwise mix in one summary). A changed
environment is logged, not refused: results of one run may come from two
library versions, and `provenance.json` keeps the first.

>>> fingerprint_inputs({'data': 'corpus.txt'})  # doctest: +SKIP
{'data': {'path': 'corpus.txt', 'sha256': '9f86d0...'}}
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from leakjax.errors import LeakjaxError

# The packages whose versions can move a number.
PACKAGES = (
  'jax',
  'jaxlib',
  'flax',
  'optax',
  'numpy',
  'tokenizers',
  'gguf',
  'rouge-score',
  'spacy',
  'torch',
  'transformers',
)

_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
  """sha256 of a file's bytes, or of a directory's (relative names and
  bytes of every file, in sorted order).

  Cached in the process by (path, size, mtime), so a model file read by
  several runs is hashed once.
  """
  path = Path(path)
  if path.is_dir():
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob('*') if p.is_file()):
      digest.update(str(f.relative_to(path)).encode() + b'\0')
      digest.update(bytes.fromhex(file_sha256(f)))
    return digest.hexdigest()
  try:
    stat = path.stat()
  except OSError as e:
    raise LeakjaxError(
      f'cannot read {path}: {e.strerror}', 'check the path'
    ) from None
  key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
  if key not in _FILE_HASHES:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
    _FILE_HASHES[key] = digest.hexdigest()
  return _FILE_HASHES[key]


def pytree_sha256(tree: Any) -> str:
  """sha256 of a pytree of arrays: each leaf's key path, dtype, shape and
  bytes (weights passed in memory, with no file behind them)."""
  import jax  # pylint: disable=g-import-not-at-top

  digest = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    array = np.asarray(leaf)
    digest.update(
      f'{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}'.encode()
    )
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()


def texts_sha256(texts: Sequence[str]) -> str:
  """sha256 of a corpus as loaded: its texts in order, each UTF-8 encoded
  and length-prefixed (so no two corpora share a fingerprint by how their
  texts split)."""
  h = hashlib.sha256()
  for t in texts:
    b = t.encode('utf-8')
    h.update(len(b).to_bytes(8, 'little'))
    h.update(b)
  return h.hexdigest()


def fingerprint_inputs(
  inputs: Mapping[str, str | os.PathLike | Sequence[str] | None],
) -> dict[str, dict[str, str]]:
  """`{name: {'path', 'sha256'}}` of the inputs that are files, folders,
  named data sets (:mod:`leakjax.datasets`, by their cached file) or
  loaded corpora (a list or tuple of texts: the corpus as the run read
  it, whatever its source, a Hugging Face dataset or the embedded one
  included; its `path` says how many texts); None and other names are
  skipped."""
  from leakjax import datasets  # pylint: disable=g-import-not-at-top

  out = {}
  for name, path in sorted(inputs.items()):
    if isinstance(path, (list, tuple)):
      out[name] = {'path': f'{len(path)} texts', 'sha256': texts_sha256(path)}
      continue
    if path is not None and str(path) in datasets.REGISTRY:
      path = datasets.path(str(path))
    if path is None or not Path(path).exists():
      continue
    out[name] = {'path': str(path), 'sha256': file_sha256(path)}
  return out


def _git_commit() -> dict[str, Any] | None:
  """HEAD of the checkout leakjax runs from (None when installed)."""
  root = Path(__file__).resolve().parents[1]
  if not (root / '.git').exists():
    return None
  try:
    head = subprocess.run(
      ['git', '-C', str(root), 'rev-parse', 'HEAD'],
      capture_output=True,
      text=True,
      check=True,
      timeout=10,
    ).stdout.strip()
    dirty = subprocess.run(
      ['git', '-C', str(root), 'status', '--porcelain', '--untracked-files=no'],
      capture_output=True,
      text=True,
      check=True,
      timeout=10,
    ).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return {'commit': head, 'modified': bool(dirty)}


def _cpu() -> dict[str, Any]:
  """The host CPU's model and vector extensions (Linux; else the model).

  XLA compiles for the host's instruction set, so float32 results can
  differ in their last bits between CPUs (AVX2 against AVX-512, say), and
  a long run (fine-tuning, then a beam search) can then choose otherwise.
  """
  model, flags = platform.processor() or platform.machine(), []
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      info = f.read()
  except OSError:
    return {'model': model}
  for line in info.splitlines():
    key, _, value = line.partition(':')
    if key.strip() == 'model name' and value.strip():
      model = value.strip()
    elif key.strip() == 'flags':
      flags = sorted(
        x for x in value.split() if x.startswith(('avx', 'fma', 'amx'))
      )
      break
  return {'model': model, 'vector': flags}


def environment() -> dict[str, Any]:
  """leakjax version and commit, Python, package versions, JAX devices,
  the host CPU."""
  import jax  # pylint: disable=g-import-not-at-top

  import leakjax  # pylint: disable=g-import-not-at-top

  versions = {}
  for name in PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  devices = jax.devices()
  return {
    'leakjax': leakjax.__version__,
    'git': _git_commit(),
    'python': platform.python_version(),
    'platform': platform.platform(),
    'packages': versions,
    'devices': {
      'platform': devices[0].platform,
      'kind': devices[0].device_kind,
      'count': len(devices),
      'processes': jax.process_count(),
    },
    'cpu': _cpu(),
  }


def check_inputs(
  old: Mapping[str, Mapping[str, str]],
  new: Mapping[str, Mapping[str, str]],
  workdir: str | os.PathLike,
) -> None:
  """Raises LeakjaxError when an input both runs name has other bytes."""
  for name in sorted(set(old) & set(new)):
    if old[name]['sha256'] != new[name]['sha256']:
      raise LeakjaxError(
        f'{workdir} holds a run whose input {name!r} ({new[name]["path"]})'
        f' has changed since it began (sha256 {old[name]["sha256"][:12]}…'
        f' then, {new[name]["sha256"][:12]}… now)',
        'use a new --workdir, or restore the input it was started with',
      )


def environment_changes(
  old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[str]:
  """Human-readable differences between two `environment()` records."""
  changes = []
  for key in ('leakjax', 'python'):
    if old.get(key) != new.get(key):
      changes.append(f'{key} {old.get(key)} -> {new.get(key)}')
  old_commit = (old.get('git') or {}).get('commit')
  new_commit = (new.get('git') or {}).get('commit')
  if old_commit != new_commit:
    changes.append(f'commit {old_commit} -> {new_commit}')
  old_pk, new_pk = old.get('packages', {}), new.get('packages', {})
  for name in sorted(set(old_pk) | set(new_pk)):
    if old_pk.get(name) != new_pk.get(name):
      changes.append(f'{name} {old_pk.get(name)} -> {new_pk.get(name)}')
  if old.get('devices') != new.get('devices'):
    changes.append(f'devices {old.get("devices")} -> {new.get("devices")}')
  if 'cpu' in old and old['cpu'] != new.get('cpu'):
    changes.append(f'cpu {old["cpu"]} -> {new.get("cpu")}')
  return changes


__all__ = [
  'PACKAGES',
  'check_inputs',
  'environment',
  'environment_changes',
  'file_sha256',
  'fingerprint_inputs',
  'pytree_sha256',
]
