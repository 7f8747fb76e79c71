"""End-to-end tests of FILM (leakjax.attacks.film) and its experiment."""

import dataclasses
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from absl import flags

from experiments import common, config_flags, film_report, film_tables
from experiments import film as film_exp
from leakjax import fl, metrics, models
from leakjax import runtime as stages
from leakjax import train as train_lib
from leakjax.attacks import film
from leakjax.attacks.film import bag_only, client, pipeline, runner, training
from leakjax.attacks.film import beam_search as bs
from leakjax.attacks.film import reorder as ro
from leakjax.models import get_path, gpt2
from leakjax.recovery import bag as bow
from leakjax.tokenization import gpt2_tokenizer

SECRETS = (
  'Anna Berg moved the Oslo meeting to Friday.',
  'Please call Tom Reed about the Denver contract.',
  'The Zephyr order for Austin has not arrived.',
)


@functools.cache
def memorising_model():
  """A tiny GPT-2 trained until it has memorised SECRETS (the threat model).

  Returns:
    `(model, params)`.
  """
  tok = gpt2_tokenizer()
  config = gpt2.GPT2Config.tiny(vocab_size=50257, n_positions=32)
  model, params = gpt2.init_model(config, key=jax.random.key(0), tokenizer=tok)
  ids, mask = tok.encode_batch(list(SECRETS), add_bos=True)
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  opt = optax.adam(1e-2)

  @jax.jit
  def step(params, state):
    loss, g = jax.value_and_grad(model.loss)(params, ids, mask)
    updates, state = opt.update(g, state)
    return optax.apply_updates(params, updates), state, loss

  state = opt.init(params)
  # At this rate the loss falls below 0.15 between about step 90 and 150,
  # depending on the CPU and XLA's flags (the steps are chaotic enough for
  # rounding to move it): train in tens of steps until it has.
  for _ in range(30):
    for _ in range(10):
      params, state, loss = step(params, state)
    if float(loss) < 0.15:
      break
  assert float(loss) < 0.15  # the first word after BOS: log(3) per sentence
  return model, params


@pytest.mark.slow
def test_film_recovers_a_memorised_sentence_from_its_gradient():
  model, params = memorising_model()
  tok = model.tokenizer
  ids, mask = tok.encode_batch([SECRETS[0]], add_bos=True)
  grads = fl.client_gradient(model, params, jnp.asarray(ids), jnp.asarray(mask))
  config = film.FilmAttackConfig(
    beam=bs.BeamSearchConfig(num_beams=4, length=12, prior_penalty=100.0),
    reorder=ro.ReorderConfig(phrase_steps=2, token_steps=2, num_candidates=4),
    repetitions=2,
  )
  result = film.recover(
    model, params, grads, config=config, key=jax.random.key(0)
  )
  truth = set(ids[0].tolist())
  p, r = metrics.bag_precision_recall(result.bag.ids, truth)
  assert p == 1.0 and r >= 0.9
  assert result.bag.max_length == ids.shape[1]
  best = metrics.best_of_batch([SECRETS[0]], result.sentences[0])
  assert best['rougeL'] == 1.0
  assert best['nerr'] == 1.0
  assert len(result.recoveries) == 2
  assert result.recoveries[1].beam_text != result.recoveries[0].beam_text
  assert result.recoveries[0].prior_score <= (
    result.recoveries[0].initial_prior_score
  )
  assert list(result.seconds) == ['bag', 'search', 'reorder']
  assert all(s > 0 for s in result.seconds.values())


def frozen_gradient(model, params, sentence):
  """`(ids, grads)`: the client's gradient of `sentence` with the word
  embeddings frozen (FILM Sec. 5's defense)."""
  ids, mask = model.tokenizer.encode_batch([sentence], add_bos=True)
  grads = fl.client_gradient(
    model,
    params,
    jnp.asarray(ids),
    jnp.asarray(mask),
    defense=fl.freeze_embeddings(model),
  )
  return ids, grads


