"""Tests for leakjax.attacks.differential and experiments.differential."""

import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import common
from leakjax import io
from leakjax.attacks import differential as dlib
from leakjax.attacks.differential import canaries as canaries_lib
from leakjax.attacks.differential import corpus as corpus_lib
from leakjax.attacks.differential import evaluation
from leakjax.errors import LeakjaxError
from leakjax.models import LanguageModel, ParamPaths, from_functions, lstm
from leakjax.tokenization import WordTokenizer

BOS = 1
TINY = lstm.LSTMConfig(vocab_size=7, embed_dim=5, hidden_size=6, num_layers=2)


def random_model(config, seed):
  """`(model, params)` with every parameter O(1) random: scores differ a lot."""
  model, params = lstm.init_model(config, key=jax.random.key(seed))
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  leaves = [
    x + 0.8 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)
  ]
  return model, jax.tree.unflatten(tree, leaves)


@pytest.fixture(scope='module')
def pair():
  """`(model, params, params_prime)`: M and M' are snapshots of one model."""
  m, params = random_model(TINY, 0)
  mp, params_prime = random_model(TINY, 1)
  assert m == mp and hash(m) == hash(mp)  # one static argument for both
  return m, params, params_prime


def np_probs(model, params, ids):
  """Next-token probabilities of every prefix, float64 [time, vocab]."""
  logits = np.asarray(model.logits(params, jnp.asarray([ids])), np.float64)[0]
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def direct_scores(m, params, params_prime, ids, num_context):
  """Definition 3.1 for one sequence, position by position, in float64."""
  p, pp = np_probs(m, params, ids), np_probs(m, params_prime, ids)
  ds = rel = 0.0
  for i in range(num_context, len(ids)):
    a, b = p[i - 1, ids[i]], pp[i - 1, ids[i]]
    ds += b - a
    rel += (b - a) / a
  return ds, rel


def all_sequences(vocab, n):
  return np.asarray(list(itertools.product(range(vocab), repeat=n)), np.int32)


@functools.partial(jax.jit, static_argnames=('model', 'num_context'))
def jitted_score(model, params, params_prime, ids, *, num_context):
  return dlib.differential_score(
    model, model, params, params_prime, ids, num_context=num_context
  )


def score_all(m, params, params_prime, context, seqs):
  ids = np.concatenate([np.tile(context, (len(seqs), 1)), seqs], 1)
  return jitted_score(m, params, params_prime, ids, num_context=len(context))


@functools.partial(
  jax.jit,
  static_argnames=(
    'model',
    'widths',
    'length',
    'num_groups',
    'score',
    'chunk_rows',
  ),
)
def jitted_search(
  model,
  params,
  params_prime,
  context,
  tokens,
  *,
  widths,
  length,
  num_groups=1,
  score='ds',
  chunk_rows=None,
):
  return dlib.rank_beam_search(
    model,
    model,
    params,
    params_prime,
    context,
    tokens,
    widths=tuple(widths),
    length=length,
    num_groups=num_groups,
    score=score,
    chunk_rows=chunk_rows,
  )


def search(m, params, params_prime, context, tokens=None, **kwargs):
  """`rank_beam_search` under jit, as callers run it."""
  kwargs['widths'] = tuple(kwargs['widths'])
  return jitted_search(
    m,
    params,
    params_prime,
    jnp.asarray(context, jnp.int32),
    None if tokens is None else jnp.asarray(tokens, jnp.int32),
    **kwargs,
  )


