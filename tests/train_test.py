"""Tests for leakjax.train on a tiny GPT-2 with a toy word-level tokenizer."""

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models as hf_models
from tokenizers import pre_tokenizers

from leakjax import data as data_lib
from leakjax import models
from leakjax import train as train_lib
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2
from leakjax.models.protocol import Bound
from leakjax.tokenization import Tokenizer
from leakjax.train import language_model as train_language_model
from leakjax.train import steps as train_steps

WORDS = (
  '<pad> <s> <unk> the cat sat on mat dog ran to park a big red ball'
  ' we saw bird sang in tree'
).split()
CORPUS = [
  'the cat sat on the mat',
  'the dog ran to the park',
  'a big red ball',
  'we saw a bird sang in the tree',
] * 6  # 24


def toy_tokenizer() -> Tokenizer:
  backend = HFTokenizer(
    hf_models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token='<unk>')
  )
  backend.pre_tokenizer = pre_tokenizers.Whitespace()
  return Tokenizer(backend, bos_id=1, pad_id=0, unk_id=2, name='toy')


@functools.cache
def tiny_model(seed: int = 0):
  """`(model, params)` of a 1-layer GPT-2 with the toy tokenizer."""
  config = gpt2.GPT2Config.tiny(
    vocab_size=32, n_positions=16, n_embd=32, n_layer=1, n_head=2
  )
  return gpt2.init_model(
    config, key=jax.random.key(seed), tokenizer=toy_tokenizer()
  )


def _logit_dropout(model, params, ids, mask, key):
  logits = model.logits(params, ids, mask)
  keep = jax.random.bernoulli(key, 0.8, logits.shape)
  return jnp.where(keep, logits / 0.8, 0.0)


def with_logit_dropout(model):
  """The model with a keyed dropout on its logits, so that training depends
  on the per-step keys (our GPT-2 has no dropout of its own)."""
  return model.replace(train_logits_fn=Bound(_logit_dropout, (model,)))


def assert_trees_equal(a, b):
  chex.assert_trees_all_equal_structs(a, b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def eval_rows(history):
  return [h for h in history if 'eval_loss' in h]


# ------------------------------------------------------------ optimizer
def test_linear_schedule_values():
  config = train_lib.TrainConfig(learning_rate=0.1, warmup_steps=2)
  schedule = train_lib.learning_rate_schedule(config, total_steps=10)
  got = [float(schedule(s)) for s in (0, 1, 2, 6, 9, 10, 12)]
  np.testing.assert_allclose(got, [0, 0.05, 0.1, 0.05, 0.0125, 0, 0], atol=1e-7)
  constant = train_lib.learning_rate_schedule(
    train_lib.TrainConfig(learning_rate=0.1, schedule='constant'), 10
  )
  np.testing.assert_allclose(
    [float(constant(s)) for s in (0, 10, 99)], [0.1] * 3, rtol=1e-7
  )


def test_sgd_optimizer_follows_linear_schedule():
  config = train_lib.TrainConfig(
    optimizer='sgd', learning_rate=0.5, grad_clip_norm=None
  )
  tx = train_lib.make_optimizer(config, total_steps=4)
  params = {'w': jnp.ones((2, 3))}
  grads = {'w': jnp.full((2, 3), 2.0)}
  state = tx.init(params)
  for step in range(5):
    updates, state = tx.update(grads, state, params)
    expected = -0.5 * max(4 - step, 0) / 4 * 2.0  # lr_t * grad
    np.testing.assert_allclose(updates['w'], expected, rtol=1e-6)


@pytest.mark.parametrize('name', ['adamw', 'adam', 'sgd'])
def test_weight_decay_skips_biases_and_scales(name):
  config = train_lib.TrainConfig(
    optimizer=name, learning_rate=0.1, weight_decay=0.5, schedule='constant'
  )
  tx = train_lib.make_optimizer(config, total_steps=1)
  params = {'kernel': jnp.full((2, 2), 3.0), 'bias': jnp.full((2,), 3.0)}
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  assert (updates['bias'] == 0).all()
  assert (updates['kernel'] < 0).all()
  if name == 'adamw':  # decoupled: -lr * wd * p
    np.testing.assert_allclose(updates['kernel'], -0.1 * 0.5 * 3.0, rtol=1e-6)


@pytest.mark.parametrize(
  'kwargs, match',
  [
    (dict(optimizer='lion'), 'unknown optimizer'),
    (dict(schedule='step'), 'unknown learning-rate schedule'),
    (dict(num_steps=-1), 'num_steps'),
    (dict(final_learning_rate_fraction=2.0), 'final_learning_rate_fraction'),
    (dict(learning_rate=0.0), 'learning_rate must be positive'),
    (dict(batch_size=0), 'batch_size must be positive'),
    (dict(warmup_steps=-1), 'warmup_steps'),
  ],
)
def test_config_errors(kwargs, match):
  with pytest.raises(LeakjaxError, match=match):
    train_lib.TrainConfig(**kwargs)


# -------------------------------------------------------------- kernels
@pytest.mark.slow
def test_sgd_step_is_params_minus_lr_grad():
  """One full-batch SGD step through `train` is exactly p - lr * grad."""
  model, params = tiny_model()
  lr = 0.25
  config = train_lib.TrainConfig(
    optimizer='sgd',
    learning_rate=lr,
    schedule='constant',
    grad_clip_norm=None,
    batch_size=len(CORPUS),
    num_steps=1,
    shuffle=False,
  )
  ids, mask, _ = data_lib.encode_corpus(model.tokenizer, CORPUS, 16)
  loss, grads = jax.jit(jax.value_and_grad(model.loss))(params, ids, mask)
  expected = jax.tree.map(lambda p, g: p - lr * g, params, grads)

  result = train_lib.train(model, params, CORPUS, config=config, progress=False)
  assert result.step == 1
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=0, atol=1e-7),
    result.params,
    expected,
  )
  row = result.history[-1]
  np.testing.assert_allclose(row['loss'], loss, rtol=1e-5)
  np.testing.assert_allclose(
    row['grad_norm'], optax.global_norm(grads), rtol=1e-5
  )
  assert row['learning_rate'] == pytest.approx(lr)


