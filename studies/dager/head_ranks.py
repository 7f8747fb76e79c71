"""How well each score of the hybrid names the next token, given the prefix.

On the pretrained SmolLM2-135M at t = 0 and one FILM Enron batch (by default
b = 64, batch 0: 1,386 input positions, past the rank limit d = 576), the
client's FedSGD gradient as in `experiments.dager`; for every position of
every sentence, the true prefix is given and the batch's distinct tokens
(BOS excluded) are ranked under

* `lm`: the language model's log-probability;
* `head`: the hybrid's head-gradient cosine
  (:class:`leakjax.attacks.dager.hybrid.HeadScore`, statistics from the
  model's own samples, shrinkage `s`);
* `lm+head`: `0.6 · lm + w · head`, the hybrid's prior (`weight_lm` 0.6),
  first with each candidate's own row and the cosine alone
  (the library's head term), then with sentence ends scored by the
  quantile `q` of the other candidates' head terms
  (:func:`end_head_terms`) and rows scaled by their norm to the power `p`
  (:func:`powered_rows`; both settings lost end to end and left the
  library: `reports/dager/hybrid_end/`, `reports/dager/hybrid_end_power/`)
  (`lm+head,end=q,p=P,w=W`, q = 0.9; the hybrid's default is the first:
  the end's own row, p = 0, w = 12);
* `evidence`: the head rows' log-likelihood ratio
  (`HeadScore.evidence`, the number of targets N estimated from the head
  gradient at BOS as `HybridConfig.start_dims` = 64 does it:
  `targets_estimated`, against the true `targets`), and
  `lm+head+evidence,w=12.0,e=E`: the default prior plus E times it
  (`HybridConfig.weight_evidence`).

SmolLM2's head is tied to its input embeddings, so the observed rows hold
three parts: the targets' head inputs (the evidence), the LM's expected
head inputs (`Σ_t p_t[v] h̃_t`) and the input embeddings' gradient at the
positions holding v. Computed from the batch (which the attacker does not
have, so these are ceilings, not attacks), the same score with the
embedding part removed (`head,own_part`, `lm+head,own_part,w=12.0`: what
an untied head's gradient would give at the same weights) and with the
targets' part alone (`head,targets_only`, `lm+head,targets_only,w=12.0`)
says how much each part costs; `norm_median,PART` are the median row norms
of the three parts over the batch's tokens.

Writes `reports/dager/head_ranks.json`: per score the fraction of
positions where the true token ranks first, in the top 5 and in the top 32
(the hybrid's shortlist), and for the default prior (s = 0.1) and the
`end=` rows the same at the
sentences' last positions (`...,at_end`: the true token is the sentence
end) and at the others (`...,not_end`). The block-2 span term is not
included (it is computed for the shortlist only).

Usage (repository root):
  python -m studies.dager.head_ranks
"""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax import data as data_lib
from leakjax import models
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.attacks.dager.pipeline import head_path
from leakjax.models.protocol import get_path, set_path
from leakjax.tokenization import sentence_end_mask
from studies import report_dir

REPORT = report_dir(__file__)
WEIGHTS = (6.0, 12.0, 24.0)  # 10, 20 and 40 x weight_lm
SHRINKAGE = (0.01, 0.1, 1.0)
POWERS = (0.0, 0.25, 0.5)
END_WEIGHTS = (12.0, 24.0)
EVIDENCE_WEIGHTS = (10.0, 30.0, 60.0, 100.0)


def ranks_of(
  scores: np.ndarray, true: np.ndarray, tol: float = 1e-5
) -> np.ndarray:
  """Rank of column `true[i]` in row i (0: first). Ties count against,
  and so does any other column within `tol` of the true one: float32
  rounding must not decide them. (With the targets' part alone two
  tokens that followed the same context once have the same row, up to
  rounding: 74 of batch 0's 1,322 positions tie within 1e-5.)"""
  own = np.take_along_axis(scores, true[:, None], axis=1)
  return (scores >= own - tol).sum(1) - 1


def fractions(ranks: np.ndarray) -> dict[str, float]:
  return {
    'top1': float(np.mean(ranks == 0)),
    'top5': float(np.mean(ranks < 5)),
    'top32': float(np.mean(ranks < 32)),
  }