# ----------------------------------------------------------------- DS
@pytest.mark.slow
@pytest.mark.parametrize('use_jit', [False, True])
@pytest.mark.parametrize('num_context', [1, 3])
def test_differential_score_equals_direct_computation(
  pair, use_jit, num_context
):
  m, p, pp = pair
  rng = np.random.default_rng(0)
  ids = rng.integers(0, TINY.vocab_size, (5, 8)).astype(np.int32)
  ids[:, 0] = BOS
  lengths = np.array([8, 6, 4, 8, 5])
  mask = (np.arange(8)[None] < lengths[:, None]).astype(np.int32)
  fn = functools.partial(dlib.differential_score, m, m, num_context=num_context)
  if use_jit:
    fn = jax.jit(fn)
  got = fn(p, pp, jnp.asarray(ids), jnp.asarray(mask))
  assert got.ds.shape == (5,) and got.token_ds.shape == (5, 7)
  for b in range(5):
    want_ds, want_rel = direct_scores(
      m, p, pp, ids[b, : lengths[b]], num_context
    )
    np.testing.assert_allclose(got.ds[b], want_ds, atol=1e-5)
    np.testing.assert_allclose(got.rel_ds[b], want_rel, rtol=1e-4, atol=1e-5)
  # Padding and context positions score exactly 0.
  assert np.all(np.asarray(got.token_ds)[mask[:, 1:] == 0] == 0)
  assert np.all(np.asarray(got.token_ds)[:, : num_context - 1] == 0)


def test_identical_models_score_zero(pair):
  m, p, _ = pair
  ids = np.array([[BOS, 2, 3, 4]], np.int32)
  s = dlib.differential_score(m, m, p, p, ids)
  assert float(s.ds[0]) == 0.0 and float(s.rel_ds[0]) == 0.0


def test_token_scores_relative_is_exact_for_tiny_probabilities():
  logp = jnp.array([-80.0, np.log(0.5)])
  logp_prime = jnp.array([-79.0, np.log(0.75)])
  ds, rel = dlib.token_differential_scores(logp, logp_prime)
  np.testing.assert_allclose(rel, [np.e - 1, 0.5], rtol=1e-5)
  np.testing.assert_allclose(ds[1], 0.25, rtol=1e-6)


def test_num_context_must_be_positive(pair):
  m, p, pp = pair
  with pytest.raises(LeakjaxError, match='num_context'):
    dlib.differential_score(m, m, p, pp, np.array([[BOS, 2]]), num_context=0)


# ------------------------------------------------------------ search
def test_exhaustive_widths_return_every_sequence_ranked(pair):
  """With widths |T|^i the search is exact: all of T^n, sorted by DS."""
  m, p, pp = pair
  n, v = 3, TINY.vocab_size
  result = search(
    m, p, pp, [BOS], widths=(v, v**2, v**3), length=n, chunk_rows=5
  )  # 5 does not divide 49: padded chunks
  seqs = all_sequences(v, n)
  want = np.asarray(score_all(m, p, pp, [BOS], seqs).ds)
  order = np.argsort(-want)
  assert result.sequences.shape == (1, v**3, n)
  np.testing.assert_allclose(result.ds[0], want[order], atol=2e-6)
  np.testing.assert_array_equal(result.sequences[0, :10], seqs[order[:10]])


