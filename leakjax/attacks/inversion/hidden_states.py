"""The target's hidden states in the inversion experiment, cached on disk.

:func:`load_target` loads the attacked model and names the layers the run
reads; :func:`compute_states` runs the target once over every text of the
run (:func:`run_target`: length-sorted padded batches, one compiled pass
per model and layer set) and keeps the BEI/HEI ids of the attacked layers
and the float16 states Embed Parrot and the defense need, each in a
`.npz` under the cache folder whose name hashes everything it depends on
(:func:`cache_key`), the weights' own sha256 included.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io as _io
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from leakjax import io, models, provenance, sharding
from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei
from leakjax.attacks.inversion import texts as texts_lib
from leakjax.attacks.inversion.texts import Split
from leakjax.errors import LeakjaxError
from leakjax.models import Model

if TYPE_CHECKING:
  from leakjax.attacks.inversion.runner import InversionConfig


@dataclasses.dataclass(frozen=True, eq=False)
class Target:
  """The attacked model and the layers the run reads.

  Attributes:
    model: the target (no weights), with its tokenizer.
    params: its parameters.
    source: its weights' file or folder; None when passed in memory.
    weights: the sha256 of its weights (of the file, else of the params):
      new weights at the same path never read the old weights' caches.
    layers: the BEI/HEI layers (ints, or 'last'), the deep layer included.
    deep: the layer Embed Parrot attacks.
    defense_layers: the layers of the DCT defense.
    keep_layers: the layers whose states are kept: 0, deep, the defense's.
  """

  model: Model
  params: Any
  source: str | None
  weights: str
  layers: list[Any]
  deep: int
  defense_layers: list[Any]
  keep_layers: list[Any]


def load_target(cfg: InversionConfig, model=None, params=None) -> Target:
  """The target: `model` and `params`, or `cfg.model` loaded."""
  source = models.source_path(cfg.model) if model is None else None
  if model is None:
    model, params = models.load(cfg.model)
  model, params = models.cast(model, params, cfg.dtype)
  if model.tokenizer is None:
    raise LeakjaxError('the target model has no tokenizer')
  layers = [bei_hei.parse_layer(model, x) for x in cfg.layers]
  deep = bei_hei.parse_layer(model, cfg.deep_layer)
  if deep not in layers:
    layers.append(deep)
  defense_layers = [bei_hei.parse_layer(model, x) for x in cfg.defense_layers]
  # The weights' own fingerprint: new weights at the same path (or passed
  # in memory) never read the old weights' cached states.
  weights = (
    provenance.file_sha256(source)
    if source is not None
    else provenance.pytree_sha256(params)
  )
  if source is not None and cfg.dtype != 'float32':
    weights += f':{cfg.dtype}'  # the file's weights, cast
  return Target(
    model=model,
    params=params,
    source=source,
    weights=weights,
    layers=layers,
    deep=deep,
    defense_layers=defense_layers,
    keep_layers=list(dict.fromkeys([0, deep] + defense_layers)),
  )


@dataclasses.dataclass(frozen=True, eq=False)
class States:
  """The target's states of every text of the run.

  Attributes:
    tests: corpus name -> its held-out split.
    passes: corpus name -> `bei`, `hei` (int32 `[layers, N, T]`, the
      BEI/HEI ids of `Target.layers`) and `keep` (float16
      `[keep_layers, N, T, D]`) of its held-out split.
    train: Embed Parrot's training texts (the model's samples appended).
    train_keep: float16 `[2, N, T, D]`: H^0 and H^deep of `train`.
    train_key: the cache key of `train_keep`; Embed Parrot's checkpoints
      are keyed by it.
    samples: the model's own samples among the training texts, or None.
  """

  tests: dict[str, Split]
  passes: dict[str, dict[str, np.ndarray]]
  train: Split
  train_keep: np.ndarray
  train_key: str
  samples: Split | None


def compute_states(
  cfg: InversionConfig,
  target: Target,
  tests: dict[str, Split],
  train_split: Split,
  *,
  cache_dir: Path,
  workdir: Path,
  key: jax.Array,
  mesh=None,
) -> States:
  """The target's states of `tests` and `train_split`, cached in `cache_dir`.

  With `cfg.train_samples` the target's own samples (drawn with
  `fold_in(key, 3)`, cached as text in `cache_dir`) join the training
  texts; their texts are also written to `<workdir>/train_samples.json`.
  """
  model, params, deep = target.model, target.params, target.deep
  layer_names = [str(x) for x in target.layers]
  model_key = cache_key(
    cfg.model, model, target.weights, cfg.max_length, cfg.add_bos
  )
  passes = {}
  for name, split in tests.items():
    k = cache_key(model_key, split.texts, layer_names, target.keep_layers)
    passes[name] = cached(
      cache_dir / f'test_{name}_{k}.npz',
      lambda split=split: run_target(
        model,
        params,
        split,
        cfg,
        decode_layers=target.layers,
        keep_layers=target.keep_layers,
        mesh=mesh,
      ),
    )
  k = cache_key(model_key, train_split.texts, deep)
  train_pass = cached(
    cache_dir / f'train_{cfg.train_corpus}_{k}.npz',
    lambda: run_target(
      model,
      params,
      train_split,
      cfg,
      decode_layers=[],
      keep_layers=[0, deep],
      mesh=mesh,
    ),
  )
  sample_split = None
  if cfg.train_samples:
    # The target's own samples join the training texts (cached: drawing
    # them takes minutes on a CPU); the corpus' cached states are reused.
    sample_key = cache_key(
      model_key,
      cfg.train_samples,
      cfg.sample_start_id,
      cfg.sample_temperature,
      cfg.sample_top_p,
      cfg.seed,
    )
    texts_path = cache_dir / f'samples_{sample_key}.json'
    if texts_path.exists():
      sample_texts = json.loads(texts_path.read_text())
    else:
      sample_texts = texts_lib.model_samples(
        model,
        params,
        cfg.train_samples,
        length=cfg.max_length,
        key=jax.random.fold_in(key, 3),
        start_id=cfg.sample_start_id,
        temperature=cfg.sample_temperature,
        top_p=cfg.sample_top_p,
      )
      if io.is_primary():
        io.atomic_write_text(texts_path, json.dumps(sample_texts, indent=0))
    sample_split = texts_lib.make_split(model.tokenizer, sample_texts, cfg)
    sample_pass = cached(
      cache_dir
      / f'train_samples_{cache_key(model_key, sample_split.texts, deep)}.npz',
      lambda: run_target(
        model,
        params,
        sample_split,
        cfg,
        decode_layers=[],
        keep_layers=[0, deep],
        mesh=mesh,
      ),
    )
    train_split = texts_lib.concat_splits(train_split, sample_split)
    width = train_split.ids.shape[1]
    train_pass = {
      'keep': np.concatenate(
        [
          texts_lib.pad_to(train_pass['keep'], width, 2),
          texts_lib.pad_to(sample_pass['keep'], width, 2),
        ],
        1,
      )
    }
    k = cache_key(k, sample_key)
    if io.is_primary():
      io.atomic_write_text(
        workdir / 'train_samples.json',
        json.dumps(sample_split.texts, indent=0),
      )
  return States(
    tests=tests,
    passes=passes,
    train=train_split,
    train_keep=train_pass['keep'],
    train_key=k,
    samples=sample_split,
  )


def width_batches(
  lengths: np.ndarray, batch_size: int, full: int, multiple: int = 16
):
  """Length-sorted batches `(rows, width)`; rows padded by repetition."""
  order = np.argsort(lengths, kind='stable')
  for start in range(0, len(order), batch_size):
    rows = order[start : start + batch_size]
    real = len(rows)
    rows = np.concatenate([rows, np.full(batch_size - real, rows[0])])
    width = min(
      full, multiple * math.ceil(max(lengths[rows].max(), 1) / multiple)
    )
    yield rows, real, width


# The static arguments of `_target_pass` under `jax.jit` (`run_target` jits it).
_TARGET_PASS_STATIC = ('model', 'decode_layers', 'keep_layers')


def _target_pass(
  params, ids, mask, *, model: Model, decode_layers: tuple, keep_layers: tuple
):
  """`(bei, hei, keep)` of one batch: BEI/HEI ids of `decode_layers` (int32
  `[layers, B, T]`, None if there are none) and the float16 states of
  `keep_layers`. Params are arguments, not closed-over constants: XLA would
  otherwise constant-fold the `[V, D]` embedding for tens of seconds."""
  states = bei_hei.layer_states(
    model, params, ids, mask, list(decode_layers) + list(keep_layers)
  )
  bei, hei = [], []
  for h in states[: len(decode_layers)]:
    b, e = bei_hei.bei_hei_ids(model, params, h)
    bei.append(b)
    hei.append(e)
  keep = states[len(decode_layers) :].astype(jnp.float16)
  if not decode_layers:
    return None, None, keep
  return jnp.stack(bei), jnp.stack(hei), keep


def run_target(
  model: Model,
  params,
  split: Split,
  cfg: InversionConfig,
  *,
  decode_layers,
  keep_layers,
  mesh=None,
) -> dict[str, np.ndarray]:
  """One pass of the target over `split`.

  Returns:
    `bei`, `hei`: int32 `[len(decode_layers), N, T]` BEI/HEI ids;
    `keep`: float16 `[len(keep_layers), N, T, D]` hidden states.
  """
  fn = functools.partial(
    jitted(_target_pass, static_argnames=_TARGET_PASS_STATIC),
    model=model,
    decode_layers=tuple(decode_layers),
    keep_layers=tuple(keep_layers),
  )
  n, full = split.ids.shape
  d = model.hidden_size
  out_bei = np.zeros((len(decode_layers), n, full), np.int32)
  out_hei = np.zeros((len(decode_layers), n, full), np.int32)
  out_keep = np.zeros((len(keep_layers), n, full, d), np.float16)
  started, done = time.time(), 0
  # Widths in multiples of 32: few shapes, so few compiles of the target.
  for rows, real, width in width_batches(
    split.mask.sum(1), cfg.batch_size, full, multiple=32
  ):
    bei, hei, keep = fn(
      params,
      sharding.shard_batch(split.ids[rows, :width], mesh),
      sharding.shard_batch(split.mask[rows, :width], mesh),
    )
    r = rows[:real]
    bei, hei, keep = sharding.to_host((bei, hei, keep))
    if decode_layers:
      out_bei[:, r, :width] = bei[:, :real]
      out_hei[:, r, :width] = hei[:, :real]
    out_keep[:, r, :width] = keep[:, :real]
    done += real
    rate = done / (time.time() - started)
    logging.info(
      'target pass: %d/%d texts (%.1f texts/s, ETA %.0f s)',
      done,
      n,
      rate,
      (n - done) / max(rate, 1e-9),
    )
  return {'bei': out_bei, 'hei': out_hei, 'keep': out_keep}


def cache_key(*parts: Any) -> str:
  """16 hex digits of the sha1 of `parts` as JSON (`str` of the rest)."""
  blob = json.dumps(parts, sort_keys=True, default=str).encode()
  return hashlib.sha1(blob).hexdigest()[:16]


def cached(path: Path, compute) -> dict[str, np.ndarray]:
  """Loads `path` (.npz) or computes, saves atomically and returns it."""
  if path.exists():
    return io.load_npy(path)
  arrays = compute()
  if io.is_primary():
    buf = _io.BytesIO()
    np.savez(buf, **arrays)
    io.atomic_write_bytes(path, buf.getvalue())
  return arrays


def invert_states(
  model: Model, params, hidden: np.ndarray, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
  """(BEI, HEI) ids of host states `[N, T, D]`, in fixed-shape chunks."""
  bei, hei = [], []
  n, bs = len(hidden), batch_size
  # BEI and HEI ids of states `[B, T, D]`: one compile per model.
  invert = jitted(bei_hei.bei_hei_ids, static_argnames=('model',))
  for s in range(0, n, bs):
    rows = np.minimum(np.arange(s, s + bs), n - 1)  # repeat-pad the tail
    b, e = invert(model, params, jnp.asarray(hidden[rows], jnp.float32))
    bei.append(np.asarray(b)[: min(bs, n - s)])
    hei.append(np.asarray(e)[: min(bs, n - s)])
  return np.concatenate(bei), np.concatenate(hei)
