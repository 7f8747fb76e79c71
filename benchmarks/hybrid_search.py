r"""The hybrid's search stage on one batch of a committed run: its seconds,
one search step's parts, and the sentences it finds.

The search (:func:`leakjax.attacks.dager.hybrid.search_sentences`) grows
one sentence after the other, each a beam search in one `lax.while_loop`
whose steps decode the beams one token (the LM, and with `prior_start`
the LM again on the prior's own context), run the shortlisted extensions
through block 2 (:meth:`Model.block_decode`) and read the head input
back from the logits (`HeadScore.readout`). With few beams each decode
is a product of a handful of rows with every weight of the model, so a
step costs about one read of the weights per decode.

This benchmark rebuilds one batch's gradient from a hybrid run's
`results.jsonl` (its config and sentences), runs the search with the
run's settings for `--sentences` sentences (`ceil(oversample ·
sentences)` searches), once to compile and once timed, and times one
step of the kernel and its parts (medians of interleaved repetitions).
Each invocation adds one run under `--label` to `--out`; a run made with
`--reference=LABEL` records whether it found the same sentences (token
ids) and scores as that one. Before/after: run it from a git worktree of
the code before, then from this one, with the same `--out`.

  python -m benchmarks.hybrid_search --label=after \
      [--results=reports/dager/hybrid_evidence_oversample_heldout/results.jsonl] \
      [--batch=3] [--sentences=8] [--reference=before] \
      [--out=benchmarks/results/hybrid_search.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.attacks.dager.hybrid import kernel
from leakjax.attacks.dager.hybrid import loop as hybrid_loop
from studies.dager.study import load_run

DEFAULT_RESULTS = (
  'reports/dager/hybrid_evidence_oversample_heldout/results.jsonl'
)


def _first_search_inputs(model, params, grads, sentences, config):
  """The arguments the host loop hands the kernel for its first search
  (the loop run up to its first kernel call, which is skipped)."""
  captured = {}

  class _Stop(Exception):
    pass

  real = hybrid_loop.jitted

  def capture(fn, **kwargs):
    if fn.__name__ not in ('hybrid_search', 'hybrid_beams'):
      return real(fn, **kwargs)

    def stop(*args, **kw):
      captured.update(args=args, kwargs=kw)
      raise _Stop

    return stop

  hybrid_loop.jitted = capture
  try:
    hybrid.search_sentences(model, params, grads, sentences, config=config)
  except _Stop:
    pass
  finally:
    hybrid_loop.jitted = real
  return captured['args'], captured['kwargs']


def step_parts(model, params, args, kwargs) -> dict:
  """Seconds of one search step (a later one, with the config's
  shortlist) and of its parts, medians of interleaved repetitions."""
  (_, _, span2, cands, valid, is_end, taken, taken_len, bos, is_start, head) = (
    args
  )
  sc = kwargs['config']
  skip = kwargs['taken_skip']
  k = sc.beams
  init = jax.jit(
    kernel.init_state,
    static_argnames=('model', 'beams', 'max_length', 'layer', 'prior_start'),
  )
  state = init(
    model, params, bos, k, sc.max_length, sc.span_block, head, sc.prior_start
  )
  step = jax.jit(
    kernel.hybrid_step, static_argnames=('model', 'config', 'shortlist')
  )
  common = (model, params, span2, cands, valid, is_end, taken, taken_len)
  state = step(
    *common,
    state,
    config=sc,
    shortlist=cands.shape[0],
    allowed=is_start,
    head=head,
    taken_skip=skip,
  )
  rows = k if sc.prior_start is None else 2 * k
  cache = model.init_cache(params, rows, sc.max_length + 1)
  decode = jax.jit(model.decode)
  ids = jnp.ones((rows, 1), jnp.int32)
  _, cache = decode(params, cache, ids)
  one_cache = jax.tree.map(lambda x: x[:k], cache)
  block = model.init_block_cache(
    params, k * sc.shortlist, sc.max_length + 1, layer=sc.span_block
  )
  block_ids = jnp.ones((k * sc.shortlist, 1), jnp.int32)
  block_decode = jax.jit(model.block_decode, static_argnames=('layer',))
  _, block = block_decode(params, block, block_ids, layer=sc.span_block)
  readout = jax.jit(lambda z, r: z[:, -1] @ r)
  logits = jnp.zeros((k, 1, model.vocab_size), jnp.float32)
  fns = {
    'step': lambda: (
      step(*common, state, config=sc, head=head, taken_skip=skip).score
    ),
    f'decode_{k}_rows': lambda: decode(params, one_cache, ids[:k])[0],
    f'decode_{2 * k}_rows': lambda: decode(params, cache, ids)[0],
    f'block_decode_{k * sc.shortlist}_rows': lambda: block_decode(
      params, block, block_ids, layer=sc.span_block
    )[0],
  }
  if head is not None:
    fns['head_readout'] = lambda: readout(logits, head.readout)
  blocking = {
    name: (lambda fn=fn: jax.block_until_ready(fn()))
    for name, fn in fns.items()
  }
  times = peak.time_interleaved(blocking, repeats=7)
  return {name: peak.median(t) for name, t in times.items()}


def run(args) -> dict:
  cfg, model, params, rows = load_run(args.results)
  config = runner.hybrid_config(cfg)
  row = next(r for r in rows if r['batch'] == args.batch)
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], row['b'], row['batch'], row['defense'], cfg
  )
  measured = peak.measure_peak(1024, repeats=3)
  t0 = time.perf_counter()
  hybrid.search_sentences(model, params, grads, args.sentences, config=config)
  first_s = time.perf_counter() - t0
  found = hybrid.search_sentences(
    model, params, grads, args.sentences, config=config
  )
  parts = step_parts(
    model,
    params,
    *_first_search_inputs(model, params, grads, args.sentences, config),
  )
  shape = peak.shape_of(model)
  contexts = 1 if config.prior_start is None else 2
  decode_flops = peak.decode_step_flops(shape, config.max_length // 2)
  # Matmul FLOPs of a step: the decodes, the shortlist's block passes
  # and the head input's readout.
  step_flops = (
    config.beams * contexts * decode_flops
    + config.beams
    * config.shortlist
    * (config.span_block + 1)
    * 2.0
    * shape.block_params
    + (2.0 * config.beams * shape.head_params if config.weight_head else 0.0)
  )
  weight_bytes = 4.0 * (
    shape.num_layers * shape.block_params + shape.head_params
  )
  return {
    'label': args.label,
    'note': args.note,
    'batch': row['batch'],
    'b': row['b'],
    'sentences': args.sentences,
    'searches': len(found.sequences),
    'seconds': {
      'first_call': first_s,
      **{f'timed_{k}': v for k, v in found.seconds.items()},
    },
    'search_seconds_per_search': found.seconds['search'] / len(found.sequences),
    'step_seconds': parts,
    'step_flops': step_flops,
    'step_fraction_of_peak': step_flops
    / parts['step']
    / measured['peak_flops'],
    'decode_weight_bytes': weight_bytes,
    'contexts': contexts,
    'matmul_peak_flops_per_second': measured['peak_flops'],
    'sequences': found.sequences,
    'scores': found.scores,
  }


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--results', default=DEFAULT_RESULTS)
  parser.add_argument('--batch', type=int, default=3)
  parser.add_argument('--sentences', type=int, default=8)
  parser.add_argument('--label', required=True)
  parser.add_argument('--note', default='')
  parser.add_argument('--reference', default=None)
  parser.add_argument('--out', default='benchmarks/results/hybrid_search.json')
  args = parser.parse_args(argv)
  out = Path(args.out)
  doc = (
    json.loads(out.read_text())
    if out.exists()
    else {
      'benchmark': 'hybrid_search',
      'results': args.results,
      'device': str(jax.devices()[0].device_kind),
      'cpu': platform.processor() or platform.machine(),
      'jax_version': jax.__version__,
      'runs': [],
    }
  )
  result = run(args)
  if args.reference is not None:
    ref = next(r for r in doc['runs'] if r['label'] == args.reference)
    result['reference'] = args.reference
    result['same_sequences'] = ref['sequences'] == result['sequences']
    result['max_score_difference'] = float(
      np.max(np.abs(np.subtract(ref['scores'], result['scores'])))
    )
    result['search_speedup'] = (
      ref['seconds']['timed_search'] / result['seconds']['timed_search']
    )
  doc['runs'] = [r for r in doc['runs'] if r['label'] != args.label]
  doc['runs'].append(result)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(doc, indent=2) + '\n')
  shown = {k: v for k, v in result.items() if k not in ('sequences', 'scores')}
  print(json.dumps(shown, indent=2))


if __name__ == '__main__':
  main()
