"""FedAvg client update: one `lax.scan` vs a Python loop of jitted steps.

Both sides run the very same local step (`leakjax.fl.client.LocalTraining`)
on the same model, data, schedule and key:

* scan -- `jax.jit(fl.client_update)`: the whole local training (E epochs
  of ceil(n / B) steps) is one compiled program;
* loop -- `leakjax.fl.make_python_loop_client_update`: the step
  is jitted once and dispatched from Python once per step (the usual way to
  write a training loop), with the schedule, init and finish jitted too.

Workloads (SGD with eta = 0.001 as in GBoard Sec. 4.1):

* quick -- `GPT2Config.tiny()` (2 layers, 64 wide), n = 64 sentences of 32
  tokens, B = 8, E = 2: 16 small steps, where dispatch overhead shows;
* full -- adds a 2-layer 128-wide GPT-2 (n = 128 of 16 tokens, B = 16,
  E = 1) and GBoard's full-size CIFG-LSTM (V = 9502, 670 units) on n = 256
  sentences of 8 tokens, B = 32, E = 1 (8 steps each).

Timing: after a warm-up (which compiles both), `repeats` rounds of
`scan, loop` interleaved (as `benchmarks.peak.time_interleaved`), medians
and the ratio loop / scan, of wall time and of process CPU time (on a
shared machine the wall time swings with other processes' load). Also reported: first-call (compile) seconds, the max
|difference| of the two results (0 expected: same step), the number of
times the scan version was traced over all calls (1: no recompilation),
and the matmul FLOPs of the local training (forward + backward = 3x forward
per sentence; `benchmarks.peak` for GPT-2, 2 x params per token for the
CIFG-LSTM) as achieved FLOP/s beside the peak the same process measured.

Run: `python -m benchmarks.client_update --out=DIR` (quick, writes
DIR/client_update.json), `--full` for all workloads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from benchmarks import peak
from leakjax import fl
from leakjax.models import gpt2, lstm, num_params

BENCH = 'client_update'


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  model_config: object
  num_sentences: int
  seq_len: int
  batch_size: int
  epochs: int
  repeats: int


QUICK = (Workload('gpt2_tiny', gpt2.GPT2Config.tiny(), 64, 32, 8, 2, 7),)
FULL = QUICK + (
  Workload(
    'gpt2_2x128',
    gpt2.GPT2Config.tiny(n_layer=2, n_embd=128, n_head=4, vocab_size=2048),
    128,
    16,
    16,
    1,
    5,
  ),
  # GBoard's full-size CIFG-LSTM on 4-word sentences (GBoard Sec. 4.1),
  # n_k = 256, B = 32 (Fig. 2b).
  Workload('cifg_gboard', lstm.CIFGConfig.gboard(), 256, 8, 32, 1, 5),
)


def _init(config, key):
  """`(model, params)` of a GPT-2 or LSTM config."""
  if isinstance(config, gpt2.GPT2Config):
    return gpt2.init_model(config, key=key)
  return lstm.init_model(config, key=key)


def _data(model, n: int, seq_len: int, seed: int = 0):
  """n random sentences of seq_len/2..seq_len tokens, right-padded."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, model.vocab_size, (n, seq_len), np.int32)
  lengths = rng.integers(seq_len // 2, seq_len + 1, n)
  mask = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)
  return jax.numpy.asarray(ids), jax.numpy.asarray(mask)


def _forward_flops_per_sentence(model, params, seq_len: int) -> float:
  if model.family == 'gpt2':
    return peak.forward_flops(peak.shape_of(model.config), seq_len)
  # CIFG-LSTM: every weight is one multiply-add per token; with the tied
  # head the embedding matrix is the output matmul (biases are negligible).
  return 2.0 * num_params(params) * seq_len


