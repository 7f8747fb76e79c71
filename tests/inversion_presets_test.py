"""Embedding inversion's presets (`leakjax.attacks.inversion.presets`) and
the experiment's `--preset` flag."""

import dataclasses
import json
from pathlib import Path

import pytest
from absl import flags

from experiments import config_flags
from experiments import embed_parrot as experiment
from leakjax.attacks.inversion import presets, runner
from leakjax.errors import LeakjaxError

REPO = Path(__file__).resolve().parents[1]
STRONGEST_RUN = (
  REPO / 'reports/embed_parrot/pretrained/scratch_skip_samples_layer_25'
)


def parsed(values, argv) -> runner.InversionConfig:
  """The experiment's config of `argv`, parsed afresh into `values`."""
  values.unparse_flags()
  values(argv)
  return experiment.config_from_flags()


def committed_flagfiles() -> list[Path]:
  """Every committed flagfile of the experiment."""
  return sorted(
    [
      *(REPO / 'experiments' / 'configs').glob('embed_parrot_*.flags'),
      *(REPO / 'studies' / 'embed_parrot').glob('**/*.flags'),
    ]
  )


@pytest.fixture
def ep_flags(fresh_flags):
  """Fresh flags with the experiment's flags defined."""
  experiment.define_flags()
  return fresh_flags


def test_presets_fill_the_config_and_explicit_flags_override(ep_flags):
  strongest = parsed(ep_flags, ['prog'])
  assert presets.DEFAULT == 'strongest'
  assert strongest == presets.config('strongest') == presets.config()
  assert strongest.preset == 'strongest'
  assert strongest.ep_variants == ('ep_skip',)
  assert (strongest.num_train, strongest.train_samples) == (6000, 3000)
  paper = parsed(ep_flags, ['prog', '--preset=paper'])
  assert paper == presets.config('paper')
  assert paper == runner.InversionConfig(
    preset='paper', **presets.overrides('paper')
  )
  differ = {
    f.name
    for f in dataclasses.fields(runner.InversionConfig)
    if getattr(paper, f.name) != getattr(strongest, f.name)
  }
  assert differ == {
    'deep_layer',
    'defense_layers',
    'ep_layers',
    'ep_steps',
    'ep_variants',
    'num_train',
    'preset',
    'sample_start_id',
    'train_samples',
  }
  # A flag given wins; the preset's other fields stay.
  cfg = parsed(ep_flags, ['prog', '--ep_steps=100', '--train_samples=0'])
  assert (cfg.ep_steps, cfg.train_samples) == (100, 0)
  assert (cfg.ep_variants, cfg.num_train) == (('ep_skip',), 6000)
  assert cfg.preset == 'strongest'
  # A flag given at the dataclass default still wins over the preset.
  cfg = parsed(ep_flags, ['prog', '--preset=paper', '--deep_layer=25'])
  assert (cfg.deep_layer, cfg.defense_layers) == (25, ('0', '30'))
  # --data replaces the corpora under a preset too.
  cfg = parsed(ep_flags, ['prog', '--data=/x/y.txt'])
  assert cfg.corpus_paths() == (('data', '/x/y.txt'),)
  assert cfg.train_corpus == 'data' and cfg.train_samples == 3000
  # And so do keyword arguments of presets.config.
  cfg = presets.config('strongest', num_test=16, ep_steps=10)
  assert (cfg.num_test, cfg.ep_steps, cfg.num_train) == (16, 10, 6000)


def test_unknown_preset_errors(ep_flags):
  with pytest.raises(LeakjaxError, match='unknown preset'):
    presets.config('best')
  with pytest.raises(flags.IllegalFlagValueError):
    parsed(ep_flags, ['prog', '--preset=best'])


@pytest.mark.parametrize(
  'path', committed_flagfiles(), ids=lambda p: str(p.relative_to(REPO))
)
def test_committed_flagfiles_pin_a_preset_and_parse_as_before(ep_flags, path):
  assert any(
    line.startswith('--preset=') for line in path.read_text().splitlines()
  ), f'{path.name} does not pin --preset'
  cfg = parsed(ep_flags, ['prog', f'--flagfile={path}'])
  assert cfg.preset in presets.PRESETS
  # The flagfile's own flags over the dataclass defaults: what it parsed
  # to before presets existed. Its preset adds nothing to them.
  assert cfg == config_flags.config_from_flags(runner.InversionConfig)


def test_the_committed_flagfiles_are_found():
  names = {p.name for p in committed_flagfiles()}
  assert {
    'embed_parrot_quick.flags',
    'embed_parrot_smollm2.flags',
    'embed_parrot_pretrained.flags',
  } <= names


def test_paper_fields_are_the_papers():
  """Wan et al. 2024; every other field keeps the config's default."""
  cfg = presets.config('paper')
  # Table 2: BEI/HEI at layers 0, 5, ..., 30 and last (Llama2-7B).
  assert cfg.layers == ('0', '5', '10', '15', '20', '25', '30', 'last')
  # Sec. 5.2.1, Table 1: Embed Parrot at Llama2-7B's layer 30.
  assert cfg.deep_layer == 30 and str(cfg.deep_layer) in cfg.layers
  # Table 6: the DCT defense at layers 0 and 30.
  assert cfg.defense_layers == ('0', '30')
  # Sec. 5.1.1: 20 % held out; trained on one corpus' text alone.
  assert cfg.test_fraction == 0.2 and cfg.train_samples == 0
  # Sec. 4.3: the adapters around a decoder-only model, no linear skip.
  assert cfg.ep_variants == ('ep',)
  # Sec. 5.1.3: ROUGE-1/L, F1 and Sentence-BERT.
  assert cfg.sbert
  assert set(presets.overrides('paper')) == {
    'layers',
    'deep_layer',
    'defense_layers',
    'test_fraction',
    'train_samples',
    'ep_variants',
    'sbert',
  }
  assert 'Wan et al. 2024' in presets.PRESETS['paper'].chosen


def test_strongest_is_the_committed_run_and_says_where_it_was_measured():
  record = presets.PRESETS['strongest']
  # Chosen on the dev split, measured on the test split: the same fields.
  test_run = STRONGEST_RUN.parent / f'{STRONGEST_RUN.name}_test'
  assert f'{test_run.name}/' in record.measured
  assert STRONGEST_RUN.name in record.chosen
  run = json.loads((STRONGEST_RUN / 'config.json').read_text())
  held = json.loads((test_run / 'config.json').read_text())
  assert (run['split'], held['split']) == ('dev', 'test')
  for name in record.fields:
    assert held[name] == run[name], name
  for name, value in record.fields.items():
    expected = tuple(run[name]) if isinstance(value, tuple) else run[name]
    assert value == expected, name


def test_every_preset_builds_a_valid_config_and_is_described():
  for name in presets.PRESETS:
    assert presets.config(name).preset == name
    assert f'{name} (' in presets.PRESETS.describe()
