r"""Differential score and rank of canaries between two LSTM snapshots.

Reproduces the canary experiments of Zanella-Beguelin et al., "Analyzing
Information Leakage of Updates to Natural Language Models" (CCS 2020),
Sec. 4.4 and Table 1, with the word-level LSTM of Sec. 4.1 (2 layers,
200-dim embeddings and states): train M on D, make snapshots M' by
retraining on D' = D + k canary copies or by continued training on them,
and compute each canary's differential score and rank bound (Algorithm 1
over the whole vocabulary), also with its first words given (RQ3).

flags -> :class:`DifferentialConfig` (flags generated from its fields) ->
:func:`leakjax.attacks.differential.runner.run` (the algorithm, read
top-down from `leakjax/attacks/differential/runner.py`) -> the report
(`experiments/differential_report.py`: summary.json, summary.md, plot).

`--preset=NAME` (:mod:`leakjax.attacks.differential.presets`: `paper`,
the paper's protocol as far as its text states it; `strongest`, the
default, the same fields while nothing of ours beats it on held-out data)
sets the defaults; explicit flags override it, and config.json records
its name.

Reddit (20M words) and WikiText-103 (103M words) are out of reach on a
2-core CPU; their larger models (`LSTMConfig.medium_512`, `wikitext_512`)
run through the same code with `--model`.

  python -m experiments.differential \
      --flagfile=experiments/configs/differential_wikitext.flags
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags, logging

from experiments import common, config_flags
from experiments import differential_report as report_lib
from leakjax import io, sharding
from leakjax.attacks import differential as dlib
from leakjax.attacks.differential import corpus as corpus_lib
from leakjax.attacks.differential import presets, runner
from leakjax.errors import LeakjaxError

DifferentialConfig = dlib.DifferentialConfig
# Config fields whose flag is written by hand: `canaries` keeps its
# semicolon-separated form (phrases may hold commas).
HAND_WRITTEN = ('canaries',)


def run_experiment(
  cfg: DifferentialConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
) -> dict[str, float]:
  """Runs everything (resuming from `workdir`); writes and returns the summary."""
  io.check_workdir(workdir)
  # The corpus is read and checked before the workdir is touched.
  corpus = corpus_lib.prepare_corpus(cfg)
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=runner.writer_inputs(cfg, corpus)
  )
  run = runner.run(cfg, writer, corpus=corpus, progress=progress, mesh=mesh)
  return report_lib.write_report(run, cfg)


# ------------------------------------------------------------------- flags
def define_flags() -> None:
  """`--workdir/--data/--seed/--mesh`, `--preset` and one flag per config
  field."""
  common.define_common_flags('/tmp/leakjax_differential')
  config_flags.define_preset_flag(presets.PRESETS)
  flags.DEFINE_string(
    'canaries',
    '',
    'Semicolon-separated phrases, one per canary type, checked against the'
    ' profile; empty: random words per quintile.',
  )
  config_flags.define_config_flags(DifferentialConfig, skip=HAND_WRITTEN)
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> DifferentialConfig:
  """The config of the parsed flags: `--preset`'s values where a flag was
  not given."""
  f = flags.FLAGS
  if not f.data:
    raise LeakjaxError('--data is required', 'pass e.g. wikitext-2-valid')
  given = {}
  preset = presets.PRESETS.overrides(f.preset)
  if f['canaries'].present or 'canaries' not in preset:
    given['canaries'] = tuple(
      p.strip() for p in f.canaries.split(';') if p.strip()
    )
  return config_flags.config_from_preset_flags(presets.PRESETS, **given)


def main(argv):
  del argv
  cfg = config_from_flags()
  common.require_data(cfg)  # every named data set, before any work
  mesh = sharding.data_mesh(flags.FLAGS.mesh)
  if mesh is not None:
    logging.info('DS scoring and DR search sharded over %s', dict(mesh.shape))
  start = time.perf_counter()
  summary = run_experiment(cfg, flags.FLAGS.workdir, mesh=mesh)
  common.print_summary(flags.FLAGS.workdir, summary, start)


if __name__ == '__main__':
  define_flags()
  common.run(main)