def reference_search(m, p, pp, context, tokens, widths, groups, score):
  """Algorithm 1 + group beam search, literally: score each candidate.

  Every candidate sequence s∘t is scored from scratch with
  `differential_score`; no cache, no batching tricks.
  """
  tokens = list(tokens)

  def scores(seqs):
    s = score_all(
      m, p, pp, context, np.asarray(seqs, np.int32).reshape(len(seqs), -1)
    )
    return np.asarray(getattr(s, score))

  def extend(beam, width):
    cands = [tuple(b) + (t,) for b in beam for t in tokens]
    vals = scores(cands)
    order = np.argsort(-vals, kind='stable')[:width]
    return [cands[i] for i in order], vals[order]

  first, _ = extend([()], widths[0])
  per = widths[0] // groups
  out_seqs, out_vals = [], []
  for g in range(groups):
    beam, vals = first[g * per : (g + 1) * per], None
    for w in widths[1:]:
      beam, vals = extend(beam, w // groups)
    if vals is None:
      vals = scores(beam)
    out_seqs.append(beam)
    out_vals.append(vals)
  return np.asarray(out_seqs), np.asarray(out_vals)


@pytest.mark.slow
@pytest.mark.parametrize(
  'groups,score,context',
  [
    (2, 'ds', [BOS, 3]),
    (3, 'rel_ds', [BOS]),
  ],
)
def test_search_equals_per_sequence_reference(pair, groups, score, context):
  m, p, pp = pair
  tokens = np.array([0, 2, 3, 5, 6, 4], np.int32)  # T, a permuted subset
  widths = (6, 6, 3) if groups == 3 else (6, 4, 2)
  result = search(
    m,
    p,
    pp,
    context,
    tokens,
    widths=widths,
    length=3,
    num_groups=groups,
    score=score,
    chunk_rows=2,
  )
  want_seqs, want_vals = reference_search(
    m, p, pp, context, tokens, widths, groups, score
  )
  assert result.sequences.shape == (groups, widths[-1] // groups, 3)
  np.testing.assert_array_equal(result.sequences, want_seqs)
  np.testing.assert_allclose(
    getattr(result, score), want_vals, rtol=1e-4, atol=1e-6
  )
  # Both scores of every returned sequence match Definition 3.1.
  flat = np.asarray(result.sequences).reshape(-1, 3)
  direct = score_all(m, p, pp, context, flat)
  np.testing.assert_allclose(
    np.asarray(result.ds).reshape(-1), direct.ds, atol=1e-5
  )
  np.testing.assert_allclose(
    np.asarray(result.rel_ds).reshape(-1), direct.rel_ds, rtol=1e-4, atol=1e-5
  )


def test_groups_start_from_disjoint_first_tokens(pair):
  """Group g extends only the one-token sequences of DS ranks g*W/G.. ."""
  m, p, pp = pair
  v = TINY.vocab_size - 1  # 6 tokens, 3 groups of 2 first tokens
  tokens = jnp.arange(1, 7)
  result = search(
    m, p, pp, [BOS], tokens, widths=(6, 6, 6), length=3, num_groups=3
  )
  first = score_all(m, p, pp, [BOS], np.arange(1, 7)[:, None])
  ranked_first = np.arange(1, 7)[np.argsort(-np.asarray(first.ds))]
  for g in range(3):
    used = set(np.asarray(result.sequences[g, :, 0]).tolist())
    assert used <= set(ranked_first[2 * g : 2 * g + 2].tolist())
  assert v == 6


def test_search_compiles_once_per_shape(pair):
  m, params, params_prime = pair
  traces = []

  def search(p, pp, ctx):
    traces.append(1)
    return dlib.rank_beam_search(
      m, m, p, pp, ctx, widths=dlib.halving_widths(7, 4), length=4
    )

  fn = jax.jit(search)
  a = fn(params, params_prime, jnp.array([BOS]))
  b = fn(params_prime, params, jnp.array([BOS]))  # swapped snapshots
  assert len(traces) == 1
  assert a.sequences.shape == b.sequences.shape == (1, 1, 4)
  assert a.ds.dtype == jnp.float32 and a.sequences.dtype == jnp.int32


def test_model_is_a_static_argument_new_params_never_recompile(pair):
  """The module-level jit idiom: the model static, the params explicit."""
  m, params, params_prime = pair
  widths = dlib.halving_widths(7, 2)
  before = jitted_search._cache_size()
  a = search(m, params, params_prime, [BOS], widths=widths, length=2)
  after_first = jitted_search._cache_size()
  # A model built again from the same config is the same static argument.
  m2, params2 = random_model(TINY, 2)
  b = search(m2, params2, params, [BOS], widths=widths, length=2)
  assert jitted_search._cache_size() == after_first <= before + 1
  assert not np.array_equal(a.ds, b.ds)


@pytest.mark.slow
def test_search_over_the_smollm2_vocabulary_on_a_tiny_llama():
  """|T| = 49,152 (SmolLM2's vocabulary) through the Llama decode cache."""
  from leakjax.models import llama  # pylint: disable=g-import-not-at-top

  config = llama.LlamaConfig(
    vocab_size=49_152,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=16,
  )
  m, p = llama.init_model(config, key=jax.random.key(0))
  _, pp = llama.init_model(config, key=jax.random.key(1))
  assert m.vocab_size == 49_152
  context = [1, 5]
  result = search(m, p, pp, context, widths=(32, 4, 2), length=3)
  assert result.sequences.shape == (1, 2, 3)
  seqs = np.asarray(result.sequences[0])
  assert seqs.max() < 49_152
  direct = score_all(m, p, pp, context, seqs)
  np.testing.assert_allclose(result.ds[0], direct.ds, atol=1e-7)
  # The best first token is the argmax of M' - M over the whole vocabulary.
  ids = jnp.asarray([context])
  first = jax.nn.softmax(m.logits(pp, ids)[0, -1]) - jax.nn.softmax(
    m.logits(p, ids)[0, -1]
  )  # [49152]
  assert seqs[0, 0] in np.argsort(-np.asarray(first))[:32]


def test_halving_widths():
  assert dlib.halving_widths(10_000, 5) == (10000, 5000, 2500, 1250, 625)
  assert dlib.halving_widths(49_152, 3) == (49152, 24576, 12288)
  assert dlib.halving_widths(10_000, 5, min_width=1024)[-1] == 1024
  assert dlib.halving_widths(10, 3, num_groups=4) == (8, 4, 4)
  assert dlib.halving_widths(3, 3, min_width=100) == (3, 9, 27)
  with pytest.raises(LeakjaxError):
    dlib.halving_widths(4, 3, num_groups=8)


def test_bad_widths_raise(pair):
  m, p, pp = pair
  with pytest.raises(LeakjaxError, match='exceeds'):
    dlib.rank_beam_search(
      m, m, p, pp, jnp.array([BOS]), widths=(8, 4), length=2
    )
  with pytest.raises(LeakjaxError, match='widths'):
    dlib.rank_beam_search(m, m, p, pp, jnp.array([BOS]), widths=(4,), length=2)


def test_snapshots_of_different_vocabularies_raise(pair):
  m, p, _ = pair
  other, other_params = random_model(
    lstm.LSTMConfig(vocab_size=9, embed_dim=5, hidden_size=6, num_layers=2), 0
  )
  with pytest.raises(LeakjaxError, match="M' has 9"):
    dlib.rank_beam_search(
      m, other, p, other_params, jnp.array([BOS]), widths=(7,), length=1
    )


# --------------------------------------------- any LanguageModel works
def _bigram_logits(params, ids, mask=None):
  del mask
  return params['table'][ids].astype(jnp.float32)


@dataclasses.dataclass(frozen=True)
class BigramLM:
  """A user's own model (not a leakjax Model): p(next | last token)."""

  vocab_size: int
  hidden_size: int | None = None
  num_layers: int | None = None
  max_length: int | None = None
  tie_word_embeddings: bool = False
  paths: ParamPaths = ParamPaths(word_embeddings=('table',))
  tokenizer: Any = None

  def logits(self, params, ids, mask=None):
    return _bigram_logits(params, ids, mask)

  def token_log_probs(self, params, ids, mask=None):
    logp = jax.nn.log_softmax(self.logits(params, ids, mask)[:, :-1], -1)
    return jnp.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]

  def init_cache(self, params, batch_size, max_length):
    del params, max_length
    return jnp.zeros((batch_size,), jnp.int32)  # tokens read per row

  def decode(self, params, cache, ids):
    return self.logits(params, ids), cache + ids.shape[1]


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['own_class', 'from_functions'])
def test_any_language_model_scores_and_searches(kind):
  """DS and the search need only the protocol (`from_functions` without a
  decode function decodes by recomputing the prefix)."""
  v, n = 5, 3
  if kind == 'own_class':
    m = BigramLM(vocab_size=v)
  else:
    m = from_functions(_bigram_logits, vocab_size=v, word_embeddings='table')
  assert isinstance(m, LanguageModel)
  keys = jax.random.split(jax.random.key(3))
  p, pp = ({'table': 2.0 * jax.random.normal(k, (v, v))} for k in keys)
  seqs = all_sequences(v, n)
  s = score_all(m, p, pp, [BOS], seqs)

  # Definition 3.1 for a bigram model, in float64.
  def probs(q):
    e = np.exp(np.asarray(q['table'], np.float64))
    return e / e.sum(-1, keepdims=True)

  a, b = probs(p), probs(pp)
  prev = np.concatenate([np.full((len(seqs), 1), BOS), seqs[:, :-1]], 1)
  diff = b[prev, seqs] - a[prev, seqs]
  want = {'ds': diff.sum(1), 'rel_ds': (diff / a[prev, seqs]).sum(1)}
  np.testing.assert_allclose(s.ds, want['ds'], atol=2e-6)
  np.testing.assert_allclose(s.rel_ds, want['rel_ds'], rtol=1e-4, atol=1e-5)
  for score in dlib.SCORES:  # exhaustive widths: all of T^n, ranked
    result = search(
      m, p, pp, [BOS], widths=(v, v**2, v**3), length=n, score=score
    )
    np.testing.assert_allclose(
      getattr(result, score)[0],
      np.sort(want[score])[::-1],
      rtol=1e-4,
      atol=2e-6,
    )
  # A longer context goes through `decode` before the first step.
  result = search(m, p, pp, [BOS, 2, 4], widths=(v, 4, 2), length=n)
  direct = score_all(m, p, pp, [BOS, 2, 4], np.asarray(result.sequences[0]))
  np.testing.assert_allclose(result.ds[0], direct.ds, atol=2e-6)
  np.testing.assert_allclose(result.rel_ds[0], direct.rel_ds, rtol=1e-4)