def time_wall_and_cpu(fns, *, repeats: int, warmup: int = 1):
  """Like `peak.time_interleaved`, also recording process CPU seconds.

  On a shared machine wall time swings with other processes' load; CPU
  time (all threads of this process) measures the work itself.

  Returns:
    name -> {'wall': [repeats floats], 'cpu': [repeats floats]}.
  """
  for _ in range(warmup):
    for fn in fns.values():
      fn()
  times = {name: {'wall': [], 'cpu': []} for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      wall, cpu = time.perf_counter(), time.process_time()
      fn()
      times[name]['wall'].append(time.perf_counter() - wall)
      times[name]['cpu'].append(time.process_time() - cpu)
  return times


def run_workload(w: Workload) -> dict:
  model, params = _init(w.model_config, jax.random.key(0))
  ids, mask = _data(model, w.num_sentences, w.seq_len)
  config = fl.ClientConfig(
    epochs=w.epochs, batch_size=w.batch_size, learning_rate=1e-3
  )  # GBoard Sec. 4.1
  traces = []

  def traced_update(params, ids, mask, key):
    traces.append(1)
    return fl.client_update(model, params, ids, mask, config, key=key)

  scan_fn = jax.jit(traced_update)
  loop_fn = fl.make_python_loop_client_update(model, params, config)
  key = jax.random.key(1)
  start = time.perf_counter()
  scan_result = jax.block_until_ready(scan_fn(params, ids, mask, key))
  scan_first = time.perf_counter() - start
  start = time.perf_counter()
  loop_result = jax.block_until_ready(loop_fn(params, ids, mask, key=key))
  loop_first = time.perf_counter() - start
  max_abs_diff = max(
    jax.tree.leaves(
      jax.tree.map(
        lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
        scan_result.params,
        loop_result.params,
      )
    )
  )

  seconds = time_wall_and_cpu(
    {
      'scan': lambda: jax.block_until_ready(scan_fn(params, ids, mask, key)),
      'loop': lambda: jax.block_until_ready(
        loop_fn(params, ids, mask, key=key)
      ),
    },
    repeats=w.repeats,
    warmup=1,
  )
  steps = int(scan_result.losses.shape[0])
  sentences = w.epochs * w.num_sentences
  flops = (
    3.0 * _forward_flops_per_sentence(model, params, w.seq_len) * sentences
  )
  scan_s = peak.median(seconds['scan']['wall'])
  loop_s = peak.median(seconds['loop']['wall'])
  scan_cpu = peak.median(seconds['scan']['cpu'])
  loop_cpu = peak.median(seconds['loop']['cpu'])
  return {
    'workload': dataclasses.asdict(w) | {'model_config': repr(w.model_config)},
    'family': model.family,
    'num_params': num_params(params),
    'local_steps': steps,
    'scan_first_call_s': scan_first,
    'loop_first_call_s': loop_first,
    'scan_seconds': seconds['scan']['wall'],
    'loop_seconds': seconds['loop']['wall'],
    'scan_cpu_seconds': seconds['scan']['cpu'],
    'loop_cpu_seconds': seconds['loop']['cpu'],
    'scan_median_s': scan_s,
    'loop_median_s': loop_s,
    'loop_over_scan': loop_s / scan_s,
    'scan_median_cpu_s': scan_cpu,
    'loop_median_cpu_s': loop_cpu,
    'loop_over_scan_cpu': loop_cpu / scan_cpu,
    'scan_ms_per_step': 1e3 * scan_s / steps,
    'loop_ms_per_step': 1e3 * loop_s / steps,
    'matmul_flops': flops,
    'scan_flops_per_s': flops / scan_s,
    'loop_flops_per_s': flops / loop_s,
    'max_abs_diff_scan_vs_loop': max_abs_diff,
    'scan_traces': len(traces),
  }


def run(quick: bool = True) -> dict:
  """Runs the workloads (QUICK or FULL) and returns the JSON-able result."""
  machine = peak.measure_peak(n=1024, repeats=3)
  results = [run_workload(w) for w in (QUICK if quick else FULL)]
  rows = [
    '| workload | steps | scan (s) | loop (s) | loop/scan | loop/scan'
    ' (CPU s) | scan GFLOP/s | max diff |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for r in results:
    rows.append(
      f'| {r["workload"]["name"]} | {r["local_steps"]} |'
      f' {r["scan_median_s"]:.4f} | {r["loop_median_s"]:.4f} |'
      f' {r["loop_over_scan"]:.2f} | {r["loop_over_scan_cpu"]:.2f} |'
      f' {r["scan_flops_per_s"] / 1e9:.2f} |'
      f' {r["max_abs_diff_scan_vs_loop"]:.1e} |'
    )
  return {
    'benchmark': BENCH,
    'quick': quick,
    'command': 'python -m benchmarks.client_update'
    + ('' if quick else ' --full')
    + ' --out=DIR',
    'jax_version': jax.__version__,
    'device': str(jax.devices()[0].device_kind),
    'peak_flops_per_s': machine['peak_flops'],
    'median_matmul_flops_per_s': machine['median_flops'],
    'results': results,
    'markdown': '\n'.join(rows),
  }


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--full',
    action='store_true',
    help='also the larger GPT-2 and the GBoard CIFG-LSTM',
  )
  parser.add_argument('--out', default=None, help=f'folder for {BENCH}.json')
  args = parser.parse_args(argv)
  result = run(quick=not args.full)
  print(result['markdown'])
  if args.out:
    from leakjax import io  # pylint: disable=g-import-not-at-top

    io.atomic_write_text(
      Path(args.out) / f'{BENCH}.json',
      json.dumps(io.jsonable(result), indent=2, sort_keys=True),
    )


if __name__ == '__main__':
  main()
