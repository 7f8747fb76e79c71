"""Tests for leakjax.io and leakjax.errors."""

import dataclasses
import json

import numpy as np
import pytest

from leakjax import LeakjaxError, errors, io


def test_summary_key_sorted():
  assert io.summary_key('rougeL', b=16) == 'rougeL@b=16'
  assert io.summary_key('f1', n_k=16, E=1) == 'f1@E=1,n_k=16'
  assert io.summary_key('x') == 'x'


def test_writer_writes_and_resumes(tmp_path):
  w = io.ExperimentWriter(tmp_path, {'b': 4, 'name': 'x'})
  w.add_result({'batch': 0, 'rougeL': np.float32(0.5)})
  w.add_result({'batch': 1, 'rougeL': 0.25, 'bad': float('nan')})
  w.write_summary({'rougeL@b=4': 0.375}, '# hi\n')
  rows = [json.loads(l) for l in (tmp_path / 'results.jsonl').open()]
  assert rows[0]['rougeL'] == 0.5 and rows[1]['bad'] is None
  assert json.loads((tmp_path / 'summary.json').read_text()) == {
    'rougeL@b=4': 0.375
  }
  again = io.ExperimentWriter(tmp_path, {'b': 4, 'name': 'x'})
  assert again.done(batch=1)['rougeL'] == 0.25
  assert again.done(batch=2) is None
  # No temp files are left behind.
  assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')]


def test_writer_refuses_other_config(tmp_path):
  io.ExperimentWriter(tmp_path, {'b': 4})
  with pytest.raises(LeakjaxError, match='changed: b'):
    io.ExperimentWriter(tmp_path, {'b': 8})


def test_summary_values_must_be_numbers_or_names(tmp_path):
  w = io.ExperimentWriter(tmp_path, {})
  for bad in ([1.0], {'x': 1}, None, True):
    with pytest.raises(TypeError):
      w.write_summary({'a': bad}, '')
  assert not (tmp_path / 'summary.json').exists()
  # The name of the attack that produced a number is a value too.
  w.write_summary({'exact@b=1': 1.0, 'attack@b=1': 'dager'}, '')
  assert json.loads((tmp_path / 'summary.json').read_text())['attack@b=1'] == (
    'dager'
  )


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
  path = tmp_path / 'f.txt'
  io.atomic_write_text(path, 'old')

  def boom(*a, **k):
    raise OSError('disk full')

  monkeypatch.setattr(io.os, 'replace', boom)
  with pytest.raises(OSError):
    io.atomic_write_text(path, 'new')
  assert path.read_text() == 'old'
  assert [p.name for p in tmp_path.iterdir()] == ['f.txt']


def test_markdown_table():
  t = io.markdown_table(['a', 'b'], [[1, 0.12345], ['x', float('nan')]])
  assert t.splitlines() == [
    '| a | b |',
    '|---|---|',
    '| 1 | 0.123 |',
    '| x | nan |',
  ]


def test_errors_are_one_line():
  e = LeakjaxError('bad\nthing', 'fix\n it')
  assert str(e) == 'bad thing; fix it'


def test_check_finite():
  errors.check_finite({'a': np.ones(3)}, 'weights')
  with pytest.raises(LeakjaxError, match=r"1 NaN/inf values in \['b'\]"):
    errors.check_finite({'b': np.array([1.0, np.inf])}, 'weights')


def test_check_token_ids_and_length():
  errors.check_token_ids(np.array([[0, 9]]), 10)
  with pytest.raises(LeakjaxError, match='out of range'):
    errors.check_token_ids(np.array([[0, 10]]), 10)
  with pytest.raises(LeakjaxError, match='context is 4'):
    errors.check_length(5, 4, 'the text')


def test_writer_disabled_on_other_processes(tmp_path):
  w = io.ExperimentWriter(tmp_path / 'w', {'b': 1}, enabled=False)
  w.add_result({'x': 1})
  w.write_summary({'a': 1.0}, '')
  assert w.results == [{'x': 1}]
  assert not (tmp_path / 'w').exists()


def test_atomic_write_makes_readable_files(tmp_path):
  path = tmp_path / 'summary.json'
  io.atomic_write_text(path, '{}')
  assert path.stat().st_mode & 0o777 == 0o644


def test_resume_accepts_fields_added_at_their_default(tmp_path):
  @dataclasses.dataclass(frozen=True)
  class Old:
    b: int = 4

  @dataclasses.dataclass(frozen=True)
  class New:
    b: int = 4
    patience: int = 0
    sizes: tuple[int, ...] = (1, 2)

  io.ExperimentWriter(tmp_path, Old()).add_result({'b': 4})
  w = io.ExperimentWriter(tmp_path, New())  # a field added since: resumes
  assert w.done(b=4) is not None
  assert json.loads((tmp_path / 'config.json').read_text()) == {
    'b': 4,
    'patience': 0,
    'sizes': [1, 2],
  }
  io.ExperimentWriter(tmp_path, New())
  other = tmp_path / 'other'
  io.ExperimentWriter(other, Old())
  with pytest.raises(LeakjaxError, match='changed: patience'):
    io.ExperimentWriter(other, New(patience=1))  # not the default: refused
  with pytest.raises(LeakjaxError, match='changed: b'):
    io.ExperimentWriter(other, New(b=8))


