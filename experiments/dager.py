r"""DAGER: exact batch recovery from attention-gradient spans (Petrov et al. 2024).

Flags (one per field of :class:`leakjax.attacks.dager.runner.
DagerExperimentConfig`, help from its docstring) -> a frozen config -> one
:func:`leakjax.attacks.dager.runner.run` (FILM's sentence preprocessing,
optional fine-tuning, consecutive client batches, the attack per batch) ->
:mod:`experiments.dager_report` (summary.json, summary.md, the plot).

  python -m experiments.dager --flagfile=experiments/configs/dager_quick.flags
  python -m experiments.dager --data=PATH --workdir=W --batch_sizes=1,4,16
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from experiments import common, dager_report, film_data
from leakjax import data as data_lib
from leakjax import io, models, sharding
from leakjax.attacks.dager import runner

DagerExperimentConfig = runner.DagerExperimentConfig


def run_experiment(
  cfg: DagerExperimentConfig,
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
  texts = (
    data_lib.load_corpus(cfg.data, column=cfg.data_column, label=cfg.data_label)
    if cfg.data
    else list(film_data.SENTENCES)
  )
  writer = io.ExperimentWriter(
    workdir,
    cfg,
    inputs={
      'data': cfg.data,
      'texts': texts,
      'model': models.source_path(cfg.model),
    },
  )
  dager_run = runner.run(cfg, texts, writer, progress=progress, mesh=mesh)
  return dager_report.write(writer, cfg, dager_run)


def define_flags() -> None:
  common.define_common_flags('/tmp/leakjax_dager')
  common.define_config_flags(DagerExperimentConfig)
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)


def main(argv):
  del argv
  f = flags.FLAGS
  cfg = common.config_from_flags(DagerExperimentConfig)
  mesh = sharding.data_mesh(f.mesh)
  start = time.perf_counter()
  summary = run_experiment(cfg, f.workdir, mesh=mesh)
  common.print_summary(f.workdir, summary, start)


if __name__ == '__main__':
  define_flags()
  common.run(main)
