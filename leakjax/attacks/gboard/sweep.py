"""The attack sweep of the GBoard experiment: every θ1 of one trajectory.

:func:`attack_trajectory` trains (or reloads) one client trajectory and
attacks each θ1 on it, also with single noise (Algorithm 4) added to the
noise-free θ1; :func:`attack` is the attack of one θ1: word recovery
(Algorithm 2, the no-oracle rules, the oracle cut) and sentence
reconstruction (Sec. 3.2) with FedSGD scaling (Sec. 4.3.2) and the keep
rules, one result row per scale.
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from leakjax import io, sharding
from leakjax import metrics as metrics_lib
from leakjax._jit import jitted
from leakjax.attacks.gboard import clients, mixture, thresholds, update
from leakjax.attacks.gboard import reconstruct as reconstruct_lib
from leakjax.fl import defenses as defenses_lib

if TYPE_CHECKING:
  from leakjax.attacks.gboard.runner import GboardConfig


def attack_trajectory(
  model,
  params0,
  ds: clients.Dataset,
  plan: tuple[str, str, float, list[int]],
  cfg: GboardConfig,
  writer: io.ExperimentWriter,
  *,
  key,
  mesh=None,
) -> bool:
  """Attacks every θ1 of one trajectory; its rows go to `writer`.

  Args:
    model: θ0's model (no weights).
    params0: θ0.
    ds: the client's dataset.
    plan: `(batch, noise, sigma, epochs)` from
      :func:`clients.plan_trajectories`.
    cfg: the experiment's config.
    writer: the run's writer; θ1 snapshots go to `<workdir>/snapshots`,
      the bias updates of DPSGD-like runs to `<workdir>/deltas`.
    key: the run's key (`jax.random.key(seed)`); the trajectory's key is
      folded in from its name.
    mesh: places the sentence candidates (see :func:`reconstruct_candidates`).

  Returns:
    False if `writer` already held the trajectory's last row (nothing was
    computed), True otherwise.
  """
  batch, noise, sigma, epochs = plan
  workdir = writer.workdir
  where = dict(
    kind='attack',
    n_k=ds.n_k,
    dataset=ds.index,
    B=batch,
    noise=noise,
    sigma=sigma,
  )
  if writer.done(**where, E=epochs[-1]):
    return False
  name = f'n{ds.n_k}_d{ds.index}_B{batch}_{noise}_{sigma:g}'
  tkey = jax.random.fold_in(key, zlib.crc32(name.encode()) % (1 << 30))
  for e, params1 in clients.snapshots(
    model,
    params0,
    ds.ids,
    cfg,
    batch=batch,
    step_noise=sigma if noise == 'dpsgd' else 0.0,
    epochs=epochs,
    key=tkey,
    folder=workdir / 'snapshots',
    name=name,
  ):
    fedsgd = e == 1 and clients.minibatch_size(batch, ds.n_k) is None
    scales = cfg.scales if (fedsgd and noise == 'none') else (0.0,)
    delta_file = (
      workdir / 'deltas' / f'{name}_E{e}.npy' if noise == 'dpsgd' else None
    )
    for r in attack(
      model,
      params0,
      params1,
      ds,
      cfg,
      scales=scales,
      save_delta=delta_file,
      mesh=mesh,
    ):
      writer.add_result({**where, 'E': e, **r})
    if noise == 'none':
      for i, s in enumerate(cfg.single_sigmas):
        noisy = jax.tree.map(
          jnp.add,
          params1,
          defenses_lib.gaussian_noise_like(
            params1, s, key=jax.random.fold_in(tkey, 1000 * e + i)
          ),
        )
        for r in attack(model, params0, noisy, ds, cfg, mesh=mesh):
          writer.add_result(
            {**where, 'noise': 'single', 'sigma': s, 'E': e, **r}
          )
  return True


def _recover_words_auto(delta, rows, candidates, rows0=None, bias0=None, *, q):
  """:func:`gboard.recover_words_auto`; the sweep jits it with `q` static:
  its EM loop compiles once (twice: with and without θ0's rows), not per
  update."""
  return mixture.recover_words_auto(
    delta, rows, candidates, rows0=rows0, bias0=bias0, q=q
  )


def reconstruct_candidates(
  model,
  params0,
  params1,
  words: np.ndarray,
  *,
  length: int,
  bos_id: int,
  mesh=None,
) -> reconstruct_lib.Reconstruction:
  """:func:`gboard.reconstruct_sentences` (jitted) for the recovered `words`.

  The candidate axis (one start word per recovered word) is padded to a
  power of two, then to a multiple of the mesh's data axis, and placed on
  that axis; θ0, θ1 and the allowed-word mask are replicated. Each
  candidate's generation and score only read its own row, so the result
  equals the one-device result (tested in tests/gboard_test.py).

  Args:
    model: the model (a static argument of the kernel).
    params0: θ0.
    params1: θ1 (or the scaled θ1).
    words: bool `[vocab]`, the recovered words.
    length: words per sentence.
    bos_id: the `<S>` id.
    mesh: a mesh with a 'data' axis, or None for one device.

  Returns:
    The :class:`gboard.Reconstruction` (`scores` -inf on padding).
  """
  count = int(np.count_nonzero(words))
  slots = 1 << max(math.ceil(math.log2(max(count, 1))), 0)
  n = sharding.data_size(mesh)
  starts, valid = reconstruct_lib.padded_indices(words, size=-(-slots // n) * n)
  starts, valid = sharding.shard_batch(
    (jnp.asarray(starts), jnp.asarray(valid)), mesh
  )
  params0, params1, allowed = sharding.replicate(
    (params0, params1, jnp.asarray(words)), mesh
  )
  reconstruct = jitted(
    reconstruct_lib.reconstruct_sentences,
    static_argnames=('model', 'length', 'bos_id'),
  )
  return reconstruct(
    model,
    params0,
    params1,
    starts,
    valid,
    allowed,
    length=length,
    bos_id=bos_id,
  )


def attack(
  model,
  params0,
  params1,
  ds: clients.Dataset,
  cfg: GboardConfig,
  *,
  scales: Sequence[float] = (0.0,),
  reconstruct: bool = True,
  save_delta: Path | None = None,
  mesh=None,
) -> list[dict[str, Any]]:
  """Word recovery and sentence reconstruction on one θ1; rows per scale.

  `model` holds no parameters and compares by value: it is a static
  argument of the jitted kernels, which compile once per shape.
  """
  tok = model.tokenizer
  vocab = tok.words
  vocab_set = set(vocab[2:])
  candidates = thresholds.candidate_mask(
    tok.vocab_size, (tok.unk_id, tok.bos_id)
  )
  delta = update.bias_update(model, params0, params1)
  if save_delta is not None and io.is_primary():
    io.save_npy(save_delta, np.asarray(delta))
  center, scale = thresholds.robust_noise_scale(delta, candidates)
  row: dict[str, Any] = {
    'noise_center': float(center),
    'noise_scale': float(scale),
  }
  masks = {}
  for rule in ('zero', 'fdr', 'universal'):
    thr = thresholds.choose_threshold(
      delta, rule, q=cfg.fdr_q, candidates=candidates
    )
    masks[rule] = np.asarray(thresholds.recover_words(delta, thr, candidates))
    m = metrics_lib.word_metrics(
      [vocab[k] for k in np.flatnonzero(masks[rule])], ds.true_words, vocab_set
    )
    row.update({f'{rule}_{k}': v for k, v in dataclasses.asdict(m).items()})
    row[f'{rule}_threshold'] = float(thr)
  delta_np = np.asarray(delta)
  thr, f1 = thresholds.oracle_threshold(
    delta_np, vocab, ds.true_words, np.asarray(candidates)
  )
  row.update(oracle_threshold=thr, oracle_f1=f1)
  rows_update = update.output_rows_update(model, params0, params1)
  rows0 = update.output_rows(model, params0)
  bias0 = update.output_bias(model, params0)
  recover_auto = jitted(_recover_words_auto, static_argnames=('q',))
  auto = np.asarray(
    recover_auto(
      delta, rows_update, candidates, rows0=rows0, bias0=bias0, q=cfg.fdr_q
    )
  )
  # The same rule with the older row-residual rescue, for comparison.
  old = np.asarray(recover_auto(delta, rows_update, candidates, q=cfg.fdr_q))
  row['rescue_f1'] = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(old)], ds.true_words, vocab_set
  ).f1
  row['num_convex'] = int(
    thresholds.convexity_violations(
      delta, rows_update, rows0, bias0, candidates
    ).sum()
  )
  masks['auto'] = auto
  m = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(auto)], ds.true_words, vocab_set
  )
  row.update({f'auto_{k}': v for k, v in dataclasses.asdict(m).items()})
  row['drift_to_noise'] = float(thresholds.drift_to_noise(delta, candidates))
  row['num_rescued'] = int(
    thresholds.rescued_words(delta, rows_update, candidates).sum()
  )
  # The bias + rows (Stouffer) branch of the auto rule on its own.
  z = thresholds.stouffer_scores(delta, rows_update, candidates)
  thr = thresholds.choose_threshold(
    z, 'fdr', q=cfg.fdr_q, candidates=candidates
  )
  mask = np.asarray(thresholds.recover_words(z, thr, candidates) & (delta > 0))
  row['stouffer_f1'] = metrics_lib.word_metrics(
    [vocab[k] for k in np.flatnonzero(mask)], ds.true_words, vocab_set
  ).f1
  # The best F1 over all cuts of that score among rising biases (uses the
  # truth; tells a weak score from a weak cut).
  z_rose = np.where(np.asarray(delta) > 0, np.asarray(z), -np.inf)
  row['stouffer_oracle_f1'] = thresholds.oracle_threshold(
    z_rose, vocab, ds.true_words, np.asarray(candidates)
  )[1]
  rule = cfg.threshold_rule
  row.update(
    f1=row[f'{rule}_f1'],
    f1_upper=row[f'{rule}_f1_upper'],
    precision=row[f'{rule}_precision'],
    recall=row[f'{rule}_recall'],
  )
  if not reconstruct:
    return [row]
  words = masks[rule]
  rows = []
  if not words.any():
    for s in scales:
      rows.append(
        {
          **row,
          'scale': s,
          'num_candidates': 0,
          'levenshtein': 0.0,
          'levenshtein_recall': 0.0,
          'exact_fraction': 0.0,
          'recon_f1': 0.0,
          'num_kept': 0,
          'examples': [],
          **{
            f'levenshtein_{k}': 0.0
            for k in reconstruct_lib.KEEP_RULES + ('topn',)
          },
        }
      )
    return rows
  num_valid = int(words.sum())
  refs = ds.sentences
  for s in scales:
    p1 = params1 if s == 0 else update.scale_update(params0, params1, s)
    t0 = time.perf_counter()
    out = jax.block_until_ready(
      reconstruct_candidates(
        model,
        params0,
        p1,
        words,
        length=cfg.sentence_length,
        bos_id=tok.bos_id,
        mesh=mesh,
      )
    )
    seconds = time.perf_counter() - t0  # includes a compile per new M
    tokens, scores = sharding.to_host((out.tokens, out.scores))
    as_words = lambda idx, tokens=tokens: [
      tuple(vocab[t] for t in tokens[i, 1:]) for i in idx
    ]
    order = np.argsort(-scores, kind='stable')[:num_valid]
    keep = {'topn': order[: ds.n_k]}
    for k in reconstruct_lib.KEEP_RULES:
      keep[k] = reconstruct_lib.select_sentences(tokens, scores, words, rule=k)
    lev = {
      k: metrics_lib.best_match_ratios(as_words(v), refs)
      for k, v in keep.items()
    }
    kept_w = as_words(keep[cfg.keep_rule])
    recall_view = metrics_lib.best_match_ratios(refs, kept_w)
    rows.append(
      {
        **row,
        'scale': s,
        'num_candidates': num_valid,
        'padded_candidates': len(tokens),
        'reconstruct_seconds': seconds,
        'num_kept': len(kept_w),
        **{f'num_kept_{k}': len(v) for k, v in keep.items()},
        'levenshtein': float(lev[cfg.keep_rule].mean()) if len(kept_w) else 0.0,
        **{
          f'levenshtein_{k}': float(v.mean()) if len(v) else 0.0
          for k, v in lev.items()
        },
        'levenshtein_recall': float(recall_view.mean()),
        'exact_fraction': float((recall_view == 100.0).mean()),
        # F1 of the distinct words of the kept sentences.
        'recon_f1': metrics_lib.f1_score(
          *metrics_lib.set_precision_recall(
            (w for c in kept_w for w in c), ds.true_words
          )
        ),
        'examples': [' '.join(w) for w in kept_w[:8]],
      }
    )
  return rows
