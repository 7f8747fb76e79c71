"""Past the rank limit: FILM's bag and beam search, scored by block 2's span
and the head gradient.

When a batch holds more input positions than the width d, the span of a
projection gradient is the whole space and DAGER's test cannot decide
(Petrov et al., NeurIPS 2024, arXiv 2405.15586). It still carries
evidence: true block-2 inputs sit closer to the span of the gradient's top
singular directions than wrong extensions do (measured on SmolLM2,
b = 64, 1,386 positions: the residual to the top `d - 16` directions
separates a true extension from a random one of the batch's tokens with
AUC ~0.86). FILM (Gupta et al., NeurIPS 2022) has the complementary
evidence: the batch's bag of words from the embedding gradient, and the
language model's prior. The head matrix's gradient has one row per token,
so no rank limit: a token's row points away from the head inputs of the
contexts it followed in the batch (:class:`HeadScore`). This module
combines the three (our construction; no paper describes it):

* candidates: the bag, DAGER's layer-1 token filter
  (:func:`span_candidates`) and every sentence-ending token. The bag
  alone misses frequent tokens (SmolLM2, b = 64, Enron batch 0: ' the',
  ' to', ',', ' of' among others, 18 % of the batch's positions), the
  layer-1 filter the last token of each sentence (no gradient), which is
  mostly a sentence end;
* a beam search (:func:`hybrid_search`, one `lax.while_loop`) grows one
  sentence from BOS: every step shortlists each beam's `shortlist` likeliest
  candidates under the LM (the first step: every candidate, since after BOS
  the LM says little about which words start the batch's sentences),
  computes the block-2 input of each shortlisted extension incrementally
  (:meth:`Model.block_decode`), and scores it

      weight_lm · log p(v | prefix) + weight_head · cos(v | prefix)
      + weight_span · log(r̄ / r(v))
      − weight_diverse · #(earlier sentences holding (prefix[-1], v))
      − weight_start · #(earlier sentences starting with v)   (first word)

  with `cos(v | prefix)` the head gradient's evidence that v followed the
  prefix in the batch (:class:`HeadScore`; it needs no rank, and enters
  the shortlist's ranking, since it costs one `[C, d]` product per beam),
  `r(v)` the extension's relative residual to the span and `r̄` the
  median of the step's shortlist (the bigram count skips BOS's: sentences
  may share their first word). A sentence end's input has no gradient,
  so its span term is the beam's best continuation's: where a sentence ends
  is the LM's call; no sentence ends right after BOS. A bigram already in
  the beam is banned (FILM's n = 2 ban). Beams are ranked by their mean
  score per token; a beam ends at a sentence-ending token;
* the runner (:func:`recover`) runs `num_sentences` searches one after the
  other, each penalising the bigrams of those before (FILM Sec. 4.5's
  repetitions) and the first words they started with, and returns one
  sentence per search; with `oversample > 1` it runs more searches and
  keeps the `num_sentences` whose own head-matrix gradients best explain
  the observed one (:func:`select_by_gradient`).

The weights were chosen by hand on two batches (SmolLM2, b = 64, Enron
batches 0 and 1), not tuned: see :class:`HybridConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from leakjax.attacks.dager import search as sr
from leakjax.attacks.dager.pipeline import head_path
from leakjax.attacks.dager.span import Span, residuals, span_of
from leakjax.attacks.film import bag as bow
from leakjax.attacks.film import reorder as ro
from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, get_path, set_path

PyTree = Any


@dataclasses.dataclass(frozen=True)
class HybridConfig:
  """The hybrid's settings (hashable, static).

  Attributes:
    beams: beams per search.
    shortlist: candidates per beam and step whose span residual is
      computed (the LM's likeliest among the candidates).
    span_dims: the span is the gradient's top `d - span_dims` singular
      directions (past the rank limit the spectrum has no gap; the AUC
      of true against random extensions grows with the number of
      directions kept up to d - 16 and drops at d - 1, the noise floor).
    span_block: the block whose attention-input gradient scores the
      extensions (DAGER uses block 1, counting from 0: the second). The
      deepest block the model declares in `attention_inputs`, up to this
      one, is used. Past the rank limit deeper inputs separate the true
      token from the LM's likeliest wrong one better (measured once on
      SmolLM2, b = 64, Enron batch 0, 150 positions, residual to the top
      560 directions: the true token is closer than the LM's favourite
      wrong bag token at 64 % of positions with block 1, 69 % block 2,
      79 % block 3, 79 % block 4; summing blocks 1-4 gives 75 %), but
      end to end (FILM's bag alone as candidates) block 3 moved that
      batch's ROUGE-L from 0.188 to 0.194
      at twice the time, so the default stays DAGER's block 1; each block
      deeper costs one block pass per scored extension.
    weight_lm: weight of the LM log-probability (0.3 and 1.0 moved
      ROUGE-L on those two batches by less than 0.02 either way).
    weight_head: weight of the head-gradient term (:class:`HeadScore`, a
      cosine in [-1, 1]; 0: off), 20 x `weight_lm`. Given the true prefix
      (SmolLM2, b = 64, Enron batch 0, `reports/dager/head_ranks.json`),
      the true next token ranks first among the batch's 532 tokens at
      24 % of the 1,322 positions under the LM alone, 50 % under the head
      term alone and 57 % under 0.6 · LM + 12 · head (top 32, the
      shortlist: 69 / 80 / 90 %); 10 x and 40 x `weight_lm` give 53 / 57 %.
    weight_evidence: weight of the head rows' log-likelihood ratio
      (:meth:`HeadScore.evidence`), added to the head term; it needs the
      batch's number of targets, which comes from :func:`start_counts`,
      so `start_dims > 0` (0: off). 30 was chosen from the true-prefix
      ranking of `reports/dager/head_ranks.json` (e = 10 / 30 / 60 / 100
      rank the true token first at 59 / 60 / 60 / 60 %). On SmolLM2,
      Enron, b = 64 batches 0-2, with allocated starts, the prior after
      `<|endoftext|>` and the whitened cuts, it lifts ROUGE-L from
      0.468 / 0.429 / 0.495 to 0.496 / 0.480 / 0.512
      (`reports/dager/hybrid_evidence/`; without it:
      `reports/dager/hybrid_starts/selection_whiten.json`).
    head_samples: sequences sampled from the model for the head inputs'
      mean and covariance (:func:`head_statistics`).
    head_sample_length: tokens per sampled sequence.
    head_shrinkage: the covariance is shrunk towards `shrinkage · tr/d · I`
      before whitening (0.01 / 0.1 / 1 give 57 / 57 / 54 % in the
      measurement above).
    head_norm_power: each candidate's head term is its cosine times
      `(|r| / median |r|)^head_norm_power`, `|r|` the norm of its whitened
      head-gradient row (0: the cosine alone, the default). A token the
      batch predicts after k contexts has a row of norm ~√k and a cosine
      ~1/√k with each of them, so the cosine alone favours the batch's
      rare tokens. Given the true prefix (SmolLM2, b = 64, Enron batch 0,
      `reports/dager/head_ranks.json`, with `end_head_quantile` 0.9) the
      true next token ranks first at 57 / 59 / 56 % of the positions with
      power 0 / 0.25 / 0.5, but end to end on that batch power 0.25 lowers
      ROUGE-L from 0.425 to 0.398 (`reports/dager/hybrid_end_power/`): the
      searches loop through the batch's frequent words ('stock exchange
      shares ...'), so it stays off.
    end_head_quantile: a sentence end's head term is this quantile of the
      beam's other candidates' head terms (None, the default: the end
      token's own row). The row of '.' sums every sentence's last
      context, so its cosine with any one of them is small: given the
      true prefix at the batch's 64 sentence ends the LM alone ranks the
      true end first at 72 %, the hybrid's prior at 25 %, with the
      quantile 0.9 at 50 % (top 5: 100 %), the other positions unchanged
      (`head_ranks.json`). End to end it changes little: ROUGE-L 0.425 on
      that batch either way (`reports/dager/hybrid_end/`), so it stays
      off.
    head_explain: after each search, the recovered sentence's own share
      of the head gradient is subtracted from the candidates' rows
      (`(1/N) Σ_t (1[y_t = v] − p_t[v]) h̃_t` over its positions, N
      estimated as `num_sentences` x the mean number of targets of the
      sentences recovered so far), and each row's cosine is scaled by
      min(1, its whitened norm / the norm before any subtraction): the
      contexts a sentence explains stop pulling the next searches to the
      same tokens (explaining away; our construction). False (the
      default): the rows stay those of the whole gradient. End to end
      on SmolLM2, b = 64, Enron batch 0 it lowers ROUGE-L from 0.425 to
      0.414 (`reports/dager/hybrid_explain/`).
    oversample: run `ceil(oversample · num_sentences)` searches and keep
      `num_sentences` of them, chosen by matching the observed head
      gradient with each sentence's own (:func:`pool_head_gradients`,
      :func:`select_by_gradient`; our construction, in the spirit of
      LAMP's gradient-matching selection, Balunović et al., NeurIPS 2022).
      With `start_dims`, the extra searches' starts are allocated from the
      same estimated counts (:func:`allocate_starts`). On SmolLM2, Enron,
      b = 64 batches 0-2, with the starts, the prior after
      `<|endoftext|>`, `weight_evidence` 30 and the whitened cuts, 1.5
      lifts ROUGE-L from 0.496 / 0.480 / 0.512 to 0.540 / 0.508 / 0.561
      (`reports/dager/hybrid_evidence_oversample/`; the first b searches
      are the same). 1 (the default): every search's sentence is kept.
    cuts: the selection's pool also holds each searched sentence cut at
      every word boundary and closed by a sentence end
      (:func:`cut_variants`), and keeps at most one variant per search
      (with `oversample = 1` it chooses where each sentence ends). False
      (the default): the sentences as searched.
    pool_beams: the selection's pool also holds each search's next
      `pool_beams - 1` live beams (:func:`hybrid_beams`; with `cuts`,
      their cuts too), still at most one variant per search. 1 (the
      default): each search's best beam only.
    select_weight: the selection scales each candidate's head row, in the
      observed gradient and in every sentence's own, by
      `(|row| + 0.1 · median |row|)^(−select_weight)`: 0 (the default)
      matches the raw rows, where the batch's frequent tokens dominate;
      1 gives every token's row about the same say.
    select_whiten: the selection (and :func:`refine`) matches every row
      centred and whitened as the head term is (:func:`head_transform`):
      the head inputs' common direction no longer dominates the match.
      On SmolLM2, b = 64, the three Enron batches of
      `reports/dager/hybrid_cuts/` (cuts, `select_weight` 1), the same
      searches give ROUGE-L 0.409 against 0.393 with the raw rows
      (`selection_whiten.json`). False (the default): the raw rows, as
      the committed runs.
    refine: sweeps of local search over the kept sentences (:func:`refine`):
      each sentence in turn takes the single-token substitution or
      deletion that most raises the match between the observed head
      gradient and the sum of the kept sentences' own (the selection's
      objective, rows weighted by `select_weight`), if any does. 0 (the
      default): none. It does not help: from the kept sentences of
      `reports/dager/hybrid_cuts/` two sweeps raise the objective by
      10-14 % while ROUGE-L goes from 0.393 to 0.391 (`refine.json`).
    refine_proposals: edits per sentence and sweep whose exact gradient is
      computed (the ones with the largest first-order gain).
    refine_lm: an edit is kept if `log m' − log m + refine_lm · (log p'
      − log p)` is positive, with `m` the objective and `log p` the
      sentence's log-probability under the model (0: the objective
      alone).
    weight_span: weight of the span term `log(r̄ / r)`.
    weight_diverse: penalty per earlier sentence that holds the bigram.
    weight_start: penalty, on a sentence's first word, per earlier
      sentence that starts with it (the bigram penalty skips BOS, since
      sentences may share their first word; 0: none). Without it the
      searches share their first words: on SmolLM2, b = 64, Enron batch 0,
      39 of 64 recovered sentences began with 'I' where the batch has 45
      distinct first words (`reports/dager/hybrid_head_only/results.jsonl`).
    start_dims: with `start_dims > 0`, each search's first token is
      fixed in advance: :func:`start_counts` estimates how many sentences
      start with each candidate from the head gradient at BOS (projecting
      out this many principal directions of the model's own head inputs),
      and :func:`allocate_starts` hands one start to each search, largest
      counts first (0: off, the searches choose their first tokens as
      any other). On SmolLM2, Enron, b = 64 batches 0-2, with 64
      directions the allocated starts match 63 / 62 / 62 of the 64
      sentences' first tokens (multiset), 124 of 128 at b = 128 batch 0;
      the default search's own first words match 39 / 34 / 34
      (`reports/dager/starts.json`).
    prior_start: the token the LM prior's context starts with in place
      of BOS (None: BOS, the batch's own). The head input, the span and
      the gradient's expected part keep BOS, since the batch was encoded
      with it; only `log p(v | prefix)` is read from the other context.
      SmolLM2 declares `<|im_start|>` its BOS: after it and the first
      word 'The' its three likeliest next tokens are letters glued on
      ('C', 'T', 't'), after `<|endoftext|>` (its document separator,
      id 0) they are ' company', ' most', ' key'
      (`reports/dager/starts.json`). One more decode per step.
    reference_quantile: `r̄` is this quantile of the step's shortlisted
      log-residuals (0.5: the median).
    end_as_best: a sentence end's span term is the beam's best
      continuation's (the LM decides where a sentence ends). False: 0,
      which ends sentences only when every continuation scores below 0:
      below the rank limit, with a low `reference_quantile` (e.g. 0.1),
      that is where DAGER's search would stop; past it the median's best
      wrong continuation always scores above 0 and beams run to
      `max_length`.
    max_length: longest sentence grown (tokens, BOS included).
    length_penalty: beams are ranked by `score / length^length_penalty`
      (1: the mean score per token).
    min_length: no sentence ends (end token included) before this many
      tokens, BOS included (at least 3: BOS, a word, the end).
    bag_bucket: candidates are padded to a multiple of this (few
      compiles).
    span: the rank rule; when it finds a gap (below the rank limit) the
      search uses that exact span instead of the top directions.
  """

  beams: int = 8
  shortlist: int = 32
  span_dims: int = 16
  span_block: int = 1
  weight_lm: float = 0.6
  weight_head: float = 12.0
  weight_evidence: float = 0.0
  head_samples: int = 64
  head_sample_length: int = 32
  head_shrinkage: float = 0.1
  head_norm_power: float = 0.0
  end_head_quantile: float | None = None
  head_explain: bool = False
  oversample: float = 1.0
  cuts: bool = False
  pool_beams: int = 1
  select_weight: float = 0.0
  select_whiten: bool = False
  refine: int = 0
  refine_proposals: int = 16
  refine_lm: float = 0.0
  weight_span: float = 1.0
  weight_diverse: float = 1.0
  weight_start: float = 3.0
  start_dims: int = 0
  prior_start: int | None = None
  reference_quantile: float = 0.5
  end_as_best: bool = True
  length_penalty: float = 1.0
  min_length: int = 3
  max_length: int = 41
  bag_bucket: int = 256
  span: sr.SpanConfig = sr.SpanConfig()

  def __post_init__(self):
    for name in ('beams', 'shortlist', 'max_length', 'bag_bucket'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise LeakjaxError(
          f'HybridConfig.{name} must be a positive int, got {value!r}'
        )
    if self.span_dims < 0 or self.span_block < 1 or self.min_length < 0:
      raise LeakjaxError(
        'HybridConfig.span_dims and min_length must be >= 0, span_block >= 1'
      )
    if self.head_samples < 2 or self.head_sample_length < 1:
      raise LeakjaxError(
        'HybridConfig.head_samples must be >= 2, head_sample_length >= 1'
      )
    if self.head_shrinkage < 0 or self.head_norm_power < 0:
      raise LeakjaxError(
        'HybridConfig.head_shrinkage and head_norm_power must be >= 0'
      )
    if self.head_explain and self.head_norm_power:
      raise LeakjaxError(
        'HybridConfig.head_explain needs head_norm_power 0',
        'turn one of them off',
      )
    q = self.end_head_quantile
    if q is not None and not 0.0 <= q <= 1.0:
      raise LeakjaxError(
        f'HybridConfig.end_head_quantile must be in [0, 1] or None, got {q!r}'
      )
    if not self.oversample >= 1.0:
      raise LeakjaxError(
        f'HybridConfig.oversample must be >= 1, got {self.oversample!r}'
      )
    if not self.select_weight >= 0.0:
      raise LeakjaxError(
        f'HybridConfig.select_weight must be >= 0, got {self.select_weight!r}'
      )
    if not isinstance(self.pool_beams, int) or not (
      1 <= self.pool_beams <= self.beams
    ):
      raise LeakjaxError(
        f'HybridConfig.pool_beams must be an int in [1, beams = {self.beams}],'
        f' got {self.pool_beams!r}'
      )
    if self.prior_start is not None and (
      not isinstance(self.prior_start, int) or self.prior_start < 0
    ):
      raise LeakjaxError(
        'HybridConfig.prior_start must be a token id >= 0 or None, got'
        f' {self.prior_start!r}'
      )
    if not self.weight_evidence >= 0.0 or (
      self.weight_evidence and not (self.start_dims and self.weight_head)
    ):
      raise LeakjaxError(
        'HybridConfig.weight_evidence must be >= 0, and it needs'
        f' start_dims > 0 and weight_head > 0, got {self.weight_evidence!r}'
        f' with start_dims {self.start_dims!r}, weight_head'
        f' {self.weight_head!r}',
        'set --hybrid_start_dims (the number of targets comes from there)',
      )
    if not isinstance(self.start_dims, int) or self.start_dims < 0:
      raise LeakjaxError(
        f'HybridConfig.start_dims must be an int >= 0, got {self.start_dims!r}'
      )
    if not isinstance(self.refine, int) or self.refine < 0:
      raise LeakjaxError(
        f'HybridConfig.refine must be an int >= 0, got {self.refine!r}'
      )
    if not isinstance(self.refine_proposals, int) or self.refine_proposals < 1:
      raise LeakjaxError(
        'HybridConfig.refine_proposals must be a positive int, got'
        f' {self.refine_proposals!r}'
      )
    if not self.refine_lm >= 0.0:
      raise LeakjaxError(
        f'HybridConfig.refine_lm must be >= 0, got {self.refine_lm!r}'
      )
    if not 0.0 <= self.reference_quantile <= 1.0:
      raise LeakjaxError('HybridConfig.reference_quantile must be in [0, 1]')


def top_span(grad: Float[Array, 'd out'], drop: int) -> Span:
  """The span of `grad`'s top `d - drop` left singular vectors (no rank
  rule: past the rank limit there is no gap to read)."""
  u, _, _ = jax.lax.linalg.svd(
    grad.astype(jnp.float32),
    full_matrices=False,
    algorithm=jax.lax.linalg.SvdAlgorithm.QR,
  )
  k = max(1, grad.shape[0] - drop)
  keep = jnp.arange(u.shape[1]) < k
  return Span(
    basis=u * keep[None, :],
    rank=jnp.asarray(k, jnp.int32),
    valid=jnp.asarray(False),
    log_gap=jnp.zeros((), jnp.float32),
  )


@flax.struct.dataclass
class HeadScore:
  """The head gradient's evidence for each candidate as the next target.

  Under the mean next-token loss over N targets the head matrix's gradient
  has rows `N ∇W[v] = Σ_t p_t[v] h̃_t − Σ_{t: y_t = v} h̃_t` (h̃_t the head
  input at position t; for a tied head, plus the input embeddings'
  gradient at the positions holding v). The row of a token the batch
  predicts after a context points away from that context's head input,
  and the row of a token the LM favours there but the batch does not
  hold points towards it. Unlike a span test this needs no rank: each
  token has its own row. Head inputs share a large common component, so
  both sides are centred and whitened with the head inputs' mean and
  covariance under the model's own samples (:func:`head_statistics`; no
  data needed) and compared by cosine: `score(v | prefix) =
  cos(−W(∇W[v]), W(h̃ − μ))` with `W` the whitening. This is the
  per-position form of :func:`leakjax.attacks.dager.pipeline.
  last_token_scores` (our construction; no paper describes it).

  Attributes:
    readout: float32 `[V, d]`, logits -> head input (`h̃ = z @ readout`,
      least squares against the head matrix: exact for a linear head
      without bias).
    mean: float32 `[d]`, μ.
    whiten: float32 `[d, d]`, W (symmetric).
    rows: float32 `[C, d]`, the candidates' negated, centred, whitened
      head-gradient rows, each of norm `(|r| / median |r|)^p` with `p`
      `HybridConfig.head_norm_power` (1 for p = 0).
    transformed: for :meth:`evidence` (else None): float32 `[C, d]`, the
      same rows before their norm is set, `R_v = r_v M` with `M`
      :func:`head_transform`.
    noise: for :meth:`evidence`: float32 `[C]`, `|R_v|² + m²`, `m` the
      median `|R_v|` over the real candidates.
    targets: for :meth:`evidence`: float32 `[]`, the batch's number of
      targets N (estimated: :func:`start_counts`).
  """

  readout: Float[Array, 'V d']
  mean: Float[Array, ' d']
  whiten: Float[Array, 'd d']
  rows: Float[Array, 'C d']
  transformed: Float[Array, 'C d'] | None = None
  noise: Float[Array, ' C'] | None = None
  targets: Float[Array, ''] | None = None

  def scores(self, head: Float[Array, 'K d']) -> Float[Array, 'K C']:
    """Cosine of each head input with each candidate's row."""
    h = (head - self.mean) @ self.whiten
    h = h / (jnp.linalg.norm(h, axis=-1, keepdims=True) + 1e-30)
    return h @ self.rows.T

  def evidence(
    self, head: Float[Array, 'K d'], prob: Float[Array, 'K C']
  ) -> Float[Array, 'K C']:
    """Each candidate's log-likelihood ratio as the target after each
    head input (`prob`: the LM's probabilities of the candidates there).

    If v followed the context `h̃` once, its row holds `(1 − p[v]) H / N`
    (`H = h̃ M`, the head input mapped as the rows are) beside its other
    contexts; if not, only the others. Model the row's coefficient along
    H, `a = ⟨R_v, H⟩ / |H|²`, as Gaussian with mean `μ = (1 − p[v]) / N`
    or 0 and variance `σ² = (|R_v|² + m²) / |H|²` (the rest of the row
    spread evenly; `m` keeps rare rows from claiming certainty): the
    ratio is `(a μ − μ² / 2) / σ²`. Unlike the cosine of :meth:`scores`
    it knows how large a true context's share is: a token that occurs
    once and whose row does not lie along H is strong evidence against
    it, a frequent token's row is weak evidence either way (our
    construction; no paper describes it). Given the true prefix (b = 64,
    batch 0, `reports/dager/head_ranks.json`: `lm+head+evidence,w=12.0,
    e=30.0` against `lm+head,s=0.1,w=12.0`), `0.6 log p + 12 cos + 30 ·`
    this ranks the true token first at 60 % of positions against 57 %
    without it (top 32: 92 % against 90 %).
    """
    h = head @ head_transform(self.mean, self.whiten)
    mu = (1.0 - prob) / self.targets
    along = h @ self.transformed.T  # [K, C]
    h2 = jnp.sum(h * h, axis=-1, keepdims=True)
    return (mu * along - 0.5 * mu**2 * h2) / self.noise[None]


