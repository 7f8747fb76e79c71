"""Named presets of an experiment's config, the way optax names its
optimizers: a preset is the handful of config fields that make a named
setting, and where that setting was chosen and measured.

Every attack package has a `presets` module with a :class:`Presets` of its
experiment config holding at least

* `paper` -- the paper's own protocol;
* `strongest` -- the best setting measured on data it was not chosen on
  (where nothing has beaten the paper's, the same fields as `paper`, and
  its record says so).

A preset's fields fill the config; the fields a caller gives win (a nested
config's as a dict, merged field by field):

  from leakjax.attacks.dager import presets
  cfg = presets.config('strongest', batch_sizes=(64,))

`python -m experiments.<paper> --preset=NAME` does the same with flags: a
flag given on the command line or in a flagfile overrides the preset.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from leakjax.errors import LeakjaxError


@dataclasses.dataclass(frozen=True)
class Preset:
  """One named setting.

  Attributes:
    description: one line: what the setting is.
    fields: the config fields it sets (a nested config's as a dict of its
      fields); the rest keep their defaults.
    chosen: where the setting was chosen (a paper's section, or a report
      folder and the data split).
    measured: where it was measured, on data it was not chosen on (a report
      folder), or why there is no such measurement.
  """

  description: str
  fields: Mapping[str, Any]
  chosen: str
  measured: str


SPLITS = ('dev', 'test')


def split_record():
  """A config's `split` field: a record of which split its data are (`dev`:
  settings were chosen on them; `test`: reported, nothing chosen on them;
  None: not said). It computes nothing (`compare=False`), so config.json
  says it and a resumed run never refuses it; :func:`check_split` checks
  its value."""
  return dataclasses.field(default=None, compare=False)


def check_split(split: str | None) -> None:
  if split is not None and split not in SPLITS:
    raise LeakjaxError(
      f'unknown --split {split!r}', f'use one of {", ".join(SPLITS)}'
    )


class Presets(Mapping):
  """The presets of one experiment config class, by name.

  Args:
    config_class: the frozen config dataclass the presets fill. When it has
      a `preset` field, :meth:`config` records the preset's name there.
    default: the name used when none is given.
    **presets: the presets by name.
  """

  def __init__(self, config_class: type, *, default: str, **presets: Preset):
    if default not in presets:
      raise ValueError(f'default {default!r} is not among {list(presets)}')
    names = {f.name for f in dataclasses.fields(config_class)}
    for name, preset in presets.items():
      unknown = set(preset.fields) - names
      if unknown:
        raise ValueError(
          f'preset {name!r} sets unknown {config_class.__name__} fields'
          f' {sorted(unknown)}'
        )
    self.config_class = config_class
    self.default = default
    self._presets = dict(presets)

  def __getitem__(self, name: str) -> Preset:
    if name not in self._presets:
      raise LeakjaxError(
        f'unknown preset {name!r}', f'use one of {", ".join(self._presets)}'
      )
    return self._presets[name]

  def __iter__(self):
    return iter(self._presets)

  def __len__(self) -> int:
    return len(self._presets)

  def overrides(self, name: str) -> dict[str, Any]:
    """A copy of the fields preset `name` sets (a nested config's as a
    dict)."""
    return copy.deepcopy(dict(self[name].fields))

  def config(self, name: str | None = None, **fields):
    """The config of preset `name` (default: :attr:`default`), `fields`
    overriding it; a nested config given as a dict (or as a config) is
    merged into the preset's field by field."""
    name = self.default if name is None else name
    values = self.overrides(name)
    for key, given in fields.items():
      base = values.get(key)
      if isinstance(base, dict):
        if dataclasses.is_dataclass(given):
          given = {
            f.name: getattr(given, f.name) for f in dataclasses.fields(given)
          }
        if isinstance(given, dict):
          given = {**base, **given}
      values[key] = given
    defaults = {
      f.name: f
      for f in dataclasses.fields(self.config_class)
      if isinstance(values.get(f.name), dict)
    }
    for key, field in defaults.items():
      values[key] = dataclasses.replace(_default(field), **values[key])
    if 'preset' in {f.name for f in dataclasses.fields(self.config_class)}:
      values.setdefault('preset', name)
    return self.config_class(**values)

  def describe(self) -> str:
    """One line per preset (for `--help`)."""
    return '; '.join(
      f'{name} ({preset.description})' for name, preset in self.items()
    )


def _default(field: dataclasses.Field):
  if field.default is not dataclasses.MISSING:
    return field.default
  return field.default_factory()


__all__ = ['Preset', 'Presets']
