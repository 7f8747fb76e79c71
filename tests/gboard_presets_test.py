"""The GBoard attack's presets: `paper` and `strongest` fill the config,
explicit flags win, and the committed flagfiles parse as they did."""

import dataclasses
import pathlib

import pytest
from absl import flags

from experiments import gboard as gboard_exp
from leakjax.attacks import gboard
from leakjax.attacks.gboard import presets, runner
from leakjax.errors import LeakjaxError

REPO = pathlib.Path(__file__).resolve().parents[1]
ALL_EPOCHS = 10**9  # a dpsgd_runs entry without a max E

# Suliman & Leith's values, from the paper's text.
PAPER = {
  'vocab_size': 9502,  # Sec. 2.3
  'embed_dim': 96,  # Sec. 2.3
  'units': 670,  # Sec. 2.3
  'sentence_length': 4,  # Sec. 4.1
  'num_sentences': (16, 32, 64, 128, 256),  # Sec. 4.1
  'epochs': (1, 50, 100, 1000),  # Sec. 4.3, Figs. 2 and 3
  'batch_sizes': ('full', '32'),  # Sec. 4.3.1, Fig. 2
  'max_sentence_epochs': 256 * 1000,  # every n_k at E = 1000 (Fig. 3c)
  'learning_rate': 0.001,  # Sec. 4.1
  'loss': 'sentence_sum',  # Sec. 3.1: J_{1:T} = Σ_t J_t
  'dpsgd_sigmas': (0.001, 0.01, 0.1),  # Sec. 6.1, Algorithm 3
  'dpsgd_runs': (  # Sec. 6: every n_k and B of Sec. 4 (B >= n_k is full)
    (16, 'full', ALL_EPOCHS),
    (32, 'full', ALL_EPOCHS),
    (64, 'full', ALL_EPOCHS),
    (64, '32', ALL_EPOCHS),
    (128, 'full', ALL_EPOCHS),
    (128, '32', ALL_EPOCHS),
    (256, 'full', ALL_EPOCHS),
    (256, '32', ALL_EPOCHS),
  ),
  'single_sigmas': (1e-4, 1e-2, 1e-1),  # Fig. 6, Sec. 6.1-6.2, Algorithm 4
  'threshold_rule': 'zero',  # Sec. 3.1, Algorithm 2: cut 0
}


def parsed(values, argv) -> runner.GboardConfig:
  """The experiment's config of `argv`, parsed afresh into `values`."""
  values.unparse_flags()
  values(argv)
  return gboard_exp.config_from_flags()


def committed_flagfiles() -> list[str]:
  return sorted(
    str(p.relative_to(REPO))
    for folder in ('experiments/configs', 'studies/gboard/configs')
    for p in (REPO / folder).glob('gboard*.flags')
  )


def fields(cfg) -> dict:
  return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def test_paper_fields_are_the_papers_values():
  assert dict(presets.PRESETS['paper'].fields) == PAPER
  cfg = presets.config('paper')
  assert cfg.preset == 'paper'
  assert {k: getattr(cfg, k) for k in PAPER} == PAPER
  # The rest keep the config's defaults.
  default = fields(gboard.GboardConfig())
  rest = {k: v for k, v in fields(cfg).items() if k not in PAPER}
  assert rest == {k: default[k] for k in rest} | {'preset': 'paper'}


def test_strongest_is_the_rule_the_heldout_runs_froze():
  strongest = presets.PRESETS['strongest']
  assert dict(strongest.fields) == {'threshold_rule': 'auto', 'fdr_q': 0.05}
  # The default config is the strongest preset's, bar the recorded name.
  assert presets.DEFAULT == 'strongest'
  assert presets.config() == gboard.GboardConfig()
  assert fields(presets.config()) == fields(gboard.GboardConfig()) | {
    'preset': 'strongest'
  }
  # Its record names the run it was chosen on and the held-out runs.
  for folder in ('reports/gboard/', 'heldout/', 'heldout_e1000/'):
    assert folder in strongest.chosen + strongest.measured
  for folder in ('heldout', 'heldout_e1000'):
    config = runner.load_config(REPO / 'reports/gboard' / folder)
    assert config.heldout_from_seed == 0
    assert {k: getattr(config, k) for k in strongest.fields} == dict(
      strongest.fields
    )


def test_presets_fill_the_config_and_explicit_flags_override(fresh_flags):
  gboard_exp.define_flags()
  strongest = parsed(fresh_flags, ['prog'])
  assert fields(strongest) == fields(presets.config('strongest'))
  assert strongest.preset == 'strongest'
  paper = parsed(fresh_flags, ['prog', '--preset=paper'])
  assert fields(paper) == fields(presets.config('paper'))
  assert paper.dpsgd_runs == PAPER['dpsgd_runs']  # the hand-written flag
  differ = {k for k, v in fields(paper).items() if fields(strongest)[k] != v}
  assert differ == {
    'dpsgd_runs',
    'max_sentence_epochs',
    'preset',
    'single_sigmas',
    'threshold_rule',
  }
  cfg = parsed(
    fresh_flags,
    [
      'prog',
      '--preset=paper',
      '--threshold_rule=auto',
      '--dpsgd_runs=16:full',
      '--epochs=1,50',
    ],
  )
  assert cfg.preset == 'paper' and cfg.threshold_rule == 'auto'
  assert cfg.dpsgd_runs == ((16, 'full', ALL_EPOCHS),)
  assert cfg.epochs == (1, 50)
  assert cfg.single_sigmas == PAPER['single_sigmas']  # the preset's
  # --data names the clients' corpus under a preset too.
  cfg = parsed(fresh_flags, ['prog', '--preset=paper', '--data=/c/sms.tsv'])
  assert cfg.sms == '/c/sms.tsv' and cfg.threshold_rule == 'zero'
  # The library call: given fields win over the preset's.
  cfg = presets.config('paper', num_sentences=(16, 64), learning_rate=0.01)
  assert cfg.num_sentences == (16, 64) and cfg.learning_rate == 0.01
  assert cfg.threshold_rule == 'zero'


def test_an_unknown_preset_is_refused(fresh_flags):
  with pytest.raises(LeakjaxError, match='unknown preset'):
    presets.config('best')
  gboard_exp.define_flags()
  with pytest.raises(flags.IllegalFlagValueError):
    fresh_flags(['prog', '--preset=best'])


@pytest.mark.parametrize('path', committed_flagfiles())
def test_committed_flagfiles_parse_the_same_under_every_preset(
  fresh_flags, path
):
  # Each flagfile sets every field a preset sets, so its run does not
  # depend on the preset; the default records `strongest`.
  gboard_exp.define_flags()
  cfg = parsed(fresh_flags, ['prog', f'--flagfile={REPO / path}'])
  assert cfg.preset == 'strongest'
  assert cfg.threshold_rule == 'auto' and cfg.fdr_q == 0.05
  for name in presets.PRESETS:
    other = parsed(
      fresh_flags, ['prog', f'--flagfile={REPO / path}', f'--preset={name}']
    )
    assert other.preset == name
    assert fields(other) == fields(cfg) | {'preset': name}
