r"""Embedding inversion of SmolLM2: BEI, HEI, Embed Parrot, DCT defense.

Reproduces Wan et al. 2024 (Tables 2-6) on a real pretrained model: per-layer
BEI/HEI, Embed Parrot at one deep layer (by corpus and by token length), and
the DCT/overlap defense with its perplexity cost. The algorithm lives in
:mod:`leakjax.attacks.inversion.runner` (read top-down from its `run`),
the tables and plots in :mod:`experiments.embed_parrot_report`.

`--preset=NAME` (:mod:`leakjax.attacks.inversion.presets`: `paper`, the
paper's protocol; `strongest`, the default: the best Embed Parrot setting
measured) sets the defaults; explicit flags override it, and config.json
records its name. `--ep_variants` picks the Embed Parrot variants: `ep`
(the paper's architecture), `ep_skip` (plus a ridge-initialised linear
skip, ours) and `ep_pretrained` (a pretrained Decode Model).
The target's hidden states are computed once and cached (`--cache_dir`);
a re-run with the same `--workdir` resumes from `results.jsonl` and the
Embed Parrot checkpoint. Timings go to `timings.json`, not the summary.

  python -m experiments.embed_parrot \
      --flagfile=experiments/configs/embed_parrot_smollm2.flags
"""

from __future__ import annotations

from pathlib import Path

import jax
from absl import flags

from experiments import common, config_flags
from experiments import embed_parrot_report as report
from leakjax import io
from leakjax.attacks.inversion import presets, runner

FLAGS = flags.FLAGS
Config = runner.InversionConfig


def define_flags() -> None:
  """--workdir/--data/--seed/--mesh, --cache_dir, --preset and one flag per
  field."""
  common.define_common_flags('/tmp/leakjax_embed_parrot')
  flags.DEFINE_string(
    'cache_dir',
    '/tmp/leakjax_embed_parrot_cache',
    'Hidden-state caches and the Embed Parrot checkpoint.',
  )
  config_flags.define_preset_flag(presets.PRESETS)
  config_flags.define_config_flags(Config)
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> Config:
  """The frozen config: `--preset`'s values where a flag was not given;
  `--data` replaces `--corpora`/`--train_corpus`."""
  common.reject_data_fields(
    'each corpus of --corpora is read with its default text field'
  )
  if FLAGS.data:
    return config_flags.config_from_preset_flags(
      presets.PRESETS, corpora=(f'data={FLAGS.data}',), train_corpus='data'
    )
  return config_flags.config_from_preset_flags(presets.PRESETS)


def run(
  cfg: Config,
  workdir: str | Path,
  cache_dir: str | Path,
  *,
  model=None,
  params=None,
) -> dict[str, float]:
  """Runs the experiment, writes the report; returns the summary."""
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=runner.writer_inputs(cfg, model=model)
  )
  result = runner.run(
    cfg, writer, cache_dir=cache_dir, model=model, params=params
  )
  report.write_report(cfg, result)
  return result.summary


def main(argv):
  del argv
  cfg = config_from_flags()
  common.require_data(cfg)  # every named data set, before any work
  summary = run(cfg, FLAGS.workdir, FLAGS.cache_dir)
  if jax.process_index() != 0:  # only process 0 wrote the workdir
    print(f'process {jax.process_index()}: done')
    return
  keys = [k for k in summary if 'method=ep,' in k or k.endswith('method=ep')]
  for k in sorted(keys)[:12]:
    print(f'{k}: {summary[k]:.3f}')
  print(f'Wrote {FLAGS.workdir}/summary.json')


if __name__ == '__main__':
  define_flags()
  common.run(main)
