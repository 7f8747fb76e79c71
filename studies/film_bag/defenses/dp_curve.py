"""FILM's bag of words under DP-SGD as a curve over the noise multiplier σ.

FILM Table 4b (Gupta et al., NeurIPS 2022, Sec. 6.3) gives one precision /
recall per ε; the σ behind each ε depends on the sampling rate, steps and
clipping, which the paper does not give. This script draws the bag's
precision and recall against σ from the committed clean row norms
(`dp_bound.json`) and whole-gradient differences (`dp_pooled.json`) of
`reports/film_bag/defenses/`: no model, no gradient. σ is the noise std
over the clip norm C on the clipped sum of per-example gradients, whose
rows were measured at the run's C over the whole model. Per σ of a log grid:

* the paper's threshold rule (Sec. 6.3: a row is in the bag when its
  largest |entry| exceeds τ = σC √(2 log d)). Only the rows' norms are
  stored, not their entries, so the rule is given as a band: with a row's
  signal on one coordinate (`peaked`) and spread evenly over its d
  coordinates (`spread`). These are the most and the least a row of that
  norm can pass: log P(|s + n| <= τ) is concave in s², so the sum over a
  row's coordinates at a fixed |s|² is smallest with the signal on one
  coordinate and largest with it spread evenly. Rows outside the batch are
  pure noise (as in `dp_bound`): each passes with the same probability at
  every σ, since τ scales with σ;
* `matched` and `energy`, the idealised row attackers of `dp_bound`, and
  `pooled`, the whole-gradient oracle of `dp_pooled`, scored with those
  modules' own functions, so that at the committed σ the curve repeats
  their JSON: recall at each paper row's precision, precision at its
  recall, best F1 and the precision / recall at that F1.

Two ε per σ, with `leakjax.fl.epsilon` (RDP, Poisson sampling) and the
run's δ:

* `run`: this run's sampling rate and steps, as `dp_sigma.json` records
  (b over the run's sentences, one step);
* `paper_setup`: b = 16 (Sec. 6.3) over FILM's 203,456 WikiText-103
  sentences (Sec. 6.1), for 90,000 steps (Sec. 6.1: "Unless otherwise
  noted, we train the model on these sentences for 90,000 iterations";
  early stopping may end sooner, which would give a smaller σ per ε). The
  paper gives no δ; the run's is used.

What the noise costs (`utility`): the held-out perplexity of SmolLM2-135M
fine-tuned under DP-SGD at each σ of `reports/film_utility/` (its ε rows,
σ calibrated for that run) and `reports/film_utility/dp_sigma/` (σ fixed,
σ = 0 the per-example clipping alone), each over its own undefended run.
Those runs fine-tune on WikiText-2 with b = 8 for 50 steps; the bag curves
are Enron b = 16 gradients. σ is the common axis (noise std over C on the
clipped sum); the per-coordinate noise of the averaged gradient, σC/b,
differs by their b.

The paper's rows are marked at the σ each assumption gives their ε. The
crossing points (the largest σ at which an oracle still reaches a paper
row's recall at its precision) are those of `dp_bound.json` and
`dp_pooled.json`; the script checks each against the oracle just below and
just above it. Results: see reports/film_bag/defenses/README.md.

Usage (repository root; under a minute on the 2-core CPU):
  python -m studies.film_bag.defenses.dp_curve
writes `dp_curve.json` and `dp_curve.png` to `reports/film_bag/defenses/`
(`--out` writes them elsewhere; `--num_sigmas`, `--sigma_min` and
`--sigma_max` set the log grid).
"""

from __future__ import annotations

import json
import math
import pathlib

import matplotlib
import matplotlib.ticker
import numpy as np
from absl import app, flags
from scipy import stats

from leakjax import fl
from studies import report_dir
from studies.film_bag.defenses import dp_bound, dp_pooled

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

REPORT = report_dir(__file__)
# The utility runs (FILM Table 4b's perplexity column, and σ fixed).
UTILITY = REPORT.parents[1] / 'film_utility'
UTILITY_RUNS = ('.', 'dp_sigma')
# FILM Sec. 6.1: sentences of WikiText-103 after preprocessing, and steps.
PAPER_SENTENCES = 203_456
PAPER_STEPS = 90_000
# FILM Sec. 6.3: batch size of the defense runs.
PAPER_BATCH = 16
ORACLES = ('matched', 'energy', 'pooled')
# A crossing σ is checked at σ (1 -/+ CHECK).
CHECK = 1e-3


