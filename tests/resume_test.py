"""kill -9 in the middle of a run, then resume: no row lost or duplicated."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leakjax import io

ROOT = Path(__file__).resolve().parents[1]

FILM_FLAGS = [
  '--model=gpt2-tiny',
  '--batch_sizes=1,2',
  '--num_batches=2',
  '--max_sentences=16',
  '--train_steps=1',
  '--train_batch_size=4',
  '--eval_fraction=0',
  '--num_beams=2',
  '--length=6',
  '--max_prompts=2',
  '--phrase_steps=1',
  '--token_steps=1',
  '--reorder_candidates=2',
]
DAGER_FLAGS = [
  '--model=gpt2-tiny',
  '--max_tokens=20',
  '--batch_sizes=1,2',
  '--num_batches=3',
  '--defenses=none,freeze',
]
# Per-row fields that differ between equal runs.
TIMINGS = ('seconds', 'grad_seconds', 'attack_seconds', 'stage_seconds')


def _rows(workdir: Path) -> list[dict]:
  return [
    json.loads(x) for x in (workdir / 'results.jsonl').read_text().splitlines()
  ]


def _run(module, flags, workdir, *, kill_after_rows=None):
  """Runs `python -m module`; with `kill_after_rows`, SIGKILLs it as soon
  as results.jsonl holds that many rows. Returns the exit code."""
  proc = subprocess.Popen(
    [sys.executable, '-m', module, *flags, f'--workdir={workdir}'],
    cwd=ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  if kill_after_rows is None:
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return proc.returncode
  results = Path(workdir) / 'results.jsonl'
  deadline = time.monotonic() + 600
  while time.monotonic() < deadline and proc.poll() is None:
    if results.exists() and len(results.read_bytes().splitlines()) >= (
      kill_after_rows
    ):
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.02)
  proc.communicate(timeout=60)
  return proc.returncode


def _without_timings(rows):
  return sorted(
    (
      json.dumps(
        {k: v for k, v in r.items() if k not in TIMINGS}, sort_keys=True
      )
    )
    for r in rows
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  'module, flags, keys, total, compare',
  [
    ('experiments.film', FILM_FLAGS, ('b', 'batch'), 4, True),
    ('experiments.dager', DAGER_FLAGS, ('b', 'defense', 'batch'), 12, False),
  ],
)
def test_kill_9_then_resume(tmp_path, module, flags, keys, total, compare):
  killed = tmp_path / 'killed'
  code = _run(module, flags, killed, kill_after_rows=2)
  assert code == -signal.SIGKILL  # it was still running
  partial = _rows(killed)
  assert 2 <= len(partial) < total
  _run(module, flags, killed)
  rows = _rows(killed)
  ids = [tuple(r[k] for k in keys) for r in rows]
  assert len(rows) == total and len(set(ids)) == total
  # The rows written before the kill were kept, not recomputed.
  assert rows[: len(partial)] == partial
  if not compare:  # one uninterrupted run (FILM's) is enough CI time
    return
  # And the whole equals an uninterrupted run, timings aside.
  whole = tmp_path / 'whole'
  _run(module, flags, whole)
  assert _without_timings(rows) == _without_timings(_rows(whole))
  summary = json.loads((killed / 'summary.json').read_text())
  assert summary == json.loads((whole / 'summary.json').read_text())


def test_a_torn_last_line_is_dropped(tmp_path):
  writer = io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)
  writer.add_result({'i': 0})
  writer.add_result({'i': 1})
  with open(tmp_path / 'results.jsonl', 'a') as f:
    f.write('{"i": 2, "tex')  # killed mid-append
  resumed = io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)
  assert resumed.results == [{'i': 0}, {'i': 1}]
  assert (tmp_path / 'results.jsonl').read_text() == '{"i": 0}\n{"i": 1}\n'
  resumed.add_result({'i': 2})
  assert [r['i'] for r in _rows(tmp_path)] == [0, 1, 2]


def test_rows_are_appended_not_rewritten(tmp_path):
  writer = io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)
  writer.add_result({'i': 0})
  inode = os.stat(tmp_path / 'results.jsonl').st_ino
  writer.add_result({'i': 1})
  assert os.stat(tmp_path / 'results.jsonl').st_ino == inode
