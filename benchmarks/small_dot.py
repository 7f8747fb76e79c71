r"""How fast a CPU matmul reads the weights at a decode step's few rows.

A decode step multiplies a few rows (FILM's quickstart decodes 8 beams, the
hybrid's search 8 or 16 rows) by every weight matrix, so each step reads
every weight once: memory bandwidth bounds it, not FLOPs, if the matmul
streams the weights at the machine's read rate. This benchmark times
`x [m, K] @ W [K, N]` for m = 1 to 64 rows (K = 576, SmolLM2-135M's width;
N = 98,304, two of its vocabularies: a 226 MB matrix), each as

* `jax`: XLA's dot with W as leakjax stores weights (`[in, out]`);
* `jax_out_in`: XLA's dot with W stored `[out, in]` (torch's layout),
  contracting the minor dimension of both;
* `torch`: `torch.matmul` on the same `[in, out]` matrix (the peer);

beside a plain read of W (`W.sum()` in JAX: the read bandwidth a matmul
could reach) and the fp32 matmul peak, both measured in the same process.
Each row reports seconds (median of interleaved repetitions), GB/s of W
read and the fraction of the peak.

One wide matrix is not what a decode step multiplies by, so `layers` does
the same on the matrices of SmolLM2-135M's 30 decoder blocks at their own
shapes (`SMOLLM2_135M`): each block's seven products (q, k, v, o, gate,
up, down) chained on m rows as a step runs them, attention and norms left
out (no weights). Sides: `jax` (`[in, out]`, leakjax's layout),
`jax_out_in` (every matrix stored `[out, in]`) and `torch`
(`torch.nn.functional.linear` on `[out, in]` weights: how transformers
runs them); the read floor is one pass over all of them. The LM head is
not in it: leakjax already multiplies by the embedding as stored,
`[vocab, D]`, i.e. `[out, in]`.

  python -m benchmarks.small_dot [--out=benchmarks/results/small_dot.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak

K, N = 576, 2 * 49_152
ROWS = (1, 2, 4, 8, 16, 32, 64)
LAYER_ROWS = (1, 8, 16, 32, 64)
# SmolLM2-135M (its config.json: hidden_size 576, intermediate_size 1536,
# 30 layers, 9 query and 3 key/value heads of 64, vocabulary 49,152); a
# test checks it against the metadata of the installed GGUF.
SMOLLM2_135M = peak.TransformerShape(
  num_layers=30,
  d_model=576,
  q_dim=576,
  kv_dim=192,
  mlp_dim=1536,
  mlp_matrices=3,
  vocab_size=49_152,
)


def _rows(seconds: dict, nbytes: int, peak_flops: float) -> list[dict]:
  """One record per `side/m` timing: m rows by float32 weights of `nbytes`
  (a multiply-add per weight and row)."""
  out = []
  for name, ts in seconds.items():
    if name == 'read':
      continue
    side, m = name.split('/')
    s = peak.median(ts)
    flops = 2.0 * int(m) * nbytes / 4
    out.append(
      {
        'side': side,
        'rows': int(m),
        'seconds': s,
        'weight_gb_per_s': nbytes / s / 1e9,
        'gflops': flops / s / 1e9,
        'fraction_of_peak': flops / s / peak_flops,
      }
    )
  return out


def run(
  rows: Sequence[int] = ROWS,
  repeats: int = 5,
  k: int = K,
  n: int = N,
  peak_flops: float | None = None,
) -> dict:
  """Times every side at every row count on a `[k, n]` matrix; measures
  the peak first unless `peak_flops` is given."""
  import torch  # the peer, imported where it runs

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  w = jax.random.normal(jax.random.key(0), (k, n), jnp.float32)
  w_out_in = jnp.asarray(np.asarray(w).T.copy())
  x = jax.random.normal(jax.random.key(1), (max(rows), k), jnp.float32)
  w_torch = torch.from_numpy(np.asarray(w).copy())
  x_torch = torch.from_numpy(np.asarray(x).copy())
  dot = jax.jit(lambda a, b: a @ b)
  dot_out_in = jax.jit(
    lambda a, b: jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())))
  )
  read = jax.jit(jnp.sum)
  if peak_flops is None:
    peak_flops = peak.measure_peak(n=2048 if k == K else 256, repeats=repeats)[
      'peak_flops'
    ]
  thunks = {'read': lambda: jax.block_until_ready(read(w))}
  for m in rows:
    xm, tm = x[:m], x_torch[:m]
    thunks[f'jax/{m}'] = lambda xm=xm: jax.block_until_ready(dot(xm, w))
    thunks[f'jax_out_in/{m}'] = lambda xm=xm: jax.block_until_ready(
      dot_out_in(xm, w_out_in)
    )
    thunks[f'torch/{m}'] = lambda tm=tm: torch.matmul(tm, w_torch)
  for m in rows:  # the same products on each side
    want = np.asarray(dot(x[:m], w))
    got = np.asarray(dot_out_in(x[:m], w_out_in))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    got = torch.matmul(x_torch[:m], w_torch).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  for f in thunks.values():
    f()  # compile / warm up
  seconds = peak.time_interleaved(thunks, repeats=repeats)
  nbytes = k * n * 4
  out = _rows(seconds, nbytes, peak_flops)
  return {
    'benchmark': 'small_dot',
    'command': 'python -m benchmarks.small_dot',
    'cpu': platform.machine(),
    'cpu_count': len(os.sched_getaffinity(0)),
    'jax_version': jax.__version__,
    'torch_version': torch.__version__,
    'shape': {'K': k, 'N': n, 'weight_bytes': nbytes},
    'matmul_peak_flops_per_second': peak_flops,
    'read_gb_per_s': nbytes / peak.median(seconds['read']) / 1e9,
    'rows': out,
  }


def block_matrices(shape: peak.TransformerShape) -> list[tuple[int, int]]:
  """`(in, out)` of one Llama block's products: q, k, v, o, gate, up, down."""
  d = shape.d_model
  return [
    (d, shape.q_dim),
    (d, shape.kv_dim),
    (d, shape.kv_dim),
    (shape.q_dim, d),
    (d, shape.mlp_dim),
    (d, shape.mlp_dim),
    (shape.mlp_dim, d),
  ]


