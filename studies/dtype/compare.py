"""What bfloat16 changes: each quick flagfile run in float32 and bfloat16.

Every experiment takes `--dtype` (float32, the default and every committed
number's, or bfloat16: the attacked model cast to it, see each config's
docstring). For each flagfile of `--flagfiles`, this runs its experiment
twice on the same machine, one dtype after the other, into
`reports/dtype/<flagfile>/<dtype>/`, and writes
`reports/dtype/summary.json`:

  {flagfile: {'float32': summary, 'bfloat16': summary}}

where each summary is the run's own `summary.json` (its numeric keys), and
`reports/dtype/README.md`, the headline keys of each (`HEADLINES`) side by
side. A run's folders (models, checkpoints) are deleted after it, its files
kept. A run whose folder holds a summary already is not run again
(`--rerun` to force), so `--flagfiles` can grow one flagfile at a time.
Decision: no seconds are compared. On a CPU, bfloat16 matmuls are not
faster than float32 ones, and runs of one flagfile share caches (the
hidden states of Embed Parrot's corpora), so their wall times say nothing
about an accelerator.

  python -m studies.dtype.compare
  python -m studies.dtype.compare --flagfiles=film_quickstart,dager_quick
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from absl import app, flags

import studies
from leakjax import models

ROOT = studies.ROOT
REPORT = ROOT / 'reports' / 'dtype'
# Each quick flagfile and the experiment that reads it.
EXPERIMENTS = {
  'film_quickstart': 'film',
  'dager_quick': 'dager',
  'embed_parrot_quick': 'embed_parrot',
  'gboard_quick': 'gboard',
  'differential_quick': 'differential',
  'inversion_exact_quick': 'inversion_exact',
}


def command(flagfile: str, dtype: str, workdir: Path) -> list[str]:
  """The experiment's command line for one run."""
  return [
    sys.executable,
    '-m',
    f'experiments.{EXPERIMENTS[flagfile]}',
    f'--flagfile=experiments/configs/{flagfile}.flags',
    f'--dtype={dtype}',
    f'--workdir={workdir}',
  ]


def numeric(summary: dict) -> dict[str, float]:
  """The summary's numbers (its text fields left out)."""
  return {
    k: v
    for k, v in summary.items()
    if isinstance(v, (int, float)) and not isinstance(v, bool)
  }


def run_one(flagfile: str, dtype: str, out: Path, rerun: bool) -> None:
  """Runs one flagfile at one dtype into `out/<flagfile>/<dtype>/`, unless
  its summary is there already (and not `rerun`)."""
  workdir = out / flagfile / dtype
  if (workdir / 'summary.json').exists() and not rerun:
    return
  shutil.rmtree(workdir, ignore_errors=True)
  workdir.mkdir(parents=True, exist_ok=True)
  subprocess.run(command(flagfile, dtype, workdir), cwd=ROOT, check=True)
  # The report keeps the run's files; its models and checkpoints (folders
  # such as models/ and train/, up to 200 MB) are left out.
  for folder in [p for p in workdir.iterdir() if p.is_dir()]:
    shutil.rmtree(folder)


def compare(flagfiles, out: Path, rerun: bool = False) -> dict:
  """Runs what is missing and returns the whole summary (module doc)."""
  path = out / 'summary.json'
  summary = json.loads(path.read_text()) if path.exists() else {}
  for flagfile in flagfiles:
    if flagfile not in EXPERIMENTS:
      raise app.UsageError(
        f'unknown flagfile {flagfile!r}: one of {", ".join(EXPERIMENTS)}'
      )
    entry = summary.setdefault(flagfile, {})
    for dtype in models.DTYPES:
      run_one(flagfile, dtype, out, rerun)
      got = json.loads((out / flagfile / dtype / 'summary.json').read_text())
      entry[dtype] = numeric(got)
    print(f'{flagfile}: both dtypes done', flush=True)
  return summary


