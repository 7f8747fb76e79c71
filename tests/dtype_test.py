"""`--dtype`: every experiment's config takes float32 or bfloat16 and
refuses anything else before any work; an attack runs end to end in
bfloat16 on the cast model."""

import json

import jax
import numpy as np
import pytest

from experiments import film as film_exp
from leakjax import models
from leakjax.attacks.dager.runner import DagerConfig
from leakjax.attacks.differential.runner import DifferentialConfig
from leakjax.attacks.film import runner as film_runner
from leakjax.attacks.film.runner import FilmConfig
from leakjax.attacks.gboard.runner import GboardConfig
from leakjax.attacks.inversion.exact_runner import ExactRunConfig
from leakjax.attacks.inversion.runner import InversionConfig
from leakjax.audit.config import AuditConfig
from leakjax.errors import LeakjaxError
from tests.film_test import SMOKE

# Each config with the arguments it requires.
CONFIGS = (
  (FilmConfig, {}),
  (DagerConfig, {}),
  (DifferentialConfig, {'data': 'wikitext-2-valid'}),
  (GboardConfig, {}),
  (InversionConfig, {}),
  (ExactRunConfig, {}),
  (AuditConfig, {}),
)


@pytest.mark.parametrize(
  'cls, required', CONFIGS, ids=[c.__name__ for c, _ in CONFIGS]
)
def test_every_config_takes_the_dtypes_and_refuses_others(cls, required):
  assert cls(**required).dtype == 'float32'  # every committed number's
  assert cls(**required, dtype='bfloat16').dtype == 'bfloat16'
  with pytest.raises(LeakjaxError, match="unknown --dtype 'float16'"):
    cls(**required, dtype='float16')


def test_casting_keeps_integer_leaves_and_refuses_an_unknown_family():
  model, params = models.load_model(models.GPT2_TINY, seed=0)
  tree = {'w': params, 'steps': np.int32(3)}
  _, cast = models.cast(model, tree, 'bfloat16')
  assert cast['steps'].dtype == np.int32
  strange = model.replace(family='mystery')
  with pytest.raises(LeakjaxError, match='cannot cast a model of family'):
    models.cast(strange, params, 'bfloat16')


@pytest.mark.slow
def test_film_runs_in_bfloat16(tmp_path, monkeypatch):
  # A tiny FILM run attacks the bfloat16 cast of the fine-tuned model: its
  # rows and summary are written, config.json records the dtype.
  attacked = []
  attack_batch = film_runner.attack_batch

  def recorded(model, params, *args, **kwargs):
    attacked.append({x.dtype.name for x in jax.tree.leaves(params)})
    return attack_batch(model, params, *args, **kwargs)

  monkeypatch.setattr(film_runner, 'attack_batch', recorded)
  cfg = FilmConfig(**{**SMOKE, 'dtype': 'bfloat16'})
  summary = film_exp.run_experiment(cfg, tmp_path, progress=False)
  assert json.loads((tmp_path / 'config.json').read_text())['dtype'] == (
    'bfloat16'
  )
  assert 0.0 <= summary['rougeL@b=2'] <= 1.0
  assert attacked == [{'bfloat16'}]


def test_the_exact_search_reads_a_bfloat16_models_states_with_the_gap_rule():
  from leakjax.attacks.inversion import exact_perturb  # pylint: disable=g-import-not-at-top

  none = exact_perturb.parse('none')
  assert ExactRunConfig().exact_config(none).rule == 'tolerance'
  assert ExactRunConfig(dtype='bfloat16').exact_config(none).rule == 'nearest'
  noisy = exact_perturb.parse('noise:0.1')
  assert ExactRunConfig(dtype='bfloat16').exact_config(noisy).rule == (
    'calibrated'
  )
  # The one rule both the runner and the audit read for a model's own states.
  from leakjax.attacks.inversion import exact  # pylint: disable=g-import-not-at-top

  assert exact.own_states_rule('float32') == 'tolerance'
  assert exact.own_states_rule(jax.numpy.bfloat16) == 'nearest'
