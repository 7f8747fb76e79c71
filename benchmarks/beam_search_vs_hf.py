"""Bag-restricted beam search: leakjax vs Hugging Face `generate` (PyTorch).

The peer is what a FILM user would otherwise run: transformers' beam search
in PyTorch on the CPU, on **the same weights** (our model is exported with
`leakjax.models.save` and loaded with `GPT2LMHeadModel` /
`LlamaForCausalLM`), with the same

* bag restriction -- a `LogitsProcessor` that adds 0 to bag tokens and -inf
  to all others (one broadcast add, the cheapest way to do it in torch);
* beam size k, repeated 2-gram ban (`no_repeat_ngram_size=2` = our
  `ngram_size=2, ngram_penalty=inf`), length L (exactly L new tokens, no
  EOS, `early_stopping=False`, `length_penalty=0`: the score is the sum of
  token log-probabilities, as ours);
* prompts: one search per start prompt `[BOS, capitalised bag token]`
  (FILM Sec. 4.3), HF gets all S prompts as one batch (its fastest mode).

For each (model, b, k) the workload is the bag of a batch of b sentences
(FILM's Enron sentences when fetched, else synthetic) and the first
S = min(#prompts, max_searches) prompts. Both sides run interleaved
(`repeats` rounds after a warm-up); we report medians, the ratio, and

* sentences/s -- searches finished per second (each yields its best
  sentence);
* candidate tokens scored/s -- bag candidates ranked per second,
  `S * M * (1 + (L - 1) * k)` per call (M = bag size);
* achieved FLOP/s -- the matmul FLOPs of the problem (prefill once per
  prompt, then k decode steps per generated token, `benchmarks.peak`)
  divided by each side's time, beside the machine peak measured by the same
  process.

Match check: for every search, our best sentence must equal HF's. When they
differ, both sentences are rescored by teacher forcing; a gap below
`tie_tolerance` nats is a tie (both are best within float32 noise) and is
left out of `match`, a larger gap is a mismatch (match = 0).

Run alone: `python -m benchmarks.beam_search_vs_hf --quick --out=DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import peak as peak_lib
from leakjax import datasets, models
from leakjax.attacks.film import beam_search as bs
from leakjax.io import atomic_write_text, summary_key

BENCH = 'beam_search'
# FILM's Enron sentences where `python -m leakjax.data fetch film-enron` put
# them, else synthetic sentences.
DEFAULT_DATA = datasets.cached_path('film-enron')


# ---------------------------------------------------------------- settings
@dataclasses.dataclass(frozen=True)
class Settings:
  """What to run (hashable; every field is written to the JSON).

  Attributes:
    models: names from :data:`MODEL_NAMES`; the first is the headline.
    beams: beam sizes k.
    batch_sizes: FILM client batch sizes b (sentences in the bag).
    length: L, tokens generated after the prompt.
    max_searches: S, prompts (= searches) per call at most.
    repeats: timed rounds per contender (after one warm-up round).
    headline_b: the b of the headline `speedup@bench=beam_search,beam=k`.
    tie_tolerance: nats; differing best sentences closer than this are ties.
    profile_beams: beam sizes at which each side's model decoding alone is
      timed too (see :func:`make_decode_only`), splitting each total into
      model compute and search logic.
    seed: which sentences form the batches.
    data: a JSON list of sentences; None or missing -> synthetic.
  """

  models: tuple[str, ...] = ('gpt2-mini',)
  beams: tuple[int, ...] = (8, 32)
  batch_sizes: tuple[int, ...] = (1, 16)
  length: int = 16
  max_searches: int = 2
  repeats: int = 3
  headline_b: int = 16
  tie_tolerance: float = 1e-3
  profile_beams: tuple[int, ...] = (32,)
  seed: int = 0
  data: str | None = str(DEFAULT_DATA)


QUICK = Settings(repeats=5)
FULL = Settings(
  models=('gpt2-small', 'smollm2-135m'),
  beams=(8, 32, 128),
  batch_sizes=(1, 16, 128),
  # FILM Sec. 4.3 generates 40 words; 20 tokens keeps the 18-case grid of
  # two 124M/135M models under an hour on 2 busy cores (--length=40 for the
  # paper's length).
  length=20,
  max_searches=1,
  repeats=2,
  profile_beams=(32,),
)
# For tests: a 2-layer, 64-wide GPT-2 with a 512-token vocabulary.
TINY = Settings(
  models=('gpt2-tiny',),
  beams=(32,),
  batch_sizes=(16,),
  length=8,
  max_searches=2,
  repeats=2,
  profile_beams=(),
  data=None,
)


# ------------------------------------------------------------------ models
def _gpt2(config_name: str, **overrides):
  """`(model, params)` of a randomly initialised GPT-2."""
  from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top
  from leakjax.tokenization import gpt2_tokenizer  # pylint: disable=g-import-not-at-top

  if config_name == 'tiny':
    config = gpt2.GPT2Config.tiny(**overrides)
    tokenizer = None
  else:
    config = getattr(gpt2.GPT2Config, config_name)(**overrides)
    tokenizer = gpt2_tokenizer()
  return gpt2.init_model(config, key=jax.random.key(0), tokenizer=tokenizer)


MODEL_NAMES = {
  # Random weights: speed does not depend on them, and matching outputs
  # only needs both sides to read the same ones.
  'gpt2-tiny': lambda: _gpt2('tiny'),
  'gpt2-mini': lambda: _gpt2(
    'small', n_layer=4, n_embd=256, n_head=4, n_positions=128
  ),
  'gpt2-small': lambda: _gpt2('small'),  # 124M, GPT-2 small's shape
  'smollm2-135m': lambda: models.load(models.SMOLLM2_ALIAS),  # real weights
}


def load_model(name: str):
  """`(model, params)` of one of `MODEL_NAMES`."""
  if name not in MODEL_NAMES:
    raise ValueError(f'unknown model {name!r}; use one of {list(MODEL_NAMES)}')
  return MODEL_NAMES[name]()


@functools.lru_cache(maxsize=1)
def load_pair(name: str):
  """`(leakjax model, its params, transformers model)`, the same weights.

  Cached (the last one) so that benchmarks run one after the other in
  `benchmarks.run` share the load, export and import costs.
  """
  model, params = load_model(name)
  with tempfile.TemporaryDirectory() as tmp:
    hf_model = to_torch(model, params, tmp)
  return model, params, hf_model


def to_torch(model, params, directory: str | os.PathLike):
  """Exports `model` with `models.save` and loads it in transformers."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  models.save(model, params, directory)
  cls = {
    'gpt2': transformers.GPT2LMHeadModel,
    'llama': transformers.LlamaForCausalLM,
  }[model.family]
  hf = cls.from_pretrained(directory, dtype=torch.float32)
  hf.eval()
  return hf


