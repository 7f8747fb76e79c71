r"""The hybrid's selection stage on a committed run's pools: each pool row
on the shortest buffer that holds it against every row on the pool's width.

The selection (:func:`leakjax.attacks.dager.hybrid.select_pool`) spends
its time on the pool's head-gradient rows, one full forward and backward
of each variant (a searched sentence or one of its cuts, 1,800-2,300 of
them at b = 64 on FILM's Enron sentences). Two ways, on the same pool, in
one process:

* `bucketed` -- :func:`hybrid.pool_gram` as the library runs it: rows
  sorted by length, each chunk of 64 on a buffer of a multiple of 8 tokens,
  several sentences a `lax.map` step where the buffer is short;
* `full_width` -- every row on the pool's width (`max_length`, 41), one
  sentence a step, in the pool's order, and the Gram from every pair of
  64-row blocks: the selection as it ran before.

Both build the weighted Gram (the run's weighting and whitening), and
both selections are made from it (:func:`hybrid.select_from_gram`); the
JSON gives each side's seconds (compiles timed apart, before), the Grams'
largest relative difference, both picks' ROUGE against the batch's
sentences and the run's own picks. The pools come from a hybrid run's
`results.jsonl` (its `searched_ids`): no search is run.

  python -m benchmarks.hybrid_select \
      [--results=reports/dager/hybrid_evidence_oversample_heldout/results.jsonl] \
      [--batches=5] [--out=benchmarks/results/hybrid_select.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from leakjax import metrics
from leakjax._jit import jitted
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.attacks.dager.hybrid import selection
from leakjax.attacks.dager.pipeline import head_path
from leakjax.models.protocol import get_path
from leakjax.recovery import bag as bow
from studies.dager.study import load_run

DEFAULT_RESULTS = (
  'reports/dager/hybrid_evidence_oversample_heldout/results.jsonl'
)
SIDES = ('bucketed', 'full_width')


def _listed(value):
  return ast.literal_eval(value) if isinstance(value, str) else value


def full_width_rows(model, params, tokens, lengths, candidates):
  """The pool's rows as the selection computed them before: every row on
  the pool's width, one sentence a map step, chunks of 64 in the pool's
  order (the last one padded). Returns the blocks and the chunk."""
  chunk = 64
  num = len(tokens)
  order = np.concatenate([np.arange(num), np.zeros(-num % chunk, np.int64)])
  rows_fn = jitted(hybrid.pool_head_gradients, static_argnames=('model',))
  blocks = [
    rows_fn(
      model,
      params,
      jnp.asarray(tokens[order[s : s + chunk]]),
      jnp.asarray(lengths[order[s : s + chunk]]),
      candidates,
    )
    for s in range(0, len(order), chunk)
  ]
  return blocks, chunk


def block_gram(blocks, chunk, target, w):
  """The weighted Gram as the selection built it before: every pair of
  `chunk`-row blocks, one einsum each (`Σ_c,e w[c]² a[n,c,e] b[m,c,e]`)."""
  block_fn = jax.jit(lambda a, b, w: jnp.einsum('nce,mce,wc->wnm', a, b, w**2))
  along_fn = jax.jit(lambda a, t, w: jnp.einsum('nce,ce,wc->wn', a, t, w**2))
  size = len(blocks) * chunk
  gram = np.zeros((len(w), size, size), np.float32)
  along = np.zeros((len(w), size), np.float32)
  for i, a in enumerate(blocks):
    r = slice(i * chunk, (i + 1) * chunk)
    along[:, r] = np.asarray(along_fn(a, target, w))
    for j in range(i, len(blocks)):
      c = slice(j * chunk, (j + 1) * chunk)
      block = np.asarray(block_fn(a, blocks[j], w))
      gram[:, r, c] = block
      gram[:, c, r] = block.transpose(0, 2, 1)
  return gram, along


def row_flops(shape: peak.TransformerShape, width: int) -> float:
  """Matmul FLOPs of one pool row on a `width`-token buffer: the forward,
  the input gradients back through every block and the head (as much
  again) and the head matrix's own gradient."""
  return 2.0 * peak.forward_flops(shape, width) + 2.0 * (
    shape.head_params * width
  )


