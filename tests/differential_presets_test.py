"""The differential attack's presets and `--preset` flag: a preset fills the
config, explicit flags win, and the committed flagfiles do not depend on
it."""

import dataclasses
import json
import pathlib

import pytest
from absl import flags

from experiments import differential as exp
from leakjax import io
from leakjax.attacks.differential import presets, runner, training
from leakjax.errors import LeakjaxError
from leakjax.presets import Preset, Presets

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAGFILES = sorted(
  str(p.relative_to(REPO))
  for pattern in (
    'experiments/configs/differential*.flags',
    'studies/*/configs/differential*.flags',
  )
  for p in REPO.glob(pattern)
)


def parsed(values, argv) -> runner.DifferentialConfig:
  """The experiment's config of `argv`, parsed afresh into `values`."""
  values.unparse_flags()
  values(argv)
  return exp.config_from_flags()


def test_presets_fill_the_config_and_explicit_flags_override(fresh_flags):
  exp.define_flags()
  strongest = parsed(fresh_flags, ['prog', '--data=corpus.txt'])
  assert strongest == presets.config('strongest', data='corpus.txt')
  assert strongest.preset == 'strongest' == presets.DEFAULT
  assert strongest.insertions == (10, 50, 100)
  paper = parsed(fresh_flags, ['prog', '--data=corpus.txt', '--preset=paper'])
  assert paper == presets.config('paper', data='corpus.txt')
  assert paper == dataclasses.replace(strongest, preset='paper')
  # A field the preset does not set keeps the config's default.
  assert paper.min_width == runner.DifferentialConfig(data='x').min_width
  cfg = parsed(
    fresh_flags,
    [
      'prog',
      '--data=corpus.txt',
      '--preset=paper',
      '--insertions=2,8',
      '--methods=continued',
      '--num_groups=2',
    ],
  )
  assert cfg == presets.config(
    'paper',
    data='corpus.txt',
    insertions=(2, 8),
    methods=('continued',),
    num_groups=2,
  )
  assert cfg.vocab_size == 10_000 and cfg.model == 'ptb_small'  # the preset's
  # A flag given at the field's default still wins over the preset.
  cfg = parsed(fresh_flags, ['prog', '--data=corpus.txt', '--score=ds'])
  assert cfg.score == 'ds'
  cfg = parsed(fresh_flags, ['prog', '--data=corpus.txt', '--vocab_size=40'])
  assert cfg.vocab_size == 40 and cfg.insertions == (10, 50, 100)


def test_unknown_presets_are_refused(fresh_flags):
  with pytest.raises(LeakjaxError, match="unknown preset 'best'"):
    presets.config('best', data='corpus.txt')
  exp.define_flags()
  with pytest.raises(flags.IllegalFlagValueError, match=r'paper\|strongest'):
    fresh_flags(['prog', '--data=corpus.txt', '--preset=best'])


def test_the_paper_preset_is_the_papers_protocol():
  # Zanella-Beguelin et al., CCS 2020: Sec. 4.1 (PTB: 10,000 words, the
  # 2-layer 200/200 LSTM), Sec. 4.4 (four canary types; k = 10, 50, 100 on
  # PTB, each k retrained), Sec. 4.2-4.3 (retraining, continued training,
  # D_extra), Algorithm 1 (DS).
  assert dict(presets.PRESETS['paper'].fields) == {
    'vocab_size': 10_000,
    'model': 'ptb_small',
    'canary_types': ('all_low', 'low_to_high', 'mixed', 'high_to_low'),
    'insertions': (10, 50, 100),
    'retrain_insertions': (),
    'methods': ('retrain', 'continued', 'continued_extra'),
    'score': 'ds',
  }
  cfg = presets.config('paper', data='corpus.txt')
  lstm = training.lstm_config(cfg)
  assert (lstm.num_layers, lstm.embed_dim, lstm.hidden_size) == (2, 200, 200)
  assert lstm.dropout_keep == 1.0  # "no additional regularization"
  # Every k retrained, as in Sec. 4.4.
  assert sorted(
    k
    for method, k, _ in training.plan_snapshots(cfg, ['c'])
    if method == 'retrain'
  ) == [10, 50, 100]


def test_strongest_is_the_paper_until_something_beats_it_held_out():
  strongest, paper = presets.PRESETS['strongest'], presets.PRESETS['paper']
  assert dict(strongest.fields) == dict(paper.fields)
  assert 'not chosen on' in strongest.measured
  assert 'reports/differential/test/' in strongest.measured


def test_a_presets_canaries_stay_unless_the_flag_gives_some(
  fresh_flags, monkeypatch
):
  phrases = ('a b c d e', 'f g h i j', 'k l m n o', 'p q r s t')
  monkeypatch.setattr(
    presets,
    'PRESETS',
    Presets(
      runner.DifferentialConfig,
      default='fixed',
      fixed=Preset('fixed phrases', {'canaries': phrases}, '', ''),
    ),
  )
  exp.define_flags()
  assert parsed(fresh_flags, ['prog', '--data=x']).canaries == phrases
  cfg = parsed(fresh_flags, ['prog', '--data=x', '--canaries=a;b;c;d'])
  assert cfg.canaries == ('a', 'b', 'c', 'd')


@pytest.mark.parametrize('path', FLAGFILES)
def test_committed_flagfiles_do_not_depend_on_the_preset(fresh_flags, path):
  exp.define_flags()
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={REPO / path}'])
  assert cfg.preset in presets.PRESETS
  for name in presets.PRESETS:
    again = parsed(
      fresh_flags, ['prog', f'--flagfile={REPO / path}', f'--preset={name}']
    )
    assert again == dataclasses.replace(cfg, preset=name)


def test_the_committed_report_is_the_wikitext_flagfile(fresh_flags):
  exp.define_flags()
  flagfile = REPO / 'experiments/configs/differential_wikitext.flags'
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={flagfile}'])
  stored = json.loads((REPO / 'reports/differential/config.json').read_text())
  now = io.jsonable(cfg)
  assert {k: now[k] for k in stored} == stored
  # Fields added since the run (but `preset`) are at their defaults.
  defaults = io.jsonable(runner.DifferentialConfig(data=cfg.data))
  added = {k: v for k, v in now.items() if k not in stored and k != 'preset'}
  assert added == {k: defaults[k] for k in added}


def test_flagfiles_are_found():
  assert 'experiments/configs/differential_wikitext.flags' in FLAGFILES
