"""The hybrid's settings: :class:`HybridConfig`, every weight and switch of
the search and the selection with why each default is what it is, and
:class:`SearchConfig`, the part the search kernel reads.

The host loop jits the kernel (:func:`hybrid_search`) with its config
static, so it gets :attr:`HybridConfig.search` only: a setting that the
host loop or the selection alone reads (`oversample`, `cuts`,
`pool_beams`, `select_weight`, `select_whiten`, the head statistics'
sample sizes, `start_dims`, `span_dims`, `bag_bucket`, `span`) can change
without a recompile."""

from __future__ import annotations

import dataclasses

from leakjax.attacks.dager import search as sr
from leakjax.errors import LeakjaxError


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """What the search kernel reads (hashable, static; the fields mean what
  :class:`HybridConfig`'s of the same name do). Build it with
  :attr:`HybridConfig.search`."""

  beams: int = 8
  shortlist: int = 32
  span_block: int = 1
  weight_lm: float = 0.6
  weight_head: float = 12.0
  weight_evidence: float = 0.0
  weight_span: float = 1.0
  weight_diverse: float = 1.0
  weight_start: float = 3.0
  prior_start: int | None = None
  reference_quantile: float = 0.5
  end_as_best: bool = True
  length_penalty: float = 1.0
  min_length: int = 3
  max_length: int = 41


