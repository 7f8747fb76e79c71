"""benchmarks/suite.py: pytest's counts and slowest tests, read from a
real pytest run of a stand-in test file."""

import json

import pytest

from benchmarks import compile_listener, suite

STAND_IN = """
import time
import pytest

def test_quick():
  assert True

@pytest.mark.skip(reason='stand-in')
def test_skipped():
  pass

def test_slow():
  time.sleep(0.3)
"""


def test_parse_reads_the_final_line_and_durations():
  out = suite.parse(
    '....\n'
    '============ slowest 2 durations ============\n'
    '74.11s call     tests/readme_test.py::test_readme_examples_run\n'
    '12.50s setup    tests/audit_test.py::test_audit\n'
    '1 failed, 1599 passed, 1 skipped, 1 warning in 909.35s (0:15:09)\n'
  )
  assert out['counts'] == {'failed': 1, 'passed': 1599, 'skipped': 1}
  assert out['slowest'][0] == {
    'seconds': 74.11,
    'phase': 'call',
    'test': 'tests/readme_test.py::test_readme_examples_run',
  }
  assert out['slowest'][1]['phase'] == 'setup'


@pytest.mark.slow
def test_main_times_each_tier_and_judges_its_bar(tmp_path, monkeypatch):
  tests = tmp_path / 'stand_in_test.py'
  tests.write_text(STAND_IN)
  args = ['-q', '-p', 'no:cacheprovider', str(tests)]
  monkeypatch.setattr(suite, 'TIERS', {'full': args, 'fast': args})
  out = tmp_path / 'loop.json'
  suite.main(['--label=here', f'--out={out}', '--durations=1'])
  doc = json.loads(out.read_text())
  (run,) = doc['runs']
  assert run['run'] == 'here' and doc['bars'] == suite.BARS
  assert 'model' in run['cpu']
  for tier in ('full', 'fast'):
    got = run[tier]
    assert got['exit_code'] == 0
    assert got['counts'] == {'passed': 2, 'skipped': 1}
    assert got['slowest'][0]['test'].endswith('test_slow')
    assert 0.3 < got['wall_s'] < 60 and got['status'] == 'met'
  # The same label replaces its run; an unknown tier is refused.
  suite.main(['--label=here', f'--out={out}', '--tiers=fast'])
  (run,) = json.loads(out.read_text())['runs']
  assert set(run) == {'run', 'note', 'cpu', 'fast'}
  with pytest.raises(SystemExit, match='unknown tiers'):
    suite.main(['--label=x', f'--out={out}', '--tiers=all'])


def committed() -> tuple[dict, str]:
  """The committed `suite.json` and benchmarks/README.md, spaces collapsed."""
  root = suite.ROOT
  doc = json.loads((root / 'benchmarks/results/suite.json').read_text())
  text = (root / 'benchmarks/README.md').read_text('utf-8')
  return doc, ' '.join(text.split())


def test_committed_run_and_its_readme_paragraph():
  doc, text = committed()
  r = [r for r in doc['runs'] if {'full', 'fast'} <= set(r)][-1]
  full, fast = r['full'], r['fast']
  assert f'run `{r["run"]}`)' in text
  for name, got in (('the full suite', full), ('the fast tier', fast)):
    assert got['exit_code'] == 0
    c = got['counts']
    assert (
      f'{name} {got["wall_s"]} s ({c["passed"]:,} passed, {c["skipped"]}'
      f' skipped; {got["status"]})' in text
    )
  assert f'peak {full["peak_rss_mib"]:,} MiB' in text
  for s in full['slowest'][:5]:
    assert f'({s["seconds"]:.1f} s)' in text
  # The full tier's compile share (the run was made with --compile_share).
  share = full['compile_share']
  sec = share['seconds']
  assert (
    f"{share['share']:.1%} of the workers' {share['worker_s']:,.1f} s:"
    f' compiling {sec["compile"]:.1f} s ({share["counts"]["compile"]:,}'
    f' programs), lowering {sec["lower"]:.1f} s, tracing {sec["trace"]:.1f} s'
    f' and reading {share["counts"]["cache_read"]:,} programs back from the'
    f' persistent cache {sec["cache_read"]:.1f} s'
  ) in text


def test_committed_runs_name_their_cpu():
  # The lent machine changes: each quoted run's vector extensions, as its
  # record has them, are named beside it.
  doc, text = committed()
  runs = {r['run']: r for r in doc['runs']}
  for name in ('amd-epyc-2core-7b', 'amd-epyc-2core-6a'):
    avx512 = any(v.startswith('avx512') for v in runs[name]['cpu']['vector'])
    want = 'with AVX-512' if avx512 else 'AVX2, no AVX-512'
    assert f'EPYC {want} (`results/suite.json`, run `{name}`' in text
  earlier, now = (
    runs['amd-epyc-2core-5']['full'],
    runs['amd-epyc-2core-7b']['full'],
  )
  fewer = now['counts']['passed'] - earlier['counts']['passed']
  assert (
    f'run `amd-epyc-2core-5`, on this EPYC with {fewer} tests fewer,'
    f' {earlier["wall_s"]} s on another'
  ) in text
  older = runs['amd-epyc-2core-4']['cpu']['vector']
  assert not any(v.startswith('avx512') for v in older)
  assert 'run `amd-epyc-2core-4` ran on an EPYC without AVX-512' in text


