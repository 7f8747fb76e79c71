"""FILM's client (the threat model of Sec. 3.3): its batch, its defense,
the gradient it sends.

* :func:`draw_batch` -- the `index`-th client batch of b training sentences;
* :func:`parse_defense` / :func:`make_defense` -- `none`, `freeze` (Sec. 5),
  `prune:<ratio>` (Zhu et al., Sec. 6.3), `dp:<epsilon>` (DP-SGD
  calibrated for the whole training run, Sec. 6.3), `dpsigma:<σ>` (DP-SGD
  at a given noise multiplier, for curves against σ; σ = 0 is the
  per-example clipping alone);
* :func:`client_gradient` -- the FedSGD gradient the eavesdropper sees
  (:func:`leakjax.fl.client_gradient`, jitted here with the model static);
  :func:`release_gradient_programs` drops its compiled programs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import jax.numpy as jnp
import numpy as np

from leakjax import fl, runtime
from leakjax._jit import jitted
from leakjax.errors import LeakjaxError

if TYPE_CHECKING:
  from leakjax.attacks.film.runner import FilmConfig


def parse_defense(spec: str) -> tuple[str, float]:
  """'none' | 'freeze' | 'prune:<ratio>' | 'dp:<epsilon>' | 'dpsigma:<σ>'
  -> (kind, value)."""
  kind, _, value = spec.partition(':')
  if kind in ('none', 'freeze') and not value:
    return kind, 0.0
  if kind in ('prune', 'dp', 'dpsigma'):
    try:
      v = float(value)
    except ValueError:
      v = float('nan')
    if (
      (kind == 'prune' and 0 <= v < 1)
      or (kind == 'dp' and v > 0)
      or (kind == 'dpsigma' and 0 <= v < float('inf'))
    ):
      return kind, v
  raise LeakjaxError(
    f'bad defense {spec!r}',
    'use none, freeze, prune:<ratio in [0,1)>, dp:<eps> or dpsigma:<σ >= 0>',
  )


def draw_batch(num: int, b: int, index: int, seed: int) -> list[int]:
  """The `index`-th client batch of size b (deterministic)."""
  rng = np.random.default_rng([seed, b, index])
  return sorted(rng.choice(num, size=b, replace=False).tolist())


def make_defense(
  model, spec: str, cfg: FilmConfig, *, num_train: int, b: int
) -> tuple[fl.Defense, float | None]:
  """The client's defense and the per-coordinate noise std it adds."""
  kind, value = parse_defense(spec)
  if kind == 'none':
    return fl.Defense(), None
  if kind == 'freeze':
    return fl.freeze_embeddings(model), None
  if kind == 'prune':
    return fl.gradient_pruning(value), None
  if kind == 'dpsigma':
    sigma = value
  else:
    # DP-SGD calibrated for `train_steps` steps at sampling rate b/N.
    steps = cfg.dp_steps or max(1, cfg.train_steps)
    sigma = fl.sigma_for_epsilon(
      value, min(1.0, b / num_train), steps, cfg.dp_delta
    )
  # Per-example gradients 4 at a time: memory of 4 copies of the model.
  defense = fl.dp_sgd(cfg.dp_clip, sigma, microbatch=min(b, 4))
  return defense, sigma * cfg.dp_clip / b


# Client batches are padded to a multiple of this many tokens, so that
# batches of different lengths share one compiled gradient.
_TOKEN_BUCKET = 8


def client_batch(model, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """`(ids, mask)` of `texts` as the client computes its gradient on them:
  BOS first, right-padded (mask 0) to a multiple of _TOKEN_BUCKET tokens
  within the model's longest sequence."""
  ids, mask = model.tokenizer.encode_batch(list(texts), add_bos=True)
  width = -(-ids.shape[1] // _TOKEN_BUCKET) * _TOKEN_BUCKET
  if model.max_length is not None:
    width = min(width, max(ids.shape[1], model.max_length))
  if width > ids.shape[1]:
    extra = ((0, 0), (0, width - ids.shape[1]))
    ids = np.pad(ids, extra, constant_values=model.tokenizer.pad_id)
    mask = np.pad(mask, extra)
  return ids, mask


def client_gradient(
  model, params, texts: Sequence[str], defense, key, microbatch=None
):
  """The client's FedSGD gradient of `texts`, `microbatch` rows at a time.

  The batch is :func:`client_batch`'s. Padding is invisible to the loss:
  masked positions carry no loss and, the models being causal, feed no
  valid position, so the gradient equals the unpadded one up to float32
  rounding of the longer sums over positions.
  """
  ids, mask = client_batch(model, texts)
  return (
    _gradient()(
      model,
      params,
      jnp.asarray(ids),
      jnp.asarray(mask),
      defense=defense,
      key=key,
      microbatch=microbatch,
    ),
    ids,
    mask,
  )


def _gradient():
  # The runner jits the client's step once per process: each model,
  # defense and batch shape compiles once.
  return jitted(fl.client_gradient, static_argnames=fl.CLIENT_GRADIENT_STATIC)


def release_gradient_programs() -> None:
  """Drops the compiled client gradients and gives their memory back.

  A gradient's program is the one a batch size needs alone (its shapes
  are the batch's; the searches' programs are shaped by the bag's and the
  sentences' buckets and are shared across batch sizes). The runner
  calls this when the batch size changes: the last size's gradient does
  not run again, and for SmolLM2-135M its programs held most of the
  memory the attacks of the next size would add to their peak. Nothing
  else is dropped, so the next size's searches do not trace or load
  their programs again.
  """
  _gradient().clear_cache()
  runtime.return_freed_memory()


def true_tokens(ids: np.ndarray, mask: np.ndarray) -> set[int]:
  return set(ids[mask > 0].tolist())


__all__ = [
  'client_batch',
  'client_gradient',
  'draw_batch',
  'make_defense',
  'parse_defense',
  'release_gradient_programs',
  'true_tokens',
]
