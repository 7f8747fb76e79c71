"""BEI and HEI on a LoRA fine-tuned target (Wan et al. 2024, Appendix 7.1).

The paper fine-tunes its targets with LoRA (Llama2-7B: the query, key,
value and output projections; four epochs) and inverts the hidden states
of the fine-tuned model on the texts it was trained on (Tables 9 and 10):
is data easier to recover from a model trained on it? This script asks the
same of SmolLM2-135M:

1. the texts: the committed run's 1,200 Embed Parrot training texts
   (FILM's Enron sentences, the same draw as
   `reports/embed_parrot/config.json`; `--texts=N` keeps the first N);
2. LoRA (`leakjax.lora`, rank 8, alpha 16) on every block's q/k/v/o
   projections, Adam at `--lr`, batches of 8, `--epochs` epochs over those
   texts (the paper gives no rank, rate or batch; these are ours);
3. BEI and HEI at every layer of the committed run (`config.json`'s
   `layers`) on the same texts, from the pretrained model and from the
   fine-tuned one, plus each model's perplexity on them.

Usage (repository root; ~35 min on the 2-core CPU):
  python -m studies.embed_parrot.lora
writes `reports/embed_parrot/lora.json`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax import data as data_lib
from leakjax import lora, models
from leakjax import train as train_lib
from leakjax.attacks.inversion import bei_hei, hidden_states, scoring
from leakjax.attacks.inversion import texts as inv_texts
from studies import report_dir
from studies.embed_parrot.dct_cost import load_config

REPORT = report_dir(__file__)

# Wan et al. 2024, Table 10: HEI ROUGE-1 (%) on the fine-tuning texts, by
# layer (0, 5, 10, 15, 20, 25, last), before and after LoRA fine-tuning.
PAPER_TABLE10_ROUGE1 = {
  'Llama2-7B': (65.22, 58.93, 53.09, 50.11, 44.38, 34.39, 19.51),
  'FT Llama2-7B': (65.22, 58.82, 52.34, 49.45, 44.35, 33.45, 6.17),
  'ChatGLM-6B': (100.00, 96.72, 92.17, 89.89, 61.05, 55.28, 41.37),
  'FT ChatGLM-6B': (100.00, 96.68, 92.91, 90.15, 68.34, 56.32, 54.48),
}
PAPER_LAYERS = ('0', '5', '10', '15', '20', '25', 'last')


def train_split(cfg, tokenizer) -> inv_texts.Split:
  """The run's Embed Parrot training texts (the same draws, in order)."""
  rng = np.random.default_rng(cfg.seed)
  for name, path in cfg.corpus_paths():
    texts = inv_texts.load_texts(name, path, name in cfg.sentence_split)
    train_texts, test_texts = data_lib.train_eval_split(
      texts, cfg.test_fraction, seed=cfg.seed
    )
    inv_texts.sample_texts(test_texts, cfg.num_test, rng)
    if name == cfg.train_corpus:
      return inv_texts.make_split(
        tokenizer, inv_texts.sample_texts(train_texts, cfg.num_train, rng), cfg
      )
  raise SystemExit(f'no corpus named {cfg.train_corpus}')


def perplexity(model, params, split: inv_texts.Split, batch_size: int) -> float:
  """exp(mean next-token NLL) over the split's real tokens."""
  fn = jax.jit(model.token_log_probs)
  total, count = 0.0, 0.0
  for rows, real, width in hidden_states.width_batches(
    split.mask.sum(1), batch_size, split.ids.shape[1], multiple=32
  ):
    ids = jnp.asarray(split.ids[rows, :width])
    mask = jnp.asarray(split.mask[rows, :width])
    logp = np.asarray(fn(params, ids, mask))[:real]
    w = np.asarray(mask[:, 1:] * mask[:, :-1])[:real]
    total -= float((logp * w).sum())
    count += float(w.sum())
  return math.exp(total / count)


