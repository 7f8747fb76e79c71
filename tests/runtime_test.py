"""leakjax.runtime's compilation cache and the entry points' --compilation_cache."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from leakjax import runtime

# Run in a child without JAX_COMPILATION_CACHE_DIR (the suite sets one, and
# JAX reads it once, at import). Prints one line per check.
CHILD = textwrap.dedent(
  """
  import os, sys
  import jax, jax.numpy as jnp
  from absl import flags
  from experiments import common
  from leakjax import runtime

  hits = []
  jax.monitoring.register_event_listener(
    lambda event, **kw: hits.append(event)
    if event == '/jax/compilation_cache/cache_hits' else None
  )
  mode, folder = sys.argv[1], sys.argv[2]
  if mode == 'flag':
    common.define_run_flags()
    flags.FLAGS(['prog', *sys.argv[3:]])
    print('in_use', common.use_compilation_cache())
  else:
    print('in_use', runtime.use_compilation_cache(folder or None))
  print('config', jax.config.jax_compilation_cache_dir)
  print('min_time', jax.config.jax_persistent_cache_min_compile_time_secs)
  f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())
  print('value', float(f(jnp.arange(64.0).reshape(8, 8) / 64)))
  print('hits', len(hits))
  """
)


def _child(tmp_path, *args, min_time=None):
  # Without JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS unless `min_time`.
  env = {
    k: v
    for k, v in os.environ.items()
    if k
    not in (
      'JAX_COMPILATION_CACHE_DIR',
      'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
    )
  }
  if min_time is not None:
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = min_time
  env['XDG_CACHE_HOME'] = str(tmp_path / 'xdg')
  out = subprocess.run(
    [sys.executable, '-c', CHILD, *map(str, args)],
    env=env,
    capture_output=True,
    text=True,
    check=True,
    cwd=os.getcwd(),
  ).stdout
  return dict(line.split(' ', 1) for line in out.splitlines())


@pytest.mark.slow
def test_cache_is_read_back_by_the_next_run(tmp_path):
  folder = tmp_path / 'cache'
  first = _child(tmp_path, 'path', folder)
  assert first['in_use'] == first['config'] == str(folder)
  assert first['hits'] == '0'
  # The small program is kept too: the run sets JAX's threshold to 0.
  assert float(first['min_time']) == 0.0
  assert any(folder.iterdir())  # the program was written
  second = _child(tmp_path, 'path', folder)
  assert int(second['hits']) >= 1  # ... and read back, not compiled
  assert second['value'] == first['value']
  # A threshold the environment sets is the caller's.
  assert float(_child(tmp_path, 'path', folder, min_time='5')['min_time']) == 5


@pytest.mark.slow
def test_no_cache_and_unusable_folders(tmp_path):
  off = _child(tmp_path, 'path', '')
  assert off['in_use'] == off['config'] == 'None'
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  bad = _child(tmp_path, 'path', blocker / 'cache')  # under a file
  assert bad['in_use'] == bad['config'] == 'None'


@pytest.mark.slow
def test_flag_default_none_and_folder(tmp_path):
  default = _child(tmp_path, 'flag', '')
  want = str(tmp_path / 'xdg' / 'leakjax' / 'xla')
  assert default['in_use'] == default['config'] == want
  assert _child(tmp_path, 'flag', '', '--compilation_cache=none')['config'] == (
    'None'
  )
  given = tmp_path / 'given'
  assert _child(tmp_path, 'flag', '', f'--compilation_cache={given}')[
    'config'
  ] == str(given)


def test_a_cache_already_chosen_is_kept(tmp_path):
  chosen = jax.config.jax_compilation_cache_dir  # the suite's (conftest)
  assert chosen
  assert runtime.use_compilation_cache(tmp_path) == chosen
  assert runtime.use_compilation_cache(None) == chosen
  assert jax.config.jax_compilation_cache_dir == chosen
  assert not any(tmp_path.iterdir())


def test_release_programs_drops_compiled_programs():
  f = jax.jit(lambda x: x * 2)
  f(jax.numpy.ones(3))
  assert f._cache_size() == 1
  runtime.release_programs()
  assert f._cache_size() == 0
  assert float(f(jax.numpy.ones(3))[0]) == 2.0  # compiles again