def _decoder(x, blocks, matmul, silu):
  """The blocks' products on rows `x` (a JAX or a torch array), chained:
  each query group is scaled by k + v (standing in for attention, so no
  product is dead code), o and down add to the residual, the MLP is
  SwiGLU."""
  for q, k, v, o, gate, up, down in blocks:
    kv = matmul(x, k) + matmul(x, v)
    a = matmul(x, q)
    a = (a.reshape(a.shape[0], -1, kv.shape[-1]) * kv[:, None, :]).reshape(
      a.shape
    )
    h = x + matmul(a, o)
    x = h + matmul(silu(matmul(h, gate)) * matmul(h, up), down)
  return x


def run_layers(
  rows: Sequence[int] = LAYER_ROWS,
  repeats: int = 5,
  shape: peak.TransformerShape = SMOLLM2_135M,
  peak_flops: float | None = None,
) -> dict:
  """Times the decoder's products (`_decoder`) at every row count."""
  import torch  # the peer, imported where it runs
  import torch.nn.functional as F  # pylint: disable=invalid-name

  if shape.q_dim % shape.kv_dim:
    raise ValueError(f'q_dim {shape.q_dim} is not a multiple of {shape.kv_dim}')
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  rng = np.random.default_rng(0)
  in_out = [
    [
      (rng.standard_normal((i, o), np.float32) / np.sqrt(i)).astype(np.float32)
      for i, o in block_matrices(shape)
    ]
    for _ in range(shape.num_layers)
  ]
  out_in = [[np.ascontiguousarray(w.T) for w in ws] for ws in in_out]
  w_jax = jax.tree.map(jnp.asarray, in_out)
  w_jax_out_in = jax.tree.map(jnp.asarray, out_in)
  w_torch = [[torch.from_numpy(w) for w in ws] for ws in out_in]
  x = rng.standard_normal((max(rows), shape.d_model), np.float32)
  x_torch = torch.from_numpy(x)
  contract_minor = lambda a, w: jax.lax.dot_general(  # noqa: E731
    a, w, (((1,), (1,)), ((), ()))
  )
  step = jax.jit(lambda a, ws: _decoder(a, ws, jnp.matmul, jax.nn.silu))
  step_out_in = jax.jit(
    lambda a, ws: _decoder(a, ws, contract_minor, jax.nn.silu)
  )

  def step_torch(a):
    with torch.inference_mode():
      return _decoder(a, w_torch, F.linear, F.silu)

  read = jax.jit(lambda ws: sum(w.sum() for w in jax.tree.leaves(ws)))
  if peak_flops is None:
    peak_flops = peak.measure_peak(n=2048, repeats=repeats)['peak_flops']
  thunks = {'read': lambda: jax.block_until_ready(read(w_jax))}
  for m in rows:
    xm, tm = jnp.asarray(x[:m]), x_torch[:m]
    want = np.asarray(step(xm, w_jax))
    np.testing.assert_allclose(
      np.asarray(step_out_in(xm, w_jax_out_in)), want, rtol=1e-3, atol=1e-3
    )
    np.testing.assert_allclose(
      step_torch(tm).numpy(), want, rtol=1e-3, atol=1e-3
    )
    thunks[f'jax/{m}'] = lambda xm=xm: jax.block_until_ready(step(xm, w_jax))
    thunks[f'jax_out_in/{m}'] = lambda xm=xm: jax.block_until_ready(
      step_out_in(xm, w_jax_out_in)
    )
    thunks[f'torch/{m}'] = lambda tm=tm: step_torch(tm)
  seconds = peak.time_interleaved(thunks, repeats=repeats)
  nbytes = 4 * shape.num_layers * shape.block_params
  out = _rows(seconds, nbytes, peak_flops)
  return {
    'shape': dataclasses.asdict(shape),
    'matrices_per_block': block_matrices(shape),
    'weight_bytes': nbytes,
    'read_gb_per_s': nbytes / peak.median(seconds['read']) / 1e9,
    'rows': out,
  }


