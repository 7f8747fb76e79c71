"""What the studies of a hybrid run share: its rows, model and config, and
an output written after each batch that a re-run resumes."""

import json
from collections.abc import Callable
from pathlib import Path

from leakjax import models
from leakjax.attacks.dager import runner
from leakjax.errors import LeakjaxError


def load_run(results: str | Path):
  """`(cfg, model, params, rows)` of a hybrid run: its config (from the
  `config.json` beside `results`), the attacked model, and its rows that
  hold the searched sentences (`searched_ids`)."""
  path = Path(results)
  rows = [json.loads(line) for line in path.open()]
  rows = [r for r in rows if r['attack'] == 'hybrid' and 'searched_ids' in r]
  if not rows:
    raise LeakjaxError(
      f'{path} holds no hybrid row with its searched sentences (searched_ids)',
      'the studies need a hybrid run that recorded them: re-run its'
      ' flagfile with this version',
    )
  cfg = runner.config_from_json(
    json.loads((path.parent / 'config.json').read_text())
  )
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  return cfg, model, params, rows


def run_batches(
  rows: list[dict],
  target: Path,
  study: Callable[[dict], dict],
  mean: Callable[[list[dict]], dict],
  shown: Callable[[dict], dict] = lambda p: p,
) -> list[dict]:
  """`study(row)` for each row (in (b, batch) order) whose batch `target`
  lacks; after each, `target` holds `{'batches': [...], 'mean': mean(...)}`
  and `shown(result)` is printed."""
  per = json.loads(target.read_text())['batches'] if target.exists() else []
  done = {(p['b'], p['batch']) for p in per}
  for row in sorted(rows, key=lambda r: (r['b'], r['batch'])):
    if (row['b'], row['batch']) in done:
      continue
    per.append(study(row))
    per.sort(key=lambda p: (p['b'], p['batch']))
    target.write_text(
      json.dumps({'batches': per, 'mean': mean(per)}, indent=2) + '\n'
    )
    print(json.dumps(shown(per[-1])), flush=True)
  print(json.dumps(mean(per), indent=2))
  return per
