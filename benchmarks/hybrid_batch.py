r"""The hybrid on whole batches: seconds by stage, beside the committed run.

Runs `python -m experiments.dager` with a hybrid flagfile on one batch at a
time (`--first_batch=B --num_batches=1`, a fresh temporary work folder) in
a child process, and puts its result row beside the row of the same batch
in the flagfile's committed `results.jsonl`:

* `stage_seconds` -- the run's span, search and select seconds (its row's
  own timings) and the committed row's;
* `wall_s`, `peak_rss_mib` -- of the child (`os.wait4`; model load and
  the batch's gradient included);
* `candidates`, `rougeL`, `exact` -- both rows'; `searched_equal` and
  `recovered_equal` -- how many searched and recovered sentences are the
  same token for token.

The committed run's timings were taken by an earlier version of the code,
on whichever CPU made the report: they are the before of the stages, not a
measurement of this run's machine.

  python -m benchmarks.hybrid_batch --batches=3,5 \
      [--flagfile=experiments/configs/dager_hybrid_evidence_oversample_heldout.flags] \
      [--out=benchmarks/results/hybrid_batch.json]

A b = 64 batch takes minutes on the 2-core CPU (benchmarks/README.md gives
the seconds of each stage).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks import peak
from leakjax import provenance

DEFAULT_FLAGFILE = (
  'experiments/configs/dager_hybrid_evidence_oversample_heldout.flags'
)
STAGES = ('span', 'search', 'select')


def report_dir(flagfile: str) -> Path:
  """The committed report of a `dager_*.flags` file:
  `reports/dager/<name without the dager_ prefix>/`."""
  name = Path(flagfile).stem
  if not name.startswith('dager_'):
    raise ValueError(f'{flagfile} is not a DAGER flagfile (dager_*.flags)')
  return Path('reports/dager') / name[len('dager_') :]


def hybrid_row(path: Path, batch: int) -> dict:
  """The `attack == 'hybrid'` row of `batch` in the `results.jsonl` at
  `path`."""
  for line in path.read_text().splitlines():
    row = json.loads(line)
    if row.get('attack') == 'hybrid' and row.get('batch') == batch:
      return row
  raise LookupError(f'no hybrid row of batch {batch} in {path}')


def _same(a: Sequence, b: Sequence) -> int:
  return sum(x == y for x, y in zip(a, b))


def compare(run: dict, committed: dict) -> dict:
  """The run's row beside the committed one (see the module docstring)."""
  return {
    'batch': run['batch'],
    'b': run['b'],
    'stage_seconds': {
      'run': {s: round(run['stage_seconds'][s], 1) for s in STAGES},
      'committed': {s: round(committed['stage_seconds'][s], 1) for s in STAGES},
    },
    'seconds': {
      'run': round(run['seconds'], 1),
      'committed': round(committed['seconds'], 1),
    },
    'candidates': {
      'run': run['num_candidates'],
      'committed': committed['num_candidates'],
    },
    'rougeL': {'run': run['rougeL'], 'committed': committed['rougeL']},
    'exact': {'run': run['exact'], 'committed': committed['exact']},
    'searched': len(run['searched_ids']),
    'searched_equal': _same(run['searched_ids'], committed['searched_ids']),
    'recovered': len(run['recovered']),
    'recovered_equal': _same(run['recovered'], committed['recovered']),
  }


def run_batch(flagfile: str, batch: int) -> tuple[dict, dict]:
  """`(row, child)`: the run's result row of `batch` and the child's
  `wall_s`, `user_cpu_s`, `peak_rss_mib`."""
  with tempfile.TemporaryDirectory(prefix='leakjax_hybrid_batch_') as tmp:
    command = [
      sys.executable,
      '-m',
      'experiments.dager',
      f'--flagfile={flagfile}',
      f'--workdir={tmp}',
      f'--first_batch={batch}',
      '--num_batches=1',
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(command)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
      raise RuntimeError(f'{" ".join(command)} failed ({status})')
    row = hybrid_row(Path(tmp) / 'results.jsonl', batch)
  child = {
    'wall_s': round(wall, 1),
    'user_cpu_s': round(usage.ru_utime, 1),
    'peak_rss_mib': round(usage.ru_maxrss / 1024),
  }
  return row, child


def cpu() -> dict:
  """The CPU's model name (:mod:`leakjax.provenance`'s reading of it),
  core count and widest vector extension."""
  info = provenance._cpu()  # pylint: disable=protected-access
  flags = set(info.get('vector', ()))
  vector = next(
    (v for v in ('avx512f', 'avx2', 'avx') if v in flags), 'unknown'
  )
  return {'model': info['model'], 'cores': os.cpu_count(), 'vector': vector}


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--flagfile', default=DEFAULT_FLAGFILE)
  parser.add_argument('--batches', default='3')
  parser.add_argument('--out', default='benchmarks/results/hybrid_batch.json')
  args = parser.parse_args(argv)
  import jax  # pylint: disable=g-import-not-at-top

  committed = report_dir(args.flagfile) / 'results.jsonl'
  rows = []
  for batch in (int(x) for x in args.batches.split(',')):
    row, child = run_batch(args.flagfile, batch)
    rows.append({**compare(row, hybrid_row(committed, batch)), **child})
    print(json.dumps(rows[-1]), flush=True)
  out = {
    'benchmark': 'hybrid_batch',
    'flagfile': args.flagfile,
    'committed': str(committed),
    'cpu': cpu(),
    'jax_version': jax.__version__,
    'rows': rows,
    'command': (
      'python -m benchmarks.hybrid_batch'
      f' --flagfile={args.flagfile} --batches={args.batches} --out={args.out}'
    ),
  }
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  peak.write_result(out, args.out)


if __name__ == '__main__':
  main()
