r"""Exact inversion of hidden states: is every token of my text recoverable
from the states I send?

Flags (one per field of
:class:`leakjax.attacks.inversion.exact_runner.ExactRunConfig`, help from
its docstring) -> a frozen config -> :func:`exact_runner.run` (per split,
corpus, layer and perturbation: BEI, HEI, the ridge inverse and the exact
search of Nikolaou et al., arXiv 2510.15511) ->
:mod:`experiments.inversion_exact_report` (summary.json, summary.md).

Settings of the exact search are chosen on the dev split
(`--splits=dev`), then the test split is attacked once (the default);
every results row and summary key names its split. A re-run with the same
`--workdir` resumes: finished rows are skipped. `--mesh=data:N` splits
the candidates of each check of the exact search over N devices (the
parameters replicated); the numbers are the same.

  python -m experiments.inversion_exact \
      --flagfile=experiments/configs/inversion_exact_quick.flags
  python -m experiments.inversion_exact --data=PATH --layers=10,last \
      --perturbations=none,noise:0.01,bf16 --workdir=W
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags, logging

from experiments import common, config_flags
from experiments import inversion_exact_report as report
from leakjax import io, sharding
from leakjax.attacks.inversion import exact_runner

FLAGS = flags.FLAGS
Config = exact_runner.ExactRunConfig


def run_experiment(
  cfg: Config,
  workdir: str | Path,
  *,
  progress: bool = True,
  model=None,
  params=None,
  mesh=None,
) -> dict[str, float]:
  """Runs (or resumes) the experiment into `workdir`; returns the summary
  (`mesh`: split the exact search's candidates over its data axis)."""
  # The corpora are read (and checked) before the workdir is touched.
  corpora = exact_runner.load_corpora(cfg)
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=exact_runner.writer_inputs(cfg, model=model)
  )
  result = exact_runner.run(
    cfg,
    writer,
    corpora=corpora,
    model=model,
    params=params,
    progress=progress,
    mesh=mesh,
  )
  return report.write(writer, cfg, result)


def define_flags() -> None:
  """--workdir/--data/--seed/--mesh and one flag per config field."""
  common.define_common_flags('/tmp/leakjax_inversion_exact')
  config_flags.define_config_flags(Config)
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> Config:
  """The frozen config; `--data` replaces `--corpora`/`--attacker_corpus`."""
  common.reject_data_fields(
    'each corpus of --corpora is read with its default text field'
  )
  if FLAGS.data:
    return config_flags.config_from_flags(
      Config, corpora=(f'data={FLAGS.data}',), attacker_corpus='data'
    )
  return config_flags.config_from_flags(Config)


def main(argv):
  del argv
  cfg = config_from_flags()
  common.require_data(cfg)  # every named data set, before any work
  mesh = sharding.data_mesh(FLAGS.mesh)  # malformed: an error before work
  if mesh is not None:
    logging.info('exact search candidates split over %s', dict(mesh.shape))
  start = time.perf_counter()
  summary = run_experiment(cfg, FLAGS.workdir, mesh=mesh)
  common.print_summary(FLAGS.workdir, summary, start)


if __name__ == '__main__':
  define_flags()
  common.run(main)
