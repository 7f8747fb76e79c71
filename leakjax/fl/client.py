"""What a federated client computes and sends: a gradient or a model update.

* :func:`client_gradient` -- FedSGD: the gradient of the mean LM loss of one
  padded batch of sentences (pad targets masked out), at the global θ.
* :func:`client_update` -- FedAvg local training (GBoard Algorithm 1): E
  epochs over the client's data in mini-batches of B with an optax optimizer
  (SGD with η by default), all steps in one `lax.scan`. Returns θ1 and
  Δ = θ1 − θ0. FedSGD is the special case E=1, B=None (all): then
  θ1 = θ0 − η · client_gradient(...) (tested).

Both work for any :class:`leakjax.models.Model` and apply a
:class:`leakjax.fl.Defense` the same way (see :mod:`leakjax.fl.defenses`).
They are pure; the caller owns `jit` (model and config are static, and
hashable, so new params of the same shapes never recompile):

>>> update = jax.jit(client_update, static_argnames=CLIENT_UPDATE_STATIC)  # doctest: +SKIP
>>> result = update(model, params, ids, mask,                 # doctest: +SKIP
...                 ClientConfig(epochs=5, batch_size=32), key=jax.random.key(0))

Loss. Without DP-SGD a step minimizes the mean next-token cross-entropy
over all real target tokens of the batch (`leakjax.models.lm_loss`). DP-SGD
needs a loss per example: each sentence's mean token loss, averaged over
the batch's sentences (Abadi et al.'s L(θ) = 1/N Σ_i L(θ, x_i)).

Randomness. `key` is split into a shuffling key (epoch e: `fold_in(., e)`),
a step key (step s: `fold_in(., s)`, for DP/local noise and dropout) and a
transmission key (single noise). :func:`client_gradient` derives its keys
the same way as step 0, so with the same key FedSGD via either function
draws the same noise.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax import lax

from leakjax.errors import LeakjaxError
from leakjax.fl import batching
from leakjax.fl import defenses as defenses_lib
from leakjax.fl.defenses import Defense
from leakjax.models.protocol import Model, lm_loss

PyTree = Any
NO_DEFENSE = Defense()
# The static arguments of each function under `jax.jit` (hashable, no
# arrays): every caller jits them the same way, e.g.
# `jax.jit(client_gradient, static_argnames=CLIENT_GRADIENT_STATIC)`.
CLIENT_GRADIENT_STATIC = ('model', 'defense', 'dropout', 'microbatch')
CLIENT_UPDATE_STATIC = ('model', 'config')


@dataclasses.dataclass(frozen=True)
class ClientConfig:
  """How a client trains locally (GBoard Algorithm 1). Hashable (static).

  Attributes:
    epochs: E, local epochs over the client's data.
    batch_size: B, sentences per local step; None means all (FedSGD when
      E=1). The last batch of an epoch may be smaller (see
      :mod:`leakjax.fl.batching`).
    learning_rate: η, the client learning rate (GBoard Sec. 4.1: 0.001).
    optimizer: a function `learning_rate -> optax.GradientTransformation`
      (`optax.sgd` default; e.g. `optax.adam`, or a `functools.partial`).
    defense: what the client does to protect what it sends.
    dropout: train with the model's dropout (`Model.train_logits`); off by
      default so that updates are deterministic given the key.
  """

  epochs: int = 1
  batch_size: int | None = None
  learning_rate: float = 1e-3
  optimizer: Callable[[float], optax.GradientTransformation] = optax.sgd
  defense: Defense = NO_DEFENSE
  dropout: bool = False

  def __post_init__(self):
    if not isinstance(self.epochs, int) or self.epochs < 1:
      raise LeakjaxError(
        f'epochs must be an int >= 1, got {self.epochs!r}',
        'train for at least one local epoch',
      )
    if self.batch_size is not None and (
      not isinstance(self.batch_size, int) or self.batch_size < 1
    ):
      raise LeakjaxError(
        f'batch_size must be None or an int >= 1, got {self.batch_size!r}',
        'pass e.g. 32',
      )
    if not isinstance(self.defense, Defense):
      raise LeakjaxError(
        f'defense must be a Defense, got {type(self.defense).__name__}',
        'build one with leakjax.fl.dp_sgd(...) etc.',
      )

  @classmethod
  def fedsgd(
    cls, learning_rate: float = 1e-3, defense: Defense = NO_DEFENSE
  ) -> ClientConfig:
    """E=1, B=all, SGD: one gradient step (GBoard Sec. 2.1, FILM Eq. 3)."""
    return cls(
      epochs=1, batch_size=None, learning_rate=learning_rate, defense=defense
    )

  @property
  def is_fedsgd(self) -> bool:
    return self.epochs == 1 and self.batch_size is None

  def make_optimizer(self) -> optax.GradientTransformation:
    return self.optimizer(self.learning_rate)


DEFAULT_CLIENT = ClientConfig()  # E=1, B=all, SGD with eta=0.001: FedSGD


@flax.struct.dataclass
class ClientResult:
  """What one client update produces.

  Attributes:
    params: θ0 + update, what the server receives. Equals the locally
      trained θ1 exactly when no transmission-time defense (single noise,
      pruning) is set.
    update: the transmitted Δ (same pytree as params; exactly zero on
      frozen parameters).
    losses: float32 `[steps]`, each step's batch loss before its update; NaN
      for skipped steps (batches without real examples).
  """

  params: PyTree
  update: PyTree
  losses: jax.Array


# ----------------------------------------------------- trainable / frozen
@dataclasses.dataclass(frozen=True)
class Partition:
  """Splits params into a trainable tree (None at frozen leaves) and the
  list of frozen leaves (None at trainable ones), and merges them back.

  Gradients, optimizer state and noise exist for the trainable tree only,
  so frozen parameters cost no per-example memory and cannot move.
  """

  treedef: Any
  frozen_mask: tuple[bool, ...]

  @classmethod
  def of(cls, params: PyTree, frozen) -> Partition:
    defenses_lib.check_frozen_paths(params, frozen)
    treedef = jax.tree.structure(params)
    mask = tuple(
      defenses_lib.is_frozen(p, frozen)
      for p in defenses_lib.leaf_key_paths(params)
    )
    return cls(treedef, mask)

  def split(self, params: PyTree) -> tuple[PyTree, list]:
    leaves = self.treedef.flatten_up_to(params)
    train = [None if f else x for f, x in zip(self.frozen_mask, leaves)]
    frozen = [x if f else None for f, x in zip(self.frozen_mask, leaves)]
    return jax.tree.unflatten(self.treedef, train), frozen

  def merge(self, train: PyTree, frozen: list) -> PyTree:
    train_leaves = jax.tree.leaves(train, is_leaf=lambda x: x is None)
    return jax.tree.unflatten(
      self.treedef,
      [
        fz if f else tr
        for f, tr, fz in zip(self.frozen_mask, train_leaves, frozen)
      ],
    )

  def zeros_for_frozen(self, frozen: list) -> list:
    return [None if x is None else jnp.zeros_like(x) for x in frozen]


# --------------------------------------------------------------- gradient
def _batch_loss(model: Model, dropout: bool, params, ids, mask, weights, key):
  """Mean token loss of a batch whose row i counts with weight[i] in {0, 1}."""
  if dropout:
    logits = model.train_logits(params, ids, mask, key=key)
  else:
    logits = model.logits(params, ids, mask)
  return lm_loss(logits, ids, mask * weights[:, None].astype(mask.dtype))


def defended_gradient(
  model: Model,
  defense: Defense,
  dropout: bool,
  part: Partition,
  train: PyTree,
  frozen: list,
  ids,
  mask,
  weights,
  *,
  key,
  microbatch: int | None = None,
) -> tuple[jax.Array, PyTree]:
  """Loss and per-step gradient (trainable tree) of one batch.

  Applies the per-step defenses: DP-SGD (clip, sum, noise, average) and
  GBoard Algorithm 3 noise. `key` is the step's key.

  Args:
    model: the model.
    defense: the client's defense.
    dropout: use the model's training dropout.
    part: the trainable/frozen partition of the parameters.
    train: trainable tree (None at frozen leaves).
    frozen: the frozen leaves (see :class:`Partition`).
    ids: int32 `[B, T]`.
    mask: int32 `[B, T]`.
    weights: float32 `[B]`, 1 for real rows, 0 for filler slots.
    key: the step key.
    microbatch: without DP-SGD, accumulate the gradient over chunks of
      this many rows (a `lax.scan`), so that memory grows with the chunk,
      not the batch; the result is the same mean-token-loss gradient up to
      float rounding (dropout draws differ). None: one pass. DP-SGD has its
      own `Defense.dp_microbatch`.

  Returns:
    `(loss, grads)`: float32 scalar and a trainable-tree gradient.
  """
  noise_key, dropout_key = jax.random.split(key)

  def loss_of(train, ids, mask, weights, dkey):
    return _batch_loss(
      model, dropout, part.merge(train, frozen), ids, mask, weights, dkey
    )

  if defense.uses_dp_sgd:
    loss, grads = _dp_sgd_gradient(
      loss_of,
      defense,
      train,
      ids,
      mask,
      weights,
      noise_key=jax.random.fold_in(noise_key, 0),
      dropout_key=dropout_key,
    )
  elif microbatch and microbatch < ids.shape[0]:
    loss, grads = _accumulated_gradient(
      loss_of, microbatch, train, ids, mask, weights, dropout_key
    )
  else:
    loss, grads = jax.value_and_grad(loss_of)(
      train, ids, mask, weights, dropout_key
    )
  if defense.step_noise_std > 0:  # GBoard Algorithm 3
    noise = defenses_lib.gaussian_noise_like(
      grads, defense.step_noise_std, key=jax.random.fold_in(noise_key, 1)
    )
    grads = jax.tree.map(jnp.add, grads, noise)
  return loss, grads


def _pad_rows(ids, mask, weights, chunk: int):
  """Pads the rows to a multiple of `chunk`; returns them and the count.

  Filler rows copy row 0 with weight 0: no tokens, zero gradient.
  """
  b = ids.shape[0]
  num_chunks = -(-b // chunk)
  pad = num_chunks * chunk - b
  if pad:
    ids = jnp.concatenate([ids, jnp.repeat(ids[:1], pad, axis=0)])
    mask = jnp.concatenate([mask, jnp.repeat(mask[:1], pad, axis=0)])
    weights = jnp.concatenate([weights, jnp.zeros((pad,), weights.dtype)])
  return ids, mask, weights, num_chunks


def _accumulated_gradient(
  loss_of, chunk: int, train, ids, mask, weights, dropout_key
):
  """The mean-token-loss gradient of `[B, T]`, `chunk` rows at a time.

  Each chunk's mean loss and gradient are weighted by its share of the
  batch's real target tokens (`lm_loss` counts `mask[:, 1:]` of the rows
  with weight 1), so the sum is the gradient of the whole batch's mean.
  """
  ids, mask, weights, num_chunks = _pad_rows(ids, mask, weights, chunk)
  tokens = mask[:, 1:].astype(jnp.float32).sum(1) * weights  # [B + pad]

  def chunked(x):  # [num_chunks * chunk, ...] -> [num_chunks, chunk, ...]
    return x.reshape((num_chunks, chunk) + x.shape[1:])

  total = jnp.maximum(tokens.sum(), 1.0)
  shares = chunked(tokens).sum(1) / total  # [num_chunks]
  keys = jax.random.split(dropout_key, num_chunks)
  value_and_grad = jax.value_and_grad(loss_of)

  def step(carry, xs):
    grad_acc, loss_acc = carry
    ids_c, mask_c, w_c, share, k = xs
    loss, grads = value_and_grad(train, ids_c, mask_c, w_c, k)
    grad_acc = jax.tree.map(
      lambda a, g: a + share.astype(g.dtype) * g, grad_acc, grads
    )
    return (grad_acc, loss_acc + share * loss), None

  init = (jax.tree.map(jnp.zeros_like, train), jnp.zeros((), jnp.float32))
  (grads, loss), _ = lax.scan(
    step, init, (chunked(ids), chunked(mask), chunked(weights), shares, keys)
  )
  return loss, grads


def _dp_sgd_gradient(
  loss_of,
  defense: Defense,
  train,
  ids,
  mask,
  weights,
  *,
  noise_key,
  dropout_key,
):
  """Abadi et al. Algorithm 1, one step: clip, sum, add N(0, σ²C²), average.

  Per-example gradients come from `vmap`, `dp_microbatch` examples at a
  time (a `lax.scan` over chunks accumulates the clipped sum). The average
  divides by the number of real examples in the batch.
  """
  b = ids.shape[0]
  chunk = min(defense.dp_microbatch or b, b)
  ids, mask, weights, num_chunks = _pad_rows(ids, mask, weights, chunk)
  dropout_keys = jax.random.split(dropout_key, num_chunks * chunk)

  def example_loss(train, ids1, mask1, w1, k):
    # [T] -> [1, T]: a batch of one sentence.
    return loss_of(train, ids1[None], mask1[None], w1[None], k)

  per_example = jax.vmap(
    jax.value_and_grad(example_loss), in_axes=(None, 0, 0, 0, 0)
  )

  def chunk_step(carry, xs):
    grad_sum, loss_sum = carry
    ids_c, mask_c, w_c, k_c = xs
    losses, grads = per_example(train, ids_c, mask_c, w_c, k_c)  # [chunk, ...]
    clipped, _ = defenses_lib.clip_per_example(grads, defense.clip_norm)
    grad_sum = jax.tree.map(lambda s, g: s + g.sum(0), grad_sum, clipped)
    return (grad_sum, loss_sum + jnp.sum(losses * w_c)), None

  def chunked(x):  # [num_chunks * chunk, ...] -> [num_chunks, chunk, ...]
    return x.reshape((num_chunks, chunk) + x.shape[1:])

  init = (jax.tree.map(jnp.zeros_like, train), jnp.zeros((), jnp.float32))
  (grad_sum, loss_sum), _ = lax.scan(
    chunk_step,
    init,
    (chunked(ids), chunked(mask), chunked(weights), chunked(dropout_keys)),
  )
  if defense.noise_multiplier > 0:
    noise = defenses_lib.gaussian_noise_like(
      grad_sum, defense.noise_multiplier * defense.clip_norm, key=noise_key
    )
    grad_sum = jax.tree.map(jnp.add, grad_sum, noise)
  count = jnp.maximum(jnp.sum(weights), 1.0)
  grads = jax.tree.map(lambda g: g / count.astype(g.dtype), grad_sum)
  return loss_sum / count, grads


def transmit(tree: PyTree, defense: Defense, *, key) -> PyTree:
  """Transmission-time defenses on a trainable tree: GBoard Algorithm 4
  noise, then pruning (post-processing)."""
  if defense.update_noise_std > 0:
    noise = defenses_lib.gaussian_noise_like(
      tree, defense.update_noise_std, key=key
    )
    tree = jax.tree.map(jnp.add, tree, noise)
  if defense.prune_fraction > 0:
    tree = defenses_lib.prune_by_magnitude(
      tree, defense.prune_fraction, scope=defense.prune_scope
    )
  return tree


def _has_transmit_defense(defense: Defense) -> bool:
  return defense.update_noise_std > 0 or defense.prune_fraction > 0


def split_client_key(key) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(shuffle, step, transmit) keys of one client computation."""
  if key is None:
    raise LeakjaxError(
      'this client computation needs a PRNG key',
      'pass key=jax.random.key(seed)',
    )
  shuffle_key, step_key, transmit_key = jax.random.split(key, 3)
  return shuffle_key, step_key, transmit_key


