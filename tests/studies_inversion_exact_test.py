"""studies.inversion_exact.noise_levels on a tiny Llama: the runner's
one-shot inverters read the dev texts at every noise level."""

from __future__ import annotations

import pytest

from leakjax.attacks.inversion import exact_runner
from studies.inversion_exact import noise_levels, noise_rule
from tests.inversion_exact_runner_test import config, sentences, tiny_llama


@pytest.mark.slow
def test_noise_levels_reads_the_dev_texts_at_every_level():
  model, params = tiny_llama()
  corpora = {'a': sentences(40, 0), 'b': sentences(30, 1)}
  cfg = config(splits=('dev',), num_dev=3, layers=('1',))
  got = noise_levels.measure(cfg, model, params, corpora, [0.0, 5.0])
  assert len(got) == 2 * 2 * len(noise_levels.READERS)
  assert set(noise_levels.READERS) <= set(exact_runner.ATTACKS)
  for attack in noise_levels.READERS:
    for name in 'ab':
      clean = got[f'rouge1@attack={attack},data={name},layer=1,split=dev']
      noisy = got[
        f'rouge1@attack={attack},data={name},layer=1,noise=5,split=dev'
      ]
      assert 0 <= noisy < clean <= 1, (attack, name, noisy, clean)


@pytest.mark.slow
def test_noise_rule_compares_the_rules_on_the_dev_texts():
  model, params = tiny_llama()
  corpora = {'a': sentences(40, 0), 'b': sentences(30, 1)}
  cfg = config(
    splits=('dev',), num_dev=3, layers=('1',), perturbations=('noise:0.05',)
  )
  got = noise_rule.measure(
    cfg, model, params, corpora, ('calibrated', 'nearest'), 2
  )
  assert len(got) == 2 * 2 * 7
  for name in 'ab':
    at = f'data={name},layer=1,noise=0.05,rule=calibrated,split=dev,z=6'
    # Light noise: the calibrated rule reads every dev text back.
    assert got[f'exact@{at}'] == 1.0
    assert got[f'undecided@{at}'] == 0.0
    assert 1 <= got[f'candidates_per_token@{at}'] <= got[f'candidates_max@{at}']
