"""Smoke test of `python -m benchmarks.film_kernels` on a tiny random GPT-2."""

import math

import jax

from benchmarks import film_kernels
from leakjax.models import gpt2


def _tiny():
  """`(model, params)`."""
  config = gpt2.GPT2Config(
    vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=2
  )
  return gpt2.init_model(config, key=jax.random.key(0))


def test_beam_search_row_counts_and_rates():
  row = film_kernels.bench_beam_search(
    *_tiny(), searches=2, beams=4, bag=16, length=6, reps=1
  )
  assert row['sentences_per_second'] > 0
  # searches * beams * bag * length candidate tokens per call.
  assert math.isclose(
    row['candidates_per_second'] * row['seconds'], 2 * 4 * 16 * 6, rel_tol=1e-6
  )
  assert math.isclose(
    row['flops_per_second'] * row['seconds'], row['flops'], rel_tol=1e-6
  )
  assert row['flops'] > 0


def test_reorder_scores_row():
  row = film_kernels.bench_reorder_scores(
    *_tiny(), candidates=4, length=8, reps=1
  )
  assert math.isclose(row['candidates_per_second'] * row['seconds'], 4)
  assert row['flops'] > 0