# ----------------------------------------------------- DR (Prop. 3.3)
@pytest.mark.slow
def test_dr_lower_bound_never_exceeds_true_rank(pair):
  m, p, pp = pair
  n, v = 3, TINY.vocab_size
  seqs = all_sequences(v, n)
  ds = np.asarray(score_all(m, p, pp, [BOS], seqs).ds)
  true_dr = (ds[None, :] > ds[:, None]).sum(1)
  for widths in [(7, 49, 343), (3, 3, 3)]:
    result = search(m, p, pp, [BOS], widths=widths, length=n)
    bound = np.asarray(dlib.differential_rank_lower_bound(result, seqs, ds))
    assert np.all(bound <= true_dr)
    if widths[-1] == v**n:  # exhaustive: the bound is the rank
      np.testing.assert_array_equal(bound, true_dr)
    # Prop. 3.3: the i-th returned sequence has DR >= i - 1.
    found = np.asarray(result.sequences[0])
    found_ds = np.asarray(result.ds[0])
    lb = np.asarray(dlib.differential_rank_lower_bound(result, found, found_ds))
    rank_in_result = np.array([(found_ds > d).sum() for d in found_ds])
    np.testing.assert_array_equal(lb, rank_in_result)


def test_dr_bound_ignores_the_sequence_itself():
  result = dlib.SearchResult(
    sequences=jnp.array([[[1, 2], [3, 4], [5, 6]]]),
    ds=jnp.array([[0.9, 0.5, 0.1]]),
    rel_ds=jnp.zeros((1, 3)),
  )
  # [3, 4] given a score a hair below its found score: not counted itself.
  bound = dlib.differential_rank_lower_bound(
    result,
    jnp.array([[3, 4], [7, 7], [1, 2]]),
    jnp.array([0.4999999, 0.2, 0.95]),
  )
  np.testing.assert_array_equal(bound, [1, 2, 0])
  np.testing.assert_array_equal(
    dlib.contains(result, jnp.array([[3, 4], [4, 3]])), [True, False]
  )


