"""What happens to the hidden states between the user and the provider.

The exact-inversion experiment (:mod:`.exact_runner`) attacks the states
as computed (`none`) and perturbed on the way:

* `noise:S` -- Gaussian noise `N(0, (S * rms)^2)` on every coordinate,
  where `rms` is the root-mean-square coordinate of the layer's real,
  unperturbed states of the attacked texts (scored positions only: the BOS
  state is the same for every text and often carries outsized
  activations). Decision: the noise is relative, because the scale of the
  states grows with depth, so that one S means the same signal-to-noise
  ratio at every layer (an absolute std, as `noise:S` of the audit,
  drowns layer 0 and barely touches a deep layer);
* `bf16` -- the states rounded to bfloat16 and back (a provider API that
  ships half-precision activations);
* `int8` -- per-position symmetric absmax quantisation to int8 and back:
  `scale = max_d |h_d| / 127`, `h -> round(h / scale) * scale`;
* `dct:K` -- the DCT/overlap defense of Wan et al. 2024 (Sec. 5.3.1) with
  K subsets (:func:`leakjax.attacks.inversion.dct.make_dct_defense`),
  drawn once per K from the run's seed (one user, one secret transform
  at every layer).

Every perturbation but `none` breaks the tolerance rule of
:mod:`.exact` (no candidate reproduces the observed state up to float
rounding), so those cells check candidates with `rule='nearest'`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from leakjax.attacks.inversion import dct
from leakjax.errors import LeakjaxError

KINDS = ('none', 'noise', 'bf16', 'int8', 'dct')
_HELP = (
  "use none, noise:S (S > 0: the std relative to the layer's rms"
  ' coordinate), bf16, int8 or dct:K (K >= 1 subsets), e.g.'
  ' --perturbations=none,noise:0.01,bf16,int8,dct:1'
)


@dataclasses.dataclass(frozen=True)
class Perturbation:
  """One parsed `--perturbations` entry.

  Attributes:
    spec: the entry as written (`noise:0.01`).
    kind: one of :data:`KINDS`.
    value: S of `noise:S`, K of `dct:K`; 0 otherwise.
  """

  spec: str
  kind: str
  value: float = 0.0

  @property
  def rule(self) -> str:
    """The acceptance rule of :class:`.exact.ExactConfig` for these
    states."""
    return 'tolerance' if self.kind == 'none' else 'nearest'

  def summary_params(self) -> dict[str, str]:
    """The summary key's parameters naming the perturbation (none: none)."""
    if self.kind == 'noise':
      return {'noise': self.spec.partition(':')[2]}
    if self.kind in ('bf16', 'int8'):
      return {'rounding': self.kind}
    if self.kind == 'dct':
      return {'defense': self.spec}
    return {}


def parse(spec: str) -> Perturbation:
  """`'noise:0.01'` -> `Perturbation('noise:0.01', 'noise', 0.01)`.

  Raises:
    LeakjaxError: an unknown kind, a missing or bad value, or a value
      given to a kind that takes none.
  """
  kind, colon, rest = spec.strip().partition(':')
  if kind in ('none', 'bf16', 'int8') and not colon:
    return Perturbation(kind, kind)
  if kind == 'noise' and colon:
    try:
      value = float(rest)
    except ValueError:
      value = math.nan
    if value > 0 and math.isfinite(value):
      return Perturbation(f'noise:{rest.strip()}', kind, value)
    raise LeakjaxError(f'bad noise scale in {spec!r}: S must be > 0', _HELP)
  if kind == 'dct' and colon:
    if rest.strip().isdigit() and int(rest) >= 1:
      return Perturbation(f'dct:{int(rest)}', kind, float(int(rest)))
    raise LeakjaxError(
      f'bad number of subsets in {spec!r}: K must be an integer >= 1', _HELP
    )
  raise LeakjaxError(f'unknown perturbation {spec!r}', _HELP)


def parse_all(specs) -> tuple[Perturbation, ...]:
  """Every entry parsed; LeakjaxError for none at all or one named twice."""
  parsed = tuple(parse(s) for s in specs)
  if not parsed:
    raise LeakjaxError('--perturbations is empty', 'name at least none')
  seen = set()
  for p in parsed:
    if (p.kind, p.value) in seen:
      raise LeakjaxError(f'perturbation {p.spec!r} is named twice')
    seen.add((p.kind, p.value))
  return parsed


def rms(states: np.ndarray, mask: np.ndarray) -> float:
  """Root-mean-square coordinate of `states [N, W, D]` where `mask`."""
  real = np.asarray(states, np.float64)[np.asarray(mask).astype(bool)]
  return float(np.sqrt(np.mean(real * real))) if real.size else 0.0


def bf16_round_trip(states: np.ndarray) -> np.ndarray:
  """The states rounded to bfloat16 (round to nearest even) and back."""
  return np.asarray(
    jnp.asarray(states, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)
  )


def int8_round_trip(states: np.ndarray) -> np.ndarray:
  """Per-position symmetric absmax int8 quantisation and back: every
  coordinate moves by at most half the position's step `max|h| / 127`."""
  x = np.asarray(states, np.float32)
  scale = np.max(np.abs(x), axis=-1, keepdims=True) / 127.0
  safe = np.where(scale > 0, scale, 1.0)
  q = np.clip(np.round(x / safe), -127, 127).astype(np.int8)
  return (q.astype(np.float32) * scale).astype(np.float32)


def cell_key(seed: int, *parts) -> jax.Array:
  """A key of its own for each cell, the same in every run of `seed`."""
  text = '/'.join(str(p) for p in parts)
  return jax.random.fold_in(jax.random.key(seed), zlib.crc32(text.encode()))


def apply(
  p: Perturbation,
  states: np.ndarray,
  score_mask: np.ndarray,
  *,
  key: jax.Array,
  seed: int,
) -> tuple[np.ndarray, dict[str, float]]:
  """The states the provider observes, and facts for the results row.

  Args:
    p: the perturbation.
    states: float32 `[N, W, D]`, the layer's states of the texts.
    score_mask: `[N, W]`, the scored positions (the rms of `noise:S`).
    key: the cell's key (the noise draw).
    seed: the run's seed (the DCT defense: one per K).

  Returns:
    `(observed, facts)`: float32 `[N, W, D]` and e.g. `{'noise_std': ..}`.
  """
  states = np.asarray(states, np.float32)
  if p.kind == 'none':
    return states, {}
  if p.kind == 'noise':
    std = p.value * rms(states, score_mask)
    noise = np.asarray(jax.random.normal(key, states.shape, jnp.float32))
    return states + std * noise, {'noise_std': std}
  if p.kind == 'bf16':
    return bf16_round_trip(states), {}
  if p.kind == 'int8':
    return int8_round_trip(states), {}
  k = int(p.value)
  defense = dct.make_dct_defense(
    states.shape[-1], k, key=jax.random.fold_in(jax.random.key(seed), k)
  )
  out = dct.apply_dct_defense(jnp.asarray(states), defense.overlap)
  return np.asarray(out, np.float32), {'dct_selected': defense.selected}


__all__ = [
  'KINDS',
  'Perturbation',
  'apply',
  'bf16_round_trip',
  'cell_key',
  'int8_round_trip',
  'parse',
  'parse_all',
  'rms',
]
