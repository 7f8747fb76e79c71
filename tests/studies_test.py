"""studies/: one absl program per study, and the commands the reports record.

The reports' READMEs, the flagfiles' headers and the studies' docstrings
name study commands (`python -m studies.dager.selection --results=...`) and
flagfiles (`--flagfile=studies/dager/configs/dager_hybrid.flags`); every one
must still name a study whose flags parse, or a flagfile that exists.
"""

import ast
import importlib
import pathlib
import re

import pytest

import studies

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Modules the studies share; not programs of their own.
HELPERS = {'studies/dager/study.py'}
FLAGFILE_DIRS = (
  'experiments/configs',
  *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob('studies/*/configs'))),
)


def study_files() -> list[str]:
  return sorted(
    str(p.relative_to(ROOT))
    for p in (ROOT / 'studies').rglob('*.py')
    if p.name != '__init__.py'
  )


def documents() -> dict[str, str]:
  """The texts that record commands: READMEs, flagfiles, study modules and
  the experiments' docstrings."""
  paths = [ROOT / 'README.md', ROOT / 'BUILD.md']
  paths += sorted((ROOT / 'reports').rglob('*.md'))
  paths += sorted((ROOT / 'studies').rglob('*.py'))
  paths += sorted((ROOT / 'experiments').glob('*.py'))
  for folder in FLAGFILE_DIRS:
    paths += sorted((ROOT / folder).glob('*.flags'))
  return {
    str(p.relative_to(ROOT)): p.read_text('utf-8').replace('\\\n', ' ')
    for p in paths
  }


def study_commands() -> list[tuple[str, str, list[str]]]:
  """`(document, module, args)` of every `python -m studies.X --a=b ...`."""
  out = []
  pattern = re.compile(
    r'python -m (studies(?:\.\w+)+)((?:\s+--\w+(?:=[^\s`\'")]*)?)*)'
  )
  for name, text in documents().items():
    for m in pattern.finditer(' '.join(text.split())):
      out.append((name, m.group(1), m.group(2).split()))
  return out


@pytest.mark.parametrize('path', study_files())
def test_every_study_is_an_absl_program(path):
  source = (ROOT / path).read_text('utf-8')
  tree = ast.parse(source)
  assert 'argparse' not in source and 'sys.argv' not in source, path
  if path in HELPERS:
    assert "__name__ == '__main__'" not in source
    return
  mains = [
    node
    for node in tree.body
    if isinstance(node, ast.FunctionDef) and node.name == 'main'
  ]
  assert len(mains) == 1, path
  assert [a.arg for a in mains[0].args.args] == ['argv'], path
  assert source.rstrip().endswith('app.run(main)'), path
  assert 'from absl import app' in source, path
  # Flags are defined when run, never at import: a test may import any
  # number of studies.
  for node in tree.body:
    text = ast.unparse(node)
    if not isinstance(node, (ast.FunctionDef, ast.If)):
      assert 'flags.DEFINE_' not in text, (path, text)


@pytest.mark.parametrize('path', study_files())
def test_every_study_uses_public_names_and_its_report_folder(path):
  # No `module._private` name and no import of one; each study works on the
  # report folder that mirrors its place.
  source = (ROOT / path).read_text('utf-8')
  private = re.findall(r'\b[a-z_]\w*\._[a-z]\w*', source)
  assert not private, (path, private)
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom):
      assert not any(a.name.startswith('_') for a in node.names), path
      assert not (node.module or '').startswith('reports'), path
  assert studies.report_dir(ROOT / path).is_dir(), path


def test_recorded_study_commands_parse(fresh_flags):
  commands = study_commands()
  # The studies of each paper are recorded somewhere.
  recorded = {module for _, module, _ in commands}
  programs = {
    p.removesuffix('.py').replace('/', '.')
    for p in study_files()
    if p not in HELPERS
  }
  assert programs <= recorded, programs - recorded
  for document, module, args in commands:
    assert module in programs, (document, module)
    values = fresh_flags
    for name in list(values):
      delattr(values, name)
    study = importlib.import_module(module)
    if hasattr(study, 'define_flags'):
      study.define_flags()
    values(['prog', *args])
    values.unparse_flags()


def test_no_document_names_a_study_under_reports():
  for name, text in documents().items():
    assert not re.search(r'python -m reports\.', text), name
    assert not re.search(r'`reports\.\w+\.\w+`', text), name


def test_every_named_flagfile_exists():
  pattern = re.compile(r'(?:experiments|studies/\w+)/configs/\w+\.flags')
  for name, text in documents().items():
    for path in pattern.findall(text):
      assert (ROOT / path).is_file(), (name, path)
  # Each flagfile's header gives the command that runs it, by its own path.
  for folder in FLAGFILE_DIRS:
    for path in sorted((ROOT / folder).glob('*.flags')):
      rel = str(path.relative_to(ROOT))
      assert f'--flagfile={rel}' in path.read_text('utf-8'), rel


def test_hybrid_ablations_live_beside_their_studies():
  # experiments/configs keeps the quick runs, the papers' protocols and,
  # of the hybrid's settings, the strongest one's full runs; the other
  # settings are studies.
  kept = {
    p.stem for p in (ROOT / 'experiments/configs').glob('dager_hybrid*.flags')
  }
  assert kept == {
    'dager_hybrid_evidence_oversample',
    'dager_hybrid_evidence_oversample_heldout',
  }
  ablations = {p.stem for p in (ROOT / 'studies/dager/configs').glob('*.flags')}
  assert {'dager_hybrid', 'dager_hybrid_evidence'} <= ablations
