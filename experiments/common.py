"""Flags and the entry-point wrapper shared by every experiment.

Each experiment parses absl flags into a frozen config dataclass, then calls
one library function. `run(main)` turns a :class:`LeakjaxError` (bad user
input) into one line on stderr and exit status 2, so a wrong path never
leaves a traceback or partial output behind.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging

from leakjax.errors import LeakjaxError

FLAGS = flags.FLAGS


def define_common_flags(default_workdir: str) -> None:
  """--workdir, --data, --seed and --mesh (used by every experiment)."""
  flags.DEFINE_string(
    'workdir',
    default_workdir,
    'Output folder (config.json, results.jsonl, summary.*).'
    ' Re-running with the same folder resumes.',
  )
  flags.DEFINE_string(
    'data',
    None,
    'Corpus: a local .txt (one example per line), .json'
    ' (list of strings) or .tsv file, or a datasets name.',
  )
  flags.DEFINE_integer('seed', 0, 'Random seed.')
  flags.DEFINE_string(
    'mesh',
    None,
    'Device mesh for candidate scoring, e.g. "data:8"'
    ' (candidates split over 8 devices, parameters'
    ' replicated); absent: no sharding, one device.',
  )
  flags.DEFINE_bool(
    'distributed',
    False,
    'Call jax.distributed.initialize() first (multi-host TPU'
    ' pod slices: run the same command on every host).',
  )


def run(main) -> None:
  """`app.run(main)` with LeakjaxError -> one stderr line, exit code 2."""

  def wrapped(argv):
    if 'distributed' in FLAGS and FLAGS.distributed:
      import jax  # pylint: disable=g-import-not-at-top

      jax.distributed.initialize()
      logging.info('process %d of %d', jax.process_index(), jax.process_count())
    try:
      return main(argv)
    except LeakjaxError as e:
      logging.flush()
      print(f'leakjax: error: {e}', file=sys.stderr)
      sys.exit(2)

  app.run(wrapped)
