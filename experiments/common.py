"""Flags and the entry-point wrapper shared by every experiment.

Each experiment parses absl flags into a frozen config dataclass, then calls
one library function. `run(main)` turns a :class:`LeakjaxError` (bad user
input) into one line on stderr and exit status 2, so a wrong path never
leaves a traceback or partial output behind.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from typing import Sequence

from absl import app, flags, logging

from leakjax.errors import LeakjaxError

FLAGS = flags.FLAGS


# What define_distributed_flags defines (no config field holds them).
DISTRIBUTED_FLAGS = (
  'distributed',
  'coordinator_address',
  'num_processes',
  'process_id',
)
# What define_run_flags defines: how the run executes, never what it finds.
RUN_FLAGS = (*DISTRIBUTED_FLAGS, 'compilation_cache')


def define_common_flags(default_workdir: str) -> None:
  """--workdir, --data, --seed, --mesh and the run flags (used by every
  experiment)."""
  flags.DEFINE_string(
    'workdir',
    default_workdir,
    'Output folder (config.json, results.jsonl, summary.*).'
    ' Re-running with the same folder resumes.',
  )
  flags.DEFINE_string(
    'data',
    None,
    'Corpus: a named data set (python -m leakjax.data list), a local'
    ' .txt (one example per line), .json (list of strings) or .tsv'
    ' file, or hub:NAME[@REVISION][:CONFIG[:SPLIT]] (a Hugging Face dataset).',
  )
  flags.DEFINE_string(
    'data_column',
    None,
    'The text field of --data rows (.json objects, .tsv, hub rows);'
    ' default: the field named text (or sentence, content, sms).',
  )
  flags.DEFINE_string(
    'data_label',
    None,
    'Keep only the --data rows with FIELD=VALUE[,VALUE...], e.g. Label=ham.',
  )
  flags.DEFINE_integer('seed', 0, 'Random seed.')
  flags.DEFINE_string(
    'mesh',
    None,
    'Device mesh for candidate scoring, e.g. "data:8"'
    ' (candidates split over 8 devices, parameters'
    ' replicated); absent: no sharding, one device.',
  )
  define_run_flags()


def define_run_flags() -> None:
  """:func:`define_distributed_flags` and --compilation_cache."""
  define_distributed_flags()
  flags.DEFINE_string(
    'compilation_cache',
    None,
    'Folder where compiled programs are kept for later runs, which read'
    ' them instead of compiling again (the same programs: results do not'
    ' change; 2 GiB at most). Default: ~/.cache/leakjax/xla'
    ' ($XDG_CACHE_HOME); "none": no cache. JAX_COMPILATION_CACHE_DIR, when'
    ' set, is used instead.',
  )


def define_distributed_flags() -> None:
  """--distributed and, off TPU/Slurm/MPI, where the coordinator is."""
  flags.DEFINE_bool(
    'distributed',
    False,
    'Call jax.distributed.initialize() first (multi-host TPU'
    ' pod slices: run the same command on every host). Only process 0'
    ' writes to --workdir.',
  )
  flags.DEFINE_string(
    'coordinator_address',
    None,
    'With --distributed: host:port of process 0 (absent: detected on'
    ' TPU, Slurm and Open MPI).',
  )
  flags.DEFINE_integer(
    'num_processes', None, 'With --coordinator_address: how many processes.'
  )
  flags.DEFINE_integer(
    'process_id', None, 'With --coordinator_address: this process, 0..N-1.'
  )


def reject_data_fields(why: str) -> None:
  """Refuses --data_column / --data_label in an experiment that reads its
  corpora's fields itself (`why` says how)."""
  for name in ('data_column', 'data_label'):
    if name in FLAGS and FLAGS[name].value is not None:
      raise LeakjaxError(f'--{name} is not used by this experiment', why)


# Config fields that name corpora: a source (`data`, `sms`), `(name,
# source)` pairs (`public`) or `name=source` strings (`corpora`).
DATA_FIELDS = ('data', 'sms', 'public', 'corpora')


def data_sets(cfg) -> list[str]:
  """The named data sets (:mod:`leakjax.datasets`) that `cfg` reads, in
  the order of :data:`DATA_FIELDS`."""
  from leakjax import datasets  # pylint: disable=g-import-not-at-top

  sources = []
  for field in DATA_FIELDS:
    value = getattr(cfg, field, None)
    if isinstance(value, str):
      sources.append(value)
    elif value:
      for item in value:
        pair = item.split('=', 1) if isinstance(item, str) else item
        sources.append(pair[-1])
  return [s for s in dict.fromkeys(sources) if s in datasets.REGISTRY]


def require_data(cfg) -> None:
  """Resolves every named data set of `cfg` before any work: one error
  names all the missing ones and how to supply them.

  Raises:
    LeakjaxError: see :func:`leakjax.datasets.require`.
  """
  from leakjax import datasets  # pylint: disable=g-import-not-at-top

  datasets.require(data_sets(cfg))


