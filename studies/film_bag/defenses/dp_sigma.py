"""The DP-SGD noise multipliers of the committed defenses run.

The FILM runner calibrates σ with `leakjax.fl.sigma_for_epsilon` for each
`dp:ε` defense at sampling rate b / N over `dp_steps` steps (0 means one
step: the attack sees the first update) with the run's δ; N is the number
of training sentences, `max_sentences` here (the run keeps no eval split).
This script recomputes them from `reports/film_bag/defenses/config.json`
and writes `dp_sigma.json` there (σ, and σC/b, the per-coordinate noise std of the averaged
gradient).

Usage (repository root):
  python -m studies.film_bag.defenses.dp_sigma
"""

import json

from absl import app

from leakjax import fl
from studies import report_dir

REPORT = report_dir(__file__)


def main(argv) -> None:
  del argv
  cfg = json.loads((REPORT / 'config.json').read_text())
  if cfg['eval_fraction']:
    raise SystemExit('this run held out an eval split; N is not max_sentences')
  num_train = cfg['max_sentences']
  steps = cfg['dp_steps'] or max(1, cfg['train_steps'])
  rows = []
  for b in cfg['batch_sizes']:
    for spec in cfg['defenses']:
      if not spec.startswith('dp:'):
        continue
      eps = float(spec.split(':', 1)[1])
      sigma = fl.sigma_for_epsilon(
        eps, min(1.0, b / num_train), steps, cfg['dp_delta']
      )
      rows.append(
        {
          'b': b,
          'defense': spec,
          'epsilon': eps,
          'delta': cfg['dp_delta'],
          'sampling_rate': min(1.0, b / num_train),
          'steps': steps,
          'sigma': sigma,
          'noise_std': sigma * cfg['dp_clip'] / b,
        }
      )
  (REPORT / 'dp_sigma.json').write_text(json.dumps(rows, indent=2) + '\n')
  for r in rows:
    print(
      f'{r["defense"]}: sigma {r["sigma"]:.3f}, noise std {r["noise_std"]:.4f}'
    )


if __name__ == '__main__':
  app.run(main)
