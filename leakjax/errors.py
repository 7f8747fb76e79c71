"""Errors that leakjax raises for bad user input.

Every error a user can cause (a wrong path, a checkpoint that does not fit the
model, a tokenizer whose vocabulary differs from the model's, NaN weights, an
empty corpus, ...) is a :class:`LeakjaxError` whose message is one line naming
the problem and the fix. The experiment entry points catch it, print the line
to stderr and exit with status 2 before writing any output.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class LeakjaxError(ValueError):
  """A problem with the user's input; the message says what and how to fix."""

  def __init__(self, problem: str, fix: str | None = None):
    message = problem if fix is None else f'{problem}; {fix}'
    super().__init__(' '.join(message.split()))  # always one line


def check_finite(tree, what: str) -> None:
  """Raises LeakjaxError if any leaf of `tree` holds NaN or inf."""
  import jax  # pylint: disable=g-import-not-at-top

  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not jax.numpy.issubdtype(np.asarray(leaf).dtype, jax.numpy.floating):
      continue
    arr = np.asarray(leaf, np.float32)  # bfloat16 and float16 too
    if not np.isfinite(arr).all():
      bad = int((~np.isfinite(arr)).sum())
      raise LeakjaxError(
        f'{what} has {bad} NaN/inf values in {jax.tree_util.keystr(path)}',
        'the checkpoint or gradient is corrupt; re-export it or lower the'
        ' learning rate',
      )


def check_gradient(grads, what: str = 'the gradient') -> None:
  """Raises LeakjaxError if an observed gradient (or update) pytree holds
  NaN/inf or is zero everywhere: an attack on it would return nonsense
  (a NaN empties a norm-based bag; a zero gradient carries nothing)."""
  import jax  # pylint: disable=g-import-not-at-top

  check_finite(grads, what)
  if all(not np.asarray(leaf).any() for leaf in jax.tree.leaves(grads)):
    raise LeakjaxError(
      f'{what} is zero everywhere',
      'was the client step taken (non-empty batch, nonzero learning rate)?',
    )


def _where(path: tuple) -> str:
  return '/'.join(str(k) for k in path)


def _kind(node) -> str:
  if isinstance(node, Mapping):
    return 'dict'
  if isinstance(node, (list, tuple)):
    return type(node).__name__
  return 'array' if hasattr(node, 'shape') else type(node).__name__


def _shape(leaf) -> tuple[int, ...]:
  # `.shape` first: a jax.ShapeDtypeStruct has one but is no array.
  return tuple(leaf.shape) if hasattr(leaf, 'shape') else np.shape(leaf)


def _mismatch(tree, reference, path: tuple):
  """`(path, problem)` of the first place `tree` differs from `reference`."""
  if isinstance(reference, Mapping):
    if not isinstance(tree, Mapping):
      return path, f'is a {_kind(tree)} where {{ref}} has a dict'
    for key in reference:
      if key not in tree:
        return path + (key,), 'is missing'
    for key in tree:
      if key not in reference:
        return path + (key,), 'is not in {ref}'
    items = [(key, tree[key], reference[key]) for key in reference]
  elif isinstance(reference, (list, tuple)):
    if not isinstance(tree, (list, tuple)):
      return path, f'is a {_kind(tree)} where {{ref}} has a {_kind(reference)}'
    if len(tree) != len(reference):
      return path, f'has {len(tree)} entries where {{ref}} has {len(reference)}'
    items = list(zip(range(len(tree)), tree, reference))
  elif reference is None:
    return None if tree is None else (path, 'is not None in {ref}')
  else:
    if isinstance(tree, (Mapping, list, tuple)) or tree is None:
      return path, f'is a {_kind(tree)} where {{ref}} has an array'
    got, want = _shape(tree), _shape(reference)
    if got != want:
      return path, f'has shape {got} where {{ref}} has {want}'
    return None
  for key, sub, ref in items:
    found = _mismatch(sub, ref, path + (key,))
    if found is not None:
      return found
  return None


def check_like(
  tree, reference, what: str = 'the gradient', like: str = 'params'
) -> None:
  """Raises LeakjaxError unless `tree` has `reference`'s structure and shapes.

  Nested dicts (any Mapping), lists and tuples are compared key by key and
  leaves by shape (not dtype, not values), and the first place they differ
  is named. The usual Flax slip, a gradient wrapped as `{'params': grads}`
  against the bare params, gets its own message.
  """
  if (
    isinstance(tree, Mapping)
    and list(tree) == ['params']
    and isinstance(reference, Mapping)
    and 'params' not in reference
  ):
    raise LeakjaxError(
      f"{what} is {{'params': ...}} but {like} has no 'params' key (did you"
      " pass {'params': grads}?)",
      "pass grads['params']",
    )
  found = _mismatch(tree, reference, ())
  if found is None:
    return
  path, problem = found
  at = f' at {_where(path)!r}' if path else ''
  raise LeakjaxError(
    f'{what}{at} {problem.format(ref=like)}',
    f'pass a pytree shaped like {like} (the gradient of these parameters)',
  )


def check_methods(obj, names, what: str, fix: str) -> None:
  """Raises LeakjaxError unless `obj` has each of `names` (callable unless
  the name ends in '_id': an attribute such as `bos_id`)."""
  for name in names:
    value = getattr(obj, name, _MISSING)
    if value is _MISSING or (not name.endswith('_id') and not callable(value)):
      kind = 'attribute' if name.endswith('_id') else 'method'
      raise LeakjaxError(
        f'{what} ({type(obj).__name__}) has no {kind} {name!r}', fix
      )


_MISSING = object()


def check_token_ids(ids, vocab_size: int, what: str = 'token ids') -> None:
  """Raises LeakjaxError if concrete `ids` fall outside [0, vocab_size)."""
  arr = np.asarray(ids)
  if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
    raise LeakjaxError(
      f'{what} out of range: min {arr.min()}, max {arr.max()} for a'
      f' vocabulary of {vocab_size}',
      'use the tokenizer that belongs to this model',
    )


def check_length(length: int, max_length: int | None, what: str) -> None:
  """Raises LeakjaxError if a sequence does not fit the model's context."""
  if max_length is not None and length > max_length:
    raise LeakjaxError(
      f'{what} has {length} tokens but the model context is {max_length}',
      'truncate the text or use a model with a longer context',
    )


def check_positive(config, *names: str, minimum: int = 1) -> None:
  """Raises LeakjaxError unless each named field of `config` (an int or a
  tuple of ints, as flags `--name`) is at least `minimum`.

  >>> import types
  >>> check_positive(types.SimpleNamespace(b=(1, 4), n=0), 'b', 'n')
  Traceback (most recent call last):
  ...
  leakjax.errors.LeakjaxError: --n=0 must be at least 1
  """
  for name in names:
    value = getattr(config, name)
    values = value if isinstance(value, tuple) else (value,)
    if not values or any(v < minimum for v in values):
      shown = ','.join(str(v) for v in values) if values else '(empty)'
      raise LeakjaxError(f'--{name}={shown} must be at least {minimum}')


__all__ = [
  'LeakjaxError',
  'check_finite',
  'check_gradient',
  'check_length',
  'check_like',
  'check_methods',
  'check_positive',
  'check_token_ids',
]
