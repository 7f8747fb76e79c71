"""Tests of the GBoard next-word-prediction attack (leakjax.attacks.gboard)."""

import dataclasses
import functools
import json
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import common
from leakjax import fl, sharding
from leakjax._jit import jitted
from leakjax.attacks import gboard
from leakjax.attacks.gboard import (
  clients,
  corpora,
  mixture,
  runner,
  sweep,
  thresholds,
)
from leakjax.errors import LeakjaxError
from leakjax.models import lstm

TINY = lstm.CIFGConfig(vocab_size=64, embed_dim=8, units=10, proj_dim=8)
ETA = 1e-3


@functools.partial(jax.jit, static_argnames=('model', 'config'))
def _update(model, params, ids, config, key) -> fl.ClientResult:
  """One jitted client update for every test (compiled once per shape,
  model and config; new params reuse it)."""
  return fl.client_update(model, params, ids, None, config, key=key)


@functools.partial(jax.jit, static_argnames=('model',))
def _logits(model, params, ids):
  return model.logits(params, ids)


# Many full-batch steps with a large η: θ1 memorises 3 sentences.
MEMORISE = gboard.client_config(100, None, learning_rate=0.5)


@functools.cache
def _model(scale: float | None = None):
  """`(model, params)` of the tiny CIFG-LSTM."""
  model, params = lstm.init_model(TINY, key=jax.random.key(0))
  if scale is None:
    return model, params
  # O(1) random weights: a peaked, non-uniform next-word distribution.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  leaves = [scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  return model, jax.tree.unflatten(tree, leaves)


