"""The audit's model samples (what studies.audit.attacker_text measured):
drawn at the inversion experiment's sampling defaults, none when the
config asks for none."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from leakjax import audit
from leakjax.attacks.inversion import runner as inversion_runner
from leakjax.attacks.inversion import texts
from leakjax.audit import hidden, runner
from leakjax.errors import LeakjaxError


def test_audit_samples_at_the_inversion_experiments_defaults(monkeypatch):
  seen = {}

  def fake(model, params, num, **kwargs):
    seen.update(kwargs, num=num)
    return ['x'] * num

  real = texts.model_samples
  monkeypatch.setattr(texts, 'model_samples', fake)
  assert hidden.attacker_samples(None, None, 0, 24, 0) == []
  assert not seen
  assert hidden.attacker_samples(None, None, 5, 24, 3) == ['x'] * 5
  ref = inversion_runner.InversionConfig(max_length=24, train_samples=5)
  assert seen.pop('num') == ref.train_samples
  assert seen.pop('length') == ref.max_length
  key = seen.pop('key')
  assert np.array_equal(
    jax.random.key_data(key), jax.random.key_data(jax.random.PRNGKey(3))
  )
  # Everything else is the sampler's defaults, which are the experiment's.
  assert not seen
  params = inspect.signature(real).parameters
  defaults = {
    p: params[p].default for p in ('start_id', 'temperature', 'top_p')
  }
  assert defaults == {
    'start_id': ref.sample_start_id,
    'temperature': ref.sample_temperature,
    'top_p': ref.sample_top_p,
  }


def test_a_model_without_sentences_names_the_audit_flag(monkeypatch):
  def fake(model, params, num, **kwargs):
    raise LeakjaxError('64 samples gave no new sentence of >= 4 words')

  monkeypatch.setattr(texts, 'model_samples', fake)
  with pytest.raises(LeakjaxError, match='--attacker_samples=0'):
    hidden.attacker_samples(None, None, 5, 24, 0)


def test_the_audit_fits_on_its_sentences_and_samples_drawn_once(monkeypatch):
  calls = []

  def fake(model, params, num, **kwargs):
    calls.append(num)
    return [f'Sampled sentence number {i}.' for i in range(num)]

  monkeypatch.setattr(texts, 'model_samples', fake)
  cfg = audit.AuditConfig(model='gpt2-tiny', attacker_samples=3)
  splits = runner.Splits(['a', 'b'], ['a', 'b'], ['c'], ['b'])
  cells = runner._Cells(cfg, None, None, splits)  # pylint: disable=protected-access
  want = ['b'] + [f'Sampled sentence number {i}.' for i in range(3)]
  assert cells.attacker_text() == want
  assert cells.attacker_text() == want
  assert calls == [3]
  with pytest.raises(LeakjaxError, match='attacker_samples'):
    audit.AuditConfig(attacker_samples=-1)
