"""Reference client update: a Python loop over one jitted local step.

Runs the very same step function as :func:`leakjax.fl.client_update`
(`LocalTraining.step`), with the same schedule and keys, but dispatches one
compiled step per iteration from Python instead of one `lax.scan` -- the
usual way to write a training loop. The tests check scan == loop exactly;
`benchmarks/client_update.py` times the two against each other.

>>> update = make_python_loop_client_update(model, params, config)  # doctest: +SKIP
>>> result = update(params, ids, mask, key=jax.random.key(0))       # doctest: +SKIP
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from leakjax.fl import batching
from leakjax.fl.client import (
  ClientConfig,
  ClientResult,
  LocalTraining,
  split_client_key,
)
from leakjax.models.protocol import Model


def make_python_loop_client_update(
  model: Model, params, config: ClientConfig, *, jit=jax.jit
):
  """Returns `update(params, ids, mask, *, key) -> ClientResult`.

  Equals `client_update(model, params, ids, mask, config, key=key)`. The
  step, the schedule and the finish are jitted once each per returned
  function (for the shapes of the first call) with `jit` (e.g. `jax.jit`
  with compiler options); the loop over steps runs in Python.

  Args:
    model: any leakjax model.
    params: parameters of the shapes the updates will get (only their
      structure is read, to split trainable from frozen leaves).
    config: the client's local training.
    jit: how to jit the pieces.
  """
  training = LocalTraining.create(model, params, config)

  @jit
  def step(train, opt_state, frozen, ids, mask, schedule, s, step_key):
    # One dispatch per step: the step's rows and key are picked inside.
    return training.step(
      train,
      opt_state,
      frozen,
      ids,
      mask,
      schedule.indices[s],
      schedule.weights[s],
      key=jax.random.fold_in(step_key, s),
    )

  @functools.partial(jit, static_argnums=0)
  def schedule(num_rows, key):
    return batching.batch_schedule(
      num_rows, epochs=config.epochs, batch_size=config.batch_size, key=key
    )

  @jit
  def start(params):
    train0, frozen = training.part.split(params)
    return train0, frozen, training.optimizer.init(train0)

  @jit
  def finish(train0, train1, frozen, losses, transmit_key):
    return training.finish(
      train0, train1, frozen, losses, transmit_key=transmit_key
    )

  def update(params, ids, mask=None, *, key) -> ClientResult:
    ids, mask = batching.check_batch(ids, mask)
    shuffle_key, step_key, transmit_key = split_client_key(key)
    sched = schedule(ids.shape[0], shuffle_key)
    num_steps = sched.indices.shape[0]
    train, frozen, opt_state = start(params)
    train0 = train
    losses = []
    for s in range(num_steps):
      train, opt_state, loss = step(
        train, opt_state, frozen, ids, mask, sched, s, step_key
      )
      losses.append(loss)
    return finish(train0, train, frozen, jnp.stack(losses), transmit_key)

  return update


__all__ = ['make_python_loop_client_update']
