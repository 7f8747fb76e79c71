"""The hybrid's settings (:class:`HybridConfig`): every weight and switch
of the search, the selection and the refinement, with why each default is
what it is."""

from __future__ import annotations

import dataclasses

from leakjax.attacks.dager import search as sr
from leakjax.errors import LeakjaxError


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