def test_evaluate_is_token_weighted_and_ignores_padding():
  model, params = tiny_model()
  texts = ['the cat sat on the mat', 'a big red ball', 'we saw a bird']
  batches = list(data_lib.batches(model.tokenizer, texts, 2, 16, shuffle=False))
  assert batches[-1][1][1].sum() == 0  # a filler row
  got = train_lib.evaluate(model, params, batches)
  # Reference: all texts in one batch without filler rows, numpy NLL.
  ids, mask, _ = data_lib.encode_corpus(model.tokenizer, texts, 16)
  logits = np.asarray(jax.jit(model.logits)(params, ids, mask), np.float64)[
    :, :-1
  ]
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
  lengths = [1 + len(model.tokenizer.encode(t)) for t in texts]
  count = sum(n - 1 for n in lengths)
  expected = sum(nll[r, : n - 1].sum() for r, n in enumerate(lengths)) / count
  assert got['tokens'] == count
  np.testing.assert_allclose(got['loss'], expected, rtol=1e-5)
  np.testing.assert_allclose(got['perplexity'], np.exp(expected), rtol=1e-5)


# --------------------------------------------------------------- runner
def test_training_lowers_eval_perplexity_without_retracing(monkeypatch):
  chex.clear_trace_counter()
  # Patched where the jitted steps look them up when tracing.
  monkeypatch.setattr(
    train_steps, 'fit_step', chex.assert_max_traces(train_lib.fit_step, n=1)
  )
  monkeypatch.setattr(
    train_language_model,
    'eval_step',
    chex.assert_max_traces(train_lib.eval_step, n=1),
  )
  model, params = tiny_model()
  before = jax.tree.map(np.array, params)
  # 24 examples in batches of 5: every epoch ends with a padded batch.
  config = train_lib.TrainConfig(
    learning_rate=1e-2, batch_size=5, num_epochs=6, warmup_steps=3, log_every=5
  )
  long_text = ' '.join(CORPUS[:4])  # 24 tokens: cut to the context, 16
  result = train_lib.train(
    model, params, CORPUS[:-1] + [long_text], CORPUS[:4], config, progress=False
  )
  # Other params of the same shapes, another data order and logging: the
  # jitted steps (static model and optimizer settings) are reused.
  train_lib.train(
    model,
    result.params,
    CORPUS[:-1] + [long_text],
    CORPUS[:4],
    dataclasses.replace(config, seed=1, log_every=10),
    progress=False,
  )
  monkeypatch.undo()
  assert result.num_truncated == 1
  evals = eval_rows(result.history)
  assert [h['step'] for h in evals] == [0, 5, 10, 15, 20, 25, 30]
  assert evals[-1]['eval_perplexity'] < 0.3 * evals[0]['eval_perplexity']
  assert evals[0]['eval_perplexity'] > 15  # ~ uniform over 32 at init
  best = min(evals, key=lambda h: h['eval_loss'])
  assert result.best_eval['loss'] == best['eval_loss']
  assert result.best_eval['step'] == best['step']
  losses = [h['loss'] for h in result.history if 'loss' in h]
  assert len(losses) == 6 and losses[-1] < 0.5 * losses[0]
  assert result.step == 30 and not result.stopped_early
  # The returned params are the best ones; the caller's params are intact.
  again = train_lib.evaluate(
    result.model,
    result.params,
    data_lib.batches(model.tokenizer, CORPUS[:4], 5, 128, shuffle=False),
  )
  np.testing.assert_allclose(again['loss'], best['eval_loss'], rtol=1e-5)
  assert_trees_equal(jax.tree.map(np.array, params), before)


