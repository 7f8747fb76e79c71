"""Embed Parrot in the inversion run: its training and its scores.

:func:`train_variants` trains every variant of `cfg.ep_variants` (Wan et
al. Sec. 4.3) on the training texts' states at the deep layer, and
:func:`train_ppl` fine-tunes the first with the perplexity term (EP+PPL);
both checkpoint under the cache folder, keyed by everything they depend
on. :func:`score_variants` scores each variant on every corpus (Tables 1
and 4) and by sequence-length bucket (Table 5).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from absl import logging

from leakjax import io, models, provenance
from leakjax.attacks.inversion import bei_hei
from leakjax.attacks.inversion import embed_parrot as ep
from leakjax.attacks.inversion.hidden_states import (
  States,
  Target,
  cache_key,
  invert_states,
)
from leakjax.attacks.inversion.scoring import BUCKETS, Recorder, bucket_name

if TYPE_CHECKING:
  from leakjax.attacks.inversion.runner import InversionConfig
  from leakjax.train import TrainConfig

# variant -> (its Embed Parrot config, its trained variables)
Variants = dict[str, tuple[ep.EmbedParrotConfig, Any]]


def train_config(cfg: InversionConfig, states: States) -> TrainConfig:
  """The training config of the variants trained from scratch."""
  return ep.train_config(
    cfg.ep_steps,
    min(cfg.ep_batch_size, len(states.train.texts)),
    learning_rate=cfg.ep_lr,
    warmup_steps=max(cfg.ep_steps // 20, 1),
    log_every=max(cfg.ep_steps // 30, 1),
    checkpoint_every=max(cfg.ep_steps // 6, 1),
    seed=cfg.seed,
  )


def train_variants(
  cfg: InversionConfig,
  target: Target,
  states: States,
  *,
  key: jax.Array,
  cache_dir: Path,
  workdir: Path,
) -> tuple[Variants, dict[str, list[dict[str, float]]]]:
  """Every variant of `cfg.ep_variants`, trained (or restored).

  Each trains with `fold_in(key, 1)` in `<cache_dir>/<variant>_<key>`;
  its logged metrics go to `<workdir>/<variant>_history.json`.

  Returns:
    `(variants, histories)`: variant -> (config, variables), and variant
    -> its logged training metrics.
  """
  d = target.model.hidden_size
  base_cfg = train_config(cfg, states)
  variants: Variants = {}
  histories: dict[str, list[dict[str, float]]] = {}
  for variant in cfg.ep_variants:
    variant_cfg, decoder_params, decoder_weights = base_cfg, None, None
    if variant == 'ep_pretrained':
      decoder, decoder_params, decoder_weights = load_decoder(cfg, target)
      ep_config = ep.EmbedParrotConfig(
        input_dim=d,
        output_dim=d,
        decoder=decoder,
        ridge_input_adapter=decoder.hidden_size == d,
      )
      # Two checkpoints, not six: each holds the whole decoder and its
      # optimiser state (1.6 GB for SmolLM2-135M).
      variant_cfg = dataclasses.replace(
        base_cfg,
        learning_rate=cfg.ep_decoder_lr,
        checkpoint_every=max(cfg.ep_steps // 2, 1),
      )
    else:
      ep_config = ep.EmbedParrotConfig(
        input_dim=d,
        output_dim=d,
        width=cfg.ep_width,
        num_layers=cfg.ep_layers,
        num_heads=cfg.ep_heads,
        linear_skip=variant == 'ep_skip',
      )
    ep_key = (
      cache_key(states.train_key, ep_config, variant_cfg)
      if decoder_weights is None
      else cache_key(states.train_key, ep_config, variant_cfg, decoder_weights)
    )
    variables, history = ep.train(
      ep_config,
      states.train_keep[1],
      states.train_keep[0],
      states.train.score_mask,
      variant_cfg,
      key=jax.random.fold_in(key, 1),
      workdir=cache_dir / f'{variant}_{ep_key}',
      decoder_params=decoder_params,
      progress=True,
    )
    if io.is_primary():
      history_path = workdir / f'{variant}_history.json'
      io.atomic_write_text(history_path, json.dumps(history, indent=1))
    variants[variant] = (ep_config, variables)
    histories[variant] = history
  return variants, histories


def train_ppl(
  cfg: InversionConfig,
  target: Target,
  states: States,
  variants: Variants,
  *,
  key: jax.Array,
  cache_dir: Path,
  workdir: Path,
) -> Variants:
  """EP+PPL: the first variant fine-tuned with the perplexity term.

  Trains with `fold_in(key, 2)` in `<cache_dir>/<variant>_ppl_<key>`; its
  logged metrics go to `<workdir>/<variant>_ppl_history.json`.

  Returns:
    `{'<variant>_ppl': (config, variables)}`.
  """
  base = cfg.ep_variants[0]
  ep_config, variables = variants[base]
  base_cfg = train_config(cfg, states)
  ppl_cfg = dataclasses.replace(
    base_cfg,
    num_steps=cfg.ep_ppl_steps,
    learning_rate=(cfg.ep_decoder_lr if base == 'ep_pretrained' else cfg.ep_lr)
    / 3,
    warmup_steps=1,
    batch_size=min(8, base_cfg.batch_size),
    log_every=max(cfg.ep_ppl_steps // 10, 1),
    # A pretrained decoder's checkpoint is 1.6 GB: two, not four.
    checkpoint_every=max(
      cfg.ep_ppl_steps // (2 if base == 'ep_pretrained' else 4), 1
    ),
  )
  ppl_key = cache_key(
    states.train_key, ep_config, base_cfg, ppl_cfg, cfg.ep_ppl_weight
  )
  ppl_vars, ppl_history = ep.train(
    ep_config,
    states.train_keep[1],
    states.train_keep[0],
    states.train.score_mask,
    ppl_cfg,
    key=jax.random.fold_in(key, 2),
    ppl_weight=cfg.ep_ppl_weight,
    workdir=cache_dir / f'{base}_ppl_{ppl_key}',
    target_model=target.model,
    target_params=target.params,
    init=variables,
  )
  if io.is_primary():
    io.atomic_write_text(
      workdir / f'{base}_ppl_history.json',
      json.dumps(ppl_history, indent=1),
    )
  return {f'{base}_ppl': (ep_config, ppl_vars)}


def load_decoder(cfg: InversionConfig, target: Target):
  """`(decoder, its params, its weights' sha256)` of `cfg.ep_decoder`; the
  target itself (no second load) when both name the same file."""
  path = models.source_path(cfg.ep_decoder)
  source = target.source
  if source is not None and path is not None and Path(path) == Path(source):
    return target.model, target.params, target.weights
  decoder, decoder_params = models.load(cfg.ep_decoder)
  digest = (
    provenance.file_sha256(path)
    if path is not None
    else provenance.pytree_sha256(decoder_params)
  )
  return decoder, decoder_params, digest


def score_variants(
  cfg: InversionConfig,
  recorder: Recorder,
  target: Target,
  states: States,
  variants: Variants,
) -> None:
  """Every variant at the deep layer of every corpus, also by bucket.

  A variant predicts H^0 from H^deep; its HEI gives method `<variant>`,
  its BEI `<variant>_bei`, and the HEI rows by sequence-length bucket
  (Table 5) kind `bucket`.
  """
  model, params, deep = target.model, target.params, target.deep
  deep_index = target.keep_layers.index(deep)
  for variant, (ep_config, variables) in variants.items():
    for name, split in states.tests.items():
      lengths = split.lengths
      buckets = [
        (lo, hi)
        for lo, hi in BUCKETS
        if ((lengths >= lo) & (lengths < hi)).any()
      ]
      rows = [
        dict(kind='inversion', data=name, layer=str(deep), method=m)
        for m in (variant, f'{variant}_bei')
      ] + [
        dict(
          kind='bucket',
          data=name,
          layer=str(deep),
          method=variant,
          bucket=bucket_name(lo, hi),
        )
        for lo, hi in buckets
      ]
      if recorder.all_done(rows):
        continue
      pred = ep.predict_batches(
        ep_config,
        variables,
        states.passes[name]['keep'][deep_index],
        split.mask,
        batch_size=cfg.batch_size,
      )
      bei_ids, hei_ids = invert_states(model, params, pred, cfg.batch_size)
      preds = bei_hei.decode_ids(model.tokenizer, hei_ids, split.score_mask)
      scores = recorder.scorer(preds, split.references)
      recorder.record(
        'inversion', scores, data=name, layer=str(deep), method=variant
      )
      recorder.score_ids(
        bei_ids,
        split,
        'inversion',
        data=name,
        layer=str(deep),
        method=f'{variant}_bei',
      )
      # Table 5: by sequence-length bucket (HEI on the predicted H^0).
      for lo, hi in buckets:
        sel = (lengths >= lo) & (lengths < hi)
        recorder.record(
          'bucket',
          {m: v[sel] for m, v in scores.items()},
          data=name,
          layer=str(deep),
          method=variant,
          bucket=bucket_name(lo, hi),
        )
  logging.info('Embed Parrot scored')
