"""What an audit measures: :class:`AuditConfig`, the artefacts, the defenses.

An audit answers "my system sends this artefact of this model trained on
this kind of text: how much of the text can an attacker read, and what
does each defense cost in model quality?" Its inputs:

* artefacts (:data:`ARTEFACTS`): `gradient` (a FedSGD client gradient),
  `update` (a FedAvg client update after `local_steps` local steps),
  `snapshot` (the model before and after fine-tuning on the user's data)
  and `hidden` (hidden states at `layers`, sent to a model provider);
* defenses (:func:`parse_defense`): `none`, `dp:EPS` (DP-SGD at epsilon
  EPS over the fine-tuning run, Abadi et al.), `prune:P` (the smallest
  fraction P of each tensor zeroed, Zhu et al.), `freeze` (the tied
  embedding/head gets no gradient, FILM Sec. 5) and `noise:S` (N(0, S^2)
  added once to what is sent, GBoard Algorithm 4).

A training defense (dp, prune, freeze) changes what a client sends and
how the model trains; it does not act on hidden states sent at inference,
where only `noise` applies (:func:`applies`). Every check runs when the
config is built, before any work.
"""

from __future__ import annotations

import dataclasses
import math

from leakjax import models
from leakjax.errors import LeakjaxError, check_positive

ARTEFACTS = ('gradient', 'update', 'snapshot', 'hidden')
DEFENSE_KINDS = ('none', 'dp', 'prune', 'freeze', 'noise')
# Defenses that act on training (the client's step), not on inference.
TRAINING_DEFENSES = ('dp', 'prune', 'freeze')


def parse_defense(spec: str) -> tuple[str, float]:
  """'none' | 'freeze' | 'dp:EPS' | 'prune:P' | 'noise:S' -> (kind, value).

  >>> parse_defense('dp:8')
  ('dp', 8.0)
  """
  kind, _, rest = spec.partition(':')
  if kind in ('none', 'freeze') and not rest:
    return kind, 0.0
  if kind in ('dp', 'prune', 'noise'):
    try:
      value = float(rest)
    except ValueError:
      value = math.nan
    if (
      (kind == 'dp' and value > 0)
      or (kind == 'prune' and 0 < value < 1)
      or (kind == 'noise' and value > 0 and math.isfinite(value))
    ):
      return kind, value
  raise LeakjaxError(
    f'unknown defense {spec!r}',
    'use none, freeze, dp:<epsilon>, prune:<fraction in (0, 1)> or'
    ' noise:<std>, e.g. --defenses=none,dp:8,freeze',
  )


def applies(artefact: str, defense: str) -> bool:
  """Whether `defense` changes `artefact`: training defenses do not act on
  hidden states (sent at inference); `noise` has no place in a snapshot
  (the released model is not a noisy message)."""
  kind, _ = parse_defense(defense)
  if artefact == 'hidden':
    return kind in ('none', 'noise')
  if artefact == 'snapshot':
    return kind != 'noise'
  return True


def artefact_name(artefact: str, layer: str | None = None) -> str:
  """The artefact's key in the summary: `hidden:<layer>` for hidden states."""
  return f'{artefact}:{layer}' if layer is not None else artefact


