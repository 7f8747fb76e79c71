"""DP-SGD privacy accounting with Google's `dp-accounting` library.

The mechanism is DP-SGD's: `steps` compositions of the Poisson-subsampled
Gaussian mechanism with sampling probability q = B / n and noise multiplier
σ (noise std σC on a sum of per-example gradients clipped to C), under
add/remove-one-example adjacency. This is the standard analysis of Abadi et
al. 2016 (and of FILM Table 4b, which reports ε for DPSGD); our clients draw
fixed-size shuffled batches, for which Poisson sampling is the customary
approximation (see "How to DP-fy ML", Ponomareva et al. 2023, Sec. 5.6).

Accountant. The default is the RDP accountant
(`dp_accounting.rdp.RdpAccountant`, Mironov 2017; Mironov, Talwar, Zhang
2019) over the orders in :data:`RDP_ORDERS`, with dp-accounting's RDP ->
(ε, δ) conversion (Canonne, Kamath, Steinke 2020, Prop. 12), which is
tighter than the classic ε = RDP(α) + log(1/δ)/(α − 1) that Abadi et al.
and the TF-Privacy tutorials used. `accountant='pld'` uses the privacy-loss-
distribution accountant (tighter still, slower).

Published checks (tests/fl_accounting_test.py): with the classic
conversion, our RDP curve reproduces Abadi et al. Sec. 3.1 (q=0.01, σ=4,
T=10000, δ=1e-5: ε ≈ 1.26) and the TF-Privacy MNIST tutorial table
(tensorflow/privacy `tutorials/README.md`: n=60000, B=256, σ=1.12, 60
epochs, δ=1e-5: ε = 2.92; σ=1.2, 10 epochs: ε = 1.20).

>>> round(epsilon(4.0, 0.01, 10_000, 1e-5), 3)
1.035
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from leakjax.errors import LeakjaxError

if TYPE_CHECKING:
  import dp_accounting


def _dp():
  # dp-accounting pulls in scipy.signal (over a second): imported on first
  # use, not by every `import leakjax`.
  import dp_accounting  # pylint: disable=g-import-not-at-top,redefined-outer-name
  import dp_accounting.pld  # pylint: disable=g-import-not-at-top
  import dp_accounting.rdp  # pylint: disable=g-import-not-at-top

  return dp_accounting


# TF-Privacy's orders, plus a few large ones for tiny δ / large σ.
RDP_ORDERS = tuple(
  [1 + x / 10 for x in range(1, 100)] + list(range(12, 64)) + [128, 256, 512]
)
ACCOUNTANTS = ('rdp', 'pld')


def _check(noise_multiplier, sampling_probability, steps, delta) -> None:
  if not noise_multiplier >= 0:
    raise LeakjaxError(
      f'noise multiplier must be >= 0, got {noise_multiplier}',
      'pass sigma >= 0',
    )
  if not 0 < sampling_probability <= 1:
    raise LeakjaxError(
      f'sampling probability must be in (0, 1], got {sampling_probability}',
      'pass q = batch / dataset',
    )
  if not (isinstance(steps, (int, np.integer)) and steps >= 0):
    raise LeakjaxError(
      f'steps must be an int >= 0, got {steps!r}',
      'pass the number of noisy steps',
    )
  if not 0 < delta < 1:
    raise LeakjaxError(
      f'delta must be in (0, 1), got {delta}',
      'pass e.g. 1e-5 (less than 1 / dataset size)',
    )


def _dp_sgd_event(
  noise_multiplier: float, sampling_probability: float, steps: int
) -> dp_accounting.DpEvent:
  dp = _dp()
  gaussian = dp.GaussianDpEvent(noise_multiplier)
  if sampling_probability < 1:
    gaussian = dp.PoissonSampledDpEvent(sampling_probability, gaussian)
  return dp.SelfComposedDpEvent(gaussian, int(steps))


def rdp_curve(
  noise_multiplier: float,
  sampling_probability: float,
  steps: int,
  orders=RDP_ORDERS,
) -> np.ndarray:
  """RDP ε(α) of DP-SGD at each order α in `orders`, `[len(orders)]`."""
  accountant = _dp().rdp.RdpAccountant(list(orders))
  accountant.compose(
    _dp_sgd_event(noise_multiplier, sampling_probability, steps)
  )
  # dp-accounting exposes the curve only as this attribute.
  return np.asarray(accountant._rdp, np.float64)  # pylint: disable=protected-access


def epsilon(
  noise_multiplier: float,
  sampling_probability: float,
  steps: int,
  delta: float,
  *,
  accountant: str = 'rdp',
) -> float:
  """ε of DP-SGD after `steps` steps (see the module docstring).

  Args:
    noise_multiplier: σ, noise std / clip norm. 0 gives ε = inf.
    sampling_probability: q = B / n.
    steps: number of noisy gradient steps.
    delta: target δ.
    accountant: 'rdp' (default) or 'pld'.

  Returns:
    ε (inf without noise, 0 without steps).
  """
  _check(noise_multiplier, sampling_probability, steps, delta)
  if steps == 0:
    return 0.0
  if noise_multiplier == 0:
    return math.inf
  event = _dp_sgd_event(noise_multiplier, sampling_probability, steps)
  if accountant == 'rdp':
    acc = _dp().rdp.RdpAccountant(list(RDP_ORDERS))
  elif accountant == 'pld':
    acc = _dp().pld.PLDAccountant()
  else:
    raise LeakjaxError(
      f'accountant {accountant!r} is not one of {ACCOUNTANTS}',
      "use 'rdp' or 'pld'",
    )
  acc.compose(event)
  return float(acc.get_epsilon(delta))


def sigma_for_epsilon(
  target_epsilon: float,
  sampling_probability: float,
  steps: int,
  delta: float,
  *,
  accountant: str = 'rdp',
  rtol: float = 1e-4,
) -> float:
  """The smallest σ (to relative `rtol`) with ε(σ) <= target, by bisection.

  ε is decreasing in σ; the bracket [0, hi] doubles hi until ε(hi) <= target,
  then bisects until (hi − lo) <= rtol * hi and returns hi, so the result
  always satisfies the target. FILM Table 4b uses ε in {1, 5, 10, 15, inf};
  inf gives σ = 0 (no noise). Answers are kept for the process: a runner
  asks for the same σ in every cell or batch of a DP defense.

  >>> s = sigma_for_epsilon(1.0, 0.01, 10_000, 1e-5)
  >>> epsilon(s, 0.01, 10_000, 1e-5) <= 1.0
  True
  """
  if not target_epsilon > 0:
    raise LeakjaxError(
      f'target epsilon must be > 0, got {target_epsilon}',
      'pass e.g. 1, 5, 10, 15 or inf',
    )
  _check(0.0, sampling_probability, steps, delta)
  if math.isinf(target_epsilon) or steps == 0:
    return 0.0
  return _sigma_for_epsilon(
    float(target_epsilon),
    float(sampling_probability),
    int(steps),
    float(delta),
    accountant,
    float(rtol),
  )


# A bisection evaluates ε a few dozen times (seconds: each an RDP curve over
# RDP_ORDERS), and a runner asks for the same σ in every cell or batch of a
# DP defense; the answer is a function of these scalars alone.
@functools.lru_cache(maxsize=256)
def _sigma_for_epsilon(
  target_epsilon: float,
  sampling_probability: float,
  steps: int,
  delta: float,
  accountant: str,
  rtol: float,
) -> float:
  eps = lambda s: epsilon(
    s, sampling_probability, steps, delta, accountant=accountant
  )
  with _quiet_orders():
    return _bisect(eps, target_epsilon, rtol)


class _UnconvergedOrders(logging.Filter):
  """Drops dp-accounting's warning that an RDP order did not converge: the
  order is left out of the bound, which stays a valid upper bound on
  epsilon, and a bisection would print it hundreds of times."""

  def filter(self, record: logging.LogRecord) -> bool:
    return 'failed to converge' not in str(record.msg)


@contextlib.contextmanager
def _quiet_orders():
  quiet = _UnconvergedOrders()
  logger = logging.getLogger('absl')
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


def _bisect(eps, target_epsilon: float, rtol: float) -> float:
  lo, hi = 0.0, 1.0
  while eps(hi) > target_epsilon:
    lo, hi = hi, 2.0 * hi
    if hi > 1e6:
      raise LeakjaxError(
        f'no noise multiplier <= 1e6 reaches epsilon {target_epsilon}',
        'raise the target epsilon',
      )
  while hi - lo > rtol * hi:
    mid = 0.5 * (lo + hi)
    if eps(mid) > target_epsilon:
      lo = mid
    else:
      hi = mid
  return hi


__all__ = ['epsilon', 'sigma_for_epsilon', 'rdp_curve', 'RDP_ORDERS']