def powered_rows(head, raw, power: float):
  """`head.rows` (unit norm) times `(|r| / median |r|)^power`, `|r|` the
  norm of each centred, whitened raw row (power 0: unchanged)."""
  mean = head.mean
  rows = raw - jnp.outer(raw @ mean / (mean @ mean), mean)
  rows = rows @ head.whiten
  norm = jnp.linalg.norm(rows, axis=-1, keepdims=True)
  rows = rows / (norm + 1e-30)
  if power:
    rows = rows * (norm / (jnp.median(norm) + 1e-30)) ** power
  return rows


def end_head_terms(scores, valid, is_end, quantile: float):
  """`scores` `[K, C]` with each sentence end's replaced by the `quantile`
  of its row's valid other candidates."""
  others = (valid & ~is_end)[None]
  q = jnp.nanquantile(
    jnp.where(others, scores, jnp.nan), quantile, axis=1, keepdims=True
  )
  q = jnp.where(jnp.isfinite(q), q, 0.0)
  return jnp.where(is_end[None], q, scores)


def define_flags() -> None:
  flags.DEFINE_integer('b', 64, 'Batch size.')
  flags.DEFINE_integer('batch', 0, 'Which consecutive batch.')
  flags.DEFINE_string('out', str(REPORT / 'head_ranks.json'), 'Output JSON.')