def load(name: str) -> dict | list:
  return json.loads((REPORT / name).read_text())


def assumptions(sigmas: list[dict]) -> dict[str, dict]:
  """The sampling assumptions the ε columns are computed under."""
  run = sigmas[0]
  return {
    'run': {
      'sampling_rate': run['sampling_rate'],
      'steps': run['steps'],
      'delta': run['delta'],
      'source': 'dp_sigma.json: b / max_sentences, one step',
    },
    'paper_setup': {
      'sampling_rate': PAPER_BATCH / PAPER_SENTENCES,
      'steps': PAPER_STEPS,
      'delta': run['delta'],
      'batch': PAPER_BATCH,
      'sentences': PAPER_SENTENCES,
      'source': (
        'FILM Sec. 6.3 (b = 16), Sec. 6.1 (203,456 WikiText-103 sentences,'
        " 90,000 iterations); delta: the run's (the paper gives none)"
      ),
    },
  }


def epsilons(sigma: float, assumed: dict[str, dict]) -> dict[str, float]:
  return {
    name: fl.epsilon(sigma, a['sampling_rate'], a['steps'], a['delta'])
    for name, a in assumed.items()
  }


def inside(y: np.ndarray, tau: float) -> np.ndarray:
  """P(|y + n| <= τ), n ~ N(0, 1)."""
  return stats.norm.cdf(tau - y) - stats.norm.cdf(-tau - y)


def threshold_rule(snr: np.ndarray, dim: int, vocab: int) -> dict[str, float]:
  """Expected precision / recall of FILM's max-entry rule on one batch,
  with each row's signal on one coordinate (`peaked`) or spread evenly
  (`spread`); `snr` is |s_v| / (σC)."""
  tau = math.sqrt(2.0 * math.log(dim))
  null_inside = float(inside(np.zeros(1), tau)[0])
  null = np.asarray([1.0 - null_inside**dim])
  passes = {
    'peaked': 1.0 - inside(snr, tau) * null_inside ** (dim - 1),
    'spread': 1.0 - inside(snr / math.sqrt(dim), tau) ** dim,
  }
  out = {}
  for name, tp in passes.items():
    p, r = dp_bound.expected_pr(tp[None, :], null, vocab - len(snr))
    out[f'{name}_precision'], out[f'{name}_recall'] = float(p[0]), float(r[0])
  return out


def oracle_curves(name: str, batch: dict, sigma: float, bound: dict):
  """The expected precision / recall over thresholds of oracle `name` on
  one batch of `dp_bound.json` (matched, energy) or `dp_pooled.json`
  (pooled) at noise multiplier σ."""
  noise = sigma * bound['clip_norm']
  if name == 'pooled':
    mu = np.asarray([t['diff_norm'] for t in batch['types']]) / noise
    return dp_pooled.oracle_pr(mu, batch['bag_size'], bound['vocab'])
  snr = np.asarray(batch['batch_row_norms']) / noise
  return dp_bound.bounds(snr, bound['dim'], bound['vocab'], (name,))[name]


def oracle_point(p: np.ndarray, r: np.ndarray) -> dict:
  """One batch's oracle scores at the paper's rows and at its best F1."""
  f1 = np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-300), 0)
  best = int(np.argmax(f1))
  out = {
    'best_f1': float(np.max(f1)),
    'precision_at_best_f1': float(p[best]),
    'recall_at_best_f1': float(r[best]),
  }
  for eps, (p_t, r_t) in dp_bound.PAPER.items():
    out[f'recall_at_precision_of_{eps:g}'] = dp_bound.best_recall(p, r, p_t)
    out[f'precision_at_recall_of_{eps:g}'] = dp_bound.precision_at(p, r, r_t)
  return out


def mean_over_batches(points: list[dict]) -> dict[str, float]:
  return {k: float(np.mean([x[k] for x in points])) for k in points[0]}


def point_threshold(sigma: float, bound: dict) -> dict[str, float]:
  """The threshold rule's band at noise multiplier σ (means over batches)."""
  noise = sigma * bound['clip_norm']
  return mean_over_batches(
    [
      threshold_rule(
        np.asarray(b['batch_row_norms']) / noise, bound['dim'], bound['vocab']
      )
      for b in bound['batches']
    ]
  )


