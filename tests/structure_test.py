"""The package's shape: paper packages stand alone, modules stay short.

STYLE.md: papers share code through neutral modules (`leakjax.recovery`,
models, fl, tokenization, metrics), never by importing each other; one
concept per module.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ATTACKS = ROOT / 'leakjax' / 'attacks'
MAX_LINES = 700


def paper_packages() -> list[str]:
  return sorted(
    p.name for p in ATTACKS.iterdir() if (p / '__init__.py').exists()
  )


def imported_modules(path: pathlib.Path, root: pathlib.Path = ROOT) -> set[str]:
  """Every module `path` (under `root`) imports, as absolute dotted names;
  `from a import b` counts as both `a` and `a.b` (b may be a module)."""
  package = '.'.join(path.relative_to(root).with_suffix('').parts[:-1])
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:  # relative: resolve against this file's package
        parts = package.split('.')
        parts = parts[: len(parts) - node.level + 1]
        base = '.'.join(parts + ([base] if base else []))
      out.add(base)
      out.update(f'{base}.{alias.name}' for alias in node.names)
  return out


def attack_packages_imported(
  path: pathlib.Path, root: pathlib.Path = ROOT
) -> set[str]:
  """The `leakjax.attacks.<package>` names `path` imports."""
  out = set()
  for name in imported_modules(path, root):
    parts = name.split('.')
    if parts[:2] == ['leakjax', 'attacks'] and len(parts) > 2:
      out.add(parts[2])
  return out


def test_the_import_parser_sees_every_form(tmp_path):
  # A stand-in tree: leakjax/attacks/film/x.py with each import form.
  pkg = tmp_path / 'leakjax' / 'attacks' / 'film'
  pkg.mkdir(parents=True)
  src = pkg / 'x.py'
  src.write_text(
    'import leakjax.attacks.dager.search\n'
    'from leakjax.attacks import gboard\n'
    'from leakjax.attacks.inversion import dct\n'
    'from ..differential import score\n'
    'from . import beam_search\n'
    'from leakjax.recovery import bag\n'
  )
  got = attack_packages_imported(src, tmp_path)
  assert got == {
    'dager',
    'gboard',
    'inversion',
    'differential',
    'film',
  }


@pytest.mark.parametrize('paper', paper_packages())
def test_a_paper_imports_no_other_paper(paper):
  others = set(paper_packages()) - {paper}
  found = {}
  for path in sorted((ATTACKS / paper).rglob('*.py')):
    bad = attack_packages_imported(path) & others
    if bad:
      found[str(path.relative_to(ROOT))] = sorted(bad)
  assert not found, (
    f'{paper} imports other papers (share through leakjax.recovery'
    ' or another neutral module instead): {found}'
  )


def test_the_neutral_package_imports_no_paper():
  found = {
    str(path.relative_to(ROOT)): sorted(
      attack_packages_imported(path) & set(paper_packages())
    )
    for path in sorted((ROOT / 'leakjax' / 'recovery').rglob('*.py'))
  }
  assert not any(found.values()), found


def test_every_module_is_short():
  long = {
    str(path.relative_to(ROOT)): n
    for path in sorted((ROOT / 'leakjax').rglob('*.py'))
    if (n := len(path.read_text().splitlines())) > MAX_LINES
  }
  assert not long, f'modules over {MAX_LINES} lines (split by concern): {long}'