def bench_batch(model, params, cfg, config, row, transform) -> dict:
  b = row['b']
  pool = _listed(row['searched_ids'])
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], b, row['batch'], row['defense'], cfg
  )
  bag = bow.extract_bag(model, params, grads)
  _, padded, valid = hybrid.candidate_tokens(model, params, grads, bag, config)
  variants, owner = hybrid.pool_variants(model, pool, config)
  tokens, lengths, candidates, target, w = selection.pool_inputs(
    model,
    grads,
    variants,
    padded,
    valid,
    (config.select_weight,),
    config.max_length,
    transform,
  )
  width = tokens.shape[1]
  w = jnp.asarray(w)
  # Warm-up: each side's programs compiled and run once on one chunk of
  # every shape it uses, so that the timed runs below are warm.
  row_bytes = 4 * get_path(params, head_path(model)).size  # one [V, d]
  warmup_s = {}
  t0 = time.perf_counter()
  shapes = {}
  for rows, cols, batch in selection.chunk_plan(lengths, width, 64, row_bytes):
    shapes.setdefault((cols, batch), rows)
  for rows in shapes.values():  # one chunk of each shape, as pool_gram plans
    selection.pool_gram(
      model, params, tokens[rows], lengths[rows], candidates, target, w
    )
  warmup_s['bucketed'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  jax.block_until_ready(
    full_width_rows(model, params, tokens[:1], lengths[:1], candidates)[0]
  )
  warmup_s['full_width'] = time.perf_counter() - t0
  seconds = {}
  t0 = time.perf_counter()
  gram_b, along_b = selection.pool_gram(
    model,
    params,
    tokens,
    lengths,
    candidates,
    target,
    w,
    transform=transform,
  )
  seconds['bucketed'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  blocks, chunk = full_width_rows(model, params, tokens, lengths, candidates)
  if transform is not None:
    blocks = [block @ transform for block in blocks]
  jax.block_until_ready(blocks)
  rows_s = time.perf_counter() - t0
  gram_f, along_f = block_gram(blocks, chunk, target, w)
  num = len(tokens)
  gram_f, along_f = gram_f[:, :num, :num], along_f[:, :num]
  seconds['full_width'] = time.perf_counter() - t0
  seconds['full_width_gram'] = seconds['full_width'] - rows_s
  select = jitted(hybrid.select_from_gram, static_argnames=('k', 'max_swaps'))
  groups = jnp.asarray(owner, jnp.int32)
  tok = model.tokenizer
  texts = [tok.decode(v, skip_special=True).strip() for v in variants]
  picks, rouge = {}, {}
  for side, (g, a) in (
    ('bucketed', (gram_b, along_b)),
    ('full_width', (gram_f, along_f)),
  ):
    chosen = np.asarray(
      select(jnp.asarray(g[0]), jnp.asarray(a[0]), b, groups=groups)
    )
    picks[side] = sorted(texts[i] for i in chosen)
  run_picks = sorted(_listed(row['recovered']))
  for name, p in (*picks.items(), ('run', run_picks)):
    m = metrics.rouge_matrix(row['originals'], p, stemmer=True)
    rouge[name] = {k: float(v.max(1).mean()) for k, v in m.items()}
  shape = peak.shape_of(model)
  buffer = np.minimum(
    width,
    -(-lengths // selection._WIDTH_BUCKET) * selection._WIDTH_BUCKET,  # pylint: disable=protected-access
  )
  flops = {
    'bucketed': float(sum(row_flops(shape, int(x)) for x in buffer)),
    'full_width': float(len(lengths) * row_flops(shape, width)),
  }
  scale = max(float(np.abs(gram_f).max()), 1e-30)
  return {
    'b': b,
    'batch': row['batch'],
    'variants': len(variants),
    'candidates': int(np.asarray(valid).sum()),
    'width': width,
    'mean_length': float(lengths.mean()),
    'buffer_tokens_ratio': float(buffer.sum() / (len(lengths) * width)),
    'seconds': seconds,
    'warmup_seconds': warmup_s,
    'shapes': sorted(f'{c}x{b}' for c, b in shapes),
    'speedup': seconds['full_width'] / seconds['bucketed'],
    'row_flops_on_buffers': flops,
    'gram_max_relative_difference': float(np.abs(gram_b - gram_f).max())
    / scale,
    'same_picks': picks['bucketed'] == picks['full_width'],
    'picks_differing': len(set(picks['bucketed']) ^ set(picks['full_width'])),
    'full_width_picks_equal_run': picks['full_width'] == run_picks,
    'rouge': rouge,
    'run_stage_seconds': row.get('stage_seconds'),
  }


def run(results: str, batches: list[int]) -> dict:
  cfg, model, params, rows = load_run(results)
  config = runner.hybrid_config(cfg)
  measured = peak.measure_peak(1024, repeats=3)
  transform = (
    hybrid.model_head_transform(model, params, config)
    if config.select_whiten
    else None
  )
  out_rows = []
  for row in rows:
    if row['batch'] in batches:
      r = bench_batch(model, params, cfg, config, row, transform)
      for side in SIDES:
        r[f'{side}_fraction_of_peak'] = (
          r['row_flops_on_buffers'][side]
          / r['seconds'][side]
          / measured['peak_flops']
        )
      out_rows.append(r)
      print(
        f'batch {r["batch"]}: bucketed {r["seconds"]["bucketed"]:.1f} s,'
        f' full width {r["seconds"]["full_width"]:.1f} s'
        f' ({r["speedup"]:.2f}x); same picks {r["same_picks"]}'
        f' ({r["picks_differing"]} texts differ); ROUGE-L'
        f' {r["rouge"]["bucketed"]["rougeL"]:.4f} vs'
        f' {r["rouge"]["full_width"]["rougeL"]:.4f}',
        flush=True,
      )
  return {
    'benchmark': 'hybrid_select',
    'results': results,
    'model': cfg.model,
    'device': str(jax.devices()[0].device_kind),
    'cpu': platform.processor() or platform.machine(),
    'jax_version': jax.__version__,
    'matmul_peak_flops_per_second': measured['peak_flops'],
    'rows': out_rows,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--results', default=DEFAULT_RESULTS)
  parser.add_argument('--batches', default='5')
  parser.add_argument('--out', default='benchmarks/results/hybrid_select.json')
  args = parser.parse_args()
  batches = [int(x) for x in args.batches.split(',')]
  result = run(args.results, batches)
  result['command'] = (
    'python -m benchmarks.hybrid_select'
    f' --results={args.results} --batches={args.batches} --out={args.out}'
  )
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=2) + '\n')
  print(f'wrote {args.out}')


if __name__ == '__main__':
  main()
