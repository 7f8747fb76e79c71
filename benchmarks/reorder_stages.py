r"""FILM's reordering in one buffer against :func:`reorder_in_stages`.

The reordering (FILM Sec. 4.4) scores C candidates a step, each over the
whole buffer. The pipeline's buffer holds the beam-search sentence (the
prompt plus `--length` generated tokens) and 8 more for insertions; once
step 0 cuts the sentence at its first sentence end, most of it is padding.
:func:`leakjax.attacks.film.reorder.reorder_in_stages` runs the stages of
`MIN_STAGE_STEPS` steps or more in buffers as narrow as the sentence
allows. This benchmark runs both on the real SmolLM2-135M, on beam-search
sentences built like the pipeline's: an embedded quickstart sentence
followed by tokens of its bag until the buffer of FILM's Enron protocol is
full (`experiments/configs/film_enron.flags`: `--length=40`, 16
candidates), and records

* each side's seconds per sentence (the first sentence's include the
  compilations; the rest do not) and the ratio;
* that both end with the same sentence, length and number of accepted
  moves, and how far apart their scores are;
* the seconds of one scoring step of C candidates at each buffer width,
  with the fraction of the machine's fp32 matmul peak (measured in the
  same process) that it reaches.

  python -m benchmarks.reorder_stages \
      [--steps=40] [--sentences=3] [--out=benchmarks/results/reorder_stages.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak
from leakjax import models, quickstart_corpus
from leakjax.attacks.film import reorder as ro
from leakjax.tokenization import sentence_end_mask

LENGTH = 40  # film_enron.flags: --length
CANDIDATES = 16  # film_enron.flags: --reorder_candidates
BUCKET = 8  # leakjax.attacks.film.pipeline._LENGTH_BUCKET


def beam_sentence(tokenizer, text: str, width: int, seed: int) -> list[int]:
  """BOS + the sentence, then tokens of its bag in a random order up to
  `width` tokens: the beam search keeps generating bag tokens past the
  sentence's end, which step 0 of the reordering cuts off when that lowers
  the prior score."""
  ids = [tokenizer.bos_id, *tokenizer.encode(text)]
  rng = np.random.default_rng(seed)
  tail = rng.choice(ids[1:], width - len(ids))
  return ids + [int(t) for t in tail]


def step_seconds(model, params, *, candidates: int, width: int, reps: int):
  """Median seconds of one scoring step of `candidates` in `width` tokens."""
  fn = jax.jit(functools.partial(ro.candidate_scores, model))
  ids = jnp.ones((candidates, width), jnp.int32)
  mask = jnp.ones_like(ids)
  jax.block_until_ready(fn(params, ids, mask))
  seconds = peak.time_interleaved(
    {'f': lambda: jax.block_until_ready(fn(params, ids, mask))},
    repeats=reps,
    warmup=0,
  )['f']
  shape = peak.shape_of(model)
  flops = candidates * (
    peak.forward_flops(shape, width)
    + peak.backward_flops(shape, width, last_layers=1)
  )
  return peak.median(seconds), flops


def run(steps: int, sentences: int, reps: int = 3) -> dict:
  model, params = models.load(models.SMOLLM2_ALIAS)
  tok = model.tokenizer
  measured = peak.measure_peak(2048, repeats=5)
  config = ro.ReorderConfig(
    phrase_steps=steps, token_steps=steps, num_candidates=CANDIDATES
  )
  is_end = jnp.asarray(sentence_end_mask(tok, model.vocab_size))
  fn = jax.jit(functools.partial(ro.reorder, model, config=config))
  width = 2 + LENGTH  # BOS + capitalised start word + generated tokens
  limit = width + 8  # the pipeline's insertion room
  full = -(-limit // BUCKET) * BUCKET
  rows, widths = [], set()
  for i, text in enumerate(quickstart_corpus.SENTENCES[:sentences]):
    tokens = beam_sentence(tok, text, width, seed=i)
    bag = jnp.asarray(sorted(set(tokens[1:])), jnp.int32)
    args = dict(
      key=jax.random.key(i), is_end=is_end, max_length=jnp.int32(limit)
    )
    buffer, _ = ro.pad_sequences([tokens], full)
    start = time.perf_counter()
    one = jax.block_until_ready(
      fn(params, jnp.asarray(buffer[0]), jnp.int32(len(tokens)), bag, **args)
    )
    one_s = time.perf_counter() - start
    used = []

    def run_stretch(toks, n, state, stop, bag=bag, args=args, used=used):
      used.append(int(toks.shape[0]))
      return fn(
        params,
        jnp.asarray(toks),
        jnp.int32(n),
        bag,
        state=state,
        stop=jnp.int32(stop),
        **args,
      )

    start = time.perf_counter()
    staged = jax.block_until_ready(
      ro.reorder_in_stages(
        run_stretch, tokens, config=config, max_length=limit, bucket=BUCKET
      )
    )
    staged_s = time.perf_counter() - start
    widths.update(used)
    n = int(one.length)
    rows.append(
      {
        'sentence': i,
        'input_tokens': len(tokens),
        'final_tokens': n,
        'one_buffer_width': full,
        'stage_widths': sorted(set(used)),
        'one_buffer_s': round(one_s, 2),
        'staged_s': round(staged_s, 2),
        'speedup': round(one_s / staged_s, 2),
        'includes_compilation': i == 0,
        'same_sentence': int(staged.length) == n
        and bool(
          np.array_equal(
            np.asarray(one.tokens)[:n], np.asarray(staged.tokens)[:n]
          )
        ),
        'same_accepted': int(one.accepted) == int(staged.accepted),
        'score_rel_diff': abs(float(staged.score) - float(one.score))
        / abs(float(one.score)),
      }
    )
    print(json.dumps(rows[-1]), flush=True)
  per_width = []
  for w in sorted(widths | {full}):
    seconds, flops = step_seconds(
      model, params, candidates=CANDIDATES, width=w, reps=reps
    )
    per_width.append(
      {
        'width': w,
        'step_s': round(seconds, 3),
        'fraction_of_peak': round(flops / seconds / measured['peak_flops'], 3),
      }
    )
  warm = [r for r in rows if not r['includes_compilation']]
  return {
    'benchmark': 'reorder_stages',
    'command': f'python -m benchmarks.reorder_stages --steps={steps}'
    f' --sentences={sentences}',
    'model': 'smollm2-135m',
    'cpu': platform.processor() or platform.machine(),
    'cpu_count': os.cpu_count(),
    'jax_version': jax.__version__,
    'matmul_peak_flops_per_second': measured['peak_flops'],
    'phrase_steps': steps,
    'token_steps': steps,
    'candidates': CANDIDATES,
    'length': LENGTH,
    'min_stage_steps': ro.MIN_STAGE_STEPS,
    'sentences': rows,
    'warm_one_buffer_s': round(sum(r['one_buffer_s'] for r in warm), 2),
    'warm_staged_s': round(sum(r['staged_s'] for r in warm), 2),
    'step_seconds_by_width': per_width,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--sentences', type=int, default=3)
  parser.add_argument('--out', default='benchmarks/results/reorder_stages.json')
  args = parser.parse_args()
  result = run(args.steps, args.sentences)
  Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  Path(args.out).write_text(json.dumps(result, indent=1) + '\n')
  print(
    f'warm: one buffer {result["warm_one_buffer_s"]} s, staged'
    f' {result["warm_staged_s"]} s'
  )


if __name__ == '__main__':
  main()
