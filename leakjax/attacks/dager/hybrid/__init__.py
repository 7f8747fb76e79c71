"""Past the rank limit: FILM's bag and beam search, scored by block 2's span
and the head gradient.

When a batch holds more input positions than the width d, the span of a
projection gradient is the whole space and DAGER's test cannot decide
(Petrov et al., NeurIPS 2024, arXiv 2405.15586). It still carries
evidence: true block-2 inputs sit closer to the span of the gradient's top
singular directions than wrong extensions do (on SmolLM2 at b = 64 the
residual to the top `d - 16` directions tells a true extension from a
random one of the batch's tokens well above chance, though not
reliably). FILM (Gupta et al., NeurIPS 2022) has the complementary
evidence: the batch's bag of words from the embedding gradient, and the
language model's prior. The head matrix's gradient has one row per token,
so no rank limit: a token's row points away from the head inputs of the
contexts it followed in the batch (:class:`HeadScore`). This package
combines the three (our construction; no paper describes it):

* candidates: the bag, DAGER's layer-1 token filter
  (:func:`span_candidates`) and every sentence-ending token. The bag
  alone misses frequent tokens (' the', ' to', ',';
  reports/dager/README.md), the layer-1 filter the last token of each
  sentence (no gradient), which is mostly a sentence end;
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

Read top-down from :mod:`loop`:

* :mod:`config` -- :class:`HybridConfig`, the settings, and
  :class:`SearchConfig`, the part the search kernel reads;
* :mod:`spans` -- block 2's span and the candidate tokens;
* :mod:`heads` -- the head gradient's evidence (:class:`HeadScore`) and
  each sentence's own head rows;
* :mod:`starts` -- each search's first token, from the head gradient at
  BOS;
* :mod:`kernel` -- the search, one `lax.while_loop` per sentence;
* :mod:`selection` -- the searched sentences the batch holds, by gradient
  matching;
* :mod:`loop` -- :func:`recover`: the searches, then the selection.
"""

from leakjax.attacks.dager.hybrid.config import HybridConfig, SearchConfig
from leakjax.attacks.dager.hybrid.heads import (
  HeadScore,
  head_readout,
  head_score,
  head_statistics,
  head_transform,
  model_head_transform,
  pool_head_gradients,
  raw_head_rows,
  sample_head_inputs,
  whitening,
)
from leakjax.attacks.dager.hybrid.kernel import (
  HybridState,
  bigram_counts,
  hybrid_beams,
  hybrid_search,
  hybrid_step,
  init_state,
)
from leakjax.attacks.dager.hybrid.loop import (
  HybridResult,
  Searched,
  recover,
  search_sentences,
)
from leakjax.attacks.dager.hybrid.selection import (
  cut_variants,
  pool_gram,
  pool_grams,
  pool_variants,
  select_by_gradient,
  select_from_gram,
  select_pool,
  selection_weights,
)
from leakjax.attacks.dager.hybrid.spans import (
  block_span,
  candidate_tokens,
  span_candidates,
  top_span,
)
from leakjax.attacks.dager.hybrid.starts import (
  allocate_starts,
  estimate_starts,
  plan_starts,
  start_counts,
  start_mask,
)

__all__ = [
  'HeadScore',
  'HybridConfig',
  'HybridResult',
  'HybridState',
  'SearchConfig',
  'Searched',
  'allocate_starts',
  'bigram_counts',
  'block_span',
  'candidate_tokens',
  'cut_variants',
  'estimate_starts',
  'head_readout',
  'head_score',
  'head_statistics',
  'head_transform',
  'hybrid_beams',
  'hybrid_search',
  'hybrid_step',
  'init_state',
  'model_head_transform',
  'plan_starts',
  'pool_gram',
  'pool_grams',
  'pool_head_gradients',
  'pool_variants',
  'raw_head_rows',
  'recover',
  'sample_head_inputs',
  'search_sentences',
  'select_by_gradient',
  'select_from_gram',
  'select_pool',
  'selection_weights',
  'span_candidates',
  'start_counts',
  'start_mask',
  'top_span',
  'whitening',
]