# ---------------------------------------------- planted canary recovery
@pytest.mark.slow
def test_search_finds_a_canary_planted_by_training():
  """M' = M trained further on a canary: the search finds it at DR 0."""
  words = ['<UNK>', '<S>'] + [f'w{i}' for i in range(28)]
  config = lstm.LSTMConfig(
    vocab_size=30, embed_dim=16, hidden_size=16, num_layers=2
  )
  model, params = lstm.init_model(
    config, key=jax.random.key(0), tokenizer=WordTokenizer(words)
  )
  canary = np.array([BOS, 17, 4, 29, 8, 23], np.int32)
  rng = np.random.default_rng(0)
  background = rng.integers(2, 30, (32, 6)).astype(np.int32)
  background[:, 0] = BOS
  opt = optax.adam(1e-2)

  @jax.jit
  def step(params, state, ids):
    grads = jax.grad(model.loss)(params, ids)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = opt.init(params)
  for _ in range(40):  # M: the background data D
    params, state = step(params, state, jnp.asarray(background))
  base = params
  # M': continued training on D' \ D = copies of the canary (as many rows
  # as the background batch: one compiled step; the mean loss of identical
  # rows is that of one).
  update = np.tile(canary, (len(background), 1))
  for _ in range(30):
    params, state = step(params, state, jnp.asarray(update))
  prime = params

  result = search(
    model, base, prime, [BOS], widths=dlib.halving_widths(30, 5), length=5
  )
  np.testing.assert_array_equal(result.sequences[0, 0], canary[1:])
  s = score_all(model, base, prime, [BOS], canary[None, 1:])
  assert float(s.ds[0]) > 1.0  # most of the canary's probability is new
  dr = dlib.differential_rank_lower_bound(result, canary[None, 1:], s.ds)
  assert int(dr[0]) == 0
  # A background sentence is not exposed: many found sequences beat it.
  other = background[:1]
  s_other = score_all(model, base, prime, [BOS], other[:, 1:])
  dr_other = dlib.differential_rank_lower_bound(
    result, other[:, 1:], s_other.ds
  )
  assert int(dr_other[0]) >= 1


