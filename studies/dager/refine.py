"""The hybrid's kept sentences refined by exact gradient matching.

For each batch of a hybrid run whose rows hold the searched sentences
(`searched_ids`: `--hybrid_oversample > 1` or `--hybrid_cuts`), this
recomputes the batch's gradient and candidates, finds the run's kept
sentences among the searches' cuts (`hybrid.pool_variants`, matched by
their text), and runs :func:`refine` from them: sweeps of single-token
substitutions and deletions, each kept only if it raises the match between
the observed head gradient and the sum of the kept sentences' own (rows
centred and whitened by `hybrid.model_head_transform` unless
`--nowhiten`; `--lm` adds the LM's log-probability). It
records ROUGE before and after (full batch, Porter stemming, as the
experiment scores it), `exact` (the fraction of originals recovered word
for word, as text), the objective after each sweep, and the seconds.

Writes `refine.json` beside the results after each batch; a re-run
computes only the batches it lacks.

The refinement does not help (`reports/dager/hybrid_cuts/refine.json`:
the objective rises while ROUGE-L does not), so it left the library and
lives here with its study.
Usage (repository root):
  python -m studies.dager.refine --results=reports/dager/hybrid_cuts/results.jsonl
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax import metrics
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.models.protocol import Model
from leakjax.recovery import bag as bow
from leakjax.tokenization import sentence_end_mask
from studies.dager.study import load_run, run_batches

PyTree = Any


def cos2_match(num, den):
  """`cos²` up to the target's norm: `num² / den` where `num > 0`."""
  return jnp.where(num > 0, num**2 / jnp.maximum(den, 1e-30), -jnp.inf)


