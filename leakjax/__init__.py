"""leakjax: measure how much private text leaks from language-model training.

Subpackages: `leakjax.models` (Flax GPT-2, Llama, LSTMs with real weights),
`leakjax.fl` (federated clients and defenses), `leakjax.attacks` (FILM,
GBoard, differential score, embedding inversion), `leakjax.train`.
"""

from leakjax.errors import LeakjaxError

__version__ = '0.1.0'

__all__ = ['LeakjaxError', '__version__']
