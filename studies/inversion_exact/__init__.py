"""Studies of exact hidden-state inversion (`reports/inversion_exact/`).

Each reads the flags of `experiments.inversion_exact` (so its flagfiles
work) and starts from :func:`target_from_flags`.
"""

from experiments import inversion_exact
from leakjax import models
from leakjax.attacks.inversion import exact_runner


def target_from_flags():
  """`(config, model, params, corpora)` of the command line: the
  experiment's config, its model (float32, `--model` and `--seed`) and the
  corpora it names."""
  cfg = inversion_exact.config_from_flags()
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  return cfg, model, params, exact_runner.load_corpora(cfg)
