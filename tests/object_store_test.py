"""Workdirs on an object store (`gs://`), through `etils.epath` and fsspec.

The bucket is an in-memory fsspec file system registered for `gs://` that,
like Cloud Storage, has no append and no real folders: the code paths are
the ones a `gs://` workdir takes with gcsfs installed, without a network.
Training checkpoints (orbax, whose arrays go through TensorStore's own GCS
driver, not fsspec) are not covered here.
"""

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from etils.epath import backend
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import _registry as fsspec_registry

from experiments import dager as dager_exp
from leakjax import io, train
from leakjax.attacks.dager import runner
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2


def _bucket_class():
  class Bucket(MemoryFileSystem):
    """`gs://bucket/key` objects in memory; no append, as on GCS."""

    protocol = ('gs', 'gcs')
    root_marker = ''
    store: dict = {}
    pseudo_dirs = ['']

    def __init__(self, *args, finalize_on_close=None, **kwargs):
      del finalize_on_close  # what etils passes gcsfs
      super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
      path = str(path)
      for prefix in ('gs://', 'gcs://'):
        if path.startswith(prefix):
          path = path[len(prefix) :]
      return path.strip('/')

    def _open(self, path, mode='rb', **kwargs):
      if 'a' in mode or '+' in mode:
        raise NotImplementedError(f'objects cannot be appended to ({mode})')
      return super()._open(path, mode, **kwargs)

  return Bucket


@pytest.fixture
def bucket(monkeypatch):
  """A fresh in-memory `gs://` store; yields its `{key: file}` dict."""
  cls = _bucket_class()
  for name in ('gs', 'gcs'):
    monkeypatch.setitem(fsspec_registry, name, cls)
  backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  yield cls.store
  backend._FileSystemSpecBackend._get_filesystem.cache_clear()


def _objects(store, prefix):
  return {
    key[len(prefix) :]: store[key].getvalue()
    for key in store
    if key.startswith(prefix)
  }


def test_writer_rows_resume_and_forget_on_a_bucket(bucket):
  writer = io.ExperimentWriter('gs://bkt/run', {'a': 1}, enabled=True)
  assert json.loads(bucket['bkt/run/config.json'].getvalue()) == {'a': 1}
  assert 'bkt/run/provenance.json' in bucket
  writer.add_result({'i': 0, 'x': 1.5})
  writer.add_result({'i': 1, 'x': float('nan')})  # NaN -> null, as locally
  writer.write_summary({'x@i=0': 1.5}, '# run\n')
  lines = bucket['bkt/run/results.jsonl'].getvalue().decode().splitlines()
  assert [json.loads(x) for x in lines] == [
    {'i': 0, 'x': 1.5},
    {'i': 1, 'x': None},
  ]
  assert json.loads(bucket['bkt/run/summary.json'].getvalue()) == {'x@i=0': 1.5}

  # A re-run resumes from the rows there and keeps them when it adds one.
  again = io.ExperimentWriter('gs://bkt/run', {'a': 1}, enabled=True)
  assert again.done(i=1) == {'i': 1, 'x': None}
  again.add_result({'i': 2, 'x': 3.0})
  lines = bucket['bkt/run/results.jsonl'].getvalue().decode().splitlines()
  assert [json.loads(x)['i'] for x in lines] == [0, 1, 2]
  with pytest.raises(LeakjaxError, match='different config'):
    io.ExperimentWriter('gs://bkt/run', {'a': 2}, enabled=True)

  # A run that fails before its first row leaves nothing that blocks the
  # corrected one.
  io.ExperimentWriter('gs://bkt/other', {'a': 1}, enabled=True)
  io.forget_unstarted_runs()
  assert 'bkt/other/config.json' not in bucket
  io.ExperimentWriter('gs://bkt/other', {'a': 2}, enabled=True)