# -------------------------------------------------------------- FedSGD
def client_gradient(
  model: Model,
  params: PyTree,
  ids,
  mask=None,
  *,
  defense: Defense = NO_DEFENSE,
  key=None,
  dropout: bool = False,
  microbatch: int | None = None,
) -> PyTree:
  """FedSGD: the gradient a client sends for one padded batch of sentences.

  ∇θ of the mean next-token loss over the real target tokens of the batch
  (pad targets masked), with `defense` applied (DP-SGD, GBoard local noise,
  frozen parameters, single noise, pruning; see :mod:`leakjax.fl.defenses`).

  Args:
    model: any leakjax model.
    params: the global parameters θ^t.
    ids: int32 `[B, T]` token ids.
    mask: `[B, T]`, 1 real / 0 pad; None means no padding.
    defense: the client's defense.
    key: PRNG key, needed when the defense adds noise or with dropout.
    dropout: use the model's training dropout.
    microbatch: compute the gradient this many sentences at a time (same
      gradient up to float rounding, memory of one chunk, for batches too
      large to differentiate in one pass). None: one pass. Ignored under
      DP-SGD (see `Defense.dp_microbatch`).

  Returns:
    The transmitted gradient, a pytree like `params` (exactly zero on frozen
    parameters).
  """
  ids, mask = batching.check_batch(ids, mask)
  if key is None and (defense.needs_key or dropout):
    raise LeakjaxError(
      'this defense adds noise (or dropout is on) but no key was given',
      'pass key=jax.random.key(seed)',
    )
  if key is None:
    key = jax.random.key(0)  # unused: nothing random happens
  _, step_key, transmit_key = split_client_key(key)
  part = Partition.of(params, defense.frozen)
  train, frozen = part.split(params)
  weights = jnp.ones((ids.shape[0],), jnp.float32)
  if microbatch is not None and microbatch < 1:
    raise LeakjaxError(f'microbatch must be >= 1, got {microbatch}')
  _, grads = defended_gradient(
    model,
    defense,
    dropout,
    part,
    train,
    frozen,
    ids,
    mask,
    weights,
    key=jax.random.fold_in(step_key, 0),
    microbatch=microbatch,
  )
  grads = transmit(grads, defense, key=transmit_key)
  return part.merge(grads, part.zeros_for_frozen(frozen))


