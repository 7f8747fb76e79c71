"""Exact-inversion report: summary.json and summary.md.

summary.json holds the keys of
:func:`leakjax.attacks.inversion.exact_runner.summarize`
(`exact@attack=exact,data=enron,layer=25,split=test`, ...); its
`seconds_per_sentence@...` keys are wall-clock seconds and vary run to run.
summary.md has one table per split (unperturbed states: the exact
search's exact and ROUGE-1, its cost, the one-shot reads beside it), one
table of the perturbations (the exact search and the linear inverses), and
a few recovered texts.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from leakjax import io, models
from leakjax.attacks.inversion import exact_runner
from leakjax.errors import LeakjaxError

EXACT_COLUMNS = (
  'exact',
  'rouge1',
  'candidates_per_token',
  'seconds_per_sentence',
  'undecided',
)
PERTURBED_COLUMNS = ('exact', 'rouge1', 'undecided')


def _cells(rows) -> dict[tuple, dict[str, Any]]:
  return {
    (r['split'], r['data'], r['layer'], r['perturbation'], r['attack']): r
    for r in rows
    if r.get('kind') == 'attack'
  }


def _get(cells, cell: tuple, attack: str, metric: str) -> float:
  row = cells.get((*cell, attack))
  return float('nan') if row is None else float(row[metric])


def one_shots(cells) -> tuple[str, ...]:
  """The one-shot reads shown beside the search, strongest first
  (Embed Parrot where the rows have it: runs before it joined do not)."""
  parrot = any(key[-1] == 'ep_skip' for key in cells)
  return ('softmax',) + ('ep_skip',) * parrot + ('ridge', 'hei', 'bei')


NAMES = {'ep_skip': 'EP', 'hei': 'HEI', 'bei': 'BEI'}


def _titles(attacks) -> list[str]:
  return [f'ROUGE-1 {NAMES.get(a, a)}' for a in attacks]


def split_table(cfg, cells, split: str) -> str:
  """Rows corpus x layer, unperturbed states."""
  rows = []
  reads = one_shots(cells)
  for name, _ in cfg.corpus_paths():
    for layer in cfg.layers:
      cell = (split, name, layer, 'none')
      if (*cell, 'exact') not in cells:
        continue  # not run (listed under 'Cells not run')
      rows.append(
        [
          name,
          layer,
          *(_get(cells, cell, 'exact', m) for m in EXACT_COLUMNS),
          *(_get(cells, cell, a, 'rouge1') for a in reads),
        ]
      )
  return io.markdown_table(
    [
      'corpus',
      'layer',
      'exact',
      'ROUGE-1',
      'candidates/token',
      's/sentence',
      'undecided',
      *_titles(reads),
    ],
    rows,
  )


def perturbation_table(cfg, cells) -> str:
  """The exact search and the learned inverses against every perturbation."""
  rows = []
  reads = one_shots(cells)[:-2]  # the learned inverses, not HEI or BEI
  for split in cfg.splits:
    for name, _ in cfg.corpus_paths():
      for layer in cfg.layers:
        for spec in cfg.perturbations:
          cell = (split, name, layer, exact_runner.perturb.parse(spec).spec)
          if (*cell, 'exact') not in cells:
            continue
          rows.append(
            [
              *cell,
              *(_get(cells, cell, 'exact', m) for m in PERTURBED_COLUMNS),
              *(_get(cells, cell, a, 'rouge1') for a in reads),
            ]
          )
  return io.markdown_table(
    [
      'split',
      'corpus',
      'layer',
      'perturbation',
      'exact',
      'ROUGE-1',
      'undecided',
      *_titles(reads),
    ],
    rows,
  )


def examples(cfg, cells, shown: int = 2) -> str:
  """Reference -> exact recovery at the deepest layer, unperturbed."""
  layer = cfg.layers[-1]
  lines = []
  for split in cfg.splits:
    for name, _ in cfg.corpus_paths():
      row = cells.get((split, name, layer, 'none', 'exact'))
      if row is None:
        continue
      for ref, got in list(zip(row['references'], row['recovered']))[:shown]:
        lines.append(f'- {split}, {name}, layer {layer}: `{ref}` -> `{got}`')
  return '\n'.join(lines) + '\n' if lines else ''


def markdown(cfg, result: exact_runner.ExactRun) -> str:
  facts = result.facts
  cells = _cells(result.results)
  parts = [
    '# Exact inversion of hidden states\n',
    f'Model {facts["model"]} ({facts["num_layers"]} blocks, d ='
    f' {facts["hidden_size"]}, {facts["vocab_size"]} tokens) on'
    f' {facts["device"]}; the ridge inverse is fitted on'
    f' {facts["num_attacker"]} texts of {cfg.attacker_corpus}. Exact: the'
    ' fraction of texts recovered token for token; ROUGE-1 as Wan et al.'
    ' Sec. 5.1.3; candidates/token: the median checked per scored token;'
    ' s/sentence: wall-clock seconds (they vary run to run).\n',
  ]
  for split in cfg.splits:
    counts = facts['num_texts'][split]
    sizes = ', '.join(f'{n} {name}' for name, n in counts.items())
    if 'none' not in cfg.perturbations:
      parts.append(f'Split: {split} ({sizes} texts).\n')
      continue
    parts.append(f'## Split: {split} ({sizes} texts), unperturbed\n')
    parts.append(split_table(cfg, cells, split))
  if any(spec != 'none' for spec in cfg.perturbations):
    parts.append('## Perturbed states\n')
    parts.append(perturbation_table(cfg, cells))
  missing = [
    f'{split} {name} layer {layer} {p.spec}'
    for split, name, layer, p in exact_runner.cells(cfg)
    if (split, name, layer, p.spec, 'exact') not in cells
  ]
  if missing:
    parts.append(
      f'## Cells not run ({len(missing)}: the run was cut short; the same'
      ' command resumes it)\n'
    )
    parts.append(', '.join(missing) + '\n')
  shown = examples(cfg, cells)
  if shown:
    parts.append('## Recovered texts (exact search)\n')
    parts.append(shown)
  return '\n'.join(parts)


def write(writer: io.ExperimentWriter, cfg, result) -> dict[str, float]:
  """Writes summary.json and summary.md; returns the summary."""
  summary = exact_runner.summarize(result.results, result.facts)
  writer.write_summary(summary, markdown(cfg, result))
  return summary


class _Folder:
  """A run's folder as :func:`write` writes to it."""

  enabled = True

  def __init__(self, workdir):
    self.workdir = io.as_path(workdir)

  def write_summary(self, summary, markdown_text: str) -> None:
    io.atomic_write_text(
      self.workdir / 'summary.json',
      json.dumps(io.jsonable(dict(summary)), indent=2, sort_keys=True),
    )
    io.atomic_write_text(self.workdir / 'summary.md', markdown_text)