def main(argv: Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='benchmarks/results/small_dot.json')
  parser.add_argument('--repeats', type=int, default=9)
  parser.add_argument(
    '--rows', default=','.join(map(str, ROWS)), help='comma-separated m'
  )
  parser.add_argument(
    '--layer_rows',
    default=','.join(map(str, LAYER_ROWS)),
    help='comma-separated m of the decoder case (empty: skip it)',
  )
  args = parser.parse_args(argv)
  rows = tuple(int(m) for m in args.rows.split(','))
  # The peak before and after the timings, the better one kept: on a shared
  # machine one measurement can come out low.
  peaks = [peak.measure_peak(n=2048, repeats=args.repeats)['peak_flops']]
  result = run(rows, args.repeats, peak_flops=peaks[0])
  if args.layer_rows:
    layer_rows = tuple(int(m) for m in args.layer_rows.split(','))
    result['layers'] = run_layers(layer_rows, args.repeats, peak_flops=peaks[0])
  peaks.append(peak.measure_peak(n=2048, repeats=args.repeats)['peak_flops'])
  best = max(peaks)
  result['matmul_peak_flops_per_second'] = best
  result['matmul_peaks_measured'] = peaks
  for r in result['rows'] + result.get('layers', {}).get('rows', []):
    r['fraction_of_peak'] = r['gflops'] * 1e9 / best
  return peak.write_result(result, args.out)


if __name__ == '__main__':
  main()