@dataclasses.dataclass(frozen=True)
class HybridConfig:
  """The hybrid's settings (hashable). The search kernel gets
  :attr:`search`, the fields it reads; the others are the host loop's and
  the selection's.

  Attributes:
    beams: beams per search.
    shortlist: candidates per beam and step whose span residual is
      computed (the LM's likeliest among the candidates).
    span_dims: the span is the gradient's top `d - span_dims` singular
      directions (past the rank limit the spectrum has no gap, so the
      cut is a choice: keeping more directions separates true from random
      extensions better until the last ones, which are the noise floor).
    span_block: the block whose attention-input gradient scores the
      extensions (DAGER uses block 1, counting from 0: the second). The
      deepest block the model declares in `attention_inputs`, up to this
      one, is used. Past the rank limit deeper inputs separate the true
      token from the LM's likeliest wrong one better, but each block
      deeper costs one block pass per scored extension, so the default
      stays DAGER's block 1 (reports/dager/README.md).
    weight_lm: weight of the LM log-probability.
    weight_head: weight of the head-gradient term (:class:`HeadScore`, a
      cosine in [-1, 1]; 0: off), 20 x `weight_lm`: given the true prefix
      the head term ranks the true next token first more often than the
      LM alone, and the sum more often than either; half and twice the
      ratio do a little worse (`reports/dager/head_ranks.json`).
    weight_evidence: weight of the head rows' log-likelihood ratio
      (:meth:`HeadScore.evidence`), added to the head term; it needs the
      batch's number of targets, which comes from :func:`start_counts`,
      so `start_dims > 0` (0: off). 30 was chosen from the true-prefix
      ranking of `reports/dager/head_ranks.json`; end to end, with
      allocated starts, the prior after `<|endoftext|>` and the whitened
      cuts, it lifts ROUGE-L on SmolLM2, Enron, b = 64 batches 0-2
      (`reports/dager/hybrid_evidence/`; without it:
      `reports/dager/hybrid_starts/selection_whiten.json`).
    head_samples: sequences sampled from the model for the head inputs'
      mean and covariance (:func:`head_statistics`).
    head_sample_length: tokens per sampled sequence.
    head_shrinkage: the covariance is shrunk towards `shrinkage · tr/d · I`
      before whitening (a tenth and ten times it rank no better in
      `reports/dager/head_ranks.json`).
    oversample: run `ceil(oversample · num_sentences)` searches and keep
      `num_sentences` of them, chosen by matching the observed head
      gradient with each sentence's own (:func:`pool_head_gradients`,
      :func:`select_by_gradient`; our construction, in the spirit of
      LAMP's gradient-matching selection, Balunović et al., NeurIPS 2022).
      With `start_dims`, the extra searches' starts are allocated from the
      same estimated counts (:func:`allocate_starts`). With the starts,
      the prior after `<|endoftext|>`, `weight_evidence` and the whitened
      cuts, 1.5 lifts ROUGE-L on SmolLM2, Enron, b = 64 batches 0-2
      (`reports/dager/hybrid_evidence_oversample/`; the first b searches
      are the same). 1 (the default): every search's sentence is kept.
      Host only.
    cuts: the selection's pool also holds each searched sentence cut at
      every word boundary and closed by a sentence end
      (:func:`cut_variants`), and keeps at most one variant per search
      (with `oversample = 1` it chooses where each sentence ends). False
      (the default): the sentences as searched. Host only.
    pool_beams: the selection's pool also holds each search's next
      `pool_beams - 1` live beams (:func:`hybrid_beams`; with `cuts`,
      their cuts too), still at most one variant per search. 1 (the
      default): each search's best beam only. Host only.
    select_weight: the selection scales each candidate's head row, in the
      observed gradient and in every sentence's own, by
      `(|row| + 0.1 · median |row|)^(−select_weight)`: 0 (the default)
      matches the raw rows, where the batch's frequent tokens dominate;
      1 gives every token's row about the same say. Host only.
    select_whiten: the selection matches every row centred and whitened
      as the head term is (:func:`head_transform`): the head inputs'
      common direction no longer dominates the match; on the same
      searches it raises ROUGE-L (`reports/dager/hybrid_cuts/`,
      `selection_whiten.json`). False (the default): the raw rows, as
      the committed runs. Host only.
    weight_span: weight of the span term `log(r̄ / r)`.
    weight_diverse: penalty per earlier sentence that holds the bigram.
    weight_start: penalty, on a sentence's first word, per earlier
      sentence that starts with it (the bigram penalty skips BOS, since
      sentences may share their first word; 0: none). Without it most
      searches share the same few first words
      (`reports/dager/hybrid_head_only/results.jsonl`).
    start_dims: with `start_dims > 0`, each search's first token is
      fixed in advance: :func:`start_counts` estimates how many sentences
      start with each candidate from the head gradient at BOS (projecting
      out this many principal directions of the model's own head inputs),
      and :func:`allocate_starts` hands one start to each search, largest
      counts first (0: off, the searches choose their first tokens as
      any other). With 64 directions the allocated starts match nearly
      every sentence's first token, far more than the default search's
      own first words (`reports/dager/starts.json`). Host only.
    prior_start: the token the LM prior's context starts with in place
      of BOS (None: BOS, the batch's own). The head input, the span and
      the gradient's expected part keep BOS, since the batch was encoded
      with it; only `log p(v | prefix)` is read from the other context.
      SmolLM2 declares `<|im_start|>` its BOS: after it and the first
      word 'The' its likeliest next tokens are letters glued on, after
      `<|endoftext|>` (its document separator, id 0) they are words
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
      compiles). Host only.
    span: the rank rule; when it finds a gap (below the rank limit) the
      search uses that exact span instead of the top directions. Host
      only.

  Settings that lost their study left the library; their evidence stays
  in `reports/dager/`: a head term scaled by the row norm
  (`hybrid_end_power/`), a sentence end's head term from the other
  candidates' (`hybrid_end/`), explaining away each recovered sentence's
  share (`hybrid_explain/`) and local search over the kept sentences
  (`hybrid_cuts/refine.json`, :mod:`studies.dager.refine`).
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
  oversample: float = 1.0
  cuts: bool = False
  pool_beams: int = 1
  select_weight: float = 0.0
  select_whiten: bool = False
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

  @property
  def search(self) -> SearchConfig:
    """The fields the search kernel reads (its static config)."""
    return SearchConfig(
      **{
        f.name: getattr(self, f.name) for f in dataclasses.fields(SearchConfig)
      }
    )

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
    if self.head_shrinkage < 0:
      raise LeakjaxError('HybridConfig.head_shrinkage must be >= 0')
    if not self.oversample >= 1.0:
      raise LeakjaxError(
        f'HybridConfig.oversample must be >= 1, got {self.oversample!r}'
      )
    if not self.select_weight >= 0.0:
      raise LeakjaxError(
        f'HybridConfig.select_weight must be >= 0, got {self.select_weight!r}'
      )
    if not self.weight_start >= 0.0 or not self.weight_head >= 0.0:
      raise LeakjaxError(
        'HybridConfig.weight_start and weight_head must be >= 0, got'
        f' {self.weight_start!r}, {self.weight_head!r}'
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
    if not 0.0 <= self.reference_quantile <= 1.0:
      raise LeakjaxError('HybridConfig.reference_quantile must be in [0, 1]')