def head_readout(model: Model, params: PyTree) -> Float[Array, 'V d']:
  """`[V, d]` with `logits @ readout` the head input (least squares
  against the head matrix, through its QR factors)."""
  w = get_path(params, head_path(model)).astype(jnp.float32)
  if model.paths.lm_head is not None:  # a Dense kernel [d, V]
    w = w.T
  q, r = jnp.linalg.qr(w)  # w = q r, so h̃ = r⁻¹ qᵀ z
  return jax.scipy.linalg.solve_triangular(r, q.T, lower=False).T


def head_transform(
  mean: Float[Array, ' d'], whiten: Float[Array, 'd d']
) -> Float[Array, 'd d']:
  """`(I − μ̂μ̂ᵀ) W`: a row `r` maps to `r @ M`, the centring and
  whitening of :class:`HeadScore` as one linear map (so sums of rows map
  to sums)."""
  unit = mean / jnp.linalg.norm(mean)
  return (jnp.eye(mean.shape[0]) - jnp.outer(unit, unit)) @ whiten


def model_head_transform(
  model: Model,
  params: PyTree,
  config: HybridConfig,
  key: jax.Array | None = None,
) -> Float[Array, 'd d']:
  """:func:`head_transform` from the head inputs of the model's own
  samples after BOS, drawn as :func:`recover` draws them (default key:
  `jax.random.key(0)`, as there)."""
  readout = head_readout(model, params)
  mean, whiten = head_statistics(
    model,
    params,
    readout,
    jnp.asarray(model.tokenizer.bos_id, jnp.int32),
    key=jax.random.key(0) if key is None else key,
    num=config.head_samples,
    length=config.head_sample_length,
    shrinkage=config.head_shrinkage,
  )
  return head_transform(mean, whiten)


