"""Tests of Embed Parrot (Wan et al. 2024, Sec. 4.3) and its experiment."""

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import common
from experiments import embed_parrot as experiment
from leakjax import models
from leakjax import train as train_lib
from leakjax._jit import jitted
from leakjax.attacks.inversion import bei_hei as ei
from leakjax.attacks.inversion import embed_parrot as ep
from leakjax.attacks.inversion import (
  hidden_states,
  presets,
  runner,
  scoring,
  texts,
)
from leakjax.errors import LeakjaxError
from leakjax.models import gpt2, llama
from leakjax.tokenization import gpt2_tokenizer
from leakjax.train import steps as train_steps

REPO = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def tiny_llama(vocab_size=128, tokenizer=None, layers=3):
  """`(model, params)` of a tiny tied Llama (built once per argument set)."""
  config = llama.LlamaConfig(
    vocab_size=vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=layers,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=True,
  )
  return llama.init_model(config, key=jax.random.key(0), tokenizer=tokenizer)


@functools.lru_cache(maxsize=None)
def tiny_data(n=48, t=8):
  """(ids, mask, deep states, H^0) of random sequences under the tiny Llama.

  A random model barely mixes its residual stream, so HEI would read H^3
  almost perfectly. Like the deep layers of SmolLM2 (huge outlier features,
  HEI ~ 0), the "deep" states here are H^3 rotated by a fixed random
  orthogonal matrix plus a large constant offset.
  """
  model, params = tiny_llama()
  ids = jax.random.randint(jax.random.key(1), (n, t), 0, 128)
  mask = np.ones((n, t), np.int32)
  mask[::3, 6:] = 0
  states = jax.jit(ei.layer_states, static_argnames=('model', 'layers'))(
    model, params, ids, mask, layers=(0, 3)
  )
  states = np.asarray(states)
  rng = np.random.default_rng(0)
  rotation = np.linalg.qr(rng.normal(size=(32, 32)))[0]
  deep = states[1] @ rotation + 30.0 * rng.normal(size=32)
  return np.asarray(ids), mask, deep.astype(np.float32), states[0]


CONFIG = ep.EmbedParrotConfig(
  input_dim=32, output_dim=32, width=32, num_layers=1, num_heads=2
)


@pytest.mark.slow
def test_forward_shapes_and_causality():
  variables = ep.init_variables(CONFIG, key=jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (2, 5, 32))
  mask = jnp.ones((2, 5), jnp.int32)
  y = ep.predict(CONFIG, variables, x, mask)
  assert y.shape == (2, 5, 32) and y.dtype == jnp.float32
  # Decoder-only: changing position 3 leaves positions 0..2 unchanged.
  y2 = ep.predict(CONFIG, variables, x.at[:, 3].set(7.0), mask)
  np.testing.assert_allclose(y2[:, :3], y[:, :3], atol=1e-5)
  assert not np.allclose(y2[:, 3:], y[:, 3:])


def test_feature_stats_ignore_padding():
  hidden = np.zeros((2, 3, 4), np.float32)
  hidden[:, :2] = np.arange(4.0)
  hidden[:, 2] = 1e6  # padding
  stats = ep.feature_stats(hidden, np.array([[1, 1, 0], [1, 1, 0]]))
  np.testing.assert_allclose(stats['input_shift'], np.arange(4.0))
  assert np.all(stats['input_scale'] > 0) and np.all(stats['input_scale'] < 1)


def test_cosine_loss_hand_values():
  a = jnp.array([[[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]]])
  assert float(ep.cosine_loss(a, a, jnp.ones((1, 3)))) == pytest.approx(0.0)
  assert float(ep.cosine_loss(a, -a, jnp.ones((1, 3)))) == pytest.approx(2.0)
  b = jnp.array([[[0.0, 1.0], [0.0, 3.0], [-1.0, -1.0]]])
  # cos = 0, 1, -1 -> losses 1, 0, 2; the mask keeps the first two.
  assert float(ep.cosine_loss(a, b, jnp.array([[1, 1, 0]]))) == (
    pytest.approx(0.5)
  )


