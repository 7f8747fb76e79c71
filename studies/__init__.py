r"""Research in progress and ablations, one subpackage per paper.

Each study is an absl program that works on the artefacts of the report
folder mirroring its own place: `studies/dager/beams.py` reads and writes
`reports/dager/`, `studies/film_bag/defenses/dp_bound.py`
`reports/film_bag/defenses/`. Run from the repository root:

  python -m studies.dager.truncation_bound
  python -m studies.dager.selection \
      --results=reports/dager/hybrid_cuts/results.jsonl

A study uses the library's public names only. Ablation flagfiles of
`experiments/` live in `studies/<paper>/configs/`.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def report_dir(study_file: str | Path) -> Path:
  """The report folder of a study module.

  >>> report_dir(ROOT / 'studies/dager/beams.py') == ROOT / 'reports/dager'
  True
  """
  here = Path(study_file).resolve().parent
  return ROOT / 'reports' / here.relative_to(ROOT / 'studies')


def write_summary(path: str | Path, summary: dict) -> None:
  """Writes a study's summary as sorted, indented JSON (its folder made
  when missing) and says where."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(summary, indent=2, sort_keys=True) + '\n')
  print(f'Wrote {path} ({len(summary)} keys)')


__all__ = ['ROOT', 'report_dir', 'write_summary']