# ---------------------------------------------------------------- workload
@dataclasses.dataclass
class Workload:
  """One (model, b) problem: the bag and the prompts of its searches."""

  b: int
  bag: np.ndarray  # int32 [M], sorted bag token ids
  prompts: np.ndarray  # int32 [S, P], one search per row
  source: str  # where the sentences came from


def _sentences(data: str | None, n: int, seed: int) -> tuple[list[str], str]:
  if data and Path(data).is_file():
    texts = json.loads(Path(data).read_text())
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(texts), size=min(n, len(texts)), replace=False)
    return [texts[i] for i in pick], f'enron:{Path(data).name}'
  return _synthetic_sentences(n, seed), 'synthetic'


_NAMES = (
  'Alice Bob Carol David Enron Houston Texas London Monday Friday Jeff Mark'
  ' Sara Kim Peter Laura Dallas Chicago Sunday Vince'
).split()
_WORDS = (
  'the a to of and in for on with at by from about meeting call report deal'
  ' gas power price contract team office week today tomorrow please send'
  ' review update market trade plan budget draft agreement schedule notes'
  ' will can should need want know think see get make take give find tell'
  ' new good final next last first same other more few all some any this'
).split()


def _synthetic_sentences(n: int, seed: int) -> list[str]:
  """English-like sentences: a name, then common words, then a full stop."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    words = [str(rng.choice(_NAMES))]
    for _ in range(int(rng.integers(8, 20))):
      pool = _NAMES if rng.random() < 0.15 else _WORDS
      words.append(str(rng.choice(pool)))
    out.append(' '.join(words) + '.')
  return out


def make_workload(model, b: int, settings: Settings) -> Workload:
  """The bag of b sentences and up to `max_searches` FILM start prompts."""
  tok = model.tokenizer
  if tok is None:  # tiny random model: sentences of random ids
    rng = np.random.default_rng(settings.seed + b)
    vocab = model.vocab_size
    sents = [
      rng.zipf(1.3, size=int(rng.integers(8, 20))) % vocab for _ in range(b)
    ]
    bag = np.unique(np.concatenate(sents)).astype(np.int32)
    starts = list(dict.fromkeys(int(s[0]) for s in sents))
    prompts = [[t] for t in starts][: settings.max_searches]
    return Workload(b, bag, np.asarray(prompts, np.int32), 'synthetic-ids')
  texts, source = _sentences(settings.data, b, settings.seed)
  ids = [tok.encode(t) for t in texts]
  bag = np.unique(np.concatenate([np.asarray(i) for i in ids]))
  bag = bag.astype(np.int32)
  prompts = bs.make_prompts(tok, bag.tolist(), use_bos=True, mode='capital')
  prompts = prompts[: settings.max_searches]
  return Workload(b, bag, np.asarray(prompts, np.int32), source)


# ----------------------------------------------------------------- contenders
_SEARCH = jax.jit(bs.bag_beam_search, static_argnames=('model', 'config'))


def make_ours(model, params, workload: Workload, k: int, length: int):
  """A thunk running our jitted search; compiled once per shape."""
  config = bs.BeamSearchConfig(
    num_beams=k,
    num_groups=1,
    ngram_size=2,
    ngram_penalty=math.inf,
    length=length,
  )
  prompts = jnp.asarray(workload.prompts[:, None, :])  # [S, P] -> [S, 1, P]
  bag = jnp.asarray(workload.bag)

  def thunk():
    return jax.block_until_ready(
      _SEARCH(model, params, prompts, bag, config=config)
    )

  return thunk


class _BagLogitsProcessor:
  """transformers LogitsProcessor: -inf for every token outside the bag."""

  def __init__(self, bag: np.ndarray, vocab_size: int):
    import torch  # pylint: disable=g-import-not-at-top

    mask = torch.full((vocab_size,), -math.inf)
    mask[torch.as_tensor(bag, dtype=torch.long)] = 0.0
    self.mask = mask

  def __call__(self, input_ids, scores):
    del input_ids
    return scores + self.mask


def make_hf(hf_model, workload: Workload, k: int, length: int, vocab: int):
  """A thunk running transformers' beam search with the same settings."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import LogitsProcessorList  # pylint: disable=g-import-not-at-top

  input_ids = torch.as_tensor(workload.prompts, dtype=torch.long)
  processors = LogitsProcessorList([_BagLogitsProcessor(workload.bag, vocab)])
  kwargs = dict(
    input_ids=input_ids,
    attention_mask=torch.ones_like(input_ids),
    num_beams=k,
    do_sample=False,
    no_repeat_ngram_size=2,
    max_new_tokens=length,
    min_new_tokens=length,
    early_stopping=False,
    length_penalty=0.0,
    logits_processor=processors,
    pad_token_id=0,
    eos_token_id=None,
    use_cache=True,
  )

  def thunk(num_return_sequences: int = 1, output_scores: bool = False):
    with torch.inference_mode():
      return hf_model.generate(
        **kwargs,
        num_return_sequences=num_return_sequences,
        output_scores=output_scores,
        return_dict_in_generate=output_scores,
      )

  return thunk


