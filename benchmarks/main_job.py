"""The main job's wall time, peak memory, checkpoints and silences.

Runs an experiment command in a child process on a fresh work folder and
records, as `reports/film_quickstart/profile.json` does:

* `wall_s`, `user_cpu_s`, `system_cpu_s` -- of the child (`os.wait4`);
* `peak_rss_mib` -- the child's peak resident memory (`ru_maxrss`);
* `workdir_bytes` -- what the run left in its work folder;
* `longest_silence_s` -- the longest stretch with no byte of output (a
  progress bar's redraw counts as output);
* `stages` -- seconds from the start to each log line that opens a stage
  (`STAGES`), and each attack's seconds (between consecutive `[i/N ...]`
  progress lines, the first counted from the end of fine-tuning);
* `summary_equal` / `max_summary_diff` -- the run's `summary.json` against
  a reference (every key but timings; numbers within `--atol`).

Each run is appended to the `runs` of `--out` (created if absent) under
`--label`, with the bars of the speed issue judged: at most 150 s, 3 GiB
peak, 300 MB left in the work folder, no silence over 15 s (`met` / `not
met` per bar).

Usage (repository root; one run of the quickstart is about 3.5 minutes on
the 2-core CPU):

  python -m benchmarks.main_job --label=after \\
    --out=reports/film_quickstart/profile.json \\
    --reference=reports/film_quickstart/other_cpu/summary.json \\
    -- python -m experiments.film \\
       --flagfile=experiments/configs/film_quickstart.flags

The command after `--` gets `--workdir=` a fresh temporary folder,
removed afterwards (`--keep_summary=PATH` keeps its summary.json, to compare
two runs with each other).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

# The bars (the speed issue's "main job"): seconds, MiB, bytes, seconds.
BARS = {
  'wall_s': 150.0,
  'peak_rss_mib': 3072.0,
  'workdir_bytes': 300e6,
  'longest_silence_s': 15.0,
}
# Log lines that open a stage, by the stage's name.
STAGES = {
  'model_loaded_s': re.compile(r'model \S+ loaded in'),
  'train_step_compiled_s': re.compile(r'train: step compiled in'),
  'training_done_s': re.compile(r'fine-tuned in|train: step (\d+)/\1 '),
}
# A finished attack (`[3/6, 30.6 s each, ...] b=4 batch 0: ...`), not the
# heartbeat of one still running (`[3/6] b=4 batch 0: still working`).
# Resident memory is sampled this often, to say in which stage it peaks.
RSS_EVERY_S = 0.25
PROGRESS = re.compile(r'\] \[(\d+)/(\d+), ')
# Summary keys that time something, not compared.
TIMING = re.compile(r'seconds|_s$|_s@|time')


def _summary_diff(got: dict, want: dict) -> tuple[bool, float]:
  """Whether two summaries agree on every non-timing key, and the largest
  absolute difference of a number."""
  keys = {k for k in {*got, *want} if not TIMING.search(k)}
  worst, same = 0.0, True
  for k in sorted(keys):
    a, b = got.get(k), want.get(k)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
      d = abs(float(a) - float(b))
      if math.isnan(d):
        same = same and math.isnan(float(a)) and math.isnan(float(b))
        continue
      worst = max(worst, d)
    elif a != b:
      same = False
  return same, worst


def _folder_bytes(path: Path) -> int:
  return sum(p.stat().st_size for p in path.rglob('*') if p.is_file())


def run_once(command: Sequence[str], workdir: Path, log_path: Path) -> dict:
  """Runs `command --workdir=workdir`; returns the measurements."""
  start = time.monotonic()
  proc = subprocess.Popen(
    [*command, f'--workdir={workdir}'],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    env={**os.environ, 'PYTHONUNBUFFERED': '1'},
  )
  last = [start]
  silence = [0.0]
  lines: list[tuple[float, str]] = []

  def read() -> None:
    buf = b''
    with log_path.open('wb') as log:
      while chunk := proc.stdout.read1(65536):
        now = time.monotonic()
        silence[0] = max(silence[0], now - last[0])
        last[0] = now
        log.write(chunk)
        log.flush()
        buf += chunk
        *done, buf = re.split(rb'[\r\n]', buf)
        lines.extend((now - start, x.decode('utf-8', 'replace')) for x in done)

  samples: list[tuple[float, int]] = []  # (seconds, resident KiB)
  done = threading.Event()

  def sample() -> None:
    status_file = Path(f'/proc/{proc.pid}/status')
    while not done.wait(RSS_EVERY_S):
      try:
        text = status_file.read_text()
      except OSError:
        return
      m = re.search(r'VmRSS:\s+(\d+) kB', text)
      if m:
        samples.append((time.monotonic() - start, int(m.group(1))))

  reader = threading.Thread(target=read)
  sampler = threading.Thread(target=sample, daemon=True)
  reader.start()
  sampler.start()
  _, status, usage = os.wait4(proc.pid, 0)
  done.set()
  reader.join()
  wall = time.monotonic() - start
  silence[0] = max(silence[0], time.monotonic() - last[0])
  if os.waitstatus_to_exitcode(status):
    tail = '\n'.join(x for _, x in lines[-20:])
    raise SystemExit(f'the command failed:\n{tail}')
  stages: dict = {}
  for name, pattern in STAGES.items():
    hits = [t for t, x in lines if pattern.search(x)]
    if hits:
      stages[name] = round(hits[-1 if name == 'training_done_s' else 0], 1)
  ticks = [t for t, x in lines if PROGRESS.search(x)]
  if ticks:
    begin = stages.get('training_done_s', stages.get('model_loaded_s', 0.0))
    stages['attack_s'] = [
      round(b - a, 1) for a, b in zip([begin, *ticks[:-1]], ticks)
    ]
  bounds = [
    ('loading', 0.0),
    ('fine-tuning', stages.get('model_loaded_s', 0.0)),
    ('attacks', stages.get('training_done_s', math.inf)),
  ]
  by_stage: dict[str, int] = {}
  for t, kib in samples:
    name = [n for n, b in bounds if t >= b][-1]
    by_stage[name] = max(by_stage.get(name, 0), round(kib / 1024))
  stages['sampled_rss_peak_mib'] = by_stage
  if samples:
    stages['sampled_rss_peak_at_s'] = round(
      max(samples, key=lambda x: x[1])[0], 1
    )
  return {
    'wall_s': round(wall, 1),
    'user_cpu_s': round(usage.ru_utime, 2),
    'system_cpu_s': round(usage.ru_stime, 2),
    'peak_rss_mib': round(usage.ru_maxrss / 1024),
    'workdir_bytes': _folder_bytes(workdir),
    'longest_silence_s': round(silence[0], 1),
    'stages': stages,
  }


def judge(run: dict) -> dict[str, str]:
  return {k: 'met' if run[k] <= bar else 'not met' for k, bar in BARS.items()}


def main(argv: Sequence[str] | None = None) -> None:
  argv = list(sys.argv[1:] if argv is None else argv)
  if '--' not in argv:
    raise SystemExit('give the command after --')
  cut = argv.index('--')
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--label', required=True, help='this run, in the JSON')
  parser.add_argument('--note', default='', help='what differs in this run')
  parser.add_argument('--out', required=True, help='JSON the run joins')
  parser.add_argument('--reference', help='summary.json to compare with')
  parser.add_argument('--atol', type=float, default=1e-6)
  parser.add_argument('--log', help='keep the output here (default: none)')
  parser.add_argument(
    '--keep_summary', help="copy the run's summary.json here (default: none)"
  )
  args = parser.parse_args(argv[:cut])
  command = argv[cut + 1 :]
  shown = ' '.join(['python', *command[1:]])  # the command as a user types it
  tmp = Path(tempfile.mkdtemp(prefix='leakjax_main_job_'))
  try:
    workdir = tmp / 'work'
    log = Path(args.log) if args.log else tmp / 'log.txt'
    run = run_once(command, workdir, log)
    if args.keep_summary:
      shutil.copyfile(workdir / 'summary.json', args.keep_summary)
    if args.reference:
      got = json.loads((workdir / 'summary.json').read_text())
      want = json.loads(Path(args.reference).read_text())
      same, worst = _summary_diff(got, want)
      run['summary_equal'] = same and worst <= args.atol
      run['max_summary_diff'] = worst
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  out = Path(args.out)
  doc = (
    json.loads(out.read_text())
    if out.exists()
    else {'command': shown, 'runs': []}
  )
  doc.setdefault('bars', BARS)
  record = {
    'run': args.label,
    'note': args.note,
    'command': shown,
    **run,
    'status': judge(run),
  }
  doc['runs'] = [r for r in doc['runs'] if r['run'] != args.label] + [record]
  out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + '\n')
  print(json.dumps(record, indent=1, ensure_ascii=False))


if __name__ == '__main__':
  main()
