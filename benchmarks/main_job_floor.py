r"""The FILM quickstart's stages beside what their matmuls take at the peak.

Runs the main job once (`benchmarks.main_job.run_once`: a fresh work folder,
the stages' times read off its log lines) and, from the run's config.json
and results.jsonl, counts the matmul FLOPs of each stage at the shapes the
run computed (`peak.forward_flops`, `backward_flops`, `decode_step_flops`);
then measures the fp32 matmul peak in this process and records, per stage,
the measured seconds, the FLOPs, the seconds they would take at the peak
and the fraction of the peak the stage reached:

* fine-tuning: steps x batch rows of the training width (the longest
  training sentence with its BOS), a forward pass and the full backward;
  measured from the step's compilation to the end of training;
* client gradients: each batch's b rows at its padded width (a multiple of
  8), forward plus full backward; `grad_seconds` of every batch, the first
  batch of each b included (it compiles);
* beam searches: the prompts' prefill and one decode step of the k beams
  per generated token (k rows read every weight once a step; what bounds
  such a step: `benchmarks.small_dot`); `stage_seconds['search']`;
* reordering: 1 + phrase + token steps of C candidates, each a forward
  pass plus the head's input gradient and the last block's weight and
  input gradients (the scorer's default `reorder.default_grad_paths`);
  step 0 over the whole buffer, each later stretch of
  `reorder.reorder_in_stages` over the buffer it runs in, taken from the
  sentence's final length (the sentences change length by at most one
  token a step, so this approximates their lengths along the way);
  `stage_seconds['reorder']`. Beside it, the same steps at each sentence's
  final length: what the reordering would cost with no padding at all.

The job's floor is the sum of the stages at the peak: what the run's
matmuls take on this machine before any overhead (model load, tracing,
compilation, tokenization, NER). Compare it with `wall_s`.

  python -m benchmarks.main_job_floor \
      [--out=benchmarks/results/main_job_floor.json] \
      [--reference=reports/film_quickstart/summary.json] \
      [-- python -m experiments.film --flagfile=...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import jax

from benchmarks import main_job, peak
from leakjax import data as data_lib
from leakjax import io, models
from leakjax.attacks.film import client, pipeline, runner
from leakjax.attacks.film import reorder as ro

DEFAULT_COMMAND = (
  sys.executable,
  '-m',
  'experiments.film',
  '--flagfile=experiments/configs/film_quickstart.flags',
)


def _train_width(cfg: runner.FilmConfig, tokenizer) -> int:
  """The fine-tuning batches' width (`leakjax.train` pads to the longest
  training sentence, BOS included, at most `max_tokens + 1`)."""
  texts = runner.private_sentences(cfg, runner.load_texts(cfg), tokenizer)
  ids, _, _ = data_lib.encode_corpus(tokenizer, texts, cfg.max_tokens + 1)
  return int(ids.shape[1])


_BUCKET = pipeline._LENGTH_BUCKET  # pylint: disable=protected-access


def _reorder_limit(cfg: runner.FilmConfig) -> int:
  """How long a beam sentence of BOS + a capitalised start word + `length`
  tokens may grow in the reordering (`pipeline.recover`: 8 insertions)."""
  return 2 + cfg.length + 8


def _reorder_width(cfg: runner.FilmConfig) -> int:
  """The reordering's one buffer: the limit rounded up to the bucket."""
  return ro.stretch_width(
    0, 0, False, max_length=_reorder_limit(cfg), bucket=_BUCKET
  )


def _stretch_widths(cfg: runner.FilmConfig, length: int) -> list[tuple]:
  """`(steps, width)` of each stretch `reorder.reorder_in_stages` runs for
  a sentence of `length` tokens (its length along the way)."""
  config = ro.ReorderConfig(
    phrase_steps=cfg.phrase_steps, token_steps=cfg.token_steps
  )
  limit = _reorder_limit(cfg)
  return [
    (
      stop - start,
      ro.stretch_width(
        length, growth, narrow, max_length=limit, bucket=_BUCKET
      ),
    )
    for start, stop, growth, narrow in ro.stretches(config, _BUCKET)
  ]


def _stage(name, seconds, flops, peak_flops, note) -> dict:
  return {
    'stage': name,
    'seconds': round(seconds, 2),
    'flops': flops,
    'seconds_at_peak': round(flops / peak_flops, 2),
    'fraction_of_peak': round(flops / seconds / peak_flops, 3),
    'note': note,
  }


