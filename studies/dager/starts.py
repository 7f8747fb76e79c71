"""How well the head gradient at BOS names the sentences' first tokens.

On the pretrained SmolLM2-135M at t = 0, FILM's Enron sentences and the
client's FedSGD gradient as in `experiments.dager` (b = 64 batches 0-2 and
b = 128 batch 0, past the rank limit d = 576), this estimates how many
sentences start with each of the hybrid's candidates
(:func:`leakjax.attacks.dager.hybrid.estimate_starts`, 64 directions, the
setting of `dager_hybrid_starts.flags`), hands out one start per sentence
(:func:`hybrid.allocate_starts`) and scores, per batch:

* `allocated_hits`: how many of the b allocated first tokens are the
  sentences' (as multisets);
* `corr`: the correlation of the estimated and the true counts over the
  candidates;
* `distinct`: the batch's distinct first tokens, and how many of them are
  among the same number of largest estimates (`distinct_in_top`);
* the first-word hits (multisets of first whitespace-separated words) of
  the default hybrid's recovered sentences (`hybrid/results.jsonl`) and
  of the run with allocated starts (`hybrid_starts/results.jsonl`) where
  they hold the batch.

And `prior`: the LM's three likeliest tokens after a first word ('The',
'While', 'So') that follows SmolLM2's declared BOS `<|im_start|>`, and
after `<|endoftext|>` (token 0, `HybridConfig.prior_start`).

Writes `reports/dager/starts.json`.

Usage (repository root):
  python -m studies.dager.starts
"""

import collections
import json

import jax
import numpy as np
from absl import app

from leakjax import data as data_lib
from leakjax import models
from leakjax.attacks.dager import client, hybrid, runner
from leakjax.recovery import bag as bow
from studies import report_dir

REPORT = report_dir(__file__)
BATCHES = ((64, 0), (64, 1), (64, 2), (128, 0))
DIMS = 64


def first_word_hits(originals: list[str], recovered: list[str]) -> int:
  first = lambda texts: collections.Counter(  # noqa: E731
    t.split()[0] for t in texts if t.split()
  )
  return sum((first(originals) & first(recovered)).values())


def run_rows(name: str) -> dict:
  path = REPORT / name / 'results.jsonl'
  if not path.exists():
    return {}
  rows = [json.loads(x) for x in path.open()]
  return {(r['b'], r['batch']): r for r in rows if r['attack'] == 'hybrid'}


def main(argv):
  del argv
  cfg = runner.DagerConfig(
    model='smollm2-135m',
    data='film-enron',
    max_sentences=2000,
    hybrid=hybrid.HybridConfig(start_dims=DIMS),
  )
  config = runner.hybrid_config(cfg)
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  texts = data_lib.load_corpus(cfg.data)
  sentences = runner.private_sentences(cfg, texts, model.tokenizer)
  strings = model.tokenizer.token_strings()
  runs = {k: run_rows(k) for k in ('hybrid', 'hybrid_starts')}
  out = {'dims': DIMS, 'batches': []}
  for b, index in BATCHES:
    ((_, batch),) = client.consecutive_batches(sentences, b, 1, index)
    grads, ids, mask = client.batch_gradient(
      model, params, batch, b, index, 'none', cfg
    )
    bag = bow.extract_bag(model, params, grads)
    _, padded, valid = hybrid.candidate_tokens(
      model, params, grads, bag, config
    )
    allowed = hybrid.start_mask(strings, padded, valid)
    picks, counts, _, _ = hybrid.plan_starts(
      model,
      params,
      grads,
      padded,
      valid,
      allowed,
      b,
      b,
      key=jax.random.key(0),
      config=config,
    )
    true = collections.Counter(int(t) for t in ids[:, 1])
    got = collections.Counter(int(padded[j]) for j in picks)
    truth = np.array([true.get(int(t), 0) for t in padded], np.float64)
    distinct = len(true)
    order = np.argsort(-np.where(valid, counts, -np.inf))[:distinct]
    entry = {
      'b': b,
      'batch': index,
      'allocated_hits': sum((true & got).values()),
      'corr': float(np.corrcoef(counts[valid], truth[valid])[0, 1]),
      'distinct': distinct,
      'distinct_in_top': int((truth[order] > 0).sum()),
      'firsts_in_candidates': int(
        sum(true[t] for t in true if t in set(padded[valid].tolist()))
      ),
    }
    for name, rows in runs.items():
      row = rows.get((b, index))
      if row is not None:
        entry[f'first_word_hits,{name}'] = first_word_hits(
          row['originals'], row['recovered']
        )
        entry[f'rougeL,{name}'] = row['rougeL']
    out['batches'].append(entry)
    print(json.dumps(entry), flush=True)
  tok = model.tokenizer
  out['prior'] = {}
  for name, start in (('bos', tok.bos_id), ('endoftext', 0)):
    for word in ('The', 'While', 'So'):
      ids = [start] + tok.encode(word)
      z = model.logits(
        params, np.asarray([ids], np.int32), np.ones((1, len(ids)), np.int32)
      )
      top = np.argsort(-np.asarray(z[0, -1], np.float32))[:3]
      out['prior'][f'{name},{word}'] = [strings[int(t)] for t in top]
  (REPORT / 'starts.json').write_text(json.dumps(out, indent=2) + '\n')


if __name__ == '__main__':
  app.run(main)