def rerender(workdir, device: str | None = None) -> dict[str, float]:
  """Rewrites summary.json/.md of a run's folder from its config.json and
  results.jsonl (a run cut short included). Without facts.json the facts
  are recomputed from the config (texts drawn again, the model's shape),
  and `device` names the machine the rows were measured on."""
  folder = _Folder(workdir)
  for name in ('config.json', 'results.jsonl'):
    if not (folder.workdir / name).exists():
      raise LeakjaxError(
        f'{folder.workdir / name} does not exist', 'name a workdir'
      )
  stored = json.loads((folder.workdir / 'config.json').read_text())
  cfg = io.config_from_json(exact_runner.ExactRunConfig, stored)
  rows = [
    json.loads(line)
    for line in (folder.workdir / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]
  path = folder.workdir / 'facts.json'
  if path.exists():
    facts = json.loads(path.read_text())
  else:
    model, _ = models.load_model(cfg.model, seed=cfg.seed)
    drawn = exact_runner.draw_texts(
      cfg, model.tokenizer, exact_runner.load_corpora(cfg)
    )
    facts = exact_runner.run_facts(cfg, model, drawn)
    if device:  # the machine of the rows, not of this rebuild
      facts['device'] = device
      facts['devices'] = {'kind': device, 'named_by': '--device'}
    io.atomic_write_text(
      path, json.dumps(io.jsonable(facts), indent=2, sort_keys=True)
    )
  return write(folder, cfg, exact_runner.ExactRun(results=rows, facts=facts))


def main(argv: list[str]) -> None:
  """`python -m experiments.inversion_exact_report WORKDIR [--device=NAME]`."""
  device = [a.split('=', 1)[1] for a in argv if a.startswith('--device=')]
  argv = [a for a in argv if not a.startswith('--device=')]
  if len(argv) != 1 or argv[0].startswith('-'):
    sys.exit(
      'usage: python -m experiments.inversion_exact_report WORKDIR'
      ' [--device=NAME]'
    )
  try:
    summary = rerender(argv[0], device[0] if device else None)
  except LeakjaxError as e:
    sys.exit(f'leakjax: error: {e}')
  print(f'{argv[0]}/summary.json: {len(summary)} keys')


if __name__ == '__main__':
  main(sys.argv[1:])
