"""The paper's pruning rule with an untied LM head, on the committed run's batches.

FILM Sec. 6.3 (Gupta et al., NeurIPS 2022) reads the bag under gradient
pruning as the embedding rows that stay non-zero, and reports precision
1.00 at every prune ratio (Table 4a). With SmolLM2's tied head every row of
the embedding gradient is dense, so the rule returns most of the vocabulary
(`reports/film_bag/defenses/README.md`). This script measures what the same rule
gives when the head is untied: SmolLM2-135M with its LM head made a
separate copy of the embedding matrix (the same function: logits are
checked equal), so the embedding gradient holds only the input rows. Same
batches, keys and per-tensor pruning as the committed run (its
`config.json`).

Usage (repository root; ~12 min on the 2-core CPU):
  python -m studies.film_bag.defenses.untied
writes `reports/film_bag/defenses/untied.json`.
"""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app

from leakjax import data as data_lib
from leakjax import metrics, models
from leakjax.attacks.film import client, runner
from leakjax.models import llama
from leakjax.recovery import bag as bow
from studies import report_dir
from studies.film_bag.defenses.dp_bound import load_config

REPORT = report_dir(__file__)


def untie(model, params):
  """The same Llama-family model with a separate LM head (kernel = E^T)."""
  config = dataclasses.replace(model.config, tie_word_embeddings=False)
  emb = models.get_path(params, model.paths.word_embeddings)
  untied = llama.make_model(config, tokenizer=model.tokenizer, dtype=emb.dtype)
  return untied, {**params, 'lm_head': {'kernel': emb.T}}


def main(argv) -> None:
  del argv
  cfg = load_config()
  texts = data_lib.load_corpus(cfg.data)
  tied, tied_params = models.load(cfg.model)
  model, params = untie(tied, tied_params)
  ids, _ = model.tokenizer.encode_batch(
    ['Please send the report.'], add_bos=True
  )
  np.testing.assert_allclose(
    np.asarray(model.logits(params, jnp.asarray(ids))),
    np.asarray(tied.logits(tied_params, jnp.asarray(ids))),
    rtol=1e-4,
    atol=1e-4,
  )
  sentences = runner.private_sentences(cfg, texts, model.tokenizer)
  train, _ = data_lib.train_eval_split(
    sentences, cfg.eval_fraction, seed=cfg.seed
  )
  specs = [s for s in cfg.defenses if s == 'none' or s.startswith('prune:')]
  b = cfg.batch_sizes[0]
  rows = []
  for index in range(cfg.num_batches):
    batch = [
      train[i] for i in client.draw_batch(len(train), b, index, cfg.seed)
    ]
    key = jax.random.fold_in(
      jax.random.fold_in(jax.random.key(cfg.seed), b), index
    )
    for spec in specs:
      defense, _ = client.make_defense(
        model, spec, cfg, num_train=len(train), b=b
      )
      grads, ids, mask = client.client_gradient(
        model, params, batch, defense, key
      )
      emb = models.get_path(grads, model.paths.word_embeddings)
      found = np.flatnonzero(np.asarray(bow.nonzero_rows(emb)))
      truth = client.true_tokens(ids, mask)
      # Tokens that occur only as a sentence's last token feed no prediction.
      inner, last = set(), set()
      for row, m in zip(np.asarray(ids), np.asarray(mask)):
        toks = row[: int(m.sum())].tolist()
        inner.update(toks[:-1])
        last.add(toks[-1])
      p, r = metrics.bag_precision_recall(found.tolist(), truth)
      rows.append(
        {
          'batch': index,
          'defense': spec,
          'bag_precision': p,
          'bag_recall': r,
          'bag_size': len(found),
          'true_bag_size': len(truth),
          'last_only_tokens': len(last - inner),
          'missed_last_only': len((last - inner) - set(found.tolist())),
        }
      )
      print(json.dumps(rows[-1]), file=sys.stderr)
  means = {}
  for spec in specs:
    sel = [r for r in rows if r['defense'] == spec]
    means[spec] = {
      k: float(np.mean([r[k] for r in sel]))
      for k in ('bag_precision', 'bag_recall', 'bag_size')
    }
  out = {
    'model': f'{cfg.model} with an untied copy of its LM head',
    'data': cfg.data,
    'b': b,
    'num_batches': cfg.num_batches,
    'rule': 'nonzero',
    'mean': means,
    'rows': rows,
  }
  (REPORT / 'untied.json').write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  app.run(main)
