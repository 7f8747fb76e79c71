"""leakjax.models.gguf_blocks gives gguf.quants' weights, bit for bit."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from leakjax.models import gguf_blocks
from leakjax.models.gguf_file import GGUFFile
from tests.gguf_file_test import smollm2_path

KINDS = ('Q4_0', 'Q4_1', 'Q8_0')


def _blocks(kind: str, seed: int = 0) -> np.ndarray:
  """Every f16 bit pattern as each scale (and offset), including zeros,
  subnormals, infinities and NaNs, with random packed values; 3 blocks
  more than a whole number of chunks, so the last task is a short one."""
  size = gguf_blocks.BLOCK_BYTES[kind]
  n = 65536 + 3
  assert n % gguf_blocks.CHUNK_BLOCKS
  rng = np.random.default_rng(seed)
  raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
  patterns = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
  raw[:65536, 0:2] = patterns  # d
  if kind == 'Q4_1':  # m, shuffled against d
    raw[:65536, 2:4] = patterns[rng.permutation(65536)]
  return raw


def _bits(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x).view(np.uint32)


# inf * 0 and inf - inf: both sides warn, and both give NaN.
@pytest.mark.filterwarnings('ignore:invalid value encountered')
@pytest.mark.parametrize('kind', KINDS)
def test_every_scale_gives_gguf_quants_bits(kind):
  raw = _blocks(kind)
  want = gguf.quants.dequantize(raw, QT[kind])
  got = gguf_blocks.dequantize(raw, kind)
  assert got.shape == want.shape == (raw.shape[0], 32)
  assert got.dtype == np.float32
  np.testing.assert_array_equal(_bits(got), _bits(want))
  # One thread, the same bits.
  np.testing.assert_array_equal(
    _bits(gguf_blocks.dequantize(raw, kind, workers=1)), _bits(want)
  )


@pytest.mark.filterwarnings('ignore:invalid value encountered')
@pytest.mark.parametrize('kind', KINDS)
def test_rows_of_several_blocks_keep_their_shape(kind):
  size = gguf_blocks.BLOCK_BYTES[kind]
  raw = np.random.default_rng(1).integers(0, 256, (2, 5, 4 * size), np.uint8)
  raw[..., 1::size] &= 0x3B  # finite scales: an f16 below 1.0
  want = gguf.quants.dequantize(raw, QT[kind])
  got = gguf_blocks.dequantize(raw, kind)
  assert got.shape == want.shape == (2, 5, 128)
  np.testing.assert_array_equal(_bits(got), _bits(want))
  # The weights a block packs, in ggml's order: low nibbles first.
  if kind == 'Q4_1':
    block = raw.reshape(-1, size)[0]
    d, m = block[:4].view(np.float16).astype(np.float32)
    q = np.concatenate([block[4:] & 0x0F, block[4:] >> 4]).astype(np.float32)
    np.testing.assert_array_equal(got.reshape(-1, 32)[0], d * q + m)


def test_rows_that_are_not_whole_blocks_are_refused():
  with pytest.raises(ValueError, match='not whole blocks'):
    gguf_blocks.dequantize(np.zeros((2, 33), np.uint8), 'Q8_0')


@pytest.mark.slow
def test_smollm2_weights_are_gguf_quants_bits():
  kinds = set()
  for t in GGUFFile(smollm2_path()).tensors:
    kind = t.tensor_type.name
    if kind in gguf_blocks.BLOCK_BYTES:
      kinds.add(kind)
      want = gguf.quants.dequantize(t.data, t.tensor_type)
      got = gguf_blocks.dequantize(t.data, kind)
      np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=t.name)
  assert kinds == {'Q4_1', 'Q8_0'}
