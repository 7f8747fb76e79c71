"""The per-layer BEI/HEI sweep and the DCT defense sweep of the inversion run.

:func:`score_layers` scores BEI and HEI (Wan et al. Sec. 4.1-4.2) at every
attacked layer of every corpus (Tables 2-3); :func:`score_defenses` the
DCT/overlap defense (Sec. 5.3.1): attack scores on defended states and the
target's perplexity with and without the defense (Table 6).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import io
from leakjax._jit import jitted
from leakjax.attacks.inversion import dct
from leakjax.attacks.inversion import embed_parrot as ep
from leakjax.attacks.inversion.hidden_states import (
  States,
  Target,
  invert_states,
  width_batches,
)
from leakjax.attacks.inversion.scoring import Recorder
from leakjax.attacks.inversion.texts import Split

if TYPE_CHECKING:
  from leakjax.attacks.inversion.runner import InversionConfig


def score_layers(recorder: Recorder, target: Target, states: States) -> None:
  """BEI and HEI at every layer of `target.layers`, every corpus."""
  counter = io.Progress(len(states.tests) * len(target.layers) * 2)
  for name, split in states.tests.items():
    for li, layer in enumerate(target.layers):
      for method in ('bei', 'hei'):
        _, fresh = recorder.score_ids(
          states.passes[name][method][li],
          split,
          'inversion',
          data=name,
          layer=str(layer),
          method=method,
        )
        if fresh is None:
          counter.skipped()
          continue
        counter.computed()
        logging.info(
          '[%s] %s layer %s %s scored', counter.describe(), name, layer, method
        )
  logging.info('per-layer BEI/HEI scored')


def corpus_ppl(
  target: Target,
  ppl_splits: dict[str, Split],
  batch_size: int,
  layer,
  overlap,
) -> float:
  """The target's perplexity over `ppl_splits`, with the defense's
  `overlap` at `layer` (None, None: undefended)."""
  # One compile per layer, not per defense: the overlap is an argument.
  defended_nll = jitted(dct.defended_nll, static_argnames=('model', 'layer'))
  fn = functools.partial(defended_nll, target.model, layer=layer)
  total, count = 0.0, 0.0
  for split in ppl_splits.values():
    for rows, real, width in width_batches(
      split.mask.sum(1), batch_size, split.ids.shape[1], multiple=32
    ):
      nll, cnt = fn(
        target.params,
        jnp.asarray(split.ids[rows, :width]),
        jnp.asarray(split.mask[rows, :width]),
        overlap=overlap,
      )
      total += float(np.asarray(nll)[:real].sum())
      count += float(np.asarray(cnt)[:real].sum())
  return math.exp(total / max(count, 1.0))


def score_defenses(
  cfg: InversionConfig,
  recorder: Recorder,
  target: Target,
  states: States,
  variants: dict[str, tuple[ep.EmbedParrotConfig, Any]],
  *,
  key: jax.Array,
) -> None:
  """The DCT defense with k = `cfg.defense_subsets` at every defense layer.

  Each defense (drawn with `fold_in(key, 1000 + k)`) gives the target's
  perplexity on the first `cfg.ppl_texts` texts of every corpus and the
  scores of HEI, BEI and (at the deep layer) every Embed Parrot variant
  on the defended states.
  """
  writer, summary = recorder.writer, recorder.summary
  model, params = target.model, target.params
  ppl_splits = {
    name: s.first(cfg.ppl_texts) for name, s in states.tests.items()
  }
  ppl = functools.partial(corpus_ppl, target, ppl_splits, cfg.batch_size)
  row = writer.done(kind='ppl', defense='none')
  if row is None:
    writer.add_result(
      {'kind': 'ppl', 'defense': 'none', 'ppl': ppl(None, None)}
    )
    row = writer.results[-1]
  summary[io.summary_key('ppl', defense='none')] = row['ppl']
  for layer in target.defense_layers:
    li = target.keep_layers.index(layer)
    for subsets in cfg.defense_subsets:
      defense = dct.make_dct_defense(
        model.hidden_size, subsets, key=jax.random.fold_in(key, 1000 + subsets)
      )
      tag = dict(defense='dct', layer=str(layer), subsets=subsets)
      row = writer.done(kind='ppl', **tag)
      if row is None:
        writer.add_result(
          {'kind': 'ppl', **tag, 'ppl': ppl(layer, defense.overlap)}
        )
        row = writer.results[-1]
      summary[io.summary_key('ppl', **tag)] = row['ppl']
      methods = ('hei', 'bei') + (
        tuple(variants) if layer == target.deep else ()
      )
      for name, split in states.tests.items():
        if recorder.all_done(
          [dict(kind='defense', data=name, method=m, **tag) for m in methods]
        ):
          continue
        hidden = states.passes[name]['keep'][li]
        defended = np.concatenate(
          [
            np.asarray(
              jitted(dct.apply_dct_defense)(
                jnp.asarray(hidden[s : s + cfg.batch_size], jnp.float32),
                defense.overlap,
              )
            )
            for s in range(0, len(hidden), cfg.batch_size)
          ]
        )
        bei_ids, hei_ids = invert_states(
          model, params, defended, cfg.batch_size
        )
        recorder.score_ids(
          hei_ids, split, 'defense', data=name, method='hei', **tag
        )
        recorder.score_ids(
          bei_ids, split, 'defense', data=name, method='bei', **tag
        )
        for variant, (ep_config, variables) in variants.items():
          if variant not in methods:
            continue
          pred = ep.predict_batches(
            ep_config,
            variables,
            defended,
            split.mask,
            batch_size=cfg.batch_size,
          )
          recorder.score_ids(
            invert_states(model, params, pred, cfg.batch_size)[1],
            split,
            'defense',
            data=name,
            method=variant,
            **tag,
          )
  logging.info('defense scored')
