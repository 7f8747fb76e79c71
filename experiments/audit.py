r"""The audit: how much of my text does my setup leak at worst, and what
does each defense cost?

Flags (one per field of :class:`leakjax.audit.AuditConfig`, help from its
docstring) -> a frozen config -> :func:`leakjax.audit.run` (every
artefact under every defense, the strongest attack on each, the same
fine-tuning under each defense) -> :mod:`experiments.audit_report`
(summary.json, summary.md and report.html, one self-contained page).

  python -m experiments.audit --flagfile=experiments/configs/audit_quick.flags
  python -m experiments.audit --model=gpt2 --data=PATH --workdir=W \
      --artefacts=gradient,update,snapshot,hidden --batch_sizes=1,4,16 \
      --defenses=none,dp:1,dp:8,prune:0.99,freeze,noise:1e-6
"""

from __future__ import annotations

import time
from pathlib import Path

from absl import flags

from experiments import audit_report, common, config_flags
from leakjax import audit, io, sharding
from leakjax.audit import runner

AuditConfig = audit.AuditConfig


def run_experiment(
  cfg: AuditConfig, workdir: str | Path, *, progress: bool = True, mesh=None
) -> dict[str, float | str]:
  """Runs (or resumes) the audit into `workdir`; returns the summary."""
  # The corpus is read (and checked) before the workdir is touched.
  texts = runner.load_texts(cfg)
  writer = io.ExperimentWriter(
    workdir, cfg, inputs=runner.writer_inputs(cfg, texts)
  )
  audit_run = runner.run(cfg, writer, texts=texts, progress=progress, mesh=mesh)
  return audit_report.write(writer, cfg, audit_run)


def define_flags() -> None:
  common.define_common_flags('/tmp/leakjax_audit')
  config_flags.define_config_flags(AuditConfig)
  flags.adopt_module_key_flags(common)
  flags.adopt_module_key_flags(config_flags)


def config_from_flags() -> AuditConfig:
  return config_flags.config_from_flags(AuditConfig)


def main(argv):
  del argv
  f = flags.FLAGS
  cfg = config_from_flags()
  common.require_data(cfg)  # every named data set, before any work
  mesh = sharding.data_mesh(f.mesh)
  start = time.perf_counter()
  summary = run_experiment(cfg, f.workdir, mesh=mesh)
  common.print_summary(f.workdir, summary, start)
  print(f'Report: {f.workdir}/report.html')


if __name__ == '__main__':
  define_flags()
  common.run(main)