@pytest.mark.slow
def test_training_reduces_loss_and_beats_hei(tmp_path):
  ids, mask, deep, h0 = tiny_data()
  cfg = ep.train_config(
    60,
    16,
    learning_rate=3e-3,
    warmup_steps=5,
    log_every=20,
    checkpoint_every=30,
  )
  ckpt = tmp_path / 'ep'
  variables, history = ep.train(
    CONFIG, deep, h0, mask, cfg, key=jax.random.key(0), workdir=ckpt
  )
  losses = [h['cos_loss'] for h in history]
  assert [h['step'] for h in history] == [20, 40, 60]
  assert losses[-1] < 0.5 * losses[0]
  assert train_lib.checkpoint_state(ckpt)['step'] == 60
  model, params = tiny_llama()
  emb = model.word_embeddings(params)
  pred = ep.predict_batches(CONFIG, variables, deep, mask, batch_size=16)
  real = mask > 0
  acc_ep = (np.asarray(ei.hei_ids(pred, emb)) == ids)[real].mean()
  acc_hei = (np.asarray(ei.hei_ids(deep, emb)) == ids)[real].mean()
  assert acc_hei < 0.2 and acc_ep > 0.9
  # Resuming a finished run restores it, and its history, without training.
  again, more = ep.train(
    CONFIG, deep, h0, mask, cfg, key=jax.random.key(0), workdir=ckpt
  )
  assert more == history
  jax.tree.map(np.testing.assert_array_equal, again, variables)
  # Another initialisation is another run: the checkpoint is refused.
  with pytest.raises(LeakjaxError, match='another fingerprint'):
    ep.train(CONFIG, deep, h0, mask, cfg, key=jax.random.key(9), workdir=ckpt)


@pytest.mark.slow
def test_train_matches_a_hand_written_adamw_loop():
  # Independent reference: the same batches (the epoch permutation of
  # leakjax.data.batch_indices) through optax's clip + AdamW with a warmup
  # cosine schedule, stepped by hand.
  _, mask, deep, h0 = tiny_data()
  cfg = ep.train_config(
    7, 16, learning_rate=3e-3, warmup_steps=2, log_every=7, seed=3
  )
  variables, history = ep.train(
    CONFIG, deep, h0, mask, cfg, key=jax.random.key(0)
  )
  start, _ = ep.train(
    CONFIG, deep, h0, mask, ep.train_config(0, 16), key=jax.random.key(0)
  )
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, 3e-3, 2, 7, end_value=0.05 * 3e-3
  )
  opt = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(
      schedule,
      weight_decay=0.01,
      mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p),
    ),
  )
  params, state = start['params'], opt.init(start['params'])
  n, per_epoch = len(deep), len(deep) // 16
  losses = []
  for step in range(7):
    epoch, within = divmod(step, per_epoch)
    rows = np.random.default_rng([3, epoch]).permutation(n)[
      within * 16 : (within + 1) * 16
    ]
    batch = ep.Batch(
      jnp.asarray(deep[rows]), jnp.asarray(h0[rows]), jnp.asarray(mask[rows])
    )
    (loss, _), grads = jax.value_and_grad(
      functools.partial(ep.loss_fn, config=CONFIG), has_aux=True
    )(params, start['stats'], batch)
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    losses.append(float(loss))
  jax.tree.map(
    functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6),
    variables['params'],
    params,
  )
  assert history[-1]['cos_loss'] == pytest.approx(np.mean(losses), rel=1e-5)


def _start(config, **kwargs):
  """Embed Parrot's variables before its first step, on `tiny_data`."""
  _, mask, deep, h0 = tiny_data()
  variables, _ = ep.train(
    config,
    deep,
    h0,
    mask,
    ep.train_config(0, 16),
    key=jax.random.key(0),
    **kwargs,
  )
  return variables


@pytest.mark.slow
def test_linear_skip_starts_at_ridge_and_improves():
  ids, mask, deep, h0 = tiny_data()
  config = dataclasses.replace(CONFIG, linear_skip=True)
  start = _start(config)
  stats = jax.tree.map(np.asarray, start['stats'])
  kernel, bias = ep.ridge_solution(deep, h0, mask, stats)
  x = (deep - stats['input_shift']) / stats['input_scale']
  np.testing.assert_allclose(
    ep.predict(config, start, deep, mask), x @ kernel + bias, atol=1e-3
  )
  # Already at step 0 the ridge map undoes most of rotation and offset.
  real = mask > 0
  model, params = tiny_llama()
  emb = model.word_embeddings(params)
  acc = (np.asarray(ei.hei_ids(x @ kernel + bias, emb)) == ids)[real].mean()
  assert acc > 0.9