# The keys README.md shows for each flagfile: (label, summary key).
HEADLINES = {
  'film_quickstart': [
    *((f'ROUGE-L, b = {b}', f'rougeL@b={b}') for b in (1, 4, 16)),
    *((f'bag recall, b = {b}', f'bag_recall@b={b}') for b in (1, 4, 16)),
  ],
  'dager_quick': [
    *((f'ROUGE-L, b = {b}', f'rougeL@b={b}') for b in (1, 4, 16)),
    *((f'exact, b = {b}', f'exact@b={b}') for b in (1, 4, 16)),
  ],
  'embed_parrot_quick': [
    *(
      (
        f'Embed Parrot ROUGE-1, {d}, layer 25',
        f'rouge1@data={d},layer=25,method=ep_skip',
      )
      for d in ('enron', 'wikitext', 'sms')
    ),
    ('HEI ROUGE-1, enron, layer 0', 'rouge1@data=enron,layer=0,method=hei'),
    (
      'DCT: Embed Parrot ROUGE-1, enron, layer 25',
      'rouge1@data=enron,defense=dct,layer=25,method=ep_skip,subsets=1',
    ),
  ],
  'gboard_quick': [
    (
      f'{m}, full batch, E = 1, n_k = {n}',
      f'{k}@B=full,E=1,n_k={n},noise=none,sigma=0.0',
    )
    for n in (16, 64)
    for m, k in (
      ('word F1', 'f1'),
      ('precision', 'precision'),
      ('recall', 'recall'),
    )
  ],
  'differential_quick': [
    *(
      (f'DS, {m}, k = 16', f'ds@canary=mixed,k=16,method={m}')
      for m in ('continued', 'continued_extra', 'retrain')
    ),
    *(
      (f'DR, {m}, k = 16', f'dr@canary=mixed,k=16,method={m}')
      for m in ('continued', 'continued_extra', 'retrain')
    ),
  ],
  'inversion_exact_quick': [
    (
      f'{m}, layer {layer}{n and ", noise " + n}',
      f'{k}@attack=exact,data=enron,layer={layer},'
      f'{n and "noise=" + n + ","}split=test',
    )
    for layer in (10, 25)
    for n in ('', '0.01')
    for m, k in (
      ('exact', 'exact'),
      ('candidates a token', 'candidates_per_token'),
    )
  ],
}
INTRO = """# What bfloat16 changes

Each quick flagfile run twice on the same machine, with `--dtype=float32` (the
default, and every other report's) and `--dtype=bfloat16` (the attacked model
cast to bfloat16: the client's gradient or update, the served hidden states or
the snapshots, and the attack itself; the victim's own training stays
float32). Regenerate (about an hour on a 2-core CPU; finished runs are kept):

    python -m studies.dtype.compare

`summary.json` holds every numeric key of both runs; `<flagfile>/<dtype>/` each
run's summary, rows and config. The headline keys:
"""


READING = """
## Reading

- **Keep their numbers**: the differential score and rank (every rank the
  same, scores within one percent), Embed Parrot, HEI and BEI (ROUGE-1 within a
  few hundredths either way), and the exact hidden-state search (exact everywhere:
  on a bfloat16 model's own states it uses the gap rule, since bfloat16's
  rounding is above the tolerance rule's).
- **Lose some**: FILM. The bag loses recall and the beam search and reordering
  rank by rounded scores, so ROUGE-L drops at every batch size.
- **Break**: DAGER and the GBoard attack. DAGER's span tests find no clear rank
  in bfloat16 gradients (every batch is rank-limited in
  `dager_quick/bfloat16/results.jsonl`, the float32 run none): its thresholds
  assume float32 rounding. GBoard's words come from the output-bias update,
  which bfloat16 local training rounds; its precision and recall both fall (the
  cause inside the update was not investigated).

For an audit of a deployment that trains or serves in bfloat16, these are its
numbers; to bound the leak of the artefact itself, attack in float32.
"""


def number(v: float) -> str:
  """Three decimals for scores, three significant digits otherwise."""
  if isinstance(v, int):
    return str(v)
  return f'{v:.3f}' if v == 0 or 0.01 <= abs(v) < 100 else f'{v:.3g}'


def readme(summary: dict) -> str:
  """README.md: `INTRO` and one table of `HEADLINES` per flagfile."""
  out = [INTRO]
  for flagfile, rows in HEADLINES.items():
    if flagfile not in summary:
      continue
    entry = summary[flagfile]
    out += [
      f'\n## {flagfile}\n',
      '| metric | float32 | bfloat16 |',
      '|---|---:|---:|',
      *(
        f'| {label} | {number(entry["float32"][key])} | '
        f'{number(entry["bfloat16"][key])} |'
        for label, key in rows
      ),
    ]
  return '\n'.join(out) + '\n' + READING


def main(argv):
  del argv
  f = flags.FLAGS
  out = Path(f.out)
  summary = compare(f.flagfiles, out, f.rerun)
  studies.write_summary(out / 'summary.json', summary)
  (out / 'README.md').write_text(readme(summary))


def define_flags() -> None:
  flags.DEFINE_list('flagfiles', list(EXPERIMENTS), 'Quick flagfiles to run.')
  flags.DEFINE_string('out', str(REPORT), 'Report folder.')
  flags.DEFINE_bool('rerun', False, 'Run again where a summary exists.')


if __name__ == '__main__':
  define_flags()
  app.run(main)
