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


@pytest.mark.slow
def test_measures_a_command_and_judges_its_bars(tmp_path):
  ref = tmp_path / 'ref.json'
  ref.write_text(json.dumps({'rougeL@b=1': 0.5, 'attack_seconds@b=1': 1.0}))
  out = tmp_path / 'profile.json'
  kept = tmp_path / 'kept.json'
  args = [
    '--label=before',
    f'--out={out}',
    f'--reference={ref}',
    f'--keep_summary={kept}',
  ]
  main_job.main([*args, '--', sys.executable, '-c', FAKE])
  doc = json.loads(out.read_text())
  (run,) = doc['runs']
  assert run['run'] == 'before' and doc['bars'] == main_job.BARS
  assert run['command'].startswith('python -c ')
  assert json.loads(kept.read_text())['rougeL@b=1'] == 0.5
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


def test_compilation_cache_runs_and_their_readme_paragraph():
  root = pathlib.Path(__file__).resolve().parents[1]
  doc = json.loads(
    (root / 'benchmarks/results/main_job_cache.json').read_text()
  )
  runs = {r['run']: r for r in doc['runs']}
  assert list(runs) == ['no-cache', 'cold-cache', 'warm-cache']
  assert '--compilation_cache=none' in runs['no-cache']['command']
  assert runs['cold-cache']['command'] == runs['warm-cache']['command']
  text = ' '.join((root / 'benchmarks/README.md').read_text('utf-8').split())
  for name, r in runs.items():
    assert r['summary_equal'] and r['max_summary_diff'] == 0.0
    st = r['stages']
    attacks = ' / '.join(f'{x:.1f}' for x in st['attack_s'])
    assert (
      f'{name}: {r["wall_s"]} s wall (train step compiled at'
      f' {st["train_step_compiled_s"]} s, attacks {attacks} s), peak'
      f' {r["peak_rss_mib"]:,} MiB' in text
    )
  # The warm run is the quicker, and the paragraph's memory figures.
  assert runs['warm-cache']['wall_s'] < runs['cold-cache']['wall_s']
  cold, warm = (
    runs[n]['stages']['sampled_rss_peak_mib']
    for n in ('cold-cache', 'warm-cache')
  )
  assert (
    f'({warm["attacks"]:,} MiB against {cold["attacks"]:,} MiB sampled)' in text
  )


def test_audit_cache_runs_and_the_readme_sentence():
  root = pathlib.Path(__file__).resolve().parents[1]
  load = lambda name: {  # noqa: E731
    r['run']: r
    for r in json.loads((root / 'benchmarks/results' / name).read_text())[
      'runs'
    ]
  }
  audit, film = load('audit_cache.json'), load('main_job_cache.json')
  cold, warm = audit['cold-cache'], audit['warm-cache']
  assert cold['command'] == warm['command']
  assert cold['max_summary_diff'] == warm['max_summary_diff']
  bench = ' '.join((root / 'benchmarks/README.md').read_text('utf-8').split())
  assert (
    f'cold-cache {cold["wall_s"]:,} s wall, peak {cold["peak_rss_mib"]:,} MiB;'
    f' warm-cache {warm["wall_s"]:,} s wall, peak {warm["peak_rss_mib"]:,} MiB'
    in bench
  )
  assert f'difference, {cold["max_summary_diff"]!r};' in bench
  assert (
    f'was {warm["peak_rss_mib"] - cold["peak_rss_mib"]:,} MiB higher' in bench
  )
  readme = ' '.join((root / 'README.md').read_text('utf-8').split())
  assert (
    f'a second FILM quickstart took {film["warm-cache"]["wall_s"]} s after'
    f' {film["cold-cache"]["wall_s"]} s on an empty cache, and a second quick'
    f' audit {warm["wall_s"]:,} s after {cold["wall_s"]:,} s, with a higher'
    f' memory peak ({warm["peak_rss_mib"]:,} MiB after'
    f' {cold["peak_rss_mib"]:,} MiB;' in readme
  )
