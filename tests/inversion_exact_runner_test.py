"""The exact-inversion experiment: its config and perturbations refuse bad
input, the perturbations do what they say, the splits are disjoint, and a
tiny Llama's states are read back exactly, resumably, into a report."""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import inversion_exact as experiment
from experiments import inversion_exact_report as report
from leakjax import io
from leakjax.attacks.inversion import dct, exact_runner
from leakjax.attacks.inversion import exact_perturb as perturb
from leakjax.errors import LeakjaxError
from leakjax.models import llama
from leakjax.tokenization import WordTokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
WORDS = (
  'meeting contract price market weather report team office project budget'
  ' plan call email schedule client review data energy power gas deal trade'
  ' monday friday lunch room agenda notes draft final'
).split()


def sentences(n: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  return [' '.join(rng.choice(WORDS, rng.integers(3, 10))) for _ in range(n)]


def tokenizer() -> WordTokenizer:
  return WordTokenizer.build([' '.join(WORDS)], len(WORDS) + 2)


@functools.lru_cache(maxsize=None)
def tiny_llama():
  tok = tokenizer()
  config = llama.LlamaConfig(
    vocab_size=tok.vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    tie_word_embeddings=True,
  )
  model, params = llama.init_model(config, key=jax.random.key(0), tokenizer=tok)
  # A random model barely mixes its residual stream: HEI would read every
  # layer back. Blocks writing 10x more make the deep states hard to read
  # in one shot (HEI about 0.05 at layer 2), so the search has work to do.
  louder = lambda path, x: x * 10 if _writes(path) else x
  return model, jax.tree_util.tree_map_with_path(louder, params)


def _writes(path) -> bool:
  return any(getattr(k, 'key', '') in ('o_proj', 'down_proj') for k in path)


def write_corpora(folder: pathlib.Path) -> tuple[str, ...]:
  (folder / 'a.json').write_text(json.dumps(sentences(40, 0)))
  (folder / 'b.txt').write_text('\n'.join(sentences(30, 1)))
  return (f'a={folder / "a.json"}', f'b={folder / "b.txt"}')


def config(corpora=('a=x.json', 'b=y.txt'), **changes):
  values = dict(
    model='tiny',
    corpora=corpora,
    attacker_corpus='a',
    num_attacker=12,
    num_dev=2,
    num_test=3,
    max_length=8,
    layers=('2', 'last'),
    perturbations=('none', 'noise:0.001', 'dct:1'),
    ep_steps=40,
  )
  values.update(changes)
  return exact_runner.ExactRunConfig(**values)


# ----------------------------------------------------------------- config
@pytest.mark.parametrize(
  'changes, message',
  [
    (dict(attacker_corpus='c'), 'is not one of the corpora'),
    (dict(splits=('train',)), "bad --splits entry 'train'"),
    (dict(splits=('dev',), num_dev=0), 'needs --num_dev'),
    (dict(splits=()), '--splits is empty'),
    (dict(layers=('middle',)), "bad --layers entry 'middle'"),
    (dict(layers=('2', '2')), 'names an entry twice'),
    (dict(max_candidates=0), 'max_candidates=0'),
    (dict(noise_rule='gap'), 'noise_rule=gap'),
    (dict(num_attacker=0), 'num_attacker=0'),
    (dict(ep_steps=0), 'ep_steps=0'),
    (dict(perturbations=('blur',)), "unknown perturbation 'blur'"),
    (dict(perturbations=()), '--perturbations is empty'),
  ],
)
def test_bad_settings_fail_when_the_config_is_built(changes, message):
  with pytest.raises(LeakjaxError, match=message):
    config(**changes)


@pytest.mark.parametrize(
  'spec',
  [
    'noise',
    'noise:0',
    'noise:-1',
    'noise:x',
    'noise:inf',
    'dct',
    'dct:0',
    'dct:1.5',
    'bf16:2',
    'none:1',
    'fp8',
  ],
)
def test_bad_perturbation_specs_are_refused(spec):
  with pytest.raises(LeakjaxError):
    perturb.parse(spec)


def test_perturbation_specs_parse_to_their_rule_and_key():
  none, noise, bf16, int8, dct1 = perturb.parse_all(
    ['none', 'noise:0.01', 'bf16', 'int8', 'dct:1']
  )
  assert none.rule == 'tolerance' and none.summary_params() == {}
  assert noise == perturb.Perturbation('noise:0.01', 'noise', 0.01)
  assert {p.rule for p in (noise, bf16, int8, dct1)} == {'nearest'}
  assert noise.summary_params() == {'noise': '0.01'}
  assert int8.summary_params() == {'rounding': 'int8'}
  assert dct1.summary_params() == {'defense': 'dct:1'}
  with pytest.raises(LeakjaxError, match='named twice'):
    perturb.parse_all(['noise:0.01', 'noise:1e-2'])
  cfg = config(max_candidates=50)
  # Gaussian noise: the calibrated rule unless asked otherwise; the other
  # perturbations are not Gaussian, so the gap rule.
  assert cfg.exact_config(noise).rule == 'calibrated'
  assert {cfg.exact_config(p).rule for p in (bf16, int8, dct1)} == {'nearest'}
  assert config(noise_rule='nearest').exact_config(noise).rule == 'nearest'
  assert cfg.exact_config(none).max_candidates == 50


# ---------------------------------------------------------- perturbations
def test_int8_round_trip_moves_each_coordinate_by_at_most_half_a_step():
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(3, 5, 64)) * rng.uniform(0.1, 50, (3, 5, 1))).astype(
    np.float32
  )
  x[0, 0] = 0.0  # an all-zero position stays zero
  out = perturb.int8_round_trip(x)
  step = np.abs(x).max(-1, keepdims=True) / 127
  assert np.all(np.abs(out - x) <= step / 2 + 1e-6 * np.abs(x).max())
  assert np.all(out[0, 0] == 0)
  assert np.any(out != x)
  # At most 255 levels per position, the absmax coordinate exact.
  assert len(np.unique(out[1, 2])) <= 255
  np.testing.assert_allclose(np.abs(out).max(-1), np.abs(x).max(-1), rtol=1e-6)