@dataclasses.dataclass(frozen=True)
class AuditConfig:
  """Everything that determines an audit's results.

  Attributes:
    model: anything :func:`leakjax.models.load` takes ('smollm2-135m',
      'gpt2', a local Hugging Face directory, ...).
    dtype: float32 or bfloat16: every artefact is computed and attacked on
      the model cast to it (:func:`leakjax.models.cast`; a snapshot pair
      is cast after fine-tuning). Decision: the fine-tuning runs of the
      utility cost and the attacker's samples stay float32 (how the model
      is trained is the setup, not the attack). bfloat16 is for
      accelerators (`reports/dtype/`).
    data: the user's corpus (a named data set, a .json/.txt/.tsv file or
      hub:NAME); None: the embedded office sentences of the quickstart.
    data_column: the text field of the corpus's rows; None: the default.
    data_label: keep only the rows with FIELD=VALUE[,VALUE...].
    max_sentences: keep the first this many preprocessed sentences (None:
      all).
    max_tokens: keep sentences with fewer tokens (FILM Appendix B.1: 40).
    artefacts: what the system sends (:data:`ARTEFACTS`).
    batch_sizes: client batch sizes b (gradient, update); for hidden states,
      how many sentences the user sends at once.
    num_batches: consecutive batches attacked per b.
    defenses: the defenses compared (:func:`parse_defense`); `none` is the
      baseline every cost is measured against and is always included.
    layers: the layers whose hidden states are sent (`hidden`): block
      outputs 0..L (0: the embedding output) or 'last'.
    local_steps: local SGD steps of a FedAvg client (`update`): one epoch
      over its b sentences in minibatches of ceil(b / local_steps).
    local_learning_rate: the FedAvg client's learning rate. The attacker
      divides the update by -lr x steps (DAGER's FedAvg setting, Petrov et
      al. Table 4).
    finetune_steps: steps of the fine-tuning whose held-out perplexity
      measures each defense's cost (and whose end points are the
      `snapshot` pair).
    finetune_batch_size: its batch size.
    finetune_learning_rate: its peak learning rate (AdamW, linear decay,
      FILM Sec. 6.1).
    utility_seeds: fine-tuning runs per defense (data order and DP noise
      differ); the cost is their mean with its spread.
    heldout_fraction: the last fraction of the sentences, never attacked
      nor trained on: the held-out perplexity's text.
    dp_clip: DP-SGD's per-example clipping norm C.
    dp_delta: DP-SGD's delta. The noise multiplier of `dp:EPS` gives
      (EPS, dp_delta)-DP over the fine-tuning run (`finetune_steps` steps
      at sampling rate finetune_batch_size / N, RDP accounting); a client's
      gradient and update carry the same per-step noise.
    film_beams: FILM's beam width when it runs (gradients and updates whose
      embedding rows carry a gradient, after DAGER fails).
    film_steps: FILM's phrase and token reordering steps, each.
    snapshot_beams: the differential rank search's beam width (`snapshot`).
    snapshot_length: the tokens the search extracts after BOS: it reads the
      openings of this many tokens of the user's sentences.
    attacker_samples: sentences the provider samples from the model it
      holds and adds to its own text before fitting the hidden-state
      inverses (:func:`leakjax.audit.hidden.attacker_samples`); 0: the
      user's sentences alone. The default was chosen on the quick audit's
      held-out sentences (dev): the exact search's proposals, by place of
      the true token, in `reports/audit/attacker_text/`.
    seed: random seed (defense noise, data order, FILM's draws).
  """

  model: str = 'smollm2-135m'
  dtype: str = 'float32'
  data: str | None = None
  data_column: str | None = None
  data_label: str | None = None
  max_sentences: int | None = None
  max_tokens: int = 40
  artefacts: tuple[str, ...] = ('gradient', 'update', 'hidden')
  batch_sizes: tuple[int, ...] = (1, 16)
  num_batches: int = 1
  defenses: tuple[str, ...] = ('none', 'dp:8', 'freeze')
  layers: tuple[str, ...] = ('0', '15', 'last')
  local_steps: int = 2
  local_learning_rate: float = 1e-2
  finetune_steps: int = 10
  finetune_batch_size: int = 8
  finetune_learning_rate: float = 1e-4
  utility_seeds: int = 2
  heldout_fraction: float = 0.2
  dp_clip: float = 1.0
  dp_delta: float = 1e-5
  film_beams: int = 32
  film_steps: int = 20
  snapshot_beams: int = 64
  snapshot_length: int = 8
  # Audits made before the field resume only at 0, their behaviour.
  attacker_samples: int = dataclasses.field(default=400, metadata={'before': 0})
  seed: int = 0

  def __post_init__(self):
    models.parameter_dtype(self.dtype)
    for name in ('artefacts', 'batch_sizes', 'defenses', 'layers'):
      object.__setattr__(self, name, tuple(getattr(self, name)))
    object.__setattr__(self, 'layers', tuple(str(x) for x in self.layers))
    if not self.artefacts:
      raise LeakjaxError('no artefact to audit', f'use some of {ARTEFACTS}')
    for artefact in self.artefacts:
      if artefact not in ARTEFACTS:
        raise LeakjaxError(
          f'unknown artefact {artefact!r}',
          f'use some of {", ".join(ARTEFACTS)}, e.g.'
          ' --artefacts=gradient,update,hidden',
        )
    if len(set(self.artefacts)) != len(self.artefacts):
      raise LeakjaxError(f'an artefact is named twice: {self.artefacts}')
    for spec in self.defenses:
      parse_defense(spec)
    if 'none' not in self.defenses:
      # Every cost and every reduction is measured against no defense.
      object.__setattr__(self, 'defenses', ('none', *self.defenses))
    if len(set(self.defenses)) != len(self.defenses):
      raise LeakjaxError(f'a defense is named twice: {self.defenses}')
    check_positive(
      self,
      'batch_sizes',
      'num_batches',
      'max_tokens',
      'local_steps',
      'finetune_batch_size',
      'utility_seeds',
      'film_beams',
      'snapshot_beams',
      'snapshot_length',
    )
    check_positive(
      self,
      'finetune_steps',
      'film_steps',
      'attacker_samples',
      'seed',
      minimum=0,
    )
    if self.max_sentences is not None:
      check_positive(self, 'max_sentences')
    if 'hidden' in self.artefacts and not self.layers:
      raise LeakjaxError(
        'the hidden artefact needs --layers', 'e.g. --layers=0,15,last'
      )
    for layer in self.layers:
      if layer != 'last' and not (layer.isdigit()):
        raise LeakjaxError(
          f'bad layer {layer!r}', 'use block indices 0..L or last'
        )
    if not 0 < self.heldout_fraction < 1:
      raise LeakjaxError(
        f'heldout_fraction must be in (0, 1), got {self.heldout_fraction}'
      )
    for name in ('local_learning_rate', 'finetune_learning_rate', 'dp_clip'):
      value = getattr(self, name)
      if not (value > 0 and math.isfinite(value)):
        raise LeakjaxError(f'{name} must be positive, got {value}')
    if not 0 < self.dp_delta < 1:
      raise LeakjaxError(f'dp_delta must be in (0, 1), got {self.dp_delta}')
    if self.finetune_steps == 0 and (
      'snapshot' in self.artefacts
      or any(parse_defense(d)[0] == 'dp' for d in self.defenses)
    ):
      raise LeakjaxError(
        'finetune_steps=0: no fine-tuning, so no snapshot pair and no DP'
        ' noise calibration',
        'use --finetune_steps of at least 1',
      )

  def cells(self) -> list[tuple[str, int, str]]:
    """The (artefact, b, defense) attack cells, artefact by artefact;
    hidden states once per layer (`hidden:<layer>`); cells a defense does
    not change are left out (:func:`applies`)."""
    out = []
    for artefact in self.artefacts:
      names = (
        [artefact_name('hidden', x) for x in self.layers]
        if artefact == 'hidden'
        else [artefact]
      )
      sizes = (0,) if artefact == 'snapshot' else self.batch_sizes
      for name in names:
        for b in sizes:
          for defense in self.defenses:
            if applies(artefact, defense):
              out.append((name, b, defense))
    return out


__all__ = [
  'ARTEFACTS',
  'AuditConfig',
  'DEFENSE_KINDS',
  'TRAINING_DEFENSES',
  'applies',
  'artefact_name',
  'parse_defense',
]
