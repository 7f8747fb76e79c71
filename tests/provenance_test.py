"""provenance.json: input fingerprints, the environment, refused resumes."""

import hashlib
import json

import jax.numpy as jnp
import pytest

from experiments import film as film_exp
from leakjax import io, models, provenance
from leakjax.attacks.film import runner
from leakjax.errors import LeakjaxError


def test_file_and_folder_sha256(tmp_path):
  f = tmp_path / 'a.txt'
  f.write_bytes(b'alpha\n')
  assert provenance.file_sha256(f) == hashlib.sha256(b'alpha\n').hexdigest()
  folder = tmp_path / 'm'
  folder.mkdir()
  (folder / 'config.json').write_text('{}')
  (folder / 'w.bin').write_bytes(b'\x00' * 8)
  first = provenance.file_sha256(folder)
  (folder / 'w.bin').write_bytes(b'\x00' * 7 + b'\x01')
  assert provenance.file_sha256(folder) != first
  with pytest.raises(LeakjaxError, match='cannot read'):
    provenance.file_sha256(tmp_path / 'missing')


def test_pytree_sha256_sees_values_names_and_dtypes():
  tree = {'a': jnp.arange(4.0), 'b': {'c': jnp.ones((2, 2))}}
  same = {'a': jnp.arange(4.0), 'b': {'c': jnp.ones((2, 2))}}
  assert provenance.pytree_sha256(tree) == provenance.pytree_sha256(same)
  for other in (
    {**tree, 'a': tree['a'].at[3].set(3.5)},
    {'x': tree['a'], 'b': tree['b']},
    {**tree, 'a': tree['a'].astype(jnp.bfloat16)},
  ):
    assert provenance.pytree_sha256(other) != provenance.pytree_sha256(tree)


def test_writer_records_inputs_and_environment(tmp_path):
  data = tmp_path / 'corpus.txt'
  data.write_text('One sentence.\n')
  io.ExperimentWriter(
    tmp_path / 'w', {'b': 1}, inputs={'data': data, 'model': None}, enabled=True
  )
  record = json.loads((tmp_path / 'w' / 'provenance.json').read_text())
  assert record['inputs'] == {
    'data': {'path': str(data), 'sha256': provenance.file_sha256(data)}
  }
  env = record['environment']
  assert env['packages']['jax'] and env['devices']['platform'] == 'cpu'
  assert env['leakjax'] and env['python']
  # This checkout is a git repository: its commit is recorded.
  assert len(env['git']['commit']) == 40
  # The CPU, whose instruction set XLA compiles for.
  assert env['cpu']['model'] and isinstance(env['cpu'].get('vector', []), list)
  other = {**env, 'cpu': {'model': 'Other CPU', 'vector': ['avx512f']}}
  changes = provenance.environment_changes(other, env)
  assert changes == [f'cpu {other["cpu"]} -> {env["cpu"]}']
  # Records written before the CPU was recorded compare equal.
  assert (
    provenance.environment_changes(
      {k: v for k, v in env.items() if k != 'cpu'}, env
    )
    == []
  )


def test_resume_with_a_changed_input_is_refused(tmp_path):
  data = tmp_path / 'corpus.txt'
  data.write_text('One sentence.\n')
  writer = io.ExperimentWriter(
    tmp_path / 'w', {'b': 1}, inputs={'data': data}, enabled=True
  )
  writer.add_result({'x': 1})
  io.ExperimentWriter(
    tmp_path / 'w', {'b': 1}, inputs={'data': data}, enabled=True
  )
  data.write_text('Another sentence.\n')
  with pytest.raises(LeakjaxError, match=r"input 'data' .* has changed"):
    io.ExperimentWriter(
      tmp_path / 'w', {'b': 1}, inputs={'data': data}, enabled=True
    )


def test_loaded_corpus_fingerprint(tmp_path):
  # A corpus from any source (a Hugging Face dataset, the embedded one) is
  # fingerprinted as loaded: its texts in order, with their boundaries.
  texts = ['One sentence.', 'Two.']
  want = hashlib.sha256()
  for t in texts:
    want.update(len(t.encode()).to_bytes(8, 'little') + t.encode())
  got = provenance.fingerprint_inputs({'texts': texts, 'none': None})
  assert got == {'texts': {'path': '2 texts', 'sha256': want.hexdigest()}}
  moved = provenance.texts_sha256(['One sentence.Two', '.'])
  assert moved != want.hexdigest()  # same characters, other texts
  writer = io.ExperimentWriter(
    tmp_path / 'w', {'b': 1}, inputs={'texts': texts}, enabled=True
  )
  writer.add_result({'x': 1})
  with pytest.raises(LeakjaxError, match=r"input 'texts' \(2 texts\)"):
    io.ExperimentWriter(
      tmp_path / 'w', {'b': 1}, inputs={'texts': ['Other.', 'Two.']}
    )


def test_failed_fresh_run_leaves_no_provenance(tmp_path):
  io.ExperimentWriter(tmp_path / 'w', {'b': 1}, enabled=True)
  assert (tmp_path / 'w' / 'provenance.json').exists()
  io.forget_unstarted_runs()
  assert not (tmp_path / 'w' / 'provenance.json').exists()
  assert not (tmp_path / 'w' / 'config.json').exists()


@pytest.mark.slow
def test_film_experiment_refuses_an_edited_corpus(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  sentences = [f'Anna Berg met client number {i} in Oslo.' for i in range(12)]
  corpus.write_text('\n'.join(sentences) + '\n')
  cfg = runner.FilmConfig(
    model=models.GPT2_TINY,
    data=str(corpus),
    require_entity=False,
    batch_sizes=(1,),
    num_batches=1,
    train_steps=1,
    train_batch_size=4,
    eval_fraction=0.0,
    num_beams=(2,),
    length=4,
    max_prompts=2,
    phrase_steps=0,
    token_steps=0,
    reorder_candidates=2,
  )
  film_exp.run_experiment(cfg, tmp_path / 'w', progress=False)
  corpus.write_text('\n'.join(sentences[:-1] + ['Edited.']) + '\n')
  with pytest.raises(LeakjaxError, match=r"input 'data' .* has changed"):
    film_exp.run_experiment(cfg, tmp_path / 'w', progress=False)


def test_pinned_smollm2_file_is_checked(tmp_path, monkeypatch):
  fake = tmp_path / 'SmolLM2-135M-Instruct.Q4_1.gguf'
  fake.write_bytes(b'GGUF' + b'\x00' * 64)
  monkeypatch.setattr(models, 'smollm2_gguf_path', lambda: fake)
  with pytest.raises(LeakjaxError, match='not the pinned SmolLM2-135M file'):
    models.load(models.SMOLLM2_ALIAS)
  assert models.source_path(models.SMOLLM2_ALIAS) == fake
  assert models.source_path('gpt2-tiny') is None
