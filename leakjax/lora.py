"""Low-rank adapters (LoRA, Hu et al. 2021) for any model of the protocol.

A LoRA fine-tune keeps the pretrained kernels frozen and learns, for each
targeted Dense kernel `W [in, out]`, a low-rank update `W + (alpha / r) A B`
with `A [in, r]` (random) and `B [r, out]` (zeros, so training starts at
the pretrained model). Wan et al. 2024 (Appendix 7.1) fine-tune their
targets this way before inverting their hidden states: Llama2-7B's query,
key, value and output projections, ChatGLM-6B's MLP projections.

Pure functions of pytrees: :func:`init` builds the adapters, :func:`merge`
folds them into the params (the merged params run through the model's own
`logits`, so nothing about the model changes), :class:`LoraLoss` is the
next-token loss of the merged model as a :class:`leakjax.train.LossFn`
(adapters trained, base params frozen). Which kernels are targeted is a
regular expression over '/'-joined parameter paths, as peft's
`target_modules`; the defaults are Llama's attention projections.

>>> cfg = lora.LoraConfig(rank=8)                             # doctest: +SKIP
>>> adapters = lora.init(params, cfg, key=jax.random.key(0))   # doctest: +SKIP
>>> tuned = lora.merge(params, adapters, cfg)                  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from leakjax.errors import LeakjaxError
from leakjax.models.protocol import Model, PyTree, lm_loss

# Llama2-7B's LoRA targets in Wan et al. 2024, Appendix 7.1: "the query
# projection layers, key projection layers, value projection layers, and
# output projection layers".
ATTENTION_PROJECTIONS = r'(^|/)(q_proj|k_proj|v_proj|o_proj)/kernel$'


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """Which kernels get adapters, and their size.

  Attributes:
    rank: r, the rank of each update.
    alpha: the update is scaled by `alpha / rank` (Hu et al. 2021).
    targets: a regular expression matched (`re.search`) against each
      parameter's '/'-joined path; every matching 2-D kernel gets an
      adapter.
  """

  rank: int = 8
  alpha: float = 16.0
  targets: str = ATTENTION_PROJECTIONS

  def __post_init__(self):
    if not isinstance(self.rank, int) or self.rank < 1:
      raise LeakjaxError(f'LoRA rank={self.rank!r} must be a positive integer')
    if not self.alpha > 0:
      raise LeakjaxError(f'LoRA alpha={self.alpha!r} must be positive')
    try:
      re.compile(self.targets)
    except re.error as e:
      raise LeakjaxError(f'LoRA targets {self.targets!r}: {e}') from None

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def target_paths(params: PyTree, config: LoraConfig) -> list[str]:
  """The '/'-joined paths of the 2-D kernels that get adapters, in order."""
  pattern = re.compile(config.targets)
  found = [
    _path_name(path)
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    if getattr(leaf, 'ndim', 0) == 2 and pattern.search(_path_name(path))
  ]
  if not found:
    raise LeakjaxError(
      f'no 2-D parameter matches the LoRA targets {config.targets!r}',
      'pass a regular expression over paths such as layers_0/attn/q_proj/kernel',
    )
  return found


def init(params: PyTree, config: LoraConfig, *, key) -> dict[str, dict]:
  """Adapters `{path: {'a': [in, r], 'b': [r, out]}}`, float32.

  `a` is normal with std `1 / sqrt(in)`, `b` zero: the merged model starts
  equal to the pretrained one.
  """
  kernels = dict(
    (_path_name(p), x) for p, x in jax.tree_util.tree_leaves_with_path(params)
  )
  adapters = {}
  for i, path in enumerate(target_paths(params, config)):
    d_in, d_out = kernels[path].shape
    a = jax.random.normal(jax.random.fold_in(key, i), (d_in, config.rank))
    adapters[path] = {
      'a': a * d_in**-0.5,
      'b': jnp.zeros((config.rank, d_out), jnp.float32),
    }
  return adapters


def merge(params: PyTree, adapters: dict[str, dict], config: LoraConfig):
  """`params` with `W + scale * a @ b` at every adapted kernel (pure)."""

  def one(path, leaf):
    ad = adapters.get(_path_name(path))
    if ad is None:
      return leaf
    delta = config.scale * (ad['a'] @ ad['b'])
    return (leaf.astype(jnp.float32) + delta).astype(leaf.dtype)

  missing = set(adapters) - {
    _path_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
  }
  if missing:
    raise LeakjaxError(
      f'LoRA adapters for parameters the model lacks: {sorted(missing)[:3]}'
    )
  return jax.tree_util.tree_map_with_path(one, params)


class Batch(NamedTuple):
  """Token ids `[B, T]` and mask `[B, T]` (1 = real token)."""

  ids: Any
  mask: Any


@dataclasses.dataclass(frozen=True)
class LoraLoss:
  """Mean next-token loss of the merged model; a :class:`leakjax.train.LossFn`.

  Trained params are the adapters; `frozen` is the base params.
  """

  model: Model
  config: LoraConfig

  def __call__(self, adapters, frozen, batch: Batch, key):
    del key  # no dropout
    params = merge(frozen, adapters, self.config)
    logits = self.model.logits(params, batch.ids, batch.mask)
    loss = lm_loss(logits, batch.ids, batch.mask)
    return loss, {'tokens': jnp.sum(batch.mask[:, 1:]).astype(jnp.float32)}


__all__ = [
  'ATTENTION_PROJECTIONS',
  'LoraConfig',
  'target_paths',
  'init',
  'merge',
  'Batch',
  'LoraLoss',
]
