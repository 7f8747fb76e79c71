"""FILM's presets (:class:`leakjax.presets.Presets` of :class:`FilmConfig`).

* `paper` -- FILM's own protocol (Gupta et al., NeurIPS 2022): the attack
  settings of Sec. 4.3-4.4 and 7, the fine-tuning of Sec. 6.1-6.2, the
  batches of Table 10 and the preprocessing of Appendix B.1. Only what the
  paper states is set; the model and the data stay the caller's (the paper
  attacks GPT-2, the default here is SmolLM2-135M).
* `strongest` -- the best setting measured on data it was not chosen on.
  No setting of ours has beaten the paper's on held-out batches yet, so it
  sets the same fields as `paper` (its record says so).

  from leakjax.attacks.film import presets
  cfg = presets.config('paper', data='film-enron', batch_sizes=(16,))

Left at their defaults, because the paper gives no value that carries over:
the held-out split (Appendix B.1 keeps 2,000 sentences, a count, not the
fraction `eval_fraction` is), the perplexity filter (Appendix B.1: < 50 on
GPT-2, a threshold of that model; the named `film-enron` data set is the
paper's filtered output already), the n-gram penalty ρ (Alg. 1 leaves it
open), the start-prompt count, the reordering candidates per step, and the bag method
(Sec. 4.2 reads the non-zero embedding-gradient rows, which a tied head
fills; `auto` picks the method the model allows). How often the held-out
loss is evaluated is ours (Sec. 6.1 does not say): every 500 steps.
"""

from __future__ import annotations

from leakjax.attacks.film import runner
from leakjax.presets import Preset, Presets

# FILM's protocol, field by field, each with where the paper states it.
PAPER_FIELDS = {
  # Appendix B.1: sentences of fewer than 40 tokens with at least one named
  # entity (PERSON, ORG, GPE, LOC, PRODUCT, EVENT).
  'max_tokens': 40,
  'require_entity': True,
  # Sec. 6.2: fine-tuning starts from the pretrained model.
  'init': 'pretrained',
  # Sec. 6.1: 90,000 iterations at an initial learning rate of 1e-5,
  # linearly decayed, with early stopping: "until the loss of the model on
  # the evaluation set increased" (one evaluation without a lower loss).
  'train_steps': 90_000,
  'learning_rate': 1e-5,
  'early_stopping_patience': 1,
  # Sec. 6.1 does not say how often the held-out loss is evaluated. Our
  # decision: every 500 steps, as experiments/configs/film_enron.flags
  # (with the default, four evaluations over 90,000 steps, the first would
  # come after 22,500 steps, far past where a small corpus is memorised).
  'eval_every': 500,
  # Sec. 6.2 and Appendix B.7: "the batch size for training b = 16".
  'train_batch_size': 16,
  # Sec. 6.2, Fig. 3 and Table 10: b = 1, 16, 64, 128, 20 batches each.
  'batch_sizes': (1, 16, 64, 128),
  'num_batches': 20,
  # Sec. 7, Fig. 5: beam size 32 is the best trade-off; the penalty on
  # repeated 2-grams (Sec. 4.3) is the one closest to the oracle.
  'num_beams': (32,),
  'ngram_size': (2,),
  # Sec. 4.3: "until the generated sentence reaches a specified length (we
  # use 40 words)".
  'length': 40,
  # Appendix A, Alg. 1: one pool of beams over all the prompts (π¹ = P).
  'prompts_per_search': 0,
  # Sec. 7, Fig. 6: β = 1 in S(x) = perplexity + β‖∇‖ (Eq. 4).
  'beta': (1.0,),
  # Sec. 4.4: 200 phrase-wise, then 200 token-wise reordering steps, after
  # cutting after the first punctuation when that lowers S (footnote 6).
  'phrase_steps': 200,
  'token_steps': 200,
  'truncate': True,
}

PRESETS = Presets(
  runner.FilmConfig,
  default='strongest',
  paper=Preset(
    description=(
      "FILM's protocol: beam 32, bigram penalty, beta 1, 200 + 200"
      ' reordering steps, fine-tuned with early stopping'
    ),
    fields=PAPER_FIELDS,
    chosen=(
      'Gupta et al., NeurIPS 2022 (Sec. 4.3-4.4, 6.1-6.2, 7, Table 10,'
      ' Appendix B.1)'
    ),
    measured=(
      'not at full scale (experiments/configs/film_enron.flags needs a'
      ' GPU); reports/film_enron/ holds a reduced CPU protocol'
    ),
  ),
  strongest=Preset(
    description=(
      "the paper's settings: none of ours has beaten them on held-out data"
    ),
    fields=dict(PAPER_FIELDS),
    chosen="the paper's (see `paper`)",
    measured=(
      "no setting measured on held-out data beats the paper's yet; the"
      " paper's early stopping, on the reduced CPU protocol: chosen on"
      ' batches 0-19 (reports/film_enron/), measured on batches 20-39'
      ' (reports/film_enron/test/)'
    ),
  ),
)
DEFAULT = PRESETS.default
config = PRESETS.config
overrides = PRESETS.overrides

__all__ = ['DEFAULT', 'PAPER_FIELDS', 'PRESETS', 'config', 'overrides']