@pytest.mark.slow
def test_client_batches_are_padded_to_a_token_bucket():
  """The runner pads a client batch to a multiple of 8 tokens (one compiled
  gradient for many batches), within the model's longest sequence; the
  padding is masked and the gradient is the unpadded one to rounding."""
  model, params = memorising_model()  # n_positions = 32
  defense = fl.Defense()
  key = jax.random.key(0)
  grads, ids, mask = client.client_gradient(
    model, params, SECRETS[:2], defense, key
  )
  plain_ids, plain_mask = model.tokenizer.encode_batch(
    list(SECRETS[:2]), add_bos=True
  )
  assert plain_ids.shape[1] % 8 and ids.shape[1] % 8 == 0
  assert ids.shape[1] > plain_ids.shape[1]
  np.testing.assert_array_equal(ids[:, : plain_ids.shape[1]], plain_ids)
  np.testing.assert_array_equal(mask[:, : plain_ids.shape[1]], plain_mask)
  assert not mask[:, plain_ids.shape[1] :].any()
  assert client.true_tokens(ids, mask) == client.true_tokens(
    plain_ids, plain_mask
  )
  plain = fl.client_gradient(
    model,
    params,
    jnp.asarray(plain_ids),
    jnp.asarray(plain_mask),
    defense=defense,
    key=key,
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
    grads,
    plain,
  )
  # Never past the model's positions: 27 tokens on a 30-position model
  # pad to 30, not 32.
  short, short_params = gpt2.init_model(
    gpt2.GPT2Config.tiny(vocab_size=50257, n_positions=30),
    key=jax.random.key(1),
    tokenizer=model.tokenizer,
  )
  text = ' '.join(['word'] * 26)
  _, ids, _ = client.client_gradient(short, short_params, [text], defense, key)
  assert ids.shape[1] == 30


@pytest.mark.slow
def test_the_client_gradient_compiles_once_per_model_and_defense(monkeypatch):
  """The runner jits `fl.client_gradient` at each call; jax.jit's cache
  (function, static arguments, shapes) keeps that to one trace."""
  model, params = memorising_model()
  traces = []
  plain = fl.client_gradient

  @functools.wraps(plain)  # the same signature: `model` stays static
  def counted(*args, **kwargs):
    traces.append(kwargs.get('defense'))
    return plain(*args, **kwargs)

  monkeypatch.setattr(fl, 'client_gradient', counted)
  for texts in (SECRETS[:2], SECRETS[1:], SECRETS[::2]):
    _, ids, _ = client.client_gradient(
      model, params, texts, fl.Defense(), jax.random.key(0)
    )
    assert ids.shape == (2, 16)
  assert len(traces) == 1
  client.client_gradient(
    model, params, SECRETS[:2], fl.gradient_pruning(0.5), jax.random.key(0)
  )
  assert len(traces) == 2
  # Released, the gradient traces again; another kernel keeps its program.
  other = jax.jit(lambda x: x + 1)
  other(jnp.ones(2))
  client.release_gradient_programs()
  assert other._cache_size() == 1
  client.client_gradient(
    model, params, SECRETS[:2], fl.Defense(), jax.random.key(0)
  )
  assert len(traces) == 3


@pytest.mark.slow
def test_frozen_embeddings_hide_the_rows_but_not_the_first_layer():
  """FILM Sec. 5's defense empties ∇W, yet layer 0's gradient still spans
  the inputs (test 1 of the tied bag method), so the bag survives."""
  model, params = memorising_model()
  ids, grads = frozen_gradient(model, params, SECRETS[1])
  rows = get_path(grads, model.paths.word_embeddings)
  assert not np.asarray(rows).any()
  assert bow.extract_bag(model, params, grads, method='nonzero').ids.size == 0
  bag = bow.extract_bag(model, params, grads, method='tied')
  inputs = set(ids[0, :-1].tolist())  # the last token is only a target
  assert set(bag.ids.tolist()) == inputs


