"""Bad inputs end in one clear `LeakjaxError` (CLI: one `leakjax: error:` line,
exit code 2), never a traceback or a silent wrong result.

Library-level cases call the host wrappers directly; the CLI cases run an
entry point in a subprocess and must fail before any model is loaded.
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import common
from leakjax import errors, fl, io
from leakjax.attacks import dager
from leakjax.attacks.dager.runner import DagerConfig
from leakjax.attacks.differential.runner import DifferentialConfig
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film.runner import FilmConfig
from leakjax.attacks.gboard import GboardConfig
from leakjax.attacks.inversion.runner import InversionConfig
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2
from leakjax.recovery import bag as bow

ROOT = Path(__file__).resolve().parents[1]
V = 64


@functools.cache
def tiny():
  """`(model, params)`: a random 2-block GPT-2 (tied head, learned positions)."""
  config = gpt2.GPT2Config.tiny(
    vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=16
  )
  return gpt2.init_model(config, key=jax.random.key(0))


@functools.cache
def tiny_grads():
  model, params = tiny()
  ids = jnp.asarray([[1, 5, 9, 13, 17], [2, 6, 10, 14, 18]], jnp.int32)
  return fl.client_gradient(model, params, ids, jnp.ones_like(ids))


def cli(*args, cwd=ROOT):
  """Runs `python -m <args>`; returns (exit code, stderr)."""
  proc = subprocess.run(
    [sys.executable, '-m', *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  return proc.returncode, proc.stderr


def assert_one_error_line(code, stderr, fragment):
  assert code == 2, stderr
  last = stderr.strip().splitlines()[-1]
  assert last.startswith('leakjax: error: '), stderr
  assert fragment in last, last
  assert 'Traceback' not in stderr


# ------------------------------------------------------------- flagfiles
def test_binary_flagfile_is_refused(tmp_path):
  path = tmp_path / 'bin.flags'
  path.write_bytes(b'\xff\xfe--workdir=x\n')
  with pytest.raises(LeakjaxError, match='not UTF-8'):
    common.check_flagfiles([f'--flagfile={path}'])


def test_flagfile_line_without_dashes_is_refused(tmp_path):
  path = tmp_path / 'a.flags'
  path.write_text('# a comment\n\n--seed=1\nworkdir=/x\n')
  with pytest.raises(LeakjaxError, match=r'line 4: .workdir=/x. is not a flag'):
    common.check_flagfiles([f'--flagfile={path}'])


def test_nested_flagfile_is_checked(tmp_path):
  inner = tmp_path / 'inner.flags'
  inner.write_text('seed 3\n')
  outer = tmp_path / 'outer.flags'
  outer.write_text(f'// comment\n--flagfile={inner}\n')
  with pytest.raises(LeakjaxError, match='inner.flags, line 1'):
    common.check_flagfiles([f'--flagfile={outer}'])


def test_missing_flagfile_is_refused(tmp_path):
  with pytest.raises(LeakjaxError, match='cannot read flagfile'):
    common.check_flagfiles([f'--flagfile={tmp_path / "none.flags"}'])


def committed_flagfiles(pattern: str) -> list[Path]:
  """The flagfiles of experiments/configs and of the studies' ablations."""
  return sorted(
    [
      *(ROOT / 'experiments' / 'configs').glob(pattern),
      *(ROOT / 'studies').glob(f'*/configs/{pattern}'),
    ]
  )


def test_good_flagfiles_pass():
  paths = committed_flagfiles('*.flags')
  assert paths
  for path in paths:
    common.check_flagfiles([f'--flagfile={path}'])


