"""LSTM hyperparameters: GBoard's :class:`CIFGConfig`, :class:`LSTMConfig`."""

from __future__ import annotations

import dataclasses

import numpy as np

from leakjax.errors import LeakjaxError


@dataclasses.dataclass(frozen=True)
class CIFGConfig:
  """GBoard's CIFG-LSTM next-word model (Suliman & Leith Sec. 2.3).

  Attributes:
    vocab_size: words including `<UNK>` and `<S>` (V=9502).
    embed_dim: input embedding width (D=96).
    units: LSTM cell width, the size of the state `C_t` (670).
    proj_dim: width of the projected output `h_t` (96 = D, so that the
      output matrix can be the input embedding); None for no projection.
    num_layers: stacked CIFG layers (GBoard: 1).
    tie_word_embeddings: logits `W h + b` with `W` the input embedding.
  """

  vocab_size: int = 9502
  embed_dim: int = 96
  units: int = 670
  proj_dim: int | None = 96
  num_layers: int = 1
  tie_word_embeddings: bool = True

  family = 'cifg_lstm'
  cifg = True
  dropout_keep = 1.0

  def __post_init__(self):
    _validate(self, self.units, self.proj_dim)

  @classmethod
  def gboard(cls) -> CIFGConfig:
    """The extracted GBoard model's shape (Suliman & Leith Sec. 2.3)."""
    return cls()

  @property
  def output_dim(self) -> int:
    """Width of each layer's output (`proj_dim`, or `units`)."""
    return self.proj_dim or self.units

  @property
  def hidden_size(self) -> int:
    """Width of `Model.hidden_states` and of `lm_head`'s input."""
    return self.output_dim

  @property
  def max_length(self) -> None:
    return None  # a recurrence has no context limit


@dataclasses.dataclass(frozen=True)
class LSTMConfig:
  """A word-level LSTM language model (standard LSTM cell, no projection).

  Attributes:
    vocab_size: words including `<UNK>` and `<S>`.
    embed_dim: input embedding width.
    hidden_size: LSTM cell and output width of every layer.
    num_layers: stacked LSTM layers.
    dropout_keep: keep probability of the dropout on every layer's input and
      on the last layer's output (the non-recurrent connections); used only
      by `Model.train_logits`. 1.0 means no dropout.
    tie_word_embeddings: use the input embedding as the softmax matrix; needs
      `embed_dim == hidden_size`.
  """

  vocab_size: int
  embed_dim: int
  hidden_size: int
  num_layers: int = 1
  dropout_keep: float = 1.0
  tie_word_embeddings: bool = False

  family = 'lstm'
  cifg = False
  proj_dim = None

  def __post_init__(self):
    _validate(self, self.hidden_size, None)
    if not 0.0 < self.dropout_keep <= 1.0:
      raise LeakjaxError(
        f'dropout_keep={self.dropout_keep} is not a probability in (0, 1]',
        'pass a keep probability such as 0.9',
      )

  @classmethod
  def ptb_small(cls, vocab_size: int = 10_000) -> LSTMConfig:
    """2 layers, 200-dim embeddings and states, no regularization.

    Zanella-Beguelin et al. Sec. 4.1 (Penn Treebank), the small configuration
    of Zaremba et al., whose softmax is not tied to the embedding.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=200,
      hidden_size=200,
      num_layers=2,
      dropout_keep=1.0,
      tie_word_embeddings=False,
    )

  @classmethod
  def medium_512(cls, vocab_size: int = 10_000) -> LSTMConfig:
    """1 layer, 512-dim states, 160-dim embeddings, dropout keep 0.9.

    Zanella-Beguelin et al. Sec. 4.1 (Reddit, model (1)). The paper names no
    projection layer, so the 512-dim LSTM output feeds an untied softmax
    `[512, vocab]` (with bias) directly; tying is impossible as 160 != 512.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=160,
      hidden_size=512,
      num_layers=1,
      dropout_keep=0.9,
      tie_word_embeddings=False,
    )

  @classmethod
  def wikitext_512(cls, vocab_size: int = 20_000) -> LSTMConfig:
    """2 layers, 512-dim states and embeddings, dropout keep 0.9.

    Zanella-Beguelin et al. Sec. 4.1 (Wikitext-103); untied as in the paper.
    """
    return cls(
      vocab_size=vocab_size,
      embed_dim=512,
      hidden_size=512,
      num_layers=2,
      dropout_keep=0.9,
      tie_word_embeddings=False,
    )

  @property
  def units(self) -> int:
    return self.hidden_size

  @property
  def output_dim(self) -> int:
    return self.hidden_size

  @property
  def max_length(self) -> None:
    return None  # a recurrence has no context limit


LSTMFamilyConfig = CIFGConfig | LSTMConfig


def _validate(config, units: int, proj_dim: int | None) -> None:
  name = type(config).__name__
  sizes = dict(
    vocab_size=config.vocab_size,
    embed_dim=config.embed_dim,
    units=units,
    num_layers=config.num_layers,
  )
  if proj_dim is not None:
    sizes['proj_dim'] = proj_dim
  for field, value in sizes.items():
    if (
      not isinstance(value, (int, np.integer))
      or isinstance(value, bool)
      or value < 1
    ):
      raise LeakjaxError(f'{name}.{field}={value!r} must be a positive int')
  out = proj_dim or units
  if config.tie_word_embeddings and config.embed_dim != out:
    raise LeakjaxError(
      f'{name}: tied embeddings need embed_dim ({config.embed_dim}) equal'
      f' to the output width ({out})',
      'set tie_word_embeddings=False or make the widths equal',
    )