# ------------------------------------------------------- experiment smoke
def write_corpus(path, num_lines=80, seed=0):
  """Paragraph-per-line text: Zipf-distributed words, 6 sentences a line."""
  rng = np.random.default_rng(seed)
  vocab = [f'w{i}' for i in range(60)]
  weights = 1.0 / np.arange(1, 61)
  weights /= weights.sum()
  lines = [' = A heading = ']
  for _ in range(num_lines):
    sentences = []
    for _ in range(6):
      words = list(rng.choice(vocab, size=rng.integers(4, 10), p=weights))
      sentences.append(' '.join(words).capitalize() + ' .')
    lines.append(' '.join(sentences))
  path.write_text('\n'.join(lines) + '\n')


@pytest.mark.slow
def test_experiment_smoke(tmp_path):
  import json  # pylint: disable=g-import-not-at-top

  from experiments import differential as exp  # pylint: disable=g-import-not-at-top

  corpus = tmp_path / 'corpus.txt'
  write_corpus(corpus)
  cfg = dlib.DifferentialConfig(
    data=str(corpus),
    vocab_size=40,
    embed_dim=16,
    hidden_size=16,
    row_width=24,
    batch_size=16,
    epochs=1,
    learning_rate=1e-2,
    continue_optimizer='adam',
    continue_epochs=20,
    continue_learning_rate=3e-2,
    continue_batch_size=4,
    canary_types=('all_low', 'high_to_low'),
    insertions=(8,),
    methods=('continued', 'retrain'),
    prefix_lengths=(0, 2),
    min_width=16,
    top=3,
  )
  summary = exp.run_experiment(cfg, tmp_path / 'run', progress=False)
  for kind in cfg.canary_types:
    for method in cfg.methods:
      for prefix in ('', ',prefix=2'):
        for metric in ('ds', 'rel_ds', 'dr'):
          key = f'{metric}@canary={kind},k=8,method={method}{prefix}'
          assert np.isfinite(summary[key]), key
  # Continued training on nothing but the canary exposes it completely.
  for kind in cfg.canary_types:
    assert summary[f'dr@canary={kind},k=8,method=continued'] == 0
    assert summary[f'ds@canary={kind},k=8,method=continued'] > 2.0
  assert summary['dr0_fraction@method=continued'] == 1.0
  saved = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert saved == pytest.approx(summary)
  md = (tmp_path / 'run' / 'summary.md').read_text()
  assert '## retrain' in md and '## continued' in md and 'RQ3' in md
  rows = [
    json.loads(x)
    for x in (tmp_path / 'run' / 'results.jsonl').read_text().splitlines()
  ]
  assert len(rows) == 2 * 2 * 2  # canaries x methods x prefixes
  assert (tmp_path / 'run' / 'ds_dr.png').stat().st_size > 1000
  # Resuming with the same workdir recomputes nothing and agrees.
  again = exp.run_experiment(cfg, tmp_path / 'run', progress=False)
  assert again == pytest.approx(summary)


