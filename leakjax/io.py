"""Atomic file writing and the experiment output contract.

Every experiment writes, under its `--workdir`:

* `config.json` -- the frozen config, once;
* `results.jsonl` -- one JSON object per attacked batch / case;
* `summary.json` -- a flat dict of headline metrics keyed
  `metric@param=value,param=value` (parameters in alphabetical order);
* `summary.md` -- tables and links to PNG plots.

All writes go to a temp file in the same folder followed by `os.replace`, so
an interrupted run never leaves a truncated file, and a re-run with the same
workdir resumes from the rows already in `results.jsonl`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from leakjax.errors import LeakjaxError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Writes `data` to `path` via a temp file + rename."""
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
  if isinstance(x, Path):
    return str(x)
  return x


def summary_key(metric: str, **params: Any) -> str:
  """`summary_key('rougeL', b=16)` -> `'rougeL@b=16'` (params sorted)."""
  if not params:
    return metric
  inner = ','.join(f'{k}={params[k]}' for k in sorted(params))
  return f'{metric}@{inner}'


def _added_default_fields(config: Any, stored: Mapping[str, Any]) -> set[str]:
  """Fields of dataclass `config` missing from `stored`, at their default."""
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
    if getattr(config, f.name) == default:
      added.add(f.name)
  return added


class ExperimentWriter:
  """The one writer of an experiment's workdir (see module docstring)."""

  def __init__(
    self,
    workdir: str | os.PathLike,
    config: Any,
    *,
    enabled: bool | None = None,
  ):
    """Opens (or resumes) `workdir`.

    Args:
      workdir: the output folder.
      config: the run's config (a dataclass or dict), written once. A
        workdir whose config differs refuses to resume, except for fields
        the stored config lacks that are at their dataclass default: a run
        made before a field was added resumes (leakjax adds config fields
        with defaults that keep the old behaviour), and config.json is
        rewritten with them.
      enabled: whether this process writes; default: only JAX process 0, so
        on a multi-host pod every host runs the same code and one writes.
    """
    if enabled is None:
      import jax  # pylint: disable=g-import-not-at-top

      enabled = jax.process_index() == 0
    self.enabled = enabled
    self.workdir = Path(workdir)
    self.results: list[dict[str, Any]] = []
    self._results_path = self.workdir / 'results.jsonl'
    if not enabled:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    cfg = jsonable(config)
    cfg_path = self.workdir / 'config.json'
    if cfg_path.exists():
      old = json.loads(cfg_path.read_text())
      added = _added_default_fields(config, old)
      if added and old == {k: v for k, v in cfg.items() if k not in added}:
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
    if self._results_path.exists():
      for line in self._results_path.read_text().splitlines():
        if line.strip():
          self.results.append(json.loads(line))

  def done(self, **match: Any) -> dict[str, Any] | None:
    """The first earlier result whose fields equal `match`, for resuming."""
    for r in self.results:
      if all(r.get(k) == v for k, v in match.items()):
        return r
    return None

  def add_result(self, row: Mapping[str, Any]) -> None:
    """Appends one row to results.jsonl (rewritten atomically)."""
    self.results.append(jsonable(dict(row)))
    if not self.enabled:
      return
    text = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in self.results)
    atomic_write_text(self._results_path, text)

  def write_summary(self, summary: Mapping[str, float], markdown: str) -> None:
    bad = {
      k: v
      for k, v in summary.items()
      if not isinstance(v, (int, float)) or isinstance(v, bool)
    }
    if bad:
      raise TypeError(f'summary values must be numbers: {bad}')
    if not self.enabled:
      return
    atomic_write_text(
      self.workdir / 'summary.json',
      json.dumps(jsonable(dict(summary)), indent=2, sort_keys=True),
    )
    atomic_write_text(self.workdir / 'summary.md', markdown)

  def save_figure(self, fig, name: str) -> str:
    """Saves a matplotlib figure as PNG atomically; returns the file name."""
    import io as _io  # pylint: disable=g-import-not-at-top

    if not self.enabled:
      return name
    buf = _io.BytesIO()
    fig.savefig(buf, format='png', dpi=120, bbox_inches='tight')
    atomic_write_bytes(self.workdir / name, buf.getvalue())
    return name


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