@functools.partial(
  jax.jit, static_argnames=('model', 'num', 'length', 'shrinkage')
)
def head_statistics(
  model: Model,
  params: PyTree,
  readout: Float[Array, 'V d'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  num: int,
  length: int,
  shrinkage: float,
) -> tuple[Float[Array, ' d'], Float[Array, 'd d']]:
  """Mean and whitening `(μ, Σ_s^{-1/2})` of the head inputs along `num`
  sequences of `length` tokens sampled from the model after `start`, with
  `Σ_s = Σ + shrinkage · tr(Σ)/d · I`.

  The model's own text stands in for the private data's, so the attack
  needs no corpus.
  """
  h = sample_head_inputs(
    model, params, readout, start, key=key, num=num, length=length
  )
  return whitening(h.reshape(-1, h.shape[-1]), shrinkage)


@functools.partial(jax.jit, static_argnames=('model', 'num', 'length'))
def sample_head_inputs(
  model: Model,
  params: PyTree,
  readout: Float[Array, 'V d'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  num: int,
  length: int,
) -> Float[Array, 'length num d']:
  """The head inputs along `num` sequences of `length` tokens sampled
  from the model after `start`: row 0 is `start`'s own (the same in every
  sequence), row i the input after i sampled tokens."""
  cache = model.init_cache(params, num, length + 1)
  first = jnp.full((num, 1), start, jnp.int32)
  logits, cache = model.decode(params, cache, first)

  def step(carry, k):
    z, c = carry
    tok = jax.random.categorical(k, z[:, -1].astype(jnp.float32))
    h = z[:, -1].astype(jnp.float32) @ readout
    z, c = model.decode(params, c, tok[:, None].astype(jnp.int32))
    return (z, c), h

  _, h = jax.lax.scan(step, (logits, cache), jax.random.split(key, length))
  return h


@functools.partial(jax.jit, static_argnames=('dims',))
def start_counts(
  rows: Float[Array, 'C d'],
  first_input: Float[Array, ' d'],
  samples: Float[Array, 'n d'],
  prior: Float[Array, ' C'],
  valid: Bool[Array, ' C'],
  num_sentences: Int[Array, ''] | int,
  *,
  dims: int,
) -> Float[Array, ' C']:
  """How many of the batch's sentences start with each candidate, read
  from the head gradient at BOS.

  Every sentence's first target follows BOS, whose head input `h̃_0` is
  the same in every sentence (causal model, BOS first). So the negated
  head rows `r_v = −∇W[v]` (:func:`raw_head_rows`) hold
  `(c_v − b p_0[v]) h̃_0 / N`, `c_v` the sentences starting with v, `p_0`
  the LM after BOS, b the sentences and N the targets, beside the other
  positions' head inputs. Those share few directions with `h̃_0` once the
  top `dims` principal directions of head inputs after BOS (`samples`:
  the model's own, :func:`sample_head_inputs` past row 0) are projected
  out of both: the coefficient `a_v = ⟨P r_v, P h̃_0⟩ / |P h̃_0|²`
  estimates `(c_v − b p_0[v]) / N`. N is not known; it comes from the
  counts summing to b over the `valid` candidates:
  `N = b (1 − Σ p_0) / Σ a`. (Our construction; no paper describes it.)
  For a tied head the rows also hold the input embeddings' gradient,
  which this leaves in.

  Returns:
    `(counts, n)`: float32 `[C]` the estimated counts (0 where not
    `valid`) and `[]` the estimated N.
  """
  u = jnp.linalg.svd(samples.astype(jnp.float32), full_matrices=False)[2]
  u = u[:dims]  # [k, d]
  h = first_input - (u @ first_input) @ u
  r = rows - (rows @ u.T) @ u
  a = jnp.where(valid, r @ h / (h @ h), 0.0)
  p = jnp.where(valid, prior, 0.0)
  n = num_sentences * (1.0 - p.sum()) / a.sum()
  return jnp.where(valid, n * a + num_sentences * p, 0.0), n


def estimate_starts(
  model: Model,
  params: PyTree,
  grads: PyTree,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  start: Int[Array, ''],
  num_sentences: int,
  *,
  key: jax.Array,
  config: HybridConfig,
) -> tuple[Float[Array, ' C'], Float[Array, ' C d'], Float[Array, '']]:
  """:func:`start_counts` for `candidates` under the observed gradient,
  with the head inputs of the model's own samples (drawn as
  :func:`head_score` draws them, same `key`) and `config.start_dims`
  directions; `start`: BOS.

  Returns:
    `(counts, share, n)`: the estimated counts `[C]`, each candidate's
    share of its negated head row that the sentences' first targets
    explain, `(c_v − b p_0[v]) h̃_0 / N` `[C, d]`, and the estimated
    number of targets N `[]`.
  """
  readout = jax.jit(head_readout, static_argnums=0)(model, params)
  h = sample_head_inputs(
    model,
    params,
    readout,
    start,
    key=key,
    num=config.head_samples,
    length=config.head_sample_length,
  )
  logits = model.logits(
    params, start.reshape(1, 1), jnp.ones((1, 1), jnp.int32)
  )
  prior = jax.nn.softmax(logits[0, 0].astype(jnp.float32))[candidates]
  counts, n = start_counts(
    raw_head_rows(model, grads, candidates),
    h[0, 0],
    h[1:].reshape(-1, h.shape[-1]),
    prior,
    valid,
    num_sentences,
    dims=config.start_dims,
  )
  coef = jnp.where(valid, (counts - num_sentences * prior) / n, 0.0)
  return counts, coef[:, None] * h[0, 0][None], n


def allocate_starts(
  counts: np.ndarray, allowed: np.ndarray, num: int
) -> np.ndarray:
  """`num` candidate indices, one per sentence, greedily from the
  estimated counts (:func:`start_counts`): each pick is the allowed
  candidate with the largest count not yet used."""
  left = np.where(allowed, np.asarray(counts, np.float64), -np.inf)
  if not np.isfinite(left).any():
    raise LeakjaxError('no candidate may start a sentence')
  picks = []
  for _ in range(num):
    j = int(np.argmax(left))
    picks.append(j)
    left[j] -= 1.0
  return np.asarray(picks, np.int64)


def whitening(
  x: Float[Array, 'n d'], shrinkage: float
) -> tuple[Float[Array, ' d'], Float[Array, 'd d']]:
  """`(mean, Σ_s^{-1/2})` of the rows of `x`, `Σ_s` their covariance shrunk
  towards `shrinkage · tr(Σ)/d · I` (symmetric inverse square root)."""
  mean = x.mean(0)
  cov = jnp.cov(x.T)
  d = cov.shape[0]
  cov = cov + shrinkage * jnp.trace(cov) / d * jnp.eye(d)
  w, u = jnp.linalg.eigh(cov)
  return mean, (u * jax.lax.rsqrt(jnp.maximum(w, 1e-30))) @ u.T


def head_score(
  model: Model,
  params: PyTree,
  grads: PyTree,
  candidates: Int[Array, ' C'],
  start: Int[Array, ''],
  *,
  key: jax.Array,
  config: HybridConfig,
  valid: Bool[Array, ' C'] | None = None,
  shift: Float[Array, 'C d'] | None = None,
  targets: Float[Array, ''] | float | None = None,
) -> HeadScore:
  """The :class:`HeadScore` of `candidates` under the observed gradient
  (`valid` marks the real candidates among padding: the median row norm
  is theirs; None: all; `shift` is taken off the negated raw rows first,
  e.g. the share the sentences' first targets explain,
  :func:`estimate_starts`; with `targets`, the batch's number of
  targets, it also holds what :meth:`HeadScore.evidence` needs)."""
  readout = jax.jit(head_readout, static_argnums=0)(model, params)
  mean, whiten = head_statistics(
    model,
    params,
    readout,
    start,
    key=key,
    num=config.head_samples,
    length=config.head_sample_length,
    shrinkage=config.head_shrinkage,
  )
  if valid is None:
    valid = jnp.ones(candidates.shape, bool)
  return _head_rows(
    model,
    grads,
    candidates,
    valid,
    readout,
    mean,
    whiten,
    jnp.zeros((), jnp.float32) if shift is None else shift,
    None if targets is None else jnp.asarray(targets, jnp.float32),
    power=config.head_norm_power,
  )


@functools.partial(jax.jit, static_argnames=('model', 'power'))
def _head_rows(
  model, grads, candidates, valid, readout, mean, whiten, shift, targets, power
):
  rows = raw_head_rows(model, grads, candidates) - shift
  rows = rows - jnp.outer(rows @ mean / (mean @ mean), mean)
  rows = rows @ whiten
  norm = jnp.linalg.norm(rows, axis=-1, keepdims=True)
  median = jnp.nanmedian(jnp.where(valid[:, None], norm, jnp.nan))
  extra = {}
  if targets is not None:
    extra = dict(
      transformed=rows, noise=norm[:, 0] ** 2 + median**2, targets=targets
    )
  rows = rows / (norm + 1e-30)
  if power:
    rows = rows * (norm / (median + 1e-30)) ** power
  return HeadScore(
    readout=readout, mean=mean, whiten=whiten, rows=rows, **extra
  )


@functools.partial(jax.jit, static_argnames=('model',))
def raw_head_rows(
  model: Model, grads: PyTree, candidates: Int[Array, ' C']
) -> Float[Array, 'C d']:
  """The candidates' negated head-gradient rows `−∇W[v]`, unprocessed."""
  g = get_path(grads, head_path(model)).astype(jnp.float32)
  if model.paths.lm_head is not None:
    g = g.T
  return -g[candidates]


@functools.partial(jax.jit, static_argnames=('model',))
def sentence_head_rows(
  model: Model,
  params: PyTree,
  tokens: Int[Array, ' L'],
  length: Int[Array, ''],
  candidates: Int[Array, ' C'],
  readout: Float[Array, 'V d'],
) -> Float[Array, 'C d']:
  """One sentence's share of the candidates' negated head rows, times N:
  `Σ_t (1[y_t = v] − p_t[v]) h̃_t` over its `length − 1` targets (the
  model's probabilities and head inputs at θ; `tokens` padded to any
  fixed width)."""
  positions = jnp.arange(tokens.shape[0])
  mask = (positions < length).astype(jnp.int32)
  z = model.logits(params, tokens[None], mask[None])[0].astype(jnp.float32)
  h = z @ readout
  p = jax.nn.softmax(z, axis=-1)[:, candidates]
  targets = jnp.roll(tokens, -1)
  real = (positions < length - 1)[:, None]
  onehot = candidates[None, :] == targets[:, None]
  return jnp.where(real, onehot.astype(jnp.float32) - p, 0.0).T @ h


@jax.jit
def explained_rows(
  raw: Float[Array, 'C d'],
  reference_norm: Float[Array, 'C 1'],
  mean: Float[Array, ' d'],
  whiten: Float[Array, 'd d'],
) -> tuple[Float[Array, 'C d'], Float[Array, 'C 1']]:
  """`HeadScore.rows` from raw rows (centred, whitened, unit norm) times
  min(1, norm / `reference_norm`), and the norms (`head_explain`)."""
  rows = raw - jnp.outer(raw @ mean / (mean @ mean), mean)
  rows = rows @ whiten
  norm = jnp.linalg.norm(rows, axis=-1, keepdims=True)
  scale = jnp.minimum(1.0, norm / (reference_norm + 1e-30))
  return rows / (norm + 1e-30) * scale, norm


@functools.partial(jax.jit, static_argnames=('model',))
def pool_head_gradients(
  model: Model,
  params: PyTree,
  tokens: Int[Array, 'P L'],
  lengths: Int[Array, ' P'],
  candidates: Int[Array, ' C'],
) -> Float[Array, 'P C d']:
  """Each sentence's own head-matrix gradient at the candidates' rows.

  Row p is `(n_p) ∇W L(sentence p)[candidates]`: the gradient of its
  summed next-token loss (`n_p = lengths[p] − 1` targets) with respect to
  the head matrix (the embedding matrix when tied, so the input
  embeddings' part is in it too), negated and oriented like
  :func:`raw_head_rows`. Under the mean loss the batch's gradient is the
  sum of its sentences' rows over the batch's targets, exactly: a causal
  model's sentences do not interact. One sentence at a time
  (`lax.map`): only one `[V, d]` gradient is alive.
  """
  path = head_path(model)
  weight = get_path(params, path)

  def one(args):
    seq, n = args
    mask = (jnp.arange(seq.shape[0]) < n).astype(jnp.int32)

    def loss(w):
      p = set_path(params, path, w)
      return model.loss(p, seq[None], mask[None]) * (n - 1)

    g = jax.grad(loss)(weight).astype(jnp.float32)
    if model.paths.lm_head is not None:
      g = g.T
    return -g[candidates]

  return jax.lax.map(one, (tokens, lengths))


def _match(num, den):
  """`cos²` up to the target's norm: `num² / den` where `num > 0`."""
  return jnp.where(num > 0, num**2 / jnp.maximum(den, 1e-30), -jnp.inf)


@functools.partial(jax.jit, static_argnames=('k', 'max_swaps'))
def select_by_gradient(
  features: Float[Array, 'P F'],
  target: Float[Array, ' F'],
  k: int,
  *,
  max_swaps: int | None = None,
  groups: Int[Array, ' P'] | None = None,
) -> Int[Array, ' k']:
  """`k` rows whose sum best matches `target` in direction.

  The objective is `cos(target, Σ_chosen features)` (the least-squares fit
  with a free scale: the batch's number of targets is unknown), so a
  near-copy of a chosen sentence, which would count its contexts twice,
  loses to a sentence that explains new ones. See :func:`select_from_gram`
  (this computes its Gram matrix and projections).

  Returns:
    int32 `[k]`, the chosen rows in increasing order.
  """
  features = features.astype(jnp.float32)
  return select_from_gram(
    features @ features.T,
    features @ target.astype(jnp.float32),
    k,
    max_swaps=max_swaps,
    groups=groups,
  )


@functools.partial(jax.jit, static_argnames=('k', 'max_swaps'))
def select_from_gram(
  gram: Float[Array, 'P P'],
  along: Float[Array, ' P'],
  k: int,
  *,
  max_swaps: int | None = None,
  groups: Int[Array, ' P'] | None = None,
) -> Int[Array, ' k']:
  """:func:`select_by_gradient` from `gram = F Fᵀ` and `along = F t`.

  Greedy forward selection, then single swaps (one chosen row for one
  other) while the best swap improves the objective, at most `max_swaps`
  (default `k`) times: greedy alone can take a near-copy first and then
  never the original. `O(k P)` per greedy step, `O(P^2)` per swap; the
  caller may build `gram` in blocks when the features do not fit.

  Args:
    gram: `F Fᵀ`.
    along: `F t`.
    k: rows to choose.
    max_swaps: at most this many swaps (default `k`).
    groups: int32 `[P]` in `[0, P)`: at most one row of each group is
      chosen (a swap may trade a row for another of its own group); the
      caller makes sure at least `k` groups exist. None: every row is its
      own group.

  Returns:
    int32 `[k]`, the chosen rows in increasing order.
  """
  gram = gram.astype(jnp.float32)
  along = along.astype(jnp.float32)
  diag = jnp.diag(gram)
  p = gram.shape[0]
  if groups is None:
    groups = jnp.arange(p, dtype=jnp.int32)
  same = groups[:, None] == groups[None, :]

  def add(_, carry):
    taken, used, a_t, a_a, a_x = carry
    free = ~taken & ~used[groups]
    objective = jnp.where(
      free, _match(a_t + along, a_a + 2 * a_x + diag), -jnp.inf
    )
    # No row left with a positive match: the first free row.
    j = jnp.where(
      jnp.isfinite(objective).any(), jnp.argmax(objective), jnp.argmax(free)
    )
    return (
      taken.at[j].set(True),
      used.at[groups[j]].set(True),
      a_t + along[j],
      a_a + 2 * a_x[j] + diag[j],
      a_x + gram[:, j],
    )

  zero = jnp.zeros((), jnp.float32)
  none = jnp.zeros((p,), bool)
  carry = jax.lax.fori_loop(
    0, k, add, (none, none, zero, zero, jnp.zeros((p,), jnp.float32))
  )

  def best_swap(carry):
    taken, used, a_t, a_a, a_x = carry
    # Row i leaves, row j joins: [P, P] over (i, j).
    num = a_t - along[:, None] + along[None, :]
    den = (
      a_a
      - 2 * a_x[:, None]
      + 2 * a_x[None, :]
      + diag[:, None]
      + diag[None, :]
      - 2 * gram
    )
    allowed = taken[:, None] & ~taken[None, :] & (~used[groups][None, :] | same)
    value = jnp.where(allowed, _match(num, den), -jnp.inf)
    flat = jnp.argmax(value)
    return flat // p, flat % p, value.reshape(-1)[flat]

  def cond(state):
    carry, n = state
    _, _, gain = best_swap(carry)
    return (n < (k if max_swaps is None else max_swaps)) & (
      gain > _match(carry[2], carry[3]) * (1 + 1e-6)
    )

  def swap(state):
    (taken, used, a_t, a_a, a_x), n = state
    i, j, _ = best_swap((taken, used, a_t, a_a, a_x))
    a_a = a_a - 2 * a_x[i] + 2 * a_x[j] + diag[i] + diag[j] - 2 * gram[i, j]
    return (
      taken.at[i].set(False).at[j].set(True),
      used.at[groups[i]].set(False).at[groups[j]].set(True),
      a_t - along[i] + along[j],
      a_a,
      a_x - gram[:, i] + gram[:, j],
    ), n + 1

  (taken, *_), _ = jax.lax.while_loop(cond, swap, (carry, 0))
  return jnp.nonzero(taken, size=k)[0].astype(jnp.int32)


def cut_variants(
  sequence: Sequence[int],
  *,
  is_end: np.ndarray,
  cuttable: np.ndarray,
  end_id: int,
  min_length: int,
) -> list[list[int]]:
  """A searched sentence and its cuts at word boundaries.

  Each cut keeps the sentence up to a word boundary (before a token that
  `cuttable` marks: one that starts a word or is punctuation) and closes
  it with the sentence's own end token, or `end_id` where it has none
  (it ran to `max_length`). The searches' sentences run on: at b = 64
  they average 23 words against the originals' 15, and cutting each
  where it should end (with the original in hand) lifts ROUGE-L from
  0.369 to 0.482 (`reports/dager/truncation_bound.json`); the head
  gradient can tell which cut the batch holds, since a sentence's own
  gradient counts every context it holds (:func:`pool_head_gradients`).

  Args:
    sequence: token ids, BOS first.
    is_end: bool `[V]`, sentence-ending tokens.
    cuttable: bool `[V]`, tokens a cut may fall before.
    end_id: the end token of a cut sentence that has none.
    min_length: no variant shorter than this (tokens, BOS and end
      included).

  Returns:
    The distinct variants, the whole sentence last.
  """
  seq = [int(t) for t in sequence]
  ended = len(seq) > 1 and bool(is_end[seq[-1]])
  body = seq[:-1] if ended else seq
  end = seq[-1] if ended else int(end_id)
  out = []
  for m in range(2, len(body)):
    if cuttable[body[m]] and m + 1 >= min_length:
      out.append(body[:m] + [end])
  out.append(seq)
  unique = []
  for v in out:
    if v not in unique:
      unique.append(v)
  return unique


def pool_gram(
  model: Model,
  params: PyTree,
  tokens: Int[np.ndarray, 'P L'],
  lengths: Int[np.ndarray, ' P'],
  candidates: Int[Array, ' C'],
  target: Float[Array, 'C d'],
  weights: Float[np.ndarray, 'W C'],
  *,
  chunk: int = 64,
  transform: Float[Array, 'd d'] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """`gram = F Fᵀ` and `along = F t` of the pool's weighted head rows.

  `F[p]` is :func:`pool_head_gradients`'s row of sentence p (times
  `transform` when given: `rows @ transform`) with each candidate's row
  scaled by one row of `weights`, flattened; `t` the target rows, which
  the caller passes already transformed, scaled alike; one Gram per
  weighting. The rows are computed
  `chunk` sentences at a time (one compile: the last chunk is padded) and
  kept on the device once, the Grams in blocks of two chunks.

  Returns:
    float32 numpy `gram [W, P, P]` and `along [W, P]`.
  """
  num = len(tokens)
  pad = -num % chunk
  tokens = np.concatenate([tokens, np.repeat(tokens[:1], pad, 0)])
  lengths = np.concatenate([lengths, np.repeat(lengths[:1], pad)])
  w = jnp.asarray(weights, jnp.float32)
  target = jnp.asarray(target, jnp.float32)
  blocks = []
  for s in range(0, len(tokens), chunk):
    block = pool_head_gradients(
      model,
      params,
      jnp.asarray(tokens[s : s + chunk]),
      jnp.asarray(lengths[s : s + chunk]),
      candidates,
    )
    blocks.append(block if transform is None else block @ transform)
  size = len(tokens)
  gram = np.zeros((len(w), size, size), np.float32)
  along = np.zeros((len(w), size), np.float32)
  for i, a in enumerate(blocks):
    rows = slice(i * chunk, (i + 1) * chunk)
    along[:, rows] = np.asarray(_weighted_along(a, target, w))
    for j in range(i, len(blocks)):
      cols = slice(j * chunk, (j + 1) * chunk)
      block = np.asarray(_weighted_block(a, blocks[j], w))
      gram[:, rows, cols] = block
      gram[:, cols, rows] = block.transpose(0, 2, 1)
  return gram[:, :num, :num], along[:, :num]


@jax.jit
def _weighted_block(a, b, w):
  """`[W, n, m]`: `Σ_c,e w[c]² a[n, c, e] b[m, c, e]` per weighting."""
  return jnp.einsum('nce,mce,wc->wnm', a, b, w**2)


@jax.jit
def _weighted_along(a, target, w):
  return jnp.einsum('nce,ce,wc->wn', a, target, w**2)


@jax.jit
def match_gradient(
  total: Float[Array, 'C d'],
  target: Float[Array, 'C d'],
  weights: Float[Array, ' C'],
) -> tuple[Float[Array, ''], Float[Array, 'C d']]:
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
  return _match(num, den), grad


@jax.jit
def match_values(
  totals: Float[Array, 'P C d'],
  target: Float[Array, 'C d'],
  weights: Float[Array, ' C'],
) -> Float[Array, ' P']:
  """:func:`match_gradient`'s objective for each of several sums."""
  w2 = (weights.astype(jnp.float32) ** 2)[None, :, None]
  num = jnp.sum(w2 * totals * target[None], axis=(1, 2))
  den = jnp.sum(w2 * totals * totals, axis=(1, 2))
  return _match(num, den)


@functools.partial(jax.jit, static_argnames=('model',))
def edit_gains(
  model: Model,
  params: PyTree,
  tokens: Int[Array, ' L'],
  length: Int[Array, ''],
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  slot: Int[Array, ' V'],
  readout: Float[Array, 'V d'],
  direction: Float[Array, 'C d'],
) -> tuple[Float[Array, 'L C'], Float[Array, ' L']]:
  """First-order gains of one sentence's single-token edits.

  A sentence adds `h_{j−1}` (the head input after its first j tokens) to
  the raw row of its token j (:func:`sentence_head_rows`; the softmax
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
  tokens: Int[Array, 'P L'],
  lengths: Int[Array, ' P'],
) -> Float[Array, ' P']:
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
  config: HybridConfig,
  ends: Bool[np.ndarray, ' V'] | None = None,
  transform: Float[Array, 'd d'] | None = None,
  progress: Callable[[int, int, float], None] | None = None,
) -> tuple[list[list[int]], dict]:
  """Local search over whole sentences by exact gradient matching.

  The observed head rows are exactly the sum of the batch's sentences'
  own rows (:func:`pool_head_gradients`), so a set of recovered
  sentences can be checked as a whole: the selection's objective
  (:func:`match_gradient`) is highest at the batch itself. For
  `config.refine` sweeps, each sentence in turn: its
  `config.refine_proposals` single-token edits with the largest
  first-order gain (:func:`edit_gains`, :func:`sentence_edits`) get their
  exact rows, and the best one replaces the sentence if it raises the
  objective. Our construction (coordinate ascent over discrete edits
  ranked by a linearisation, as in HotFlip, Ebrahimi et al., ACL 2018,
  applied to a gradient-matching objective as in LAMP, Balunović et al.,
  NeurIPS 2022).

  `transform` maps every row before matching (`rows @ transform`; the
  hybrid passes :func:`head_transform` with `config.select_whiten`;
  default: none). `ends` marks the sentence-ending
  tokens (default: the tokenizer's);
  `progress(sweep, sentence, objective)` is called after each sentence.
  Sweeps stop early when one changes nothing.

  Returns:
    The refined sentences and `{'objective': [m after each sweep, the
    first before any], 'edits': [edits accepted per sweep]}`.
  """
  if ends is None:
    ends = ro.sentence_end_mask(model.tokenizer, model.vocab_size)
  ends = np.asarray(ends, bool)
  candidates = jnp.asarray(padded)
  readout = head_readout(model, params)
  if transform is None:
    transform = jnp.eye(readout.shape[1])
  transform = jnp.asarray(transform, jnp.float32)
  observed = raw_head_rows(model, grads, candidates) @ transform
  weights = jnp.asarray(
    selection_weights(np.asarray(observed), valid, config.select_weight)
  )
  slot = np.full(model.vocab_size, -1, np.int32)
  slot[padded[valid]] = np.flatnonzero(valid)
  slot = jnp.asarray(slot)
  is_end = jnp.asarray(ends[padded] & valid)
  valid_j = jnp.asarray(valid)
  width = max(config.max_length, *map(len, sequences))
  chunk = config.refine_proposals

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
          pool_head_gradients(model, params, t, n, candidates),
          sentence_log_probs(model, params, t, n)
          if config.refine_lm
          else jnp.zeros(len(t)),
        )
      )
    rows = jnp.concatenate([o[0] for o in out])[: len(seqs)] @ transform
    return rows, jnp.concatenate([o[1] for o in out])[: len(seqs)]

  seqs = [list(s) for s in sequences]
  own, logp = rows_of(seqs)
  total = own.sum(0)
  value, _ = match_gradient(total, observed, weights)
  info = {'objective': [float(value)], 'edits': []}
  for sweep in range(config.refine):
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
        config.refine_proposals,
        config.min_length,
      )
      if edits:
        rows, lp = rows_of(edits)
        values = np.asarray(
          match_values(total[None] - own[k][None] + rows, observed, weights)
        )
        with np.errstate(divide='ignore', invalid='ignore'):
          gain = np.log(values / float(value))
        gain = gain + config.refine_lm * (np.asarray(lp) - float(logp[k]))
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


@flax.struct.dataclass
class HybridState:
  """One search's beams (fixed shapes).

  Attributes:
    tokens: int32 `[K, L]`, BOS first.
    length: int32 `[K]`.
    score: float32 `[K]`, summed step scores.
    finished: bool `[K]`, ended at a sentence end.
    alive: bool `[K]`, holds a beam.
    logp: float32 `[K, V]`, the LM's next-token log-probabilities.
    head: float32 `[K, d]`, the head input at the last position (`[K, 1]`
      zeros without a :class:`HeadScore`).
    cache: the LM's decode cache.
    block_cache: the block-1 cache (:meth:`Model.block_decode`).
    step: int32 `[]`, the position the next step fills.
    prior_cache: with `HybridConfig.prior_start`, the decode cache of the
      LM prior's own context (else None).
  """

  tokens: Int[Array, 'K L']
  length: Int[Array, ' K']
  score: Float[Array, ' K']
  finished: Bool[Array, ' K']
  alive: Bool[Array, ' K']
  logp: Float[Array, 'K V']
  head: Float[Array, 'K d']
  cache: PyTree
  block_cache: PyTree
  step: Int[Array, '']
  prior_cache: PyTree = None


def bigram_counts(
  last: Int[Array, ' K'],
  candidates: Int[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  taken_skip: Int[Array, ' G'] | None = None,
) -> Int[Array, 'K C']:
  """How many rows of `taken` hold the bigram `(last[k], candidates[c])`
  at a position past BOS (sentences may share their first word), and,
  with `taken_skip`, at a position `p >= taken_skip[g]` (the bigram
  `(taken[g, p], taken[g, p + 1])`; None: 1 for every row)."""
  pos = jnp.arange(taken.shape[1] - 1)
  skip = (
    jnp.ones(taken_length.shape, jnp.int32)
    if taken_skip is None
    else jnp.maximum(taken_skip, 1)
  )
  ok = (pos[None] >= skip[:, None]) & (pos[None] + 1 < taken_length[:, None])
  first = jnp.where(ok, taken[:, :-1], -1)
  second = jnp.where(ok, taken[:, 1:], -1)
  hit_first = first[None] == last[:, None, None]  # [K, G, L-1]
  # [K, C]: sum over rows g and positions p of hit_first * (second == c).
  onehot = second[..., None] == candidates[None, None]  # [G, L-1, C]
  return jnp.einsum(
    'kgp,gpc->kc', hit_first.astype(jnp.int32), onehot.astype(jnp.int32)
  )


def _own_bigrams(
  tokens: Int[Array, 'K L'],
  length: Int[Array, ' K'],
  last: Int[Array, ' K'],
  candidates: Int[Array, ' C'],
) -> Bool[Array, 'K C']:
  """Whether the bigram `(last[k], candidates[c])` already occurs in row k."""
  pos = jnp.arange(tokens.shape[1] - 1)
  ok = pos[None] + 1 < length[:, None]  # [K, L-1]
  first = jnp.where(ok, tokens[:, :-1], -1) == last[:, None]  # [K, L-1]
  second = jnp.where(ok, tokens[:, 1:], -1)
  hit = first[..., None] & (second[..., None] == candidates[None, None])
  return hit.any(1)


def end_head_terms(
  scores: Float[Array, 'K C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  quantile: float | None,
) -> Float[Array, 'K C']:
  """`scores` with each sentence end's replaced by the `quantile` of its
  row's valid other candidates (None: unchanged; see
  `HybridConfig.end_head_quantile`)."""
  if quantile is None:
    return scores
  others = (valid & ~is_end)[None]
  q = jnp.nanquantile(
    jnp.where(others, scores, jnp.nan), quantile, axis=1, keepdims=True
  )
  q = jnp.where(jnp.isfinite(q), q, 0.0)
  return jnp.where(is_end[None], q, scores)


def _head_input(head: HeadScore | None, logits) -> jax.Array:
  z = logits[:, -1].astype(jnp.float32)
  if head is None:
    return jnp.zeros((z.shape[0], 1), jnp.float32)
  return z @ head.readout


def init_state(
  model: Model,
  params: PyTree,
  start: Int[Array, ''],
  beams: int,
  max_length: int,
  layer: int = 1,
  head: HeadScore | None = None,
  prior_start: int | None = None,
) -> HybridState:
  """Every beam at `start` (BOS); only beam 0 alive; the block cache runs
  up to block `layer`'s input; with `prior_start` the LM prior's
  log-probabilities come from a second context that starts with that
  token instead (`HybridConfig.prior_start`)."""
  cache = model.init_cache(params, beams, max_length + 1)
  first = jnp.full((beams, 1), start, jnp.int32)
  logits, cache = model.decode(params, cache, first)
  prior_logits, prior_cache = logits, None
  if prior_start is not None:
    prior_cache = model.init_cache(params, beams, max_length + 1)
    prior_logits, prior_cache = model.decode(
      params, prior_cache, jnp.full((beams, 1), prior_start, jnp.int32)
    )
  block_cache = model.init_block_cache(
    params, beams, max_length + 1, layer=layer
  )
  _, block_cache = model.block_decode(params, block_cache, first, layer=layer)
  tokens = jnp.zeros((beams, max_length), jnp.int32).at[:, 0].set(start)
  return HybridState(
    tokens=tokens,
    length=jnp.ones((beams,), jnp.int32),
    score=jnp.zeros((beams,), jnp.float32),
    finished=jnp.zeros((beams,), bool),
    alive=jnp.arange(beams) == 0,
    logp=jax.nn.log_softmax(prior_logits[:, -1].astype(jnp.float32), axis=-1),
    head=_head_input(head, logits),
    cache=cache,
    block_cache=block_cache,
    step=jnp.ones((), jnp.int32),
    prior_cache=prior_cache,
  )


def hybrid_step(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  state: HybridState,
  *,
  config: HybridConfig,
  shortlist: int | None = None,
  allowed: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  taken_skip: Int[Array, ' G'] | None = None,
) -> HybridState:
  """One position of the search (pure; `model` and `config` static).

  `shortlist` overrides `config.shortlist` (the first step scores every
  candidate: after BOS the LM's prior says little about which words start
  the batch's sentences, the span says much); `allowed` further restricts
  the candidates of this step (the first: sentence starts); `head` adds
  `config.weight_head` times its scores to the LM's prior (None: no head
  term).
  """
  k, max_len = state.tokens.shape
  s = shortlist or config.shortlist
  i = state.step
  last = state.tokens[:, i - 1]
  lm = state.logp[:, candidates]  # [K, C]
  repeat = _own_bigrams(state.tokens, state.length, last, candidates)
  others = bigram_counts(last, candidates, taken, taken_length, taken_skip)
  open_ = state.alive & ~state.finished
  # No sentence ends before `min_length` tokens (BOS and one word at least).
  early = i + 1 < max(config.min_length, 3)
  ok = valid[None] & ~repeat & open_[:, None] & ~(is_end[None] & early)
  if allowed is not None:
    ok &= allowed[None]
  prior = config.weight_lm * lm - config.weight_diverse * others
  if config.weight_start:
    started = (taken_length > 1)[:, None] & (
      taken[:, 1][:, None] == candidates[None]
    )  # [G, C]
    first = (i == 1).astype(jnp.float32)
    prior = prior - config.weight_start * first * started.sum(0)[None]
  if head is not None:
    prior = prior + config.weight_head * end_head_terms(
      head.scores(state.head), valid, is_end, config.end_head_quantile
    )
    if config.weight_evidence and head.targets is not None:
      prior = prior + config.weight_evidence * head.evidence(
        state.head, jnp.exp(lm)
      )
  prior = jnp.where(ok, prior, -jnp.inf)
  short_prior, short = jax.lax.top_k(prior, s)  # [K, S]
  token = candidates[short]  # [K, S]
  end = is_end[short]
  # Block-2 inputs of the K·S shortlisted extensions.
  cache = jax.tree.map(lambda x: jnp.repeat(x, s, axis=0), state.block_cache)
  x, _ = model.block_decode(
    params, cache, token.reshape(-1, 1), layer=config.span_block
  )
  res = residuals(span2, x[:, 0]).reshape(k, s)
  log_res = jnp.log(res + 1e-12)
  counted = jnp.isfinite(short_prior) & ~end
  ref = jnp.nanquantile(
    jnp.where(counted, log_res, jnp.nan), config.reference_quantile
  )
  ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
  span_term = jnp.where(counted, ref - log_res, 0.0)
  if config.end_as_best:
    # A sentence end scores as well as the beam's best continuation: the
    # span cannot say where a sentence ends, so the LM decides.
    best = jnp.max(jnp.where(counted, span_term, -jnp.inf), 1, keepdims=True)
    end_term = jnp.where(jnp.isfinite(best), best, 0.0)
  else:
    end_term = jnp.zeros((k, 1), jnp.float32)
  span_term = jnp.where(end, end_term, span_term)
  ext = state.score[:, None] + short_prior + config.weight_span * span_term
  ext = jnp.where(jnp.isfinite(short_prior), ext, -jnp.inf)
  # A finished beam competes unchanged (one "stay" entry, column 0).
  stay = state.alive & state.finished
  ext = jnp.where(stay[:, None], -jnp.inf, ext)
  ext = ext.at[:, 0].set(jnp.where(stay, state.score, ext[:, 0]))
  new_len = jnp.where(stay, state.length, state.length + 1)[:, None]
  norm = new_len.astype(jnp.float32) ** config.length_penalty
  key = jnp.where(jnp.isfinite(ext), ext / norm, -jnp.inf).reshape(-1)
  best, pick = jax.lax.top_k(key, k)
  alive = jnp.isfinite(best)
  parent = pick // s
  col = pick % s
  kept = stay[parent]
  tok = token[parent, col]
  tokens = state.tokens[parent]
  tokens = jnp.where(
    (~kept & alive)[:, None] & (jnp.arange(max_len)[None] == i),
    tok[:, None],
    tokens,
  )
  gather = lambda t: jax.tree.map(lambda x: x[parent], t)  # noqa: E731
  logits, lm_cache = model.decode(params, gather(state.cache), tok[:, None])
  _, block_cache = model.block_decode(
    params, gather(state.block_cache), tok[:, None], layer=config.span_block
  )
  prior_logits, prior_cache = logits, None
  if state.prior_cache is not None:
    prior_logits, prior_cache = model.decode(
      params, gather(state.prior_cache), tok[:, None]
    )
  return HybridState(
    tokens=tokens,
    length=jnp.where(kept, state.length[parent], i + 1),
    score=jnp.where(alive, ext.reshape(-1)[pick], -jnp.inf),
    finished=alive & (kept | end[parent, col]),
    alive=alive,
    logp=jax.nn.log_softmax(prior_logits[:, -1].astype(jnp.float32), axis=-1),
    head=_head_input(head, logits),
    cache=lm_cache,
    block_cache=block_cache,
    step=i + 1,
    prior_cache=prior_cache,
  )


@functools.partial(jax.jit, static_argnames=('model', 'config'))
def hybrid_search(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  start: Int[Array, ''],
  is_start: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  *,
  config: HybridConfig,
  taken_skip: Int[Array, ' G'] | None = None,
) -> tuple[Int[Array, ' L'], Int[Array, ''], Float[Array, '']]:
  """One sentence: the best beam's `(tokens [L], length, mean score)`.

  Args:
    model: the attacked model (`decode`, `block_decode`), static.
    params: θ.
    span2: the span of block `config.span_block`'s attention-input
      gradient (:func:`block_span`).
    candidates: int32 `[C]` token ids (the bag and the sentence ends),
      padded; `valid` marks the real ones and `is_end` the sentence ends.
    taken: int32 `[G, L]` sentences recovered before (BOS first), whose
      bigrams are penalised; `taken_length` `[G]` their lengths (0: none).
    start: BOS.
    is_start: bool `[C]`, the candidates a sentence may start with (None:
      any).
    head: the head-gradient term for these candidates (None: none).
    config: settings, static.
    taken_skip: int32 `[G]`, the bigram penalty counts a row's bigrams
      from this position on (:func:`bigram_counts`; None: past BOS).
  """
  rows, lengths, keys = hybrid_beams(
    model,
    params,
    span2,
    candidates,
    valid,
    is_end,
    taken,
    taken_length,
    start,
    is_start,
    head,
    config=config,
    taken_skip=taken_skip,
  )
  return rows[0], lengths[0], keys[0]


@functools.partial(jax.jit, static_argnames=('model', 'config'))
def hybrid_beams(
  model: Model,
  params: PyTree,
  span2: Span,
  candidates: Int[Array, ' C'],
  valid: Bool[Array, ' C'],
  is_end: Bool[Array, ' C'],
  taken: Int[Array, 'G L'],
  taken_length: Int[Array, ' G'],
  start: Int[Array, ''],
  is_start: Bool[Array, ' C'] | None = None,
  head: HeadScore | None = None,
  *,
  config: HybridConfig,
  taken_skip: Int[Array, ' G'] | None = None,
) -> tuple[Int[Array, 'K L'], Int[Array, ' K'], Float[Array, ' K']]:
  """One sentence's final beams, best first: `(tokens [K, L], lengths
  [K], mean scores [K])`, K = `config.beams`; a dead beam scores -inf.
  The arguments are :func:`hybrid_search`'s, whose sentence is row 0.
  """
  if taken.shape[1] != config.max_length:
    raise LeakjaxError('taken must have max_length columns')
  state = init_state(
    model,
    params,
    start,
    config.beams,
    config.max_length,
    config.span_block,
    head,
    config.prior_start,
  )
  state = hybrid_step(
    model,
    params,
    span2,
    candidates,
    valid,
    is_end,
    taken,
    taken_length,
    state,
    config=config,
    shortlist=candidates.shape[0],
    allowed=is_start,
    head=head,
    taken_skip=taken_skip,
  )

  def cond(st):
    return (st.step < config.max_length) & jnp.any(st.alive & ~st.finished)

  def body(st):
    return hybrid_step(
      model,
      params,
      span2,
      candidates,
      valid,
      is_end,
      taken,
      taken_length,
      st,
      config=config,
      head=head,
      taken_skip=taken_skip,
    )

  state = jax.lax.while_loop(cond, body, state)
  norm = state.length.astype(jnp.float32) ** config.length_penalty
  key = jnp.where(state.alive, state.score / norm, -jnp.inf)
  order = jnp.argsort(-key)
  return state.tokens[order], state.length[order], key[order]


@functools.partial(jax.jit, static_argnames=('model', 'span_config'))
def span_candidates(
  model: Model, params: PyTree, grads: PyTree, span_config: sr.SpanConfig
) -> Bool[Array, ' V']:
  """DAGER's layer-1 token filter where it can decide, else the tokens
  closest to block 1's span (as many as its numerical rank, at most the
  rank limit).

  On a RoPE model block 1's input depends on the token only, so its span
  test stays exact while the batch has fewer *distinct* tokens than d,
  past the limit of block 2 (SmolLM2, b = 64: 529 distinct input tokens,
  block 1 valid, block 2 not).
  """
  mask, res, span1 = sr.token_filter(model, params, grads, config=span_config)
  limit = int(span_config.max_rank_fraction * model.hidden_size)
  k = jnp.minimum(span1.rank, limit)
  order = jnp.argsort(res)
  closest = (
    jnp.zeros(res.shape, bool).at[order].set(jnp.arange(res.shape[0]) < k)
  )
  return jnp.where(span1.valid, mask, closest)


@functools.partial(
  jax.jit, static_argnames=('model', 'block', 'drop', 'span_config')
)
def block_span(model, grads, block, drop, span_config):
  """Block `block`'s span: the rank rule's when it finds a gap, else the
  top `d - drop` directions."""
  g2 = sr.block_gradient(model, grads, block)
  exact = span_of(
    g2,
    min_gap_decades=span_config.min_gap_decades,
    max_rank_fraction=span_config.max_rank_fraction,
  )
  top = top_span(g2, drop)
  return jax.tree.map(lambda a, b: jnp.where(exact.valid, a, b), exact, top)


@dataclasses.dataclass
class HybridResult:
  """What the hybrid recovered from one gradient.

  Attributes:
    sequences: token ids of each sentence (BOS first).
    texts: decoded sentences.
    scores: mean score per token of each.
    candidates: the candidate token ids (bag and sentence ends).
    bag: FILM's bag.
    seconds: wall time per stage.
    searched: sentences searched (more than returned with `oversample`).
    pool: token ids of every searched sentence, in search order.
    alternatives: with `config.pool_beams > 1`, each search's other live
      beams (token ids, best first), distinct from its sentence.
    refined: :func:`refine`'s record (empty without `config.refine`).
    starts: with `config.start_dims`, each search's allocated first
      token (token ids, in search order; else empty).
  """

  sequences: list[list[int]]
  texts: list[str]
  scores: list[float]
  candidates: np.ndarray
  bag: bow.Bag
  seconds: dict[str, float]
  searched: int = 0
  pool: list[list[int]] = dataclasses.field(default_factory=list)
  alternatives: list[list[list[int]]] = dataclasses.field(default_factory=list)
  refined: dict = dataclasses.field(default_factory=dict)
  starts: list[int] = dataclasses.field(default_factory=list)


def candidate_tokens(
  model: Model,
  params: PyTree,
  grads: PyTree,
  bag: bow.Bag,
  config: HybridConfig,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The searches' candidate tokens: FILM's bag, the layer-1 filter and
  every sentence end, BOS excluded.

  Returns:
    `(candidates, padded, valid)`: the sorted ids; the same padded with
    zeros to a multiple of `config.bag_bucket`; bool, which of `padded`
    are real.
  """
  tok = model.tokenizer
  ends = ro.sentence_end_mask(tok, model.vocab_size)
  layer1 = np.asarray(span_candidates(model, params, grads, config.span))
  cand_mask = np.asarray(bag.mask, bool) | layer1 | ends
  cand_mask[tok.bos_id] = False
  cands = np.flatnonzero(cand_mask).astype(np.int32)
  if len(cands) < config.shortlist:
    raise LeakjaxError(
      f'{len(cands)} candidates, fewer than the shortlist of'
      f' {config.shortlist}',
      'use a smaller HybridConfig.shortlist',
    )
  size = -(-len(cands) // config.bag_bucket) * config.bag_bucket
  padded = np.zeros(size, np.int32)
  padded[: len(cands)] = cands
  valid = np.arange(size) < len(cands)
  return cands, padded, valid


def selection_weights(
  observed: Float[np.ndarray, 'C d'], valid: np.ndarray, power: float
) -> np.ndarray:
  """float32 `[C]`: `valid · (|row| + 0.1 · median |row|)^(−power)` of
  the observed head rows (`HybridConfig.select_weight`)."""
  weights = np.asarray(valid, np.float32)
  if power:
    norm = np.linalg.norm(np.asarray(observed, np.float64), axis=1)
    floor = 0.1 * np.median(norm[np.asarray(valid, bool)])
    weights = weights * ((norm + floor) ** -power).astype(np.float32)
  return weights


def pool_variants(
  model: Model,
  sequences: Sequence[Sequence[int]],
  config: HybridConfig,
  alternatives: Sequence[Sequence[Sequence[int]]] | None = None,
) -> tuple[list[list[int]], list[int]]:
  """The selection's pool and each variant's search.

  The pool holds each searched sentence and its `alternatives` (other
  beams of the same search, if given), or with `config.cuts` each one's
  :func:`cut_variants`; a variant appears once per search.
  """
  groups = [
    [list(seq), *(alternatives[j] if alternatives else ())]
    for j, seq in enumerate(sequences)
  ]
  if config.cuts:
    tok = model.tokenizer
    ends = ro.sentence_end_mask(tok, model.vocab_size)
    cuttable = np.array([not s[:1].isalnum() for s in tok.token_strings()])
    end_id = _end_token(tok, ends)
    groups = [
      [
        v
        for seq in group
        for v in cut_variants(
          seq,
          is_end=ends,
          cuttable=cuttable,
          end_id=end_id,
          min_length=config.min_length,
        )
      ]
      for group in groups
    ]
  variants, owner = [], []
  for j, group in enumerate(groups):
    seen = set()
    for v in group:
      if tuple(v) not in seen:
        seen.add(tuple(v))
        variants.append(list(v))
        owner.append(j)
  return variants, owner


def pool_grams(
  model: Model,
  params: PyTree,
  grads: PyTree,
  variants: Sequence[Sequence[int]],
  padded: np.ndarray,
  valid: np.ndarray,
  powers: Sequence[float],
  width: int,
  transform: Float[Array, 'd d'] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """:func:`pool_gram` of `variants` against the observed head rows, one
  Gram per weighting power: `[W, P, P]` and `[W, P]`. With `transform`
  every row, observed or a variant's, is matched as `row @ transform`
  (the weights come from the transformed observed rows)."""
  tokens = np.zeros((len(variants), max(width, *map(len, variants))), np.int32)
  for i, v in enumerate(variants):
    tokens[i, : len(v)] = v
  lengths = np.array([len(v) for v in variants], np.int32)
  candidates = jnp.asarray(padded)
  observed = raw_head_rows(model, grads, candidates)
  if transform is not None:
    observed = observed @ transform
  weights = np.stack(
    [selection_weights(np.asarray(observed), valid, q) for q in powers]
  )
  return pool_gram(
    model,
    params,
    tokens,
    lengths,
    candidates,
    observed,
    weights,
    transform=transform,
  )


def select_pool(
  model: Model,
  params: PyTree,
  grads: PyTree,
  sequences: Sequence[Sequence[int]],
  num_sentences: int,
  *,
  padded: np.ndarray,
  valid: np.ndarray,
  config: HybridConfig,
  transform: Float[Array, 'd d'] | None = None,
  alternatives: Sequence[Sequence[Sequence[int]]] | None = None,
) -> tuple[list[list[int]], list[int]]:
  """`num_sentences` of the searched `sequences` (or of their cuts, and
  of each search's `alternatives`: one per search), chosen by matching the
  observed head gradient
  (:func:`pool_grams`, :func:`select_from_gram`; every row times
  `transform` when given).

  Returns:
    The chosen sentences and, for each, the search it came from.
  """
  variants, owner = pool_variants(model, sequences, config, alternatives)
  gram, along = pool_grams(
    model,
    params,
    grads,
    variants,
    padded,
    valid,
    (config.select_weight,),
    config.max_length,
    transform=transform,
  )
  chosen = select_from_gram(
    jnp.asarray(gram[0]),
    jnp.asarray(along[0]),
    num_sentences,
    groups=jnp.asarray(owner, jnp.int32),
  )
  keep = sorted(int(i) for i in np.asarray(chosen))
  return [variants[i] for i in keep], [owner[i] for i in keep]


def _end_token(tok, ends: np.ndarray) -> int:
  """'.' where it is one sentence-ending token, else the first end."""
  ids = tok.encode('.')
  if len(ids) == 1 and ends[ids[0]]:
    return int(ids[0])
  return int(np.flatnonzero(ends)[0])


@dataclasses.dataclass
class Searched:
  """The hybrid's searches before its selection (:func:`search_sentences`).

  Attributes:
    sequences: each search's sentence (token ids, BOS first).
    scores: each one's mean score per token.
    alternatives: with `config.pool_beams > 1`, each search's other live
      beams, best first, distinct from its sentence (else empty).
    starts: with `config.start_dims`, each search's allocated first token
      (else empty).
    candidates: the candidate token ids (bag and sentence ends).
    padded: int32 `[C]` the candidates, padded; `valid` marks the real ones.
    valid: bool `[C]`.
    ends: bool `[V]`, the sentence-ending tokens.
    head: the head-gradient term (None without `config.weight_head`).
    bag: FILM's bag.
    seconds: wall time per stage.
  """

  sequences: list[list[int]]
  scores: list[float]
  alternatives: list[list[list[int]]]
  starts: list[int]
  candidates: np.ndarray
  padded: np.ndarray
  valid: np.ndarray
  ends: np.ndarray
  head: HeadScore | None
  bag: bow.Bag
  seconds: dict[str, float]


def start_mask(
  strings: list[str], padded: np.ndarray, valid: np.ndarray
) -> np.ndarray:
  """The candidates a sentence may start with: FILM Sec. 4.3 starts its
  beams from the bag's capitalised tokens; we also let a sentence start
  with a digit (every valid candidate if none is either). `strings`: the
  tokenizer's token strings."""
  starts = np.array(
    [
      strings[int(t)][:1].isupper() or strings[int(t)][:1].isdigit()
      for t in padded
    ]
  )
  is_start = starts & valid
  return is_start if is_start.any() else valid


def plan_starts(
  model: Model,
  params: PyTree,
  grads: PyTree,
  padded: np.ndarray,
  valid: np.ndarray,
  allowed: np.ndarray,
  num_sentences: int,
  searches: int,
  *,
  key: jax.Array,
  config: HybridConfig,
) -> tuple[np.ndarray, np.ndarray, jax.Array, jax.Array]:
  """`(picks, counts, share, n)`: :func:`estimate_starts` over the
  padded candidates for `num_sentences` sentences, then one allowed start
  per search (:func:`allocate_starts`, `searches` of them; `picks` index
  `padded`)."""
  counts, share, n = estimate_starts(
    model,
    params,
    grads,
    jnp.asarray(padded),
    jnp.asarray(valid),
    jnp.asarray(model.tokenizer.bos_id, jnp.int32),
    num_sentences,
    key=key,
    config=config,
  )
  counts = np.asarray(counts)
  return allocate_starts(counts, allowed, searches), counts, share, n


def search_sentences(
  model: Model,
  params: PyTree,
  grads: PyTree,
  num_sentences: int,
  *,
  config: HybridConfig = HybridConfig(),
  bag: bow.Bag | None = None,
  key: jax.Array | None = None,
) -> Searched:
  """The hybrid's searches, one sentence each, in order (:func:`recover`
  without its selection and refinement; the same arguments)."""
  if num_sentences < 1:
    raise LeakjaxError(f'num_sentences must be >= 1, got {num_sentences}')
  tok = model.tokenizer
  bos = getattr(tok, 'bos_id', None) if tok is not None else None
  if bos is None:
    raise LeakjaxError(
      'the hybrid needs a tokenizer with a BOS token',
      'load the model with its tokenizer',
    )
  seconds = {}
  t0 = time.perf_counter()
  if bag is None:
    bag = bow.extract_bag(model, params, grads)
  ends = ro.sentence_end_mask(tok, model.vocab_size)
  cands, padded, valid = candidate_tokens(model, params, grads, bag, config)
  is_end = ends[padded] & valid
  strings = tok.token_strings()
  is_start = start_mask(strings, padded, valid)
  declared = len(model.paths.attention_inputs)
  if declared < 2:
    raise LeakjaxError(
      'the hybrid needs the attention input kernels of at least two blocks',
      'declare attention_inputs through from_functions / from_flax',
    )
  config = dataclasses.replace(
    config, span_block=max(1, min(config.span_block, declared - 1))
  )
  span2 = block_span(
    model, grads, config.span_block, config.span_dims, config.span
  )
  searches = max(num_sentences, math.ceil(config.oversample * num_sentences))
  shift = targets = None
  if config.start_dims:
    picks, _, shift, targets = plan_starts(
      model,
      params,
      grads,
      padded,
      valid,
      is_start,
      num_sentences,
      searches,
      key=jax.random.key(0) if key is None else key,
      config=config,
    )
    # Sentences given the same first token may share its first word:
    # bigrams inside a taken sentence's first word are not penalised.
    word_start = np.array([not s[:1].isalnum() for s in strings])
  head = None
  if config.weight_head:
    head = head_score(
      model,
      params,
      grads,
      jnp.asarray(padded),
      jnp.asarray(bos, jnp.int32),
      key=jax.random.key(0) if key is None else key,
      config=config,
      valid=jnp.asarray(valid),
      shift=shift,
      targets=targets if config.weight_evidence else None,
    )
  seconds['span'] = time.perf_counter() - t0
  t0 = time.perf_counter()
  taken = np.zeros((searches, config.max_length), np.int32)
  taken_len = np.zeros((searches,), np.int32)
  taken_skip = np.ones((searches,), np.int32)
  args = [jnp.asarray(a) for a in (padded, valid, is_end)]
  sequences, scores, alternatives = [], [], []
  explain = head is not None and config.head_explain
  if explain:
    raw = raw_head_rows(model, grads, args[0])
    _, reference_norm = explained_rows(
      raw, jnp.ones((len(padded), 1), jnp.float32), head.mean, head.whiten
    )
    shares = jnp.zeros_like(raw)
  for j in range(searches):
    if explain and j:
      # N: the batch's targets, estimated from the sentences so far.
      n_targets = num_sentences * float(np.mean(taken_len[:j] - 1))
      rows, _ = explained_rows(
        raw - shares / max(n_targets, 1.0),
        reference_norm,
        head.mean,
        head.whiten,
      )
      head = head.replace(rows=rows)
    search_args = (
      model,
      params,
      span2,
      *args,
      jnp.asarray(taken),
      jnp.asarray(taken_len),
      jnp.asarray(bos, jnp.int32),
      jnp.asarray(
        is_start
        if not config.start_dims
        else np.arange(len(padded)) == picks[j]
      ),
      head,
    )
    skip = jnp.asarray(taken_skip) if config.start_dims else None
    if config.pool_beams > 1:
      rows, lengths, keys = map(
        np.asarray,
        hybrid_beams(*search_args, config=config, taken_skip=skip),
      )
      row, length, score = rows[0], lengths[0], keys[0]
    else:
      row, length, score = hybrid_search(
        *search_args, config=config, taken_skip=skip
      )
    n = int(length)
    seq = np.asarray(row)[:n].tolist()
    if config.pool_beams > 1:
      others = []
      for k in range(1, config.pool_beams):
        other = rows[k][: int(lengths[k])].tolist()
        if np.isfinite(keys[k]) and other != seq and other not in others:
          others.append(other)
      alternatives.append(others)
    taken[j, :n] = seq
    taken_len[j] = n
    if config.start_dims:
      # The bigram (p, p + 1) counts from the first word's end on.
      later = [p for p in range(2, n) if word_start[seq[p]]]
      taken_skip[j] = (later[0] if later else n) - 1
    if explain:
      shares = shares + sentence_head_rows(
        model, params, jnp.asarray(taken[j]), n, args[0], head.readout
      )
    sequences.append(seq)
    scores.append(float(score))
  seconds['search'] = time.perf_counter() - t0
  return Searched(
    sequences=sequences,
    scores=scores,
    alternatives=alternatives,
    starts=[int(padded[j]) for j in picks] if config.start_dims else [],
    candidates=cands,
    padded=padded,
    valid=valid,
    ends=ends,
    head=head,
    bag=bag,
    seconds=seconds,
  )


def recover(
  model: Model,
  params: PyTree,
  grads: PyTree,
  num_sentences: int,
  *,
  config: HybridConfig = HybridConfig(),
  bag: bow.Bag | None = None,
  key: jax.Array | None = None,
) -> HybridResult:
  """`num_sentences` sentences from one gradient (module docstring).

  Args:
    model: the attacked model, with its tokenizer (BOS, sentence ends)
      and the attention inputs of block 2 declared.
    params: θ at which the gradient was taken.
    grads: the observed gradient.
    num_sentences: sentences to recover (the client's batch size, which
      the server knows in FedSGD).
    config: settings.
    bag: FILM's bag (default: :func:`leakjax.attacks.film.bag.extract_bag`
      with its automatic method).
    key: draws the model's samples for the head term's statistics
      (default: `jax.random.key(0)`).

  Returns:
    A :class:`HybridResult`.
  """
  if num_sentences < 1:
    raise LeakjaxError(f'num_sentences must be >= 1, got {num_sentences}')
  found = search_sentences(
    model, params, grads, num_sentences, config=config, bag=bag, key=key
  )
  sequences, scores, head = (
    list(found.sequences),
    list(found.scores),
    found.head,
  )
  padded, valid, seconds = found.padded, found.valid, found.seconds
  alternatives = found.alternatives or None
  tok = model.tokenizer
  searches = len(sequences)
  searched = list(sequences)
  transform = None
  if config.select_whiten:
    transform = (
      head_transform(head.mean, head.whiten)
      if head is not None
      else model_head_transform(model, params, config, key)
    )
  if searches > num_sentences or config.cuts or alternatives:
    t0 = time.perf_counter()
    sequences, owner = select_pool(
      model,
      params,
      grads,
      searched,
      num_sentences,
      padded=padded,
      valid=valid,
      config=config,
      transform=transform,
      alternatives=alternatives,
    )
    scores = [scores[j] for j in owner]
    seconds['select'] = time.perf_counter() - t0
  refined = {}
  if config.refine:
    t0 = time.perf_counter()
    sequences, refined = refine(
      model,
      params,
      grads,
      sequences,
      padded=padded,
      valid=valid,
      config=config,
      ends=found.ends,
      transform=transform,
    )
    seconds['refine'] = time.perf_counter() - t0
  texts = [tok.decode(s, skip_special=True).strip() for s in sequences]
  return HybridResult(
    sequences=sequences,
    texts=texts,
    scores=scores,
    candidates=found.candidates,
    bag=found.bag,
    seconds=seconds,
    searched=len(searched),
    pool=searched,
    alternatives=found.alternatives,
    refined=refined,
    starts=found.starts,
  )


__all__ = [
  'HeadScore',
  'HybridConfig',
  'HybridResult',
  'HybridState',
  'Searched',
  'bigram_counts',
  'block_span',
  'candidate_tokens',
  'cut_variants',
  'pool_gram',
  'pool_grams',
  'pool_variants',
  'select_pool',
  'selection_weights',
  'pool_head_gradients',
  'edit_gains',
  'match_gradient',
  'match_values',
  'refine',
  'sentence_edits',
  'sentence_log_probs',
  'select_by_gradient',
  'select_from_gram',
  'head_readout',
  'head_score',
  'head_statistics',
  'head_transform',
  'model_head_transform',
  'raw_head_rows',
  'sentence_head_rows',
  'whitening',
  'span_candidates',
  'hybrid_beams',
  'hybrid_search',
  'search_sentences',
  'hybrid_step',
  'end_head_terms',
  'explained_rows',
  'init_state',
  'recover',
  'top_span',
]
