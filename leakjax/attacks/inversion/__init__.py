"""Embedding inversion (Wan et al. 2024): BEI, HEI, Embed Parrot, DCT defense.

* :mod:`bei_hei` -- layer states `H^i`, BEI (Sec. 4.1) and HEI (Sec. 4.2)
  kernels, the location of block i, the model run with a transform at
  layer i;
* :mod:`dct` -- the DCT/overlap defense (Sec. 5.3.1) and its perplexity;
* :mod:`embed_parrot` -- the Embed Parrot model (Sec. 4.3) and its training;
* :mod:`exact` -- exact inversion by sequential verification (Nikolaou et
  al., arXiv 2510.15511) with learned proposals;
* :mod:`presets` -- the named settings of the experiment (`paper`,
  `strongest`), :class:`leakjax.presets.Presets` of its config;
* :mod:`runner` -- the experiment (Tables 2-6), read top-down from
  `runner.run(config, writer)`: :class:`InversionConfig`, the texts
  (:mod:`texts`), the target's cached hidden states (:mod:`hidden_states`),
  the BEI/HEI and defense sweeps (:mod:`sweeps`), Embed Parrot's training
  and scores (:mod:`parrot_runs`), the result rows (:mod:`scoring`).

>>> states = layer_states(model, params, ids, mask, (0, 25))  # doctest: +SKIP
>>> guess = hei_ids(states[1], model.word_embeddings(params))  # doctest: +SKIP
"""

from leakjax.attacks.inversion import (
  bei_hei,
  dct,
  embed_parrot,
  presets,
  runner,
)
from leakjax.attacks.inversion.bei_hei import (
  bei_hei_ids,
  bei_ids,
  decode_ids,
  hei_ids,
  layer_states,
)
from leakjax.attacks.inversion.dct import (
  DCTDefense,
  apply_dct_defense,
  defended_nll,
  make_dct_defense,
)
from leakjax.attacks.inversion.embed_parrot import (
  EmbedParrot,
  EmbedParrotConfig,
  EmbedParrotLoss,
  predict_batches,
  train,
)
from leakjax.attacks.inversion.runner import InversionConfig, InversionRun

__all__ = [
  'DCTDefense',
  'EmbedParrot',
  'EmbedParrotConfig',
  'EmbedParrotLoss',
  'InversionConfig',
  'InversionRun',
  'apply_dct_defense',
  'bei_hei',
  'bei_hei_ids',
  'bei_ids',
  'dct',
  'decode_ids',
  'defended_nll',
  'embed_parrot',
  'hei_ids',
  'layer_states',
  'make_dct_defense',
  'predict_batches',
  'presets',
  'runner',
  'train',
]
