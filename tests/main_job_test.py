"""benchmarks/main_job.py: what it measures of a command, on a stand-in
command that prints log lines like a FILM run and writes a summary."""

import json
import pathlib
import sys

import pytest

from benchmarks import main_job

FAKE = """
import json, pathlib, sys, time
work = pathlib.Path(sys.argv[-1].split('=', 1)[1])
work.mkdir()
print('I0 runner.py:1] model m loaded in 0.1 s', flush=True)
time.sleep(0.6)
print('I0 loop.py:1] train: step 3/3 loss 1.0', flush=True)
sys.stdout.write('bar 1/2\\r'); sys.stdout.flush()
time.sleep(0.2)
print('I0 runtime.py:6] [1/2] b=1 batch 0: still working (10 s)', flush=True)
print('I0 runner.py:2] [1/2, 0.2 s each] b=1 batch 0: ROUGE-L 1.00', flush=True)
time.sleep(0.3)
print('I0 runner.py:2] [2/2, 0.2 s each] b=1 batch 1: ROUGE-L 1.00', flush=True)
(work / 'summary.json').write_text(json.dumps({'rougeL@b=1': 0.5,
  'attack_seconds@b=1': 9.0}))
(work / 'blob').write_bytes(b'x' * 1000)
"""


def test_measures_a_command_and_judges_its_bars(tmp_path):
  ref = tmp_path / 'ref.json'
  ref.write_text(json.dumps({'rougeL@b=1': 0.5, 'attack_seconds@b=1': 1.0}))
  out = tmp_path / 'profile.json'
  args = ['--label=before', f'--out={out}', f'--reference={ref}']
  main_job.main([*args, '--', sys.executable, '-c', FAKE])
  doc = json.loads(out.read_text())
  (run,) = doc['runs']
  assert run['run'] == 'before' and doc['bars'] == main_job.BARS
  assert run['summary_equal'] and run['max_summary_diff'] == 0.0
  assert run['workdir_bytes'] >= 1000
  assert 0.5 < run['longest_silence_s'] < 5
  assert run['longest_silence_s'] <= run['wall_s']
  st = run['stages']
  assert st['model_loaded_s'] < st['training_done_s'] < run['wall_s']
  # Attacks: from the end of training to each progress line.
  assert len(st['attack_s']) == 2 and 0.1 < st['attack_s'][1] < 2
  assert run['status'] == main_job.judge(run)
  sampled = st['sampled_rss_peak_mib']
  assert set(sampled) <= {'loading', 'fine-tuning', 'attacks'} and sampled
  assert max(sampled.values()) <= run['peak_rss_mib'] + 1
  # A second label joins the runs; the same label replaces its run.
  ref.write_text(json.dumps({'rougeL@b=1': 0.75}))
  after = ['--label=after', f'--out={out}', f'--reference={ref}']
  for _ in range(2):
    main_job.main([*after, '--', sys.executable, '-c', FAKE])
  runs = json.loads(out.read_text())['runs']
  assert [r['run'] for r in runs] == ['before', 'after']
  assert not runs[1]['summary_equal'] and runs[1]['max_summary_diff'] == 0.25


def test_judge_and_failures(tmp_path):
  run = dict(
    wall_s=151.0, peak_rss_mib=3000, workdir_bytes=1, longest_silence_s=15.0
  )
  assert main_job.judge(run) == {
    'wall_s': 'not met',
    'peak_rss_mib': 'met',
    'workdir_bytes': 'met',
    'longest_silence_s': 'met',
  }
  out = tmp_path / 'p.json'
  with pytest.raises(SystemExit, match='failed'):
    main_job.main(
      [
        '--label=x',
        f'--out={out}',
        '--',
        sys.executable,
        '-c',
        'raise SystemExit(3)',
      ]
    )
  with pytest.raises(SystemExit, match='after --'):
    main_job.main(['--label=x', f'--out={out}'])
  assert not out.exists()


def test_committed_baseline_and_its_readme_paragraph():
  root = pathlib.Path(__file__).resolve().parents[1]
  doc = json.loads((root / 'benchmarks/results/main_job.json').read_text())
  (r,) = doc['runs']
  st = r['stages']
  assert r['summary_equal'] and r['status'] == main_job.judge(r)
  assert doc['command'] == (
    'python -m experiments.film'
    ' --flagfile=experiments/configs/film_quickstart.flags'
  )
  text = ' '.join((root / 'benchmarks/README.md').read_text('utf-8').split())
  attacks = ' / '.join(f'{x:.1f}' for x in st['attack_s'])
  peaks = st['sampled_rss_peak_mib']
  assert (
    f'run `{r["run"]}`): {r["wall_s"]} s wall ({st["training_done_s"]} s to'
    f' the end of fine-tuning, attacks {attacks} s), peak'
    f' {r["peak_rss_mib"]:,} MiB (sampled: {peaks["fine-tuning"]:,} while'
    f' fine-tuning, {peaks["attacks"]:,} while attacking),'
    f' {r["workdir_bytes"]:,} bytes left, longest silence'
    f' {r["longest_silence_s"]} s' in text
  )
  unmet = [k for k, v in r['status'].items() if v != 'met']
  assert (
    unmet == ['wall_s', 'peak_rss_mib'] and 'Time and memory: not met' in text
  )


def test_committed_before_and_after_pair_and_its_readme_paragraph():
  root = pathlib.Path(__file__).resolve().parents[1]
  doc = json.loads((root / 'benchmarks/results/main_job_amd.json').read_text())
  before, after = doc['runs']
  assert (before['run'], after['run']) == ('before', 'after')
  text = ' '.join((root / 'benchmarks/README.md').read_text('utf-8').split())
  for r in (before, after):
    assert r['summary_equal'] and r['status'] == main_job.judge(r)
    peaks = r['stages']['sampled_rss_peak_mib']
    assert (
      f'{r["run"]}: {r["wall_s"]} s wall, peak {r["peak_rss_mib"]:,} MiB'
      f' ({peaks["fine-tuning"]:,} while fine-tuning)' in text
    )
