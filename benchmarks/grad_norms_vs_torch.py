"""Per-candidate gradient norms: `vmap(grad)` vs a PyTorch loop of backwards.

FILM's reordering (Sec. 4.4) scores every candidate sentence by
`perplexity + β‖∇θ L(x)‖`, which needs one gradient norm per candidate.
The authors' implementation runs one forward and one backward per
candidate in a Python loop; leakjax scores all C candidates in one jitted
call (`leakjax.attacks.film.reorder.candidate_scores`, `vmap` of
`value_and_grad`). Both sides here compute exactly the same quantity on the
same weights (ours exported with `leakjax.models.save`, loaded in
transformers):

* the gradient of each candidate's mean next-token loss with respect to the
  reorder scorer's parameter subset (`reorder.default_grad_paths`: the last
  transformer block and the final norm), the torch side with
  `torch.autograd.grad` on just those tensors (other parameters have
  `requires_grad=False`, so autograd does no work for them);
* the perplexity `exp(loss)` from the same forward pass.

Candidates are C random edits (swap / delete / insert / phrase moves) of one
sentence, so their lengths differ; ours pads them to one width and masks,
torch runs each at its exact length. We check that the norms and
perplexities agree, then time both interleaved and report candidates/s and
achieved FLOP/s (forward + backward through the head and the last block,
`benchmarks.peak`) beside the measured peak.

Run alone: `python -m benchmarks.grad_norms_vs_torch --quick --out=DIR`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from benchmarks import beam_search_vs_hf as beam_bench
from benchmarks import peak as peak_lib
from leakjax.attacks.film import reorder
from leakjax.io import atomic_write_text, jsonable, summary_key

BENCH = 'grad_norms'


@dataclasses.dataclass(frozen=True)
class Settings:
  """What to run.

  Attributes:
    models: model names of `benchmarks.beam_search_vs_hf.MODEL_NAMES`; the
      first is the headline.
    num_candidates: C values; the first is the headline (FILM's reorder
      scores 16 candidates per step by default).
    sentence_tokens: length of the base sentence (BOS included).
    repeats: timed rounds per contender after one warm-up.
    rtol: relative tolerance of the norm / perplexity agreement.
    film_peer: also time the loop as FILM's code runs it (a backward
      through every parameter per candidate); reported beside, never as
      the headline.
    seed: candidate edits.
    data: sentences as in the beam-search benchmark.
  """

  models: tuple[str, ...] = ('gpt2-mini',)
  num_candidates: tuple[int, ...] = (16, 64)
  sentence_tokens: int = 32
  repeats: int = 3
  rtol: float = 2e-3
  film_peer: bool = True
  seed: int = 0
  data: str | None = str(beam_bench.DEFAULT_DATA)


QUICK = Settings(num_candidates=(16,), repeats=4)
FULL = Settings(
  models=('gpt2-small', 'smollm2-135m'), num_candidates=(16,), repeats=2
)
TINY = Settings(
  models=('gpt2-tiny',),
  num_candidates=(16,),
  sentence_tokens=16,
  repeats=2,
  data=None,
)


# --------------------------------------------------------------- workload
def base_sentence(model, settings: Settings) -> np.ndarray:
  """One sentence of `sentence_tokens` ids (BOS first when there is one)."""
  n = settings.sentence_tokens
  tok = model.tokenizer
  if tok is None:
    rng = np.random.default_rng(settings.seed)
    return rng.integers(1, model.vocab_size, n).astype(np.int32)
  texts, _ = beam_bench._sentences(settings.data, 64, settings.seed)  # pylint: disable=protected-access
  ids = [tok.bos_id] if tok.bos_id is not None else []
  for text in texts:  # concatenate sentences until long enough
    ids += tok.encode(' ' + text if len(ids) > 1 else text)
    if len(ids) >= n:
      break
  return np.asarray(ids[:n], np.int32)


def make_candidates(
  sentence: np.ndarray, num: int, *, seed: int, fixed: int = 2
) -> tuple[np.ndarray, np.ndarray]:
  """C edited copies of `sentence` (FILM Sec. 4.4 moves), zero padded.

  Returns:
    `(ids int32 [C, W], mask int32 [C, W])` with W = len(sentence) + 1.
  """
  rng = np.random.default_rng(seed)
  n = len(sentence)
  width = n + 1
  ids = np.zeros((num, width), np.int32)
  mask = np.zeros((num, width), np.int32)
  for c in range(num):
    s = list(sentence)
    op = c % 4
    i, j = sorted(rng.choice(np.arange(fixed, len(s)), 2, replace=False))
    if op == 0:  # swap two tokens
      s[i], s[j] = s[j], s[i]
    elif op == 1:  # delete one
      del s[i]
    elif op == 2:  # insert a token of the sentence elsewhere
      s.insert(i, s[j])
    else:  # move a phrase
      s = s[:i] + s[j:] + s[i:j]
    ids[c, : len(s)] = s
    mask[c, : len(s)] = 1
  return ids, mask


# ------------------------------------------------------------- contenders
def _ours_fn(model, params):
  """`(params, ids, mask) -> (norms, ppl)`, the subset, the implementation."""
  del params  # the subset is declared by the model
  grad_paths = reorder.default_grad_paths(model)

  def fn(params, ids, mask):
    _, ppl, norms = reorder.candidate_scores(
      model, params, ids, mask, beta=1.0, grad_paths=grad_paths
    )
    return norms, ppl

  return jax.jit(fn), grad_paths, 'reorder.candidate_scores'


def hf_parameter_names(model, grad_paths) -> list[str]:
  """The transformers names of the parameters under `grad_paths`."""
  if model.family == 'gpt2':
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

    specs = gpt2.hf_name_map(model.config)
  elif model.family == 'llama':
    from leakjax.models import llama  # pylint: disable=g-import-not-at-top

    specs = llama.hf_name_map(model.config)
  else:
    raise ValueError(f'no torch peer for family {model.family}')
  names = []
  for name, spec in specs.items():
    if any(tuple(spec.path[: len(p)]) == tuple(p) for p in grad_paths):
      names.append(name)
  return names


def make_torch_loop(
  hf_model,
  names: Sequence[str],
  ids: np.ndarray,
  mask: np.ndarray,
  *,
  full_backward: bool = False,
):
  """A thunk: one forward + `autograd.grad` per candidate, in a loop.

  Args:
    hf_model: the transformers model.
    names: parameters whose gradient norm is wanted.
    ids, mask: the candidates; each runs at its own length.
    full_backward: differentiate every parameter and take the norm over
      `names` only, as FILM's reorder.py does (its `get_grad_gpt2` returns
      all gradients, the score reads one layer's); False: only `names`
      require gradients (the same work as ours).
  """
  import torch  # pylint: disable=g-import-not-at-top

  params = dict(hf_model.named_parameters())
  if hf_model.config.tie_word_embeddings:  # tied head: one tensor, two names
    params.setdefault('lm_head.weight', hf_model.get_output_embeddings().weight)
  missing = [n for n in names if n not in params]
  if missing:
    raise KeyError(f'torch model lacks {missing}')
  wanted = [params[n] for n in names]
  wanted_ids = {id(p) for p in wanted}
  if full_backward:
    differentiated = list(hf_model.parameters())
  else:
    differentiated = wanted
  pick = [i for i, p in enumerate(differentiated) if id(p) in wanted_ids]
  rows = [
    torch.as_tensor(r[m.astype(bool)][None], dtype=torch.long)
    for r, m in zip(ids, mask)
  ]

  def thunk():
    for p in hf_model.parameters():
      p.requires_grad_(full_backward or id(p) in wanted_ids)
    norms, ppls = [], []
    for x in rows:
      logits = hf_model(input_ids=x, use_cache=False).logits[0, :-1]
      loss = torch.nn.functional.cross_entropy(logits.float(), x[0, 1:])
      grads = torch.autograd.grad(loss, differentiated)
      norms.append(
        torch.sqrt(sum((grads[i] * grads[i]).sum() for i in pick)).item()
      )
      ppls.append(float(torch.exp(loss.detach())))
    return np.asarray(norms), np.asarray(ppls)

  return thunk


def problem_flops(model, mask: np.ndarray, grad_paths) -> float:
  """Forward + backward matmul FLOPs of all candidates at their lengths."""
  shape = peak_lib.shape_of(model)
  last = None if grad_paths == ((),) else 1
  total = 0.0
  for n in mask.sum(-1):
    total += peak_lib.forward_flops(shape, int(n))
    total += peak_lib.backward_flops(shape, int(n), last_layers=last)
  return total


# ------------------------------------------------------------------- cases
def run_case(
  model, params, hf_model, name: str, num: int, settings: Settings
) -> dict[str, Any]:
  sentence = base_sentence(model, settings)
  ids, mask = make_candidates(sentence, num, seed=settings.seed)
  fn, grad_paths, impl = _ours_fn(model, params)
  names = hf_parameter_names(model, grad_paths)
  jids, jmask = jnp.asarray(ids), jnp.asarray(mask)

  def ours():
    return jax.block_until_ready(fn(params, jids, jmask))

  contenders = {
    'ours': ours,
    'torch': make_torch_loop(hf_model, names, ids, mask),
  }
  if settings.film_peer:
    contenders['torch_full'] = make_torch_loop(
      hf_model, names, ids, mask, full_backward=True
    )
  start = time.perf_counter()
  norms, ppl = (np.asarray(x) for x in ours())
  compile_s = time.perf_counter() - start
  err_norm = err_ppl = 0.0
  for name_, fn_ in contenders.items():
    if name_ == 'ours':
      continue
    t_norms, t_ppl = fn_()
    err_norm = max(
      err_norm, float(np.max(np.abs(norms - t_norms) / np.abs(t_norms)))
    )
    err_ppl = max(err_ppl, float(np.max(np.abs(ppl - t_ppl) / np.abs(t_ppl))))
  cpu: dict[str, list[float]] = {}
  times = peak_lib.time_interleaved(
    contenders, repeats=settings.repeats, warmup=0, cpu_times=cpu
  )
  t_ours, t_torch = (peak_lib.median(times[n]) for n in ('ours', 'torch'))
  c_ours, c_torch = (peak_lib.median(cpu[n]) for n in ('ours', 'torch'))
  flops = problem_flops(model, mask, grad_paths)
  full = {}
  if 'torch_full' in times:
    t_full = peak_lib.median(times['torch_full'])
    full = {
      'seconds_torch_full': times['torch_full'],
      'median_s_torch_full': t_full,
      'speedup_vs_full_backward': t_full / t_ours,
      'median_cpu_s_torch_full': peak_lib.median(cpu['torch_full']),
      'speedup_cpu_vs_full_backward': (
        peak_lib.median(cpu['torch_full']) / c_ours
      ),
      'candidates_per_s_torch_full': num / t_full,
    }
  return {
    'model': name,
    'candidates': num,
    'width': int(ids.shape[1]),
    'mean_length': float(mask.sum(-1).mean()),
    'implementation': impl,
    'grad_paths': ['/'.join(p) for p in grad_paths],
    'grad_params': int(
      sum(
        np.prod(v.shape)
        for k, v in traverse_util.flatten_dict(params).items()
        if any(k[: len(p)] == tuple(p) for p in grad_paths)
      )
    ),
    'torch_tensors': len(names),
    'max_rel_err_norm': err_norm,
    'max_rel_err_ppl': err_ppl,
    'match': int(err_norm <= settings.rtol and err_ppl <= settings.rtol),
    'seconds_ours': times['ours'],
    'seconds_torch': times['torch'],
    'median_s_ours': t_ours,
    'median_s_torch': t_torch,
    'compile_s_ours': compile_s,
    'cpu_seconds_ours': cpu['ours'],
    'cpu_seconds_torch': cpu['torch'],
    'median_cpu_s_ours': c_ours,
    'median_cpu_s_torch': c_torch,
    'speedup': t_torch / t_ours,
    'speedup_cpu': c_torch / c_ours,
    'candidates_per_s_ours': num / t_ours,
    'candidates_per_s_torch': num / t_torch,
    'flops': flops,
    'flops_per_s_ours': flops / t_ours,
    'flops_per_s_torch': flops / t_torch,
    **full,
  }


def summarize(rows, settings: Settings, peak: dict) -> dict[str, float]:
  out: dict[str, float] = {}
  for r in rows:
    p = dict(bench=BENCH, candidates=r['candidates'], model=r['model'])
    out[summary_key('speedup', **p)] = r['speedup']
    out[summary_key('speedup_cpu', **p)] = r['speedup_cpu']
    if 'speedup_vs_full_backward' in r:
      out[summary_key('speedup', peer='full_backward', **p)] = r[
        'speedup_vs_full_backward'
      ]
      out[summary_key('speedup_cpu', peer='full_backward', **p)] = r[
        'speedup_cpu_vs_full_backward'
      ]
    out[summary_key('match', **p)] = r['match']
    out[summary_key('candidates_per_s_ours', **p)] = r['candidates_per_s_ours']
    out[summary_key('candidates_per_s_torch', **p)] = r[
      'candidates_per_s_torch'
    ]
    out[summary_key('flops_frac_peak_ours', **p)] = (
      r['flops_per_s_ours'] / peak['peak_flops']
    )
    out[summary_key('flops_frac_peak_torch', **p)] = (
      r['flops_per_s_torch'] / peak['peak_flops']
    )
  head = [
    r
    for r in rows
    if r['model'] == settings.models[0]
    and r['candidates'] == settings.num_candidates[0]
  ]
  if head:
    out[summary_key('speedup', bench=BENCH)] = head[0]['speedup']
    out[summary_key('speedup_cpu', bench=BENCH)] = head[0]['speedup_cpu']
    if 'speedup_vs_full_backward' in head[0]:
      out[summary_key('speedup', bench=BENCH, peer='full_backward')] = head[0][
        'speedup_vs_full_backward'
      ]
      out[summary_key('speedup_cpu', bench=BENCH, peer='full_backward')] = head[
        0
      ]['speedup_cpu_vs_full_backward']
    out[summary_key('match', bench=BENCH)] = int(all(r['match'] for r in rows))
  return out


def markdown(rows, peak: dict) -> str:
  lines = [
    '| model | C | mean len | grad params | ours s | torch s | speedup |'
    ' CPU-s speedup | torch full-backward s | speedup vs full |'
    ' cand/s ours | cand/s torch | %peak ours | %peak torch | max rel err |',
    '|' + '---|' * 15,
  ]
  for r in rows:
    full_s = r.get('median_s_torch_full')
    full_x = r.get('speedup_vs_full_backward')
    lines.append(
      f'| {r["model"]} | {r["candidates"]} | {r["mean_length"]:.1f} |'
      f' {r["grad_params"]:,} | {r["median_s_ours"]:.3f} |'
      f' {r["median_s_torch"]:.3f} | {r["speedup"]:.1f}x |'
      f' {r["speedup_cpu"]:.1f}x |'
      f' {"-" if full_s is None else f"{full_s:.3f}"} |'
      f' {"-" if full_x is None else f"{full_x:.1f}x"} |'
      f' {r["candidates_per_s_ours"]:.1f} | {r["candidates_per_s_torch"]:.1f} |'
      f' {100 * r["flops_per_s_ours"] / peak["peak_flops"]:.1f} |'
      f' {100 * r["flops_per_s_torch"] / peak["peak_flops"]:.1f} |'
      f' {max(r["max_rel_err_norm"], r["max_rel_err_ppl"]):.1e} |'
    )
  return '\n'.join(lines) + '\n'


def run(
  quick: bool = True,
  *,
  settings: Settings | None = None,
  peak: dict | None = None,
  log=print,
) -> dict[str, Any]:
  import torch  # pylint: disable=g-import-not-at-top

  settings = settings or (QUICK if quick else FULL)
  peak = peak or peak_lib.measure_peak(1024 if quick else 2048)
  rows = []
  for name in settings.models:
    model, params, hf_model = beam_bench.load_pair(name)
    for num in settings.num_candidates:
      row = run_case(model, params, hf_model, name, num, settings)
      rows.append(row)
      log(
        f'[grad_norms] {name} C={num}: ours {row["median_s_ours"]:.3f}s'
        f' torch {row["median_s_torch"]:.3f}s -> {row["speedup"]:.1f}x'
        f' (max rel err {row["max_rel_err_norm"]:.1e})'
      )
    del hf_model, model, params
  return {
    'bench': BENCH,
    'settings': dataclasses.asdict(settings),
    'peak': peak,
    'torch_threads': torch.get_num_threads(),
    'rows': rows,
    'summary': summarize(rows, settings, peak),
    'markdown': markdown(rows, peak),
  }


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true')
  parser.add_argument('--tiny', action='store_true')
  parser.add_argument('--models', default=None)
  parser.add_argument('--candidates', default=None)
  parser.add_argument('--out', default=None)
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
  if args.models:
    settings = dataclasses.replace(
      settings, models=tuple(args.models.split(','))
    )
  if args.candidates:
    settings = dataclasses.replace(
      settings, num_candidates=tuple(int(x) for x in args.candidates.split(','))
    )
  result = run(args.quick, settings=settings)
  print(result['markdown'])
  if args.out:
    atomic_write_text(
      Path(args.out) / f'{BENCH}.json',
      json.dumps(jsonable(result), indent=2, sort_keys=True),
    )


if __name__ == '__main__':
  main()
