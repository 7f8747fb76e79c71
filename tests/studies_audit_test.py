"""studies.audit.attacker_text: its sampling settings are the fields
`texts.model_samples` reads, so the study draws whole model sentences."""

from __future__ import annotations

import dataclasses

import jax

from leakjax.attacks.inversion import runner, texts
from leakjax.tokenization import gpt2_tokenizer
from studies.audit import attacker_text
from tests.embed_parrot_test import _chain_model


def test_sample_settings_are_the_experiments_defaults():
  got = attacker_text.SampleSettings(5, 24)
  ref = runner.InversionConfig(max_length=24, train_samples=5)
  for field in dataclasses.fields(got):
    assert getattr(got, field.name) == getattr(ref, field.name), field.name


def test_sample_settings_draw_whole_sentences():
  tok = gpt2_tokenizer()
  model, params = _chain_model(
    tok, [' The red fox runs fast.', ' A blue bird sings well.']
  )
  settings = dataclasses.replace(
    attacker_text.SampleSettings(2, 24), sample_start_id=tok.encode('.')[0]
  )
  got = texts.model_samples(
    model, params, settings, key=jax.random.key(0), batch_size=4
  )
  assert sorted(got) == ['A blue bird sings well.', 'The red fox runs fast.']
