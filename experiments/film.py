r"""FILM: recover private sentences from federated gradients (Gupta et al. 2022).

Flags (one per field of :class:`leakjax.attacks.film.runner.FilmConfig`,
help from its docstring) -> a frozen config -> one
:func:`leakjax.attacks.film.runner.run` (Appendix B.1 preprocessing,
fine-tuning to θ^t, client gradients, the attack of Sec. 4 per batch) ->
:mod:`experiments.film_report` (summary.json, summary.md, the plot).

`--preset=NAME` (:mod:`leakjax.attacks.film.presets`: `paper`, FILM's
protocol; `strongest`, the default, which is the same until a setting of
ours beats it on held-out data) sets the defaults; explicit flags override
it, and config.json records its name. The committed flagfiles name
`--preset=paper` and set what they change.

`--mode=bag` only extracts bags: it compares the tied-embedding method
with the norm-threshold baseline and reproduces the precision/recall
columns of Table 4 under gradient pruning and DP-SGD (`--defenses`).

  python -m experiments.film --flagfile=experiments/configs/film_quickstart.flags
  python -m experiments.film --flagfile=experiments/configs/film_enron.flags
  python -m experiments.film --preset=paper --data=film-enron --batch_sizes=16
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from experiments import common, config_flags, film_report
from leakjax import io, sharding
from leakjax.attacks.film import presets, runner

FilmConfig = runner.FilmConfig


def run_experiment(
  cfg: FilmConfig,
  workdir: str | Path,
  *,
  progress: bool = True,
  mesh=None,
  microbatch: int | None = None,
) -> dict[str, float]:
  """Runs (or resumes) the experiment into `workdir`; returns the summary."""
  # The corpus is read (and checked) before the workdir is touched.
  texts = runner.load_texts(cfg)
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=runner.writer_inputs(cfg, texts)
  )
  film_run = runner.run(
    cfg,
    writer,
    texts=texts,
    progress=progress,
    mesh=mesh,
    microbatch=microbatch,
  )
  return film_report.write(writer, cfg, film_run)


def define_flags() -> None:
  common.define_common_flags('/tmp/leakjax_film')
  config_flags.define_preset_flag(presets.PRESETS)
  config_flags.define_config_flags(FilmConfig)
  flags.DEFINE_integer(
    'grad_microbatch',
    32,
    'Compute the client gradient this many sentences at a time, so that'
    ' memory holds the activations of one chunk, not of the whole batch; 0:'
    ' one pass. Same gradient up to float rounding; not part of the config.',
  )
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> FilmConfig:
  """The config of the parsed flags: `--preset`'s values where a flag was
  not given."""
  return config_flags.config_from_preset_flags(presets.PRESETS)


def main(argv):
  del argv
  f = flags.FLAGS
  cfg = config_from_flags()
  common.require_data(cfg)
  mesh = sharding.data_mesh(f.mesh)
  start = time.perf_counter()
  summary = run_experiment(
    cfg, f.workdir, mesh=mesh, microbatch=f.grad_microbatch or None
  )
  common.print_summary(f.workdir, summary, start)


if __name__ == '__main__':
  define_flags()
  common.run(main)
