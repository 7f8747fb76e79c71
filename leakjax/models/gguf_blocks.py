"""GGUF's legacy block types dequantized in threads, bit for bit as
`gguf.quants` does.

Q4_0, Q4_1 and Q8_0 (ggml-common.h's `block_q4_0`, `block_q4_1`,
`block_q8_0`) hold 32 weights per block: an f16 scale `d` (and for Q4_1 an
f16 offset `m`) before the packed values. A weight is `d * (q - 8)` (Q4_0,
q the 4-bit value), `d * q + m` (Q4_1) or `d * q` (Q8_0, q signed 8-bit);
of a block's 16 bytes of nibbles, the low ones are weights 0-15 and the
high ones 16-31.

`gguf.quants` evaluates the same float32 expressions over groups of 16
rows, one NumPy temporary after another. Here each task takes
:data:`CHUNK_BLOCKS` blocks, unpacks their values into one uint8
temporary and scales them straight into its slice of the output, and the
tasks run on a thread pool (NumPy releases the GIL inside its loops). Every product and sum is the same float32 operation on
the same operands, so the weights are the same bits (tests/gguf_blocks_test.py
compares them for every bit pattern of the scales and on SmolLM2's file;
the timings against `gguf.quants`: benchmarks/results/gguf_dequantize.json).
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

# Weights per block and bytes per block (ggml-common.h: QK4_0, QK4_1,
# QK8_0 = 32; sizeof(block_*)).
BLOCK_WEIGHTS = 32
BLOCK_BYTES = {'Q4_0': 18, 'Q4_1': 20, 'Q8_0': 34}
# Blocks per task: 8192 blocks make a 1 MiB float32 slice of the output,
# which with its temporaries stays in the L2 cache. Our choice, by timing
# 512-8192 on SmolLM2's file.
CHUNK_BLOCKS = 8192


def default_workers() -> int:
  """Threads :func:`dequantize` uses by default: the CPU count, at most 8."""
  return min(os.cpu_count() or 1, 8)


def _halves(raw: np.ndarray, start: int) -> np.ndarray:
  """The f16 at bytes `start:start+2` of each block, as float32 [n, 1]."""
  pair = np.ascontiguousarray(raw[:, start : start + 2])
  return pair.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
  """The 32 4-bit values of each block's 16 bytes, uint8 [n, 32]."""
  out = np.empty((qs.shape[0], BLOCK_WEIGHTS), np.uint8)
  np.bitwise_and(qs, np.uint8(0x0F), out=out[:, :16])
  np.right_shift(qs, np.uint8(4), out=out[:, 16:])
  return out


def _q4_0(raw: np.ndarray, out: np.ndarray) -> None:
  q = _nibbles(raw[:, 2:])
  np.subtract(q, np.uint8(8), out=q)  # mod 256: q - 8 as int8
  np.multiply(_halves(raw, 0), q.view(np.int8), out=out)


def _q4_1(raw: np.ndarray, out: np.ndarray) -> None:
  np.multiply(_halves(raw, 0), _nibbles(raw[:, 4:]), out=out)
  np.add(out, _halves(raw, 2), out=out)


def _q8_0(raw: np.ndarray, out: np.ndarray) -> None:
  np.multiply(raw[:, 2:].view(np.int8), _halves(raw, 0), out=out)


_KERNELS = {'Q4_0': _q4_0, 'Q4_1': _q4_1, 'Q8_0': _q8_0}


def dequantize(
  data: np.ndarray, kind: str, workers: int | None = None
) -> np.ndarray:
  """The float32 weights of a tensor's blocks.

  Args:
    data: the tensor's bytes, uint8 `[..., row_bytes]` (as GGUF readers
      give them; rows are whole blocks).
    kind: 'Q4_0', 'Q4_1' or 'Q8_0'.
    workers: threads (default: :func:`default_workers`).

  Returns:
    float32 `[..., row_bytes // block_bytes * 32]`.
  """
  size = BLOCK_BYTES[kind]
  raw = np.asarray(data, np.uint8)
  if raw.shape[-1] % size:
    raise ValueError(f'{kind} rows of {raw.shape[-1]} bytes: not whole blocks')
  blocks = raw.reshape(-1, size)
  out = np.empty((blocks.shape[0], BLOCK_WEIGHTS), np.float32)
  kernel = _KERNELS[kind]
  starts = range(0, blocks.shape[0], CHUNK_BLOCKS)
  workers = min(len(starts), workers or default_workers())

  def task(i: int) -> None:
    kernel(blocks[i : i + CHUNK_BLOCKS], out[i : i + CHUNK_BLOCKS])

  if workers <= 1:
    for i in starts:
      task(i)
  else:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      list(pool.map(task, starts))
  return out.reshape(*raw.shape[:-1], raw.shape[-1] // size * BLOCK_WEIGHTS)


__all__ = [
  'BLOCK_BYTES',
  'BLOCK_WEIGHTS',
  'CHUNK_BLOCKS',
  'default_workers',
  'dequantize',
]