@functools.partial(jax.jit, static_argnames=('model', 'length'))
def _decode_loop(model, params, prompts, bag, *, length: int):
  """Prefill `prompts [rows, P]`, then `length - 1` greedy bag steps."""
  rows, p = prompts.shape
  cache = model.init_cache(params, rows, p + length)
  logits, cache = model.decode(params, cache, prompts)  # [rows, P, V]

  def step(_, carry):
    last, cache = carry  # [rows, V]
    nxt = bag[jnp.argmax(last[:, bag], axis=-1)][:, None]  # [rows, 1]
    logits, cache = model.decode(params, cache, nxt)  # [rows, 1, V]
    return logits[:, -1], cache

  last, _ = jax.lax.fori_loop(0, length - 1, step, (logits[:, -1], cache))
  return last


def make_decode_only(
  model, params, hf_model, workload: Workload, k: int, length: int
):
  """Thunks that run only the model decoding of the search, both sides.

  Same rows (S * k), same number of steps and cache length as the search,
  but the next token is the best bag token of each row: no n-gram test,
  no top-k over beams, no cache reordering. `search - decode_only` is the
  cost of the search logic (and, for HF, of `generate`'s machinery).
  """
  import torch  # pylint: disable=g-import-not-at-top

  bag = jnp.asarray(workload.bag)
  prompts = jnp.repeat(jnp.asarray(workload.prompts), k, axis=0)  # [S*k, P]

  def ours():
    return jax.block_until_ready(
      _decode_loop(model, params, prompts, bag, length=length)
    )

  t_prompts = torch.as_tensor(np.array(prompts), dtype=torch.long)
  t_bag = torch.as_tensor(workload.bag, dtype=torch.long)

  def hf():
    with torch.inference_mode():
      out = hf_model(input_ids=t_prompts, use_cache=True)
      for _ in range(length - 1):
        nxt = t_bag[out.logits[:, -1, t_bag].argmax(-1)][:, None]
        out = hf_model(
          input_ids=nxt, past_key_values=out.past_key_values, use_cache=True
        )
      return out.logits

  return ours, hf


