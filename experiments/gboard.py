r"""GBoard next-word-prediction attack (Suliman & Leith) on real SMS messages.

End to end, without the oracles of the authors' code (the word threshold
and the number of sentences are chosen without the true text): θ0 is the
GBoard-shaped CIFG-LSTM pre-trained on public text, the victims are SMS
`ham` clients trained with SGD (FedSGD, FedAvg, local DP), and the server
recovers their words and sentences from θ0 and θ1 alone.

flags -> :class:`gboard.GboardConfig` (flags generated from its fields) ->
:func:`leakjax.attacks.gboard.runner.run` (the algorithm, read top-down
from `leakjax/attacks/gboard/runner.py`) -> the report
(`experiments/gboard_report.py`: summary.json, summary.md, figures).

`--preset=NAME` (:mod:`leakjax.attacks.gboard.presets`: `paper`, Suliman &
Leith's protocol with Algorithm 2; `strongest`, the default: the no-oracle
word rule measured on held-out data) sets the defaults; explicit flags
override it, and config.json records its name. The committed flagfiles set
every field a preset sets, so they run the same under either.

  python -m experiments.gboard --flagfile=experiments/configs/gboard_sms.flags
  python -m experiments.gboard --preset=paper --workdir=W
"""

from __future__ import annotations

from pathlib import Path

import jax
from absl import flags

from experiments import common, config_flags
from experiments import gboard_report as report_lib
from leakjax import io, sharding
from leakjax.attacks import gboard
from leakjax.attacks.gboard import presets, runner

Config = gboard.GboardConfig
# Config fields whose flag is written by hand: `public` is one
# 'name=path,...' string and `dpsgd_runs` a list of 'n_k:B[:max E]'
# entries; both are parsed into tuples (runner.parse_public,
# runner.parse_dpsgd_runs).
HAND_WRITTEN = ('public', 'dpsgd_runs')


def run_experiment(
  cfg: gboard.GboardConfig, workdir: str | Path, *, mesh=None
) -> dict[str, float]:
  """Runs everything (resuming from `workdir`); writes and returns the summary."""
  writer = io.ExperimentWriter(workdir, cfg, inputs=runner.writer_inputs(cfg))
  run = runner.run(cfg, writer, mesh=mesh)
  return report_lib.write_report(run, cfg)


# ------------------------------------------------------------------- flags
def define_flags() -> None:
  """`--workdir/--data/--mesh/--distributed`, `--preset` and one flag per
  config field.

  `--data`, as in every experiment, names the private corpus: here the
  clients' messages (the same as `--sms`, which it overrides).
  """
  flags.DEFINE_string(
    'workdir',
    '/tmp/leakjax_gboard',
    'Output folder (config.json, results.jsonl, summary.*).'
    ' Re-running with the same folder resumes.',
  )
  flags.DEFINE_string(
    'data',
    None,
    "The clients' private corpus (a label<TAB>text .tsv like UCI SMS);"
    ' overrides --sms.',
  )
  flags.DEFINE_string(
    'mesh',
    None,
    'Device mesh for the sentence candidates, e.g. "data:8"; absent: one'
    ' device.',
  )
  common.define_run_flags()
  flags.DEFINE_string(
    'public',
    ','.join(f'{n}={p}' for n, p in runner.PUBLIC_DEFAULT),
    'name=path,... more public pre-training corpora'
    ' (WikiText paragraphs are split into sentences).',
  )
  flags.DEFINE_list(
    'dpsgd_runs',
    [
      f'{n}:{b}' if e == 10**9 else f'{n}:{b}:{e}'
      for n, b, e in Config().dpsgd_runs
    ],
    'n_k:B[:max E] of the DPSGD-like trajectories.',
  )
  config_flags.define_preset_flag(presets.PRESETS)
  config_flags.define_config_flags(Config, skip=HAND_WRITTEN)
  # --help lists the common and config flags, not only this module's.
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> gboard.GboardConfig:
  """The config of the parsed flags: `--preset`'s values where a flag was
  not given (the hand-written `--public` and `--dpsgd_runs` too)."""
  f = flags.FLAGS
  preset = presets.overrides(f.preset)
  hand = {}
  for name, parse in (
    ('public', runner.parse_public),
    ('dpsgd_runs', runner.parse_dpsgd_runs),
  ):
    given = f[name].present or name not in preset
    hand[name] = parse(f[name].value) if given else preset[name]
  private = {'sms': f.data} if f.data else {}
  return config_flags.config_from_preset_flags(
    presets.PRESETS, **hand, **private
  )


def main(argv):
  del argv
  workdir = flags.FLAGS.workdir
  cfg = config_from_flags()
  common.require_data(cfg)  # --sms and every --public data set, at once
  mesh = sharding.data_mesh(flags.FLAGS.mesh)
  summary = run_experiment(cfg, workdir, mesh=mesh)
  if jax.process_index() != 0:  # only process 0 wrote the workdir
    print(f'process {jax.process_index()}: done')
    return
  for k in sorted(summary):
    if k.startswith(('f1@', 'levenshtein@')) and 'noise=none' in k:
      print(f'{k}: {summary[k]:.3f}')
  print(f'Wrote {workdir}/summary.json')


if __name__ == '__main__':
  define_flags()
  common.run(main)