def invert(model, params, split, cfg, layers) -> dict[str, dict]:
  """Mean F1 / ROUGE-1 / ROUGE-L of BEI and HEI per layer."""
  out = hidden_states.run_target(
    model, params, split, cfg, decode_layers=layers, keep_layers=[]
  )
  rows = {}
  for li, layer in enumerate(layers):
    for method in ('bei', 'hei'):
      preds = bei_hei.decode_ids(
        model.tokenizer, out[method][li], split.score_mask
      )
      scores = scoring.score_texts(preds, split.references)
      rows[f'{method}@layer={layer}'] = {
        m: float(np.mean(v)) for m, v in scores.items()
      }
  return rows


def define_flags() -> None:
  flags.DEFINE_integer(
    'texts', None, 'Keep the first N training texts (default: all).'
  )
  flags.DEFINE_integer('epochs', 4, 'LoRA epochs over the texts.')
  flags.DEFINE_integer('rank', 8, 'LoRA rank (alpha = 2 x rank).')
  flags.DEFINE_float('lr', 5e-4, "Adam's learning rate.")
  flags.DEFINE_string('out', str(REPORT / 'lora.json'), 'Output JSON.')


def main(argv) -> None:
  del argv
  f = flags.FLAGS
  cfg = load_config()
  model, params = models.load(cfg.model)
  split = train_split(cfg, model.tokenizer)
  if f.texts is not None:
    split = split.first(f.texts)
  layers = [bei_hei.parse_layer(model, x) for x in cfg.layers]
  lcfg = lora.LoraConfig(rank=f.rank, alpha=2.0 * f.rank)
  batch_size = 8
  steps = f.epochs * (len(split.texts) // batch_size)
  ids, mask = split.ids, split.mask
  lengths = mask.sum(1)

  def make_batch(rows):
    width = int(min(ids.shape[1], 16 * math.ceil(lengths[rows].max() / 16)))
    return lora.Batch(
      jnp.asarray(ids[rows, :width]), jnp.asarray(mask[rows, :width])
    )

  t0 = time.time()
  adapters = lora.init(params, lcfg, key=jax.random.key(cfg.seed))
  result = train_lib.fit(
    lora.LoraLoss(model, lcfg),
    adapters,
    make_batch,
    len(split.texts),
    train_lib.TrainConfig(
      optimizer='adam',
      learning_rate=f.lr,
      schedule='constant',
      batch_size=batch_size,
      num_steps=steps,
      drop_remainder=True,
      log_every=max(steps // 8, 1),
      seed=cfg.seed,
    ),
    frozen=params,
    desc='LoRA',
  )
  tuned = lora.merge(params, result.params, lcfg)
  seconds_train = time.time() - t0
  report = {
    'settings': {
      'model': cfg.model,
      'texts': len(split.texts),
      'corpus': cfg.train_corpus,
      'epochs': f.epochs,
      'steps': steps,
      'batch_size': batch_size,
      'rank': lcfg.rank,
      'alpha': lcfg.alpha,
      'targets': lcfg.targets,
      'adapted_kernels': len(result.params),
      'adapter_params': int(
        sum(x.size for x in jax.tree.leaves(result.params))
      ),
      'optimizer': 'adam',
      'learning_rate': f.lr,
      'layers': [str(x) for x in layers],
      'max_length': cfg.max_length,
    },
    'train_loss': [
      {'step': h['step'], 'loss': h['loss']} for h in result.history
    ],
    'ppl': {
      'base': perplexity(model, params, split, cfg.batch_size),
      'lora': perplexity(model, tuned, split, cfg.batch_size),
    },
    'base': invert(model, params, split, cfg, layers),
    'lora': invert(model, tuned, split, cfg, layers),
  }
  report['seconds'] = {'train': seconds_train, 'total': time.time() - t0}
  Path(f.out).write_text(json.dumps(report, indent=1) + '\n')
  print(f'ppl {report["ppl"]["base"]:.1f} -> {report["ppl"]["lora"]:.1f}')
  for key in report['base']:
    b, t = report['base'][key]['rouge1'], report['lora'][key]['rouge1']
    print(f'{key}: ROUGE-1 {b:.3f} -> {t:.3f}')
  print(f'wrote {f.out}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