# ------------------------------------------------------------------ checks
@functools.partial(jax.jit, static_argnames=('model',))
def _token_log_probs(model, params, ids):
  return model.token_log_probs(params, ids)


def _sequence_logprob(model, params, tokens: np.ndarray, p: int) -> np.ndarray:
  """Sum of log P(token) over the generated positions p.., per row."""
  logp = _token_log_probs(model, params, jnp.asarray(tokens, jnp.int32))
  return np.asarray(logp[:, p - 1 :].sum(-1))


def check_match(
  model,
  params,
  ours_thunk,
  hf_thunk,
  workload: Workload,
  k: int,
  settings: Settings,
) -> dict[str, Any]:
  """Compares the best sentence of every search (see module docstring)."""
  result = ours_thunk()
  p = workload.prompts.shape[1]
  ours_best = np.asarray(result.tokens[:, 0])  # [S, P + L]
  ours_scores = np.asarray(result.scores)  # [S, k]
  out = hf_thunk(num_return_sequences=k, output_scores=True)
  hf_seqs = out.sequences.numpy().reshape(len(workload.prompts), k, -1)
  hf_scores = out.sequences_scores.numpy().reshape(len(workload.prompts), k)
  hf_best = hf_seqs[:, 0]
  same = [bool(np.array_equal(a, b)) for a, b in zip(ours_best, hf_best)]
  # Teacher-forced log P of the generated tokens, ours and HF's best.
  both = _sequence_logprob(
    model, params, np.concatenate([ours_best, hf_best]), p
  )
  lp_ours, lp_hf = both[: len(same)], both[len(same) :]
  differing = [i for i, s in enumerate(same) if not s]
  gaps = np.abs(lp_ours - lp_hf)[differing].tolist()
  ties = int(sum(g <= settings.tie_tolerance for g in gaps))
  mismatches = len(differing) - ties
  # Beam-set overlap: how many of HF's k final beams we also return.
  overlap = []
  for s in range(len(workload.prompts)):
    ours_set = {tuple(r) for r in np.asarray(result.tokens[s]).tolist()}
    hf_set = {tuple(r) for r in hf_seqs[s].tolist()}
    overlap.append(len(ours_set & hf_set) / k)
  # Score agreement of the best beams (ours include log P(prompt)).
  prompt_lp = ours_scores[:, 0] - lp_ours
  return {
    'searches': len(same),
    'same_best': int(sum(same)),
    'ties': ties,
    'mismatches': mismatches,
    'tie_gaps': gaps,
    'match': int(mismatches == 0),
    'beam_overlap': float(np.mean(overlap)),
    'best_score_ours': (ours_scores[:, 0] - prompt_lp).tolist(),
    'best_score_hf': hf_scores[:, 0].tolist(),
  }