def test_bf16_round_trip_keeps_8_bits_of_mantissa():
  x = np.random.default_rng(1).normal(size=(4, 6, 32)).astype(np.float32)
  out = perturb.bf16_round_trip(x)
  assert out.dtype == np.float32 and np.any(out != x)
  assert np.all(np.abs(out - x) <= 2.0**-8 * np.abs(x))
  np.testing.assert_array_equal(perturb.bf16_round_trip(out), out)


def test_noise_is_relative_to_the_layers_rms():
  rng = np.random.default_rng(2)
  mask = np.ones((4, 50), np.int32)
  mask[:, 0] = 0  # the BOS position: not in the rms
  small = rng.normal(size=(4, 50, 64)).astype(np.float32)
  small[:, 0] = 1e4  # an outsized BOS state
  big = 100 * small
  p = perturb.parse('noise:0.1')
  key = jax.random.key(0)
  std = []
  for states in (small, big):
    observed, facts = perturb.apply(p, states, mask, key=key, seed=0)
    rms = np.sqrt(np.mean(states[:, 1:] ** 2))
    assert facts['noise_std'] == pytest.approx(0.1 * rms, rel=1e-5)
    std.append(float(np.std(observed - states)))
    assert std[-1] == pytest.approx(0.1 * rms, rel=0.05)
  assert std[1] == pytest.approx(100 * std[0], rel=1e-4)  # same draw, scaled


def test_dct_and_none_perturbations():
  states = np.random.default_rng(3).normal(size=(2, 4, 32)).astype(np.float32)
  mask = np.ones((2, 4), np.int32)
  key = jax.random.key(1)
  same, facts = perturb.apply(
    perturb.parse('none'), states, mask, key=key, seed=0
  )
  np.testing.assert_array_equal(same, states)
  assert facts == {}
  got, _ = perturb.apply(perturb.parse('dct:2'), states, mask, key=key, seed=5)
  defense = dct.make_dct_defense(
    32, 2, key=jax.random.fold_in(jax.random.key(5), 2)
  )
  want = dct.apply_dct_defense(jnp.asarray(states), defense.overlap)
  np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)
  assert not np.allclose(got, states)