def floors(run: dict, workdir: Path, peak_flops: float) -> dict:
  """The stages of the run in `workdir` against `peak_flops`."""
  cfg = io.config_from_json(
    runner.FilmConfig, json.loads((workdir / 'config.json').read_text())
  )
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  model, _ = models.load_model(cfg.model)
  tok, shape = model.tokenizer, peak.shape_of(model)

  def fwd_bwd(width: int) -> float:
    return peak.forward_flops(shape, width) + peak.backward_flops(shape, width)

  width = _train_width(cfg, tok)
  stages = run['stages']
  train = cfg.train_steps * cfg.train_batch_size * fwd_bwd(width)
  grads = sum(
    len(r['originals'])
    * fwd_bwd(client.client_batch(model, r['originals'])[0].shape[1])
    for r in rows
  )
  beams = cfg.num_beams[0]
  # The prompts (padded to a multiple of 8 rows), then length - 1 decode
  # steps of the k beams.
  decodes = sum(
    beams * peak.decode_step_flops(shape, 2 + i) for i in range(cfg.length - 1)
  )
  search = sum(
    -(-r['num_prompts'] // 8) * 8 * peak.forward_flops(shape, 2) + decodes
    for r in rows
  )
  steps = 1 + cfg.phrase_steps + cfg.token_steps
  c, buffer = cfg.reorder_candidates, _reorder_width(cfg)

  def step_flops(w: int) -> float:
    return c * (
      peak.forward_flops(shape, w)
      + peak.backward_flops(shape, w, last_layers=1)
    )

  finals = [len(tok.encode(r['recovered'][0])) + 1 for r in rows]
  stretches = [_stretch_widths(cfg, n) for n in finals]
  narrow = [w for st in stretches for _, w in st[1:]]
  out = [
    _stage(
      'fine-tuning',
      stages['training_done_s'] - stages['train_step_compiled_s'],
      train,
      peak_flops,
      f'{cfg.train_steps} steps of {cfg.train_batch_size} x {width} tokens',
    ),
    _stage(
      'client gradients',
      sum(r['grad_seconds'] for r in rows),
      grads,
      peak_flops,
      f'{len(rows)} batches; the first of each b compiles',
    ),
    _stage(
      'beam searches',
      sum(r['stage_seconds']['search'] for r in rows),
      search,
      peak_flops,
      f'{beams} beams x {cfg.length} steps a batch',
    ),
    _stage(
      'reordering',
      sum(r['stage_seconds']['reorder'] for r in rows),
      sum(n * step_flops(w) for st in stretches for n, w in st),
      peak_flops,
      f'{steps} steps of {c} candidates a batch, step 0 x {buffer} tokens,'
      f' the rest x {min(narrow, default=buffer)}-{max(narrow, default=buffer)}',
    ),
  ]
  unpadded = sum(steps * step_flops(n) for n in finals)
  at_peak = sum(s['seconds_at_peak'] for s in out)
  return {
    'stages': out,
    'reorder_unpadded': {
      'final_lengths': finals,
      'flops': unpadded,
      'seconds_at_peak': round(unpadded / peak_flops, 2),
    },
    'job_seconds_at_peak': round(at_peak, 1),
    'job_seconds_at_peak_unpadded': round(
      at_peak - out[-1]['seconds_at_peak'] + unpadded / peak_flops, 1
    ),
  }


def main(argv: Sequence[str] | None = None) -> dict:
  argv = list(sys.argv[1:] if argv is None else argv)
  cut = argv.index('--') if '--' in argv else len(argv)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='benchmarks/results/main_job_floor.json')
  parser.add_argument(
    '--reference',
    default='reports/film_quickstart/summary.json',
    help="summary.json the run's must equal (timings aside); '' skips",
  )
  args = parser.parse_args(argv[:cut])
  command = argv[cut + 1 :] or list(DEFAULT_COMMAND)
  tmp = Path(tempfile.mkdtemp(prefix='leakjax_main_job_floor_'))
  try:
    run = main_job.run_once(command, tmp / 'work', tmp / 'log.txt')
    if args.reference:
      same, worst = main_job._summary_diff(  # pylint: disable=protected-access
        json.loads((tmp / 'work' / 'summary.json').read_text()),
        json.loads(Path(args.reference).read_text()),
      )
      run['summary_equal'] = same and worst <= 1e-6
    measured = peak.measure_peak(n=2048)
    result = {
      'benchmark': 'main_job_floor',
      'command': ' '.join(['python', *command[1:]]),
      'cpu': platform.machine(),
      'cpu_count': len(os.sched_getaffinity(0)),
      'jax_version': jax.__version__,
      'matmul_peak_flops_per_second': measured['peak_flops'],
      'wall_s': run['wall_s'],
      'summary_equal': run.get('summary_equal'),
      'reference': args.reference or None,
      'run_stages': run['stages'],
      **floors(run, tmp / 'work', measured['peak_flops']),
    }
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return peak.write_result(result, args.out)


if __name__ == '__main__':
  main()