def test_early_stopping_keeps_best_params():
  model, params = tiny_model()
  train_texts = ['the cat sat on the mat'] * 8
  # Reversed word order: what the model learns makes these less likely.
  eval_texts = ['mat the on sat cat the'] * 2
  config = train_lib.TrainConfig(
    learning_rate=3e-2,
    schedule='constant',
    batch_size=4,
    num_steps=60,
    eval_every=2,
    early_stopping_patience=2,
    add_bos=False,
  )
  result = train_lib.train(
    model, params, train_texts, eval_texts, config, progress=False
  )
  evals = eval_rows(result.history)
  assert result.stopped_early and result.step < 60
  best = result.best_eval
  assert [h['step'] for h in evals[-2:]] == [result.step - 2, result.step]
  assert all(h['eval_loss'] >= best['loss'] for h in evals[-2:])
  assert best['step'] == result.step - 4
  got = train_lib.evaluate(
    result.model,
    result.params,
    data_lib.batches(model.tokenizer, eval_texts, 2, 16, add_bos=False),
  )
  np.testing.assert_allclose(got['loss'], best['loss'], rtol=1e-5)


@pytest.mark.slow
def test_resume_gives_same_params_as_uninterrupted_run(tmp_path, monkeypatch):
  model, params = tiny_model()
  model = with_logit_dropout(model)
  config = train_lib.TrainConfig(
    learning_rate=1e-2,
    weight_decay=0.1,
    warmup_steps=2,
    batch_size=5,
    num_steps=9,
    eval_every=3,
    checkpoint_every=3,
    log_every=1,
  )
  eval_texts = CORPUS[:3]
  whole = train_lib.train(
    model,
    params,
    CORPUS,
    eval_texts,
    config,
    workdir=tmp_path / 'a',
    progress=False,
  )
  assert whole.start_step == 0

  # Interrupt the second run while it takes the batch of step 6.
  real_take, calls = data_lib.take_batch, []

  def take_then_crash(*args):
    calls.append(1)
    if len(calls) == 1 + 6:  # 1 eval batch, then training batches
      raise KeyboardInterrupt
    return real_take(*args)

  monkeypatch.setattr(data_lib, 'take_batch', take_then_crash)
  with pytest.raises(KeyboardInterrupt):
    train_lib.train(
      model,
      params,
      CORPUS,
      eval_texts,
      config,
      workdir=tmp_path / 'b',
      progress=False,
    )
  monkeypatch.setattr(data_lib, 'take_batch', real_take)
  state = train_lib.checkpoint_state(tmp_path / 'b')
  assert state['step'] == 3 and not state['finished']
  # A run that goes on keeps Adam's moments; a finished one (below) not.
  assert (tmp_path / 'b' / 'checkpoint' / '3' / 'opt_state').is_dir()

  resumed = train_lib.train(
    model,
    params,
    CORPUS,
    eval_texts,
    dataclasses.replace(config, log_every=2),
    workdir=tmp_path / 'b',
    progress=False,
  )
  assert resumed.start_step == 3 and resumed.step == 9
  assert_trees_equal(resumed.params, whole.params)
  assert resumed.best_eval == whole.best_eval
  assert [h['eval_loss'] for h in eval_rows(resumed.history)] == [
    h['eval_loss'] for h in eval_rows(whole.history)
  ]

  # A finished run returns at once with the same model.
  done = train_lib.train(
    model,
    params,
    CORPUS,
    eval_texts,
    config,
    workdir=tmp_path / 'b',
    progress=False,
  )
  assert done.start_step == done.step == 9
  assert_trees_equal(done.params, whole.params)
  last_step = tmp_path / 'b' / 'checkpoint' / '9'
  assert (last_step / 'params').is_dir()
  assert not (last_step / 'opt_state').exists()

  # The returned model loads with leakjax.models.load; the checkpoint
  # holds the last step's params (here the best ones as well).
  assert whole.best_eval['step'] == 9
  loaded, loaded_params = models.load(tmp_path / 'a' / 'model')
  assert loaded.family == 'gpt2'
  assert loaded.tokenizer.encode('the cat') == [3, 4]
  assert_trees_equal(loaded_params, whole.params)
  last = train_lib.checkpoint_params(tmp_path / 'a', params)
  assert_trees_equal(last, whole.params)

  # Another config or other data is refused.
  with pytest.raises(LeakjaxError, match='different config.*learning_rate'):
    train_lib.train(
      model,
      params,
      CORPUS,
      eval_texts,
      dataclasses.replace(config, learning_rate=1e-3),
      workdir=tmp_path / 'b',
      progress=False,
    )
  with pytest.raises(LeakjaxError, match='another fingerprint'):
    train_lib.train(
      model,
      params,
      CORPUS[:-1],
      eval_texts,
      config,
      workdir=tmp_path / 'b',
      progress=False,
    )