# ----------------------------------------------------------------- splits
def test_dev_test_and_attacker_texts_are_disjoint():
  tok = tokenizer()
  corpora = {'a': sentences(60, 0), 'b': sentences(40, 1)}
  cfg = config(num_test=6, num_dev=5, num_attacker=20)
  drawn = exact_runner.draw_texts(cfg, tok, corpora)
  seqs = {}
  for split in ('dev', 'test'):
    for name in 'ab':
      data = drawn.splits[split][name]
      assert len(data.texts) == cfg.split_size(split)
      assert data.ids.shape == (len(data.texts), cfg.max_length + 1)
      assert np.all(data.ids[:, 0] == tok.bos_id)
      assert np.all(data.score_mask[:, 0] == 0)
      seqs[(split, name)] = {
        tuple(row[m.astype(bool)]) for row, m in zip(data.ids, data.mask)
      }
  attacker = drawn.attacker
  seqs['attacker'] = {
    tuple(row[m.astype(bool)]) for row, m in zip(attacker.ids, attacker.mask)
  }
  assert len(seqs['attacker']) == 20
  groups = list(seqs.values())
  for i, one in enumerate(groups):
    for other in groups[i + 1 :]:
      assert not one & other
  # Choosing num_dev or num_attacker leaves the test texts as they were.
  again = exact_runner.draw_texts(
    config(num_test=6, num_dev=2, num_attacker=3), tok, corpora
  )
  assert again.splits['test']['a'].texts == drawn.splits['test']['a'].texts
  assert again.splits['dev']['a'].texts == drawn.splits['dev']['a'].texts[:2]
  with pytest.raises(LeakjaxError, match='too few usable texts'):
    exact_runner.draw_texts(config(num_attacker=100), tok, corpora)


# -------------------------------------------------------------- end to end
@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  folder = tmp_path_factory.mktemp('exact')
  cfg = config(corpora=write_corpora(folder))
  model, params = tiny_llama()
  workdir = folder / 'w'
  summary = experiment.run_experiment(
    cfg, workdir, progress=False, model=model, params=params
  )
  rows = [json.loads(x) for x in (workdir / 'results.jsonl').open()]
  return cfg, workdir, summary, rows


@pytest.mark.slow
def test_a_tiny_llama_is_read_back_exactly(tiny_run):
  cfg, workdir, summary, rows = tiny_run
  assert len(rows) == len(exact_runner.cells(cfg)) * len(exact_runner.ATTACKS)
  assert {r['split'] for r in rows} == {'test'}
  for name in 'ab':
    for layer in cfg.layers:
      at = f'attack=exact,data={name},layer={layer},split=test'
      assert summary[f'exact@{at}'] == 1.0
      assert summary[f'rouge1@{at}'] == 1.0
      assert summary[f'undecided@{at}'] == 0.0
      assert summary[f'candidates_per_token@{at}'] >= 1
      assert summary[f'seconds_per_sentence@{at}'] > 0
    assert summary[f'num_texts@data={name},split=test'] == 3
  assert summary['num_attacker'] == 12
  for key in (
    'rouge1@attack=ridge,data=a,layer=2,noise=0.001,split=test',
    'exact@attack=exact,data=b,defense=dct:1,layer=last,split=test',
    'rougeL@attack=bei,data=a,layer=last,split=test',
    'rouge1@attack=ep_skip,data=b,defense=dct:1,layer=2,split=test',
  ):
    assert 0 <= summary[key] <= 1, key
  # The one-shot reads miss what the search recovers, checking beyond
  # the first proposal where the ridge inverse's guess was wrong.
  assert summary['exact@attack=ridge,data=b,layer=2,split=test'] < 1
  assert summary['rouge1@attack=hei,data=a,layer=2,split=test'] < 0.5
  plain = [
    r for r in rows if r['attack'] == 'exact' and r['perturbation'] == 'none'
  ]
  assert max(r['candidates_max'] for r in plain) > 1
  exact_row = next(r for r in rows if r['attack'] == 'exact')
  assert exact_row['recovered'] == exact_row['references']
  assert exact_row['candidates_max'] >= exact_row['candidates_per_token']
  noisy = [r for r in rows if r['perturbation'] == 'noise:0.001']
  assert all(r['noise_std'] > 0 for r in noisy)
  assert json.loads((workdir / 'summary.json').read_text()) == summary


