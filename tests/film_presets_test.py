"""FILM's presets: `--preset` fills the config, flags win, the committed
flagfiles keep their configs, `paper` is the paper's protocol."""

import dataclasses
import math
import pathlib

import pytest
from absl import flags

from experiments import config_flags
from experiments import film as film_exp
from leakjax.attacks.film import presets, runner
from leakjax.errors import LeakjaxError

REPO = pathlib.Path(__file__).resolve().parents[1]

# FILM's protocol as Gupta et al. (NeurIPS 2022) state it, written out
# independently of leakjax/attacks/film/presets.py.
PAPER = {
  'max_tokens': 40,  # Appendix B.1: fewer than 40 tokens
  'require_entity': True,  # Appendix B.1: at least one named entity
  'init': 'pretrained',  # Sec. 6.2: fine-tuned from pretrained GPT-2
  'train_steps': 90000,  # Sec. 6.1: 90,000 iterations
  'learning_rate': 1e-5,  # Sec. 6.1: initial learning rate 1e-5
  'early_stopping_patience': 1,  # Sec. 6.1: until the eval loss increased
  'eval_every': 500,  # ours: Sec. 6.1 does not say how often
  'train_batch_size': 16,  # Sec. 6.2: batch size for training b = 16
  'batch_sizes': (1, 16, 64, 128),  # Fig. 3, Table 10
  'num_batches': 20,  # Fig. 3, Table 10: 20 tested mini-batches
  'num_beams': (32,),  # Sec. 7, Fig. 5: beam size around 32
  'ngram_size': (2,),  # Sec. 4.3, 7: penalty on repeated 2-grams
  'length': 40,  # Sec. 4.3: "we use 40 words"
  'prompts_per_search': 0,  # Appendix A, Alg. 1: one pool, π¹ = P
  'beta': (1.0,),  # Sec. 7, Fig. 6: β = 1 is optimal
  'phrase_steps': 200,  # Sec. 4.4: phrase-wise, 200 steps
  'token_steps': 200,  # Sec. 4.4: token-wise, 200 steps
  'truncate': True,  # Sec. 4.4, footnote 6
}


def parsed(values, argv) -> runner.FilmConfig:
  """The experiment's config of `argv`, parsed afresh into `values`."""
  values.unparse_flags()
  values(argv)
  return film_exp.config_from_flags()


def committed_flagfiles() -> list[pathlib.Path]:
  """Every committed flagfile of experiments.film."""
  return sorted(
    [
      *(REPO / 'experiments' / 'configs').glob('film*.flags'),
      *(REPO / 'studies').glob('*/configs/film*.flags'),
    ]
  )


def test_paper_preset_is_the_papers_protocol():
  fields = dict(presets.PRESETS['paper'].fields)
  assert fields == PAPER
  # The model and the data stay the caller's.
  assert not {'model', 'data', 'data_column', 'data_label'} & set(fields)
  cfg = presets.config('paper')
  for name, value in PAPER.items():
    assert getattr(cfg, name) == value, name
  assert cfg.preset == 'paper' and cfg.mode == 'attack'
  assert cfg.ngram_penalty == math.inf  # not the paper's to set: a default


def test_strongest_is_the_paper_until_a_held_out_win():
  # No setting of ours beat the paper's on batches it was not chosen on;
  # strongest says so and sets the paper's fields.
  strongest = presets.PRESETS['strongest']
  assert presets.DEFAULT == 'strongest'
  assert dict(strongest.fields) == PAPER
  assert 'held-out' in strongest.measured
  for preset in presets.PRESETS.values():
    assert preset.description and preset.chosen and preset.measured


def test_presets_fill_the_config_and_explicit_flags_override(fresh_flags):
  film_exp.define_flags()
  bare = parsed(fresh_flags, ['prog'])
  assert bare == presets.config() == presets.config('strongest')
  assert bare.preset == 'strongest' and bare.train_steps == 90000
  paper = parsed(fresh_flags, ['prog', '--preset=paper'])
  assert paper == presets.config('paper')
  assert paper == runner.FilmConfig(**PAPER, preset='paper')
  differ = {
    f.name
    for f in dataclasses.fields(runner.FilmConfig)
    if getattr(paper, f.name) != getattr(runner.FilmConfig(), f.name)
  }
  assert differ == {
    'train_steps',
    'early_stopping_patience',
    'eval_every',
    'preset',
  }
  cfg = parsed(
    fresh_flags,
    [
      'prog',
      '--preset=paper',
      '--num_beams=8',
      '--train_steps=5',
      '--early_stopping_patience=0',
      '--batch_sizes=4',
    ],
  )
  assert (cfg.num_beams, cfg.train_steps, cfg.batch_sizes) == ((8,), 5, (4,))
  assert cfg.early_stopping_patience == 0  # a flag at its default wins too
  assert cfg.learning_rate == 1e-5 and cfg.phrase_steps == 200  # preset's
  assert cfg.preset == 'paper'
  assert presets.config('paper', num_beams=(8,), train_steps=5) == (
    dataclasses.replace(paper, num_beams=(8,), train_steps=5)
  )


def test_unknown_preset_is_refused(fresh_flags):
  with pytest.raises(LeakjaxError, match='unknown preset'):
    presets.config('best')
  with pytest.raises(LeakjaxError, match='unknown preset'):
    presets.overrides('best')
  film_exp.define_flags()
  fresh_flags.unparse_flags()
  with pytest.raises(flags.IllegalFlagValueError):
    fresh_flags(['prog', '--preset=best'])


@pytest.mark.parametrize('path', committed_flagfiles(), ids=lambda p: p.name)
def test_committed_flagfiles_parse_to_their_configs(fresh_flags, path):
  # Each names the paper's preset and sets every field where its run
  # differs from the config's defaults, so the preset's values change
  # none of them: the config is the one its flags give on their own.
  film_exp.define_flags()
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={path}'])
  assert cfg.preset == 'paper', path
  assert cfg == config_flags.config_from_flags(runner.FilmConfig), path


def test_the_quickstart_flagfile_keeps_its_config(fresh_flags):
  # The README's main job: t = 30 steps without early stopping, b = 1/4/16.
  film_exp.define_flags()
  path = REPO / 'experiments/configs/film_quickstart.flags'
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={path}'])
  assert cfg == runner.FilmConfig(
    model='smollm2-135m',
    eval_fraction=0.0,
    train_steps=30,
    train_batch_size=8,
    learning_rate=3e-4,
    batch_sizes=(1, 4, 16),
    num_batches=2,
    num_beams=(8,),
    length=24,
    max_prompts=16,
    phrase_steps=10,
    token_steps=10,
    reorder_candidates=8,
    preset='paper',
  )
