"""leakjax.presets: a preset fills the config, given fields win."""

import dataclasses

import pytest

from leakjax.errors import LeakjaxError
from leakjax.presets import Preset, Presets


@dataclasses.dataclass(frozen=True)
class Inner:
  beams: int = 8
  cuts: bool = False


@dataclasses.dataclass(frozen=True)
class Outer:
  steps: int = 1
  sizes: tuple[int, ...] = (1,)
  inner: Inner = Inner()
  preset: str | None = None


def presets() -> Presets:
  return Presets(
    Outer,
    default='strongest',
    paper=Preset('the paper', {'steps': 3}, 'Sec. 1', 'Table 1'),
    strongest=Preset(
      'ours', {'steps': 5, 'inner': {'cuts': True}}, 'dev', 'test'
    ),
  )


def test_a_preset_fills_the_config_and_records_its_name():
  p = presets()
  assert p.config() == Outer(
    steps=5, inner=Inner(cuts=True), preset='strongest'
  )
  assert p.config('paper') == Outer(steps=3, preset='paper')


def test_given_fields_win_and_nested_ones_merge_field_by_field():
  p = presets()
  cfg = p.config('strongest', steps=7, inner={'beams': 2})
  assert cfg == Outer(
    steps=7, inner=Inner(beams=2, cuts=True), preset='strongest'
  )
  # A nested config given whole replaces every field it holds.
  cfg = p.config('strongest', inner=Inner(beams=4))
  assert cfg.inner == Inner(beams=4, cuts=False)
  # A nested dict on a preset that sets none of it starts from the default.
  assert p.config('paper', inner={'beams': 2}).inner == Inner(beams=2)


def test_overrides_are_a_copy():
  p = presets()
  p.overrides('strongest')['inner']['cuts'] = False
  assert p.config().inner.cuts


def test_unknown_names_and_fields_fail_in_one_line():
  p = presets()
  with pytest.raises(
    LeakjaxError, match="unknown preset 'best'.*paper, strongest"
  ):
    p.config('best')
  with pytest.raises(ValueError, match='unknown Outer fields'):
    Presets(Outer, default='a', a=Preset('a', {'step': 1}, '', ''))
  with pytest.raises(ValueError, match='default'):
    Presets(Outer, default='b', a=Preset('a', {}, '', ''))


def test_a_mapping_of_names_with_one_line_help():
  p = presets()
  assert list(p) == ['paper', 'strongest'] and len(p) == 2
  assert p['paper'].chosen == 'Sec. 1'
  assert p.describe() == 'paper (the paper); strongest (ours)'


def test_a_config_without_a_preset_field_is_built_too():
  @dataclasses.dataclass(frozen=True)
  class Plain:
    steps: int = 1

  p = Presets(Plain, default='a', a=Preset('a', {'steps': 2}, '', ''))
  assert p.config() == Plain(steps=2)
