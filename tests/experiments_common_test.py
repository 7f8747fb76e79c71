"""Flags generated from a config dataclass: names, types, defaults, help."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import config_flags
from leakjax.errors import LeakjaxError


@dataclasses.dataclass(frozen=True)
class ToyConfig:
  """A config as the experiments write them.

  Attributes:
    steps: training steps.
    rate: learning rate, a
      float spread over two lines.
    name, label: two fields,
      one entry.
    sizes: batch sizes.
    cut: optional threshold.
    fast: a switch.
  """

  steps: int = 3
  rate: float = 0.5
  name: str = 'a'
  label: str | None = None
  sizes: tuple[int, ...] = (1, 4)
  cut: float | None = None
  fast: bool = False


def test_flags_follow_the_dataclass(fresh_flags):
  config_flags.define_config_flags(ToyConfig)
  fresh_flags(['prog', '--steps=7', '--sizes=2,8,16', '--cut=0.25', '--fast'])
  cfg = config_flags.config_from_flags(ToyConfig)
  assert cfg == ToyConfig(steps=7, sizes=(2, 8, 16), cut=0.25, fast=True)
  assert (
    fresh_flags['rate'].help == 'learning rate, a float spread over two lines.'
  )
  assert fresh_flags['label'].help == 'two fields, one entry.'
  assert config_flags.config_from_flags(ToyConfig, steps=1).steps == 1


def test_bad_list_items_are_a_clear_error(fresh_flags):
  config_flags.define_config_flags(ToyConfig)
  fresh_flags(['prog', '--sizes=2,x'])
  with pytest.raises(
    LeakjaxError, match='--sizes=2,x: each item must be a int'
  ):
    config_flags.config_from_flags(ToyConfig)


def test_an_undocumented_field_is_refused(fresh_flags):
  @dataclasses.dataclass(frozen=True)
  class Undocumented:
    """No attributes block."""

    steps: int = 1

  with pytest.raises(TypeError, match='no docstring entry'):
    config_flags.define_config_flags(Undocumented)


@pytest.mark.slow
@pytest.mark.parametrize(
  'module', ['film', 'dager', 'differential', 'gboard', 'embed_parrot']
)
def test_plain_help_lists_the_common_and_config_flags(module):
  proc = subprocess.run(
    [sys.executable, '-m', f'experiments.{module}', '--help'],
    cwd=Path(__file__).resolve().parents[1],
    capture_output=True,
    text=True,
    timeout=120,
  )
  listed = {
    line.split(':')[0].strip()
    for line in proc.stdout.splitlines()
    if line.strip().startswith('--')
  }
  assert {'--workdir', '--data', '--seed', '--mesh'} <= listed, proc.stdout
  # And at least one config field of each experiment besides those.
  assert len(listed) > 10


@dataclasses.dataclass(frozen=True)
class Inner:
  """A nested config.

  Attributes:
    beams: beams per search.
    cuts: a switch.
    toy: a config nested deeper (no flags).
  """

  beams: int = 8
  cuts: bool = False
  toy: ToyConfig = ToyConfig()


@dataclasses.dataclass(frozen=True)
class Outer:
  """A config holding another.

  Attributes:
    steps: steps.
    inner: the nested settings.
  """

  steps: int = 1
  inner: Inner = Inner(beams=4)


def test_nested_config_fields_get_prefixed_flags_and_presets(fresh_flags):
  config_flags.define_config_flags(Outer, skip=('inner_cuts',))
  assert 'inner_beams' in fresh_flags and 'inner' not in fresh_flags
  assert 'inner_cuts' not in fresh_flags and 'inner_toy' not in fresh_flags
  assert fresh_flags['inner_beams'].help == 'beams per search.'
  assert fresh_flags['inner_beams'].default == 4  # the outer default's
  fresh_flags(['prog'])
  assert config_flags.config_from_flags(Outer) == Outer()
  # A preset fills the flags not given; given flags win.
  preset = {'steps': 5, 'inner': {'beams': 2, 'cuts': True}}
  assert config_flags.config_from_flags(Outer, preset=preset) == Outer(
    steps=5, inner=Inner(beams=2, cuts=True)
  )
  fresh_flags.unparse_flags()
  fresh_flags(['prog', '--inner_beams=16'])
  assert config_flags.config_from_flags(Outer, preset=preset) == Outer(
    steps=5, inner=Inner(beams=16, cuts=True)
  )
