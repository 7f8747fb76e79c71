r"""GGUF dequantization: :mod:`leakjax.models.gguf_blocks` against
`gguf.quants`, with the machine's memory bandwidth beside them.

For each block type of the file that `gguf_blocks` handles (Q4_0, Q4_1,
Q8_0), every tensor of that type is dequantized by both sides, timed
interleaved (`benchmarks.peak.time_interleaved`, medians), and the weights
must be the same bits. Dequantization reads the packed bytes and writes
float32, so its roof is memory bandwidth, not FLOPs: beside each side's
bytes moved per second (packed in plus float32 out) stands the best rate
of a large NumPy copy on the same machine (bytes read plus written), with
as many threads as `gguf_blocks` uses.

  python -m benchmarks.gguf_dequantize \
      [--gguf=PATH] [--out=benchmarks/results/gguf_dequantize.json]

Without `--gguf`: SmolLM2-135M's Q4_1 file (`models.smollm2_gguf_path`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
from pathlib import Path

import numpy as np

from benchmarks import peak
from leakjax import models
from leakjax.models import gguf_blocks
from leakjax.models.gguf_file import GGUFFile


def copy_bandwidth(mib: int = 256, repeats: int = 5, workers: int = 1):
  """Best bytes/s (read + written) of `np.copyto` over `mib` MiB, split
  over `workers` threads."""
  src = np.ones(mib * 2**20 // 4, np.float32)
  dst = np.empty_like(src)
  edges = [src.size * i // workers for i in range(workers + 1)]
  bounds = list(zip(edges[:-1], edges[1:]))

  def copy(bound):
    np.copyto(dst[bound[0] : bound[1]], src[bound[0] : bound[1]])

  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    seconds = peak.time_interleaved(
      {'copy': lambda: list(pool.map(copy, bounds))}, repeats=repeats
    )['copy']
  return 2 * src.nbytes / min(seconds)


def bench(path: Path, repeats: int = 5) -> dict:
  """One row per block type: both sides' seconds, bytes/s and equality."""
  from gguf import quants  # pylint: disable=g-import-not-at-top

  workers = gguf_blocks.default_workers()
  bandwidth = copy_bandwidth(workers=workers)
  by_kind: dict[str, list] = {}
  for t in GGUFFile(path).tensors:
    if t.tensor_type.name in gguf_blocks.BLOCK_BYTES:
      by_kind.setdefault(t.tensor_type.name, []).append(t)
  rows = []
  for kind, tensors in sorted(by_kind.items()):
    sides = {
      'ours': lambda ts=tensors, k=kind: [
        gguf_blocks.dequantize(t.data, k) for t in ts
      ],
      'gguf_quants': lambda ts=tensors: [
        quants.dequantize(t.data, t.tensor_type) for t in ts
      ],
    }
    equal = all(
      np.array_equal(a.view(np.uint32), b.view(np.uint32))
      for a, b in zip(sides['ours'](), sides['gguf_quants']())
    )
    seconds = peak.time_interleaved(sides, repeats=repeats)
    packed = sum(int(t.data.nbytes) for t in tensors)
    weights = packed // gguf_blocks.BLOCK_BYTES[kind] * 32
    moved = packed + 4 * weights
    row = {
      'kind': kind,
      'tensors': len(tensors),
      'weights': weights,
      'bytes_moved': moved,
      'equal_bits': equal,
    }
    for side, times in seconds.items():
      s = peak.median(times)
      row[f'{side}_seconds'] = s
      row[f'{side}_fraction_of_bandwidth'] = moved / s / bandwidth
    row['speedup'] = row['gguf_quants_seconds'] / row['ours_seconds']
    rows.append(row)
  return {
    'benchmark': 'gguf_dequantize',
    'file': path.name,
    'cpu': platform.processor() or platform.machine(),
    'threads': workers,
    'copy_bytes_per_second': bandwidth,
    'repeats': repeats,
    'rows': rows,
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gguf', default=None, help='a GGUF file')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--out', default=None, help='JSON file to write')
  args = parser.parse_args(argv)
  path = Path(args.gguf) if args.gguf else models.smollm2_gguf_path()
  result = bench(path, args.repeats)
  result['command'] = 'python -m benchmarks.gguf_dequantize' + (
    f' --gguf={args.gguf}' if args.gguf else ''
  )
  return peak.write_result(result, args.out)


if __name__ == '__main__':
  main()