def test_forgetting_a_run_whose_store_is_gone_raises_nothing(
  monkeypatch, tmp_path
):
  # The bucket's file system is registered for this block only: afterwards
  # `gs://` names a store whose package is missing (gcsfs is not installed
  # here), as when a cleanup runs after such a store failed. The cleanup
  # runs while another error is reported: it logs and goes on, and still
  # forgets the local run.
  with pytest.MonkeyPatch.context() as patch:
    for name in ('gs', 'gcs'):
      patch.setitem(fsspec_registry, name, _bucket_class())
    backend._FileSystemSpecBackend._get_filesystem.cache_clear()
    io.ExperimentWriter('gs://bkt/gone', {'a': 1}, enabled=True)
  backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  io.ExperimentWriter(tmp_path / 'w', {'a': 1}, enabled=True)
  warnings = []
  monkeypatch.setattr(
    'absl.logging.warning', lambda msg, *a: warnings.append(msg % a)
  )
  io.forget_unstarted_runs()
  assert not (tmp_path / 'w' / 'config.json').exists()
  assert any('gs://bkt/gone/config.json' in w for w in warnings), warnings
  io.forget_unstarted_runs()  # nothing left to forget


def test_workdir_naming_an_object_is_refused(bucket):
  epath.Path('gs://bkt/file').write_text('x')
  with pytest.raises(LeakjaxError, match='is a file'):
    io.ExperimentWriter('gs://bkt/file', {'a': 1}, enabled=True)


def test_arrays_round_trip_through_a_bucket(bucket):
  tree = {
    'w': jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3),
    'b': jnp.ones(3, jnp.float32),
  }
  io.save_pytree('gs://bkt/p/params.safetensors', tree)
  back = io.load_pytree('gs://bkt/p/params.safetensors', tree)
  assert back['w'].dtype == jnp.bfloat16
  for k in tree:
    np.testing.assert_array_equal(np.asarray(back[k]), np.asarray(tree[k]))
  io.save_npy('gs://bkt/d/delta.npy', np.arange(4.0))
  np.testing.assert_array_equal(
    io.load_npy('gs://bkt/d/delta.npy'), [0, 1, 2, 3]
  )


def test_model_directory_on_a_bucket_is_marked_complete(bucket, tmp_path):
  model, params = gpt2.init_model(
    gpt2.GPT2Config.tiny(vocab_size=32, n_positions=16, n_embd=32, n_layer=1),
    key=jax.random.key(0),
  )
  target = epath.Path('gs://bkt/run/model')
  assert not train._is_complete(target)
  train._save_directory(model, params, target)
  assert train._is_complete(target)
  objects = _objects(bucket, 'bkt/run/model/')
  assert objects.pop('.complete') == b''
  train._save_directory(model, params, tmp_path / 'model')
  assert objects == {
    p.name: p.read_bytes() for p in (tmp_path / 'model').iterdir()
  }


@pytest.mark.slow
def test_experiment_on_a_bucket_writes_what_a_local_run_writes(
  bucket, tmp_path
):
  cfg = runner.DagerConfig(
    model='gpt2-tiny', max_tokens=20, batch_sizes=(1,), num_batches=1
  )
  local = dager_exp.run_experiment(cfg, tmp_path, progress=False)
  remote = dager_exp.run_experiment(cfg, 'gs://bkt/dager', progress=False)
  assert remote == local
  objects = _objects(bucket, 'bkt/dager/')
  files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  assert set(objects) == set(files)
  for name in ('config.json', 'summary.json'):
    assert objects[name] == files[name], name

  def digits_masked(blob):  # summary.md shows the run's timings
    return re.sub(rb'[0-9.]+', b'#', blob)

  assert digits_masked(objects['summary.md']) == digits_masked(
    files['summary.md']
  )

  def rows(blob):
    out = [json.loads(x) for x in blob.decode().splitlines()]
    for r in out:  # timings differ between two runs
      for key in [k for k in r if 'seconds' in k]:
        r.pop(key)
    return out

  assert rows(objects['results.jsonl']) == rows(files['results.jsonl'])
  # Resuming from the bucket recomputes nothing and duplicates no row.
  again = dager_exp.run_experiment(cfg, 'gs://bkt/dager', progress=False)
  assert again == local
  assert rows(bucket['bkt/dager/results.jsonl'].getvalue()) == rows(
    files['results.jsonl']
  )
