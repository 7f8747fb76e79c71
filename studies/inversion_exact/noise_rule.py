"""Which acceptance rule reads noisy states back exactly (dev split).

Under `noise:S` the exact search's `nearest` rule accepts the nearest
candidate once it is `gap` times nearer than the second; at the noise of
`experiments/configs/inversion_exact_noise.flags` that gap never opens
early, so every position spends the whole budget, and a position whose
true token lies past it takes a wrong nearest. The `calibrated` rule
(:mod:`leakjax.attacks.inversion.exact`) reads the noise's size off the
residuals of the BOS and of the positions accepted before, and accepts the
nearest of a position's first chunk within the tolerance that implies,
searching on past the budget when none is. On the first
`--num_texts` dev texts of each corpus of the flags (texts its test
numbers are not reported on), at each noise level of the flags, every rule
of `--rules` runs the runner's own search (:meth:`exact_runner.Attacks.
exact_attack`; `nearest` with the flags' `--max_candidates`, `calibrated`
with no budget, at each `noise_z` of `--noise_z`) and is scored as the
runner scores it.

Writes `reports/inversion_exact/noise_rule/summary.json` with
`METRIC@data=C,layer=L,noise=S,rule=R,split=dev` (and `,z=Z`, the
calibrated rule's `noise_z` in `--noise_z`) for METRIC in `exact`,
`rouge1`, `candidates_per_token` (median), `candidates_mean`,
`candidates_max`, `seconds_per_sentence` and `undecided`.

  python -m studies.inversion_exact.noise_rule \
      --flagfile=experiments/configs/inversion_exact_noise.flags
"""

import dataclasses
from pathlib import Path

import numpy as np
from absl import app, flags

import studies
import studies.inversion_exact as study
from experiments import inversion_exact
from leakjax import io
from leakjax.attacks.inversion import exact, exact_runner
from leakjax.attacks.inversion import exact_perturb as perturb

REPORT = Path(__file__).resolve().parents[2] / 'reports' / 'inversion_exact'


def measure(cfg, model, params, corpora, rules, num_texts, zs=(6.0,)) -> dict:
  """The summary keys (module docstring) of `cfg`'s first dev texts."""
  drawn = exact_runner.draw_texts(cfg, model.tokenizer, corpora)
  attacks = exact_runner.Attacks(cfg, model, params, drawn)
  out: dict[str, float] = {}
  for name, _ in cfg.corpus_paths():
    every = drawn.splits['dev'][name]
    data = every.first(num_texts)
    for layer in cfg.layers:
      states = attacks.cell_states('dev', name)[layer]
      for p in cfg.perturbation_specs():
        # Perturbed as the runner perturbs the whole dev cell.
        key = perturb.cell_key(cfg.seed, 'dev', name, layer, p.spec)
        observed, _ = perturb.apply(
          p, states, every.score_mask, key=key, seed=cfg.seed
        )
        observed = observed[:num_texts]
        for rule, z in [
          (r, z) for r in rules for z in (zs if r == 'calibrated' else [0])
        ]:
          config = dataclasses.replace(cfg.exact_config(p), rule=rule)
          if rule == 'calibrated':
            config = dataclasses.replace(config, max_candidates=None, noise_z=z)
          found = attacks.exact_attack(
            observed, data, layer, config, lambda i: None
          )
          predicted = np.zeros_like(data.ids)
          for r, inv in enumerate(found):
            predicted[r, : len(inv.ids)] = inv.ids
          row = exact_runner.search_facts(found, data.score_mask)
          row.update(exact_runner.score(model.tokenizer, data, predicted))
          at = dict(
            data=name, layer=layer, rule=rule, split='dev', **p.summary_params()
          )
          if rule == 'calibrated':
            at['z'] = f'{z:g}'
          for metric in (
            'exact',
            'rouge1',
            'candidates_per_token',
            'candidates_mean',
            'candidates_max',
            'seconds_per_sentence',
            'undecided',
          ):
            out[io.summary_key(metric, **at)] = row[metric]
          print(
            f'{name} layer {layer} {p.spec} {rule}'
            + (f' z={z:g}' if rule == 'calibrated' else '')
            + f': exact {row["exact"]:.3f}'
            f' ROUGE-1 {row["rouge1"]:.3f} candidates median'
            f' {row["candidates_per_token"]:.0f} mean'
            f' {row["candidates_mean"]:.1f}'
            f' {row["seconds_per_sentence"]:.1f} s a sentence',
            flush=True,
          )
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  for rule in f.rules:
    exact.ExactConfig(rule=rule)  # a bad rule fails before any work
  cfg, model, params, corpora = study.target_from_flags()
  out = measure(
    cfg,
    model,
    params,
    corpora,
    tuple(f.rules),
    f.num_texts,
    tuple(float(z) for z in f.noise_z),
  )
  studies.write_summary(f.out, out)


def define_flags() -> None:
  inversion_exact.define_flags()
  flags.DEFINE_list('rules', ['calibrated', 'nearest'], 'Rules compared.')
  flags.DEFINE_integer('num_texts', 8, 'Dev texts of each corpus.')
  flags.DEFINE_list('noise_z', ['6'], "The calibrated rule's noise_z values.")
  flags.DEFINE_string(
    'out', str(REPORT / 'noise_rule' / 'summary.json'), 'Output JSON.'
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
