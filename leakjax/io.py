"""Atomic file writing and the experiment output contract.

Every experiment writes, under its `--workdir`:

* `config.json` -- the frozen config, once;
* `provenance.json` -- the sha256 of every named input and the environment
  (:mod:`leakjax.provenance`); a resumed run whose inputs changed is refused;
* `results.jsonl` -- one JSON object per attacked batch / case;
* `summary.json` -- a flat dict of headline metrics keyed
  `metric@param=value,param=value` (parameters in alphabetical order);
* `summary.md` -- tables and links to PNG plots.

Arrays (parameters, optimizer states, client updates) are written with
:func:`save_pytree` and read with :func:`load_pytree`: one safetensors file
per pytree, each leaf named by its key path, the one parameter format of the
library (`leakjax.models.save` writes the same format under Hugging Face's
names, for export).

Rows are appended to `results.jsonl` (and flushed) one at a time; every
other file is written to a temp file in the same folder followed by
`os.replace`. An interrupted run never leaves a truncated file, except
possibly the last line of `results.jsonl`, which the next run drops; a
re-run with the same workdir resumes from the rows already there.

Workdirs are `etils.epath` paths: a local folder or an object-store URL
(`gs://bucket/run`, with `pip install 'leakjax[gcs]'`; `s3://` and `az://`
through their fsspec packages). Object stores publish an object only once
its upload is complete, so a file there is written in one upload instead of
temp file + rename, and, having no append, `results.jsonl` is uploaded again
whole after each row (a few hundred rows of at most a few KB each).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import jax
import numpy as np
from etils import epath

from leakjax.errors import LeakjaxError

PyTree = Any


def as_path(path: str | os.PathLike) -> epath.Path:
  """`path` as an `etils.epath.Path`: local paths and URLs (`gs://...`)
  alike, where `pathlib.Path` would turn `gs://b` into a local `gs:/b`."""
  return epath.Path(path)


def is_local(path: str | os.PathLike) -> bool:
  """Whether `path` names a local file (not an object-store URL)."""
  return '://' not in os.fspath(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` via a temp file + rename; to an object store
  (`gs://...`) in one upload, which readers see only once complete."""
  if not is_local(path):
    path = as_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.')
  try:
    # mkstemp makes the file 0600; results are meant to be read by others
    # (reports, shared workdirs). Reading the umask would mean setting it,
    # which races with other threads, so use the common default.
    os.chmod(fd, 0o644)
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
  """`np.save` of one array, written atomically (local or URL)."""
  import io as _io  # pylint: disable=g-import-not-at-top

  buf = _io.BytesIO()
  np.save(buf, np.asarray(array), allow_pickle=False)
  atomic_write_bytes(path, buf.getvalue())


def load_npy(path: str | os.PathLike) -> Any:
  """`np.load` of a .npy array or a .npz archive (as a dict), local or URL."""
  import io as _io  # pylint: disable=g-import-not-at-top

  data = np.load(_io.BytesIO(as_path(path).read_bytes()), allow_pickle=False)
  if isinstance(data, np.ndarray):
    return data
  with data:
    return dict(data)


def is_primary() -> bool:
  """Whether this process writes shared outputs: JAX process 0. On a
  multi-host pod every host runs the same code; side files (caches,
  snapshots, histories) are written by this one only, and no host relies
  on reading what another wrote."""
  import jax  # pylint: disable=g-import-not-at-top

  return jax.process_index() == 0


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
  atomic_write_bytes(path, text.encode('utf-8'))


def jsonable(x: Any) -> Any:
  """`x` as plain JSON values: dataclasses and mappings become dicts,
  tuples lists, NumPy/JAX scalars and arrays Python numbers and lists,
  non-finite floats None, paths strings."""
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return {k: jsonable(v) for k, v in dataclasses.asdict(x).items()}
  if isinstance(x, Mapping):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if hasattr(x, 'tolist'):  # numpy / jax scalars and arrays
    return jsonable(x.tolist())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  if isinstance(x, os.PathLike):
    return os.fspath(x)
  return x


def config_from_json(cls: type, stored: Mapping[str, Any]) -> Any:
  """`cls` from config.json values; lists as tuples, unknown keys dropped."""
  names = {f.name for f in dataclasses.fields(cls)}
  tuples = {
    k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()
  }
  return cls(**{k: v for k, v in tuples.items() if k in names})


def summary_key(metric: str, **params: Any) -> str:
  """`summary_key('rougeL', b=16)` -> `'rougeL@b=16'` (params sorted)."""
  if not params:
    return metric
  inner = ','.join(f'{k}={params[k]}' for k in sorted(params))
  return f'{metric}@{inner}'


