"""The machine's measured peak and the FLOP counts of the benchmarked work.

Every benchmark in this folder reports achieved FLOP/s next to the peak that
the same process measured a moment earlier, so that a result carries its own
roofline: a peer ratio of 1.1x means little if both sides run at
80% of peak, and a lot if both run at 3%.

* :func:`measure_peak` -- a large float32 matmul in JAX, timed with
  interleaved repetitions; the best repetition is the peak, the median is
  reported beside it (on a shared machine the two differ).
* :func:`forward_flops` / :func:`decode_step_flops` / :func:`backward_flops`
  -- analytic FLOP counts of the transformer families (GPT-2, Llama) from
  their config, per token, counting a multiply-add as 2 FLOPs and only the
  matmuls (layer norms, softmax and activations are a few percent at these
  widths).
* :func:`xla_flops` -- XLA's own count of a jitted function (cost analysis),
  used in the tests to check the analytic counts;
* :func:`write_result` -- prints a benchmark's JSON and writes it to its
  `--out` file.

>>> peak = measure_peak(n=512, repeats=3)                      # doctest: +SKIP
>>> peak['peak_flops'] > 1e8                                   # doctest: +SKIP
True
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
  'TransformerShape',
  'backward_flops',
  'decode_step_flops',
  'forward_flops',
  'measure_peak',
  'shape_of',
  'time_interleaved',
  'write_result',
  'xla_flops',
]


# ------------------------------------------------------------------- timing
def time_interleaved(
  fns: dict[str, Callable[[], Any]],
  *,
  repeats: int,
  warmup: int = 1,
  cpu_times: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
  """Wall-clock seconds of each thunk, repetitions interleaved.

  Runs `warmup` untimed rounds, then `repeats` rounds of `fn_a, fn_b, ...`
  so that a burst of load from other processes hits every contender alike;
  compare medians. Each thunk must block until its result is ready (call
  `jax.block_until_ready` inside).

  Args:
    fns: name -> thunk.
    repeats: timed rounds.
    warmup: untimed rounds first.
    cpu_times: if given, filled with name -> process CPU seconds of each
      repetition. With every contender on one thread this is the work
      itself, whatever share of a core the scheduler granted.

  Returns:
    name -> list of `repeats` durations in seconds.
  """
  for _ in range(warmup):
    for fn in fns.values():
      fn()
  times: dict[str, list[float]] = {name: [] for name in fns}
  if cpu_times is not None:
    cpu_times.update({name: [] for name in fns})
  for _ in range(repeats):
    for name, fn in fns.items():
      cpu_start = time.process_time()
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
      if cpu_times is not None:
        cpu_times[name].append(time.process_time() - cpu_start)
  return times


def median(xs) -> float:
  return float(statistics.median(xs))


# --------------------------------------------------------------------- peak
def measure_peak(
  n: int = 2048, *, repeats: int = 5, dtype=jnp.float32
) -> dict[str, float]:
  """FLOP/s of an `[n, n] @ [n, n]` matmul in JAX on the default device.

  Args:
    n: matrix size; 2048 (17 GFLOP) saturates a CPU core's vector units
      and takes ~0.1-1 s on 2 cores; use 1024 in quick runs.
    repeats: timed repetitions after one warm-up.
    dtype: matmul dtype (float32: every benchmark here runs in float32).

  Returns:
    `{'peak_flops': best, 'median_flops': median, 'n': n, 'seconds': [...]}`
    with FLOP/s = 2 n^3 / seconds.
  """
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (n, n), dtype)
  b = jax.random.normal(key_b, (n, n), dtype)
  matmul = jax.jit(lambda x, y: x @ y)
  seconds = time_interleaved(
    {'matmul': lambda: jax.block_until_ready(matmul(a, b))}, repeats=repeats
  )['matmul']
  flops = 2.0 * n**3
  return {
    'peak_flops': flops / min(seconds),
    'median_flops': flops / median(seconds),
    'n': n,
    'dtype': jnp.dtype(dtype).name,
    'device': str(jax.devices()[0].device_kind),
    'num_devices': jax.device_count(),
    'seconds': seconds,
  }


# -------------------------------------------------------------- FLOP counts
@dataclasses.dataclass(frozen=True)
class TransformerShape:
  """The widths that set a decoder-only transformer's matmul FLOPs.

  Attributes:
    num_layers: blocks.
    d_model: residual width.
    q_dim: width of the queries (= heads * head_dim).
    kv_dim: width of the keys (= values); < q_dim with grouped queries.
    mlp_dim: MLP hidden width.
    mlp_matrices: 2 for GELU MLPs (GPT-2), 3 for SwiGLU (Llama).
    vocab_size: rows of the LM head.
  """

  num_layers: int
  d_model: int
  q_dim: int
  kv_dim: int
  mlp_dim: int
  mlp_matrices: int
  vocab_size: int

  @property
  def block_params(self) -> int:
    """Matmul weights of one block (biases and norms left out)."""
    attn = self.d_model * (2 * self.q_dim + 2 * self.kv_dim)  # q, k, v, o
    return attn + self.mlp_matrices * self.d_model * self.mlp_dim

  @property
  def head_params(self) -> int:
    return self.d_model * self.vocab_size


def shape_of(model_or_config) -> TransformerShape:
  """:class:`TransformerShape` of a leakjax GPT-2 or Llama model/config."""
  config = getattr(model_or_config, 'config', model_or_config)
  name = type(config).__name__
  if name == 'GPT2Config':
    return TransformerShape(
      num_layers=config.n_layer,
      d_model=config.n_embd,
      q_dim=config.n_embd,
      kv_dim=config.n_embd,
      mlp_dim=config.inner_size,
      mlp_matrices=2,
      vocab_size=config.vocab_size,
    )
  if name == 'LlamaConfig':
    return TransformerShape(
      num_layers=config.num_hidden_layers,
      d_model=config.hidden_size,
      q_dim=config.num_attention_heads * config.head_dim,
      kv_dim=config.num_key_value_heads * config.head_dim,
      mlp_dim=config.intermediate_size,
      mlp_matrices=3,
      vocab_size=config.vocab_size,
    )
  raise TypeError(f'no FLOP model for {name}')


def _attention_flops(shape: TransformerShape, context: float) -> float:
  """Scores q.k and the weighted sum of values, per token and layer."""
  return 2.0 * 2.0 * shape.q_dim * context


def forward_flops(
  shape: TransformerShape, seq_len: int, *, head: bool = True
) -> float:
  """Forward FLOPs of one sequence of `seq_len` tokens (causal).

  Per token: `2 * block_params` per layer, attention over the tokens so far
  (on average `(seq_len + 1) / 2` of them; XLA computes the full square and
  masks it, which we do not count), and `2 * d_model * vocab` for the head.
  """
  mean_context = (seq_len + 1) / 2.0
  per_token = shape.num_layers * (
    2.0 * shape.block_params + _attention_flops(shape, mean_context)
  )
  if head:
    per_token += 2.0 * shape.head_params
  return per_token * seq_len


def decode_step_flops(shape: TransformerShape, context: int) -> float:
  """FLOPs of decoding one token that attends to `context` cached tokens."""
  return (
    shape.num_layers
    * (2.0 * shape.block_params + _attention_flops(shape, context))
    + 2.0 * shape.head_params
  )


def backward_flops(
  shape: TransformerShape, seq_len: int, *, last_layers: int | None = None
) -> float:
  """Backward FLOPs of one sequence, for the gradient of some layers.

  The backward pass of a matmul costs twice its forward (one product for
  the input gradient, one for the weight gradient). With
  `last_layers = k`, only the head and the last k blocks are differentiated
  (the reorder scorer's default is the last block, see
  `leakjax.attacks.film.reorder.default_grad_paths`): the head and those blocks
  need the input gradients, and only those blocks the weight gradients; the
  head's weight gradient is skipped when it is tied to the (frozen)
  embedding. `None` means every layer, i.e. twice the forward.
  """
  if last_layers is None:
    return 2.0 * forward_flops(shape, seq_len)
  k = min(last_layers, shape.num_layers)
  mean_context = (seq_len + 1) / 2.0
  per_block = 2.0 * shape.block_params + _attention_flops(shape, mean_context)
  # Input gradient of the head; weight + input gradients of k blocks (the
  # first of them needs no input gradient, which we ignore: < 1/k).
  per_token = 2.0 * shape.head_params + k * 2.0 * per_block
  return per_token * seq_len


def xla_flops(fn: Callable, *args) -> float | None:
  """XLA's FLOP count of `jax.jit(fn)(*args)` (None if unavailable).

  XLA counts loop bodies once, so use it on straight-line code only.
  """
  try:
    compiled = jax.jit(fn).lower(*args).compile()
    analysis = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  if not analysis or 'flops' not in analysis:
    return None
  return float(np.asarray(analysis['flops']))


# ------------------------------------------------------------------ output
def write_result(result: dict, out: str | None) -> dict:
  """Prints `result` as indented JSON, writes it to `out` unless that is
  empty or None, and returns it."""
  text = json.dumps(result, indent=1)
  if out:
    Path(out).write_text(text + '\n')
  print(text)
  return result
