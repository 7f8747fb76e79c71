"""The GBoard attack's presets (:class:`leakjax.presets.Presets` of
:class:`GboardConfig`).

* `paper` -- Suliman & Leith's protocol: Algorithm 2's word recovery (every
  word whose bias rose, no threshold) and the client settings and local-DP
  noise levels the paper names. Only fields the paper's text gives are set,
  each with its section; the rest keep the config's defaults (the victim
  model's pre-training, the client corpus, the FedSGD scales s of
  Sec. 4.3.2, whose values are in Fig. 4 only). Two of the paper's rules
  need the true text and are no `threshold_rule` or `keep_rule`: its
  magnitude threshold under noise is read off a plot (Sec. 6.1, Fig. 5b)
  and it keeps the top n_k sentences (Sec. 4.1). Every run reports them
  beside the rule: the best bias cut (`oracle_f1`) and the top-n_k
  sentences (`levenshtein_topn`).
* `strongest` -- the no-oracle word rule `auto`
  (:func:`leakjax.attacks.gboard.recover_words_auto`: the bias FDR cut
  plus the convexity test with little noise, the Gaussian mixture under
  local-DP noise, the Stouffer rule otherwise), its constants chosen on
  the seed-0 SMS run and measured, frozen, on a second θ0 and client
  sentences they never saw (reports/gboard/README.md,
  reports/gboard/heldout/README.md). It sets no keep rule: no report
  compares the keep rules on held-out data by a measure that rewards both
  keeping the right sentences and keeping enough of them, so `keep_rule`
  keeps the config's default.

  from leakjax.attacks.gboard import presets
  cfg = presets.config('paper', num_sentences=(16, 64))
"""

from __future__ import annotations

from leakjax.attacks.gboard import runner
from leakjax.presets import Preset, Presets

# Sec. 4.1: datasets of n_k = 16, 32, 64, 128 and 256 sentences.
PAPER_NUM_SENTENCES = (16, 32, 64, 128, 256)
# Sec. 2.1 and 4.3.1: B = n_k (full batch) or the mini-batch B = 32 of
# Fig. 2's caption (at n_k = 16 that is the full batch, B = 16).
PAPER_BATCH_SIZES = ('full', '32')
# Sec. 4.3.1-4.3.2: FedSGD (E = 1, Fig. 2) and FedAvg with E = 50, 100 and
# 1000 local epochs (Fig. 3a-c).
PAPER_EPOCHS = (1, 50, 100, 1000)

PRESETS = Presets(
  runner.GboardConfig,
  default='strongest',
  paper=Preset(
    description=(
      "Suliman & Leith's protocol: Algorithm 2 and the paper's client and"
      ' noise settings'
    ),
    fields={
      # Sec. 2.3: V = 9502 words incl. <UNK> and <S>, D = 96, 670 units.
      'vocab_size': 9502,
      'embed_dim': 96,
      'units': 670,
      # Sec. 4.1: 4-word sentences.
      'sentence_length': 4,
      'num_sentences': PAPER_NUM_SENTENCES,
      'epochs': PAPER_EPOCHS,
      'batch_sizes': PAPER_BATCH_SIZES,
      # Fig. 3c has every dataset size at E = 1000: no setting is skipped.
      'max_sentence_epochs': max(PAPER_NUM_SENTENCES) * max(PAPER_EPOCHS),
      # Sec. 4.1: "we keep the client learning rate η = 0.001 constant".
      'learning_rate': 1e-3,
      # Sec. 3.1: the loss of a text of T words is J_{1:T} = Σ_t J_t.
      'loss': 'sentence_sum',
      # Algorithm 3's σ (noise η N(0, σ) at every step). Sec. 6.1: 0.001
      # (Fig. 4b), "σ ≥ 0.01 ... with DPSGD-like training, these levels of
      # noise are manageable", and up to σ = 0.1.
      'dpsgd_sigmas': (0.001, 0.01, 0.1),
      # Sec. 6: "everything else as described in Section 4 is kept the
      # same": DPSGD-like training on every n_k and B of Sec. 4, every E.
      'dpsgd_runs': tuple(
        (n_k, b, 10**9)
        for n_k in PAPER_NUM_SENTENCES
        for b in PAPER_BATCH_SIZES
        if b == 'full' or int(b) < n_k  # B >= n_k is the full batch
      ),
      # Algorithm 4's σ (noise N(0, σ) on θ1): σ = 0.0001 (Fig. 6's
      # caption), σ ≥ 0.01 (Sec. 6.1), σ = 0.1 (Sec. 6.2).
      'single_sigmas': (1e-4, 1e-2, 1e-1),
      # Sec. 3.1, Algorithm 2: every word whose bias rose (cut 0).
      'threshold_rule': 'zero',
    },
    chosen=(
      'Suliman & Leith, Sec. 2.3, 3.1 (Algorithm 2), 4.1, 4.3 and 6'
      ' (Algorithms 3 and 4)'
    ),
    measured=(
      'not run as a whole; reports/gboard/ measures its rule (Algorithm 2,'
      ' `zero_f1` in summary.json) and sets the paper statements beside'
      ' the gboard_sms.flags run'
    ),
  ),
  strongest=Preset(
    description=(
      'the no-oracle word rule auto: bias FDR cut and convexity test,'
      ' Gaussian mixture under local DP noise'
    ),
    fields={
      'threshold_rule': 'auto',
      # The FDR level of auto's bias cut, as frozen in the held-out runs.
      'fdr_q': 0.05,
    },
    chosen=(
      'reports/gboard/ (seed-0 θ0, its 400 client sentences; the rules'
      ' and their constants, the true words scoring the choice)'
    ),
    measured=(
      'reports/gboard/heldout/ (seed-1 θ0, the 350 client sentences the'
      ' seed-0 run never used, E <= 100) and reports/gboard/heldout_e1000/'
      ' (the same at E = 1000)'
    ),
  ),
)
DEFAULT = PRESETS.default
config = PRESETS.config
overrides = PRESETS.overrides

__all__ = ['DEFAULT', 'PRESETS', 'config', 'overrides']
