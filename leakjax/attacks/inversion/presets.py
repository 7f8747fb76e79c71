"""Embedding inversion's presets (:class:`leakjax.presets.Presets` of
:class:`InversionConfig`).

* `paper` -- Wan et al. 2024's protocol, as far as the config expresses
  it: BEI and HEI at the layers of Table 2, Embed Parrot (Sec. 4.3) at the
  deep layer of Table 1, trained on one corpus' text alone (Sec. 5.1.1),
  the DCT defense at the layers of Table 6, all four metrics (Sec. 5.1.3).
  The paper gives no optimiser, step count, decoder size for a decoder
  trained from scratch, PPL weight or number of subsets K; those fields
  keep the config's defaults. Its Decode Model, the pretrained GPT-2 XL,
  is not an alias here: `--ep_variants=ep_pretrained --ep_decoder=DIR` with
  a GPT-2 XL checkpoint folder puts it between the adapters.
* `strongest` (the default) -- the best inverter measured: Embed Parrot
  with the ridge-initialised linear skip (ours), the small decoder, 4,000
  steps on 6,000 training texts plus 3,000 sentences sampled from the
  target itself (ours; SmolLM2's `<|endoftext|>`, id 0, starts each).

Where `strongest` stands. Embed Parrot's learning rate, steps, linear skip
and target samples were chosen on the dev split (`split='dev'`: the first
draw of held-out texts per corpus) and measured on the test split
(`split='test'`: a second draw that shares no text with it). On the test
texts it scores within 0.02 ROUGE-1 of its dev scores on every corpus
(reports/embed_parrot/README.md), so the choice lifted it little. Why not
`paper`: on every dev corpus its lead over the `paper` preset's
architecture (`ep`) trained on the same data is more than twice its
largest lead over its nearest neighbours among the runs it was picked from
(the same without the samples, or trained twice as long).

  from leakjax.attacks.inversion import presets
  cfg = presets.config('strongest', num_test=16)
"""

from __future__ import annotations

from leakjax.attacks.inversion import runner
from leakjax.presets import Preset, Presets

PRESETS = Presets(
  runner.InversionConfig,
  default='strongest',
  paper=Preset(
    description="Wan et al. 2024's protocol (Tables 1-6, Sec. 4-5)",
    fields={
      # Table 2: BEI and HEI on Llama2-7B at layers 0, 5, ..., 30 and last.
      'layers': ('0', '5', '10', '15', '20', '25', '30', 'last'),
      # Sec. 5.2.1 and Table 1: Embed Parrot attacks Llama2-7B's layer 30
      # (ChatGLM-6B's 28). The index is taken as it is: on a target with
      # another depth it is not the same depth (SmolLM2-135M has 30
      # blocks, so 30 is its last); the paper picked the layer as one
      # hard for BEI/HEI (Sec. 6), a criterion, not a rule for other depths.
      'deep_layer': 30,
      # Table 6: the defense at Llama2-7B's layers 0 and 30. The number of
      # subsets K is not given (Sec. 5.3.1): `defense_subsets` keeps its
      # default.
      'defense_layers': ('0', '30'),
      # Sec. 5.1.1: 20 % of every data set held out as its test set.
      'test_fraction': 0.2,
      # Sec. 5.1.1, 5.2.1: Embed Parrot is trained on one data set's
      # training split (fingpt-sentiment), with no generated text.
      'train_samples': 0,
      # Sec. 4.3: Input-Adapter -> decoder-only Decode Model ->
      # Output-Adapter, trained with the cosine loss. `ep` is that
      # architecture with the decoder trained from scratch (the paper's
      # GPT-2 XL: see the module docstring). EP+PPL (Table 4) is left off:
      # the paper gives neither the PPL term's weight nor its schedule.
      'ep_variants': ('ep',),
      # Sec. 5.1.3: ROUGE-1, ROUGE-L, SQuAD F1 and Sentence-BERT. The paper
      # scores every text of its test sets (20 % of each corpus);
      # `num_test` and `sbert_limit` are budgets it does not give.
      'sbert': True,
    },
    chosen='Wan et al. 2024, Sec. 4.3, 5.1, Tables 1, 2 and 6',
    measured=(
      'not run as a whole: reports/embed_parrot/ has its BEI/HEI layer'
      ' sweep and its `ep` architecture at layer 25 with other budgets'
    ),
  ),
  strongest=Preset(
    description=(
      'Embed Parrot with a linear skip, 4,000 steps on 6,000 texts and'
      ' 3,000 sentences sampled from the target'
    ),
    fields={
      'ep_variants': ('ep_skip',),
      'ep_width': 256,
      'ep_layers': 2,
      'ep_heads': 4,
      'ep_steps': 4000,
      'ep_batch_size': 32,
      'ep_lr': 1e-3,
      'ep_ppl_steps': 0,
      'num_train': 6000,
      'max_length': 64,
      'train_samples': 3000,
      'sample_start_id': 0,
      'sample_temperature': 1.0,
      'sample_top_p': 0.95,
    },
    chosen=(
      'reports/embed_parrot/README.md, "Embed Parrot with a pretrained'
      ' Decode Model" (pretrained/scratch_skip_samples_layer_25: SmolLM2-135M'
      ' layer 25, the dev split of the held-out Enron, WikiText-2 and SMS'
      ' texts)'
    ),
    measured=(
      'reports/embed_parrot/pretrained/scratch_skip_samples_layer_25_test/'
      ' (the test split: 100 other held-out texts per corpus)'
    ),
  ),
)
DEFAULT = PRESETS.default
config = PRESETS.config
overrides = PRESETS.overrides

__all__ = ['DEFAULT', 'PRESETS', 'config', 'overrides']