# -------------------------------------------------------------------- cases
def problem_flops(model, workload: Workload, k: int, length: int) -> float:
  """Matmul FLOPs of the search (prefill once, then k rows per step)."""
  shape = peak_lib.shape_of(model)
  s, p = workload.prompts.shape
  per_search = peak_lib.forward_flops(shape, p)
  for step in range(1, length):
    per_search += k * peak_lib.decode_step_flops(shape, p + step)
  return s * per_search


def run_case(
  model,
  params,
  hf_model,
  model_name: str,
  workload: Workload,
  k: int,
  settings: Settings,
) -> dict[str, Any]:
  length = settings.length
  ours = make_ours(model, params, workload, k, length)
  hf = make_hf(hf_model, workload, k, length, model.vocab_size)
  start = time.perf_counter()
  ours()  # compile
  compile_s = time.perf_counter() - start
  match = check_match(model, params, ours, hf, workload, k, settings)
  contenders = {'ours': ours, 'hf': hf}
  if k in settings.profile_beams:
    contenders['ours_decode_only'], contenders['hf_decode_only'] = (
      make_decode_only(model, params, hf_model, workload, k, length)
    )
    contenders['ours_decode_only']()  # compile outside the timing
  cpu: dict[str, list[float]] = {}
  times = peak_lib.time_interleaved(
    contenders, repeats=settings.repeats, warmup=0, cpu_times=cpu
  )
  t_ours, t_hf = (peak_lib.median(times[n]) for n in ('ours', 'hf'))
  c_ours, c_hf = (peak_lib.median(cpu[n]) for n in ('ours', 'hf'))
  profile = {}
  if 'ours_decode_only' in times:
    d_ours = peak_lib.median(times['ours_decode_only'])
    d_hf = peak_lib.median(times['hf_decode_only'])
    profile = {
      'seconds_ours_decode_only': times['ours_decode_only'],
      'seconds_hf_decode_only': times['hf_decode_only'],
      'median_s_ours_decode_only': d_ours,
      'median_s_hf_decode_only': d_hf,
      'median_cpu_s_ours_decode_only': peak_lib.median(cpu['ours_decode_only']),
      'median_cpu_s_hf_decode_only': peak_lib.median(cpu['hf_decode_only']),
      # Share of each side's time spent outside the model's decoding.
      'search_overhead_frac_ours': max(0.0, 1.0 - d_ours / t_ours),
      'search_overhead_frac_hf': max(0.0, 1.0 - d_hf / t_hf),
      'decode_speedup': d_hf / d_ours,
    }
  s, m = len(workload.prompts), len(workload.bag)
  candidates = s * m * (1 + (length - 1) * k)
  flops = problem_flops(model, workload, k, length)
  return {
    'model': model_name,
    'b': workload.b,
    'beam': k,
    'bag_size': m,
    'searches': s,
    'prompt_length': int(workload.prompts.shape[1]),
    'length': length,
    'data': workload.source,
    'seconds_ours': times['ours'],
    'seconds_hf': times['hf'],
    'median_s_ours': t_ours,
    'median_s_hf': t_hf,
    'compile_s_ours': compile_s,
    'cpu_seconds_ours': cpu['ours'],
    'cpu_seconds_hf': cpu['hf'],
    'median_cpu_s_ours': c_ours,
    'median_cpu_s_hf': c_hf,
    'speedup': t_hf / t_ours,
    'speedup_cpu': c_hf / c_ours,
    'sentences_per_s_ours': s / t_ours,
    'sentences_per_s_hf': s / t_hf,
    'candidates_per_s_ours': candidates / t_ours,
    'candidates_per_s_hf': candidates / t_hf,
    'flops': flops,
    'flops_per_s_ours': flops / t_ours,
    'flops_per_s_hf': flops / t_hf,
    **profile,
    **match,
  }