@pytest.mark.slow
def test_frozen_embeddings_end_to_end_with_sentence_ends():
  """With ∇W silent, the bag (inputs only) lacks the final '.', so the
  search adds the vocabulary's sentence ends: the sentence can end."""
  model, params = memorising_model()
  tok = model.tokenizer
  ids, grads = frozen_gradient(model, params, SECRETS[1])
  mask = np.ones_like(ids)
  period = tok.encode('.')[0]
  assert period == ids[0, -1] and period not in ids[0, :-1]
  config = film.FilmAttackConfig(
    beam=bs.BeamSearchConfig(num_beams=4, length=12),
    reorder=ro.ReorderConfig(phrase_steps=0, token_steps=0, num_candidates=4),
  )
  ends = film.pipeline.sentence_end_ids(tok)
  assert period in ends and all(tok.decode([i]).strip() in '.!?' for i in ends)

  def recover(gradient, sentence_ends='silent'):
    cfg = dataclasses.replace(config, sentence_ends=sentence_ends)
    return film.recover(
      model, params, gradient, config=cfg, key=jax.random.key(0)
    )

  with_ends = recover(grads)
  assert period in with_ends.sentence_ends
  assert period not in with_ends.bag.ids  # the bag is what the gradient gave
  assert with_ends.sentences[0] == SECRETS[1]
  without = recover(grads, 'never')
  assert without.sentence_ends == ()
  assert not without.sentences[0].endswith('.')
  # A gradient with embedding rows adds nothing.
  plain = fl.client_gradient(model, params, jnp.asarray(ids), jnp.asarray(mask))
  result = recover(plain)
  assert result.sentence_ends == ()
  # ... unless asked for, as the like-for-like undefended arm.
  always = recover(plain, 'always')
  assert set(always.sentence_ends) == set(ends) - set(always.bag.ids)
  assert always.sentence_ends
  with pytest.raises(Exception, match='unknown sentence_ends'):
    film.FilmAttackConfig(sentence_ends='sometimes')


SMOKE = dict(
  model=models.GPT2_TINY,
  batch_sizes=(2,),
  num_batches=1,
  train_steps=1,
  train_batch_size=4,
  learning_rate=1e-3,
  eval_fraction=0.0,
  num_beams=(2,),
  length=6,
  max_prompts=2,
  phrase_steps=1,
  token_steps=1,
  reorder_candidates=2,
  max_sentences=12,
)


@pytest.mark.slow
def test_experiment_frozen_embeddings_past_the_span_rank(tmp_path, monkeypatch):
  """At b = 8 the tiny model's 64-wide first layer sees more inputs than
  the span test can separate: an empty bag, a zero row, not a crash."""
  cfg = runner.FilmConfig(
    **{**SMOKE, 'batch_sizes': (1, 8), 'defenses': ('freeze',)}
  )
  released = []

  def counted(module, name):
    release = getattr(module, name)
    monkeypatch.setattr(
      module, name, lambda: released.append(name) or release()
    )

  counted(train_lib, 'release_programs')
  counted(client, 'release_gradient_programs')
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  # The training's programs go after the fine-tuning, the gradient's when
  # b changes: b = 1's beam search (b = 8 has no bag to search) is kept.
  assert released == ['release_programs', 'release_gradient_programs']
  search = pipeline.jitted(
    pipeline._beam_search, static_argnames=pipeline._BEAM_SEARCH_STATIC
  )
  assert search._cache_size() >= 1
  lines = (tmp_path / 'results.jsonl').read_text().splitlines()
  rows = {r['b']: r for r in map(json.loads, lines)}
  assert rows[1]['bag_size'] > 0 and rows[1]['span_rank'] < 0.9 * 64
  assert rows[8]['empty_bag'] and rows[8]['span_rank'] > 0.9 * 64
  assert rows[8]['rougeL'] == rows[8]['bag_recall'] == 0.0
  assert summary['rougeL@b=8,defense=freeze'] == 0.0