@pytest.mark.slow
@pytest.mark.parametrize('family', ['llama', 'gpt2'])
def test_decoder_states_of_token_embeddings_are_the_model_states(family):
  # Independent reference: the model's own forward pass. Fed its own token
  # embeddings, the decoder stack must reproduce the last block's output
  # (GPT-2's position embeddings are kept by the substitution).
  if family == 'llama':
    model, params = tiny_llama()
    emb = model.word_embeddings(params)
  else:
    model, params = gpt2.init_model(
      gpt2.GPT2Config.tiny(vocab_size=128, n_positions=16, n_layer=2),
      key=jax.random.key(3),
    )
    emb = model.word_embeddings(params)
  ids = jax.random.randint(jax.random.key(4), (3, 7), 0, 128)
  mask = jnp.ones((3, 7), jnp.int32).at[1, 5:].set(0)
  want = model.hidden_states(params, ids, mask)[-1]
  got = jax.jit(ep.decoder_states, static_argnums=0)(
    model, params, emb[ids], mask
  )
  real = np.asarray(mask) > 0
  np.testing.assert_allclose(
    np.asarray(got)[real], np.asarray(want)[real], atol=2e-5, rtol=1e-4
  )


@pytest.mark.slow
def test_pretrained_decoder_trains_every_weight_and_starts_at_ridge():
  ids, mask, deep, h0 = tiny_data()
  model, params = tiny_llama()
  config = ep.EmbedParrotConfig(
    input_dim=32, output_dim=32, decoder=model, ridge_input_adapter=True
  )
  assert config.decoder_width == 32
  start = _start(config, decoder_params=params)
  # The decoder starts as the pretrained weights, the Input-Adapter at the
  # ridge map H^i -> H^0.
  jax.tree.map(
    np.testing.assert_array_equal, start['params']['decoder'], params
  )
  stats = jax.tree.map(np.asarray, start['stats'])
  kernel, bias = ep.ridge_solution(deep, h0, mask, stats)
  np.testing.assert_allclose(
    start['params']['input_adapter']['kernel'], kernel, atol=1e-6
  )
  # Causal: changing position 3 leaves positions 0..2 unchanged.
  x = jnp.asarray(deep[:2])
  m = jnp.ones((2, 8), jnp.int32)
  y = ep.predict(config, start, x, m)
  y2 = ep.predict(config, start, x.at[:, 3].add(5.0), m)
  np.testing.assert_allclose(y2[:, :3], y[:, :3], atol=1e-5)
  assert not np.allclose(y2[:, 3:], y[:, 3:])
  # One loss gradient reaches every block weight, not the token embeddings
  # (the decoder reads the adapter's output in their place).
  batch = ep.Batch(jnp.asarray(deep[:8]), jnp.asarray(h0[:8]), mask[:8])
  grads = jax.grad(
    lambda p: ep.loss_fn(p, start['stats'], batch, config=config)[0]
  )(start['params'])
  dec = grads['decoder']
  # (Row 0, the dummy id's, gets the two paths' cancelling terms: rounding.)
  emb_grad = np.asarray(dec['embed']['embedding'])
  assert not np.any(emb_grad[1:])
  largest = max(np.abs(np.asarray(g)).max() for g in jax.tree.leaves(dec))
  assert np.abs(emb_grad[0]).max() < 1e-5 * largest
  for name in ('layers_0', 'layers_1', 'layers_2'):
    for leaf in jax.tree.leaves(dec[name]):
      assert np.abs(np.asarray(leaf)).max() > 0
  # Training lowers the loss.
  cfg = ep.train_config(
    40, 16, learning_rate=1e-3, warmup_steps=4, log_every=10
  )
  _, history = ep.train(
    config, deep, h0, mask, cfg, key=jax.random.key(0), decoder_params=params
  )
  assert history[-1]['cos_loss'] < 0.7 * history[0]['cos_loss']


def test_pretrained_decoder_needs_its_params():
  model, params = tiny_llama()
  config = ep.EmbedParrotConfig(input_dim=32, output_dim=32, decoder=model)
  with pytest.raises(LeakjaxError, match='go together'):
    ep.init_variables(config, key=jax.random.key(0))
  with pytest.raises(LeakjaxError, match='ridge_input_adapter'):
    ep.EmbedParrotConfig(
      input_dim=32, output_dim=16, decoder=model, ridge_input_adapter=True
    )
  with pytest.raises(LeakjaxError, match='ridge_input_adapter'):
    ep.EmbedParrotConfig(input_dim=32, output_dim=32, ridge_input_adapter=True)


