"""`python -m benchmarks.gguf_dequantize` on tiny files, and the section of
benchmarks/README.md that quotes its committed run."""

import json
import pathlib

import pytest
from gguf import GGMLQuantizationType as QT

from benchmarks import gguf_dequantize
from tests.gguf_test import _hf_model, write_gguf

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
  'qtype', [QT.Q4_0, QT.Q4_1, QT.Q8_0], ids=lambda q: q.name
)
def test_both_sides_give_the_same_bits(tmp_path, qtype):
  path = write_gguf(tmp_path / 'tiny.gguf', _hf_model(True), qtype=qtype)
  got = gguf_dequantize.main([f'--gguf={path}', '--repeats=1'])
  # The tiny model's vectors stay F32; its matrices are `qtype`.
  (row,) = got['rows']
  assert row['kind'] == qtype.name and row['equal_bits'] is True
  assert row['tensors'] > 1 and row['weights'] % 32 == 0
  assert row['ours_seconds'] > 0 and row['gguf_quants_seconds'] > 0
  assert 0 < row['ours_fraction_of_bandwidth'] < 1
  assert got['copy_bytes_per_second'] > 0


def test_the_readme_quotes_the_committed_run():
  got = json.loads(
    (ROOT / 'benchmarks/results/gguf_dequantize.json').read_text()
  )
  rows = {r['kind']: r for r in got['rows']}
  assert set(rows) == {'Q4_1', 'Q8_0'}
  assert all(r['equal_bits'] for r in rows.values())
  q, e = rows['Q4_1'], rows['Q8_0']
  text = ' '.join((ROOT / 'benchmarks/README.md').read_text().split())
  bandwidth = got['copy_bytes_per_second'] / 1e9
  quoted = [
    f'({bandwidth:.1f} GB/s read plus written, {got["threads"]} threads)',
    f'the {q["tensors"]} Q4_1 tensors in {q["ours_seconds"]:.2f} s against'
    f' {q["gguf_quants_seconds"]:.2f} s ({q["speedup"]:.2f}x;'
    f" {100 * q['ours_fraction_of_bandwidth']:.1f} % of the copy's rate"
    f' against {100 * q["gguf_quants_fraction_of_bandwidth"]:.1f} %)',
    f'the Q8_0 embedding in {e["ours_seconds"]:.3f} s against'
    f' {e["gguf_quants_seconds"]:.3f} s ({e["speedup"]:.2f}x;'
    f' {100 * e["ours_fraction_of_bandwidth"]:.1f} % against'
    f' {100 * e["gguf_quants_fraction_of_bandwidth"]:.1f} %), every weight'
    ' the same bits.',
  ]
  for words in quoted:
    assert words in text, words
