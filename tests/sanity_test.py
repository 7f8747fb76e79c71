"""Smoke test of experiments/sanity.py (the interim main job)."""

import json
import subprocess
import sys

import jax
import pytest

from leakjax import models, tokenization
from leakjax.models import gpt2


def _run(*args):
  return subprocess.run(
    [sys.executable, '-m', 'experiments.sanity', *args],
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.slow
def test_sanity_runs_on_a_checkpoint_and_data(tmp_path):
  config = gpt2.GPT2Config.tiny(vocab_size=50257)
  model, params = gpt2.init_model(
    config, key=jax.random.key(0), tokenizer=tokenization.gpt2_tokenizer()
  )
  models.save(model, params, tmp_path / 'ckpt')
  (tmp_path / 'data.txt').write_text('One two three four.\n\nFive six seven.\n')
  out = _run(
    f'--model={tmp_path / "ckpt"}',
    f'--data={tmp_path / "data.txt"}',
    f'--workdir={tmp_path / "w"}',
  )
  assert out.returncode == 0, out.stderr
  summary = json.loads((tmp_path / 'w' / 'summary.json').read_text())
  assert summary['num_params'] == models.num_params(params)
  rows = (tmp_path / 'w' / 'results.jsonl').read_text().splitlines()
  assert [json.loads(r)['text'] for r in rows] == [
    'One two three four.',
    'Five six seven.',
  ]
  assert 'perplexity' in (tmp_path / 'w' / 'summary.md').read_text()


@pytest.mark.slow
def test_sanity_bad_path_exits_2_without_output(tmp_path):
  out = _run('--model=/no/such/dir', f'--workdir={tmp_path / "w"}')
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1] == (
    'leakjax: error: checkpoint path /no/such/dir does not exist; check the'
    ' path'
  )
  assert not (tmp_path / 'w').exists()