def test_train_rejects_bad_shapes():
  _, mask, deep, h0 = tiny_data()
  cfg = ep.train_config(1, 4)
  with pytest.raises(LeakjaxError):
    ep.train(CONFIG, deep[:, :, :16], h0, mask, cfg, key=jax.random.key(0))
  with pytest.raises(LeakjaxError):
    ep.train(
      CONFIG,
      deep,
      h0,
      mask,
      ep.train_config(1, 1000),
      key=jax.random.key(0),
    )


@pytest.mark.slow
def test_ppl_term_is_model_nll_for_exact_embeddings_and_differentiable():
  model, params = tiny_llama()
  ids, mask, deep, h0 = tiny_data()
  ids, mask, deep, h0 = ids[:4], mask[:4], deep[:4], h0[:4]
  # With the true H^0 and a tiny temperature, q is one-hot on the tokens and
  # the term is the model's mean next-token NLL of the text.
  term = ep.ppl_term(model, params, jnp.asarray(h0), mask, temperature=1e-3)
  nll, count = ei.sequence_nll(model.logits(params, ids, mask), ids, mask)
  assert float(term) == pytest.approx(float(nll.sum() / count.sum()), rel=1e-3)
  # EP+PPL loss = cosine loss + weight * PPL term, with finite gradients.
  variables = ep.init_variables(CONFIG, key=jax.random.key(0))
  batch = ep.Batch(jnp.asarray(deep), jnp.asarray(h0), jnp.asarray(mask))
  ppl = lambda pred, m: ep.ppl_term(model, params, pred, m)
  loss_fn = functools.partial(
    ep.loss_fn, config=CONFIG, ppl=ppl, ppl_weight=0.5
  )
  (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
    variables['params'], variables['stats'], batch
  )
  assert float(loss) == pytest.approx(
    float(metrics['cos_loss'] + 0.5 * metrics['log_ppl']), rel=1e-5
  )
  leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
  assert any(np.abs(np.asarray(g)).max() > 0 for g in leaves)


@pytest.mark.slow
def test_train_with_ppl_term_needs_target_params_and_runs():
  model, params = tiny_llama()
  _, mask, deep, h0 = tiny_data()
  cfg = ep.train_config(2, 8, warmup_steps=1, log_every=1)
  ppl = dict(key=jax.random.key(0), ppl_weight=0.5)
  with pytest.raises(LeakjaxError, match='params'):
    ep.train(CONFIG, deep, h0, mask, cfg, **ppl)
  with pytest.raises(LeakjaxError, match='params'):
    ep.train(CONFIG, deep, h0, mask, cfg, target_model=model, **ppl)
  _, history = ep.train(
    CONFIG,
    deep,
    h0,
    mask,
    cfg,
    **ppl,
    target_model=model,
    target_params=params,
  )
  assert [h['step'] for h in history] == [1, 2]
  assert all(np.isfinite(h['log_ppl']) for h in history)


def test_train_step_compiles_once_per_settings():
  _, mask, deep, h0 = tiny_data()
  cfg = ep.train_config(2, 16, warmup_steps=1, log_every=1)
  ep.train(CONFIG, deep, h0, mask, cfg, key=jax.random.key(0))
  # The step as `fit` jits it (one wrapper per process).
  step = jitted(train_steps._settings_fit_step, **train_steps._FIT_STEP_JIT)
  before = step._cache_size()
  # Same settings, new data and initialisation: no new compile.
  ep.train(CONFIG, deep + 1.0, h0, mask, cfg, key=jax.random.key(1))
  assert step._cache_size() == before


# -------------------------------------------------------------- experiment
def _write_corpora(folder: Path) -> str:
  words = (
    'the meeting contract price market weather report team office'
    ' project budget plan call email schedule client review data'
    ' energy power gas deal trade '
  ).split()
  rng = np.random.default_rng(0)
  sent = lambda: ' '.join(rng.choice(words, rng.integers(3, 12))).capitalize()
  (folder / 'a.json').write_text(json.dumps([sent() + '.' for _ in range(40)]))
  (folder / 'b.txt').write_text(
    '\n'.join(
      ' = Heading = '
      if i % 5 == 0
      else ' '.join(sent() + '.' for _ in range(3))
      for i in range(20)
    )
  )
  return f'a={folder / "a.json"},b={folder / "b.txt"}'