@pytest.mark.slow
def test_the_report_renders_its_tables(tiny_run):
  cfg, workdir, _, _ = tiny_run
  text = (workdir / 'summary.md').read_text()
  assert '## Split: test (3 a, 3 b texts), unperturbed' in text
  assert '| a | 2 | 1.000 | 1.000 |' in text
  assert '| ROUGE-1 softmax | ROUGE-1 EP | ROUGE-1 ridge |' in text
  assert '## Perturbed states' in text
  assert '| test | b | last | dct:1 |' in text
  assert '## Recovered texts (exact search)' in text
  # Without perturbed cells there is no perturbation table.
  run = exact_runner.ExactRun(
    [], {**json.loads((workdir / 'facts.json').read_text())}
  )
  plain = report.markdown(config(perturbations=('none',)), run)
  assert '## Perturbed states' not in plain
  assert '## Cells not run (4: the run was cut short' in plain


@pytest.mark.slow
def test_a_run_cut_short_is_summarised_from_its_rows(tiny_run, tmp_path):
  _, workdir, summary, _ = tiny_run
  for name in ('config.json', 'results.jsonl', 'facts.json'):
    (tmp_path / name).write_text((workdir / name).read_text())
  lines = (tmp_path / 'results.jsonl').read_text().splitlines()
  cut = [
    x
    for x in lines
    if not (json.loads(x)['data'] == 'b' and json.loads(x)['layer'] == 'last')
  ]
  assert len(cut) < len(lines)
  (tmp_path / 'results.jsonl').write_text(''.join(x + '\n' for x in cut))
  got = report.rerender(tmp_path)
  assert json.loads((tmp_path / 'summary.json').read_text()) == got
  assert 'exact@attack=exact,data=b,layer=last,split=test' not in got
  kept = {
    k: v
    for k, v in summary.items()
    if 'data=b' not in k or 'layer=last' not in k
  }
  assert {k: v for k, v in got.items() if k in kept} == kept
  text = (tmp_path / 'summary.md').read_text()
  assert 'test b layer last none' in text and '| b | last |' not in text
  with pytest.raises(LeakjaxError, match='does not exist'):
    report.rerender(tmp_path / 'nowhere')


@pytest.mark.slow
def test_a_rerun_skips_the_finished_rows(tiny_run, monkeypatch):
  cfg, workdir, summary, rows = tiny_run
  # Drop the last cell's BEI row: only it is recomputed, never a search.
  lines = (workdir / 'results.jsonl').read_text().splitlines()
  dropped = [
    i
    for i, x in enumerate(lines)
    if json.loads(x)['attack'] == 'bei'
    and json.loads(x)['perturbation'] == 'dct:1'
    and json.loads(x)['data'] == 'b'
    and json.loads(x)['layer'] == 'last'
  ]
  assert len(dropped) == 1
  del lines[dropped[0]]
  (workdir / 'results.jsonl').write_text(''.join(x + '\n' for x in lines))

  def no_search(*args, **kwargs):
    raise AssertionError('a finished exact row was recomputed')

  monkeypatch.setattr(exact_runner.exact, 'invert', no_search)
  model, params = tiny_llama()
  before = json.loads((workdir / 'facts.json').read_text())['seconds']
  again = experiment.run_experiment(
    cfg, workdir, progress=False, model=model, params=params
  )
  assert again == summary
  # facts.json's seconds add the resuming invocation's to the run's.
  after = json.loads((workdir / 'facts.json').read_text())['seconds']
  assert after > before
  assert len((workdir / 'results.jsonl').read_text().splitlines()) == len(rows)


@pytest.mark.slow
def test_a_run_split_over_a_mesh_reads_the_same(tmp_path, mesh):
  cfg = config(
    corpora=write_corpora(tmp_path), layers=('2',), perturbations=('none',)
  )
  model, params = tiny_llama()
  got = {}
  for name, where in (('one', None), ('split', mesh)):
    summary = experiment.run_experiment(
      cfg,
      tmp_path / name,
      progress=False,
      model=model,
      params=params,
      mesh=where,
    )
    got[name] = {k: v for k, v in summary.items() if 'seconds' not in k}
  assert got['split'] == got['one']
  assert got['one']['exact@attack=exact,data=a,layer=2,split=test'] == 1.0


