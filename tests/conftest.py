"""Test setup: 8 fake CPU devices (sharding is tested on every run)."""

import os

# Must run before jax is imported anywhere.
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()
# The suite's programs are small and its time is mostly XLA's CPU compiler:
# without its backend optimisations and fusion emitters the test files of
# the FILM and GBoard experiments ran in 164 s instead of 252 s on the
# 2-core CPU (compile time 303 -> 84 s). Results change at most by float
# rounding, which every test tolerates. LEAKJAX_TEST_XLA_OPTIMIZED=1 keeps
# XLA's defaults (what users' runs get). The experiments that tests start
# as subprocesses inherit the flags.
#
# XLA's CPU compiler also splits each program's LLVM module into parts that
# it compiles on a thread pool. The suite's programs are small and its two
# workers already use both cores, so the split costs more than it saves:
# one part per program (benchmarks/README.md, the test loop). Results
# change at most by float rounding here too.
if os.environ.get('LEAKJAX_TEST_XLA_OPTIMIZED') != '1':
  os.environ['XLA_FLAGS'] += (
    ' --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false'
    ' --xla_cpu_parallel_codegen_split_count=1'
  )
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')

import gc
import shutil
import sys
import tempfile

# One persistent XLA compilation cache per test session, shared by the xdist
# workers (they inherit the controller's environment) and by the experiments
# the tests start as subprocesses, which compile the same kernels run after
# run. A fresh folder each session, so the suite's time is what a clean
# machine sees; a cache the caller names (JAX_COMPILATION_CACHE_DIR) is used
# and kept, so a developer's next run reads its programs back (README.md,
# the paragraph on the test workers).
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
    prefix='leakjax-tests-xla-cache-'
  )
# Every compilation: the suite's many small ones add up, and the experiments
# the tests start compile the same ones run after run.
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')

import jax  # noqa: E402  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # noqa: E402  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_default_matmul_precision', 'highest')


NUM_FAKE_DEVICES = 8


def pytest_sessionfinish(session):
  # The controller (or a run without xdist) removes the cache it made.
  if _OWN_CACHE and not hasattr(session.config, 'workerinput'):
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """Drops the compiled programs a test file leaves behind.

  A worker runs many test files in one process, and each file's programs
  (the tiny models' and SmolLM2's, at many shapes) would otherwise stay in
  memory until the worker ends; on the 24 GB development machine the last
  file of a worker then ran out of memory. The persistent compilation cache
  above keeps them on disk, so a later file that needs one loads it instead
  of compiling it again.
  """
  yield
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope='module')
def mesh():
  """A `data:8` mesh over the fake CPU devices (sharded-vs-single tests)."""
  from leakjax import sharding  # pylint: disable=g-import-not-at-top

  if jax.device_count() < NUM_FAKE_DEVICES:
    pytest.skip('needs the 8 fake CPU devices set up above')
  return sharding.make_mesh(f'data:{NUM_FAKE_DEVICES}')


@pytest.fixture
def fresh_flags(monkeypatch):
  """An empty absl FlagValues that every DEFINE_* and FLAGS use.

  The experiments define their flags at import of `__main__`; tests define
  them here instead, once per test, and parse with `fresh_flags(argv)`.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  from experiments import common  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  monkeypatch.setattr(flags, 'FLAGS', values)
  for module in [common] + [
    m for n, m in sys.modules.items() if n.startswith('experiments.')
  ]:
    if hasattr(module, 'FLAGS'):  # `FLAGS = flags.FLAGS` at import
      monkeypatch.setattr(module, 'FLAGS', values)
  for name in (
    'DEFINE_integer',
    'DEFINE_float',
    'DEFINE_string',
    'DEFINE_bool',
    'DEFINE_list',
    'DEFINE_enum',
  ):
    define = getattr(flags, name)
    monkeypatch.setattr(
      flags,
      name,
      lambda *a, _d=define, **k: _d(*a, flag_values=values, **k),
    )
  return values