def test_test_split_shares_no_text_with_dev_and_keeps_the_training_texts(
  tmp_path,
):
  tok = gpt2_tokenizer()
  base = runner.InversionConfig(
    corpora=tuple(_write_corpora(tmp_path).split(',')),
    train_corpus='a',
    sentence_split=('b',),
    num_test=4,
    num_train=20,
    test_fraction=0.25,
    max_length=16,
  )
  assert base.split == 'dev'  # the committed runs' texts
  dev, dev_train = texts.load_splits(base, tok)
  test, test_train = texts.load_splits(
    dataclasses.replace(base, split='test'), tok
  )
  assert test_train.texts == dev_train.texts
  for name in 'ab':
    assert len(test[name].texts) == len(dev[name].texts) == 4
    assert not set(test[name].texts) & set(dev[name].texts)
    assert not set(test[name].texts) & set(dev_train.texts)
  with pytest.raises(LeakjaxError, match='outside the dev draw'):
    texts.load_splits(dataclasses.replace(base, split='test', num_test=8), tok)
  with pytest.raises(LeakjaxError, match='unknown --split'):
    runner.InversionConfig(split='train')


@pytest.mark.slow
def test_experiment_smoke(tmp_path):
  tok = gpt2_tokenizer()
  model, params = tiny_llama(vocab_size=tok.vocab_size, tokenizer=tok, layers=2)
  cfg = experiment.Config(
    model='tiny',
    corpora=tuple(_write_corpora(tmp_path).split(',')),
    train_corpus='a',
    sentence_split=('b',),
    layers=('0', '1', 'last'),
    deep_layer=2,
    num_test=6,
    num_train=24,
    test_fraction=0.25,
    max_length=16,
    add_bos=False,
    batch_size=4,
    ep_width=16,
    ep_layers=1,
    ep_heads=2,
    ep_steps=4,
    ep_batch_size=8,
    ep_lr=1e-3,
    ep_variants=('ep',),
    ep_ppl_steps=0,
    ep_ppl_weight=0.1,
    defense_layers=('0', '2'),
    defense_subsets=(2,),
    ppl_texts=3,
    sbert=False,
    sbert_limit=2,
    seed=0,
  )
  workdir, cache = tmp_path / 'out', tmp_path / 'cache'
  summary = experiment.run(cfg, workdir, cache, model=model, params=params)
  for data in 'ab':
    # Layer 0 is the embedding itself: HEI recovers the text exactly.
    assert summary[f'f1@data={data},layer=0,method=hei'] >= 0.95
  # Each inversion key is its row of results.jsonl (one row per cell).
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  cells = {
    (r['data'], r['layer'], r['method']): r
    for r in rows
    if r['kind'] == 'inversion' and 'defense' not in r and 'bucket' not in r
  }
  for data in 'ab':
    for metric in ('f1', 'rouge1', 'rougeL'):  # no 'sbert': disabled here
      for method in ('bei', 'hei', 'ep', 'ep_bei'):
        want = cells[(data, '2', method)][metric]
        key = f'{metric}@data={data},layer=2,method={method}'
        assert summary[key] == pytest.approx(want)
    (dct,) = [
      r
      for r in rows
      if r.get('defense') == 'dct'
      and (r.get('data'), r['layer'], r.get('method')) == (data, '2', 'ep')
    ]
    key = f'rouge1@data={data},defense=dct,layer=2,method=ep,subsets=2'
    assert summary[key] == pytest.approx(dct['rouge1'])
  assert summary['ppl@defense=dct,layer=0,subsets=2'] > 0
  assert summary['ppl@defense=none'] > 0
  assert any(k.startswith('rouge1@bucket=') for k in summary)
  assert not any(k.startswith('sbert@') for k in summary)
  # Timings live in timings.json: equal runs give equal summaries.
  assert not any(k.startswith('seconds') for k in summary)
  timings = json.loads((workdir / 'timings.json').read_text())
  assert set(timings) == {
    'seconds_hidden_states',
    'seconds_ep_train',
    'seconds_total',
  }
  for name in (
    'summary.json',
    'summary.md',
    'results.jsonl',
    'config.json',
    'layers.png',
    'ep_history.json',
  ):
    assert (workdir / name).exists(), name
  assert 'paper' in (workdir / 'summary.md').read_text()
  assert json.loads((workdir / 'summary.json').read_text()) == summary
  with pytest.raises(LeakjaxError, match='together'):
    experiment.run(cfg, workdir, cache, model=model)
  # A re-run resumes from results.jsonl, the caches and the checkpoint.
  again = experiment.run(cfg, workdir, cache, model=model, params=params)
  assert set(again) == set(summary)
  for k, v in summary.items():
    assert again[k] == pytest.approx(v, nan_ok=True), k


