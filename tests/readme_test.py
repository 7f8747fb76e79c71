"""README.md's Python examples run as written, in order, in one namespace."""

import pathlib
import re

import jax
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python_blocks(text: str) -> list[str]:
  return re.findall(r'```python\n(.*?)```', text, flags=re.S)


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch, capsys):
  blocks = python_blocks((ROOT / 'README.md').read_text())
  assert len(blocks) >= 3, 'the API tour lost its examples'
  monkeypatch.chdir(tmp_path)
  namespace = {}
  for i, block in enumerate(blocks):
    code = block.replace('/tmp/smollm2_hf', str(tmp_path / 'smollm2_hf'))
    exec(compile(code, f'README.md python block {i}', 'exec'), namespace)
  out = capsys.readouterr().out
  assert '(1, 3)' in out
  # Your own transformer: FILM's bag holds the inputs, DAGER the exact batch.
  assert sorted(namespace['exact'].sequences) == sorted(
    [[3, 14, 15, 9, 26, 5, 35], [8, 27, 18, 28]]
  )
  assert {3, 14, 15, 9, 26, 5, 8, 27, 18} <= set(namespace['bag'].ids.tolist())
  # The training block: 4 steps of both loops, the caller's params untouched.
  assert '4 True' in out
  # `train` is `fit` with the next-token loss: same data, order and steps,
  # so the same parameters.
  tuned, run = namespace['tuned'], namespace['run']
  assert tuned.step == run.step == 4
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
    tuned.params,
    run.params,
  )
  assert run.history[-1]['loss'] < run.history[0]['loss']
  # What the tour promises: the saved directory loads back, same logits.
  from leakjax import models

  again, again_params = models.load(tmp_path / 'smollm2_hf')
  assert again == namespace['model']
  jax.tree.map(np.testing.assert_array_equal, again_params, namespace['params'])
