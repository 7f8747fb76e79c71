"""studies.dtype.compare: each quick flagfile at both dtypes, a run whose
summary exists is read instead of run again; reports/dtype/README.md is the
committed summary's tables."""

import json

import pytest
from absl import app

from leakjax import models
from studies.dtype import compare


def test_compare_runs_what_is_missing_and_reads_the_rest(tmp_path, monkeypatch):
  done = tmp_path / 'film_quickstart' / 'float32'
  done.mkdir(parents=True)
  (done / 'summary.json').write_text(json.dumps({'rougeL@b=1': 0.85, 'x': 's'}))
  calls = []

  def fake_run(cmd, cwd, check):
    calls.append(cmd)
    workdir = next(a for a in cmd if a.startswith('--workdir='))[10:]
    dtype = next(a for a in cmd if a.startswith('--dtype='))[8:]
    (tmp_path / workdir).mkdir(parents=True, exist_ok=True)
    score = {'float32': 0.85, 'bfloat16': 0.78}[dtype]
    (tmp_path / workdir / 'summary.json').write_text(
      json.dumps({'rougeL@b=1': score, 'flag': True})
    )
    (tmp_path / workdir / 'models').mkdir()  # a checkpoint folder

  monkeypatch.setattr(compare.subprocess, 'run', fake_run)
  got = compare.compare(['film_quickstart'], tmp_path)
  # Only the bfloat16 run was missing: one command, the experiment's own.
  assert len(calls) == 1
  assert calls[0][1:] == [
    '-m',
    'experiments.film',
    '--flagfile=experiments/configs/film_quickstart.flags',
    '--dtype=bfloat16',
    f'--workdir={tmp_path / "film_quickstart" / "bfloat16"}',
  ]
  assert not (tmp_path / 'film_quickstart' / 'bfloat16' / 'models').exists()
  entry = got['film_quickstart']
  assert entry['float32'] == {'rougeL@b=1': 0.85}  # numbers only
  assert entry['bfloat16'] == {'rougeL@b=1': 0.78}
  assert set(entry) == {'float32', 'bfloat16'}
  assert set(models.DTYPES) == {'float32', 'bfloat16'}
  # Every quick flagfile named is a committed one.
  for flagfile in compare.EXPERIMENTS:
    assert (compare.ROOT / f'experiments/configs/{flagfile}.flags').exists()
  with pytest.raises(app.UsageError, match='unknown flagfile'):
    compare.compare(['film_enron'], tmp_path)


def test_readme_tables():
  summary = {
    'dager_quick': {
      'float32': {
        f'{m}@b={b}': 1.0 for m in ('rougeL', 'exact') for b in (1, 4, 16)
      },
      'bfloat16': {
        f'{m}@b={b}': 0.0 for m in ('rougeL', 'exact') for b in (1, 4, 16)
      },
    }
  }
  md = compare.readme(summary)
  assert '## dager_quick' in md and '## film_quickstart' not in md
  assert '| ROUGE-L, b = 16 | 1.000 | 0.000 |' in md
  assert (
    compare.number(0.0015672) == '0.00157' and compare.number(1024) == '1024'
  )
  assert compare.number(7088.527) == '7.09e+03'


def test_committed_readme_is_the_committed_summary():
  """Every number of reports/dtype/README.md is its summary.json's, and every
  headline key is in both runs' summaries."""
  folder = compare.REPORT
  summary = json.loads((folder / 'summary.json').read_text())
  assert set(summary) == set(compare.EXPERIMENTS)
  for flagfile, rows in compare.HEADLINES.items():
    for dtype in models.DTYPES:
      missing = {k for _, k in rows} - set(summary[flagfile][dtype])
      assert not missing, (flagfile, dtype, missing)
  assert (folder / 'README.md').read_text() == compare.readme(summary)