@pytest.mark.slow
def test_experiment_with_a_pretrained_decoder(tmp_path):
  # ep_pretrained: a saved model as Decode Model, then EP+PPL on top of it.
  tok = gpt2_tokenizer()
  model, params = tiny_llama(vocab_size=tok.vocab_size, tokenizer=tok, layers=2)
  models.save(model, params, tmp_path / 'decoder')
  cfg = experiment.Config(
    model='tiny',
    corpora=tuple(_write_corpora(tmp_path).split(',')),
    train_corpus='a',
    sentence_split=('b',),
    layers=('2',),
    deep_layer=2,
    num_test=4,
    num_train=16,
    test_fraction=0.25,
    max_length=16,
    batch_size=4,
    ep_steps=3,
    ep_batch_size=8,
    ep_variants=('ep_pretrained',),
    ep_decoder=str(tmp_path / 'decoder'),
    ep_ppl_steps=2,
    defense_layers=(),
    sbert=False,
    ppl_texts=2,
  )
  workdir = tmp_path / 'out'
  summary = experiment.run(
    cfg, workdir, tmp_path / 'cache', model=model, params=params
  )
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  for method in ('ep_pretrained', 'ep_pretrained_bei', 'ep_pretrained_ppl'):
    (row,) = [
      r
      for r in rows
      if r['kind'] == 'inversion' and r['method'] == method and r['data'] == 'a'
    ]
    key = f'rouge1@data=a,layer=2,method={method}'
    assert summary[key] == pytest.approx(row['rouge1'])
  history = json.loads((workdir / 'ep_pretrained_history.json').read_text())
  assert history and history[-1]['step'] == 3
  # EP+PPL's curve, with both of its terms.
  ppl = json.loads((workdir / 'ep_pretrained_ppl_history.json').read_text())
  assert ppl[-1]['step'] == 2 and {'cos_loss', 'log_ppl'} <= set(ppl[-1])
  last = ppl[-1]
  assert last['loss'] == pytest.approx(
    last['cos_loss'] + cfg.ep_ppl_weight * last['log_ppl'], rel=1e-5
  )
  with pytest.raises(LeakjaxError, match='ep_decoder'):
    dataclasses.replace(cfg, ep_decoder='')


@pytest.fixture
def ep_flags(fresh_flags):
  """Fresh flags with the experiment's flags defined."""
  experiment.define_flags()
  return fresh_flags


def test_every_config_field_is_a_flag_and_back(ep_flags):
  fields = {f.name for f in dataclasses.fields(experiment.Config)}
  hand_written = {
    'workdir',
    'data',
    'data_column',
    'data_label',
    'cache_dir',
    *common.RUN_FLAGS,
  }
  assert set(ep_flags) == fields | hand_written
  assert not fields & hand_written
  ep_flags(['prog'])
  # The flag defaults are the default preset's config.
  assert experiment.config_from_flags() == presets.config()


@pytest.mark.parametrize(
  'name',
  ['embed_parrot_quick', 'embed_parrot_smollm2', 'embed_parrot_pretrained'],
)
def test_flagfiles_parse(ep_flags, name):
  path = REPO / 'experiments' / 'configs' / f'{name}.flags'
  ep_flags(['prog', f'--flagfile={path}'])
  cfg = experiment.config_from_flags()
  assert cfg.train_corpus in dict(cfg.corpus_paths())
  assert str(cfg.deep_layer) in cfg.layers
  assert path.read_text().startswith('#')
  if name == 'embed_parrot_pretrained':
    # EP+PPL fine-tunes the first variant: the pretrained one.
    assert cfg.ep_variants[0] == 'ep_pretrained' and cfg.ep_ppl_steps > 0
    assert cfg.ep_decoder == cfg.model == 'smollm2-135m'


