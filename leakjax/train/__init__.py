"""The training loop of the library, with optax.

The attacks need models trained on private text (FILM, the differential
score, GBoard's θ0) and models trained to attack (Embed Parrot), so there is
one loop for all of them:

* :func:`fit_step` -- one pure optimizer step on any :class:`LossFn`
  `(params, frozen, batch, key) -> (loss, metrics)`;
* :func:`fit` -- the loop: epochs of batches in an order fixed by the seed,
  one jitted step per loss function, optimizer settings and step count (new
  params never recompile), a tqdm bar and log lines, evaluation with early
  stopping (keeping the best parameters), NaN checks, orbax checkpoints
  under `workdir/checkpoint/` and a resume with the same final parameters
  as an uninterrupted run;
* :class:`LanguageModelLoss`, :func:`train_step`, :func:`evaluate` and
  :func:`train` -- language-model fine-tuning of any leakjax
  :class:`~leakjax.models.Model` on texts: tokenizes with
  `model.tokenizer`, cuts the corpus into fixed-shape batches (one
  compilation), evaluates the token-weighted loss and perplexity, and
  calls :func:`fit`.

The defaults follow FILM (Gupta et al. 2022) Sec. 6.1: initial learning rate
1e-5, linearly decayed, early stopping when the eval loss goes up:

>>> model, params = leakjax.models.load('smollm2-135m')  # doctest: +SKIP
>>> config = TrainConfig(num_epochs=3, early_stopping_patience=1)
>>> result = train(model, params, train_texts, eval_texts,  # doctest: +SKIP
...                config, workdir='/tmp/run')
>>> result.params, result.best_eval['perplexity']  # doctest: +SKIP

`workdir/checkpoint/` is an orbax `CheckpointManager` folder holding the
last checkpointed step: items `params`, `opt_state` (not in the last
checkpoint of a finished run, which never steps again), `state` (JSON:
step, key, history, best eval, config and data fingerprint) and, when the
best evaluated parameters differ from the last ones, `best`. Orbax writes each
step asynchronously (training goes on while it is written) and commits it
atomically, on local disks and object stores (`gs://`) alike, so a run
killed at any moment resumes from its last committed step
(:func:`checkpoint_state` reads it). :func:`train` also writes
`workdir/model/`, the model it returns, in Hugging Face's safetensors
layout (:func:`leakjax.models.save`), which :func:`leakjax.models.load`
reads.
"""

# The private names are re-exported for the tests that use them.
from leakjax.train.checkpoint import (
  _is_complete,  # noqa: F401
  _save_directory,  # noqa: F401
  checkpoint_params,
  checkpoint_state,
  data_fingerprint,
)
from leakjax.train.config import OPTIMIZERS, SCHEDULES, TrainConfig
from leakjax.train.language_model import (
  LanguageModelLoss,
  TrainResult,
  eval_step,
  evaluate,
  release_programs,
  train,
  train_step,
)
from leakjax.train.loop import FitResult, fit
from leakjax.train.optimizer import learning_rate_schedule, make_optimizer
from leakjax.train.steps import LossFn, fit_step

__all__ = [
  'FitResult',
  'checkpoint_params',
  'checkpoint_state',
  'LanguageModelLoss',
  'LossFn',
  'TrainConfig',
  'TrainResult',
  'fit',
  'data_fingerprint',
  'fit_step',
  'make_optimizer',
  'learning_rate_schedule',
  'train_step',
  'eval_step',
  'evaluate',
  'release_programs',
  'train',
  'OPTIMIZERS',
  'SCHEDULES',
]