def summarize(
  rows: Sequence[dict], settings: Settings, peak: dict
) -> dict[str, float]:
  """Flat summary keys (`leakjax.io.summary_key` convention)."""
  out: dict[str, float] = {}
  for r in rows:
    params = dict(bench=BENCH, beam=r['beam'], b=r['b'], model=r['model'])
    out[summary_key('speedup', **params)] = r['speedup']
    out[summary_key('speedup_cpu', **params)] = r['speedup_cpu']
    out[summary_key('match', **params)] = r['match']
    out[summary_key('sentences_per_s_ours', **params)] = r[
      'sentences_per_s_ours'
    ]
    out[summary_key('sentences_per_s_hf', **params)] = r['sentences_per_s_hf']
    out[summary_key('flops_frac_peak_ours', **params)] = (
      r['flops_per_s_ours'] / peak['peak_flops']
    )
    out[summary_key('flops_frac_peak_hf', **params)] = (
      r['flops_per_s_hf'] / peak['peak_flops']
    )
  headline_model = settings.models[0]
  for k in settings.beams:
    at_k = [r for r in rows if r['beam'] == k and r['model'] == headline_model]
    if not at_k:
      continue
    pick = [r for r in at_k if r['b'] == settings.headline_b] or at_k[-1:]
    out[summary_key('speedup', bench=BENCH, beam=k)] = pick[0]['speedup']
    out[summary_key('speedup_cpu', bench=BENCH, beam=k)] = pick[0][
      'speedup_cpu'
    ]
    # Match over every b and model at this beam size.
    out[summary_key('match', bench=BENCH, beam=k)] = int(
      all(r['match'] for r in rows if r['beam'] == k)
    )
  return out


def markdown(rows: Sequence[dict], peak: dict) -> str:
  lines = [
    f'Peak (fp32 matmul n={peak["n"]}): {peak["peak_flops"] / 1e9:.1f}'
    ' GFLOP/s.',
    '',
    '| model | b | beam | M | S | ours s | HF s | speedup | CPU-s speedup |'
    ' sent/s ours | sent/s HF | cand/s ours | cand/s HF | %peak ours |'
    ' %peak HF | same best | ties |',
    '|' + '---|' * 17,
  ]
  for r in rows:
    lines.append(
      f'| {r["model"]} | {r["b"]} | {r["beam"]} | {r["bag_size"]} |'
      f' {r["searches"]} | {r["median_s_ours"]:.3f} | {r["median_s_hf"]:.3f}'
      f' | {r["speedup"]:.1f}x | {r["speedup_cpu"]:.1f}x |'
      f' {r["sentences_per_s_ours"]:.2f} |'
      f' {r["sentences_per_s_hf"]:.2f} | {r["candidates_per_s_ours"]:.3g} |'
      f' {r["candidates_per_s_hf"]:.3g} |'
      f' {100 * r["flops_per_s_ours"] / peak["peak_flops"]:.1f} |'
      f' {100 * r["flops_per_s_hf"] / peak["peak_flops"]:.1f} |'
      f' {r["same_best"]}/{r["searches"]} | {r["ties"]} |'
    )
  return '\n'.join(lines) + '\n'