def test_data_flag_replaces_the_corpora(ep_flags):
  ep_flags(['prog', '--data=/x/y.txt', '--defense_subsets=2,8'])
  cfg = experiment.config_from_flags()
  assert cfg.corpus_paths() == (('data', '/x/y.txt'),)
  assert cfg.train_corpus == 'data'
  assert cfg.defense_subsets == (2, 8)


def test_config_checks_train_corpus_and_variants():
  with pytest.raises(LeakjaxError, match='train_corpus=c'):
    runner.InversionConfig(corpora=('a=x', 'b=y'), train_corpus='c')
  with pytest.raises(LeakjaxError, match='not name=path'):
    runner.InversionConfig(corpora=('a',), train_corpus='a')
  with pytest.raises(LeakjaxError, match='ep_variants'):
    runner.InversionConfig(ep_variants=('ep', 'nope'))


# ------------------------------------------------------------------ runner
def test_parse_corpora():
  assert runner.parse_corpora(['a=x.txt', ' b = y=z.json', '']) == (
    ('a', 'x.txt'),
    ('b', 'y=z.json'),
  )
  with pytest.raises(LeakjaxError, match='empty'):
    runner.parse_corpora(['', ' '])


def test_width_batches_sort_pad_and_trim():
  lengths = np.array([5, 40, 3, 17, 9])
  batches = list(hidden_states.width_batches(lengths, 2, full=48, multiple=16))
  # Length-sorted rows (3, 5, 9, 17, 40); the short last batch is padded by
  # repeating its first row; widths round up to 16 and stop at `full`.
  rows = [b[0].tolist() for b in batches]
  assert rows == [[2, 0], [4, 3], [1, 1]]
  assert [b[1] for b in batches] == [2, 2, 1]
  assert [b[2] for b in batches] == [16, 32, 48]


def test_cached_computes_once(tmp_path):
  calls = []

  def compute():
    calls.append(1)
    return {'x': np.arange(3, dtype=np.int32)}

  first = hidden_states.cached(tmp_path / 'a.npz', compute)
  second = hidden_states.cached(tmp_path / 'a.npz', compute)
  assert len(calls) == 1
  np.testing.assert_array_equal(first['x'], second['x'])
  assert second['x'].dtype == np.int32


def test_row_summary_ignores_nan():
  scores = {
    'f1': np.array([0.5, 1.0]),
    'rouge1': np.array([0.0, 1.0]),
    'rougeL': np.array([0.25, 0.75]),
    'sbert': np.array([0.8, np.nan]),
  }
  assert scoring.row_summary(scores) == {
    'f1': 0.75,
    'rouge1': 0.5,
    'rougeL': 0.5,
    'sbert': pytest.approx(0.8),
  }


@pytest.mark.parametrize('pretrained', [False, True])
def test_batch_width_is_trimmed_except_for_a_pretrained_decoder(
  monkeypatch, pretrained
):
  # Sequences of at most 5 real tokens in a 40-wide cache: a small decoder
  # trains on them trimmed to 16 columns (one compiled shape per multiple of
  # 16); a pretrained decoder, whose deep step compiles slowly, on all 40.
  rng = np.random.default_rng(0)
  n, t = 12, 40
  deep = rng.normal(size=(n, t, 32)).astype(np.float32)
  h0 = rng.normal(size=(n, t, 32)).astype(np.float32)
  mask = np.zeros((n, t), np.int32)
  mask[:, :5] = 1
  if pretrained:
    model, params = tiny_llama()
    config = ep.EmbedParrotConfig(
      input_dim=32, output_dim=32, decoder=model, ridge_input_adapter=True
    )
  else:
    config, params = CONFIG, None
  seen = {}

  class Stop(Exception):
    pass

  def fake_fit(loss, start, make_batch, num, train_config, **kwargs):
    del loss, start, num, train_config, kwargs
    seen['batch'] = make_batch(np.array([0, 1, 2, -1]))
    raise Stop

  monkeypatch.setattr(ep.train_lib, 'fit', fake_fit)
  with pytest.raises(Stop):
    ep.train(
      config,
      deep,
      h0,
      mask,
      ep.train_config(1, 4),
      key=jax.random.key(0),
      decoder_params=params,
    )
  batch = seen['batch']
  width = t if pretrained else 16
  assert batch.inputs.shape == (4, width, 32)
  assert batch.targets.shape == (4, width, 32)
  # The filler row (-1) is masked out; the real rows keep their 5 tokens.
  np.testing.assert_array_equal(batch.mask.sum(1), [5, 5, 5, 0])
  np.testing.assert_array_equal(batch.inputs[:3], deep[:3, :width])


