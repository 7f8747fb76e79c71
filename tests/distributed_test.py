"""Multi-process runs: one experiment as two JAX processes on this CPU.

`jax.distributed.initialize` on localhost stands in for a pod slice's
hosts. Every process computes the whole run (no data is exchanged); only
process 0 writes to the workdir, and no process reads what another wrote.
The test checks that exactly one complete set of outputs appears and that it
equals the one-process run's.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.resume_test import DAGER_FLAGS, FILM_FLAGS

ROOT = Path(__file__).resolve().parents[1]

# The resume tests' tiny runs, smaller still (absl keeps a flag's last
# value); FILM fine-tunes for two steps, so its checkpoints are written too.
RUNS = {
  'dager': [*DAGER_FLAGS, '--num_batches=1', '--defenses=none'],
  'film': [
    *FILM_FLAGS,
    '--batch_sizes=2',
    '--num_batches=1',
    '--max_sentences=12',
    '--train_steps=2',
  ],
}


def _env():
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  # One CPU device per process; the suite's other XLA flags stay.
  env['XLA_FLAGS'] = ' '.join(
    f
    for f in env.get('XLA_FLAGS', '').split()
    if not f.startswith('--xla_force_host_platform_device_count')
  )
  return env


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _launch(experiment, workdir, *extra):
  return subprocess.Popen(
    [
      sys.executable,
      '-m',
      f'experiments.{experiment}',
      f'--workdir={workdir}',
      *RUNS[experiment],
      *extra,
    ],
    cwd=ROOT,
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _finish(proc):
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out[-3000:]
  return out


def _rows(workdir):
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  # Timings (`seconds`, `grad_seconds`, ...) differ between any two runs.
  return [
    {k: v for k, v in r.items() if not k.endswith('seconds')} for r in rows
  ]


@pytest.mark.parametrize('experiment', sorted(RUNS))
def test_two_processes_write_one_run_equal_to_one_process(tmp_path, experiment):
  _finish(_launch(experiment, tmp_path / 'one'))
  port = _free_port()
  procs = [
    _launch(
      experiment,
      tmp_path / 'two',
      '--distributed',
      f'--coordinator_address=localhost:{port}',
      '--num_processes=2',
      f'--process_id={i}',
    )
    for i in (0, 1)
  ]
  outs = [_finish(p) for p in procs]
  assert 'process 1: done' in outs[1]
  assert 'summary.json' in outs[0]

  one, two = tmp_path / 'one', tmp_path / 'two'
  files = lambda d: sorted(  # noqa: E731
    str(p.relative_to(d)) for p in d.rglob('*') if p.is_file()
  )
  assert files(two) == files(one)  # one set: nothing twice, nothing else
  assert _rows(two) == _rows(one)  # no row written by both processes
  assert json.loads((two / 'summary.json').read_text()) == json.loads(
    (one / 'summary.json').read_text()
  )
  assert json.loads((two / 'config.json').read_text()) == json.loads(
    (one / 'config.json').read_text()
  )
  devices = json.loads((two / 'provenance.json').read_text())['environment']
  assert devices['devices']['processes'] == 2


def test_coordinator_flags_go_together(tmp_path):
  proc = _launch(
    'dager', tmp_path / 'w', '--distributed', '--coordinator_address=x:1'
  )
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 2
  assert 'go together' in out.strip().splitlines()[-1]
