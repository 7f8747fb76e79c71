"""Embed Parrot (Wan et al. 2024, Sec. 4.3): learn to map `H^i` back to `H^0`.

Deep hidden states defeat BEI and HEI (Table 2), so the attacker trains a
small transformer M on public text to turn the hidden states `H^i_x` of the
target's layer i into its embedding-layer output `H^0_x`, then decodes the
prediction with HEI (or BEI):

  Input-Adapter (linear) -> decoder-only transformer -> Output-Adapter (linear)

trained with the cosine loss `1 - cos(M(H^i_x)_t, H^0_{x,t})` averaged over
real tokens, optionally plus the target model's perplexity of the
reconstructed text (the "EP+PPL" rows of Table 4, see :func:`ppl_term`).

The decoder. The paper uses pretrained GPT-2 XL (1.5B). Here the decoder is
a GPT-2-style stack (pre-norm blocks of :mod:`leakjax.models.gpt2`) trained
from scratch, a few million parameters by default, because (1) one
training step of GPT-2 XL, or even of SmolLM2-135M, costs 100-1000x more
and would not train in minutes on a 2-core CPU; (2) the task is mostly
per-position -- `H^i_t` already carries token t in the residual stream and
only needs a learned read-out plus some context -- so a language-model
prior adds little; and (3) a from-scratch decoder cannot have seen the test
text. The decoder has no position embeddings by default (causal attention
already orders the sequence, RoPE targets such as Llama carry no absolute
position in `H^i`, and it then works on sequences longer than any it was
trained on, as Tables 5 and 8 need); `position_embeddings=True` adds GPT-2's.

A pretrained Decode Model, as in the paper: `EmbedParrotConfig(decoder=
model)` puts any model of the protocol (e.g. the pretrained SmolLM2-135M)
between the adapters: the Input-Adapter's output takes the place of the
decoder's token embeddings (its own position terms, if any, are kept), its
blocks run with their causal mask, and the Output-Adapter reads the last
block's output through a LayerNorm. Every decoder weight is fine-tuned with
the adapters (the paper does not say whether it froze GPT-2 XL; we train it
all). With `ridge_input_adapter=True` the Input-Adapter starts at the ridge
map `H^i -> H^0`, so a decoder that shares the target's embedding space
(the target itself) starts by reading approximately its own token
embeddings (ours; the paper does not say how the adapters start).

The Input-Adapter standardises each feature with fixed statistics of the
training hidden states before its linear map (together still one affine
map; it keeps the huge outlier features of deep Llama states from
dominating the first steps). Those statistics live in the `stats` variable
collection and are not trained.

`linear_skip=True` (not in the paper) adds a full-rank linear map from the
standardised input to the output, started at the closed-form ridge
regression `H^i -> H^0` of the training data, with the Output-Adapter
starting at zero, so training starts from the linear inverse and learns what
it misses; the plain architecture's linear path runs through a `width`-rank
bottleneck. How much the skip adds is measured in
reports/embed_parrot/README.md.

Pure pieces (`EmbedParrot`, `init_variables`, `loss_fn`, `EmbedParrotLoss`,
`predict`) are jit-able; :func:`train` hands `EmbedParrotLoss` to the
library's one training loop, :func:`leakjax.train.fit` (batches, the
compiled step, checkpoints, resume, progress). The loss hashes by value and
takes the target's params as an argument, so equal settings compile once per
process and the target's weights are never baked into the program as
constants.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from leakjax import train as train_lib
from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei as ei
from leakjax.errors import LeakjaxError, check_finite
from leakjax.models import gpt2
from leakjax.models.protocol import Model, PyTree


# ------------------------------------------------------------------ model
@dataclasses.dataclass(frozen=True)
class EmbedParrotConfig:
  """Architecture of Embed Parrot.

  Attributes:
    input_dim: width of the attacked hidden states `H^i`.
    output_dim: width of `H^0` (the target's embedding width).
    width: decoder width.
    num_layers: decoder blocks.
    num_heads: attention heads; must divide `width`.
    position_embeddings: add learned GPT-2 position embeddings.
    max_length: rows of the position embedding (if any).
    linear_skip: add a full-rank linear map of the (standardised) input to
      the output, initialised by :func:`train` to the ridge-regression
      solution `H^i -> H^0` of the training data, with the Output-Adapter
      starting at zero: training starts from the best linear inverse and
      the transformer learns what it misses. Not in the paper (False = the
      paper's architecture); it removes the `width`-rank bottleneck of
      Input-Adapter -> decoder -> Output-Adapter when `width < input_dim`.
    decoder: a pretrained Decode Model (any :class:`Model` with
      `hidden_states` and declared `attention_inputs`): its blocks replace
      the from-scratch stack, `width`, `num_layers`, `num_heads` and
      `position_embeddings` are then unused, and its params are passed to
      :func:`init_variables` / :func:`train`. None: the from-scratch stack.
    ridge_input_adapter: with a `decoder` whose width is `output_dim`,
      start the Input-Adapter at the ridge map `H^i -> H^0`.
  """

  input_dim: int
  output_dim: int
  width: int = 256
  num_layers: int = 4
  num_heads: int = 4
  position_embeddings: bool = False
  max_length: int = 1024
  linear_skip: bool = False
  decoder: Model | None = None
  ridge_input_adapter: bool = False

  @property
  def decoder_width(self) -> int:
    """Width of the stack between the adapters."""
    return self.width if self.decoder is None else self.decoder.hidden_size

  def __post_init__(self):
    for name in (
      'input_dim',
      'output_dim',
      'width',
      'num_layers',
      'num_heads',
      'max_length',
    ):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise LeakjaxError(
          f'Embed Parrot: {name}={getattr(self, name)!r}'
          ' must be a positive integer'
        )
    if self.decoder is not None:
      if not self.decoder.hidden_size or not self.decoder.num_layers:
        raise LeakjaxError(
          'Embed Parrot: the pretrained decoder declares no hidden_size or'
          ' num_layers',
          'build it with hidden_size= and num_layers= (models.load does)',
        )
      if self.ridge_input_adapter and self.decoder.hidden_size != (
        self.output_dim
      ):
        raise LeakjaxError(
          'Embed Parrot: ridge_input_adapter needs a decoder of width'
          f' output_dim={self.output_dim}, not {self.decoder.hidden_size}'
        )
    elif self.ridge_input_adapter:
      raise LeakjaxError(
        'Embed Parrot: ridge_input_adapter needs a pretrained decoder'
      )
    if self.decoder is None and self.width % self.num_heads:
      raise LeakjaxError(
        f'Embed Parrot: width={self.width} is not divisible'
        f' by num_heads={self.num_heads}'
      )

  def decoder_config(self) -> gpt2.GPT2Config:
    """The GPT-2 block hyperparameters of the decoder."""
    return gpt2.GPT2Config(
      vocab_size=1,
      n_positions=self.max_length,
      n_embd=self.width,
      n_layer=self.num_layers,
      n_head=self.num_heads,
      bos_token_id=None,
      eos_token_id=None,
    )


class EmbedParrot(nn.Module):
  """`H^i [B, T, input_dim]`, mask `[B, T]` -> predicted `H^0 [B, T, output_dim]`."""

  config: EmbedParrotConfig

  @nn.compact
  def __call__(self, hidden, mask, decode=None):
    """`decode`: `[B, T, W] -> [B, T, W]`, the pretrained decoder's stack
    (see :func:`predict`); only with `config.decoder`."""
    c = self.config
    shift = self.variable('stats', 'input_shift', jnp.zeros, (c.input_dim,))
    scale = self.variable('stats', 'input_scale', jnp.ones, (c.input_dim,))
    x = (hidden.astype(jnp.float32) - shift.value) / scale.value
    skip = None
    if c.linear_skip:
      skip = nn.Dense(c.output_dim, name='linear_skip')(x)
    x = nn.Dense(
      c.decoder_width,
      name='input_adapter',
      kernel_init=nn.initializers.normal(c.input_dim**-0.5),
    )(x)
    if c.decoder is not None:
      x = nn.LayerNorm(name='ln_f')(decode(x))
      out = nn.Dense(c.output_dim, name='output_adapter')(x)
      return out if skip is None else out + skip
    dc = c.decoder_config()
    _, t, _ = x.shape
    if c.position_embeddings:
      x = x + nn.Embed(
        c.max_length,
        c.width,
        name='wpe',
        embedding_init=nn.initializers.normal(0.02),
      )(jnp.arange(t)[None])
    causal = jnp.tril(jnp.ones((t, t), bool))
    allowed = causal[None] & (jnp.asarray(mask) > 0)[:, None, :]  # [B, T, T]
    for i in range(c.num_layers):
      x, _ = gpt2.Block(dc, i, name=f'h_{i}')(x, allowed)
    x = nn.LayerNorm(name='ln_f')(x)
    out = nn.Dense(c.output_dim, name='output_adapter')(x)
    return out if skip is None else out + skip


def feature_stats(
  hidden: np.ndarray, mask: np.ndarray, *, eps: float = 1e-3
) -> dict[str, np.ndarray]:
  """Per-feature mean and std of `hidden [N, T, D]` over real positions."""
  real = np.asarray(mask).astype(bool)
  x = np.asarray(hidden)[real].astype(np.float64)  # [tokens, D]
  if not len(x):
    raise LeakjaxError('no real token to compute Embed Parrot input stats')
  mean = x.mean(0)
  std = x.std(0)
  return {
    'input_shift': mean.astype(np.float32),
    'input_scale': np.maximum(std, eps * max(std.mean(), eps)).astype(
      np.float32
    ),
  }


def ridge_solution(
  inputs: np.ndarray,
  targets: np.ndarray,
  mask: np.ndarray,
  stats: dict[str, np.ndarray],
  *,
  l2: float = 10.0,
) -> tuple[np.ndarray, np.ndarray]:
  """Least-squares `(kernel [Din, Dout], bias [Dout])` from standardised
  `H^i` to `H^0` over real positions, with an L2 penalty `l2`."""
  real = np.asarray(mask).astype(bool)
  x = (np.asarray(inputs)[real].astype(np.float64) - stats['input_shift']) / (
    stats['input_scale']
  )
  y = np.asarray(targets)[real].astype(np.float64)
  x_mean, y_mean = x.mean(0), y.mean(0)
  xc, yc = x - x_mean, y - y_mean
  kernel = np.linalg.solve(xc.T @ xc + l2 * np.eye(x.shape[1]), xc.T @ yc)
  bias = y_mean - x_mean @ kernel
  return kernel.astype(np.float32), bias.astype(np.float32)


def decoder_states(decoder: Model, params, inputs, mask) -> jax.Array:
  """The pretrained decoder's last block output `[B, T, W]` for `inputs`.

  `inputs [B, T, W]` take the place of the token embeddings: the decoder
  runs on dummy ids (id 0) and its block 0 reads `H^0 - e_0 + inputs`,
  where `e_0` is token 0's embedding as block 0 sees it, so position terms
  (GPT-2's) stay and the token part is `inputs`.
  """
  ids = jnp.zeros(inputs.shape[:2], jnp.int32)
  first = decoder.first_layer_inputs(params)
  token0 = (
    first.tokens[0] if first is not None else decoder.word_embeddings(params)[0]
  )
  token0 = token0.astype(jnp.float32)

  def transform(h):
    return (h.astype(jnp.float32) - token0 + inputs).astype(h.dtype)

  out = ei.hidden_with_transform(
    decoder, params, ids, mask, transform=transform
  )
  return out.astype(jnp.float32)


def init_variables(
  config: EmbedParrotConfig,
  *,
  key,
  stats: dict[str, np.ndarray] | None = None,
  decoder_params: PyTree = None,
) -> PyTree:
  """`{'params': ..., 'stats': ...}` for :class:`EmbedParrot`.

  With `config.decoder`, `decoder_params` (its pretrained weights) become
  `params['decoder']`.
  """
  if (config.decoder is None) != (decoder_params is None):
    raise LeakjaxError(
      'Embed Parrot: a pretrained decoder and its params go together',
      'pass EmbedParrotConfig(decoder=model) with decoder_params=params',
    )
  module = EmbedParrot(config)
  variables = module.init(
    key,
    jnp.zeros((1, 2, config.input_dim)),
    jnp.ones((1, 2), jnp.int32),
    None if config.decoder is None else (lambda x: x),
  )
  variables = {'params': variables['params'], 'stats': variables['stats']}
  if decoder_params is not None:
    variables['params'] = {
      **variables['params'],
      'decoder': jax.tree.map(jnp.asarray, decoder_params),
    }
  if stats is not None:
    variables['stats'] = {k: jnp.asarray(v) for k, v in stats.items()}
  return variables


def predict(
  config: EmbedParrotConfig, variables: PyTree, hidden, mask
) -> jax.Array:
  """Predicted `H^0` float32 `[B, T, output_dim]` (pure; jit it)."""
  if config.decoder is None:
    return EmbedParrot(config).apply(variables, hidden, mask)
  params = dict(variables['params'])
  dec = params.pop('decoder')
  decode = functools.partial(decoder_states, config.decoder, dec, mask=mask)
  return EmbedParrot(config).apply(
    {'params': params, 'stats': variables['stats']},
    hidden,
    mask,
    lambda x: decode(x),
  )


# ------------------------------------------------------------------- loss
def cosine_loss(pred: jax.Array, target: jax.Array, mask) -> jax.Array:
  """Mean `1 - cos(pred_t, target_t)` over real positions (Sec. 4.3)."""
  pred = pred.astype(jnp.float32)
  target = target.astype(jnp.float32)
  cos = (pred * target).sum(-1) / (
    jnp.maximum(jnp.linalg.norm(pred, axis=-1), 1e-8)
    * jnp.maximum(jnp.linalg.norm(target, axis=-1), 1e-8)
  )
  w = jnp.asarray(mask).astype(jnp.float32)
  return ((1.0 - cos) * w).sum() / jnp.maximum(w.sum(), 1.0)


def ppl_term(
  model: Model, params, pred: jax.Array, mask, *, temperature: float = 0.05
) -> jax.Array:
  """The target model's log-perplexity of the reconstruction (EP+PPL).

  The decoded text `argmax_v cos(pred_t, W_v)` is not differentiable, so it
  is relaxed: `q_t = softmax(cos(pred_t, W) / temperature)` over the
  vocabulary, the model reads the soft embeddings `q_t W` in place of its
  token embeddings (position terms, if any, are kept), and the term is the
  cross-entropy `-sum_v q_{t+1}(v) log p(v | q_{<=t})` averaged over real
  next-token positions; as temperature -> 0 it is the log-perplexity of the
  HEI-decoded text.

  Args:
    model: the target model (its parameters are not trained).
    params: the target's parameters.
    pred: Embed Parrot's predicted `H^0`, `[B, T, D]`.
    mask: `[B, T]`.
    temperature: softmax temperature of the relaxation.
  """
  emb = jax.lax.stop_gradient(model.word_embeddings(params))  # [V, D]
  params = jax.lax.stop_gradient(params)
  q = jax.nn.softmax(ei.cosine_scores(pred, emb) / temperature, axis=-1)
  soft = jnp.einsum('btv,vd->btd', q, emb.astype(jnp.float32))
  ids = jnp.zeros(pred.shape[:2], jnp.int32)
  # H^0 of the dummy ids is E[0] + (position terms); swap E[0] for `soft`.
  token0 = emb[0].astype(jnp.float32)
  logits = ei.logits_with_transform(
    model,
    params,
    ids,
    mask,
    layer=0,
    transform=lambda h: (h.astype(jnp.float32) - token0 + soft).astype(h.dtype),
  )
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  ce = -(q[:, 1:] * logp).sum(-1)  # [B, T-1]
  w = jnp.asarray(mask)[:, 1:].astype(jnp.float32)
  return (ce * w).sum() / jnp.maximum(w.sum(), 1.0)


class Batch(NamedTuple):
  """One training batch.

  Attributes:
    inputs: `H^i`, float `[B, T, input_dim]`.
    targets: `H^0`, float `[B, T, output_dim]`.
    mask: int32 `[B, T]`.
  """

  inputs: jax.Array
  targets: jax.Array
  mask: jax.Array


def loss_fn(
  params,
  stats,
  batch: Batch,
  *,
  config: EmbedParrotConfig,
  ppl: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
  ppl_weight: float = 0.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Cosine loss (+ `ppl_weight` * PPL term); returns (loss, metrics)."""
  pred = predict(
    config, {'params': params, 'stats': stats}, batch.inputs, batch.mask
  )
  cos_loss = cosine_loss(pred, batch.targets, batch.mask)
  metrics = {'cos_loss': cos_loss}
  loss = cos_loss
  if ppl is not None and ppl_weight > 0:
    log_ppl = ppl(pred, batch.mask)
    metrics['log_ppl'] = log_ppl
    loss = loss + ppl_weight * log_ppl
  metrics['loss'] = loss
  return loss, metrics


# --------------------------------------------------------------- training
@dataclasses.dataclass(frozen=True)
class EmbedParrotLoss:
  """Embed Parrot's training loss as a :class:`leakjax.train.LossFn`.

  `frozen` is `{'stats': <the input statistics>, 'target': <the attacked
  model's params, or None>}`: neither is trained. Hashes by value, so equal
  settings share one compiled step and the target's weights are an argument,
  never constants of the program.

  Attributes:
    config: the architecture.
    ppl_weight: weight of the PPL term (0: plain EP).
    ppl_temperature: temperature of the PPL term's relaxation.
    target_model: the attacked model, needed when `ppl_weight > 0`.
  """

  config: EmbedParrotConfig
  ppl_weight: float = 0.0
  ppl_temperature: float = 0.05
  target_model: Model | None = None

  def __call__(self, params, frozen, batch: Batch, key):
    del key  # deterministic
    ppl = None
    if self.ppl_weight > 0:
      ppl = functools.partial(
        ppl_term,
        self.target_model,
        frozen['target'],
        temperature=self.ppl_temperature,
      )
    return loss_fn(
      params,
      frozen['stats'],
      batch,
      config=self.config,
      ppl=ppl,
      ppl_weight=self.ppl_weight,
    )


def train_config(
  steps: int,
  batch_size: int = 32,
  *,
  learning_rate: float = 1e-3,
  warmup_steps: int = 100,
  **overrides,
) -> train_lib.TrainConfig:
  """The optimisation of Embed Parrot as a :class:`leakjax.train.TrainConfig`.

  AdamW (weight decay 0.01 of the matrices, not of biases, norms or the
  adapters' statistics), the global gradient norm clipped to 1, linear
  warmup then cosine decay to 5% of the peak, `steps` steps over epochs of
  full batches reshuffled with `seed`. The paper gives no optimiser
  settings (Wan et al. 2024, Sec. 4.3); these are ours. `overrides` sets
  any other field (e.g. `seed`, `log_every`, `checkpoint_every`).
  """
  fields = dict(
    optimizer='adamw',
    learning_rate=learning_rate,
    warmup_steps=warmup_steps,
    schedule='cosine',
    final_learning_rate_fraction=0.05,
    weight_decay=0.01,
    grad_clip_norm=1.0,
    batch_size=batch_size,
    num_steps=steps,
    drop_remainder=True,
    log_every=100,
    checkpoint_every=500,
  )
  fields.update(overrides)
  return train_lib.TrainConfig(**fields)


def train(
  config: EmbedParrotConfig,
  inputs: np.ndarray,
  targets: np.ndarray,
  mask: np.ndarray,
  train_config: train_lib.TrainConfig,
  *,
  key,
  ppl_weight: float = 0.0,
  ppl_temperature: float = 0.05,
  workdir: str | os.PathLike | None = None,
  target_model: Model | None = None,
  target_params: PyTree = None,
  init: PyTree | None = None,
  decoder_params: PyTree = None,
  progress: bool = False,
) -> tuple[PyTree, list[dict[str, float]]]:
  """Trains Embed Parrot on cached hidden states with :func:`leakjax.train.fit`.

  Args:
    config: the architecture (`input_dim`/`output_dim` must match the data).
    inputs: `H^i`, `[N, T, input_dim]` (any float dtype; kept on the host).
    targets: `H^0`, `[N, T, output_dim]`.
    mask: `[N, T]`, 1 for real tokens.
    train_config: optimisation settings, e.g. from :func:`train_config`
      (its `num_steps` counts the steps).
    key: a `jax.random.key` for the initialisation.
    ppl_weight: weight of the target's perplexity term (EP+PPL); 0: plain
      EP.
    ppl_temperature: temperature of the PPL term's relaxation.
    workdir: checkpoint folder (see :func:`leakjax.train.fit`); a finished
      run there returns at once.
    target_model: the attacked model, needed when `ppl_weight > 0`.
    target_params: its parameters, needed with `target_model`.
    init: start from these `{'params', 'stats'}` (e.g. a trained EP that is
      fine-tuned with the PPL term) instead of a fresh initialisation.
    decoder_params: the pretrained weights of `config.decoder` (needed with
      a decoder and no `init`).
    progress: show a tqdm bar (log lines are written either way).

  Returns:
    `(variables, history)`: `{'params', 'stats'}` and the logged rows of
    :func:`leakjax.train.fit` (`step`, `loss`, `cos_loss`, `log_ppl` with
    the PPL term, `grad_norm`, `learning_rate`, `steps_per_second`).
  """
  n, t, din = inputs.shape
  if targets.shape[:2] != (n, t) or mask.shape != (n, t):
    raise LeakjaxError(
      f'Embed Parrot data shapes differ: inputs'
      f' {inputs.shape}, targets {targets.shape}, mask'
      f' {mask.shape}'
    )
  if din != config.input_dim or targets.shape[-1] != config.output_dim:
    raise LeakjaxError(
      f'Embed Parrot expects {config.input_dim} -> {config.output_dim}'
      f' features, the data has {din} -> {targets.shape[-1]}'
    )
  if train_config.batch_size > n:
    raise LeakjaxError(
      f'batch_size={train_config.batch_size} exceeds the {n} training'
      ' sequences',
      'use a smaller batch',
    )
  if ppl_weight > 0:
    if target_model is None or target_params is None:
      raise LeakjaxError(
        'ppl_weight > 0 needs the target model and its params',
        'pass target_model= and target_params=',
      )
  else:  # the plain cosine loss reads neither: one compile for every target
    target_model, target_params = None, None
  if init is not None:
    variables = jax.tree.map(jnp.asarray, init)
  else:
    stats = feature_stats(inputs, mask)
    variables = init_variables(
      config, key=key, stats=stats, decoder_params=decoder_params
    )
    if config.linear_skip or config.ridge_input_adapter:
      kernel, bias = ridge_solution(inputs, targets, mask, stats)
      ridge = {'kernel': jnp.asarray(kernel), 'bias': jnp.asarray(bias)}
      params = dict(variables['params'])
      if config.ridge_input_adapter:
        params['input_adapter'] = ridge
      if config.linear_skip:
        params['linear_skip'] = ridge
        params['output_adapter'] = jax.tree.map(
          jnp.zeros_like, params['output_adapter']
        )
      variables = {'params': params, 'stats': variables['stats']}
  # Right padding: the last real position + 1 of each sequence.
  host_mask = np.asarray(mask)
  lengths = np.where(
    host_mask.any(1), t - np.argmax(host_mask[:, ::-1] > 0, axis=1), 0
  )

  def make_batch(rows: np.ndarray) -> Batch:
    real = rows >= 0  # -1: a filler row of a partial batch
    rows = np.where(real, rows, 0)
    # Trim padding to a multiple of 16 (at most T/16 compiled shapes). A
    # pretrained Decode Model keeps the full length instead: compiling its
    # deep training step costs far more than the padding, so one shape is
    # cheaper than four.
    longest = lengths[rows][real].max() if real.any() else 1
    width = (
      t
      if config.decoder is not None
      else min(t, 16 * max(1, math.ceil(longest / 16)))
    )
    return Batch(
      inputs=jnp.asarray(inputs[rows, :width], jnp.float32),
      targets=jnp.asarray(targets[rows, :width], jnp.float32),
      mask=jnp.asarray(host_mask[rows, :width] * real[:, None], jnp.int32),
    )

  loss = EmbedParrotLoss(config, ppl_weight, ppl_temperature, target_model)
  result = train_lib.fit(
    loss,
    variables['params'],
    make_batch,
    n,
    train_config,
    frozen={'stats': variables['stats'], 'target': target_params},
    workdir=workdir,
    fingerprint=train_lib.data_fingerprint(
      inputs, targets, host_mask, *jax.tree.leaves(variables)
    ),
    progress=progress,
    desc='Embed Parrot',
  )
  check_finite(result.params, 'Embed Parrot parameters')
  return {'params': result.params, 'stats': variables['stats']}, result.history


def predict_batches(
  config: EmbedParrotConfig,
  variables: PyTree,
  inputs: np.ndarray,
  mask: np.ndarray,
  *,
  batch_size: int = 64,
) -> np.ndarray:
  """:func:`predict` over host arrays in fixed-shape chunks, float32 numpy."""
  fn = functools.partial(jitted(predict, static_argnames=('config',)), config)
  n = len(inputs)
  out = []
  for start in range(0, n, batch_size):
    rows = np.arange(start, start + batch_size)
    rows = np.minimum(rows, n - 1)  # pad the last chunk by repetition
    pred = fn(
      variables,
      jnp.asarray(inputs[rows], jnp.float32),
      jnp.asarray(mask[rows], jnp.int32),
    )
    out.append(np.asarray(pred)[: min(batch_size, n - start)])
  return np.concatenate(out)


__all__ = [
  'EmbedParrotConfig',
  'EmbedParrot',
  'decoder_states',
  'feature_stats',
  'ridge_solution',
  'init_variables',
  'predict',
  'cosine_loss',
  'ppl_term',
  'Batch',
  'loss_fn',
  'EmbedParrotLoss',
  'train_config',
  'train',
  'predict_batches',
]