# -------------------------------------------------------------- FedAvg
@dataclasses.dataclass(frozen=True)
class LocalTraining:
  """The pieces of :func:`client_update`, shared with the Python-loop
  reference (:mod:`leakjax.fl.reference`), so both run the very same step."""

  model: Model
  config: ClientConfig
  part: Partition
  optimizer: optax.GradientTransformation

  @classmethod
  def create(
    cls, model: Model, params: PyTree, config: ClientConfig
  ) -> LocalTraining:
    if not isinstance(config, ClientConfig):
      raise LeakjaxError(
        f'config must be a ClientConfig, got {type(config).__name__}',
        'pass fl.ClientConfig()',
      )
    return cls(
      model,
      config,
      Partition.of(params, config.defense.frozen),
      config.make_optimizer(),
    )

  def step(
    self, train, opt_state, frozen, ids_all, mask_all, indices, weights, *, key
  ):
    """One local step on rows `indices [B]` of the client's data.

    Returns `(train, opt_state, loss)`; a batch without real rows leaves
    train and opt_state unchanged and has loss NaN.
    """
    ids = ids_all[indices]  # [n, T] -> [B, T]
    mask = mask_all[indices]
    loss, grads = defended_gradient(
      self.model,
      self.config.defense,
      self.config.dropout,
      self.part,
      train,
      frozen,
      ids,
      mask,
      weights,
      key=key,
    )
    updates, new_opt_state = self.optimizer.update(grads, opt_state, train)
    new_train = optax.apply_updates(train, updates)
    has_data = jnp.sum(weights) > 0
    keep = lambda new, old: jnp.where(has_data, new, old)
    new_train = jax.tree.map(keep, new_train, train)
    new_opt_state = jax.tree.map(keep, new_opt_state, opt_state)
    return new_train, new_opt_state, jnp.where(has_data, loss, jnp.nan)

  def finish(
    self, train0, train1, frozen, losses, *, transmit_key
  ) -> ClientResult:
    """Δ = θ1 − θ0, transmission defenses, and the full-tree result."""
    defense = self.config.defense
    delta = jax.tree.map(jnp.subtract, train1, train0)
    if _has_transmit_defense(defense):
      delta = transmit(delta, defense, key=transmit_key)
      train1 = jax.tree.map(jnp.add, train0, delta)
    return ClientResult(
      params=self.part.merge(train1, frozen),
      update=self.part.merge(delta, self.part.zeros_for_frozen(frozen)),
      losses=losses,
    )