def test_donated_params_train_the_same_and_are_deleted():
  model, params = tiny_model()
  config = train_lib.TrainConfig(
    learning_rate=1e-2, batch_size=5, num_steps=3, log_every=1
  )
  kept = train_lib.train(model, params, CORPUS, None, config, progress=False)
  mine = jax.tree.map(jnp.array, params)
  given = train_lib.train(
    model, mine, CORPUS, None, config, progress=False, donate=True
  )
  assert_trees_equal(given.params, kept.params)
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(mine))
  assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(params))


def test_release_programs_drops_the_training_steps_and_nothing_else():
  from leakjax._jit import jitted

  model, params = tiny_model()
  config = train_lib.TrainConfig(learning_rate=1e-2, batch_size=5, num_steps=2)
  before = train_lib.train(
    model, params, CORPUS, CORPUS[:4], config, progress=False
  )
  fit_step = jitted(train_steps._settings_fit_step, **train_steps._FIT_STEP_JIT)
  eval_step = jitted(
    train_language_model._model_eval_step, **train_language_model._EVAL_JIT
  )
  others = jax.jit(lambda x: x * 2)
  others(jnp.ones(3))
  assert fit_step._cache_size() >= 1 and eval_step._cache_size() >= 1
  train_lib.release_programs()
  assert fit_step._cache_size() == eval_step._cache_size() == 0
  assert others._cache_size() == 1  # a caller's program stays compiled
  # Training again compiles the steps again, to the same parameters.
  again = train_lib.train(
    model, params, CORPUS, CORPUS[:4], config, progress=False
  )
  assert fit_step._cache_size() >= 1
  assert_trees_equal(again.params, before.params)


def test_the_compilers_freed_memory_goes_back_once_per_run(monkeypatch):
  # fit returns the heap's freed pages right after the step's compile (the
  # compiler's memory would stay resident while the step's buffers peak),
  # once, and training is the same.
  from leakjax import runtime
  from leakjax.train import loop

  model, params = tiny_model()
  config = train_lib.TrainConfig(learning_rate=1e-2, batch_size=5, num_steps=3)
  kept = train_lib.train(model, params, CORPUS, None, config, progress=False)
  calls = []
  monkeypatch.setattr(
    loop.runtime, 'return_freed_memory', lambda: calls.append(1)
  )
  got = train_lib.train(model, params, CORPUS, None, config, progress=False)
  assert calls == [1] and loop.runtime is runtime
  assert_trees_equal(got.params, kept.params)