def test_a_field_that_changed_the_default_resumes_only_at_its_old_value(
  tmp_path,
):
  @dataclasses.dataclass(frozen=True)
  class Changed:
    b: int = 4
    samples: int = dataclasses.field(default=400, metadata={'before': 0})

  io.ExperimentWriter(tmp_path, {'b': 4}).add_result({'b': 4})
  with pytest.raises(LeakjaxError, match='changed: samples'):
    io.ExperimentWriter(tmp_path, Changed())  # the new default
  w = io.ExperimentWriter(tmp_path, Changed(samples=0))  # the old one
  assert w.done(b=4) is not None


def test_resume_ignores_record_fields_and_rewrites_them(tmp_path):
  @dataclasses.dataclass(frozen=True)
  class Old:
    b: int = 4

  @dataclasses.dataclass(frozen=True)
  class New:
    b: int = 4
    preset: str | None = dataclasses.field(default=None, compare=False)

  io.ExperimentWriter(tmp_path, Old()).add_result({'b': 4})
  # A run made before presets resumes under one, and records it.
  w = io.ExperimentWriter(tmp_path, New(preset='paper'))
  assert w.done(b=4) is not None
  stored = json.loads((tmp_path / 'config.json').read_text())
  assert stored == {'b': 4, 'preset': 'paper'}
  io.ExperimentWriter(tmp_path, New(preset='strongest'))
  stored = json.loads((tmp_path / 'config.json').read_text())
  assert stored['preset'] == 'strongest'
  with pytest.raises(LeakjaxError, match='changed: b'):
    io.ExperimentWriter(tmp_path, New(b=8, preset='strongest'))


def test_pytree_file_round_trip_keeps_dtypes_and_shapes(tmp_path):
  import jax
  import jax.numpy as jnp

  tree = {
    'w': jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 7,
    'half': jnp.asarray([1.5, -2.25, 3e-3], jnp.bfloat16),
    'opt': (jnp.asarray(7, jnp.int32), {'mu': jnp.full((4,), 0.1)}),
  }
  path = tmp_path / 'tree.safetensors'
  io.save_pytree(path, tree)
  back = io.load_pytree(path, jax.eval_shape(lambda: tree))
  assert jax.tree.structure(back) == jax.tree.structure(tree)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The leaves are named by their key paths, readable by any safetensors tool.
  from safetensors.numpy import load_file

  assert set(load_file(path)) == {
    "['half']",
    "['opt'][0]",
    "['opt'][1]['mu']",
    "['w']",
  }


def test_pytree_file_refuses_another_structure(tmp_path):
  import jax.numpy as jnp

  path = tmp_path / 'tree.safetensors'
  io.save_pytree(path, {'a': jnp.zeros((2, 3)), 'b': jnp.ones(4)})
  with pytest.raises(LeakjaxError, match=r"lacks \['c'\]"):
    io.load_pytree(path, {'a': jnp.zeros((2, 3)), 'c': jnp.ones(4)})
  with pytest.raises(LeakjaxError, match='unexpected entries'):
    io.load_pytree(path, {'a': jnp.zeros((2, 3))})
  with pytest.raises(LeakjaxError, match=r'shape \(2, 3\), expected \(3, 2\)'):
    io.load_pytree(path, {'a': jnp.zeros((3, 2)), 'b': jnp.ones(4)})
  path.write_bytes(b'not a safetensors file')
  with pytest.raises(LeakjaxError, match='cannot read'):
    io.load_pytree(path, {'a': jnp.zeros((2, 3)), 'b': jnp.ones(4)})


def test_progress_counts_only_computed_units_towards_the_rate():
  clock = iter([30.0, 60.0])
  p = io.Progress(total=4)
  p._clock = lambda: next(clock)
  p._start = 0.0
  p.skipped()  # resumed: no time
  assert p.describe() == '1/4'
  p.computed()
  assert p.describe() == '2/4, 30.0 s each, about 60 s left'
  p.computed()
  assert p.describe() == '3/4, 30.0 s each, about 30 s left'


def test_side_files_come_from_process_0_only(tmp_path, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top

  from leakjax.attacks.inversion import hidden_states  # pylint: disable=g-import-not-at-top

  compute = lambda: {'a': np.arange(3.0)}  # noqa: E731
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  assert not io.is_primary()
  got = hidden_states.cached(tmp_path / 'states.npz', compute)
  np.testing.assert_array_equal(got['a'], np.arange(3.0))
  assert not (tmp_path / 'states.npz').exists()  # another host's disk
  assert not io.ExperimentWriter(tmp_path / 'w', {'b': 1}).enabled
  monkeypatch.setattr(jax, 'process_index', lambda: 0)
  hidden_states.cached(tmp_path / 'states.npz', compute)
  assert (tmp_path / 'states.npz').exists()
  again = hidden_states.cached(
    tmp_path / 'states.npz', lambda: {'a': np.zeros(3)}
  )
  np.testing.assert_array_equal(again['a'], np.arange(3.0))  # read back
