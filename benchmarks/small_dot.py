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

  python -m benchmarks.small_dot [--out=benchmarks/results/small_dot.json]
"""

from __future__ import annotations

import argparse
import os
import platform
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak

K, N = 576, 2 * 49_152
ROWS = (1, 2, 4, 8, 16, 32, 64)


def run(
  rows: Sequence[int] = ROWS, repeats: int = 5, k: int = K, n: int = N
) -> dict:
  """Times every side at every row count on a `[k, n]` matrix."""
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
  measured = peak.measure_peak(n=2048 if k == K else 256, repeats=repeats)
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
  out = []
  for name, ts in seconds.items():
    if name == 'read':
      continue
    side, m = name.split('/')
    s = peak.median(ts)
    flops = 2.0 * int(m) * k * n
    out.append(
      {
        'side': side,
        'rows': int(m),
        'seconds': s,
        'weight_gb_per_s': nbytes / s / 1e9,
        'gflops': flops / s / 1e9,
        'fraction_of_peak': flops / s / measured['peak_flops'],
      }
    )
  return {
    'benchmark': 'small_dot',
    'command': 'python -m benchmarks.small_dot',
    'cpu': platform.machine(),
    'cpu_count': len(os.sched_getaffinity(0)),
    'jax_version': jax.__version__,
    'torch_version': torch.__version__,
    'shape': {'K': k, 'N': n, 'weight_bytes': nbytes},
    'matmul_peak_flops_per_second': measured['peak_flops'],
    'read_gb_per_s': nbytes / peak.median(seconds['read']) / 1e9,
    'rows': out,
  }


def main(argv: Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default='benchmarks/results/small_dot.json')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument(
    '--rows', default=','.join(map(str, ROWS)), help='comma-separated m'
  )
  args = parser.parse_args(argv)
  rows = tuple(int(m) for m in args.rows.split(','))
  result = run(rows, args.repeats)
  return peak.write_result(result, args.out)


if __name__ == '__main__':
  main()