def point(sigma: float, bound: dict, pooled: dict) -> dict:
  """Every curve at noise multiplier σ (means over the run's batches)."""
  noise = sigma * bound['clip_norm']
  row = {'sigma': sigma, 'noise_std_of_sum': noise}
  row['threshold'] = point_threshold(sigma, bound)
  for name in ORACLES:
    batches = pooled['batches'] if name == 'pooled' else bound['batches']
    row[name] = mean_over_batches(
      [oracle_point(*oracle_curves(name, b, sigma, bound)) for b in batches]
    )
  return row


def reaches(name: str, sigma: float, eps: float, bound, pooled) -> bool:
  """Whether oracle `name` reaches the paper's recall at its precision for
  row ε (mean over batches, as `dp_bound` and `dp_pooled` decide)."""
  p_t, r_t = dp_bound.PAPER[eps]
  batches = pooled['batches'] if name == 'pooled' else bound['batches']
  got = [
    dp_bound.best_recall(*oracle_curves(name, b, sigma, bound), p_t)
    for b in batches
  ]
  return float(np.mean(got)) >= r_t


def crossings(bound: dict, pooled: dict, assumed: dict) -> list[dict]:
  """The committed crossing σ of each oracle and paper row, checked."""
  committed = {
    'matched': {
      r['epsilon']: r['matched_largest_sigma'] for r in bound['paper_rows']
    },
    'energy': {
      r['epsilon']: r['energy_largest_sigma'] for r in bound['paper_rows']
    },
    'pooled': {r['epsilon']: r['largest_sigma'] for r in pooled['paper_rows']},
  }
  rows = []
  for eps, (p_t, r_t) in sorted(dp_bound.PAPER.items(), reverse=True):
    row = {'epsilon': eps, 'paper_precision': p_t, 'paper_recall': r_t}
    for name in ORACLES:
      sigma = committed[name][eps]
      below = reaches(name, sigma * (1 - CHECK), eps, bound, pooled)
      above = reaches(name, sigma * (1 + CHECK), eps, bound, pooled)
      if not below or above:
        raise SystemExit(
          f'{name} at ε = {eps:g}: the committed crossing σ = {sigma:.4g}'
          ' does not separate reaching from not reaching the paper row'
        )
      row[f'{name}_largest_sigma'] = sigma
      for where, value in epsilons(sigma, assumed).items():
        row[f'{name}_epsilon_{where}'] = value
    rows.append(row)
  return rows


def threshold_limits(bound: dict) -> dict[str, float]:
  """The threshold rule's limits at any σ: τ in units of the noise std, the
  rate at which a pure-noise row passes, and the precision if every batch
  row passed (an upper bound on its precision at every σ)."""
  dim, vocab = bound['dim'], bound['vocab']
  tau = math.sqrt(2.0 * math.log(dim))
  rate = 1.0 - float(inside(np.zeros(1), tau)[0]) ** dim
  bags = [b['true_bag_size'] for b in bound['batches']]
  return {
    'tau_over_noise_std': tau,
    'null_pass_rate': rate,
    'precision_limit': float(
      np.mean([n / (n + rate * (vocab - n)) for n in bags])
    ),
  }


def utility() -> dict:
  """Held-out perplexity after DP-SGD fine-tuning against σ, from the
  committed utility runs (`UTILITY_RUNS`), each point over its own run's
  undefended perplexity."""
  points, runs = [], []
  for sub in UTILITY_RUNS:
    folder = UTILITY / sub
    rows = [
      json.loads(line)
      for line in (folder / 'results.jsonl').read_text().splitlines()
    ]
    by_defense = {r['defense']: r for r in rows if r['kind'] == 'utility'}
    none = by_defense['none']['perplexity']
    runs.append(
      {
        'folder': str(folder.relative_to(UTILITY.parent)),
        'none': none,
        'start': by_defense['start']['perplexity'],
      }
    )
    for spec, r in by_defense.items():
      if not spec.startswith(('dp:', 'dpsigma:')):
        continue
      points.append(
        {
          'sigma': r['noise_multiplier'],
          'defense': spec,
          'perplexity': r['perplexity'],
          'ratio': r['perplexity'] / none,
          'folder': runs[-1]['folder'],
        }
      )
  keys = ('model', 'data', 'train_batch_size', 'train_steps', 'dp_clip')
  first = json.loads((UTILITY / 'config.json').read_text())
  for sub in UTILITY_RUNS[1:]:
    other = json.loads((UTILITY / sub / 'config.json').read_text())
    if any(other[k] != first[k] for k in keys):
      raise SystemExit(f'{UTILITY / sub} is not the set-up of {UTILITY}')
  return {
    'model': first['model'],
    'data': first['data'],
    'b': first['train_batch_size'],
    'steps': first['train_steps'],
    'clip_norm': first['dp_clip'],
    'runs': runs,
    'points': sorted(points, key=lambda x: x['sigma']),
  }


