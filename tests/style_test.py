"""The tree keeps one style: `ruff format` and `ruff check` as configured in pyproject.toml."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  'args', [('format', '--check', '--quiet'), ('check', '--quiet')]
)
def test_ruff(args):
  ruff = shutil.which('ruff')
  assert ruff is not None, "ruff is a test dependency: pip install -e '.[test]'"
  proc = subprocess.run(
    [ruff, *args, '.'], cwd=ROOT, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