def _added_default_fields(config: Any, stored: Mapping[str, Any]) -> set[str]:
  """Fields of dataclass `config` missing from `stored`, at the value that
  keeps the old behaviour: the field's `metadata['before']` when a field
  added later changed what a run computes by default, else its default."""
  if not dataclasses.is_dataclass(config):
    return set()
  added = set()
  for f in dataclasses.fields(config):
    if f.name in stored:
      continue
    if f.default is not dataclasses.MISSING:
      default = f.default
    elif f.default_factory is not dataclasses.MISSING:
      default = f.default_factory()
    else:
      continue
    default = f.metadata.get('before', default)
    if getattr(config, f.name) == default:
      added.add(f.name)
  return added


def _record_fields(config: Any) -> set[str]:
  """Fields of dataclass `config` that record how it was made rather than
  what it computes (`dataclasses.field(compare=False)`, e.g. the name of
  the preset it started from)."""
  if not dataclasses.is_dataclass(config):
    return set()
  return {f.name for f in dataclasses.fields(config) if not f.compare}


def _without(values: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
  return {k: v for k, v in values.items() if k not in names}


# Writers of this process that created their workdir's config.json and
# have written nothing else yet (see `forget_unstarted_runs`).
_FRESH: list[ExperimentWriter] = []


def forget_unstarted_runs() -> None:
  """Deletes the config.json of every run of this process that wrote nothing
  else: called when a run fails on its inputs (a bad --data, a missing
  model), so that the corrected re-run in the same workdir is not refused
  as "a different config". Runs that wrote results keep their config.

  Best effort: it runs while the caller reports another error, so a file
  it cannot delete (a store whose file system is gone, e.g. a `gs://`
  workdir without gcsfs) is logged and left, never raised over that error.
  """
  while _FRESH:
    writer = _FRESH.pop()
    for name in ('config.json', 'provenance.json'):
      path = writer.workdir / name
      try:
        path.unlink()
      except FileNotFoundError:
        pass
      except Exception as e:  # pylint: disable=broad-exception-caught
        from absl import logging  # pylint: disable=g-import-not-at-top

        logging.warning('could not delete %s of a failed run: %r', path, e)


def _read_workdir_json(path: epath.Path) -> Any:
  """A JSON file of an earlier run in the workdir, or one error line."""
  try:
    return json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise LeakjaxError(
      f'cannot read {path}: {e}', 'use a new --workdir or delete the old one'
    ) from None


def check_workdir(workdir: str | os.PathLike) -> None:
  """Raises LeakjaxError if `workdir` is a file, lies under a file or sits
  where nothing can be written, without creating anything (so a runner
  can check it before slower checks of its inputs). Of a URL it checks
  only that it names no file: whether a bucket takes writes shows at the
  first write."""
  if not is_local(workdir):
    workdir = as_path(workdir)
    try:
      is_file = workdir.exists() and not workdir.is_dir()
    except ImportError as e:  # fsspec's message names the package
      raise LeakjaxError(
        f'--workdir {workdir}: {e}',
        "for gs:// pip install 'leakjax[gcs]' (gcsfs)",
      ) from None
    if is_file:
      raise LeakjaxError(
        f'--workdir {workdir} is a file, not a folder',
        'choose another --workdir',
      )
    return
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise LeakjaxError(
      f'--workdir {workdir} is a file, not a folder', 'choose another --workdir'
    )
  parent = workdir
  while not parent.exists() and parent != parent.parent:
    parent = parent.parent
  if parent != workdir and not parent.is_dir():
    raise LeakjaxError(
      f'--workdir {workdir} lies under a file, not a folder',
      'choose another --workdir',
    )
  if not os.access(parent, os.W_OK | os.X_OK):
    raise LeakjaxError(
      f'--workdir {workdir} is not writable'
      if parent == workdir
      else f'cannot create --workdir {workdir}: {parent} is not writable',
      'choose a folder you can write to',
    )


def _make_workdir(workdir: epath.Path) -> None:
  """Creates `workdir` (and its parents) or says in one line why not."""
  check_workdir(workdir)
  if not is_local(workdir):
    try:
      workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise LeakjaxError(
        f'cannot create --workdir {workdir}: {e}', 'check the URL and access'
      ) from None
    return
  try:
    workdir.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    raise LeakjaxError(
      f'--workdir {workdir} lies under a file, not a folder',
      'choose another --workdir',
    ) from None
  except OSError as e:
    raise LeakjaxError(
      f'cannot create --workdir {workdir}: {e.strerror}',
      'choose a folder you can write to',
    ) from None
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise LeakjaxError(
      f'--workdir {workdir} is not writable', 'choose a folder you can write to'
    )


class ExperimentWriter:
  """The one writer of an experiment's workdir (see module docstring)."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    config: Any,
    *,
    inputs: Mapping[str, str | os.PathLike | None] | None = None,
    enabled: bool | None = None,
  ):
    """Opens (or resumes) `workdir`.

    Args:
      workdir: the output folder, local or a URL such as `gs://b/run`.
      config: the run's config (a dataclass or dict), written once. A
        workdir whose config differs refuses to resume, except for fields
        the stored config lacks that are at their dataclass default: a run
        made before a field was added resumes (leakjax adds config fields
        with defaults that keep the old behaviour), and config.json is
        rewritten with them. Fields declared `compare=False` record how
        the config was made (the preset's name), not what it computes:
        they never block a resume, and config.json takes the new values.
      inputs: the run's input files or folders by name (the corpus, the
        model weights; None entries and non-paths are skipped). Their
        sha256 go to provenance.json with the environment; resuming after
        an input's bytes changed is refused.
      enabled: whether this process writes; default: only JAX process 0, so
        on a multi-host pod every host runs the same code and one writes.
    """
    if enabled is None:
      enabled = is_primary()
    self.enabled = enabled
    self.workdir = as_path(workdir)
    self.results: list[dict[str, Any]] = []
    self._results_path = self.workdir / 'results.jsonl'
    if not enabled:
      return
    _make_workdir(self.workdir)
    cfg = jsonable(config)
    cfg_path = self.workdir / 'config.json'
    if cfg_path.exists():
      old = _read_workdir_json(cfg_path)
      ignore = _added_default_fields(config, old) | _record_fields(config)
      if old != cfg and _without(old, ignore) == _without(cfg, ignore):
        atomic_write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True))
        old = cfg
      if old != cfg:
        changed = sorted(
          k for k in set(old) | set(cfg) if old.get(k) != cfg.get(k)
        )
        raise LeakjaxError(
          f'{self.workdir} holds a run with a different config (changed:'
          f' {", ".join(changed)})',
          'use a new --workdir or delete the old one',
        )
    else:
      atomic_write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True))
      _FRESH.append(self)
    self._record_provenance(inputs or {})
    if self._results_path.exists():
      self._read_results()

  def _read_results(self) -> None:
    """Reads results.jsonl; a torn last line (a run killed in the middle
    of an append) is dropped, and the file rewritten without it."""
    text = self._results_path.read_text()
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        self.results.append(json.loads(line))
      except json.JSONDecodeError:
        if number == len(lines) and not text.endswith('\n'):
          from absl import logging  # pylint: disable=g-import-not-at-top

          logging.warning(
            '%s: dropping its unfinished last line (the run was killed'
            ' while writing it); that row is recomputed',
            self._results_path,
          )
          atomic_write_text(
            self._results_path, ''.join(x + '\n' for x in lines[:-1])
          )
          return
        raise LeakjaxError(
          f'{self._results_path}, line {number}, is not JSON',
          'delete that line (or the file) to recompute it',
        ) from None

  def _record_provenance(self, inputs) -> None:
    """Writes provenance.json, or checks the inputs against it."""
    from leakjax import provenance  # pylint: disable=g-import-not-at-top

    path = self.workdir / 'provenance.json'
    fingerprints = provenance.fingerprint_inputs(inputs)
    env = provenance.environment()
    if not path.exists():
      record = {'inputs': fingerprints, 'environment': env}
    else:
      record = _read_workdir_json(path)
      provenance.check_inputs(
        record.get('inputs', {}), fingerprints, self.workdir
      )
      changes = provenance.environment_changes(
        record.get('environment', {}), env
      )
      if changes:
        from absl import logging  # pylint: disable=g-import-not-at-top

        logging.warning(
          'resuming %s in another environment: %s (provenance.json keeps'
          ' the first)',
          self.workdir,
          '; '.join(changes),
        )
      added = {
        k: v
        for k, v in fingerprints.items()
        if k not in record.get('inputs', {})
      }
      if not added:
        return
      record = {**record, 'inputs': {**record.get('inputs', {}), **added}}
    atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True))

  def _write(self, path: epath.Path, data: bytes) -> None:
    if self in _FRESH:
      _FRESH.remove(self)
    try:
      atomic_write_bytes(path, data)
    except OSError as e:
      raise LeakjaxError(
        f'cannot write {path}: {e.strerror}', 'check --workdir'
      ) from None

  def done(self, **match: Any) -> dict[str, Any] | None:
    """The first earlier result whose fields equal `match`, for resuming."""
    for r in self.results:
      if all(r.get(k) == v for k, v in match.items()):
        return r
    return None

  def add_result(self, row: Mapping[str, Any]) -> None:
    """Appends one row to results.jsonl, flushed to disk before it
    returns. A run killed mid-append leaves a torn last line, which the
    next run drops and recomputes (`_read_results`)."""
    row = jsonable(dict(row))
    self.results.append(row)
    if not self.enabled:
      return
    if self in _FRESH:
      _FRESH.remove(self)
    line = json.dumps(row, sort_keys=True) + '\n'
    try:
      if is_local(self._results_path):
        with open(self._results_path, 'a', encoding='utf-8') as f:
          f.write(line)
          f.flush()
          os.fsync(f.fileno())
      else:  # object stores have no append (module docstring)
        atomic_write_bytes(
          self._results_path,
          ''.join(
            json.dumps(r, sort_keys=True) + '\n' for r in self.results
          ).encode('utf-8'),
        )
    except OSError as e:
      raise LeakjaxError(
        f'cannot write {self._results_path}: {e.strerror}', 'check --workdir'
      ) from None

  def write_summary(
    self, summary: Mapping[str, float | str], markdown: str
  ) -> None:
    """Writes summary.json (numbers, and names such as the attack that
    produced a number) and summary.md."""
    bad = {
      k: v
      for k, v in summary.items()
      if not isinstance(v, (int, float, str)) or isinstance(v, bool)
    }
    if bad:
      raise TypeError(f'summary values must be numbers or names: {bad}')
    if not self.enabled:
      return
    self._write(
      self.workdir / 'summary.json',
      json.dumps(jsonable(dict(summary)), indent=2, sort_keys=True).encode(),
    )
    self._write(self.workdir / 'summary.md', markdown.encode('utf-8'))

  def save_figure(self, fig, name: str) -> str:
    """Saves a matplotlib figure as PNG atomically; returns the file name."""
    if not self.enabled:
      return name
    self._write(self.workdir / name, figure_png(fig))
    return name


def figure_png(fig) -> bytes:
  """A matplotlib figure as the PNG bytes every report writes (120 dpi,
  cropped to what is drawn)."""
  import io as _io  # pylint: disable=g-import-not-at-top

  buf = _io.BytesIO()
  fig.savefig(buf, format='png', dpi=120, bbox_inches='tight')
  return buf.getvalue()


class Progress:
  """Rate and time left of a loop of `total` units, for log lines.

  Only units computed in this process count towards the rate (resumed
  ones are skipped in no time).

  >>> p = Progress(total=10)
  >>> p.computed()  # after each computed unit            # doctest: +SKIP
  >>> p.skipped()   # after each unit found in results    # doctest: +SKIP
  >>> p.describe()                                       # doctest: +SKIP
  '4/10, 12.5 s each, about 1 min left'
  """

  def __init__(self, total: int):
    import time  # pylint: disable=g-import-not-at-top

    self._clock = time.perf_counter
    self.total = total
    self.done = 0
    self._computed = 0
    self._start = self._clock()

  def skipped(self) -> None:
    self.done += 1

  def computed(self) -> None:
    self.done += 1
    self._computed += 1

  def describe(self) -> str:
    text = f'{self.done}/{self.total}'
    if not self._computed:
      return text
    each = (self._clock() - self._start) / self._computed
    left = each * (self.total - self.done)
    when = f'{left / 60:.0f} min' if left >= 90 else f'{left:.0f} s'
    return f'{text}, {each:.1f} s each, about {when} left'


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
  """A GitHub markdown table; floats get 3 decimals."""

  def fmt(v):
    if isinstance(v, float):
      return 'nan' if math.isnan(v) else f'{v:.3f}'
    return str(v)

  header = list(header)
  lines = [
    '| ' + ' | '.join(header) + ' |',
    '|' + '|'.join('---' for _ in header) + '|',
  ]
  for r in rows:
    lines.append('| ' + ' | '.join(fmt(v) for v in r) + ' |')
  return '\n'.join(lines) + '\n'


# ------------------------------------------------------------ pytree files
# safetensors' NumPy reader knows only NumPy's own dtypes; leaves of other
# dtypes (bfloat16, float8) are stored as unsigned integers of their width
# and their dtype name goes into the file's metadata under this prefix.
_DTYPE_META = 'leakjax.dtype:'
_NUMPY_KINDS = frozenset('biuf')


def flatten_pytree(tree: PyTree) -> dict[str, np.ndarray]:
  """`{key path: NumPy leaf}` of a pytree, the names `jax.tree_util.keystr`
  gives (e.g. `"['params']['Dense_0']['kernel']"`)."""
  return {
    jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf))
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def unflatten_pytree(
  flat: Mapping[str, np.ndarray], like: PyTree, what: str
) -> PyTree:
  """Rebuilds `like`'s structure from :func:`flatten_pytree` output.

  Args:
    flat: leaves by key path.
    like: the template: arrays or `jax.ShapeDtypeStruct`s. Each leaf of
      `flat` must have the shape of its template leaf and is cast to its
      dtype.
    what: how errors name the source.

  Raises:
    LeakjaxError: a leaf of `like` is missing, `flat` holds a leaf `like`
      lacks, or a leaf has another shape.
  """
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  leaves, names = [], set()
  for key_path, template in paths:
    name = jax.tree_util.keystr(key_path)
    names.add(name)
    if name not in flat:
      raise LeakjaxError(
        f'{what} lacks {name}',
        'it was written for another model or optimizer; use a new workdir'
        ' or path',
      )
    value = flat[name]
    if tuple(value.shape) != tuple(template.shape):
      raise LeakjaxError(
        f'{what}: {name} has shape {tuple(value.shape)}, expected'
        f' {tuple(template.shape)}',
        'it was written for another model; use a new workdir or path',
      )
    leaves.append(jax.numpy.asarray(value, dtype=template.dtype))
  unused = sorted(set(flat) - names)
  if unused:
    raise LeakjaxError(
      f'{what} has unexpected entries ({unused[0]}, ...)',
      'it was written for another model or optimizer; use a new workdir'
      ' or path',
    )
  return jax.tree_util.tree_unflatten(treedef, leaves)


def pytree_bytes(tree: PyTree) -> bytes:
  """`tree` as safetensors bytes, each leaf named by its key path."""
  from safetensors.numpy import save  # pylint: disable=g-import-not-at-top

  flat, meta = {}, {}
  for name, value in flatten_pytree(tree).items():
    if value.dtype.kind not in _NUMPY_KINDS or value.dtype.name == 'bfloat16':
      meta[_DTYPE_META + name] = value.dtype.name
      value = value.view(f'u{value.dtype.itemsize}')
    # Not np.ascontiguousarray: it turns 0-d leaves into shape (1,).
    flat[name] = np.require(value, requirements='C')
  return save(flat, metadata=meta or None)


def save_pytree(path: str | os.PathLike, tree: PyTree) -> None:
  """Writes a pytree of arrays to a safetensors file, atomically.

  Leaves keep their dtypes; :func:`load_pytree` reads the file back into
  the structure of a template.
  """
  atomic_write_bytes(path, pytree_bytes(tree))


def load_pytree(
  path: str | os.PathLike, like: PyTree, *, what: str | None = None
) -> PyTree:
  """Reads a :func:`save_pytree` file into the structure of `like`.

  Args:
    path: the safetensors file.
    like: a pytree of the same structure, arrays or `jax.ShapeDtypeStruct`s
      (e.g. from `jax.eval_shape`); see :func:`unflatten_pytree`.
    what: how errors name the file (default: its path).

  Returns:
    The pytree, leaves as `jax.Array`.

  Raises:
    LeakjaxError: the file cannot be read or does not fit `like`.
  """
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  what = what or str(path)
  try:
    if is_local(path):
      with safe_open(str(path), framework='numpy') as f:
        meta = f.metadata() or {}
        flat = {name: f.get_tensor(name) for name in f.keys()}
    else:  # safetensors reads local files: download to a temp file first
      with tempfile.NamedTemporaryFile(suffix='.safetensors') as tmp:
        tmp.write(as_path(path).read_bytes())
        tmp.flush()
        with safe_open(tmp.name, framework='numpy') as f:
          meta = f.metadata() or {}
          flat = {name: f.get_tensor(name) for name in f.keys()}
  except Exception as e:  # safetensors raises several types  # noqa: BLE001
    raise LeakjaxError(
      f'cannot read {what}: {type(e).__name__}: {e}',
      'delete the file to compute it again',
    ) from None
  for name, dtype in meta.items():
    if name.startswith(_DTYPE_META) and name[len(_DTYPE_META) :] in flat:
      key = name[len(_DTYPE_META) :]
      flat[key] = flat[key].view(np.dtype(dtype))
  return unflatten_pytree(flat, like, what)