def _sentences(n: int, length: int = 4, seed: int = 0) -> np.ndarray:
  """`n` random sentences `<S> w1..wL` of word ids >= 2, int32 [n, L+1]."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(2, TINY.vocab_size, (n, length + 1)).astype(np.int32)
  ids[:, 0] = 1
  return ids


# ----------------------------------------------------------- word recovery
@pytest.mark.slow
def test_fedsgd_word_recovery_is_exact():
  model, params = _model()
  ids = _sentences(4)
  config = gboard.client_config(
    1, None, learning_rate=ETA, words_per_sentence=4
  )
  result = _update(model, params, jnp.asarray(ids), config, jax.random.key(0))
  delta = gboard.bias_update(model, params, result.params)
  # Sec. 3.1: the bias step is η Σ_t (y_t - p_t) per sentence, batch mean.
  probs = jax.nn.softmax(model.logits(params, jnp.asarray(ids))[:, :-1])
  onehot = jax.nn.one_hot(ids[:, 1:], TINY.vocab_size)
  expected = ETA * (onehot - probs).sum(1).mean(0)
  np.testing.assert_allclose(delta, expected, atol=1e-9, rtol=1e-5)
  cand = gboard.candidate_mask(TINY.vocab_size)
  for rule in gboard.THRESHOLD_RULES:
    thr = gboard.choose_threshold(delta, rule, candidates=cand)
    words = np.flatnonzero(gboard.recover_words(delta, thr, cand))
    assert set(words) == set(ids[:, 1:].ravel()), rule


def test_recover_words_under_jit_matches_eager():
  delta = jnp.asarray(np.random.default_rng(0).normal(size=200), jnp.float32)
  cand = gboard.candidate_mask(200)
  f = lambda d: gboard.recover_words(
    d, gboard.choose_threshold(d, 'fdr', candidates=cand), cand
  )
  np.testing.assert_array_equal(f(delta), jax.jit(f)(delta))


def _noisy_update(num_words=5000, num_typed=100, snr=6.0, seed=0):
  rng = np.random.default_rng(seed)
  sigma = 1e-3
  delta = rng.normal(0, sigma, num_words)
  delta -= np.abs(rng.normal(0, 0.2 * sigma, num_words))  # untyped drift
  typed = rng.choice(np.arange(2, num_words), num_typed, replace=False)
  delta[typed] = snr * sigma + rng.uniform(0, 3 * sigma, num_typed)
  return jnp.asarray(delta, jnp.float32), set(typed.tolist()), sigma


def test_noise_scale_and_threshold_rules():
  delta, typed, sigma = _noisy_update()
  cand = gboard.candidate_mask(delta.shape[0])
  center, scale = thresholds.robust_noise_scale(delta, cand)
  assert abs(float(scale) / sigma - 1.0) < 0.1
  assert abs(float(center)) < 0.3 * sigma
  # Algorithm 2 (cut 0) keeps about half of the noise.
  zero = set(np.flatnonzero(gboard.recover_words(delta, 0.0, cand)).tolist())
  assert len(zero - typed) > 1500
  for rule, max_false in (('fdr', 0.05 * len(typed) * 2), ('universal', 3)):
    thr = gboard.choose_threshold(delta, rule, candidates=cand)
    got = set(np.flatnonzero(gboard.recover_words(delta, thr, cand)).tolist())
    assert got >= typed, rule
    assert len(got - typed) <= max_false, rule
  fdr = float(gboard.choose_threshold(delta, 'fdr', candidates=cand))
  universal = float(
    gboard.choose_threshold(delta, 'universal', candidates=cand)
  )
  assert 0 < fdr <= universal  # BH adapts to many signals: a lower cut
  # The oracle threshold separates the two groups perfectly here.
  words = [str(i) for i in range(delta.shape[0])]
  thr, f1 = thresholds.oracle_threshold(
    np.asarray(delta), words, [str(i) for i in typed]
  )
  assert f1 == 1.0 and fdr <= thr + 3 * sigma


def test_max_f1_cut_trades_precision_for_recall():
  # 200 typed words 3 noise scales up among 9000 N(0, 1) entries: the FDR
  # cut (precision ~0.95) drops about half of them; the estimated-F1 cut
  # keeps more and scores a higher F1.
  rng = np.random.default_rng(7)
  num, typed = 9000, np.arange(200)
  z = rng.normal(size=num)
  z[typed] += 3.0
  truth = np.zeros(num, bool)
  truth[typed] = True

  def f1(mask):
    tp = (mask & truth).sum()
    return 2 * tp / (mask.sum() + truth.sum())

  z = jnp.asarray(z, jnp.float32)
  cut = float(thresholds.max_f1_cut(z))
  fdr = float(gboard.choose_threshold(z, 'fdr'))
  assert 0 < cut < fdr
  assert f1(np.asarray(z) > cut) > f1(np.asarray(z) > fdr) + 0.05
  assert float(jax.jit(thresholds.max_f1_cut)(z)) == pytest.approx(cut)
  # The former bias rule 'maxf1' left the library (studies/gboard/
  # noise_detectors/maxf1_rule.py keeps it for comparison).
  with pytest.raises(LeakjaxError):
    gboard.choose_threshold(z, 'maxf1')
  # Only eligible entries count; with none eligible nothing is kept.
  assert math.isinf(
    float(thresholds.max_f1_cut(z, eligible=jnp.zeros(num, bool)))
  )
  # Pure noise: (almost) nothing passes (slack: 3 null std; 0 gives
  # hundreds here).
  noise = jnp.asarray(rng.normal(size=num), jnp.float32)
  assert int((noise > thresholds.max_f1_cut(noise)).sum()) <= 10


def test_threshold_without_noise_stays_near_zero():
  # Noise-free: untyped words drift down by η Σ p (tiny), typed go up.
  rng = np.random.default_rng(1)
  delta = -np.abs(rng.normal(0, 1e-8, 3000))
  delta[10:40] = rng.uniform(1e-6, 1e-4, 30)
  delta = jnp.asarray(delta, jnp.float32)
  for rule in gboard.THRESHOLD_RULES:
    got = np.flatnonzero(
      gboard.recover_words(delta, gboard.choose_threshold(delta, rule))
    )
    np.testing.assert_array_equal(got, np.arange(10, 40))


def test_no_signal_recovers_nothing_with_fdr():
  delta = jnp.asarray(np.random.default_rng(2).normal(0, 1, 9502), jnp.float32)
  thr = gboard.choose_threshold(delta, 'fdr')
  assert int(gboard.recover_words(delta, thr).sum()) <= 2


def test_row_scores_find_rows_with_signal():
  rng = np.random.default_rng(3)
  rows = rng.normal(0, 1.0, (2000, 16))
  rows[:20] += 3.0  # typed rows
  z = np.asarray(thresholds.row_update_scores(jnp.asarray(rows, jnp.float32)))
  assert np.all(z[:20] > 8) and np.mean(z[20:] > 4) < 0.01
  assert abs(np.median(z[20:])) < 0.3  # ~N(0, 1) under the null


def _drift_update(seed=0):
  """A noise-free-like update: frequent untyped words drift down along one
  row direction ĥ; typed words rise; one typed word fell, its row differs."""
  rng = np.random.default_rng(seed)
  num, dim = 3000, 8
  hbar = rng.normal(size=dim)
  delta = -np.abs(rng.normal(0, 1e-9, num))  # rare untyped words
  frequent = np.arange(2, 202)
  delta[frequent] = -rng.uniform(1e-5, 1e-3, len(frequent))
  rows = delta[:, None] * (hbar[None] + 0.05 * rng.normal(size=(num, dim)))
  typed = np.arange(500, 530)
  delta[typed] = rng.uniform(1e-5, 1e-3, len(typed))
  rows[typed] = rng.normal(size=(len(typed), dim)) * 1e-3
  hidden = 7  # typed, yet its bias fell: Algorithm 2 misses it
  rows[hidden] += 3e-4 * np.linalg.norm(hbar) * rng.normal(size=dim)
  return (
    jnp.asarray(delta, jnp.float32),
    jnp.asarray(rows, jnp.float32),
    set(typed.tolist()) | {hidden},
    hidden,
  )


@pytest.mark.slow
def test_rescue_and_auto_without_noise():
  delta, rows, typed, hidden = _drift_update()
  cand = gboard.candidate_mask(delta.shape[0])
  assert float(thresholds.drift_to_noise(delta, cand)) > 1000
  rescued = np.flatnonzero(thresholds.rescued_words(delta, rows, cand))
  np.testing.assert_array_equal(rescued, [hidden])
  auto = gboard.recover_words_auto(delta, rows, cand)
  assert set(np.flatnonzero(auto).tolist()) == typed
  f = jax.jit(gboard.recover_words_auto)
  np.testing.assert_array_equal(f(delta, rows, cand), auto)


@functools.cache
def _peaked_update(typed_count: int):
  """FedSGD (η = 0.001) on a peaked random CIFG-LSTM, V = 2000.

  16 random sentences; the word the model predicts most often
  (`Σ_t p_tk ≈ 11` over the 64 targets) ends the first `typed_count`
  sentences. Returns `(delta, rows, rows0, bias0, typed ids, that word)`.
  """
  cfg = lstm.CIFGConfig(vocab_size=2000, embed_dim=8, units=10, proj_dim=8)
  model, params = lstm.init_model(cfg, key=jax.random.key(0))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  params = jax.tree.unflatten(
    tree, [jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
  )
  rng = np.random.default_rng(0)
  ids = rng.integers(2, cfg.vocab_size, (16, 5)).astype(np.int32)
  ids[:, 0] = 1
  probs = jax.nn.softmax(model.logits(params, jnp.asarray(ids))[:, :-1])
  word = int(jnp.argmax(probs.sum((0, 1))))
  ids = ids[np.all(ids[:, 1:] != word, axis=1)][:16]
  ids[:typed_count, -1] = word  # the last word: a target, never an input
  config = gboard.client_config(
    1, None, learning_rate=ETA, words_per_sentence=4
  )
  params1 = _update(
    model, params, jnp.asarray(ids), config, jax.random.key(0)
  ).params
  return (
    gboard.bias_update(model, params, params1),
    gboard.output_rows_update(model, params, params1),
    gboard.output_rows(model, params),
    gboard.output_bias(model, params),
    set(ids[:, 1:].ravel().tolist()),
    word,
  )


@pytest.mark.slow
def test_convexity_finds_typed_word_whose_bias_fell():
  delta, rows, rows0, bias0, typed, word = _peaked_update(8)
  cand = gboard.candidate_mask(delta.shape[0])
  # Typed 8 times but predicted ~11 times: the bias fell, Algorithm 2 and
  # the bias rule miss it.
  assert float(delta[word]) < 0
  bias_rule = gboard.recover_words(
    delta, gboard.choose_threshold(delta, 'fdr', candidates=cand), cand
  )
  assert set(np.flatnonzero(bias_rule).tolist()) == typed - {word}
  flagged = thresholds.convexity_violations(delta, rows, rows0, bias0, cand)
  np.testing.assert_array_equal(np.flatnonzero(flagged), [word])
  jitted = jax.jit(thresholds.convexity_violations)(
    delta, rows, rows0, bias0, cand
  )
  np.testing.assert_array_equal(jitted, flagged)
  auto = gboard.recover_words_auto(delta, rows, cand, rows0=rows0, bias0=bias0)
  assert set(np.flatnonzero(auto).tolist()) == typed
  with pytest.raises(LeakjaxError):
    gboard.recover_words_auto(delta, rows, cand, rows0=rows0)


@pytest.mark.slow
def test_convexity_flags_nothing_untyped():
  # The same data without that word: every fallen bias is an untyped
  # word's, all on one convex function, so nothing is flagged.
  delta, rows, rows0, bias0, typed, word = _peaked_update(0)
  assert word not in typed
  cand = gboard.candidate_mask(delta.shape[0])
  assert not thresholds.convexity_violations(
    delta, rows, rows0, bias0, cand
  ).any()
  # Pure noise: no word's bias fell by 10 noise scales.
  noise = jax.random.normal(jax.random.key(1), delta.shape) * 1e-3
  noise_rows = jax.random.normal(jax.random.key(2), rows.shape) * 1e-3
  assert not thresholds.convexity_violations(
    noise, noise_rows, rows0, bias0, cand
  ).any()


@pytest.mark.slow
def test_auto_uses_rows_under_noise():
  # Local DP noise: each typed word's bias is only ~2.5 noise scales up,
  # but its D = 16 row entries are too; bias + rows finds what bias misses.
  rng = np.random.default_rng(4)
  num, dim, sigma = 4000, 16, 1e-3
  delta = rng.normal(0, sigma, num)
  rows = rng.normal(0, sigma, (num, dim))
  typed = np.arange(100, 160)
  delta[typed] += 2.5 * sigma
  rows[typed] += 2.5 * sigma * rng.choice([-1, 1], (len(typed), dim))
  delta, rows = jnp.asarray(delta), jnp.asarray(rows)
  cand = gboard.candidate_mask(num)
  assert float(thresholds.drift_to_noise(delta, cand)) < 6
  bias_only = gboard.recover_words(
    delta, gboard.choose_threshold(delta, 'fdr', candidates=cand), cand
  )
  auto = np.asarray(gboard.recover_words_auto(delta, rows, cand))
  hits = auto[typed].sum()
  assert hits >= 0.8 * len(typed) > int(bias_only[typed].sum())
  assert auto.sum() - hits <= 0.1 * auto.sum()


def _low_rank_noisy_update(seed=0):
  """Local-DP-like update whose typed rows share two directions.

  4000 words, D = 16, unit noise on every entry; 150 typed words rise by
  ~0.7 in the bias and 3-8 along a 2-d subspace (the hidden states that
  predicted them); 100 frequent untyped words drift down along -(1, ĥ)
  by 2-6 noise scales, as the LSTM's do.
  """
  rng = np.random.default_rng(seed)
  num, dim = 4000, 16
  delta = rng.normal(size=num)
  rows = rng.normal(size=(num, dim))
  basis = np.linalg.qr(rng.normal(size=(dim, 2)))[0].T  # [2, D]
  typed = np.arange(200, 350)
  amp = rng.uniform(3, 8, len(typed))
  mix = np.abs(rng.normal(size=(len(typed), 2))) + 0.3
  mix /= np.linalg.norm(mix, axis=1, keepdims=True)
  delta[typed] += 0.7
  rows[typed] += amp[:, None] * (mix @ basis)
  frequent = np.arange(2, 102)
  drift = rng.uniform(2, 6, len(frequent))
  hbar = basis.sum(0) / np.sqrt(2.0)
  delta[frequent] -= 0.3 * drift
  rows[frequent] -= drift[:, None] * hbar
  scale = 1e-3
  return (
    jnp.asarray(delta * scale, jnp.float32),
    jnp.asarray(rows * scale, jnp.float32),
    set(typed.tolist()),
    set(frequent.tolist()),
  )


def _f1(found: set, typed: set) -> float:
  tp = len(found & typed)
  return 2 * tp / (len(found) + len(typed))


@pytest.mark.slow
def test_mixture_finds_low_rank_signal_and_skips_drift():
  delta, rows, typed, frequent = _low_rank_noisy_update()
  cand = gboard.candidate_mask(delta.shape[0])
  log_odds, post = mixture.mixture_word_posterior(delta, rows, cand)
  assert not np.isfinite(np.asarray(log_odds)[:2]).any()  # non-candidates
  assert float(post.sum()) == pytest.approx(len(typed), rel=0.15)
  auto = set(
    np.flatnonzero(gboard.recover_words_auto(delta, rows, cand)).tolist()
  )
  assert _f1(auto, typed) >= 0.9
  assert len(auto & frequent) <= 5
  # The bias + all-entries chi-square it replaced does clearly worse.
  z = (
    (delta - jnp.median(delta)) / thresholds.robust_noise_scale(delta, cand)[1]
    + thresholds.row_update_scores(rows, cand)
  ) / math.sqrt(2.0)
  z = jnp.where(cand, z, -jnp.inf)
  old = z > thresholds.max_f1_cut(z, cand, delta > 0)
  old = set(np.flatnonzero(old & (delta > 0)).tolist())
  assert _f1(old, typed) < _f1(auto, typed) - 0.1
  jitted = jax.jit(mixture.mixture_word_posterior)(delta, rows, cand)
  np.testing.assert_allclose(jitted[1], post, atol=1e-4)


@pytest.mark.slow
def test_mixture_sees_no_signal_in_pure_noise():
  rng = np.random.default_rng(7)
  delta = jnp.asarray(rng.normal(0, 1e-3, 9502), jnp.float32)
  rows = jnp.asarray(rng.normal(0, 1e-3, (9502, 96)), jnp.float32)
  cand = gboard.candidate_mask(9502)
  log_odds, post = mixture.mixture_word_posterior(delta, rows, cand)
  assert float(post.sum()) == 0.0
  assert math.isinf(float(mixture.expected_f1_cut(log_odds, post)))
  # recover_words_auto falls back to the chi-square rule: ~nothing.
  assert int(gboard.recover_words_auto(delta, rows, cand).sum()) <= 5


def test_expected_f1_cut():
  scores = jnp.asarray([5.0, 4.0, 3.0, 2.0, 1.0, -jnp.inf])
  post = jnp.asarray([1.0, 1.0, 0.9, 0.1, 0.0, 0.0])
  cut = float(mixture.expected_f1_cut(scores, post))
  # Top 3: 2 * 2.9 / (3 + 3) = 0.967 beats top 2 (0.8) and top 4 (0.857).
  assert 2.0 < cut < 3.0


def test_bad_rule_raises():
  with pytest.raises(LeakjaxError):
    gboard.choose_threshold(jnp.zeros(4), 'magic')
  with pytest.raises(LeakjaxError):
    gboard.select_sentences(
      np.zeros((1, 3), int), np.zeros(1), np.ones(3, bool), rule='magic'
    )


# ----------------------------------------------------------- reconstruction
def _reference(model, params0, params1, start, allowed, length, bos):
  """Per-word Python loop: Sec. 3.2 greedy generation and its score."""
  logits_fn = functools.partial(_logits, model)
  ids = [bos, int(start)]
  for _ in range(length - 1):
    logits = logits_fn(params1, jnp.asarray([ids], jnp.int32))[0, -1]
    probs = jax.nn.softmax(logits) * allowed
    probs = probs / probs.sum()  # renormalised over the recovered words
    ids.append(int(jnp.argmax(probs)))

  def log_ppl(params):
    logp = jax.nn.log_softmax(logits_fn(params, jnp.asarray([ids]))[0])
    return -float(sum(logp[i - 1, ids[i]] for i in range(1, len(ids))))

  pp0, pp1 = log_ppl(params0), log_ppl(params1)
  return ids, (pp0 - pp1) / pp0


@pytest.mark.slow
@pytest.mark.parametrize('jit', [False, True])
def test_batched_reconstruction_matches_reference(jit):
  model, params0 = _model(scale=0.7)
  ids = _sentences(3, seed=4)
  result = _update(
    model, params0, jnp.asarray(ids), MEMORISE, jax.random.key(1)
  )
  params1 = result.params
  allowed = np.zeros(TINY.vocab_size, bool)
  allowed[np.unique(ids[:, 1:])] = True
  starts, valid = gboard.padded_indices(allowed, size=16)
  fn = lambda p0, p1, s, v, a: gboard.reconstruct_sentences(
    model, p0, p1, s, v, a, length=4, bos_id=1
  )
  if jit:
    fn = jax.jit(fn)
  out = fn(
    params0,
    params1,
    jnp.asarray(starts),
    jnp.asarray(valid),
    jnp.asarray(allowed),
  )
  assert out.tokens.shape == (16, 5)
  for i in np.flatnonzero(valid):
    tokens, score = _reference(
      model, params0, params1, starts[i], jnp.asarray(allowed), 4, 1
    )
    np.testing.assert_array_equal(np.asarray(out.tokens[i]), tokens)
    np.testing.assert_allclose(
      float(out.scores[i]), score, rtol=1e-4, atol=1e-6
    )
    assert set(tokens[2:]) <= set(np.flatnonzero(allowed))
  assert np.all(np.isneginf(np.asarray(out.scores)[~valid]))


@pytest.mark.slow
@pytest.mark.skipif(
  jax.device_count() < 2,
  reason='needs >= 2 devices (tests/conftest.py fakes 8)',
)
@pytest.mark.parametrize('spec', ['data:-1', 'data:3'])
def test_reconstruction_on_a_mesh_matches_one_device(spec):
  model, params0 = _model(scale=0.7)
  ids = _sentences(3, seed=4)
  params1 = _update(
    model, params0, jnp.asarray(ids), MEMORISE, jax.random.key(1)
  ).params
  words = np.zeros(TINY.vocab_size, bool)
  words[np.unique(ids[:, 1:])] = True  # 11 words: 16 slots, 18 on 3
  kw = dict(length=4, bos_id=1)
  one = sweep.reconstruct_candidates(model, params0, params1, words, **kw)
  mesh = sharding.data_mesh(spec)
  many = sweep.reconstruct_candidates(
    model, params0, params1, words, mesh=mesh, **kw
  )
  n = mesh.shape['data']
  assert n >= 2 and many.tokens.shape[0] % n == 0
  assert len(many.tokens.sharding.device_set) == n
  m = one.tokens.shape[0]
  np.testing.assert_array_equal(many.tokens[:m], one.tokens)
  np.testing.assert_allclose(many.scores[:m], one.scores, rtol=1e-5)
  assert np.isneginf(np.asarray(many.scores[m:])).all()  # padding
  assert np.isfinite(np.asarray(one.scores)).sum() == words.sum()
  assert sharding.data_mesh(None) is None  # absent flag: no sharding
  with pytest.raises(LeakjaxError):
    sharding.data_mesh('model:2')


@pytest.mark.slow
def test_reconstruction_recovers_memorised_sentences():
  # θ1 trained hard on 3 sentences with distinct words: greedy decoding from
  # each first word gives back the sentence, and those rank first.
  model, params0 = _model(scale=0.5)
  ids = np.array(
    [[1, 2, 3, 4, 5], [1, 6, 7, 8, 9], [1, 10, 11, 12, 13]], np.int32
  )
  result = _update(
    model, params0, jnp.asarray(ids), MEMORISE, jax.random.key(2)
  )
  delta = gboard.bias_update(model, params0, result.params)
  words = np.asarray(
    gboard.recover_words(delta, 0.0, gboard.candidate_mask(64))
  )
  np.testing.assert_array_equal(np.flatnonzero(words), np.arange(2, 14))
  starts, valid = gboard.padded_indices(words)
  out = gboard.reconstruct_sentences(
    model,
    params0,
    result.params,
    jnp.asarray(starts),
    jnp.asarray(valid),
    jnp.asarray(words),
    length=4,
    bos_id=1,
  )
  tokens = np.asarray(out.tokens)
  for row in ids:
    np.testing.assert_array_equal(tokens[list(starts).index(row[1])], row)
  kept = gboard.select_sentences(
    tokens, np.asarray(out.scores), words, rule='cover'
  )
  assert sorted(tokens[kept, 1].tolist()) == [2, 6, 10]


def test_reconstruction_compiles_once_per_model_and_shape():
  # The model holds no weights and compares by value: new parameters and
  # an equal model built again reuse the compiled kernel.
  model, params0 = _model(scale=0.5)
  params1 = jax.tree.map(lambda x: 1.01 * x, params0)
  again = lstm.make_model(TINY)
  assert again == model and hash(again) == hash(model)
  allowed = np.zeros(TINY.vocab_size, bool)
  allowed[2:9] = True
  starts, valid = gboard.padded_indices(allowed, size=8)
  args = (jnp.asarray(starts), jnp.asarray(valid), jnp.asarray(allowed))
  kw = dict(length=3, bos_id=1)
  # Jitted as the sweep jits it (one wrapper per process).
  reconstruct = jitted(
    gboard.reconstruct_sentences, static_argnames=('model', 'length', 'bos_id')
  )
  first = reconstruct(model, params0, params1, *args, **kw)
  size = reconstruct._cache_size()
  reconstruct(model, params1, params0, *args, **kw)
  same = reconstruct(again, params0, params1, *args, **kw)
  assert reconstruct._cache_size() == size
  np.testing.assert_array_equal(same.tokens, first.tokens)
  np.testing.assert_array_equal(same.scores, first.scores)


def test_snapshot_round_trip(tmp_path):
  model, params = _model(scale=0.5)
  path = tmp_path / 'theta1.safetensors'
  gboard.save_snapshot(path, params)
  loaded = gboard.load_snapshot(path, params)
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)
  with pytest.raises(LeakjaxError):
    gboard.load_snapshot(path, {'only': jnp.zeros(3)})


def test_scale_update_is_a_longer_fedsgd_step():
  # FedSGD: θ1 = θ0 - η g, so θ1 + s (θ1 - θ0) = θ0 - η (1 + s) g.
  rng = np.random.default_rng(0)
  theta0 = {'a': rng.normal(size=(3, 2)), 'b': {'c': rng.normal(size=4)}}
  grad = jax.tree.map(lambda x: rng.normal(size=x.shape), theta0)
  theta1 = jax.tree.map(lambda t, g: t - ETA * g, theta0, grad)
  scaled = gboard.scale_update(theta0, theta1, 10.0)
  expected = jax.tree.map(lambda t, g: t - 11 * ETA * g, theta0, grad)
  for a, b in zip(jax.tree.leaves(scaled), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_client_config_emulates_sentence_sum_loss():
  config = gboard.client_config(
    3,
    8,
    learning_rate=1e-3,
    words_per_sentence=4,
    step_noise=0.1,
    update_noise=0.01,
  )
  assert config.learning_rate == pytest.approx(4e-3)
  # Algorithm 3's η N(0, σ): (η T) (σ / T) = η σ.
  assert config.learning_rate * config.defense.step_noise_std == pytest.approx(
    1e-3 * 0.1
  )
  assert config.defense.update_noise_std == 0.01


@pytest.mark.slow
@pytest.mark.parametrize('batch', ['full', '4'])
def test_batch_sum_loss_is_sentence_sum_with_eta_times_batch(batch):
  (model, params0), ids = _model(), _sentences(8)
  per_batch = 8 if batch == 'full' else 4

  def theta1(loss, eta):
    cfg = types.SimpleNamespace(loss=loss, learning_rate=eta)
    ((_, params),) = clients.trajectory(
      model,
      params0,
      ids,
      cfg,
      batch=batch,
      step_noise=0.0,
      epochs=(2,),
      key=jax.random.key(0),
    )
    return params

  summed = theta1('batch_sum', ETA)
  expected = theta1('sentence_sum', ETA * per_batch)
  moved = theta1('sentence_sum', ETA)
  for a, b in zip(jax.tree.leaves(summed), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert not all(
    np.allclose(a, c)
    for a, c in zip(jax.tree.leaves(summed), jax.tree.leaves(moved))
  )


# ------------------------------------------------------------------ keeping
def test_select_sentences_rules():
  # Candidates (best first): two true sentences, then junk reusing words.
  tokens = np.array(
    [
      [1, 2, 3, 4, 5],
      [1, 6, 7, 8, 9],
      [1, 3, 3, 3, 3],
      [1, 10, 2, 2, 2],
      [1, 4, 4, 4, 4],
    ]
  )
  scores = np.array([0.9, 0.8, 0.1, 0.05, 0.11])
  recovered = np.zeros(12, bool)
  recovered[2:11] = True  # words 2..10
  cover = gboard.select_sentences(tokens, scores, recovered, rule='cover')
  np.testing.assert_array_equal(cover, [0, 1, 3])  # 4, 2 add no new word
  words = gboard.select_sentences(tokens, scores, recovered, rule='words')
  np.testing.assert_array_equal(words, [0, 1, 4])  # ceil(9 / 4) = 3
  gap = gboard.select_sentences(tokens, scores, recovered, rule='gap')
  np.testing.assert_array_equal(gap, [0, 1])
  scores[4] = -np.inf  # padding is never kept
  assert 4 not in gboard.select_sentences(
    tokens, scores, recovered, rule='words'
  )


def test_padded_indices():
  idx, valid = gboard.padded_indices(np.array([0, 1, 0, 1, 1], bool))
  np.testing.assert_array_equal(idx, [1, 3, 4, 0])
  np.testing.assert_array_equal(valid, [True, True, True, False])
  with pytest.raises(LeakjaxError):
    gboard.padded_indices(np.ones(5, bool), size=2)


# ------------------------------------------------------------ experiment
def _write_corpora(tmp_path):
  """Synthetic SMS file and public text; ~300 words, Zipf-like frequencies."""
  rng = np.random.default_rng(0)
  words = np.array([f'w{i}' for i in range(300)])
  freq = 1.0 / np.arange(1, 301)
  freq /= freq.sum()
  draw = lambda n: list(rng.choice(words, n, p=freq))

  def sentence(n):
    w = draw(n)
    return ' '.join([w[0].capitalize()] + w[1:]) + '.'

  lines = ['Label\tSMS']
  for _ in range(300):
    text = ' '.join(
      sentence(int(rng.choice([3, 4, 4, 5]))) for _ in range(rng.integers(1, 3))
    )
    lines.append(f'{"spam" if rng.random() < 0.1 else "ham"}\t{text}')
  sms = tmp_path / 'sms.tsv'
  sms.write_text('\n'.join(lines) + '\n')
  public = tmp_path / 'public.txt'
  public.write_text('\n'.join(sentence(8) for _ in range(300)) + '\n')
  return sms, public


@pytest.mark.slow
def test_experiment_smoke(tmp_path):
  from experiments import gboard as experiment  # noqa: PLC0415

  sms, public = _write_corpora(tmp_path)
  cfg = gboard.GboardConfig(
    sms=str(sms),
    public=(('extra', str(public)),),
    public_limit=100,
    vocab_size=200,
    embed_dim=8,
    units=12,
    pretrain_steps=4,
    pretrain_batch_size=16,
    pretrain_lr=3e-3,
    pretrain_max_length=8,
    pretrain_eval=40,
    sentence_length=4,
    client_pool=24,
    num_sentences=(16,),
    num_datasets=1,
    epochs=(1, 2),
    batch_sizes=('full', '16'),
    max_sentence_epochs=10_000,
    learning_rate=1e-3,
    loss='sentence_sum',
    dpsgd_sigmas=(0.1,),
    dpsgd_runs=((16, '8', 1000),),
    single_sigmas=(1e-3,),
    scales=(0.0, 10.0),
    threshold_rule='auto',
    fdr_q=0.05,
    keep_rule='cover',
    seed=0,
  )
  workdir = tmp_path / 'run'
  summary = experiment.run_experiment(cfg, workdir)
  for name in (
    'config.json',
    'results.jsonl',
    'summary.json',
    'summary.md',
    'fig2_word_recovery.png',
    'fig3_sentence_reconstruction.png',
    'fig5_dpsgd_threshold.png',
    'fig6_local_dp_words.png',
  ):
    assert (workdir / name).is_file(), name
  assert json.loads((workdir / 'summary.json').read_text()) == summary
  key = 'B=full,E=1,n_k=16,noise=none,sigma=0.0'
  # Noise-free FedSGD on a barely trained model: Algorithm 2 and the bias
  # rule are exact; the auto rule (bias + rows) is at least close.
  assert summary[f'zero_f1@{key}'] == pytest.approx(summary[f'f1_upper@{key}'])
  assert summary[f'fdr_f1@{key}'] == pytest.approx(summary[f'f1_upper@{key}'])
  assert summary[f'f1@{key}'] >= 0.9 * summary[f'f1_upper@{key}']
  assert 0 < summary[f'f1_upper@{key}'] <= 1
  assert 0 <= summary[f'levenshtein@{key}'] <= 100
  assert f'levenshtein@{key.replace("sigma", "scale=10.0,sigma")}' in summary
  for k in (
    'f1@B=8,E=2,n_k=16,noise=dpsgd,sigma=0.1',
    'f1@B=full,E=2,n_k=16,noise=single,sigma=0.001',
    # n_k <= B is full-batch training, run once, reported under both.
    'levenshtein@B=16,E=2,n_k=16,noise=none,sigma=0.0',
  ):
    assert k in summary and math.isfinite(summary[k]), k
  rows = [
    json.loads(x) for x in (workdir / 'results.jsonl').read_text().splitlines()
  ]
  assert {(r['B'], r['noise']) for r in rows} == {
    ('full', 'none'),
    ('full', 'single'),
    ('8', 'dpsgd'),
  }
  # The oracle cut of the combined score beats its FDR cut (same score).
  for r in rows:
    assert r['stouffer_f1'] <= r['stouffer_oracle_f1'] + 1e-12 <= 1 + 1e-12
  # Client sentences never reach pre-training.
  texts = corpora.load_corpora(cfg)
  pool = set(texts.pool)
  split = corpora.sentence_words
  assert not any(
    split(s) in pool for s in texts.public_train + texts.public_eval
  )
  # config.json gives back the config (reports read runs this way).
  assert runner.load_config(workdir) == cfg
  # A re-run resumes: nothing is recomputed, the summary is the same.
  again = experiment.run_experiment(cfg, workdir)
  assert again == summary


def test_heldout_pool_avoids_the_first_seeds_pool(tmp_path):
  from leakjax import data as data_lib  # noqa: PLC0415

  sms, public = _write_corpora(tmp_path)
  base = gboard.GboardConfig(
    sms=str(sms),
    public=(('extra', str(public)),),
    public_limit=100,
    client_pool=24,
    num_sentences=(16,),
  )
  four = sorted(
    {
      corpora.sentence_words(x)
      for m in data_lib.load_corpus(sms, label=('Label', 'ham'))
      for x in data_lib.split_sentences(m)
    }
    - {()}
  )
  four = [w for w in four if len(w) == 4]
  # Without the option the pool is the seed's first 24 of a permutation of
  # the distinct 4-word sentences, as every committed run drew it.
  first = corpora.load_corpora(base).pool
  order = np.random.default_rng([0, 1]).permutation(len(four))
  assert first == [four[i] for i in order[:24]]
  held = corpora.load_corpora(
    dataclasses.replace(base, seed=1, heldout_from_seed=0)
  )
  assert len(held.pool) == 24 and not set(held.pool) & set(first)
  plain = set(corpora.load_corpora(dataclasses.replace(base, seed=1)).pool)
  assert plain & set(first)  # without the option, seed 1 reuses some
  # A first pool of every distinct sentence leaves none for the second.
  with pytest.raises(LeakjaxError, match='0 distinct client sentences remain'):
    corpora.load_corpora(
      dataclasses.replace(
        base, client_pool=len(four), seed=1, heldout_from_seed=0
      )
    )


# ------------------------------------------------------------------ runner
def test_plan_trajectories():
  cfg = gboard.GboardConfig(
    num_sentences=(16, 64),
    epochs=(50, 1, 1000, 50),  # sorted, each once
    batch_sizes=('full', '16', '32'),
    max_sentence_epochs=64 * 50,
    dpsgd_sigmas=(0.01, 0.1),
    dpsgd_runs=((16, 'full', 10**9), (64, '32', 20)),
  )
  assert cfg.epochs == (1, 50, 1000)

  def ds(n_k):
    return clients.Dataset(n_k, 0, [], np.zeros((n_k, 5), np.int32), set())

  # n_k=16: B=16 and B=32 are full-batch training (run once, as B=full);
  # E=1000 is over the budget (16 * 1000 > 3200).
  assert clients.plan_trajectories(cfg, ds(16)) == [
    ('full', 'none', 0.0, [1, 50]),
    ('full', 'dpsgd', 0.01, [1, 50]),
    ('full', 'dpsgd', 0.1, [1, 50]),
  ]
  # n_k=64: E=50 is exactly the budget; the DPSGD run stops at E=20 (only
  # E=1 left); B=16 and B=32 are real mini-batches.
  assert clients.plan_trajectories(cfg, ds(64)) == [
    ('full', 'none', 0.0, [1, 50]),
    ('16', 'none', 0.0, [1, 50]),
    ('32', 'none', 0.0, [1, 50]),
    ('32', 'dpsgd', 0.01, [1]),
    ('32', 'dpsgd', 0.1, [1]),
  ]


def test_parse_flag_values():
  assert runner.parse_public(' a=x.txt, b=dir/y=z.json,') == (
    ('a', 'x.txt'),
    ('b', 'dir/y=z.json'),
  )
  assert runner.parse_dpsgd_runs(['16:full', '64:32:100']) == (
    (16, 'full', 10**9),
    (64, '32', 100),
  )
  with pytest.raises(LeakjaxError):
    runner.parse_public('a.txt')
  with pytest.raises(LeakjaxError):
    runner.parse_dpsgd_runs(['16'])
  for bad in (
    dict(loss='mean'),
    dict(threshold_rule='maxf1'),
    dict(keep_rule='all'),
    dict(batch_sizes=('full', '0')),
    dict(epochs=(0, 1)),
    dict(num_sentences=(500,)),
  ):
    with pytest.raises(LeakjaxError):
      gboard.GboardConfig(**bad)


def test_sentence_words():
  assert corpora.sentence_words('Ok lar... Joking wif u oni!') == (
    'ok',
    'lar',
    'joking',
    'wif',
    'u',
    'oni',
  )


# ------------------------------------------------------------------- flags


NOT_CONFIG = {'workdir', 'mesh', 'data', *common.RUN_FLAGS}


def test_flags_are_exactly_the_config_fields(fresh_flags):
  import dataclasses  # noqa: PLC0415

  from experiments import gboard as experiment  # noqa: PLC0415

  experiment.define_flags()
  fields = {f.name for f in dataclasses.fields(gboard.GboardConfig)}
  assert set(fresh_flags) - NOT_CONFIG == fields
  fresh_flags(['prog'])
  # Every flag's default is the field's default.
  assert experiment.config_from_flags() == gboard.GboardConfig()
  # --data names the clients' private corpus, as --sms does.
  fresh_flags(['prog', '--data=/corpora/my_sms.tsv'])
  assert experiment.config_from_flags().sms == '/corpora/my_sms.tsv'


@pytest.mark.parametrize('name', ['gboard_quick', 'gboard_sms'])
def test_committed_flagfiles_parse(fresh_flags, name):
  import pathlib  # noqa: PLC0415

  from experiments import gboard as experiment  # noqa: PLC0415

  experiment.define_flags()
  root = pathlib.Path(__file__).resolve().parents[1]
  fresh_flags(['prog', f'--flagfile={root}/experiments/configs/{name}.flags'])
  cfg = experiment.config_from_flags()
  assert cfg.public == (
    ('wikitext', 'wikitext-2-valid'),
    ('enron', 'film-enron'),
  )
  if name == 'gboard_quick':
    assert cfg == gboard.GboardConfig(
      public_limit=4000,
      pretrain_steps=200,
      pretrain_max_length=16,
      pretrain_eval=400,
      num_sentences=(16, 64),
      epochs=(1, 50),
      max_sentence_epochs=64000,
      dpsgd_sigmas=(0.01, 0.1),
      dpsgd_runs=((16, 'full', 10**9),),
      single_sigmas=(1e-4, 1e-3),
      scales=(0.0, 100.0),
    )
  else:
    assert cfg.dpsgd_runs == (
      (16, 'full', 10**9),
      (64, '32', 100),
      (256, '32', 100),
    )
    assert cfg.epochs == (1, 50, 100, 1000) and cfg.pretrain_steps == 700


def test_paper_claims_table_reads_the_named_settings():
  from experiments import gboard_claims

  def key(metric, **p):
    return f'{metric}@' + ','.join(f'{k}={v}' for k, v in sorted(p.items()))

  free = dict(B='full', n_k=16, noise='none', sigma=0.0)
  summary = {
    key('f1', E=1, **free): 0.45,
    key('f1_upper', E=1, **free): 0.5,
    key('f1', E=50, **free): 0.5,
    key('f1_upper', E=50, **free): 0.5,
    key('levenshtein', E=50, **free): 40.0,
    key('levenshtein', E=1000, **free): 80.0,
    key('f1', B=32, E=1000, n_k=256, noise='single', sigma=0.01): 0.3,
    key('f1_upper', B=32, E=1000, n_k=256, noise='single', sigma=0.01): 0.6,
    key('zero_f1', B='full', E=50, n_k=16, noise='dpsgd', sigma=0.1): 0.07,
    key('zero_f1', B='full', E=1, n_k=16, noise='dpsgd', sigma=0.1): math.nan,
  }
  md = '\n'.join(gboard_claims.paper_claims_markdown(summary))
  rows = md.split('\n')[4:]
  assert rows[0].endswith('noise-free: 0.90-1.00 |')
  assert rows[1].endswith('E = 50 / 100 / 1000: 40 / not run / 80 |')
  assert rows[3].endswith('σ = 0.001 / 0.01 / 0.1: not run / not run / 0.07 |')
  assert rows[4].endswith('not run / not run / not run / 0.50 |')


@pytest.mark.slow
def test_spread_over_datasets_in_the_report():
  from experiments import gboard_report  # noqa: PLC0415

  def row(d, f1, lev):
    return dict(
      kind='attack',
      dataset=d,
      B='full',
      E=1,
      n_k=16,
      noise='none',
      sigma=0.0,
      f1=f1,
      f1_upper=0.5,
      recon_f1=f1,
      levenshtein=lev,
    )

  res = [
    row(0, 0.4, 60.0),
    row(1, 0.5, 80.0),
    {**row(0, 0.1, 1.0), 'scale': 10.0},
  ]
  one = gboard.GboardConfig(num_datasets=1)
  assert gboard_report._spread_markdown(one, res) == []
  lines = gboard_report._spread_markdown(
    gboard.GboardConfig(num_datasets=2), res
  )
  table = '\n'.join(lines)
  # Scaled FedSGD rows are not datasets; std with ddof=1 of (0.4, 0.5).
  assert '| none | 0 | full | 1 | 16 | 2 |' in table
  assert '0.450 ± 0.071' in table and '0.900 ± 0.141' in table
  assert '70.000 ± 14.142' in table
