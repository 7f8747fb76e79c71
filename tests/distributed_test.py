"""Multi-process runs: one experiment as two JAX processes on this CPU.

`jax.distributed.initialize` on localhost stands in for a pod slice's
hosts. Every process computes the whole run; only process 0 writes to the
workdir, and no process reads what another wrote. With `--mesh=data:2` the
candidate batches are split over both processes' devices (gloo collectives
on CPU). The test checks that exactly one complete set of outputs appears
and that it equals the one-process run's.
"""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from leakjax import train
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
  # gboard_test.py's smoke run (corpora written per test, see _data_flags):
  # pre-training θ0 (checkpointed), FedSGD/FedAvg and DPSGD-like updates,
  # snapshots and deltas in the workdir, attacks and plots.
  'gboard': [
    '--public_limit=100',
    '--vocab_size=200',
    '--embed_dim=8',
    '--units=12',
    '--pretrain_steps=4',
    '--pretrain_batch_size=16',
    '--pretrain_max_length=8',
    '--pretrain_eval=40',
    '--client_pool=24',
    '--num_sentences=16',
    '--epochs=1,2',
    '--batch_sizes=full,16',
    '--max_sentence_epochs=10000',
    '--dpsgd_sigmas=0.1',
    '--dpsgd_runs=16:8:1000',
    '--single_sigmas=1e-3',
    '--scales=0,10',
    '--pretrain_lr=3e-3',
    '--sentence_length=4',
    '--num_datasets=1',
    '--learning_rate=1e-3',
    '--loss=sentence_sum',
    '--threshold_rule=auto',
    '--fdr_q=0.05',
    '--keep_rule=cover',
  ],
}


# Flags of the two-process runs only: DAGER's sequence search and FILM's
# beams and reorder candidates run on a mesh over both processes' devices
# (one each), so the mesh spans two hosts, and the outputs must still equal
# the one-process run's.
TWO_PROCESS_FLAGS = {
  'dager': ['--mesh=data:2'],
  'film': ['--mesh=data:2'],
  'gboard': ['--mesh=data:2'],
}


def _data_flags(experiment, tmp_path):
  """gboard's corpora: gboard_test.py's synthetic SMS and public text."""
  if experiment != 'gboard':
    return []
  from tests.gboard_test import _write_corpora  # pylint: disable=g-import-not-at-top

  sms, public = _write_corpora(tmp_path)
  return [f'--sms={sms}', f'--public=extra={public}']


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


@pytest.mark.slow
@pytest.mark.parametrize('experiment', sorted(RUNS))
def test_two_processes_write_one_run_equal_to_one_process(tmp_path, experiment):
  data = _data_flags(experiment, tmp_path)
  _finish(_launch(experiment, tmp_path / 'one', *data))
  port = _free_port()
  procs = [
    _launch(
      experiment,
      tmp_path / 'two',
      '--distributed',
      f'--coordinator_address=localhost:{port}',
      '--num_processes=2',
      f'--process_id={i}',
      *data,
      *TWO_PROCESS_FLAGS[experiment],
    )
    for i in (0, 1)
  ]
  outs = [_finish(p) for p in procs]
  assert 'process 1: done' in outs[1]
  assert 'summary.json' in outs[0]

  one, two = tmp_path / 'one', tmp_path / 'two'
  # Orbax names its checkpoint's data chunks by content hashes
  # (`.../d/<hex>`), which differ between two runs.
  files = lambda d: sorted(  # noqa: E731
    {
      re.sub(r'/d/[0-9a-f]+$', '/d/*', str(p.relative_to(d)))
      for p in d.rglob('*')
      if p.is_file()
    }
  )
  assert files(two) == files(one)  # one set: nothing twice, nothing else
  if (one / 'train').exists():
    states = [train.checkpoint_state(d / 'train') for d in (one, two)]
    for key in ('step', 'fingerprint', 'best', 'finished'):
      assert states[0][key] == states[1][key], key
  assert _rows(two) == _rows(one)  # no row written by both processes
  assert json.loads((two / 'summary.json').read_text()) == json.loads(
    (one / 'summary.json').read_text()
  )
  assert json.loads((two / 'config.json').read_text()) == json.loads(
    (one / 'config.json').read_text()
  )
  devices = json.loads((two / 'provenance.json').read_text())['environment']
  assert devices['devices']['processes'] == 2


@pytest.mark.slow
def test_coordinator_flags_go_together(tmp_path):
  proc = _launch(
    'dager', tmp_path / 'w', '--distributed', '--coordinator_address=x:1'
  )
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 2
  assert 'go together' in out.strip().splitlines()[-1]


# Two processes, one CPU device each: a `data:2` mesh spans both. Each
# places the same batch, runs a jitted kernel on the mesh and reads its
# output back; they print what they read.
_MESH_SCRIPT = """
import sys
import jax
import jax.numpy as jnp
import numpy as np
jax.distributed.initialize(
  coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2])
)
from leakjax import sharding
mesh = sharding.make_mesh('data:2')
x = sharding.shard_batch(np.arange(12.0).reshape(6, 2), mesh)
w = sharding.replicate({'w': np.arange(6.0).reshape(2, 3)}, mesh)
y = jax.jit(lambda x, w: jnp.tanh(x @ w['w'] / 10))(x, w)
host = sharding.to_host({'y': y, 'n': jnp.int32(3)})
print('SPANS', not x.is_fully_addressable, not y.is_fully_addressable)
print('READ', host['y'].tolist(), int(host['n']))
"""


@pytest.mark.slow
def test_mesh_across_processes_places_and_reads_back(tmp_path):
  address = f'localhost:{_free_port()}'
  procs = [
    subprocess.Popen(
      [sys.executable, '-c', _MESH_SCRIPT, address, str(i)],
      cwd=ROOT,
      env=_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in (0, 1)
  ]
  outs = [_finish(p) for p in procs]
  want = np.tanh(
    np.arange(12.0).reshape(6, 2) @ np.arange(6.0).reshape(2, 3) / 10
  )
  for out in outs:
    lines = {
      x.split(' ', 1)[0]: x.split(' ', 1)[1]
      for x in out.splitlines()
      if x.startswith(('SPANS', 'READ'))
    }
    assert lines['SPANS'] == 'True True'  # the arrays span both processes
    got, n = lines['READ'].rsplit(' ', 1)
    np.testing.assert_allclose(json.loads(got), want, rtol=1e-6)
    assert n == '3'
