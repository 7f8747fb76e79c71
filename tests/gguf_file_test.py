"""leakjax.models.gguf_file reads what the `gguf` package's GGUFReader reads."""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from leakjax import models
from leakjax.errors import LeakjaxError
from leakjax.models import gguf as leakjax_gguf
from leakjax.models.gguf_file import GGUFFile
from tests.gguf_test import _hf_model, write_gguf


def assert_reads_like_gguf_reader(path):
  ours, theirs = GGUFFile(path), gguf.GGUFReader(str(path))
  fields = {k: f for k, f in theirs.fields.items() if not k.startswith('GGUF.')}
  assert list(ours.fields) == list(fields)  # same keys, same order
  for key, field in fields.items():
    got, want = ours.fields[key].contents(), field.contents()
    assert got == want and type(got) is type(want), key
    assert ours.fields[key].type == field.types[0], key
  assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
  for a, b in zip(ours.tensors, theirs.tensors):
    assert a.tensor_type == b.tensor_type, a.name
    np.testing.assert_array_equal(a.shape, b.shape)
    assert (a.data.dtype, a.data.shape) == (b.data.dtype, b.data.shape), a.name
    np.testing.assert_array_equal(a.data, b.data)
  return ours


@pytest.fixture(scope='module')
def tied():
  return _hf_model(True)


@pytest.mark.parametrize(
  'qtype', [QT.F32, QT.F16, QT.Q8_0, QT.Q4_1], ids=lambda q: q.name
)
def test_tiny_files_read_like_gguf_reader(tmp_path, tied, qtype):
  path = write_gguf(tmp_path / 'tiny.gguf', tied, qtype=qtype)
  ours = assert_reads_like_gguf_reader(path)
  assert ours.fields['tokenizer.ggml.merges'].contents()[0] == 'Ġ t'
  # The loader reads the same model through either reader.
  model, params = leakjax_gguf.load_gguf(path)
  assert model.config.vocab_size == len(
    ours.fields['tokenizer.ggml.tokens'].contents()
  )


def test_big_endian_and_raw_bf16_files_read_like_gguf_reader(tmp_path):
  path = tmp_path / 'big.gguf'
  writer = gguf.GGUFWriter(str(path), 'llama', endianess=gguf.GGUFEndian.BIG)
  writer.add_token_list(['a', 'bc', 'Ġd'])
  writer.add_array('test.floats', [0.5, -2.25])
  writer.add_float32('test.eps', 1e-5)
  writer.add_bool('test.flag', True)
  weights = np.arange(12, dtype=np.float32).reshape(3, 4)
  writer.add_tensor('w.weight', weights)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  ours = assert_reads_like_gguf_reader(path)
  np.testing.assert_array_equal(ours.tensors[0].data, weights)
  assert ours.fields['test.floats'].contents() == [0.5, -2.25]
  assert ours.fields['test.flag'].contents() is True
  # A quantised type is its raw bytes, one row of blocks per row.
  path = tmp_path / 'bf16.gguf'
  writer = gguf.GGUFWriter(str(path), 'llama')
  x = np.random.default_rng(0).normal(size=(4, 64)).astype(np.float32)
  writer.add_tensor('x', gguf.quants.quantize(x, QT.BF16), raw_dtype=QT.BF16)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  ours = assert_reads_like_gguf_reader(path)
  assert ours.tensors[0].data.dtype == np.uint8
  back = leakjax_gguf.dequantize(ours.tensors[0])
  assert np.abs(back - x).max() <= 4e-3 * np.abs(x).max()


def test_bad_files_raise(tmp_path, tied):
  good = write_gguf(tmp_path / 'tiny.gguf', tied).read_bytes()
  cases = {
    'empty': b'',
    'magic': b'GGUX' + good[4:],
    'version': good[:4] + (7).to_bytes(4, 'little') + good[8:],
    'cut in the metadata': good[:200],
    'cut in the data': good[: len(good) - 100],
  }
  for name, data in cases.items():
    path = tmp_path / f'{name}.gguf'
    path.write_bytes(data)
    with pytest.raises(LeakjaxError, match='not a readable GGUF'):
      leakjax_gguf.load_gguf(path)
  path.write_bytes(good[:200])
  with pytest.raises(LeakjaxError, match='truncated or corrupt'):
    GGUFFile(path)


def smollm2_path():
  """SmolLM2's GGUF file; skips the test where it is not installed."""
  try:
    return models.smollm2_gguf_path()
  except LeakjaxError as e:
    pytest.skip(f'SmolLM2 GGUF not installed ({e})')


@pytest.mark.slow
def test_smollm2_reads_like_gguf_reader():
  ours = assert_reads_like_gguf_reader(smollm2_path())
  assert len(ours.fields['tokenizer.ggml.tokens'].contents()) == 49152