def _chain_model(tok, sentences):
  """A "model" that writes `sentences` in random order, one after another.

  Its logits allow exactly the next token of the current sentence; after
  a sentence's final '.', the first token of any of them (equal odds).
  """
  succ = np.zeros((tok.vocab_size, len(sentences)), np.int32)
  firsts = [tok.encode(s)[0] for s in sentences]
  for s in sentences:
    ids = tok.encode(s)
    for a, b in zip(ids[:-1], ids[1:]):
      succ[a] = b
  succ[tok.encode('.')[0]] = firsts
  succ = jnp.asarray(succ)

  def logits(params, ids, mask=None):
    del mask
    allowed = (jnp.arange(tok.vocab_size) == succ[ids][..., None]).any(-2)
    return jnp.where(allowed, 0.0, -30.0) + 0.0 * params['w'][0, 0]

  model = models.from_functions(
    logits,
    vocab_size=tok.vocab_size,
    word_embeddings='w',
    max_length=64,
    tokenizer=tok,
  )
  return model, {'w': jnp.zeros((tok.vocab_size, 2))}


@pytest.mark.slow
def test_model_samples_are_whole_distinct_sentences():
  tok = gpt2_tokenizer()
  sentences = [
    ' The red fox runs fast.',
    ' A blue bird sings well.',
    ' Go now.',
  ]
  model, params = _chain_model(tok, sentences)
  settings = dict(
    length=24, start_id=tok.encode('.')[0], key=jax.random.key(0), batch_size=4
  )
  got = texts.model_samples(model, params, 2, **settings)
  # 'Go now.' has < 4 words; every row's unfinished last piece is dropped.
  assert sorted(got) == ['A blue bird sings well.', 'The red fox runs fast.']
  with pytest.raises(LeakjaxError, match='no new sentence'):
    texts.model_samples(model, params, 3, **settings)
  with pytest.raises(LeakjaxError, match='no valid token'):
    texts.model_samples(model, params, 2, **{**settings, 'start_id': 10**6})
  cfg = runner.InversionConfig(max_length=24, train_samples=2)
  with pytest.raises(LeakjaxError, match='sample_top_p'):
    dataclasses.replace(cfg, sample_top_p=0.0)
  with pytest.raises(LeakjaxError, match='sample_temperature'):
    dataclasses.replace(cfg, sample_temperature=0.0)


@pytest.mark.slow
def test_experiment_adds_model_samples_to_the_training_texts(
  tmp_path, monkeypatch
):
  tok = gpt2_tokenizer()
  model, params = tiny_llama(vocab_size=tok.vocab_size, tokenizer=tok, layers=2)
  samples = [f'Sample number {i} is a sentence.' for i in range(5)]
  calls = []

  def fake_samples(model, params, num, **kwargs):
    calls.append(num)
    return samples[:num]

  monkeypatch.setattr(texts, 'model_samples', fake_samples)
  cfg = experiment.Config(
    model='tiny',
    corpora=tuple(_write_corpora(tmp_path).split(',')),
    train_corpus='a',
    sentence_split=('b',),
    layers=('2',),
    deep_layer=2,
    num_test=4,
    num_train=12,
    max_length=16,
    batch_size=4,
    ep_width=16,
    ep_layers=1,
    ep_heads=2,
    ep_steps=2,
    ep_batch_size=8,
    defense_layers=(),
    ppl_texts=2,
    sbert=False,
    train_samples=5,
  )
  cache = tmp_path / 'cache'
  summary = experiment.run(
    cfg, tmp_path / 'out', cache, model=model, params=params
  )
  assert summary['num_train_samples'] == 5
  assert summary['num_train_texts'] == 12 + 5
  written = json.loads((tmp_path / 'out' / 'train_samples.json').read_text())
  assert written == samples
  # The samples are cached: a second run draws none.
  experiment.run(cfg, tmp_path / 'again', cache, model=model, params=params)
  assert calls == [5]
