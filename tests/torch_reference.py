"""Shared helpers for tests that use transformers (PyTorch) as the reference."""

import numpy as np


def torch_lm_loss_backward(hf_model, ids: np.ndarray, vocab_size: int) -> float:
  """Mean next-token cross-entropy of `ids` under `hf_model`, after
  which its parameters hold the gradient (`.grad`); returns the loss."""
  import torch  # pylint: disable=g-import-not-at-top

  hf_model.zero_grad()
  logits = hf_model(torch.tensor(ids, dtype=torch.long)).logits
  loss = torch.nn.functional.cross_entropy(
    logits[:, :-1].reshape(-1, vocab_size),
    torch.tensor(ids[:, 1:], dtype=torch.long).reshape(-1),
  )
  loss.backward()
  return loss.item()