def marks(sigmas: list[dict], assumed: dict) -> list[dict]:
  """The σ each assumption gives each paper row's ε (`run`: the run's own σ
  from `dp_sigma.json`)."""
  run = {r['epsilon']: r['sigma'] for r in sigmas}
  out = []
  for eps, (p_t, r_t) in sorted(dp_bound.PAPER.items(), reverse=True):
    row = {'epsilon': eps, 'paper_precision': p_t, 'paper_recall': r_t}
    row['sigma_run'] = run[eps]
    a = assumed['paper_setup']
    row['sigma_paper_setup'] = fl.sigma_for_epsilon(
      eps, a['sampling_rate'], a['steps'], a['delta']
    )
    out.append(row)
  return out


def plot(out: dict, measured: dict[float, tuple[float, float]], path) -> None:
  """Precision and recall against σ: the threshold rule's band and its
  measured points; the oracles' precision at each paper row's recall and
  recall at its precision; the paper's rows at the σ of each assumption.
  Beside them, what the noise costs: held-out perplexity over the
  undefended run's, with the pooled oracle's crossing σ of each row."""
  curve = out['curve']
  x = np.asarray([c['sigma'] for c in curve])
  run_sigma = {s['epsilon']: s['sigma'] for s in out['run_sigmas']}
  fig, axes = plt.subplots(1, 3, figsize=(17, 7.8), sharex=True)
  colors = {15.0: 'C3', 10.0: 'C1', 5.0: 'C2'}
  oracles = {
    'matched': ('-', 'row oracle (matched)'),
    'pooled': ('--', 'whole-gradient oracle (pooled)'),
  }
  for ax, what, other in zip(
    axes[:2], ('precision', 'recall'), ('recall', 'precision')
  ):
    lo = [c['threshold'][f'spread_{what}'] for c in curve]
    hi = [c['threshold'][f'peaked_{what}'] for c in curve]
    ax.fill_between(x, lo, hi, color='C0', alpha=0.2, lw=0)
    ax.plot(
      x,
      hi,
      color='C0',
      label="paper's threshold rule, signal on one coordinate",
    )
    ax.plot(
      x, lo, color='C0', ls='-.', label="paper's threshold rule, signal spread"
    )
    ax.plot(
      [run_sigma[e] for e in measured],
      [v[0 if what == 'precision' else 1] for v in measured.values()],
      'x',
      color='C0',
      ms=7,
      label="paper's threshold rule, measured (summary.json)",
    )
    for m in out['paper_marks']:
      eps = m['epsilon']
      for name, (ls, label) in oracles.items():
        ax.plot(
          x,
          [c[name][f'{what}_at_{other}_of_{eps:g}'] for c in curve],
          color=colors[eps],
          ls=ls,
          lw=1.2,
          label=f'{label}, ε = {eps:g} row',
        )
      for key, fill, where in (
        ('sigma_run', colors[eps], 'this run'),
        ('sigma_paper_setup', 'none', "FILM's setup"),
      ):
        ax.plot(
          [m[key]],
          [m[f'paper_{what}']],
          'o' if fill != 'none' else 's',
          color=colors[eps],
          mfc=fill,
          ms=7,
          label=f'paper, ε = {eps:g}, at the σ of {where}',
        )
    ax.set_title(
      f"bag {what}; the oracles at the paper row's {other}", fontsize=10
    )
    ax.set_ylabel(what)
    ax.set_ylim(-0.02, 1.02)
  u = out['utility']
  ax = axes[2]
  noisy = [p for p in u['points'] if p['sigma'] > 0]
  ax.plot(
    [p['sigma'] for p in noisy],
    [p['ratio'] for p in noisy],
    'o-',
    color='k',
    label='DP-SGD at σ (measured)',
  )
  for p in u['points']:
    if p['sigma'] == 0:
      ax.axhline(p['ratio'], color='k', ls=':', label='clipping alone (σ = 0)')
  ax.axhline(1.0, color='0.5', ls='--', lw=1, label='no defense')
  start = u['runs'][0]['start'] / u['runs'][0]['none']
  ax.axhline(start, color='0.5', ls='-.', lw=1, label='before fine-tuning')
  for c in out['crossings']:
    ax.axvline(
      c['pooled_largest_sigma'],
      color=colors[c['epsilon']],
      ls='--',
      lw=1,
      label=f'largest σ at which the pooled oracle reaches the ε = '
      f'{c["epsilon"]:g} row',
    )
  ax.set_yscale('log')
  ax.set_yticks([1, 2, 4, 8])
  ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter('%gx'))
  ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  ax.set_ylabel('held-out perplexity / undefended')
  ax.set_title(
    f'what the noise costs: fine-tuning on {u["data"]},\n'
    f'b = {u["b"]}, {u["steps"]} steps, C = {u["clip_norm"]:g}',
    fontsize=10,
  )
  for ax in axes:
    ax.set_xscale('log')
    ax.set_xlabel('σ (noise std / C on the clipped sum)')
    ax.grid(alpha=0.3)
  legends = (
    (axes[0], 'lower left', (0.02, 0.01), 2, 'bag of words (left, middle)'),
    (axes[2], 'lower right', (0.99, 0.01), 1, 'utility (right)'),
  )
  for ax, loc, anchor, ncol, title in legends:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
      handles,
      labels,
      loc=loc,
      bbox_to_anchor=anchor,
      ncol=ncol,
      fontsize=7.5,
      title=title,
      title_fontsize=8,
    )
  fig.suptitle(
    f'{out["model"]} on {out["data"]}, b = {out["b"]},'
    f' {out["num_batches"]} batches, C = {out["clip_norm"]:g}: the bag of'
    ' words under DP-SGD against σ, and what σ costs',
    fontsize=11,
  )
  fig.tight_layout(rect=(0, 0.27, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def define_flags() -> None:
  flags.DEFINE_integer('num_sigmas', 25, 'Points of the σ grid.')
  flags.DEFINE_float('sigma_min', 1e-3, 'Smallest σ of the grid.')
  flags.DEFINE_float('sigma_max', 1.0, 'Largest σ of the grid.')
  flags.DEFINE_string(
    'out', '', 'Folder for dp_curve.json and .png (default: the report).'
  )


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  bound, pooled = load('dp_bound.json'), load('dp_pooled.json')
  sigmas = load('dp_sigma.json')
  assumed = assumptions(sigmas)
  grid = np.logspace(
    math.log10(f.sigma_min), math.log10(f.sigma_max), f.num_sigmas
  )
  curve = []
  for sigma in grid.tolist():
    row = point(sigma, bound, pooled)
    row['epsilon'] = epsilons(sigma, assumed)
    curve.append(row)
    print(
      f'σ {sigma:.4g}: threshold P {row["threshold"]["peaked_precision"]:.3f}'
      f' R {row["threshold"]["peaked_recall"]:.3f}, matched best F1'
      f' {row["matched"]["best_f1"]:.3f}, ε {row["epsilon"]["run"]:.3g} /'
      f' {row["epsilon"]["paper_setup"]:.3g}'
    )
  out = {
    **{k: bound[k] for k in ('model', 'data', 'b', 'num_batches', 'clip_norm')},
    'vocab': bound['vocab'],
    'dim': bound['dim'],
    'paper': [
      {'epsilon': e, 'precision': p, 'recall': r}
      for e, (p, r) in sorted(dp_bound.PAPER.items(), reverse=True)
    ],
    'assumptions': assumed,
    'run_sigmas': [
      {'epsilon': s['epsilon'], 'sigma': s['sigma']} for s in sigmas
    ],
    'threshold_limits': threshold_limits(bound),
    'paper_marks': marks(sigmas, assumed),
    'crossings': crossings(bound, pooled, assumed),
    'utility': utility(),
    'curve': curve,
  }
  folder = pathlib.Path(f.out) if f.out else REPORT
  folder.mkdir(parents=True, exist_ok=True)
  (folder / 'dp_curve.json').write_text(json.dumps(out, indent=1) + '\n')
  summary = load('summary.json')
  measured = {
    s['epsilon']: tuple(
      summary[f'bag_{m}@b={bound["b"]},defense=dp:{s["epsilon"]:g},method=dp']
      for m in ('precision', 'recall')
    )
    for s in sigmas
  }
  plot(out, measured, folder / 'dp_curve.png')
  print(f'Wrote {folder / "dp_curve.json"} and dp_curve.png')


if __name__ == '__main__':
  define_flags()
  app.run(main)