@pytest.mark.slow
def test_experiment_smoke_and_resume(tmp_path):
  cfg = runner.FilmConfig(**SMOKE)
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  rows = [
    json.loads(x) for x in (tmp_path / 'results.jsonl').read_text().splitlines()
  ]
  assert len(rows) == 1 and rows[0]['b'] == 2
  # The attack's stages, timed inside its attack_seconds (the bag was
  # extracted by the runner and handed to recover).
  stages = rows[0]['stage_seconds']
  assert set(stages) == {'bag', 'search', 'reorder'}
  assert 0 < sum(stages.values()) <= rows[0]['attack_seconds']
  # The summary is the one row's numbers (one batch).
  for name in ('bag_precision', 'bag_recall'):
    assert summary[f'{name}@b=2'] == rows[0][name]
  for name in ('rouge1', 'rouge2', 'rougeL', 'nerr'):
    assert 0 <= summary[f'{name}@b=2'] <= 1
  assert summary['bag_precision@b=2'] == 1.0
  assert len(rows[0]['originals']) == 2 and rows[0]['recovered']
  md = (tmp_path / 'summary.md').read_text()
  assert '| b=2 | 1 |' in md and 'paper' in md  # Table-10 layout
  assert (tmp_path / 'film_vs_batch_size.png').stat().st_size > 1000
  assert json.loads((tmp_path / 'config.json').read_text())['model'] == (
    models.GPT2_TINY
  )
  # A fine-tuning this short leaves no checkpoint (a resume redoes it).
  assert SMOKE['train_steps'] < training.CHECKPOINT_MIN_STEPS
  assert not (tmp_path / 'train').exists()
  # Resuming recomputes nothing and gives the same summary.
  again = film_exp.run_experiment(cfg, tmp_path, progress=False)
  assert again == summary
  assert len((tmp_path / 'results.jsonl').read_text().splitlines()) == 1
  # --grad_microbatch: the gradient one sentence at a time, same attack.
  chunked = film_exp.run_experiment(
    cfg, tmp_path / 'chunked', progress=False, microbatch=1
  )
  (row,) = [
    json.loads(x) for x in (tmp_path / 'chunked' / 'results.jsonl').open()
  ]
  assert row['recovered'] == rows[0]['recovered']
  assert row['bag_size'] == rows[0]['bag_size']
  assert chunked['rougeL@b=2'] == summary['rougeL@b=2']


@pytest.mark.slow
def test_experiment_early_stopping(tmp_path, monkeypatch):
  # Sec. 6.1: train "until the loss on the evaluation set increased". A
  # learning rate this large makes the held-out loss go up at once.
  monkeypatch.setattr(training, 'CHECKPOINT_MIN_STEPS', 1)  # state to read
  cfg = runner.FilmConfig(
    **{
      **SMOKE,
      'train_steps': 8,
      'eval_fraction': 0.25,
      'learning_rate': 0.5,
      'phrase_steps': 0,
      'token_steps': 0,
    },
    eval_every=1,
    early_stopping_patience=1,
    repetitions=3,
  )
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  state = train_lib.checkpoint_state(tmp_path / 'train')
  assert state['stopped_early'] and state['step'] < 8
  md = (tmp_path / 'summary.md').read_text()
  assert f't = {state["step"]} steps (early stopping)' in md
  # Sec. 4.5 / Table 3: recall and precision after the first k searches.
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert sorted(row['multi_by_iter'], key=int) == ['1', '3']
  assert row['multi_by_iter']['3']['recall'] == row['multi_recall']
  assert row['multi_by_iter']['1']['recall'] <= row['multi_recall']
  assert 'multi_recall@b=2,iter=1' in summary
  assert summary['multi_precision@b=2,iter=3'] == row['multi_precision']
  assert '| 2 | 3 | 1 |' in md and 'Table 3' in md
  # --attack_best: the lowest-eval-loss parameters (here the initial ones).
  best = dataclasses.replace(cfg, attack_best=True, repetitions=1)
  film_exp.run_experiment(best, tmp_path / 'best', progress=False)
  md = (tmp_path / 'best' / 'summary.md').read_text()
  assert f'attacked at step {state["best"]["step"]} (lowest eval loss)' in md


