"""Where the learned inverters fall to ROUGE-1 0.5 under noise (dev split).

The exact-inversion goal asks for exact recovery "under noise at which
Embed Parrot still reaches ROUGE-1 0.5". This study finds that noise on the
dev split, so that the noise levels of
`experiments/configs/inversion_exact_noise.flags` are chosen on texts its
test numbers do not come from. For every corpus and layer of the flags, the
dev texts' states with relative Gaussian noise `noise:S`
(:mod:`leakjax.attacks.inversion.exact_perturb`, S in `--levels`; 0: none)
are read by the runner's own one-shot inverters, fitted on the attacker's
clean states: `softmax` (the softmax inverse), `ep_skip` (Embed Parrot)
and `ridge`; each is scored as the runner scores it (Wan et al. Sec.
5.1.3). No exact search runs.

Writes `reports/inversion_exact/noise_levels/summary.json` with
`rouge1@attack=A,data=C,layer=L,noise=S,split=dev` (no `noise` key at
S = 0).

  python -m studies.inversion_exact.noise_levels \
      --flagfile=experiments/configs/inversion_exact_noise.flags
"""

from pathlib import Path

from absl import app, flags

import studies
import studies.inversion_exact as study
from experiments import inversion_exact
from leakjax import io
from leakjax.attacks.inversion import exact_perturb as perturb
from leakjax.attacks.inversion import exact_runner

REPORT = Path(__file__).resolve().parents[2] / 'reports' / 'inversion_exact'
READERS = ('softmax', 'ep_skip', 'ridge')


def measure(cfg, model, params, corpora, levels) -> dict[str, float]:
  """The summary keys (module docstring) of `cfg`'s dev texts."""
  drawn = exact_runner.draw_texts(cfg, model.tokenizer, corpora)
  # The runner's inverters, fitted as the experiment fits them.
  attacks = exact_runner.Attacks(cfg, model, params, drawn)
  out: dict[str, float] = {}
  for name, _ in cfg.corpus_paths():
    data = drawn.splits['dev'][name]
    for layer in cfg.layers:
      states = attacks.cell_states('dev', name)[layer]
      for level in levels:
        p = perturb.parse(f'noise:{level:g}' if level else 'none')
        key = perturb.cell_key(cfg.seed, 'dev', name, layer, p.spec)
        observed, _ = perturb.apply(
          p, states, data.score_mask, key=key, seed=cfg.seed
        )
        for attack in READERS:
          ids = attacks.one_shot(attack, observed, data.mask, layer)
          got = exact_runner.score(model.tokenizer, data, ids)['rouge1']
          at = dict(
            attack=attack,
            data=name,
            layer=layer,
            split='dev',
            **p.summary_params(),
          )
          out[io.summary_key('rouge1', **at)] = got
          print(f'{name} layer {layer} {p.spec} {attack}: ROUGE-1 {got:.3f}')
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  cfg, model, params, corpora = study.target_from_flags()
  out = measure(
    cfg,
    model,
    params,
    corpora,
    [float(x) for x in f.levels],
  )
  studies.write_summary(f.out, out)


def define_flags() -> None:
  inversion_exact.define_flags()
  flags.DEFINE_list(
    'levels', ['0', '0.1', '0.2', '0.3', '0.5', '1'], 'Noise scales S.'
  )
  flags.DEFINE_string(
    'out', str(REPORT / 'noise_levels' / 'summary.json'), 'Output JSON.'
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
