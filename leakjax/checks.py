"""Up-front checks of an attack's inputs, each failing in one line.

Every attack's host entry point (:func:`leakjax.recovery.extract_bag`,
:func:`leakjax.attacks.film.recover`, :func:`leakjax.attacks.dager.recover`)
calls :func:`check_inputs` before any work, so that a model that lacks a
fact, params or a gradient that do not fit it, or a tokenizer without a
needed method, fail at once with a :class:`LeakjaxError` that names what is
missing and the argument that provides it -- not deep inside a kernel, and
not after minutes of search.

Shapes only are read (plus the gradient's values by
:func:`leakjax.errors.check_gradient`), never inside `jax.jit`.
"""

from __future__ import annotations

import warnings
from typing import Any

from leakjax.errors import LeakjaxError, check_gradient, check_like
from leakjax.errors import check_methods as _check_methods
from leakjax.models.custom import check_params

# fact -> (the Model field that holds it, the argument that provides it)
FACTS = {
  'first_layer_inputs': (
    'first_layer_fn',
    'pass first_layer_inputs= (a function params -> FirstLayerInputs, or in'
    ' from_flax a method name) to from_functions / from_flax',
  ),
  'block_inputs': (
    'block_input_fn',
    'pass block_inputs= (a function (params, ids, mask, layer) -> [b, t, d],'
    ' or in from_flax a method name) to from_functions / from_flax',
  ),
  'hidden_states': (
    'hidden_fn',
    'pass hidden_states= to from_functions or hidden_states_method= to'
    ' from_flax',
  ),
  'lm_head': (
    'head_fn',
    'pass lm_head= to from_functions or lm_head_method= to from_flax',
  ),
}


def declared_blocks(model) -> int:
  """How many leading blocks declare attention-input kernels."""
  n = 0
  for block in model.paths.attention_inputs:
    if not block:
      break
    n += 1
  return n


def check_inputs(
  model,
  params,
  grads: Any = None,
  *,
  attack: str,
  needs: tuple[str, ...] = (),
  attention_blocks: int = 0,
  tokenizer: tuple[str, ...] = (),
  tokenizer_required: bool = False,
) -> None:
  """Raises LeakjaxError unless an attack's inputs fit, before any work.

  Args:
    model: the attacked model.
    params: θ (:func:`leakjax.models.check_params`: declared paths,
      vocabulary, attention layouts).
    grads: the observed gradient or None: it must be shaped like `params`
      (:func:`leakjax.errors.check_like`) and finite and non-zero
      (:func:`leakjax.errors.check_gradient`).
    attack: the attack's name, for the messages.
    needs: declared functions the attack calls, names of :data:`FACTS`.
    attention_blocks: how many leading blocks must declare
      `attention_inputs`.
    tokenizer: methods (or `*_id` attributes) the model's tokenizer must
      have; checked when the model has a tokenizer.
    tokenizer_required: the attack needs a tokenizer.
  """
  check_params(model, params)
  if grads is not None:
    check_like(grads, params, 'the gradient', 'params')
    check_gradient(grads)
  declared = declared_blocks(model)
  if declared < attention_blocks:
    raise LeakjaxError(
      f'{attack} needs the attention input kernels of {attention_blocks}'
      f' blocks; the model declares {declared} (attention_inputs)',
      'pass attention_inputs= (per block, the paths of its q/k/v kernels) to'
      ' from_functions / from_flax',
    )
  for fact in needs:
    field, fix = FACTS[fact]
    if getattr(model, field) is None:
      raise LeakjaxError(
        f'{attack} needs {fact}: this model declares no {fact} function', fix
      )
  tok = model.tokenizer
  if tok is None and tokenizer_required:
    raise LeakjaxError(
      f'{attack} needs the model tokenizer', 'build the model with tokenizer='
    )
  if tok is not None:
    _check_methods(
      tok,
      tokenizer,
      f"{attack} uses the model's tokenizer, which",
      'give the model a leakjax.tokenization.Tokenizer (or one with these'
      ' methods)',
    )


def missing_span_facts(model, method: str) -> tuple[str, ...]:
  """The facts the tied bag's exact span test lacks, with a warning.

  The tied method ('tied') reads block 0's attention-input gradient and
  what that block reads per token; without them it falls back on the
  target-sign and norm tests, which miss tokens the model already predicts
  well. Returns the missing facts' names ('attention_inputs',
  'first_layer_inputs'), empty when none is missing or for other methods.
  """
  if method != 'tied':
    return ()
  missing = []
  if not declared_blocks(model):
    missing.append('attention_inputs')
  if model.first_layer_fn is None:
    missing.append('first_layer_inputs')
  if missing:
    names = ' and '.join(missing)
    warnings.warn(
      f'the tied bag of words runs without its exact span test: the model'
      f' declares no {names}, so tokens may be missed; declare {names}='
      ' through from_functions / from_flax',
      stacklevel=3,
    )
  return tuple(missing)


def check_same_vocabulary(model, model_prime, params, params_prime) -> None:
  """Raises LeakjaxError unless two models share one vocabulary (shapes
  only, so it works under `jax.jit` and `jax.vmap`)."""
  if model.vocab_size != model_prime.vocab_size:
    raise LeakjaxError(
      f'the models differ in vocabulary: M has {model.vocab_size} tokens,'
      f" M' {model_prime.vocab_size}",
      'compare two snapshots of one model (the same tokenizer and vocabulary)',
    )
  check_params(model, params, 'params')
  check_params(model_prime, params_prime, 'params_prime')


__all__ = [
  'FACTS',
  'check_inputs',
  'check_same_vocabulary',
  'declared_blocks',
  'missing_span_facts',
]
