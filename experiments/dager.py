r"""DAGER: exact batch recovery from attention-gradient spans (Petrov et al. 2024).

Flags (one per field of :class:`leakjax.attacks.dager.runner.DagerConfig`,
help from its docstring) -> a frozen config -> one
:func:`leakjax.attacks.dager.runner.run` (FILM's sentence preprocessing,
optional fine-tuning, consecutive client batches, the attack per batch) ->
:mod:`experiments.dager_report` (summary.json, summary.md, the plot).

`--preset=NAME` (:mod:`leakjax.attacks.dager.presets`: `paper`, DAGER's
protocol; `strongest`, the default: exact DAGER below the rank limit, the
strongest hybrid past it) sets the defaults; explicit flags override it,
and config.json records its name. `--attacks=film` compares with FILM on
the same gradients. A paper package
never imports another, so this entry point, which may, hands FILM's
pipeline to the DAGER runner (:func:`film_baseline`).

  python -m experiments.dager --flagfile=experiments/configs/dager_quick.flags
  python -m experiments.dager --data=PATH --workdir=W --batch_sizes=1,4,16
  python -m experiments.dager --data=film-enron --batch_sizes=64
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from experiments import common, config_flags, dager_report
from leakjax import io, sharding
from leakjax.attacks import film
from leakjax.attacks.dager import presets, runner

DagerConfig = runner.DagerConfig


def film_baseline(cfg: DagerConfig) -> runner.Baseline:
  """FILM's pipeline (:func:`leakjax.attacks.film.baseline`) as the DAGER
  runner's 'film' attack: `film_beams` beams, `film_steps` reordering
  steps."""
  return film.baseline(cfg.film_beams, cfg.film_steps)


def run_experiment(
  cfg: DagerConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
) -> dict[str, float]:
  """Runs (or resumes) the experiment into `workdir`; returns the summary.

  `mesh` (from `--mesh`, :func:`leakjax.sharding.data_mesh`) splits the
  attacks' candidate batches over its devices; it changes no result, so it
  is not part of the config.
  """
  # The corpus is read and its size checked (a bound without the
  # tokenizer) before the workdir is touched or the model loaded.
  texts = runner.load_texts(cfg)
  runner.check_corpus_size(cfg, texts)
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=runner.writer_inputs(cfg, texts)
  )
  dager_run = runner.run(
    cfg,
    writer,
    texts=texts,
    baselines={'film': film_baseline(cfg)},
    progress=progress,
    mesh=mesh,
  )
  return dager_report.write(writer, cfg, dager_run)


# Set from the experiment's own flags (`max_length`, the layer tolerances).
SKIPPED = ('hybrid_max_length',)


def define_flags() -> None:
  common.define_common_flags('/tmp/leakjax_dager')
  config_flags.define_preset_flag(presets.PRESETS)
  config_flags.define_config_flags(DagerConfig, skip=SKIPPED)
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> DagerConfig:
  """The config of the parsed flags: `--preset`'s values where a flag was
  not given."""
  return config_flags.config_from_preset_flags(presets.PRESETS)


def main(argv):
  del argv
  f = flags.FLAGS
  cfg = config_from_flags()
  common.require_data(cfg)  # every named data set, before any work
  mesh = sharding.data_mesh(f.mesh)
  start = time.perf_counter()
  summary = run_experiment(cfg, f.workdir, mesh=mesh)
  common.print_summary(f.workdir, summary, start)


if __name__ == '__main__':
  define_flags()
  common.run(main)