@pytest.mark.slow
def test_experiment_bag_mode_with_defenses(tmp_path):
  cfg = runner.FilmConfig(
    **{**SMOKE, 'batch_sizes': (2,)}, mode='bag', defenses=('none', 'dp:10')
  )
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  rows = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  # One row per (defense, method); the summary holds each row's numbers.
  assert sorted((r['defense'], r['method']) for r in rows) == [
    ('dp:10', 'dp'),
    ('none', 'norm'),
    ('none', 'norm_oracle'),
    ('none', 'tied'),
  ]
  for r in rows:
    for name in ('bag_precision', 'bag_recall'):
      key = f'{name}@b=2,defense={r["defense"]},method={r["method"]}'
      assert summary[key] == r[name]
  # Undefended, the tied span test finds the bag exactly on this model.
  assert summary['bag_precision@b=2,defense=none,method=tied'] == 1.0
  assert summary['bag_recall@b=2,defense=none,method=tied'] == 1.0
  # eps = 10 noise drowns this 2-sentence gradient: far below the clean bag.
  assert summary['bag_precision@b=2,defense=dp:10,method=dp'] < 0.5


@pytest.mark.slow
def test_experiment_utility_mode_trains_under_each_defense(tmp_path):
  defenses = ('none', 'freeze', 'prune:0.9', 'dp:1')
  cfg = runner.FilmConfig(
    **{**SMOKE, 'train_steps': 3, 'eval_fraction': 0.25, 'learning_rate': 0.01},
    mode='utility',
    defenses=defenses,
  )
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  rows = {
    r['defense']: r for r in map(json.loads, open(tmp_path / 'results.jsonl'))
  }
  assert sorted(rows) == sorted(('start', *defenses))
  ppl = {d: summary[f'test_perplexity@defense={d}'] for d in rows}
  # Three steps at lr 0.01 lower the held-out perplexity of the random
  # model; each defense trains another model.
  assert ppl['none'] < ppl['start']
  assert len({round(v, 6) for v in ppl.values()}) == len(ppl)
  assert rows['dp:1']['noise_multiplier'] > 1 and rows['none']['steps'] == 3
  # The frozen run trained everything but the (tied) embedding matrix.
  model, start = models.load_model(cfg.model, init=cfg.init, seed=cfg.seed)
  trained, trained_params = models.load(
    tmp_path / 'utility' / 'freeze' / 'model'
  )
  np.testing.assert_array_equal(
    model.word_embeddings(trained_params), model.word_embeddings(start)
  )
  md = (tmp_path / 'summary.md').read_text()
  assert '| dp:1 |' in md and '| 16.31 |' in md  # FILM Table 4b, ε = 1
  # Resuming recomputes nothing.
  assert film_exp.run_experiment(cfg, tmp_path, progress=False) == summary
  with pytest.raises(Exception, match='--mode=utility'):
    runner.FilmConfig(mode='utility', train_steps=0, eval_fraction=0.1)


def test_bad_defense_and_config_errors():
  with pytest.raises(Exception, match='bad defense'):
    client.parse_defense('prune:2')
  with pytest.raises(Exception, match='unknown --mode'):
    runner.FilmConfig(mode='nope')
  assert client.parse_defense('dp:8') == ('dp', 8.0)
  for bad in ('dpsigma:-0.1', 'dpsigma:inf', 'dpsigma:x', 'dp:0'):
    with pytest.raises(Exception, match='bad defense'):
      client.parse_defense(bad)
  # dpsigma:<σ> fixes the noise multiplier; σ = 0 is the clipping alone.
  dp_cfg = runner.FilmConfig(defenses=('dpsigma:0', 'dpsigma:0.25'))
  clip_only, no_noise = client.make_defense(
    None, 'dpsigma:0', dp_cfg, num_train=100, b=8
  )
  assert clip_only.uses_dp_sgd and not clip_only.needs_key
  assert no_noise == 0.0
  noisy, std = client.make_defense(
    None, 'dpsigma:0.25', dp_cfg, num_train=100, b=8
  )
  assert noisy.noise_multiplier == 0.25 and noisy.clip_norm == 1.0
  assert std == pytest.approx(0.25 / 8)
  cfg = runner.FilmConfig(batch_sizes=(1, 4), beta=(0.0, 1.0))
  keys = [p['key'] for p in runner.sweep_points(cfg)]
  assert keys[0] == {'b': 1, 'beta': 0.0} and len(keys) == 4
  assert dataclasses.replace(cfg, seed=1) != cfg