def check_flagfiles(argv: Sequence[str]) -> None:
  """Refuses flagfiles that absl would misread, before it reads them.

  absl skips a line that does not start with a dash without a word, and a
  file that is not UTF-8 ends in a UnicodeDecodeError. Every
  `--flagfile=PATH` in `argv` (and in the flagfiles it names) must be a
  readable UTF-8 file whose lines are flags (`--name=value`), comments
  (`#`, `//`) or blank.

  Raises:
    LeakjaxError: naming the file and, for a bad line, its number.
  """
  pending = [a.split('=', 1)[1] for a in argv if a.startswith('--flagfile=')]
  seen = set()
  while pending:
    path = pending.pop()
    if path in seen:
      continue
    seen.add(path)
    try:
      with open(path, 'rb') as f:
        data = f.read()
    except OSError as e:
      raise LeakjaxError(
        f'cannot read flagfile {path}: {e.strerror}', 'check the path'
      ) from None
    try:
      text = data.decode('utf-8')
    except UnicodeDecodeError as e:
      raise LeakjaxError(
        f'flagfile {path} is not UTF-8 text (byte {e.start})',
        'a flagfile holds one --name=value per line',
      ) from None
    for number, line in enumerate(text.splitlines(), 1):
      line = line.strip()
      if not line or line.startswith(('#', '//')):
        continue
      if not line.startswith('-'):
        raise LeakjaxError(
          f'flagfile {path}, line {number}: {line[:60]!r} is not a flag',
          'write it as --name=value, or start a comment with #',
        )
      if line.startswith('--flagfile='):
        pending.append(line.split('=', 1)[1])


def _quiet_orbax(record) -> bool:
  """A log filter: drops orbax's records below WARNING."""
  return record.levelno >= 30 or '/orbax/' not in record.pathname.replace(
    '\\', '/'
  )


def quiet_backend_probe() -> None:
  """Hides JAX's INFO lines about backends it tried and could not start.

  On a machine without the accelerator (libtpu installed on a CPU host)
  JAX logs `Unable to initialize backend 'tpu'` at INFO on every run,
  which absl shows. Only the level of that logger
  (`jax._src.xla_bridge`) changes, and only when nobody asked for more
  (`--verbosity=1` or more, `JAX_LOGGING_LEVEL`, `JAX_DEBUG_LOG_MODULES`)
  or set it: which backends start is untouched, JAX's warnings (a TPU or
  GPU present but unused) still show, and a backend named in
  `JAX_PLATFORMS` that fails still raises.
  """
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top

  probe = std_logging.getLogger('jax._src.xla_bridge')
  asked = logging.get_verbosity() > 0 or any(
    os.environ.get(v) for v in ('JAX_LOGGING_LEVEL', 'JAX_DEBUG_LOG_MODULES')
  )
  if probe.level == std_logging.NOTSET and not asked:
    probe.setLevel(std_logging.WARNING)


def use_compilation_cache() -> str | None:
  """Applies --compilation_cache (:func:`leakjax.runtime.use_compilation_cache`);
  returns the folder in use, or None."""
  from leakjax import runtime  # pylint: disable=g-import-not-at-top

  value = (
    FLAGS['compilation_cache'].value if 'compilation_cache' in FLAGS else None
  )
  if value is None:
    value = runtime.default_compilation_cache()
  if value.strip().lower() in ('', 'none'):
    value = None
  return runtime.use_compilation_cache(value)


def run(main) -> None:
  """`app.run(main)` with LeakjaxError -> one stderr line, exit code 2, and
  the compilation cache of --compilation_cache."""
  try:
    check_flagfiles(sys.argv[1:])
  except LeakjaxError as e:
    print(f'leakjax: error: {e}', file=sys.stderr)
    sys.exit(2)

  def wrapped(argv):
    # Orbax logs a dozen INFO lines per checkpoint; warnings still show.
    logging.get_absl_handler().addFilter(_quiet_orbax)
    quiet_backend_probe()
    use_compilation_cache()
    if 'distributed' in FLAGS and FLAGS.distributed:
      import jax  # pylint: disable=g-import-not-at-top

      given = {
        name: FLAGS[name].value
        for name in ('coordinator_address', 'num_processes', 'process_id')
        if FLAGS[name].value is not None
      }
      if given and len(given) < 3:
        print(
          'leakjax: error: --coordinator_address, --num_processes and'
          ' --process_id go together; pass all three or none',
          file=sys.stderr,
        )
        sys.exit(2)
      jax.distributed.initialize(**given)
      logging.info('process %d of %d', jax.process_index(), jax.process_count())
    try:
      return main(argv)
    except LeakjaxError as e:
      from leakjax import io  # pylint: disable=g-import-not-at-top

      # A run that failed before its first result leaves no config.json
      # behind to refuse the corrected re-run.
      io.forget_unstarted_runs()
      logging.flush()
      print(f'leakjax: error: {e}', file=sys.stderr)
      sys.exit(2)

  app.run(wrapped)


# ------------------------------------------- flags from a config dataclass
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


def print_summary(workdir, summary, start: float) -> None:
  """Prints `workdir/summary.md` and how many keys took how long."""
  import time  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  if jax.process_index() != 0:  # only process 0 wrote it
    print(f'process {jax.process_index()}: done')
    return
  from leakjax import io  # pylint: disable=g-import-not-at-top

  print((io.as_path(workdir) / 'summary.md').read_text())
  print(
    f'Wrote {workdir}/summary.json ({len(summary)} keys) in'
    f' {time.perf_counter() - start:.0f} s'
  )
