"""The runner's jit: one jitted wrapper per kernel, built on first use.

Kernels are plain functions; a host loop (a runner, a pipeline's loop over
prompts) jits them where it calls them, with the model and the settings
static:

>>> search = jitted(bag_beam_search, static_argnames=('model', 'config'))

The wrapper is cached per function and jit options, so every call of a
host loop, and every run in one process, shares one compilation cache:
new params of the same shapes never recompile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax


@functools.cache
def jitted(
  fn: Callable,
  *,
  static_argnames: tuple[str, ...] | None = None,
  static_argnums: tuple[int, ...] | None = None,
  donate_argnames: tuple[str, ...] | None = None,
) -> Callable:
  """`jax.jit(fn, ...)`, built once per `fn` and options (all hashable).

  As in `jax.jit`, names given alone also make the matching positional
  arguments static (or donated), and numbers given alone the names.
  """
  return jax.jit(
    fn,
    static_argnames=static_argnames,
    static_argnums=static_argnums,
    donate_argnames=donate_argnames,
  )