# ------------------------------------------------------------------ flags
def parsed(values, argv) -> exact_runner.ExactRunConfig:
  values.unparse_flags()
  values(argv)
  return experiment.config_from_flags()


@pytest.mark.parametrize(
  'name',
  [
    'inversion_exact_quick.flags',
    'inversion_exact.flags',
    'inversion_exact_robust.flags',
    'inversion_exact_robust_unbounded.flags',
    'inversion_exact_noise.flags',
  ],
)
def test_the_flagfiles_parse_to_their_configs(fresh_flags, name):
  experiment.define_flags()
  path = REPO / 'experiments' / 'configs' / name
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={path}'])
  assert cfg.model == 'smollm2-135m' and cfg.splits == ('test',)
  assert '# Expected headline: see reports/inversion_exact/README.md' in (
    path.read_text()
  )
  if name == 'inversion_exact_quick.flags':
    assert cfg == exact_runner.ExactRunConfig(
      corpora=('enron=film-enron',),
      num_attacker=200,
      num_test=4,
      num_dev=8,
      layers=('10', '25'),
      perturbations=('none', 'noise:0.01'),
      max_length=24,
      noise_rule='nearest',
    )
    assert len(exact_runner.cells(cfg)) == 4
  elif name == 'inversion_exact.flags':
    assert cfg == exact_runner.ExactRunConfig()
    assert len(exact_runner.cells(cfg)) == 15
  elif name == 'inversion_exact_robust.flags':
    assert cfg == exact_runner.ExactRunConfig(
      num_test=16,
      layers=('25',),
      max_candidates=1024,
      perturbations=(
        'noise:0.001',
        'noise:0.01',
        'noise:0.05',
        'noise:0.1',
        'bf16',
        'int8',
        'dct:1',
      ),
      noise_rule='nearest',
    )
    assert len(exact_runner.cells(cfg)) == 21
  elif name == 'inversion_exact_noise.flags':
    assert cfg == exact_runner.ExactRunConfig(
      num_test=8,
      num_dev=24,
      layers=('25',),
      perturbations=('noise:0.1', 'noise:0.3'),
    )
    # The robust run's attacker: test and dev take the same 32 texts.
    robust = exact_runner.ExactRunConfig(num_test=16)
    assert cfg.num_test + cfg.num_dev == robust.num_test + robust.num_dev
  else:  # the mild perturbations without the budget
    assert cfg == exact_runner.ExactRunConfig(
      num_test=16,
      layers=('25',),
      perturbations=('noise:0.001', 'noise:0.01', 'bf16', 'int8'),
      noise_rule='nearest',
    )
    assert len(exact_runner.cells(cfg)) == 12


def test_flags_give_the_config_and_refuse_bad_input(fresh_flags):
  experiment.define_flags()
  cfg = parsed(fresh_flags, ['prog', '--data=x.txt', '--splits=dev'])
  assert cfg.corpora == ('data=x.txt',) and cfg.attacker_corpus == 'data'
  assert cfg.splits == ('dev',)
  with pytest.raises(LeakjaxError, match="bad noise scale in 'noise:'"):
    parsed(fresh_flags, ['prog', '--perturbations=none,noise:'])
  # --mesh splits the search's candidates; the config is the same.
  mesh_cfg = parsed(fresh_flags, ['prog', '--mesh=data:8'])
  assert mesh_cfg == exact_runner.ExactRunConfig()
  key = io.summary_key('exact', split='dev', layer='25', data='enron')
  assert key == 'exact@data=enron,layer=25,split=dev'


def test_the_calibrated_rule_needs_a_bos_before_any_work():
  model = types.SimpleNamespace(
    hidden_fn=lambda *a: None,
    tokenizer=types.SimpleNamespace(bos_id=None),
    num_layers=2,
  )
  cfg = config(layers=('1',), perturbations=('noise:0.1',))
  with pytest.raises(LeakjaxError, match='--noise_rule=nearest'):
    exact_runner.check_model(cfg, model)
  exact_runner.check_model(
    dataclasses.replace(cfg, noise_rule='nearest'), model
  )
  exact_runner.check_model(
    dataclasses.replace(cfg, perturbations=('bf16',)), model
  )