def test_checkpoint_readers_and_an_old_layout(tmp_path):
  # Workdirs of the safetensors checkpoint layout (train_state.json in
  # checkpoint/) are refused with one clear error, not misread by orbax.
  model, params = tiny_model()
  config = train_lib.TrainConfig(batch_size=8, num_steps=2)
  assert train_lib.checkpoint_state(tmp_path / 'none') is None
  with pytest.raises(LeakjaxError, match='holds no checkpoint'):
    train_lib.checkpoint_params(tmp_path / 'none', params)
  assert not (tmp_path / 'none').exists()
  old = tmp_path / 'old' / 'checkpoint'
  old.mkdir(parents=True)
  (old / 'train_state.json').write_text('{}')
  with pytest.raises(LeakjaxError, match='earlier leakjax version'):
    train_lib.train(
      model, params, CORPUS, None, config, workdir=old.parent, progress=False
    )


def test_nan_loss_names_the_step_with_pretokenized_input():
  model, params = tiny_model()
  ids, mask, _ = data_lib.encode_corpus(model.tokenizer, CORPUS, 16)
  config = train_lib.TrainConfig(
    optimizer='sgd',
    learning_rate=1e4,
    schedule='constant',
    grad_clip_norm=None,
    batch_size=8,
    num_steps=50,
  )
  with pytest.raises(
    LeakjaxError,
    match=r'is (nan|inf) at step \d+ \(learning rate 1e\+04'
    r'\); lower the learning rate',
  ) as e:
    train_lib.train(model, params, (ids, mask), config=config, progress=False)
  step = int(str(e.value).split('at step ')[1].split()[0])
  assert 1 < step < 50


def test_input_errors():
  model, params = tiny_model()
  config = train_lib.TrainConfig(num_steps=1, batch_size=4)
  with pytest.raises(LeakjaxError, match='training set is empty'):
    train_lib.train(model, params, [], config=config, progress=False)
  with pytest.raises(LeakjaxError, match='training set is empty'):
    train_lib.train(
      model,
      params,
      (np.zeros((0, 4)), np.zeros((0, 4))),
      config=config,
      progress=False,
    )
  long_text = ' '.join(['the cat sat on the mat'] * 4)  # 25 tokens with BOS
  with pytest.raises(LeakjaxError, match='longer than max_length=16'):
    train_lib.train(
      model,
      params,
      [long_text, 'a dog'],
      config=dataclasses.replace(config, truncate=False),
      progress=False,
    )
  with pytest.raises(LeakjaxError, match='no tokenizer'):
    train_lib.train(
      model.replace(tokenizer=None),
      params,
      CORPUS,
      config=config,
      progress=False,
    )
  with pytest.raises(LeakjaxError, match='nothing to predict'):
    train_lib.train(
      model,
      params,
      ['the', 'cat'],
      config=dataclasses.replace(config, add_bos=False),
      progress=False,
    )
  with pytest.raises(LeakjaxError, match='out of range'):
    train_lib.train(
      model,
      params,
      (np.full((2, 4), 40), np.ones((2, 4))),
      config=config,
      progress=False,
    )
  wide = (np.full((2, 20), 3), np.ones((2, 20)))
  with pytest.raises(
    LeakjaxError,
    match='2 examples of the training set are longer than 16 tokens',
  ):
    train_lib.train(
      model,
      params,
      wide,
      config=dataclasses.replace(config, truncate=False),
      progress=False,
    )
  with pytest.raises(LeakjaxError, match=r'shapes \(2, 4\) and \(2, 5\)'):
    train_lib.train(
      model,
      params,
      (np.ones((2, 4)), np.ones((2, 5))),
      config=config,
      progress=False,
    )


# ------------------------------------------------------- defended training
def _one_sgd_step(defense, **config):
  """Params after one plain-SGD step on 4 sentences under `defense`, and
  the batch."""
  model, params = tiny_model()
  ids, mask = model.tokenizer.encode_batch(CORPUS[:4], add_bos=True)
  settings = dict(
    optimizer='sgd',
    learning_rate=0.1,
    schedule='constant',
    grad_clip_norm=None,
    batch_size=4,
    num_steps=1,
  )
  settings.update(config)
  result = train_lib.train(
    model,
    params,
    (ids, mask),
    config=train_lib.TrainConfig(**settings),
    progress=False,
    defense=defense,
  )
  return model, params, result.params, jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.slow
def test_dp_sgd_training_step_is_the_clipped_per_example_mean():
  from leakjax import fl

  model, start, trained, ids, mask = _one_sgd_step(fl.dp_sgd(0.5, 0.0))
  # Reference: each sentence's gradient on its own, clipped to global norm
  # 0.5, averaged, one SGD step of 0.1.
  clipped = []
  for i in range(4):
    g = jax.grad(model.loss)(start, ids[i : i + 1], mask[i : i + 1])
    norm = optax.global_norm(g)
    assert float(norm) > 0.5  # the clip is active
    clipped.append(jax.tree.map(lambda x, n=norm: x * (0.5 / n), g))
  mean = jax.tree.map(lambda *g: sum(g) / 4, *clipped)
  expected = jax.tree.map(lambda p, g: p - 0.1 * g, start, mean)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6),
    trained,
    expected,
  )