def test_one_module_per_program_and_its_paragraph():
  # The code before, then the split flag and the narrower release, one
  # after the other; the paragraph quotes both records.
  doc, text = committed()
  runs = {r['run']: r['full'] for r in doc['runs'] if 'full' in r}
  before, after = runs['amd-epyc-2core-7a'], runs['amd-epyc-2core-7b']
  for r in (before, after):
    assert r['exit_code'] == 0 and 'failed' not in r['counts']
  assert (
    f'The full suite took {before["wall_s"]} s before and'
    f' {after["wall_s"]} s after'
  ) in text
  b, a = before['compile_share'], after['compile_share']
  assert (
    f'XLA compiled {b["counts"]["compile"]:,} programs in'
    f' {b["seconds"]["compile"]:.1f} s before and {a["counts"]["compile"]:,}'
    f" in {a['seconds']['compile']:.1f} s after, and the workers' time went"
    f' from {b["worker_s"]:,.1f} s to {a["worker_s"]:,.1f} s'
  ) in text
  assert a['counts']['compile'] < b['counts']['compile']
  assert after['wall_s'] < before['wall_s']


def test_eager_model_try_and_its_sentence():
  # The try left out: the committed code, then the change, one after the
  # other; the sentence quotes both records and the failures.
  doc, text = committed()
  runs = {r['run']: r['full'] for r in doc['runs'] if 'full' in r}
  before, after = runs['amd-epyc-2core-6a'], runs['amd-epyc-2core-6b']
  assert before['exit_code'] == 0 and 'failed' not in before['counts']
  assert f'and {after["counts"]["failed"]} tests failed' in text
  for r in (before, after):
    share = r['compile_share']
    assert (
      f'{r["wall_s"]} s ({r["counts"]["passed"]:,} passed),'
      f' {share["counts"]["compile"]:,} programs compiled in'
      f' {share["seconds"]["compile"]:.1f} s'
    ) in text
  fewer = 1 - (
    after['compile_share']['counts']['compile']
    / before['compile_share']['counts']['compile']
  )
  assert f'{fewer:.0%} fewer programs' in text


def test_kept_cache_runs_and_their_readme_sentence():
  root = suite.ROOT
  doc, _ = committed()
  pairs = {}
  for tier in ('fast', 'full'):
    runs = {r['run']: r[tier] for r in doc['runs'] if r['run'].startswith(tier)}
    empty, filled = (
      runs[f'{tier}-kept-cache-all-{k}'] for k in ('empty', 'filled')
    )
    assert empty['counts'] == filled['counts'] and filled['exit_code'] == 0
    assert filled['wall_s'] < empty['wall_s']
    pairs[tier] = (filled['wall_s'], empty['wall_s'])
  readme = ' '.join((root / 'README.md').read_text('utf-8').split())
  assert (
    'the fast tier took {} s on the second run after {} s on the first,'
    ' the full suite {} s after {} s'.format(*pairs['fast'], *pairs['full'])
    in readme
  )


JAX_STAND_IN = """
import jax
import jax.numpy as jnp

def test_jit():
  assert float(jax.jit(lambda x: jnp.sin(x) * 2)(1.0)) > 0
"""


@pytest.mark.slow
def test_compile_share_counts_the_runs_compilations(tmp_path, monkeypatch):
  tests = tmp_path / 'jax_stand_in_test.py'
  tests.write_text(JAX_STAND_IN)
  args = ['-q', '-p', 'no:cacheprovider', str(tests)]
  monkeypatch.setattr(suite, 'TIERS', {'full': args})
  out = tmp_path / 'loop.json'
  suite.main(
    ['--label=here', f'--out={out}', '--tiers=full', '--compile_share']
  )
  (run,) = json.loads(out.read_text())['runs']
  got = run['full']
  assert got['exit_code'] == 0 and got['counts'] == {'passed': 1}
  assert '-p benchmarks.compile_listener' in got['command']
  share = got['compile_share']
  # One process ran the test: its jit traced, lowered and compiled.
  assert share['workers'] == 1
  assert share['worker_s'] == got['wall_s']
  for stage in ('trace', 'lower', 'compile'):
    assert share['counts'][stage] >= 1 and share['seconds'][stage] >= 0
  assert share['seconds']['compile'] > 0
  assert 0 < share['share'] < 1


def test_compile_share_sums_the_workers_files(tmp_path):
  for pid, (t, c) in enumerate(((1.0, 3.0), (2.0, 5.0))):
    (tmp_path / f'{pid}.json').write_text(
      json.dumps(
        {
          'pid': pid,
          'seconds': {'trace': t, 'lower': 0.5, 'compile': c, 'cache_read': 0},
          'counts': {'trace': 2, 'lower': 1, 'compile': 1, 'cache_read': 0},
        }
      )
    )
  got = compile_listener.summarise(tmp_path, wall_s=10.0)
  assert got['workers'] == 2 and got['worker_s'] == 20.0
  assert got['seconds'] == {
    'trace': 3.0,
    'lower': 1.0,
    'compile': 8.0,
    'cache_read': 0,
  }
  assert got['counts']['trace'] == 4
  assert got['share'] == pytest.approx(12.0 / 20.0)
  assert compile_listener.summarise(tmp_path / 'none', 5.0)['share'] is None
