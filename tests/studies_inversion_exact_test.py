"""studies.inversion_exact on a tiny Llama: the runner's one-shot
inverters read the dev texts at every noise level, the noise rules compare,
and SipIt's gradient policy descends to the true token."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from leakjax.attacks.inversion import exact_runner
from studies.inversion_exact import (
  gradient_policy,
  noise_levels,
  noise_rule,
  proposals,
)
from tests.inversion_exact_runner_test import config, sentences, tiny_llama

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_gradient_policy_descends_to_the_true_token_at_layer_0():
  # At layer 0 a token's state is its embedding row: the steps move e from
  # the mean row onto the true token's row, which the ranking puts first.
  model, params = tiny_llama()
  table = np.asarray(model.word_embeddings(params), np.float32)
  cache = model.init_stream_cache(params, 1, 8, layer=0)
  _, cache = model.stream_decode(params, cache, jnp.asarray([[3, 5]]), layer=0)
  for token in (4, 7, 11):
    e = np.asarray(
      gradient_policy.descend(
        model,
        params,
        cache,
        jnp.asarray(table[token]),
        layer='0',
        steps=40,
        step_size=0.5,
      )
    )
    start = np.linalg.norm(table.mean(0) - table[token])
    assert np.linalg.norm(e - table[token]) < 0.1 * start
    assert np.argmax(gradient_policy.gradient_ranking(table, e)) == token


def test_the_three_ranking_order_holds_every_token_once():
  rng = np.random.default_rng(0)
  scores, prior, third = rng.normal(size=(3, 50))
  config = exact_runner.exact.ExactConfig(first_chunk=4, prior_top=2)
  got = gradient_policy.order_with(scores, prior, third, config)
  assert sorted(got.tolist()) == list(range(50))
  # The library's order's first 4, then the third ranking's best (place
  # 2 of the interleave: only the two rankings' firsts, in the head, come
  # before it).
  want = exact_runner.exact.proposal_order(scores, prior, config)
  assert got[:4].tolist() == want[:4].tolist()
  best = int(np.argmax(third))
  assert best in got[:5].tolist()
  assert best not in want[:5].tolist()  # so the third ranking moved it


@pytest.mark.slow
def test_gradient_policy_ranks_the_dev_tokens():
  model, params = tiny_llama()
  corpora = {'a': sentences(40, 0), 'b': sentences(30, 1)}
  cfg = config(splits=('dev',), num_dev=2, layers=('1',))
  got = gradient_policy.measure(cfg, model, params, corpora, 2, 10, 0.5)
  for name in 'ab':
    n = got[f'num_tokens@data={name},layer=1']
    assert n >= 2
    for ranking in gradient_policy.RANKINGS:
      at = f'data={name},layer=1,ranking={ranking}'
      assert 0 <= got[f'top1@{at}'] <= got[f'top128@{at}'] <= 1
      assert 0 <= got[f'mean_rank@{at}'] <= got[f'max_rank@{at}']
      assert got[f'max_rank@{at}'] < model.vocab_size


def test_rank_keys_of_the_proposal_studies():
  out = {}
  got = proposals.add_rank_keys(
    out, [0, 3, 200], data='enron', layer=10, ranking='order'
  )
  assert got.tolist() == [0, 3, 200]
  assert out == {
    'top1@data=enron,layer=10,ranking=order': 1 / 3,
    'top128@data=enron,layer=10,ranking=order': 2 / 3,
    'mean_rank@data=enron,layer=10,ranking=order': 203 / 3,
    'max_rank@data=enron,layer=10,ranking=order': 200,
  }
  # The keys the committed studies wrote (gradient_policy and proposals).
  for study in ('gradient_policy', 'proposals'):
    summary = json.loads(
      (ROOT / f'reports/inversion_exact/{study}/summary.json').read_text()
    )
    assert set(out) <= set(summary), study
