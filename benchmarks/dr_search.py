"""Differential-rank search: our batched beam search vs a per-sequence loop.

The workload of the bar: Algorithm 1 of Zanella-Beguelin et al.
(CCS 2020) of length 5 over |T| = 10,000 tokens with the beam width halved
at every step (Sec. 3.2: 10000, 5000, 2500, 1250, 625), between two
snapshots of the 2-layer 200/200 word-level LSTM (`LSTMConfig.ptb_small`,
Sec. 4.1). Weights are two random initializations: the cost does not
depend on their values.

* ours -- `leakjax.attacks.differential.rank_beam_search` under `jax.jit`
  (the model a static argument, the params explicit): each step decodes the
  k beam sequences once on both models with the LSTM cache and scores all
  k * |T| extensions from the full-vocabulary probabilities, keeping the
  best with `lax.top_k`, the whole search one compiled program.
* straightforward -- what one writes from Algorithm 1 without batching: a
  Python loop over the beam sequences; for each, both models run on the
  whole prefix (jitted, batch 1, no cache) to get the next-token
  distribution, the |T| extension scores are a NumPy vector, and NumPy
  `argpartition` keeps the best k. (Vectorized over T; a loop over tokens
  would be another 10,000x slower.)

The full straightforward search runs 18,751 model calls of batch 1. With
`quick=True` it is timed on a sample of beam sequences per step and
extrapolated (its cost is linear in the number of sequences: one call
each, plus one `argpartition` over the step's candidates, which is timed
at full size); both sides also run a complete search over a |T| = 500
subset, which must return the same sequences. `quick=False` times the
complete straightforward search at |T| = 10,000 as well and compares its
result with ours.

Reported: medians of interleaved repetitions (`benchmarks.peak`), wall and
process CPU seconds (the machine is shared: CPU seconds show the work
itself), compile time, the matmul FLOPs of the search and achieved FLOP/s
beside the peak the same process measured, and whether the < 30 s bar is
met (`bar_met`; `benchmarks.run` reports it as `met` / `not met`).
`straightforward_extrapolated` says whether the straightforward time was
extrapolated (quick) or measured (`--full`); an extrapolated ratio is not
judged against the ratio bar.

Run: `python -m benchmarks.dr_search --out=DIR` (quick, writes
DIR/dr_search.json), `--full` for the complete straightforward search.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from leakjax.attacks import differential as dlib
from leakjax.models import lstm

BENCH = 'dr_search'
BAR_SECONDS = 30.0  # the bar: full search < 30 s on 2 CPU cores
BOS = 1


def make_models(vocab_size: int = 10_000):
  """`(model, params, params_prime)`: two initializations of one LSTM."""
  config = lstm.LSTMConfig.ptb_small(vocab_size)
  model, params = lstm.init_model(config, key=jax.random.key(0))
  _, params_prime = lstm.init_model(config, key=jax.random.key(1))
  return model, params, params_prime


@functools.partial(
  jax.jit, static_argnames=('model', 'model_prime', 'widths', 'length')
)
def ours_search(
  model,
  model_prime,
  params,
  params_prime,
  context,
  tokens=None,
  *,
  widths,
  length,
):
  """Our search (Algorithm 1), jitted; compiles once per shape."""
  return dlib.rank_beam_search(
    model,
    model_prime,
    params,
    params_prime,
    context,
    tokens,
    widths=widths,
    length=length,
  )


def search_flops(config: lstm.LSTMConfig, widths: Sequence[int]) -> float:
  """Matmul FLOPs of a search: every decoded row, on both models.

  Step i decodes the `widths[i-1]` sequences kept by step i-1 (one row at
  step 1); each row costs the LSTM layers' `2 * (in + H) * 4H` and the
  output layer's `2 * H * V` per model.
  """
  rows = 1 + sum(widths[:-1])
  lstm_flops = sum(
    2.0
    * (config.embed_dim if k == 0 else config.hidden_size)
    * 4
    * config.hidden_size
    + 2.0 * config.hidden_size * 4 * config.hidden_size
    for k in range(config.num_layers)
  )
  head = 2.0 * config.hidden_size * config.vocab_size
  return 2.0 * rows * (lstm_flops + head)


# ----------------------------------------------------------- straightforward
@functools.partial(jax.jit, static_argnames=('model', 'model_prime'))
def _next_probs(model, model_prime, params, params_prime, ids):
  return (
    jax.nn.softmax(model.logits(params, ids)[0, -1]),
    jax.nn.softmax(model_prime.logits(params_prime, ids)[0, -1]),
  )


def make_next_probs(model, model_prime):
  """`(params, params', ids [1, t]) -> (p, p')`: next-token probabilities."""
  return functools.partial(_next_probs, model, model_prime)


def straightforward_search(
  next_probs, params, params_prime, context, widths, tokens=None
):
  """Algorithm 1 with one model call per beam sequence (the peer).

  Returns:
    `(sequences [W, n] int, ds [W])`, best first.
  """
  tokens = None if tokens is None else np.asarray(tokens)
  beam = np.zeros((1, 0), np.int64)
  scores = np.zeros(1, np.float32)
  for width in widths:
    rows = []
    for seq, score in zip(beam, scores):
      ids = np.asarray([list(context) + seq.tolist()], np.int32)
      p, p_prime = next_probs(params, params_prime, ids)
      diff = np.asarray(p_prime) - np.asarray(p)
      rows.append(score + (diff if tokens is None else diff[tokens]))
    cand = np.stack(rows).ravel()  # [B * |T|]
    num_tokens = len(rows[0])
    best = np.argpartition(-cand, width - 1)[:width]
    best = best[np.argsort(-cand[best], kind='stable')]
    tok = best % num_tokens
    tok = tok if tokens is None else tokens[tok]
    beam = np.concatenate([beam[best // num_tokens], tok[:, None]], 1)
    scores = cand[best]
  return beam, scores


def straightforward_estimate(
  next_probs,
  params,
  params_prime,
  widths,
  vocab_size,
  *,
  sample: int,
  seed: int = 0,
):
  """Extrapolated seconds of the full straightforward search.

  Per step: `sample` model calls on random prefixes of the step's length,
  scaled to the step's number of beam sequences, plus one full-size
  `argpartition` over the step's candidates.

  Returns:
    `(wall_seconds, cpu_seconds)`.
  """
  rng = np.random.default_rng(seed)
  rows_per_step = [1] + list(widths[:-1])
  wall = cpu = 0.0
  for step, (rows, width) in enumerate(zip(rows_per_step, widths)):
    n = min(sample, rows)
    prefixes = rng.integers(2, vocab_size, (n, step))
    w0, c0 = time.perf_counter(), time.process_time()
    for prefix in prefixes:
      ids = np.asarray([[BOS] + prefix.tolist()], np.int32)
      p, p_prime = next_probs(params, params_prime, ids)
      diff = np.asarray(p_prime) - np.asarray(p)
      _ = 0.0 + diff
    wall += (time.perf_counter() - w0) * rows / n
    cpu += (time.process_time() - c0) * rows / n
    cand = rng.standard_normal(rows * vocab_size).astype(np.float32)
    w0, c0 = time.perf_counter(), time.process_time()
    best = np.argpartition(-cand, width - 1)[:width]
    best = best[np.argsort(-cand[best], kind='stable')]
    wall += time.perf_counter() - w0
    cpu += time.process_time() - c0
  return wall, cpu


def _timed(fn):
  w0, c0 = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - w0, time.process_time() - c0


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
  sa = {tuple(x) for x in np.asarray(a).tolist()}
  sb = {tuple(x) for x in np.asarray(b).tolist()}
  return len(sa & sb) / max(len(sa), 1)


# ---------------------------------------------------------------------- run
def run(quick: bool = True) -> dict:
  """Runs the benchmark and returns the JSON-able result (see module doc)."""
  load_before = os.getloadavg()[0]
  machine = peak.measure_peak(n=1024 if quick else 2048, repeats=3)
  model, params, params_prime = make_models()
  model_prime = model  # two snapshots of one model
  vocab = model.vocab_size
  length = 5
  widths = dlib.halving_widths(vocab, length)
  context = jnp.array([BOS], jnp.int32)
  run_ours = lambda: jax.block_until_ready(
    ours_search(
      model,
      model_prime,
      params,
      params_prime,
      context,
      widths=widths,
      length=length,
    )
  )
  # First call = trace + compile + run: what a user waits for once.
  result, first_wall, first_cpu = _timed(run_ours)
  next_probs = make_next_probs(model, model_prime)
  for t in range(1, length + 1):  # compile every prefix length up front
    jax.block_until_ready(
      next_probs(params, params_prime, np.ones((1, t), np.int32))
    )

  # Interleaved repetitions: ours, then the peer (estimate or full run).
  repeats = 3 if quick else 2
  ours_wall, ours_cpu, peer_wall, peer_cpu = [], [], [], []
  peer_result = None
  for _ in range(repeats):
    _, w, c = _timed(run_ours)
    ours_wall.append(w)
    ours_cpu.append(c)
    if quick:
      w, c = straightforward_estimate(
        next_probs, params, params_prime, widths, vocab, sample=64
      )
    else:
      peer_result, w, c = _timed(
        lambda: straightforward_search(
          next_probs, params, params_prime, [BOS], widths
        )
      )
    peer_wall.append(w)
    peer_cpu.append(c)

  # Agreement: a complete search on both sides (|T| = 500 in quick mode).
  if quick:
    tokens = np.arange(2, 502, dtype=np.int32)
    small_widths = dlib.halving_widths(len(tokens), 3)
    ours_small = dlib.ranked(
      ours_search(
        model,
        model_prime,
        params,
        params_prime,
        context,
        jnp.asarray(tokens),
        widths=small_widths,
        length=3,
      )
    )
    peer_seqs, peer_ds = straightforward_search(
      next_probs, params, params_prime, [BOS], small_widths, tokens
    )
    ours_seqs, ours_ds = ours_small.sequences[0], ours_small.ds[0]
    check = f'complete search over |T| = {len(tokens)}, widths {small_widths}'
  else:
    peer_seqs, peer_ds = peer_result
    ours_seqs, ours_ds = result.sequences[0], result.ds[0]
    check = f'complete search over |T| = {vocab}, widths {widths}'
  overlap = _overlap(ours_seqs, peer_seqs)
  top_match = bool(np.array_equal(np.asarray(ours_seqs[0]), peer_seqs[0]))
  max_ds_diff = float(np.max(np.abs(np.asarray(ours_ds) - peer_ds)))

  med = peak.median
  flops = search_flops(model.config, widths)
  out = {
    'benchmark': BENCH,
    'quick': quick,
    'command': 'python -m benchmarks.dr_search'
    + ('' if quick else ' --full')
    + ' --out=DIR',
    'jax_version': jax.__version__,
    'device': str(jax.devices()[0].device_kind),
    'cpu_count': os.cpu_count(),
    'load_average_before': load_before,
    'load_average_after': os.getloadavg()[0],
    'peak_flops_per_s': machine['peak_flops'],
    'median_matmul_flops_per_s': machine['median_flops'],
    'workload': {
      'model': 'LSTMConfig.ptb_small (2 x 200, V = 10,000)',
      'num_tokens': vocab,
      'length': length,
      'widths': list(widths),
      'candidates_scored': int(vocab * (1 + sum(widths[:-1]))),
      'rows_decoded': int(1 + sum(widths[:-1])),
    },
    'ours_first_call_s': first_wall,
    'ours_first_call_cpu_s': first_cpu,
    'ours_compile_s': max(first_wall - med(ours_wall), 0.0),
    'ours_median_s': med(ours_wall),
    'ours_median_cpu_s': med(ours_cpu),
    'ours_seconds': ours_wall,
    'straightforward_median_s': med(peer_wall),
    'straightforward_median_cpu_s': med(peer_cpu),
    'straightforward_seconds': peer_wall,
    'straightforward_extrapolated': quick,
    'speedup': med(peer_wall) / med(ours_wall),
    'speedup_cpu': med(peer_cpu) / med(ours_cpu),
    'bar_seconds': BAR_SECONDS,
    'bar_met': bool(first_wall < BAR_SECONDS),
    'search_flops': flops,
    'ours_flops_per_s': flops / med(ours_wall),
    'ours_flops_per_cpu_s': flops / med(ours_cpu),
    'agreement': {
      'check': check,
      'overlap': overlap,
      'top_match': top_match,
      'max_abs_ds_diff': max_ds_diff,
    },
  }
  out['markdown'] = '\n'.join(
    [
      '| search | ours (s) | ours CPU (s) | first call (s) | straightforward'
      ' (s) | speedup | GFLOP/s (peak) | agreement |',
      '|---|---|---|---|---|---|---|---|',
      f'| |T|=10,000, n=5, halving | {out["ours_median_s"]:.2f} |'
      f' {out["ours_median_cpu_s"]:.2f} | {first_wall:.2f} |'
      f' {out["straightforward_median_s"]:.1f}'
      f'{" (extrapolated)" if quick else ""} | {out["speedup"]:.1f}x |'
      f' {out["ours_flops_per_s"] / 1e9:.1f} ({machine["peak_flops"] / 1e9:.0f})'
      f' | {overlap:.3f} |',
    ]
  )
  return out


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--full',
    action='store_true',
    help='time the complete straightforward search',
  )
  parser.add_argument('--out', default=None, help=f'folder for {BENCH}.json')
  args = parser.parse_args(argv)
  result = run(quick=not args.full)
  print(result['markdown'])
  print(
    json.dumps(
      {k: v for k, v in result.items() if k != 'markdown'},
      indent=1,
      default=str,
    )
  )
  if args.out:
    from leakjax.io import _jsonable, atomic_write_text  # pylint: disable=g-import-not-at-top

    atomic_write_text(
      Path(args.out) / f'{BENCH}.json',
      json.dumps(_jsonable(result), indent=2, sort_keys=True),
    )


if __name__ == '__main__':
  main()
