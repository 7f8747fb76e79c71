"""Private helpers shared by the hybrid's modules."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

PyTree = Any


def _match(num, den):
  """`cos²` up to the target's norm: `num² / den` where `num > 0`."""
  return jnp.where(num > 0, num**2 / jnp.maximum(den, 1e-30), -jnp.inf)