def test_first_batch_attacks_later_draws_and_split_is_a_record(tmp_path):
  """--first_batch=1 attacks the batch index 1 draws (not index 0's), and
  --split only labels config.json: the same config otherwise."""
  with pytest.raises(Exception, match='first_batch'):
    runner.FilmConfig(first_batch=-1)
  with pytest.raises(Exception, match='unknown --split'):
    runner.FilmConfig(split='train')
  cfg = runner.FilmConfig(**SMOKE, first_batch=1, split='test')
  assert cfg == dataclasses.replace(cfg, split='dev')
  film_exp.run_experiment(cfg, tmp_path, progress=False)
  (row,) = [json.loads(x) for x in (tmp_path / 'results.jsonl').open()]
  assert row['batch'] == 1
  first, second = (client.draw_batch(12, 2, i, 0) for i in (0, 1))
  assert first != second
  assert json.loads((tmp_path / 'config.json').read_text())['split'] == 'test'


def test_summary_with_entity_free_batches():
  # NERR is None where a batch has no named entity (--norequire_entity).
  cfg = runner.FilmConfig(**{**SMOKE, 'batch_sizes': (1,)})
  rows = [
    {
      'b': 1,
      'batch': i,
      'rouge1': 0.5,
      'rouge2': 0.25,
      'rougeL': 0.5,
      'nerr': nerr,
      'bag_precision': 1.0,
      'bag_recall': 1.0,
      'originals': ['A b.'],
      'match': 0,
      'recovered': ['A b.'],
    }
    for i, nerr in enumerate([None, 1.0, None])
  ]
  summary, md, _ = film_report.summarize(cfg, rows, {'num_train': 3})
  assert summary['nerr@b=1'] == 1.0
  assert summary['nerr_best@b=1'] == 1.0
  assert summary['rougeL_best@b=1'] == 0.5
  assert '[1]' in md


def test_frozen_embedding_table_and_one_panel_per_defense():
  cfg = runner.FilmConfig(
    **{**SMOKE, 'batch_sizes': (1, 64), 'defenses': ('none', 'freeze')}
  )

  def row(b, defense, rouge, recall, valid, rank):
    return {
      'b': b,
      'defense': defense,
      'batch': 0,
      'rouge1': rouge,
      'rouge2': rouge,
      'rougeL': rouge,
      'nerr': None,
      'bag_precision': 1.0,
      'bag_recall': recall,
      'true_bag_size': 600 if b == 64 else 12,
      'span_valid': valid,
      'span_rank': rank,
      'originals': ['A b.'],
      'match': 0,
      'recovered': ['A b.'],
    }

  rows = [
    row(1, 'none', 0.9, 1.0, True, 12),
    row(1, 'freeze', 0.8, 0.5, True, 12),
    row(64, 'none', 0.4, 0.9, False, 576),
    {**row(64, 'freeze', 0.0, 0.0, False, 1), 'empty_bag': True},
  ]
  extra = {'num_train': 3, 'hidden_size': 576}
  summary, md, figures = film_report.summarize(cfg, rows, extra)
  assert summary['rougeL@b=64,defense=freeze'] == 0.0
  assert summary['bag_recall@b=1,defense=freeze'] == 0.5
  table = md[md.index('## Frozen embeddings') :]
  assert (
    '| 1 | 1 | 1.000 / 1.000 | 1.000 / 0.500 | 0.90 | 0.80 | 1 of 1 | 12-12 | 0 of 1 |'
    in table
  )
  assert (
    '| 64 | 1 | 1.000 / 0.900 | 1.000 / 0.000 | 0.40 | 0.00 | 0 of 1 | 600-600 | 1 of 1 |'
    in table
  )
  assert '(the model width d = 576)' in table
  fig, _ = figures[0]
  titles = [ax.get_title() for ax in fig.axes]
  assert titles == ['defense: none', 'defense: freeze']
  # Without a frozen-embedding run there is no such section.
  plain = [r for r in rows if r['defense'] == 'none']
  _, md, _ = film_report.summarize(cfg, plain, {'num_train': 3})
  assert '## Frozen embeddings' not in md


