"""The audit: its config refuses bad input before work, and on the same
inputs its numbers are the attack packages' own (one case per artefact)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import audit as audit_exp
from leakjax import audit, io, models
from leakjax.attacks.dager import client as dager_client
from leakjax.attacks.dager import runner as dager_runner
from leakjax.attacks.differential import rank_search
from leakjax.attacks.inversion import bei_hei, softmax_inverse
from leakjax.attacks.inversion import scoring as inversion_scoring
from leakjax.audit import runner
from leakjax.errors import LeakjaxError


def tiny(**changes) -> audit.AuditConfig:
  values = dict(
    model='gpt2-tiny',
    max_tokens=20,
    artefacts=('gradient', 'update', 'hidden', 'snapshot'),
    batch_sizes=(1, 2),
    defenses=('none', 'dp:8', 'noise:1e-3'),
    layers=('0', 'last'),
    local_steps=2,
    finetune_steps=2,
    finetune_batch_size=4,
    utility_seeds=2,
    film_beams=2,
    film_steps=1,
    snapshot_beams=4,
    snapshot_length=3,
    attacker_samples=0,  # a random model writes no sentence
  )
  values.update(changes)
  return audit.AuditConfig(**values)


@pytest.mark.parametrize(
  'changes, message',
  [
    (dict(artefacts=('gradient', 'logits')), "unknown artefact 'logits'"),
    (dict(defenses=('clip:3',)), "unknown defense 'clip:3'"),
    (dict(defenses=('dp:0',)), "unknown defense 'dp:0'"),
    (dict(defenses=('prune:1.5',)), "unknown defense 'prune:1.5'"),
    (dict(defenses=('none', 'freeze', 'freeze')), 'named twice'),
    (dict(layers=('middle',)), "bad layer 'middle'"),
    (dict(batch_sizes=(0, 4)), 'must be at least 1'),
    (dict(heldout_fraction=1.0), 'heldout_fraction'),
    (dict(finetune_steps=0), 'finetune_steps=0'),
  ],
)
def test_bad_settings_fail_when_the_config_is_built(changes, message):
  with pytest.raises(LeakjaxError, match=message):
    tiny(**changes)


def test_cells_leave_out_what_a_defense_does_not_change():
  cfg = tiny(
    artefacts=('gradient', 'hidden', 'snapshot'),
    batch_sizes=(4,),
    defenses=('dp:8', 'freeze', 'noise:1e-6'),
    layers=('3',),
  )
  # `none` is the baseline of every comparison: added first.
  assert cfg.defenses == ('none', 'dp:8', 'freeze', 'noise:1e-6')
  assert cfg.cells() == [
    ('gradient', 4, 'none'),
    ('gradient', 4, 'dp:8'),
    ('gradient', 4, 'freeze'),
    ('gradient', 4, 'noise:1e-6'),
    # Training defenses do not act on hidden states sent at inference.
    ('hidden:3', 4, 'none'),
    ('hidden:3', 4, 'noise:1e-6'),
    # A released model is not a noisy message.
    ('snapshot', 0, 'none'),
    ('snapshot', 0, 'dp:8'),
    ('snapshot', 0, 'freeze'),
  ]
  units = runner.units(cfg)
  # The snapshot pair is the first seed's fine-tuning: utility runs first.
  assert units[0] == ('utility', 'none', 0)
  assert len(units) == 9 + 4 * cfg.utility_seeds


def test_too_small_a_corpus_and_a_missing_layer_fail_before_work(tmp_path):
  cfg = tiny(batch_sizes=(64,))
  model, _ = models.load_model('gpt2-tiny')
  with pytest.raises(LeakjaxError, match='the batches need 64'):
    runner.split_sentences(cfg, ['a sentence'] * 60)
  with pytest.raises(LeakjaxError, match='layer 5 is past'):
    runner.check_model(tiny(layers=('5',)), model)
  # Through the entry point: nothing is written.
  with pytest.raises(LeakjaxError, match='the batches need 64'):
    audit_exp.run_experiment(cfg, tmp_path / 'w', progress=False)
  assert not (tmp_path / 'w' / 'results.jsonl').exists()


def test_splits_are_disjoint_where_they_must_be():
  cfg = tiny(batch_sizes=(4,), num_batches=2)
  sentences = [f's{i}' for i in range(20)]
  splits = runner.split_sentences(cfg, sentences)
  assert splits.heldout == sentences[16:]  # ceil(0.2 * 20)
  assert splits.train == sentences[:16]
  assert splits.attacker == sentences[8:16]  # after the attacked 2 x 4
  assert not set(splits.heldout) & set(splits.train)


FILM_CALLS = []


def _film_stand_in(num_beams, steps):
  # FILM's pipeline needs a longer context than the small GPT-2's 64
  # positions once noise claims every position (its own tests run it on
  # SmolLM2); here it stands in, recording where the audit calls it.
  del num_beams, steps

  def recover(model, params, grads, *, key, mesh=None):
    FILM_CALLS.append(key)
    return ['Alice Martin moved to Paris in 2019.']

  return recover


@pytest.fixture(scope='module')
def tiny_audit(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('audit')
  cfg = tiny()
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(runner.film, 'baseline', _film_stand_in)
    # The softmax inverse's training at its default 150 steps over GPT-2's
    # 50,257 tokens was half the fixture's time; 10 steps run the same path.
    fit = softmax_inverse.fit
    short = softmax_inverse.SoftmaxInverseConfig(steps=10)
    patch.setattr(
      softmax_inverse, 'fit', lambda *a, **k: fit(*a, config=short, **k)
    )
    summary = audit_exp.run_experiment(cfg, workdir, progress=False)
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  return cfg, workdir, summary, rows


def _row(rows, **match):
  found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
  assert len(found) == 1, (match, len(found))
  return found[0]


@pytest.mark.slow
def test_the_audit_writes_its_report_and_resumes(tiny_audit):
  cfg, workdir, summary, rows = tiny_audit
  # A random 2-layer GPT-2 below the rank limit: DAGER reads the gradient
  # back whole, and no weaker attack runs after it.
  assert summary['exact@artefact=gradient,b=1,defense=none'] == 1.0
  assert summary['attack@artefact=gradient,b=1,defense=none'] == 'dager'
  assert not [
    r
    for r in rows
    if r['kind'] == 'attack'
    and r['artefact'] == 'gradient'
    and r['defense'] == 'none'
    and r['attack'] != 'dager'
  ]
  # Where DAGER fails (DP noise), FILM runs next, on the same gradient.
  dp_cells = {
    (r['artefact'], r['b'])
    for r in rows
    if r['kind'] == 'attack'
    and r['defense'] == 'dp:8'
    and r['b']
    and not r['artefact'].startswith('hidden')
  }
  film_rows = [r for r in rows if r.get('attack') == 'film']
  assert {(r['artefact'], r['b']) for r in film_rows} <= dp_cells | {
    (r['artefact'], r['b'])
    for r in rows
    if r['kind'] == 'attack' and r['defense'] == 'noise:1e-3'
  }
  assert len(FILM_CALLS) == len(film_rows) > 0
  # Layer 0 is the embedding: HEI reads it back.
  assert summary['exact@artefact=hidden:0,b=2,defense=none'] == 1.0
  # Past it the exact search (Nikolaou et al.) does, where HEI cannot.
  assert summary['exact@artefact=hidden:last,b=2,defense=none'] == 1.0
  last = [
    r['attack']
    for r in rows
    if r['kind'] == 'attack'
    and r['artefact'] == 'hidden:last'
    and r['b'] == 2
    and r['defense'] == 'none'
  ]
  assert last[-1] == 'exact' and 'hei' in last
  for d in cfg.defenses:
    assert summary[f'perplexity_after@defense={d}'] > 0
  assert summary['perplexity_before'] > 0
  utility = [r for r in rows if r['kind'] == 'utility']
  assert len(utility) == len(cfg.defenses) * cfg.utility_seeds
  dp = [r for r in utility if r['defense'] == 'dp:8']
  assert all(r['sigma'] > 0 for r in dp)
  facts = json.loads((workdir / 'facts.json').read_text())
  assert facts['sigma']['dp:8'] == dp[0]['sigma']
  assert facts['num_layers'] == 2
  html = (workdir / 'report.html').read_text()
  assert 'id="answer"' in html and 'id="frontier"' in html
  # Resuming computes nothing new.
  again = audit_exp.run_experiment(cfg, workdir, progress=False)
  assert again == summary
  assert len((workdir / 'results.jsonl').read_text().splitlines()) == len(rows)


@pytest.mark.slow
def test_gradient_and_update_numbers_are_dagers(tiny_audit):
  cfg, _, _, rows = tiny_audit
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  sentences = runner.split_sentences(
    cfg,
    dager_runner.private_sentences(
      runner.dager_config(cfg), runner.load_texts(cfg), model.tokenizer
    ),
  ).sentences
  # The gradient: DAGER's experiment on the same batch (its `strongest`
  # preset, no defense).
  dcfg = runner.dager_config(cfg)
  mine = _row(
    rows, artefact='gradient', b=2, batch=0, defense='none', attack='dager'
  )
  theirs = dager_runner.attack_batch(
    model, params, sentences[:2], 2, 0, 'none', 'dager', dcfg
  )
  for key in ('exact', 'rougeL', 'rouge1', 'recovered'):
    assert mine[key] == theirs[key], key
  # The update: DAGER's FedAvg defense at the same local steps and rate.
  dcfg = runner.dager_config(cfg)
  import dataclasses  # pylint: disable=g-import-not-at-top

  dcfg = dataclasses.replace(dcfg, fedavg_lr=cfg.local_learning_rate)
  mine = _row(
    rows, artefact='update', b=2, batch=0, defense='none', attack='dager'
  )
  theirs = dager_runner.attack_batch(
    model, params, sentences[:2], 2, 0, 'fedavg:1:1', 'dager', dcfg
  )
  for key in ('exact', 'rougeL', 'rouge1', 'recovered'):
    assert mine[key] == theirs[key], key


@pytest.mark.slow
def test_hidden_and_snapshot_numbers_are_the_papers(tiny_audit):
  cfg, _, _, rows = tiny_audit
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  dcfg = runner.dager_config(cfg)
  sentences = dager_runner.private_sentences(
    dcfg, runner.load_texts(cfg), model.tokenizer
  )
  # Hidden states: Wan et al.'s BEI on the last layer, scored as the
  # inversion experiment scores it.
  texts = sentences[:2]
  ids, mask = dager_client.padded_batch(model, texts, cfg.max_tokens + 1)
  states = bei_hei.layer_states(
    model, params, jnp.asarray(ids), jnp.asarray(mask), ('last',)
  )[0]
  bei = np.asarray(bei_hei.bei_ids(model, params, states))
  score_mask = mask.copy()
  score_mask[:, 0] = 0
  scores = inversion_scoring.score_texts(
    bei_hei.decode_ids(model.tokenizer, bei, score_mask),
    bei_hei.decode_ids(model.tokenizer, ids, score_mask),
  )
  mine = _row(rows, artefact='hidden:last', b=2, defense='none', attack='bei')
  assert mine['rouge1'] == pytest.approx(float(np.mean(scores['rouge1'])))
  # The snapshot: Algorithm 1 between the model and its fine-tuned self;
  # the fine-tuning is the first seed's utility run, redone here.
  splits = runner.split_sentences(cfg, sentences)
  tuned, row = audit.utility.fine_tune(
    model, params, splits.train, splits.heldout, 'none', cfg, cfg.seed
  )
  assert (
    row['ppl_after']
    == _row(rows, kind='utility', defense='none', seed=cfg.seed)['ppl_after']
  )
  result = rank_search.rank_beam_search(
    model,
    model,
    params,
    tuned,
    jnp.asarray([model.tokenizer.bos_id], jnp.int32),
    widths=(cfg.snapshot_beams,) * cfg.snapshot_length,
    length=cfg.snapshot_length,
  )
  best = model.tokenizer.decode(np.asarray(result.sequences[0][0]).tolist())
  mine = _row(rows, artefact='snapshot', defense='none')
  assert mine['recovered'][0] == best
  assert math.isfinite(mine['rougeL'])


def test_dp_noise_is_calibrated_for_the_fine_tuning_run():
  cfg = tiny(finetune_steps=100, finetune_batch_size=8)
  sigma = audit.client.noise_multiplier(cfg, 8.0, num_train=400)
  from leakjax import fl  # pylint: disable=g-import-not-at-top

  assert fl.epsilon(sigma, 8 / 400, 100, cfg.dp_delta) <= 8.0
  assert fl.epsilon(sigma * 0.99, 8 / 400, 100, cfg.dp_delta) > 8.0
  assert audit.client.local_batch(cfg, 16) == 8
  assert audit.client.local_batch(cfg, 1) == 1


def test_hidden_noise_changes_the_states_by_its_std():
  h = jnp.zeros((2, 3, 4))
  out = audit.hidden.noisy(h, 0.5, jax.random.key(0))
  assert out.shape == h.shape
  assert 0.2 < float(jnp.std(out)) < 0.8
  assert io.summary_key('exact', artefact='hidden:0', b=1, defense='none') == (
    'exact@artefact=hidden:0,b=1,defense=none'
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  'flag, message',
  [
    ('--defenses=none,clip:3', "unknown defense 'clip:3'"),
    ('--artefacts=logits', "unknown artefact 'logits'"),
    ('--batch_sizes=64', 'the batches need 64'),
    ('--layers=7', 'layer 7 is past'),
  ],
)
def test_the_command_refuses_bad_input_in_one_line(tmp_path, flag, message):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  done = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.audit',
      '--model=gpt2-tiny',
      f'--workdir={tmp_path / "w"}',
      '--layers=0',
      flag,
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=str(pytest.importorskip('pathlib').Path(__file__).parents[1]),
  )
  assert done.returncode == 2
  errors = [x for x in done.stderr.splitlines() if x.startswith('leakjax:')]
  assert len(errors) == 1 and message in errors[0]
  assert not (tmp_path / 'w' / 'results.jsonl').exists()