def test_canaries_follow_the_frequency_profiles(tmp_path):
  corpus = tmp_path / 'corpus.txt'
  write_corpus(corpus)
  cfg = dlib.DifferentialConfig(data=str(corpus), vocab_size=40)
  sentences = corpus_lib.read_sentences(cfg.data, max_sentences=None, seed=0)
  split = corpus_lib.split_corpus(sentences, cfg)
  tok = WordTokenizer.build(split.train, 40)
  canaries = dlib.make_canaries(
    tok, split.train, canary_types=cfg.canary_types, seed=0
  )
  assert [c.kind for c in canaries] == list(dlib.PROFILES)
  for c in canaries:
    assert c.quintiles == dlib.PROFILES[c.kind]
  with pytest.raises(LeakjaxError, match='quintiles'):
    dlib.make_canaries(
      tok,
      split.train,
      canary_types=('all_low',),
      phrases=('w0 w1 w2 w3 w4',),
      seed=0,
    )
  assert canaries_lib.canary_copies(canaries[:2], 3) == (
    [canaries[0].text] * 3 + [canaries[1].text] * 3
  )
  ids, mask = corpus_lib.pack_rows(tok, split.train, 24, seed=0)
  assert ids.shape[1] == 24 and mask.mean() > 0.9
  assert np.all(ids[:, 0] == tok.bos_id)  # every row starts a sentence


def test_pack_rows_keeps_every_sentence_whole():
  """Best-fit packing: each sentence once, uncut, `<S>` first; rows full."""
  tok = WordTokenizer.build(['a b c d e f g h'], 12)
  sentences = ['a b c', 'd e', 'f g h a b', 'c', 'h g f e d c', 'b a']
  ids, mask = corpus_lib.pack_rows(tok, sentences, 8, seed=3)
  # 4+3+6+2+7+3 = 25 tokens: best fit decreasing puts 7 | 6+2 | 4+3 | 3.
  assert ids.shape == (4, 8)
  got = []
  for row, m in zip(ids, mask):
    row = list(row[m > 0])
    starts = [i for i, t in enumerate(row) if t == tok.bos_id] + [len(row)]
    assert starts[0] == 0
    got += [tok.decode(row[a + 1 : b]) for a, b in zip(starts, starts[1:])]
  assert sorted(got) == sorted(sentences)
  assert sorted(mask.sum(1)) == [3, 7, 7, 8]


def test_hamming_close_marks_near_copies_of_other_canaries():
  found = np.array([[1, 2, 3, 4, 5], [1, 2, 9, 9, 5], [9, 9, 9, 4, 5]])
  np.testing.assert_array_equal(
    canaries_lib.hamming_close(found, [(1, 2, 3, 4, 5)]), [True, True, False]
  )
  np.testing.assert_array_equal(
    canaries_lib.hamming_close(found, [(1, 2, 3, 4, 5)], 0),
    [True, False, False],
  )


