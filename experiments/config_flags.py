"""Command-line flags generated from a frozen config dataclass.

:func:`define_config_flags` defines one absl flag per field of a config
(nested configs as `outer.inner`), typed from its annotation and
documented from the `Attributes:` block of its docstring;
:func:`config_from_flags` builds the config back from the parsed flags.
:func:`define_preset_flag` and :func:`config_from_preset_flags` add
`--preset=NAME`, whose settings the flags given on the command line
override.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from typing import Sequence

from absl import flags

from leakjax.errors import LeakjaxError

FLAGS = flags.FLAGS


def _attribute_docs(cls) -> dict[str, str]:
  """`name -> text` from the `Attributes:` block of `cls`'s docstring.

  Google style: `name: text` lines, continuation lines indented deeper;
  `a, b: text` documents several fields at once.
  """
  lines = inspect.getdoc(cls).splitlines() if cls.__doc__ else []
  docs: dict[str, str] = {}
  inside, names, indent = False, [], None
  for line in lines:
    if line.strip() == 'Attributes:':
      inside = True
      continue
    if not inside:
      continue
    if line and not line.startswith(' '):
      break  # the next section
    stripped = line.strip()
    depth = len(line) - len(line.lstrip())
    head = re.match(r'^([\w, ]+):\s*(.*)$', stripped)
    if head and (indent is None or depth <= indent):
      indent = depth
      names = [n.strip() for n in head.group(1).split(',')]
      for n in names:
        docs[n] = head.group(2)
    elif names and stripped:
      for n in names:
        docs[n] = f'{docs[n]} {stripped}'.strip()
  return docs


def _flag_kind(annotation) -> tuple[str, type | None]:
  """('integer'|'float'|'bool'|'string'|'list', element type) of a field."""
  origin = typing.get_origin(annotation)
  args = [a for a in typing.get_args(annotation) if a is not type(None)]
  if origin in (typing.Union, types.UnionType) and len(args) == 1:
    return _flag_kind(args[0])
  if origin is tuple:
    return 'list', args[0] if args else str
  kinds = {int: 'integer', float: 'float', bool: 'bool', str: 'string'}
  if annotation in kinds:
    return kinds[annotation], None
  raise TypeError(f'no flag type for {annotation!r}')


def _nested(hint) -> type | None:
  """The dataclass a field holds (a nested config), else None."""
  return hint if dataclasses.is_dataclass(hint) else None


def _field_default(field: dataclasses.Field):
  default = field.default
  if default is dataclasses.MISSING:
    default = field.default_factory()  # type: ignore[misc]
  return default


def define_config_flags(cls, *, skip: Sequence[str] = ()) -> None:
  """One absl flag per field of the frozen config dataclass `cls`.

  The flag's name, type and default are the field's; its help is the
  field's entry in the class docstring's `Attributes:` block, so the flags
  cannot drift from the config. Tuple fields are comma-separated lists. A
  field holding a nested config dataclass (`hybrid: HybridConfig`) gives
  one flag `--<field>_<name>` per field of the nested class, with its
  default and its help from the nested class's docstring; the nested
  class's own dataclass fields get none (they keep their defaults).
  Fields already defined as flags (e.g. by :func:`define_common_flags`) and
  those in `skip` (nested ones by their flag name) are left alone.
  """
  docs = _attribute_docs(cls)
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    if field.name in skip or field.name in FLAGS:
      continue
    if field.name not in docs:
      raise TypeError(f'{cls.__name__}.{field.name} has no docstring entry')
    nested = _nested(hints[field.name])
    if nested is None:
      _define_flag(
        field.name, hints[field.name], _field_default(field), docs[field.name]
      )
      continue
    inner_docs = _attribute_docs(nested)
    inner_hints = typing.get_type_hints(nested)
    inner_default = _field_default(field)
    for inner in dataclasses.fields(nested):
      name = f'{field.name}_{inner.name}'
      if name in skip or name in FLAGS or _nested(inner_hints[inner.name]):
        continue
      if inner.name not in inner_docs:
        raise TypeError(
          f'{nested.__name__}.{inner.name} has no docstring entry'
        )
      _define_flag(
        name,
        inner_hints[inner.name],
        getattr(inner_default, inner.name),
        inner_docs[inner.name],
      )


def _define_flag(name: str, hint, default, doc: str) -> None:
  kind, _ = _flag_kind(hint)
  if kind == 'list':
    default = None if default is None else [str(x) for x in default]
    flags.DEFINE_list(name, default, doc)
  else:
    getattr(flags, f'DEFINE_{kind}')(name, default, doc)


def define_preset_flag(presets) -> None:
  """--preset: one of `presets` (a :class:`leakjax.presets.Presets`), its
  default theirs; :func:`config_from_flags` fills the flags not given
  from it."""
  flags.DEFINE_enum(
    'preset',
    presets.default,
    list(presets),
    'Named preset that sets the defaults: '
    + presets.describe()
    + '. Flags given on the command line or in a flagfile override it.',
  )


def config_from_preset_flags(presets, **overrides):
  """The config of the parsed flags, `--preset`'s values where a flag was
  not given (the config records the preset's name when it has a `preset`
  field: the `--preset` flag fills it)."""
  return config_from_flags(
    presets.config_class, preset=presets.overrides(FLAGS.preset), **overrides
  )


def _flag_value(name: str, hint, preset: dict, key: str):
  """The flag `name`'s value, typed; a preset's value where the flag was
  not given (`preset[key]`)."""
  flag = FLAGS[name]
  if not flag.present and key in preset:
    return preset[key]
  value = flag.value
  kind, element = _flag_kind(hint)
  if kind == 'list' and value is not None:
    try:
      value = tuple(element(x) for x in value)
    except ValueError:
      raise LeakjaxError(
        f'--{name}={",".join(value)}: each item must be a {element.__name__}'
      ) from None
  return value


def config_from_flags(cls, *, preset: dict | None = None, **overrides):
  """`cls(**{field: FLAGS.field})`, list flags parsed to typed tuples, a
  nested config rebuilt from its `--<field>_<name>` flags.

  `preset` (e.g. :func:`leakjax.attacks.dager.presets.overrides`) gives
  the values of the flags not set on the command line or in a flagfile
  (a nested config's as a dict); `overrides` win over both.
  """
  preset = dict(preset or {})
  hints = typing.get_type_hints(cls)
  values = {}
  for field in dataclasses.fields(cls):
    if field.name in overrides:
      continue
    nested = _nested(hints[field.name])
    if nested is None:
      if field.name in FLAGS:
        values[field.name] = _flag_value(
          field.name, hints[field.name], preset, field.name
        )
      continue
    inner_preset = dict(preset.get(field.name, {}))
    inner_hints = typing.get_type_hints(nested)
    base = _field_default(field)
    inner = {}
    for f in dataclasses.fields(nested):
      name = f'{field.name}_{f.name}'
      if name in FLAGS and not _nested(inner_hints[f.name]):
        inner[f.name] = _flag_value(
          name, inner_hints[f.name], inner_preset, f.name
        )
      elif f.name in inner_preset:
        inner[f.name] = inner_preset[f.name]
    values[field.name] = dataclasses.replace(base, **inner)
  return cls(**values, **overrides)