# Flags that are not config fields (they do not change the results).
HAND_WRITTEN_FLAGS = {'workdir', 'mesh', 'grad_microbatch', *common.RUN_FLAGS}


def test_flags_are_the_config_fields():
  if 'grad_microbatch' not in flags.FLAGS:
    film_exp.define_flags()
  fields = {f.name: f for f in dataclasses.fields(runner.FilmConfig)}
  assert set(fields) <= set(flags.FLAGS)
  for name, field in fields.items():
    if name in ('data', 'seed'):  # common flags, same meaning everywhere
      continue
    if name == 'preset':  # the flag names the default preset (the field
      continue  # records it; None for a config built in code)
    default = flags.FLAGS[name].default
    expected = field.default
    if isinstance(expected, tuple):
      expected = [type(expected[0])(x) for x in expected]
      default = [type(expected[0])(x) for x in default]
    assert default == expected, name
  # Every flag the committed flagfiles set is a field or a hand-written flag.
  for path in pathlib.Path('experiments/configs').glob('film*.flags'):
    names = {
      line.split('=')[0].lstrip('-').removeprefix('no')
      for line in path.read_text().splitlines()
      if line.startswith('--')
    }
    assert names <= set(fields) | HAND_WRITTEN_FLAGS, (path, names)
  # The quickstart flagfile parses into the config it describes.
  try:
    flags.FLAGS(
      ['film', '--flagfile=experiments/configs/film_quickstart.flags']
    )
    cfg = config_flags.config_from_flags(runner.FilmConfig)
  finally:
    flags.FLAGS.unparse_flags()
  assert cfg.batch_sizes == (1, 4, 16) and cfg.num_beams == (8,)
  assert cfg.learning_rate == 3e-4 and cfg.beta == (1.0,)
  assert cfg.eval_fraction == 0.0 and cfg.max_sentences is None


def test_oracle_norm_threshold_and_batches():
  # Rows 0 and 2 are the true bag; row 3 has a larger norm than row 2, so
  # the best-F1 cut takes the top 3 (P 2/3, R 1) over the top 1 (P 1, R 1/2).
  rows = np.array([[5.0, 0], [0, 0.1], [1.0, 0], [0, 2.0]])
  p, r = bag_only.oracle_norm_threshold(rows, {0, 2})
  assert (p, r) == pytest.approx((2 / 3, 1.0))
  assert bag_only.oracle_norm_threshold(rows, {0}) == (1.0, 1.0)
  a = client.draw_batch(10, 4, 0, seed=0)
  assert a == client.draw_batch(10, 4, 0, seed=0) == sorted(set(a))
  assert a != client.draw_batch(10, 4, 1, seed=0) and len(a) == 4


def test_preprocess_appendix_b1():
  tok = gpt2_tokenizer()
  cfg = runner.FilmConfig(batch_sizes=(1,), require_entity=False, max_tokens=6)
  texts = ['Short one. Short one. This sentence is far too long to keep.']
  assert runner.private_sentences(cfg, texts, tok) == ['Short one.']
  ppl = lambda ts: np.array([10.0] * len(ts))
  strict = dataclasses.replace(cfg, max_perplexity=5.0)
  with pytest.raises(Exception, match='survive preprocessing'):
    runner.private_sentences(strict, texts, tok, ppl)


@pytest.mark.slow
def test_paper_table3_counts_match_the_runner():
  assert tuple(film_tables.PAPER_TABLE3) == runner.MULTI_SENTENCE_COUNTS


def test_heartbeat_fills_silent_stages(monkeypatch):
  lines = []
  monkeypatch.setattr(
    stages.logging, 'info', lambda fmt, *args: lines.append(fmt % args)
  )
  with stages.Heartbeat(every=0.2) as beat:
    beat.stage = 'compiling'
    time.sleep(0.7)
  assert lines and all('compiling: still working' in x for x in lines)
  stages.return_freed_memory()  # glibc's malloc_trim, or nothing