def client_update(
  model: Model,
  params: PyTree,
  ids,
  mask=None,
  config: ClientConfig = DEFAULT_CLIENT,
  *,
  key,
  num_examples=None,
) -> ClientResult:
  """FedAvg client update (GBoard Algorithm 1), all steps in one lax.scan.

  E epochs over the client's sentences in mini-batches of B (reshuffled
  every epoch, last batch possibly smaller: :mod:`leakjax.fl.batching`),
  each step an optax update of the trainable parameters with the
  (defended) gradient of the batch's mean token loss.

  Args:
    model: any leakjax model.
    params: the global parameters θ0.
    ids: int32 `[n, T]`, the client's sentences.
    mask: `[n, T]`, 1 real / 0 pad; None means no padding.
    config: E, B, η, optimizer, defense (static under jit).
    key: PRNG key (shuffling, noise, dropout).
    num_examples: rows `[0, num_examples)` are real (may be traced); None
      means all n. Used to stack clients of different sizes.

  Returns:
    A :class:`ClientResult` with θ1 (`params`), Δ (`update`) and the losses.
  """
  ids, mask = batching.check_batch(ids, mask)
  training = LocalTraining.create(model, params, config)
  shuffle_key, step_key, transmit_key = split_client_key(key)
  schedule = batching.batch_schedule(
    ids.shape[0],
    epochs=config.epochs,
    batch_size=config.batch_size,
    key=shuffle_key,
    num_examples=num_examples,
  )
  train0, frozen = training.part.split(params)
  opt_state = training.optimizer.init(train0)

  def body(carry, xs):
    train, opt_state = carry
    step, indices, weights = xs
    train, opt_state, loss = training.step(
      train,
      opt_state,
      frozen,
      ids,
      mask,
      indices,
      weights,
      key=jax.random.fold_in(step_key, step),
    )
    return (train, opt_state), loss

  num_steps = schedule.indices.shape[0]
  (train1, _), losses = lax.scan(
    body,
    (train0, opt_state),
    (jnp.arange(num_steps), schedule.indices, schedule.weights),
  )
  return training.finish(
    train0, train1, frozen, losses, transmit_key=transmit_key
  )


__all__ = [
  'CLIENT_GRADIENT_STATIC',
  'CLIENT_UPDATE_STATIC',
  'ClientConfig',
  'ClientResult',
  'client_gradient',
  'client_update',
]
