"""The test loop's wall time: the full suite and the fast tier.

Runs README.md's test command (the full suite, two workers) and its fast
tier (`-m "not slow"`) one after the other in child processes and records,
per tier, the wall seconds, the peak resident memory of the largest process
(`ru_maxrss` of the children), the counts pytest reports and its slowest
tests. Each run is appended to the `runs` of `--out` under `--label`, with
the test loop's bars judged: the full suite in at most 8 minutes
and the fast tier in at most 3 (`met` / `not met`).

Usage (repository root; about 18 minutes on the idle 2-core CPU):

  python -m benchmarks.suite --label=amd-epyc \\
    --out=benchmarks/results/suite.json

Run it on an otherwise idle machine: the suite is CPU-bound, and a job
beside it stretches every figure.

With `--compile_share` each tier also records how much of its workers'
time JAX spent tracing, lowering and compiling programs
(`benchmarks/compile_listener.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks import compile_listener
from leakjax import provenance

ROOT = Path(__file__).resolve().parents[1]
# README.md's test command and its fast tier.
FULL = ['-q', '-n', '2', '--dist', 'loadfile', 'tests']
TIERS = {
  'full': FULL,
  'fast': [*FULL[:-1], '-m', 'not slow', 'tests'],
}
BARS = {'full': 480.0, 'fast': 180.0}  # wall seconds
# pytest's last line: `1611 passed, 1 skipped, 1 warning in 911.09s`.
COUNT = re.compile(r'(\d+) (passed|failed|skipped|errors?|deselected)')
# `--durations` lines: `74.11s call     tests/readme_test.py::test_x`.
DURATION = re.compile(r'^([\d.]+)s (setup|call|teardown)\s+(\S+)$')


def parse(output: str) -> dict:
  """The counts of pytest's final line and its slowest tests."""
  last = [x for x in output.splitlines() if ' in ' in x and 'passed' in x]
  counts: dict[str, int] = {}
  for n, what in COUNT.findall(last[-1] if last else ''):
    counts['errors' if what.startswith('error') else what] = int(n)
  slowest = [
    {'seconds': float(m[1]), 'phase': m[2], 'test': m[3]}
    for m in (DURATION.match(x.strip()) for x in output.splitlines())
    if m
  ]
  return {'counts': counts, 'slowest': slowest}


def run_tier(
  args: Sequence[str], durations: int, compile_share: bool = False
) -> dict:
  """Runs pytest with `args`; its wall seconds, peak memory and parse, and
  with `compile_share` what JAX's compilations took of it."""
  plugin = ['-p', 'benchmarks.compile_listener'] if compile_share else []
  command = [sys.executable, '-m', 'pytest', *plugin, *args]
  command.append(f'--durations={durations}')
  with tempfile.TemporaryDirectory(prefix='leakjax-compile-share-') as folder:
    env = {**os.environ, compile_listener.ENV: folder} if plugin else None
    start = time.monotonic()
    proc = subprocess.run(
      command, cwd=ROOT, capture_output=True, text=True, env=env
    )
    wall = time.monotonic() - start
    share = compile_listener.summarise(folder, wall) if compile_share else None
  out = parse(proc.stdout)
  got = {
    'command': ' '.join(['python3', *command[1:-1]]),
    'wall_s': round(wall, 1),
    'exit_code': proc.returncode,
    # The largest descendant so far (grows only): tiers run in order, so a
    # later tier's figure is at least the earlier one's.
    'peak_rss_mib': round(
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    ),
    **out,
  }
  if share is not None:
    got['compile_share'] = share
  return got


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--label', required=True, help='this run, in the JSON')
  parser.add_argument('--note', default='', help='what differs in this run')
  parser.add_argument('--out', required=True, help='JSON the run joins')
  parser.add_argument(
    '--tiers', default='full,fast', help=f'of {", ".join(TIERS)}'
  )
  parser.add_argument('--durations', type=int, default=10)
  parser.add_argument(
    '--compile_share',
    action='store_true',
    help="record JAX's trace/lower/compile seconds (compile_listener.py)",
  )
  args = parser.parse_args(argv)
  tiers = args.tiers.split(',')
  unknown = set(tiers) - set(TIERS)
  if unknown:
    raise SystemExit(f'unknown tiers {sorted(unknown)}: {", ".join(TIERS)}')
  record: dict = {'run': args.label, 'note': args.note}
  record['cpu'] = provenance.environment()['cpu']
  for tier in tiers:
    print(f'{tier}: running', flush=True)
    got = run_tier(TIERS[tier], args.durations, args.compile_share)
    got['status'] = 'met' if got['wall_s'] <= BARS[tier] else 'not met'
    record[tier] = got
    print(f'{tier}: {got["wall_s"]} s, {got["counts"]}', flush=True)
  out = Path(args.out)
  doc = json.loads(out.read_text()) if out.exists() else {'runs': []}
  doc['bars'] = BARS
  doc['runs'] = [r for r in doc['runs'] if r['run'] != args.label] + [record]
  out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + '\n')


if __name__ == '__main__':
  main()
