"""FILM's pipeline on a gradient another experiment builds.

DAGER's comparison (Petrov et al. 2024 against FILM at Sec. 7's beam
width) and the audit run FILM on the gradients they build; a paper
package imports no other, so they take this function.
"""

from __future__ import annotations

from typing import Callable

from leakjax.attacks.film import pipeline, runner


def baseline(num_beams: int = 32, steps: int = 20) -> Callable[..., list[str]]:
  """FILM's pipeline (:func:`leakjax.attacks.film.recover`) as a function of
  one observed gradient, `(model, params, grads, *, key, mesh) -> list of
  sentences`: `num_beams` beams, n-gram size 2, beta = 1, `steps` phrase
  and token reordering steps, FILM's other settings at their defaults."""
  film_cfg = runner.FilmConfig(
    num_beams=(num_beams,), phrase_steps=steps, token_steps=steps
  )
  attack = runner.attack_config(film_cfg, num_beams, 2, 1.0)

  def recover(model, params, grads, *, key, mesh=None) -> list[str]:
    result = pipeline.recover(
      model, params, grads, config=attack, key=key, mesh=mesh
    )
    return list(result.sentences)

  return recover


__all__ = ['baseline']
