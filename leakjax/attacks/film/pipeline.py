"""FILM: recover private sentences from a federated gradient (Gupta et al. 2022).

The pipeline of Sec. 4, on one observed gradient and the model θ^t it was
taken at:

1. bag of words (Sec. 4.2, :mod:`leakjax.recovery.bag`, shared with
   DAGER's hybrid);
2. beam search over the bag from capitalised start words (Sec. 4.3,
   :func:`leakjax.attacks.film.beam_search.bag_beam_search`), repeated with a
   penalty on the n-grams of earlier results to recover several sentences
   (Sec. 4.5);
3. prior-guided reordering of each result (Sec. 4.4,
   :mod:`leakjax.attacks.film.reorder`).

>>> model, params = leakjax.models.load('smollm2-135m')       # doctest: +SKIP
>>> result = recover(model, params, grads, config=FilmAttackConfig(),
...                  key=jax.random.key(0))                   # doctest: +SKIP
>>> result.sentences[0]                                       # +SKIP
'Volume mgmt is trying to clear up these issues.'

:func:`recover`'s host loop jits each kernel once (:func:`leakjax._jit.jitted`)
with the model, the configs and the mesh static (a model hashes by value
and holds no weights), so attacking many batches, or new parameters of the
same shapes, compiles each kernel once per bag size bucket (bags are padded
to a multiple of `bag_bucket`).

On several devices, `recover(..., mesh=make_mesh('data:N'))` splits the
beams of the search and the candidates of each reordering step over the N
devices (parameters replicated); the recovered sentences are the same.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.sharding import Mesh

from leakjax import checks, sharding
from leakjax._jit import jitted
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, get_path
from leakjax.recovery import bag as bow
from leakjax.tokenization import sentence_end_mask

PyTree = Any


SENTENCE_ENDS = ('silent', 'always', 'never')


@dataclasses.dataclass(frozen=True)
class FilmAttackConfig:
  """The attack's settings (hashable).

  Attributes:
    bag_method: see :func:`leakjax.recovery.bag.extract_bag`.
    tied: thresholds of the tied-embedding bag method.
    beam: beam-search settings (FILM Sec. 4.3, 7: k = 32, n = 2).
    reorder: reordering settings (Sec. 4.4); None skips reordering.
    prompt_mode: 'capital' (BOS + capitalised bag tokens, Sec. 4.3) or
      'bos' (BOS only).
    prompts_per_search: prompts that share one search's beams; 0 puts all
      prompts in one pool (Alg. 1, π¹ = P), 1 gives each its own k beams.
    max_prompts: at most this many prompts (those whose first token has the
      highest log-probability after BOS); None: all.
    repetitions: beam searches per batch (Sec. 4.5); each later one
      penalises the n-grams of the earlier results.
    reorder_top: how many results (in order) to reorder.
    use_bos: prompts start with the tokenizer's BOS (as the client's
      training data does).
    bag_bucket: pad the bag to a multiple of this (fewer recompilations).
      The padding is masked and changes no beam, score or reordering
      (`tests/beam_search_test.py`, `tests/reorder_test.py`); a bucket
      wide enough for the bags of every batch size an experiment sweeps
      compiles the search and the reordering once per buffer, not once
      per batch size (`bag-bucket-*` runs in
      `benchmarks/results/reorder_stages_quickstart.json`).
    grad_paths: parameter subset of the reordering gradient norm; None:
      :func:`leakjax.attacks.film.reorder.default_grad_paths`.
    sentence_ends: when to search over the bag plus the vocabulary's
      one-character sentence ends ('.', '!', '?', with or without a
      leading space): 'silent' when the gradient of the word embeddings
      (and of an untied head) is zero everywhere, as under FILM's
      frozen-embedding defense (Sec. 5); 'always'; 'never' (the paper's
      attack). Our decision, not the paper's: a bag from a silent head
      comes from the span test, which sees model inputs only, and each
      sentence's last token is a target, never an input, so without these
      tokens the beam search could never end a sentence. 'always' gives an
      undefended gradient the same tokens, for a like-for-like comparison
      with the defense. The bag itself (FilmResult.bag) stays what the
      gradient gave.
  """

  bag_method: str = 'auto'
  tied: bow.TiedBagConfig = bow.TiedBagConfig()
  beam: bs.BeamSearchConfig = bs.BeamSearchConfig()
  reorder: ro.ReorderConfig | None = ro.ReorderConfig()
  prompt_mode: str = 'capital'
  prompts_per_search: int = 0
  max_prompts: int | None = 64
  repetitions: int = 1
  reorder_top: int = 1
  use_bos: bool = True
  bag_bucket: int = 256
  grad_paths: tuple[tuple[str, ...], ...] | None = None
  sentence_ends: str = 'silent'

  def __post_init__(self):
    if self.sentence_ends not in SENTENCE_ENDS:
      raise LeakjaxError(
        f'unknown sentence_ends {self.sentence_ends!r}',
        f'use one of {", ".join(SENTENCE_ENDS)}',
      )


@dataclasses.dataclass
class Recovery:
  """One recovered sentence.

  Attributes:
    text: the final sentence (after reordering, if any).
    tokens: its token ids (with the prompt/BOS).
    beam_text: the beam-search sentence before reordering.
    beam_score: its Alg. 1 score.
    prior_score: S(x) of Eq. 4 after reordering (None without).
    initial_prior_score: S(x) of the beam sentence (None without).
  """

  text: str
  tokens: list[int]
  beam_text: str
  beam_score: float
  prior_score: float | None = None
  initial_prior_score: float | None = None


@dataclasses.dataclass
class FilmResult:
  """What :func:`recover` returns.

  Attributes:
    bag: the recovered bag of words.
    recoveries: one :class:`Recovery` per repetition, in order (the first
      is FILM's single-sentence answer).
    num_prompts: how many start prompts were searched.
    sentence_ends: token ids searched beside the bag
      (`FilmAttackConfig.sentence_ends`); empty when none were added.
    seconds: wall seconds of each stage: `bag` (absent when the caller
      passed the bag), `search` (ranking the prompts and the beam
      searches) and `reorder` (absent without reordering); compilation
      included where a stage compiles.
  """

  bag: bow.Bag
  recoveries: list[Recovery]
  num_prompts: int
  sentence_ends: tuple[int, ...] = ()
  seconds: dict[str, float] = dataclasses.field(default_factory=dict)

  @property
  def sentences(self) -> list[str]:
    return [r.text for r in self.recoveries]


# ------------------------------------------- kernels (jitted by `recover`)
# Beam-search and reordering buffers are padded to a multiple of this many
# tokens, so that batches of different lengths share one compilation. A
# wider bucket compiles less often but pads more: the reordering's cost is
# linear in its buffer (C candidates' gradients over every position).
_LENGTH_BUCKET = 8


_BEAM_SEARCH_STATIC = ('model', 'config', 'mesh')
_REORDER_STATIC = ('model', 'config', 'grad_paths', 'mesh')


def _beam_search(
  model: Model,
  params: PyTree,
  prompts,
  bag_ids,
  *,
  prompt_mask,
  bag_mask,
  prior,
  prior_lengths,
  num_steps,
  config: bs.BeamSearchConfig,
  mesh: Mesh | None,
) -> bs.BeamResult:
  return bs.bag_beam_search(
    model,
    params,
    prompts,
    bag_ids,
    config=config,
    prompt_mask=prompt_mask,
    bag_mask=bag_mask,
    prior=prior,
    prior_lengths=prior_lengths,
    mesh=mesh,
    num_steps=num_steps,
  )


def _reorder(
  model: Model,
  params: PyTree,
  tokens,
  length,
  bag_ids,
  *,
  key,
  is_end,
  bag_mask,
  max_length,
  config: ro.ReorderConfig,
  grad_paths,
  mesh: Mesh | None,
  state: ro.ReorderState,
  stop,
) -> ro.ReorderState:
  return ro.reorder(
    model,
    params,
    tokens,
    length,
    bag_ids,
    key=key,
    config=config,
    is_end=is_end,
    bag_mask=bag_mask,
    grad_paths=grad_paths,
    mesh=mesh,
    max_length=max_length,
    state=state,
    stop=stop,
  )


def _token_log_probs(model: Model, params: PyTree, ids):
  return model.token_log_probs(params, ids)


def _bucket_length(model: Model, prompt_length: int, steps: int) -> int:
  """The beam buffer's generated length: `steps` rounded up to a multiple
  of _LENGTH_BUCKET, within the model's longest sequence."""
  length = -(-steps // _LENGTH_BUCKET) * _LENGTH_BUCKET
  if model.max_length is not None:
    length = min(length, max(steps, model.max_length - prompt_length))
  return length


def _pad(ids: np.ndarray, bucket: int) -> tuple[np.ndarray, np.ndarray]:
  m = max(1, -(-len(ids) // bucket) * bucket)
  out = np.zeros((m,), np.int32)
  mask = np.zeros((m,), bool)
  out[: len(ids)] = ids
  mask[: len(ids)] = True
  if len(ids):
    out[len(ids) :] = ids[0]
  return out, mask


def _rank_prompts(
  model: Model, params, prompts: list[list[int]], limit: int | None
) -> list[list[int]]:
  """Keeps the `limit` prompts the model finds likeliest."""
  if limit is None or len(prompts) <= limit:
    return prompts
  # Rows padded to a multiple of 64 (one compilation for most batches).
  rows = -(-len(prompts) // 64) * 64
  ids = np.asarray(prompts + [prompts[0]] * (rows - len(prompts)), np.int32)
  log_probs = jitted(_token_log_probs, static_argnames=('model',))
  logp = log_probs(model, params, jnp.asarray(ids)).sum(-1)
  order = np.argsort(-np.asarray(logp)[: len(prompts)], kind='stable')
  order = order[:limit]
  return [prompts[i] for i in sorted(order)]


def recover(
  model: Model,
  params: PyTree,
  grads: PyTree,
  *,
  config: FilmAttackConfig,
  key: jax.Array,
  noise_std: float | None = None,
  bag: bow.Bag | None = None,
  mesh: Mesh | None = None,
) -> FilmResult:
  """Runs FILM on one observed gradient.

  Args:
    model: the attacked model (with its tokenizer).
    params: θ^t, where the client took the gradient.
    grads: the observed gradient (pytree like `params`).
    config: a :class:`FilmAttackConfig`.
    key: a `jax.random.key` (reordering).
    noise_std: per-coordinate DP noise std, for the DP bag threshold.
    bag: use this bag instead of extracting one (ablations).
    mesh: optional `jax.sharding.Mesh` with a `'data'` axis of N devices
      (:func:`leakjax.sharding.make_mesh`). The beam search splits its k
      beams over it and each reordering step its C candidates; the
      parameters are replicated (bag extraction runs unsharded). k and C
      need not be multiples of N: the kernels pad with rows whose results
      are dropped (idle devices, never different results), so choose
      `--num_beams` / `--reorder_candidates` as multiples of N to use
      every device. Results equal the unsharded run (scores up to float32
      rounding).

  Returns:
    A :class:`FilmResult`.
  """
  sharding.check_data_axis(mesh)
  tok = model.tokenizer
  if tok is None:
    raise LeakjaxError(
      'FILM needs the model tokenizer (capitalised prompts and decoding)',
      'load the model with its tokenizer',
    )
  checks.check_inputs(
    model,
    params,
    grads,
    attack='FILM',
    tokenizer=('bos_id', 'decode', 'token_strings'),
  )
  seconds = {}
  start = time.perf_counter()
  if bag is None:
    bag = bow.extract_bag(
      model,
      params,
      grads,
      method=config.bag_method,
      noise_std=noise_std,
      config=config.tied,
    )
    seconds['bag'] = time.perf_counter() - start
    start = time.perf_counter()
  bag_ids = [int(i) for i in bag.ids if i != tok.bos_id]
  if not bag_ids:
    raise LeakjaxError(
      'the recovered bag of words is empty',
      'the gradient carries no embedding information (frozen embeddings?)',
    )
  ends = ()
  if config.sentence_ends == 'always' or (
    config.sentence_ends == 'silent' and _silent_token_gradients(model, grads)
  ):
    ends = tuple(sorted(set(sentence_end_ids(tok)) - set(bag_ids)))
    bag_ids = sorted(bag_ids + list(ends))
  prompts = bs.make_prompts(
    tok, bag_ids, use_bos=config.use_bos, mode=config.prompt_mode
  )
  prompts = _rank_prompts(model, params, prompts, config.max_prompts)
  # The sharded kernels below read the parameters on every device (a
  # no-op copy if the caller replicated them already).
  params = sharding.replicate(params, mesh)
  # One pool (Alg. 1) is padded to a multiple of 8 prompts, fewer shapes.
  per_search = config.prompts_per_search or -(-len(prompts) // 8) * 8
  prompt_arr, prompt_mask = bs.prompt_batches(prompts, per_search=per_search)
  beam_cfg = config.beam
  num_steps = beam_cfg.length
  if bag.max_length is not None:  # Sec. 4.2: the longest sentence's length
    num_steps = max(1, bag.max_length - prompt_arr.shape[-1])
    # The length is traced: the search compiles once per buffer bucket.
    beam_cfg = dataclasses.replace(
      beam_cfg, length=_bucket_length(model, prompt_arr.shape[-1], num_steps)
    )
  bag_arr, bag_mask = _pad(np.asarray(bag_ids, np.int32), config.bag_bucket)
  width = prompt_arr.shape[-1] + num_steps  # the searched sentences' length
  buffer = prompt_arr.shape[-1] + beam_cfg.length
  prior = np.zeros((max(1, config.repetitions), buffer), np.int32)
  prior_len = np.zeros((max(1, config.repetitions),), np.int32)
  beam_search = jitted(_beam_search, static_argnames=_BEAM_SEARCH_STATIC)
  recoveries = []
  logging.info(
    'FILM: bag of %d tokens, %d prompts; beam search of %d beams, %d steps',
    len(bag_ids),
    len(prompts),
    beam_cfg.num_beams,
    num_steps,
  )
  for rep in range(config.repetitions):
    use_prior = config.repetitions > 1
    out = beam_search(
      model,
      params,
      jnp.asarray(prompt_arr),
      jnp.asarray(bag_arr),
      prompt_mask=jnp.asarray(prompt_mask),
      bag_mask=jnp.asarray(bag_mask),
      prior=jnp.asarray(prior) if use_prior else None,
      prior_lengths=jnp.asarray(prior_len) if use_prior else None,
      num_steps=jnp.asarray(num_steps, jnp.int32),
      config=beam_cfg,
      mesh=mesh,
    )
    best = bs.best_sequences(out, top=1)
    if not best:
      raise LeakjaxError(
        'beam search found no sentence',
        'the bag is too small for the requested length',
      )
    score, tokens = best[0]
    tokens = tokens[:width]  # the buffer's unused tail is padding
    prior[rep, : len(tokens)] = tokens
    prior_len[rep] = len(tokens)
    text = _decode(tok, tokens)
    recoveries.append(
      Recovery(text=text, tokens=tokens, beam_text=text, beam_score=score)
    )
  seconds['search'] = time.perf_counter() - start
  start = time.perf_counter()
  if config.reorder is not None:
    logging.info(
      'FILM: beam search done in %.1f s; reordering (%d + %d steps)',
      seconds['search'],
      config.reorder.phrase_steps,
      config.reorder.token_steps,
    )
    rcfg = config.reorder
    fixed = min(rcfg.fixed_prefix, prompt_arr.shape[-1])
    rcfg = dataclasses.replace(rcfg, fixed_prefix=max(1, fixed))
    is_end = jnp.asarray(sentence_end_mask(tok, model.vocab_size))
    reorder = jitted(_reorder, static_argnames=_REORDER_STATIC)
    for i, rec in enumerate(recoveries[: config.reorder_top]):
      # Insertions may add up to 8 tokens. The loop runs in buffers
      # padded to a multiple of _LENGTH_BUCKET, so that sentences of
      # different lengths share a few compilations, and its long stages
      # in buffers as narrow as the sentence allows
      # (`ro.reorder_in_stages`); the result does not depend on the
      # padding (see `ro.reorder`).
      limit = width + 8

      def run(toks, length, state, stop, i=i, limit=limit):
        return reorder(
          model,
          params,
          jnp.asarray(toks),
          jnp.asarray(length, jnp.int32),
          jnp.asarray(bag_arr),
          key=jax.random.fold_in(key, i),
          is_end=is_end,
          bag_mask=jnp.asarray(bag_mask),
          max_length=jnp.asarray(limit, jnp.int32),
          config=rcfg,
          grad_paths=config.grad_paths,
          mesh=mesh,
          state=state,
          stop=jnp.asarray(stop, jnp.int32),
        )

      state = ro.reorder_in_stages(
        run,
        rec.tokens,
        config=rcfg,
        max_length=limit,
        bucket=_LENGTH_BUCKET,
      )
      new = np.asarray(state.tokens)[: int(state.length)].tolist()
      rec.tokens = new
      rec.text = _decode(tok, new)
      rec.prior_score = float(state.score)
      rec.initial_prior_score = float(state.initial_score)
    seconds['reorder'] = time.perf_counter() - start
  return FilmResult(
    bag=bag,
    recoveries=recoveries,
    num_prompts=len(prompts),
    sentence_ends=ends,
    seconds=seconds,
  )


def _silent_token_gradients(model: Model, grads: PyTree) -> bool:
  """Whether the word-embedding (and untied head) gradients are all zero."""
  paths = [model.paths.word_embeddings, model.paths.lm_head]
  return not any(
    np.any(np.asarray(get_path(grads, p))) for p in paths if p is not None
  )


def sentence_end_ids(tokenizer) -> list[int]:
  """Ids of the tokens whose text is '.', '!' or '?' (spaces stripped)."""
  return [
    i
    for i, s in enumerate(tokenizer.token_strings())
    if s.strip() in ('.', '!', '?')
  ]


def _decode(tokenizer, tokens) -> str:
  return tokenizer.decode(tokens, skip_special=True).strip()


__all__ = [
  'FilmAttackConfig',
  'FilmResult',
  'Recovery',
  'recover',
  'sentence_end_ids',
]