def main(argv):
  del argv
  b, index = flags.FLAGS.b, flags.FLAGS.batch
  cfg = runner.DagerConfig(
    model='smollm2-135m',
    data='film-enron',
    max_sentences=2000,
    batch_sizes=(b,),
    num_batches=1,
    first_batch=index,
  )
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  texts = data_lib.load_corpus(cfg.data)
  sentences = runner.private_sentences(cfg, texts, model.tokenizer)
  ((_, batch),) = client.consecutive_batches(sentences, b, 1, index)
  ids, mask = model.tokenizer.encode_batch(batch, add_bos=True)
  width = cfg.max_tokens + 1
  ids = np.pad(ids, ((0, 0), (0, width - ids.shape[1])))
  mask = np.pad(mask, ((0, 0), (0, width - mask.shape[1])))
  # The key of experiments.dager's row for this batch.
  key = jax.random.key(cfg.seed * 1_000_003 + b * 1009 + index)
  grads = client.client_view(
    model, params, jnp.asarray(ids), jnp.asarray(mask), 'none', cfg, key=key
  )
  bos = model.tokenizer.bos_id
  cands = np.unique(ids[mask.astype(bool)])
  cands = cands[cands != bos].astype(np.int32)
  rows, cols = np.nonzero(mask[:, 1:])  # positions with a next token
  true = np.searchsorted(cands, ids[rows, cols + 1])
  logits = model.logits(params, jnp.asarray(ids), jnp.asarray(mask))
  z = np.asarray(logits, np.float32)[rows, cols]  # [P, V]
  lm = np.asarray(jax.nn.log_softmax(jnp.asarray(z), axis=-1))[:, cands]
  out = {
    'b': b,
    'batch': index,
    'num_positions': int(len(rows)),
    'num_input_tokens': int(mask.sum()),
    'num_candidates': int(len(cands)),
    'lm': fractions(ranks_of(lm, true)),
  }
  # Sentence ends: the true next token is the last of its sentence.
  at_end = cols + 2 == mask.sum(1)[rows]
  base = hybrid.HybridConfig()

  def head_of(rows=None, targets=None, **changes):
    """The :class:`HeadScore` of the candidates (`rows`: their
    head-gradient rows in place of the observed ones; `targets`: N, for
    `HeadScore.evidence`)."""
    config = dataclasses.replace(base, **changes)
    g = grads
    if rows is not None:
      full = get_path(grads, head_path(model))
      g = set_path(grads, head_path(model), full.at[cands].set(rows))
    return hybrid.head_score(
      model,
      params,
      g,
      jnp.asarray(cands),
      jnp.asarray(bos, jnp.int32),
      key=jax.random.key(0),
      config=config,
      targets=targets,
    )

  def head_terms(rows=None, **changes):
    """The head term of every candidate at every position, `[P, C]`."""
    head = head_of(rows, **changes)
    return head.scores(jnp.asarray(z) @ head.readout)

  for s in SHRINKAGE:
    h = np.asarray(head_terms(head_shrinkage=s))
    out[f'head,s={s}'] = fractions(ranks_of(h, true))
    for w in WEIGHTS:
      prior = base.weight_lm * lm + w * h
      out[f'lm+head,s={s},w={w}'] = fractions(ranks_of(prior, true))
      if s == base.head_shrinkage:
        r = ranks_of(prior, true)
        out[f'lm+head,s={s},w={w},at_end'] = fractions(r[at_end])
        out[f'lm+head,s={s},w={w},not_end'] = fractions(r[~at_end])
  is_end = jnp.asarray(sentence_end_mask(model.tokenizer, model.vocab_size))
  is_end = is_end[jnp.asarray(cands)]
  valid = jnp.ones(is_end.shape, bool)
  q = 0.9
  for p in POWERS:
    head = head_of()
    head = head.replace(
      rows=powered_rows(
        head, hybrid.raw_head_rows(model, grads, jnp.asarray(cands)), p
      )
    )
    h = head.scores(jnp.asarray(z) @ head.readout)
    h = np.asarray(end_head_terms(h, valid, is_end, q))
    for w in END_WEIGHTS:
      r = ranks_of(base.weight_lm * lm + w * h, true)
      name = f'lm+head,end={q},p={p},w={w}'
      out[name] = fractions(r)
      out[name + ',at_end'] = fractions(r[at_end])
      out[name + ',not_end'] = fractions(r[~at_end])
  out['lm,at_end'] = fractions(ranks_of(lm, true)[at_end])
  # The head rows' log-likelihood ratio (HeadScore.evidence), N estimated
  # from the head gradient at BOS as the search estimates it.
  starts = dataclasses.replace(base, start_dims=64)
  _, _, n_est = hybrid.estimate_starts(
    model,
    params,
    grads,
    jnp.asarray(cands),
    jnp.ones(len(cands), bool),
    jnp.asarray(bos, jnp.int32),
    b,
    key=jax.random.key(0),
    config=starts,
  )
  out['targets'] = int(len(rows))
  out['targets_estimated'] = float(n_est)
  scored = head_of(targets=n_est)
  zj = jnp.asarray(z)
  evidence = np.asarray(
    scored.evidence(zj @ scored.readout, jnp.exp(jnp.asarray(lm)))
  )
  cosine = np.asarray(scored.scores(zj @ scored.readout))
  out['evidence'] = fractions(ranks_of(evidence, true))
  for e in EVIDENCE_WEIGHTS:
    r = ranks_of(base.weight_lm * lm + 12.0 * cosine + e * evidence, true)
    out[f'lm+head+evidence,w=12.0,e={e}'] = fractions(r)
  # The tied gradient's parts (ceilings: computed from the batch).
  assert model.paths.lm_head is None, 'the decomposition assumes a tied head'
  readout = jax.jit(hybrid.head_readout, static_argnames=('model',))(
    model, params
  )
  h_in = zj @ readout  # [P, d] head inputs
  n = zj.shape[0]
  expected = jax.nn.softmax(zj, axis=-1)[:, jnp.asarray(cands)].T @ h_in / n
  targets = -jax.ops.segment_sum(h_in, jnp.asarray(true), len(cands)) / n
  observed = get_path(grads, head_path(model))[jnp.asarray(cands)]
  parts = {
    'targets': targets,
    'expected': expected,
    'embedding': observed - expected - targets,
  }
  for name, part in parts.items():
    out[f'norm_median,{name}'] = float(
      jnp.median(jnp.linalg.norm(part, axis=-1))
    )
  for name, rows in (
    ('own_part', targets + expected),
    ('targets_only', targets),
  ):
    h = np.asarray(head_terms(rows=rows))
    out[f'head,{name}'] = fractions(ranks_of(h, true))
    out[f'lm+head,{name},w=12.0'] = fractions(
      ranks_of(base.weight_lm * lm + 12.0 * h, true)
    )
  out['num_end_positions'] = int(at_end.sum())
  Path(flags.FLAGS.out).write_text(json.dumps(out, indent=2) + '\n')
  print(json.dumps(out, indent=2))


if __name__ == '__main__':
  define_flags()
  app.run(main)