@jax.jit
def match_gradient(
  total: jax.Array,
  target: jax.Array,
  weights: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """The selection's objective and its gradient in the raw rows.

  `m(S) = ⟨S, T⟩² / ⟨S, S⟩` with `⟨A, B⟩ = Σ_c w_c² ⟨A_c, B_c⟩`: the
  squared cosine between the weighted rows of `total` (S, the sum of the
  kept sentences' own rows) and of `target` (T, the observed ones), times
  `⟨T, T⟩` (:func:`select_from_gram` maximises the same; `−inf` where
  `⟨S, T⟩ <= 0`).
  """
  w2 = (weights.astype(jnp.float32) ** 2)[:, None]
  num = jnp.sum(w2 * total * target)
  den = jnp.maximum(jnp.sum(w2 * total * total), 1e-30)
  grad = w2 * (2.0 * num / den * target - 2.0 * num**2 / den**2 * total)
  return cos2_match(num, den), grad


@jax.jit
def match_values(
  totals: jax.Array,
  target: jax.Array,
  weights: jax.Array,
) -> jax.Array:
  """:func:`match_gradient`'s objective for each of several sums."""
  w2 = (weights.astype(jnp.float32) ** 2)[None, :, None]
  num = jnp.sum(w2 * totals * target[None], axis=(1, 2))
  den = jnp.sum(w2 * totals * totals, axis=(1, 2))
  return cos2_match(num, den)


@functools.partial(jax.jit, static_argnames=('model',))
def edit_gains(
  model: Model,
  params: PyTree,
  tokens: jax.Array,
  length: jax.Array,
  candidates: jax.Array,
  valid: jax.Array,
  is_end: jax.Array,
  slot: jax.Array,
  readout: jax.Array,
  direction: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """First-order gains of one sentence's single-token edits.

  A sentence adds `h_{j−1}` (the head input after its first j tokens) to
  the raw row of its token j (the head rows of one sentence; the softmax
  part and the tied head's input part aside). With `D` the objective's
  gradient in the rows (:func:`match_gradient`) and `s[i, c] = ⟨D_c,
  h_i⟩`:

  * `sub[j, c] = s[j−1, c] − s[j−1, t_j]`: token j replaced by
    candidate c. The last token (a sentence end) only by another end,
    the others only by tokens that end no sentence;
  * `dele[j] = s[j−1, t_{j+1}] − s[j−1, t_j] − s[j, t_{j+1}]`: token j
    deleted, so `t_{j+1}` follows the shorter context; for `1 <= j <=
    length − 2` (BOS and the end stay).

  Later contexts move too; that is left to the exact check
  (:func:`refine`). Invalid edits are `−inf`. `slot[v]` is v's index
  in `candidates` (−1: none, which counts 0).
  """
  pos = jnp.arange(tokens.shape[0])
  mask = (pos < length).astype(jnp.int32)
  z = model.logits(params, tokens[None], mask[None])[0].astype(jnp.float32)
  s = (z @ readout) @ direction.T  # [L, C]
  idx = slot[tokens]

  def own(values, index):
    picked = jnp.take_along_axis(values, jnp.maximum(index, 0)[:, None], 1)
    return jnp.where(index >= 0, picked[:, 0], 0.0)

  before = jnp.roll(s, 1, axis=0)  # before[j] = s[j − 1]
  current = own(before, idx)
  last = (pos == length - 1)[:, None]
  ok = ((pos >= 1) & (pos < length))[:, None] & valid[None]
  ok = ok & jnp.where(last, is_end[None], ~is_end[None])
  ok = ok & (candidates[None] != tokens[:, None])
  sub = jnp.where(ok, before - current[:, None], -jnp.inf)
  following = jnp.roll(idx, -1)
  dele = own(before, following) - current - own(s, following)
  dele = jnp.where((pos >= 1) & (pos < length - 1), dele, -jnp.inf)
  return sub, dele


@functools.partial(jax.jit, static_argnames=('model',))
def sentence_log_probs(
  model: Model,
  params: PyTree,
  tokens: jax.Array,
  lengths: jax.Array,
) -> jax.Array:
  """Each sentence's log-probability under the model, its first token
  (BOS) given."""
  mask = (jnp.arange(tokens.shape[1])[None] < lengths[:, None]).astype(
    jnp.int32
  )
  z = model.logits(params, tokens, mask).astype(jnp.float32)
  logp = jax.nn.log_softmax(z[:, :-1], axis=-1)
  picked = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  return jnp.sum(picked * mask[:, 1:], axis=1)


def sentence_edits(
  sequence: Sequence[int],
  sub: np.ndarray,
  dele: np.ndarray,
  candidates: np.ndarray,
  count: int,
  min_length: int,
) -> list[list[int]]:
  """The `count` edits of `sequence` with the largest gains
  (:func:`edit_gains`), as edited sequences."""
  n = len(sequence)
  if n - 1 < min_length:
    dele = np.full_like(dele, -np.inf)
  gains = np.concatenate([sub.reshape(-1), dele])
  order = np.argsort(-gains, kind='stable')[:count]
  edits = []
  for e in order:
    if not np.isfinite(gains[e]):
      break
    edited = list(sequence)
    if e < sub.size:
      j, c = divmod(int(e), sub.shape[1])
      edited[j] = int(candidates[c])
    else:
      del edited[int(e) - sub.size]
    edits.append(edited)
  return edits


def refine(
  model: Model,
  params: PyTree,
  grads: PyTree,
  sequences: Sequence[Sequence[int]],
  *,
  padded: np.ndarray,
  valid: np.ndarray,
  config: hybrid.HybridConfig,
  sweeps: int = 1,
  proposals: int = 16,
  lm: float = 0.0,
  ends: np.ndarray | None = None,
  transform: jax.Array | None = None,
  progress: Callable[[int, int, float], None] | None = None,
) -> tuple[list[list[int]], dict]:
  """Local search over whole sentences by exact gradient matching.

  The observed head rows are exactly the sum of the batch's sentences'
  own rows (:func:`hybrid.pool_head_gradients`), so a set of recovered
  sentences can be checked as a whole: the selection's objective
  (:func:`match_gradient`) is highest at the batch itself. For
  `sweeps` sweeps, each sentence in turn: its
  `proposals` single-token edits with the largest
  first-order gain (:func:`edit_gains`, :func:`sentence_edits`) get their
  exact rows, and the best one replaces the sentence if it raises the
  objective. Our construction (coordinate ascent over discrete edits
  ranked by a linearisation, as in HotFlip, Ebrahimi et al., ACL 2018,
  applied to a gradient-matching objective as in LAMP, Balunović et al.,
  NeurIPS 2022).

  `transform` maps every row before matching (`rows @ transform`; the
  study passes :func:`hybrid.head_transform` unless `--nowhiten`;
  default: none); rows are weighted by `config.select_weight`; an edit is
  kept if `log m' − log m + lm · (log p' − log p)` is positive, with `m`
  the objective and `log p` the sentence's log-probability under the
  model (`lm` 0: the objective alone). `ends` marks the sentence-ending
  tokens (default: the tokenizer's);
  `progress(sweep, sentence, objective)` is called after each sentence.
  Sweeps stop early when one changes nothing.

  Returns:
    The refined sentences and `{'objective': [m after each sweep, the
    first before any], 'edits': [edits accepted per sweep]}`.
  """
  if ends is None:
    ends = sentence_end_mask(model.tokenizer, model.vocab_size)
  ends = np.asarray(ends, bool)
  candidates = jnp.asarray(padded)
  readout = hybrid.head_readout(model, params)
  pool_rows = jax.jit(hybrid.pool_head_gradients, static_argnames=('model',))
  if transform is None:
    transform = jnp.eye(readout.shape[1])
  transform = jnp.asarray(transform, jnp.float32)
  observed = hybrid.raw_head_rows(model, grads, candidates) @ transform
  weights = jnp.asarray(
    hybrid.selection_weights(np.asarray(observed), valid, config.select_weight)
  )
  slot = np.full(model.vocab_size, -1, np.int32)
  slot[padded[valid]] = np.flatnonzero(valid)
  slot = jnp.asarray(slot)
  is_end = jnp.asarray(ends[padded] & valid)
  valid_j = jnp.asarray(valid)
  width = max(config.max_length, *map(len, sequences))
  chunk = proposals

  def rows_of(seqs):
    tokens = np.zeros((-(-len(seqs) // chunk) * chunk, width), np.int32)
    lengths = np.full(len(tokens), len(seqs[0]), np.int32)
    for i, v in enumerate(seqs):
      tokens[i, : len(v)] = v
      lengths[i] = len(v)
    tokens[len(seqs) :] = tokens[0]
    out = []
    for i in range(0, len(tokens), chunk):
      t = jnp.asarray(tokens[i : i + chunk])
      n = jnp.asarray(lengths[i : i + chunk])
      out.append(
        (
          pool_rows(model, params, t, n, candidates),
          sentence_log_probs(model, params, t, n) if lm else jnp.zeros(len(t)),
        )
      )
    rows = jnp.concatenate([o[0] for o in out])[: len(seqs)] @ transform
    return rows, jnp.concatenate([o[1] for o in out])[: len(seqs)]

  seqs = [list(s) for s in sequences]
  own, logp = rows_of(seqs)
  total = own.sum(0)
  value, _ = match_gradient(total, observed, weights)
  info = {'objective': [float(value)], 'edits': []}
  for sweep in range(sweeps):
    accepted = 0
    for k, seq in enumerate(seqs):
      value, direction = match_gradient(total, observed, weights)
      tokens = np.zeros(width, np.int32)
      tokens[: len(seq)] = seq
      sub, dele = edit_gains(
        model,
        params,
        jnp.asarray(tokens),
        jnp.asarray(len(seq), jnp.int32),
        candidates,
        valid_j,
        is_end,
        slot,
        readout,
        direction @ transform.T,
      )
      edits = sentence_edits(
        seq,
        np.asarray(sub),
        np.asarray(dele),
        padded,
        proposals,
        config.min_length,
      )
      if edits:
        rows, lp = rows_of(edits)
        values = np.asarray(
          match_values(total[None] - own[k][None] + rows, observed, weights)
        )
        with np.errstate(divide='ignore', invalid='ignore'):
          gain = np.log(values / float(value))
        gain = gain + lm * (np.asarray(lp) - float(logp[k]))
        gain = np.where(values > 0, gain, -np.inf)
        best = int(np.argmax(gain))
        if gain[best] > 1e-6:
          total = total - own[k] + rows[best]
          own = own.at[k].set(rows[best])
          logp = logp.at[k].set(lp[best])
          seqs[k] = edits[best]
          accepted += 1
      if progress is not None:
        progress(sweep, k, float(value))
    value, _ = match_gradient(total, observed, weights)
    info['objective'].append(float(value))
    info['edits'].append(accepted)
    if not accepted:
      break
  return seqs, info


@dataclasses.dataclass(frozen=True)
class RefineSettings:
  """The study's settings (its flags).

  Attributes:
    sweeps: sweeps of single-token edits (:func:`refine`).
    proposals: edits per sentence and sweep whose exact gradient is
      computed (the ones with the largest first-order gain).
    select_weight: `HybridConfig.select_weight`; None keeps the run's.
    lm: the weight of the LM's log-probability (:func:`refine`).
    whiten: match the rows centred and whitened (`hybrid.head_transform`).
  """

  sweeps: int = 3
  proposals: int = 16
  select_weight: float | None = None
  lm: float = 0.0
  whiten: bool = True


def scores(originals, texts):
  m = metrics.rouge_matrix(originals, texts, stemmer=True)
  out = {k: float(v.max(1).mean()) for k, v in m.items()}
  norm = [' '.join(t.split()) for t in texts]
  out['exact'] = float(
    np.mean([' '.join(o.split()) in norm for o in originals])
  )
  return out


def kept_sentences(model, row, config):
  """The run's kept sentences as token ids: the cut variants of its
  searches whose decoded text is a recovered sentence."""
  tok = model.tokenizer
  cut = dataclasses.replace(config, cuts=True)
  variants, _ = hybrid.pool_variants(model, row['searched_ids'], cut)
  by_text = {}
  for v in variants:
    by_text.setdefault(tok.decode(v, skip_special=True).strip(), v)
  missing = [t for t in row['recovered'] if t not in by_text]
  if missing:
    raise SystemExit(f'{len(missing)} kept sentences are no cut of a search')
  return [by_text[t] for t in row['recovered']]


def study(model, params, cfg, row, settings: RefineSettings) -> dict:
  b = row['b']
  config = runner.hybrid_config(cfg)
  if settings.select_weight is not None:
    config = dataclasses.replace(config, select_weight=settings.select_weight)
  grads, _, _ = client.batch_gradient(
    model, params, row['originals'], b, row['batch'], row['defense'], cfg
  )
  bag = bow.extract_bag(model, params, grads)
  _, padded, valid = hybrid.candidate_tokens(model, params, grads, bag, config)
  start = kept_sentences(model, row, config)
  tok = model.tokenizer
  t0 = time.perf_counter()
  per_sweep = []

  def texts_of(seqs):
    return [tok.decode(s, skip_special=True).strip() for s in seqs]

  transform = None
  if settings.whiten:
    transform = hybrid.model_head_transform(model, params, config)
  refined, info = refine(
    model,
    params,
    grads,
    start,
    padded=padded,
    valid=valid,
    config=config,
    sweeps=settings.sweeps,
    proposals=settings.proposals,
    lm=settings.lm,
    transform=transform,
  )
  seconds = time.perf_counter() - t0
  before = scores(row['originals'], texts_of(start))
  after = scores(row['originals'], texts_of(refined))
  per_sweep.append(info)
  return {
    'b': b,
    'batch': row['batch'],
    'sweeps': settings.sweeps,
    'proposals': settings.proposals,
    'whiten': settings.whiten,
    'lm': settings.lm,
    'select_weight': config.select_weight,
    'run': {k: row[k] for k in ('rouge1', 'rouge2', 'rougeL', 'exact')},
    'before': before,
    'after': after,
    'objective': info['objective'],
    'edits': info['edits'],
    'changed': int(sum(a != s for a, s in zip(refined, start))),
    'words_before': float(np.mean([len(t.split()) for t in texts_of(start)])),
    'words_after': float(np.mean([len(t.split()) for t in texts_of(refined)])),
    'seconds': seconds,
    'recovered': texts_of(refined),
  }


def mean(per: list[dict]) -> dict:
  keys = ('before', 'after', 'run')
  out = {
    k: {m: float(np.mean([p[k][m] for p in per])) for m in per[0][k]}
    for k in keys
  }
  out['seconds'] = float(np.mean([p['seconds'] for p in per]))
  return out


def define_flags() -> None:
  flags.DEFINE_string(
    'results',
    None,
    "A hybrid run's results.jsonl (rows with searched_ids).",
    required=True,
  )
  flags.DEFINE_string(
    'out', None, 'Output JSON (default: refine.json beside --results).'
  )
  flags.DEFINE_integer('sweeps', 3, 'Sweeps of single-token edits.')
  flags.DEFINE_integer(
    'proposals', 16, 'Edits per sentence and sweep checked exactly.'
  )
  flags.DEFINE_float(
    'select_weight', None, "HybridConfig.select_weight (default: the run's)."
  )
  flags.DEFINE_float('lm', 0.0, "Weight of the LM's log-probability.")
  flags.DEFINE_bool(
    'whiten',
    True,
    'Match the rows centred and whitened (hybrid.head_transform).',
  )
  flags.DEFINE_list('batches', None, 'Batch indices to study (default: all).')


def main(argv):
  del argv
  f = flags.FLAGS
  settings = RefineSettings(
    sweeps=f.sweeps,
    proposals=f.proposals,
    select_weight=f.select_weight,
    lm=f.lm,
    whiten=f.whiten,
  )
  cfg, model, params, rows = load_run(f.results)
  if f.batches:
    keep = {int(i) for i in f.batches}
    rows = [r for r in rows if r['batch'] in keep]
  target = Path(f.out or Path(f.results).parent / 'refine.json')
  run_batches(
    rows,
    target,
    lambda row: study(model, params, cfg, row, settings),
    mean,
    shown=lambda p: {k: v for k, v in p.items() if k != 'recovered'},
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