def run(
  quick: bool = True,
  *,
  settings: Settings | None = None,
  peak: dict | None = None,
  log=print,
) -> dict[str, Any]:
  """Runs the benchmark; returns `{'summary', 'rows', 'peak', ...}`."""
  import torch  # pylint: disable=g-import-not-at-top

  settings = settings or (QUICK if quick else FULL)
  peak = peak or peak_lib.measure_peak(1024 if quick else 2048)
  rows = []
  for name in settings.models:
    model, params, hf_model = load_pair(name)
    for b in settings.batch_sizes:
      workload = make_workload(model, b, settings)
      for k in settings.beams:
        row = run_case(model, params, hf_model, name, workload, k, settings)
        rows.append(row)
        log(
          f'[beam_search] {name} b={b} k={k} M={row["bag_size"]}'
          f' S={row["searches"]}: ours {row["median_s_ours"]:.3f}s'
          f' HF {row["median_s_hf"]:.3f}s -> {row["speedup"]:.1f}x,'
          f' same best {row["same_best"]}/{row["searches"]}'
          f' (ties {row["ties"]})'
        )
    del hf_model, model, params
  return {
    'bench': BENCH,
    'settings': dataclasses.asdict(settings),
    'peak': peak,
    'torch_threads': torch.get_num_threads(),
    'jax_backend': jax.default_backend(),
    'rows': rows,
    'summary': summarize(rows, settings, peak),
    'markdown': markdown(rows, peak),
  }


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument(
    '--tiny', action='store_true', help='the test settings (tiny random GPT-2)'
  )
  parser.add_argument(
    '--models',
    default=None,
    help='comma-separated, from ' + ','.join(MODEL_NAMES),
  )
  parser.add_argument('--beams', default=None)
  parser.add_argument('--batch_sizes', default=None)
  parser.add_argument('--length', type=int, default=None)
  parser.add_argument('--max_searches', type=int, default=None)
  parser.add_argument('--repeats', type=int, default=None)
  parser.add_argument('--out', default=None, help='folder for beam_search.json')
  parser.add_argument(
    '--threads',
    type=int,
    default=1,
    help='see benchmarks/run.py (1: one core per side)',
  )
  args = parser.parse_args(argv)
  from benchmarks import run as run_lib  # pylint: disable=g-import-not-at-top

  print(f'threads: {run_lib.configure_threads(args.threads)}')
  settings = TINY if args.tiny else (QUICK if args.quick else FULL)
  ints = lambda s: tuple(int(x) for x in s.split(','))
  changes = {
    'models': tuple(args.models.split(',')) if args.models else None,
    'beams': ints(args.beams) if args.beams else None,
    'batch_sizes': ints(args.batch_sizes) if args.batch_sizes else None,
    'length': args.length,
    'max_searches': args.max_searches,
    'repeats': args.repeats,
  }
  settings = dataclasses.replace(
    settings, **{k: v for k, v in changes.items() if v is not None}
  )
  result = run(args.quick, settings=settings)
  print(result['markdown'])
  if args.out:
    out = Path(args.out)
    atomic_write_text(
      out / f'{BENCH}.json',
      json.dumps(_jsonable(result), indent=2, sort_keys=True),
    )


def _jsonable(x):
  from leakjax.io import _jsonable as impl  # pylint: disable=g-import-not-at-top

  return impl(x)


if __name__ == '__main__':
  main()
