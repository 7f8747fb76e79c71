"""leakjax: measure how much private text leaks from language-model training.

Subpackages (imported on first use):

* `leakjax.models` -- the :class:`~leakjax.models.LanguageModel` protocol,
  `from_functions` / `from_flax` for your own model, and our Flax GPT-2,
  Llama and LSTM families with real weights (`load`, `save`);
* `leakjax.fl` -- federated clients (FedSGD, FedAvg) and defenses;
* `leakjax.attacks` -- FILM, GBoard, differential score / rank, embedding
  inversion, as jittable kernels and one runner per paper;
* `leakjax.metrics` -- what an attack recovered: ROUGE, NERR, token and
  word F1, word-level Levenshtein ratio, Sentence-BERT similarity;
* `leakjax.data` -- corpora and batching;
* `leakjax.train` -- the one training loop (`fit`) and language-model
  fine-tuning (`train`).
"""

import importlib

from leakjax.errors import LeakjaxError

__version__ = '0.1.0'

_SUBPACKAGES = ('attacks', 'data', 'fl', 'metrics', 'models', 'train')


def __getattr__(name):
  if name in _SUBPACKAGES:
    return importlib.import_module(f'leakjax.{name}')
  raise AttributeError(f'module leakjax has no attribute {name!r}')


__all__ = ['LeakjaxError', '__version__', *_SUBPACKAGES]