@pytest.mark.slow
def test_pruned_training_step_keeps_each_tensors_largest_entries():
  from leakjax import fl

  model, start, trained, ids, mask = _one_sgd_step(fl.gradient_pruning(0.9))
  grads = jax.grad(model.loss)(start, ids, mask)

  def pruned(g):  # zero the 90% smallest |g| of the tensor
    flat = np.asarray(g).ravel()
    drop = np.argsort(np.abs(flat), kind='stable')[: int(0.9 * flat.size + 0.5)]
    flat = flat.copy()
    flat[drop] = 0.0
    return flat.reshape(g.shape)

  expected = jax.tree.map(lambda p, g: p - 0.1 * pruned(g), start, grads)
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6),
    trained,
    expected,
  )


@pytest.mark.slow
def test_frozen_embeddings_do_not_move_under_weight_decay():
  from leakjax import fl

  model, start = tiny_model()
  defense = fl.freeze_embeddings(model)
  model, start, trained, _, _ = _one_sgd_step(
    defense, optimizer='adamw', weight_decay=0.5, num_steps=3
  )
  moved = {
    path: not np.array_equal(a, b)
    for (path, a), b in zip(
      jax.tree_util.tree_leaves_with_path(start),
      jax.tree.leaves(trained),
      strict=True,
    )
  }
  frozen = {p for p in moved if 'wte' in jax.tree_util.keystr(p)}
  assert frozen and not any(moved[p] for p in frozen)
  assert all(moved[p] for p in moved if p not in frozen)


def test_clip_scales_like_optax_and_passes_small_gradients_unchanged():
  tx = train_lib.make_optimizer(
    train_lib.TrainConfig(
      optimizer='sgd', learning_rate=1.0, schedule='constant'
    ),
    total_steps=1,
  )
  clip = optax.clip_by_global_norm(1.0)
  keys = jax.random.split(jax.random.key(0), 2)
  params = {'a': jnp.zeros((5, 7)), 'b': jnp.zeros((3,))}
  for scale in (0.01, 30.0):  # under and over the bound
    grads = {
      'a': scale * jax.random.normal(keys[0], (5, 7)),
      'b': scale * jax.random.normal(keys[1], (3,)),
    }
    got, _ = tx.update(grads, tx.init(params), params)
    want, _ = clip.update(grads, clip.init(params))
    for k in grads:
      if scale < 1:  # under the bound: the gradient itself, bit for bit
        np.testing.assert_array_equal(got[k], -grads[k])
      else:
        np.testing.assert_allclose(got[k], -want[k], rtol=1e-6)
  assert float(optax.global_norm(got)) == pytest.approx(1.0, rel=1e-6)


def _wide_loss(params, frozen, batch, key):
  del frozen, key
  h = jnp.tanh(batch[0] @ params['w1'])
  return jnp.mean((h @ params['w2']) ** 2), {}


@pytest.mark.parametrize('optimizer', ['adamw', 'adam', 'sgd'])
def test_the_step_holds_one_copy_of_the_gradients(optimizer):
  # The clipped step's temporaries: one gradient per parameter and little
  # else (the activations of a 2-row batch are small). optax's select form
  # of the clip kept the divided gradients beside the raw ones: twice this.
  params = {
    'w1': jnp.zeros((512, 1024), jnp.float32),
    'w2': jnp.zeros((1024, 512), jnp.float32),
  }
  settings = train_lib.TrainConfig(optimizer=optimizer, weight_decay=0.1)
  opt_state = train_lib.make_optimizer(settings, 10).init(params)
  batch = (jnp.ones((2, 512)), jnp.ones((2, 512)))
  step = jax.jit(train_steps._settings_fit_step, **train_steps._FIT_STEP_JIT)
  compiled = step.lower(
    _wide_loss,
    settings,
    10,
    params,
    None,
    opt_state,
    batch,
    jax.random.key(0),
    np.int32(0),
  ).compile()
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < 1.25 * param_bytes, (temp, param_bytes)