_BUILD_CONFIGS = """
import sys
from absl import flags
from experiments import common, {module} as m
m.define_flags()
for path in sys.argv[2:]:
  flags.FLAGS.unparse_flags()
  flags.FLAGS(['prog', '--flagfile=' + path])
  if hasattr(m, 'config_from_flags'):
    m.config_from_flags()
  else:
    config_flags.config_from_flags(getattr(m, sys.argv[1]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
  'module, config',
  [
    ('film', 'FilmConfig'),
    ('dager', 'DagerConfig'),
    ('differential', ''),
    ('gboard', ''),
    ('embed_parrot', ''),
    ('inversion_exact', ''),
  ],
)
def test_committed_flagfiles_pass_the_config_checks(module, config):
  """Each committed flagfile builds its config (the size checks pass)."""
  # A flagfile of a setting that left the library records what ran; its
  # header says so, and it builds no config any more.
  paths = [
    p
    for p in committed_flagfiles(f'{module}_*.flags')
    if 'This setting left the library' not in p.read_text()
  ]
  assert paths
  code = _BUILD_CONFIGS.format(module=module)
  done = subprocess.run(
    [sys.executable, '-c', code, config or '-', *map(str, paths)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_cli_binary_flagfile(tmp_path):
  path = tmp_path / 'bin.flags'
  path.write_bytes(b'\x80\x81\n')
  code, err = cli('experiments.film', f'--flagfile={path}')
  assert_one_error_line(code, err, 'is not UTF-8 text')


# --------------------------------------------------------------- workdir
def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / 'f').write_text('x')
  with pytest.raises(LeakjaxError, match='is a file, not a folder'):
    io.ExperimentWriter(tmp_path / 'f', {'b': 1}, enabled=True)


def test_workdir_under_a_file(tmp_path):
  (tmp_path / 'f').write_text('x')
  with pytest.raises(LeakjaxError, match='lies under a file'):
    io.ExperimentWriter(tmp_path / 'f' / 'w', {'b': 1}, enabled=True)


def test_check_workdir_creates_nothing(tmp_path):
  (tmp_path / 'f').write_text('x')
  with pytest.raises(LeakjaxError, match='lies under a file'):
    io.check_workdir(tmp_path / 'f' / 'a' / 'w')
  with pytest.raises(LeakjaxError, match='is a file, not a folder'):
    io.check_workdir(tmp_path / 'f')
  io.check_workdir(tmp_path / 'new' / 'w')  # creatable: fine
  assert sorted(p.name for p in tmp_path.iterdir()) == ['f']


@pytest.mark.skipif(
  hasattr(os, 'geteuid') and os.geteuid() == 0,
  reason='root may write into read-only folders',
)
def test_read_only_workdir(tmp_path):
  ro = tmp_path / 'ro'
  ro.mkdir()
  ro.chmod(0o500)
  try:
    with pytest.raises(LeakjaxError, match='not writable'):
      io.ExperimentWriter(ro, {'b': 1}, enabled=True)
  finally:
    ro.chmod(0o700)


def test_url_workdir_without_its_fsspec_package(tmp_path, monkeypatch):
  # A gs:// workdir goes through etils.epath and gcsfs; without gcsfs it is
  # one error naming the extra, and pathlib makes no local 'gs:' folder.
  from etils.epath import backend  # pylint: disable=g-import-not-at-top
  from fsspec.registry import _registry  # pylint: disable=g-import-not-at-top

  monkeypatch.chdir(tmp_path)
  monkeypatch.setitem(sys.modules, 'gcsfs', None)  # as if not installed
  for name in ('gs', 'gcs'):
    monkeypatch.delitem(_registry, name, raising=False)
  backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  try:
    with pytest.raises(LeakjaxError, match=r'gcsfs.*leakjax\[gcs\]'):
      io.ExperimentWriter('gs://bucket/run', {'a': 1}, enabled=True)
  finally:
    backend._FileSystemSpecBackend._get_filesystem.cache_clear()
  assert not (tmp_path / 'gs:').exists()


def test_corrupt_config_json(tmp_path):
  (tmp_path / 'config.json').write_text('{not json')
  with pytest.raises(LeakjaxError, match='cannot read .*config.json'):
    io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)


def test_corrupt_results_line(tmp_path):
  w = io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)
  w.add_result({'batch': 0})
  with (tmp_path / 'results.jsonl').open('a') as f:
    f.write('{"batch": 1, "trunc\n')
  with pytest.raises(LeakjaxError, match='line 2, is not JSON'):
    io.ExperimentWriter(tmp_path, {'b': 1}, enabled=True)


def test_failed_first_run_does_not_block_the_corrected_one(tmp_path):
  io.ExperimentWriter(tmp_path, {'data': 'bad.txt'}, enabled=True)
  io.forget_unstarted_runs()  # what the entry point does on a LeakjaxError
  assert not (tmp_path / 'config.json').exists()
  w = io.ExperimentWriter(tmp_path, {'data': 'good.txt'}, enabled=True)
  w.add_result({'batch': 0})
  io.forget_unstarted_runs()  # a run with results keeps its config
  stored = json.loads((tmp_path / 'config.json').read_text())
  assert stored == {'data': 'good.txt'}
  with pytest.raises(LeakjaxError, match='changed: data'):
    io.ExperimentWriter(tmp_path, {'data': 'other.txt'}, enabled=True)


@pytest.mark.slow
@pytest.mark.parametrize(
  'experiment, args, fragment',
  [
    # --workdir is a file.
    (
      'differential',
      ['--workdir={tmp}/f', '--data={root}/README.md'],
      'is a file',
    ),
    # A corpus that does not exist; no config.json may stay behind.
    (
      'differential',
      ['--workdir={tmp}/w', '--data={tmp}/no.txt'],
      'does not exist',
    ),
    # A misspelt data set name is neither a file nor a name.
    (
      'differential',
      ['--workdir={tmp}/w', '--data=wikitext2'],
      'neither a file nor a named data set',
    ),
    (
      'differential',
      ['--workdir={tmp}/w', '--data={tmp}/f.tsv', '--data_label=Label'],
      'is not FIELD=VALUE',
    ),
    (
      'embed_parrot',
      ['--workdir={tmp}/w', '--data_label=Label=ham'],
      '--data_label is not used',
    ),
    ('gboard', ['--workdir={tmp}/w', '--num_sentences=0'], '--num_sentences=0'),
    ('embed_parrot', ['--workdir={tmp}/w', '--batch_size=0'], '--batch_size=0'),
  ],
)
def test_cli_refuses_before_any_work(tmp_path, experiment, args, fragment):
  (tmp_path / 'f').write_text('x')
  (tmp_path / 'f.tsv').write_text('Label\tText\nham\thello there\n')
  flagfile = {
    'differential': 'differential_quick',
    'gboard': 'gboard_quick',
    'embed_parrot': 'embed_parrot_quick',
  }[experiment]
  code, err = cli(
    f'experiments.{experiment}',
    f'--flagfile=experiments/configs/{flagfile}.flags',
    *(a.format(tmp=tmp_path, root=ROOT) for a in args),
  )
  assert_one_error_line(code, err, fragment)
  assert not (tmp_path / 'w' / 'config.json').exists()


# ----------------------------------------------------------- config sizes
@pytest.mark.parametrize(
  'field, value',
  [
    ('num_sentences', (16, 0)),
    ('vocab_size', 0),
    ('units', -1),
    ('client_pool', 0),
    ('num_datasets', 0),
  ],
)
def test_gboard_config_sizes(field, value):
  with pytest.raises(LeakjaxError, match=f'--{field}=.* must be at least'):
    GboardConfig(**{field: value})


def test_word_vocabulary_needs_a_word():
  # <UNK> and <S> take ids 0 and 1: --vocab_size=2 leaves no room for a word.
  with pytest.raises(LeakjaxError, match='--vocab_size=2 must be at least 3'):
    GboardConfig(vocab_size=2)
  with pytest.raises(LeakjaxError, match='--vocab_size=2 must be at least 3'):
    DifferentialConfig(data='c.txt', vocab_size=2)
  DifferentialConfig(data='c.txt', vocab_size=3)


@pytest.mark.parametrize(
  'field, value',
  [('batch_size', 0), ('num_test', 0), ('ep_batch_size', 0), ('ep_steps', -1)],
)
def test_embed_parrot_config_sizes(field, value):
  with pytest.raises(LeakjaxError, match=f'--{field}=.* must be at least'):
    InversionConfig(**{field: value})


def test_embed_parrot_test_fraction():
  for bad in (0.0, 1.0, -0.1):
    with pytest.raises(LeakjaxError, match='--test_fraction=.* must be in'):
      InversionConfig(test_fraction=bad)


@pytest.mark.parametrize(
  'field, value',
  [
    ('num_beams', (32, 0)),
    ('max_tokens', 0),
    ('train_batch_size', 0),
    ('reorder_candidates', 0),
    ('max_sentences', 0),
    ('train_steps', -1),
    ('ngram_size', (-1,)),
  ],
)
def test_film_config_sizes(field, value):
  with pytest.raises(LeakjaxError, match=f'--{field}=.* must be at least'):
    FilmConfig(**{field: value})


def test_film_eval_fraction():
  with pytest.raises(LeakjaxError, match='--eval_fraction=1.0 must be in'):
    FilmConfig(eval_fraction=1.0)


@pytest.mark.parametrize(
  'field, value',
  [('train_batch_size', 0), ('film_steps', -1), ('max_sentences', 0)],
)
def test_dager_config_sizes(field, value):
  with pytest.raises(LeakjaxError, match=f'--{field}=.* must be at least'):
    DagerConfig(**{field: value})


@pytest.mark.parametrize(
  'field, value',
  [('row_width', 0), ('batch_size', 0), ('top', 0), ('hidden_size', -1)],
)
def test_differential_config_sizes(field, value):
  with pytest.raises(LeakjaxError, match=f'--{field}=.* must be at least'):
    DifferentialConfig(data='c.txt', **{field: value})


# -------------------------------------------------------------- gradients
def test_check_gradient_nan_inf_zero():
  good = {'a': jnp.ones(3), 'b': jnp.zeros((2, 2))}
  errors.check_gradient(good)
  with pytest.raises(LeakjaxError, match=r"1 NaN/inf values in \['a'\]"):
    errors.check_gradient({**good, 'a': jnp.asarray([1.0, jnp.nan, 2.0])})
  with pytest.raises(LeakjaxError, match='2 NaN/inf'):
    errors.check_gradient({**good, 'b': jnp.full((2, 2), jnp.inf).at[0].set(1)})
  with pytest.raises(LeakjaxError, match='zero everywhere'):
    errors.check_gradient(jax.tree.map(jnp.zeros_like, good))


def test_check_finite_sees_bfloat16():
  with pytest.raises(LeakjaxError, match='NaN/inf'):
    errors.check_finite(jnp.asarray([1.0, jnp.nan], jnp.bfloat16), 'x')


@pytest.mark.slow
def test_film_bag_refuses_a_nan_gradient():
  model, params = tiny()
  grads = tiny_grads()
  assert len(bow.extract_bag(model, params, grads).ids) > 0
  emb = model.paths.word_embeddings
  bad = jax.tree_util.tree_map_with_path(
    lambda p, x: (
      x.at[0, 0].set(jnp.nan) if tuple(k.key for k in p) == tuple(emb) else x
    ),
    grads,
  )
  with pytest.raises(LeakjaxError, match='NaN/inf'):
    bow.extract_bag(model, params, bad)
  with pytest.raises(LeakjaxError, match='zero everywhere'):
    bow.extract_bag(model, params, jax.tree.map(jnp.zeros_like, grads))


@pytest.mark.slow
def test_dager_refuses_a_nan_gradient():
  model, params = tiny()
  bad = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), tiny_grads())
  with pytest.raises(LeakjaxError, match='NaN/inf'):
    dager.recover(model, params, bad)


# ----------------------------------------------------------- token ids
@pytest.mark.parametrize('bad', [999999, -5, V])
def test_logits_refuse_out_of_vocabulary_ids(bad):
  model, params = tiny()
  ids = jnp.asarray([[1, bad, 3]], jnp.int32)
  with pytest.raises(LeakjaxError, match='token ids out of range'):
    model.logits(params, ids)
  with pytest.raises(LeakjaxError, match='token ids out of range'):
    model.decode(params, model.init_cache(params, 1, 8), ids)


@pytest.mark.slow
def test_traced_ids_are_not_checked():
  model, params = tiny()
  ids = jnp.asarray([[1, 2, 3]], jnp.int32)
  out = jax.jit(model.logits)(params, ids)
  np.testing.assert_allclose(out, model.logits(params, ids), atol=1e-5)


@pytest.mark.slow
def test_beam_search_refuses_out_of_vocabulary_ids():
  model, params = tiny()
  config = bs.BeamSearchConfig(num_beams=2, length=2)
  prompts = jnp.asarray([[[0, 5]]], jnp.int32)
  bag = jnp.asarray([5, 7, 9], jnp.int32)
  bs.bag_beam_search(model, params, prompts, bag, config=config)
  with pytest.raises(LeakjaxError, match='prompt ids out of range'):
    bs.bag_beam_search(
      model, params, prompts.at[0, 0, 1].set(999999), bag, config=config
    )
  with pytest.raises(LeakjaxError, match='bag ids out of range'):
    bs.bag_beam_search(model, params, prompts, bag.at[1].set(-5), config=config)
  # Padding entries (mask False) may hold any id.
  bs.bag_beam_search(
    model,
    params,
    prompts,
    bag.at[1].set(-5),
    bag_mask=jnp.asarray([True, False, True]),
    config=config,
  )


def test_check_positive_names_the_flag():
  import types

  with pytest.raises(LeakjaxError, match=r'--sizes=4,0 must be at least 1'):
    errors.check_positive(types.SimpleNamespace(sizes=(4, 0)), 'sizes')
  errors.check_positive(types.SimpleNamespace(steps=0), 'steps', minimum=0)


class _RunsCode:
  """A pickle payload: unpickling it would call print."""

  def __reduce__(self):
    return (print, ('this ran from the checkpoint',))


@pytest.mark.slow
def test_pickled_checkpoint_with_code_is_refused_without_unsafe_advice(
  tmp_path, capsys
):
  torch = pytest.importorskip('torch')
  from leakjax.models import hf_checkpoint  # noqa: PLC0415

  path = tmp_path / 'pytorch_model.bin'
  torch.save({'w': _RunsCode()}, path)
  with pytest.raises(LeakjaxError) as info:
    hf_checkpoint._read_torch_bin(path)  # pylint: disable=protected-access
  message = str(info.value)
  assert (
    'Unsupported global' in message and 'never runs pickled code' in message
  )
  # torch's own text advises weights_only=False or allowlisting: not ours.
  assert 'weights_only=False' not in message and 'safe_globals' not in message
  assert 'this ran' not in capsys.readouterr().out
