"""Flags and the entry-point wrapper shared by every experiment.

Each experiment parses absl flags into a frozen config dataclass
(:mod:`experiments.config_flags`), then calls one library function. `run(main)` turns a :class:`LeakjaxError` (bad user
input) into one line on stderr and exit status 2, so a wrong path never
leaves a traceback or partial output behind.
"""

from __future__ import annotations

import sys
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