def test_experiment_dr_bounds_count_higher_found_sequences():
  """`dr_bounds` (the library's Prop. 3.3) = counting found rows directly."""
  rng = np.random.default_rng(0)
  seqs = rng.integers(0, 4, (64, 3)).astype(np.int32)  # with repeats
  ds = np.round(rng.normal(size=64), 1).astype(np.float32)  # with ties
  order = np.argsort(-ds, kind='stable')
  found = dlib.SearchResult(
    sequences=seqs[order][None],
    ds=ds[order][None],
    rel_ds=np.float32(3.0) * ds[order][None],
  )
  own = rng.random(64) < 0.7
  targets = np.concatenate([seqs[:8], rng.integers(0, 5, (8, 3))]).astype(
    np.int32
  )
  for score in dlib.SCORES:
    found_scores = getattr(found, score)[0]
    for i, target in enumerate(targets):
      value = found_scores[i] + np.float32(0.05 * (i % 3 - 1))
      different = np.any(found.sequences[0] != target[None], -1)
      higher = found_scores > value
      got = evaluation.dr_bounds(
        found, target, np.asarray([value], np.float32), own, score
      )
      assert got == (
        int(np.sum(different & higher)),
        int(np.sum(different & higher & own)),
      )


# ------------------------------------------------------------------ flags


# Flags of every experiment that are not config fields.
NOT_CONFIG = {'workdir', 'mesh', *common.RUN_FLAGS}


def test_flags_are_exactly_the_config_fields(fresh_flags):
  from experiments import differential as exp  # pylint: disable=g-import-not-at-top

  exp.define_flags()
  fields = {f.name for f in dataclasses.fields(dlib.DifferentialConfig)}
  assert set(fresh_flags) - NOT_CONFIG == fields
  fresh_flags(['prog', '--data=corpus.txt'])
  # The default preset's fields; every other flag's default is the field's.
  assert exp.config_from_flags() == dlib.presets.config(data='corpus.txt')


@pytest.mark.slow
def test_committed_quick_flagfile_gives_its_config(fresh_flags):
  import pathlib  # pylint: disable=g-import-not-at-top

  from experiments import differential as exp  # pylint: disable=g-import-not-at-top

  exp.define_flags()
  root = pathlib.Path(__file__).resolve().parents[1]
  flagfile = root / 'experiments/configs/differential_quick.flags'
  fresh_flags(['prog', f'--flagfile={flagfile}', '--canaries=a b; c d;e,f g;h'])
  assert exp.config_from_flags() == dlib.DifferentialConfig(
    data='wikitext-2-valid',
    max_sentences=3000,
    vocab_size=2000,
    model='ptb_small',
    row_width=64,
    batch_size=20,
    learning_rate=3e-3,
    epochs=3,
    continue_optimizer='sgd',
    continue_epochs=2,
    continue_learning_rate=0.1,
    continue_batch_size=4,
    extra_sentences=100,
    canary_types=('all_low', 'low_to_high', 'mixed', 'high_to_low'),
    canaries=('a b', 'c d', 'e,f g', 'h'),  # ';'-separated
    insertions=(4, 16),
    retrain_insertions=(16,),
    methods=('retrain', 'continued', 'continued_extra'),
    prefix_lengths=(0, 2),
    min_width=1024,
    score='ds',
    top=10,
    seed=0,
    preset='paper',  # the flagfile's --preset
  )


def test_split_is_a_record_of_the_canaries():
  cfg = dlib.DifferentialConfig(data='corpus.txt', split='test')
  assert cfg == dataclasses.replace(cfg, split='dev')  # computes the same
  assert io.jsonable(cfg)['split'] == 'test'  # config.json says it
  with pytest.raises(LeakjaxError, match='unknown --split'):
    dlib.DifferentialConfig(data='corpus.txt', split='heldout')
