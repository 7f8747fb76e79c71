r"""The exact inversion's candidate checks, against transformers, with the
roofline beside them.

The exact search (:mod:`leakjax.attacks.inversion.exact`) spends its time
checking candidates: C alternative next tokens, each put after the same
verified prefix and run through the first `layer` blocks, then compared
with the observed state (:func:`exact.check_candidates`). Three ways to do
that, on the same weights and the same problem, timed interleaved:

* `ours` -- :meth:`leakjax.models.Model.stream_candidates` of our Llama
  and GPT-2: each candidate attends to the one-row prefix cache in place;
* `copied` -- the same jitted check with the cache copied to C rows and
  decoded as a batch (the protocol's fallback for models without their own
  `stream_candidates`);
* `transformers` -- what a user of transformers writes: the prefix's
  `DynamicCache` repeated to C rows (`batch_repeat_interleave`), the C
  tokens through the first `layer` decoder layers (the rest and the final
  norm removed), in `torch.inference_mode`.

The distances of the three must agree (rtol 1e-3). Achieved FLOP/s count
the matmuls of the `layer` blocks for each candidate (`benchmarks.peak`,
multiply-add = 2) against the peak of a float32 matmul measured by the same
process.

  python -m benchmarks.exact_checks [--quick] [--threads=1] \
      [--out=benchmarks/results/exact_checks.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import beam_search_vs_hf as beam_bench
from benchmarks import peak
from benchmarks import run as run_lib
from leakjax import models
from leakjax._jit import jitted
from leakjax.attacks.inversion import exact

SIDES = ('ours', 'copied', 'transformers')


def _model(quick: bool):
  """`(model, params, name)`: SmolLM2-135M, or a small random Llama."""
  if not quick:
    return (*models.load(models.SMOLLM2_ALIAS), 'smollm2-135m')
  from leakjax.models import llama  # pylint: disable=g-import-not-at-top

  config = llama.LlamaConfig(
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    tie_word_embeddings=True,
  )
  return (*llama.init_model(config, key=jax.random.key(0)), 'llama-4x128')


def check_flops(model, layer: int, context: int) -> float:
  """Matmul FLOPs of one candidate through `layer` blocks after `context`
  cached tokens (no head)."""
  shape = dataclasses.replace(peak.shape_of(model), num_layers=layer)
  return peak.decode_step_flops(shape, context) - 2.0 * shape.head_params


def _torch_side(hf, prefix: np.ndarray, layer: int):
  """A thunk `candidates [C] -> states [C, d]` (numpy) for transformers."""
  import torch  # pylint: disable=g-import-not-at-top

  base = hf.model
  base.layers = base.layers[:layer]
  base.norm = torch.nn.Identity()
  with torch.inference_mode():
    out = base(input_ids=torch.as_tensor(prefix[None]), use_cache=True)
  cache = out.past_key_values

  def states(cands: np.ndarray) -> np.ndarray:
    import copy  # pylint: disable=g-import-not-at-top

    rows = copy.deepcopy(cache)
    rows.batch_repeat_interleave(len(cands))
    with torch.inference_mode():
      got = base(
        input_ids=torch.as_tensor(cands[:, None]),
        cache=rows,
        use_cache=True,
      ).last_hidden_state
    return got[:, 0].numpy()

  return states


def bench(model, params, hf, *, layer: int, chunk: int, prefix: int, reps):
  """One (layer, chunk) cell: seconds per chunk of each side."""
  rng = np.random.default_rng(layer * 1000 + chunk)
  ids = rng.integers(3, model.vocab_size, prefix + 1).astype(np.int32)
  ids[0] = 1
  cands = rng.integers(3, model.vocab_size, chunk).astype(np.int32)
  cands[chunk // 2] = ids[-1]  # the true token is among them
  states = model.hidden_states(params, jnp.asarray(ids[None]))
  observed = jnp.asarray(states[layer][0, -1])
  cache = model.init_stream_cache(params, 1, 2 * (prefix + 1), layer=layer)
  _, cache = model.stream_decode(
    params, cache, jnp.asarray(ids[None, :-1]), layer=layer
  )
  check = jitted(exact.check_candidates, static_argnames=exact.CHECK_STATIC)
  copied = model.replace(stream_candidates_fn=None)
  torch_states = _torch_side(hf, ids[:-1], layer)
  fns = {
    'ours': lambda: check(
      model, params, cache, jnp.asarray(cands), observed, layer
    ),
    'copied': lambda: check(
      copied, params, cache, jnp.asarray(cands), observed, layer
    ),
    'transformers': lambda: np.linalg.norm(
      torch_states(cands) - np.asarray(observed)[None], axis=-1
    ),
  }
  got = {k: np.asarray(jax.block_until_ready(f())) for k, f in fns.items()}
  scale = float(np.abs(got['ours']).max())
  agree = all(
    np.allclose(got[k], got['ours'], rtol=1e-3, atol=1e-4 * scale)
    for k in SIDES
  )
  seconds = peak.time_interleaved(
    {k: (lambda f=f: jax.block_until_ready(f())) for k, f in fns.items()},
    repeats=reps,
  )
  flops = chunk * check_flops(model, layer, prefix)
  row = {
    'layer': layer,
    'chunk': chunk,
    'prefix': prefix,
    'agree': agree,
    'true_token_nearest': bool(np.argmin(got['ours']) == chunk // 2),
    'flops': flops,
  }
  for side in SIDES:
    s = peak.median(seconds[side])
    row[f'{side}_seconds'] = s
    row[f'{side}_candidates_per_second'] = chunk / s
    row[f'{side}_flops_per_second'] = flops / s
  row['speedup_vs_copied'] = row['copied_seconds'] / row['ours_seconds']
  row['speedup_vs_transformers'] = (
    row['transformers_seconds'] / row['ours_seconds']
  )
  return row


def run(quick: bool = True, threads: int = 0) -> dict:
  """Runs every cell; returns a JSON-able dict (module docstring)."""
  thread_info = run_lib.configure_threads(threads)
  reps = 3 if quick else 5
  model, params, name = _model(quick)
  measured = peak.measure_peak(512 if quick else 1024, repeats=reps)
  with tempfile.TemporaryDirectory() as tmp:
    cells = [(2, 64), (4, 256)] if quick else [(10, 128), (25, 128), (25, 512)]
    rows = []
    for layer, chunk in cells:
      hf = beam_bench.to_torch(model, params, tmp)  # fresh layers per cell
      rows.append(
        bench(model, params, hf, layer=layer, chunk=chunk, prefix=16, reps=reps)
      )
  for row in rows:
    for side in SIDES:
      row[f'{side}_fraction_of_peak'] = (
        row[f'{side}_flops_per_second'] / measured['peak_flops']
      )
  return {
    'benchmark': 'exact_checks',
    'quick': quick,
    'model': name,
    'threads': thread_info,
    'device': str(jax.devices()[0].device_kind),
    'cpu': platform.processor() or platform.machine(),
    'jax_version': jax.__version__,
    'matmul_peak_flops_per_second': measured['peak_flops'],
    'matmul_median_flops_per_second': measured['median_flops'],
    'rows': rows,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--quick', action='store_true', help='a small Llama')
  parser.add_argument(
    '--threads', type=int, default=0, help='1: one core per side; 0: defaults'
  )
  parser.add_argument('--out', default='benchmarks/results/exact_checks.json')
  args = parser.parse_args()
  result = run(quick=args.quick, threads=args.threads)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + '\n')
  peak_flops = result['matmul_peak_flops_per_second']
  for row in result['rows']:
    shown = ', '.join(
      f'{side} {row[f"{side}_seconds"] * 1e3:.0f} ms'
      f' ({100 * row[f"{side}_fraction_of_peak"]:.0f}% of peak)'
      for side in SIDES
    )
    print(
      f'layer {row["layer"]} C={row["chunk"]}: {shown};'
      f' {row["speedup_vs_transformers"]:.2f}x transformers,'
      f' {row["speedup_vs_copied"]:.2f}x copied; agree {row["agree"]}'
    )
  print(f'matmul peak {peak_flops / 1e9:.1f} GFLOP/s; wrote {args.out}')


if __name__ == '__main__':
  main()
