"""Why the DCT defense costs so much perplexity here, measured.

Wan et al. 2024 (Sec. 5.3.1, Table 6) report that the DCT/overlap
transform raises Llama2-7B's perplexity from 5.44 to 8.85 / 9.13; the
committed run (`reports/embed_parrot/results.jsonl`, rows `kind = ppl`)
gives 190 -> 3,754-46,951 on SmolLM2-135M. The transform is linear,
`E_trans = E A` with `A = C^T O_s C` (C the DCT), so its cost splits into
what it destroys (the part of E outside the range of A, which nothing can
restore) and what a model that knows A could undo (the rest). This script
re-creates the run's perplexity texts and defenses from `config.json`
(same corpora, split, sample and keys) and measures, at each defended
layer and number of subsets k:

* `ppl_defended`: the target fed `E A` (must equal the committed rows);
* `ppl_undone`: the target fed `E A A^+`, the least-squares recovery of E
  from `E A` (A^+ the pseudo-inverse): the perplexity of a provider that
  undoes the transform as well as any linear map can;
* `rank`: rank of A out of d;
* `lost_energy`: `|E - E A A^+|^2 / |E|^2` over the texts' real tokens,
  the share of the hidden states the transform destroys;
* `relative_change`: `|E A - E| / |E|`, how far the sent states are from
  the ones the frozen model expects.

Usage (repository root; ~2 min on the 2-core CPU):
  python -m studies.embed_parrot.dct_cost
writes `reports/embed_parrot/dct_cost.json`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app

from leakjax import data as data_lib
from leakjax import models
from leakjax.attacks.inversion import bei_hei, dct
from leakjax.attacks.inversion import runner as inv
from leakjax.attacks.inversion import texts as inv_texts
from leakjax.attacks.inversion.hidden_states import width_batches
from studies import report_dir

REPORT = report_dir(__file__)


def load_config() -> inv.InversionConfig:
  """The committed run's config (`reports/embed_parrot/config.json`)."""
  raw = json.loads((REPORT / 'config.json').read_text())
  names = {f.name for f in dataclasses.fields(inv.InversionConfig)}

  def tup(v):
    return tuple(tup(x) for x in v) if isinstance(v, list) else v

  fields = {k: tup(v) for k, v in raw.items() if k in names}
  # config.json keeps the corpora as (name, path) pairs.
  fields['corpora'] = tuple(
    c if isinstance(c, str) else '='.join(c) for c in fields['corpora']
  )
  return inv.InversionConfig(**fields)


def test_splits(cfg, tokenizer) -> dict[str, inv_texts.Split]:
  """The run's held-out test texts (the same draws, in the same order)."""
  rng = np.random.default_rng(cfg.seed)
  tests = {}
  for name, path in cfg.corpus_paths():
    texts = inv_texts.load_texts(name, path, name in cfg.sentence_split)
    train_texts, test_texts = data_lib.train_eval_split(
      texts, cfg.test_fraction, seed=cfg.seed
    )
    tests[name] = inv_texts.make_split(
      tokenizer, inv_texts.sample_texts(test_texts, cfg.num_test, rng), cfg
    )
    if name == cfg.train_corpus:  # the run draws its training texts here
      inv_texts.sample_texts(train_texts, cfg.num_train, rng)
  return tests


@functools.partial(jax.jit, static_argnames=('model', 'layer'))
def transformed_nll(model, params, ids, mask, right, *, layer):
  """Sequence NLL with `H^layer` replaced by `H^layer @ right`."""
  logits = bei_hei.logits_with_transform(
    model,
    params,
    ids,
    mask,
    layer=layer,
    transform=lambda h: (h.astype(jnp.float32) @ right).astype(h.dtype),
  )
  return bei_hei.sequence_nll(logits, ids, mask)


@functools.partial(jax.jit, static_argnames=('model', 'layers'))
def hidden_states(model, params, ids, mask, *, layers):
  return bei_hei.layer_states(model, params, ids, mask, list(layers))


def main(argv) -> None:
  del argv
  cfg = load_config()
  model, params = models.load(cfg.model)
  d = model.hidden_size
  tests = test_splits(cfg, model.tokenizer)
  ppl = {name: s.first(cfg.ppl_texts) for name, s in tests.items()}

  def batches():
    for split in ppl.values():
      for rows, real, width in width_batches(
        split.mask.sum(1), cfg.batch_size, split.ids.shape[1], multiple=32
      ):
        yield (
          jnp.asarray(split.ids[rows, :width]),
          jnp.asarray(split.mask[rows, :width]),
          real,
        )

  def corpus_ppl(layer, right) -> float:
    total = count = 0.0
    for ids, mask, real in batches():
      nll, cnt = transformed_nll(model, params, ids, mask, right, layer=layer)
      total += float(np.asarray(nll)[:real].sum())
      count += float(np.asarray(cnt)[:real].sum())
    return math.exp(total / max(count, 1.0))

  committed = {
    (r.get('layer'), r.get('subsets')): r['ppl']
    for r in map(json.loads, (REPORT / 'results.jsonl').open())
    if r.get('kind') == 'ppl'
  }
  key = jax.random.key(cfg.seed)
  eye = jnp.eye(d, dtype=jnp.float32)
  rows = [
    {
      'layer': None,
      'subsets': None,
      'ppl_defended': corpus_ppl(0, eye),
      'ppl_committed': committed[(None, None)],
    }
  ]
  print(json.dumps(rows[-1]), file=sys.stderr)
  for layer_name in cfg.defense_layers:
    layer = bei_hei.parse_layer(model, layer_name)
    states = []  # [tokens, d] per batch: the real rows' real tokens
    for ids, mask, real in batches():
      h = hidden_states(model, params, ids, mask, layers=(layer,))[0]
      h = np.asarray(h)
      states.append(h[:real][np.asarray(mask[:real], bool)].astype(np.float64))
    for subsets in cfg.defense_subsets:
      # The run's draw: inversion.sweeps.score_defenses folds 1000 + k in.
      defense = dct.make_dct_defense(
        d, subsets, key=jax.random.fold_in(key, 1000 + subsets)
      )
      a = np.asarray(defense.matrix, np.float64)
      a_pinv = np.linalg.pinv(a, rcond=1e-6)
      undo = a @ a_pinv
      lost = changed = norm = 0.0
      for e in states:
        lost += float(np.sum((e - e @ undo) ** 2))
        changed += float(np.sum((e @ a - e) ** 2))
        norm += float(np.sum(e**2))
      row = {
        'layer': str(layer_name),
        'subsets': subsets,
        'rank': int(np.linalg.matrix_rank(a, tol=1e-6)),
        'dim': d,
        'lost_energy': lost / norm,
        'relative_change': math.sqrt(changed / norm),
        'ppl_defended': corpus_ppl(layer, jnp.asarray(a, jnp.float32)),
        'ppl_undone': corpus_ppl(layer, jnp.asarray(undo, jnp.float32)),
        'ppl_committed': committed[(str(layer_name), subsets)],
      }
      rows.append(row)
      print(json.dumps(row), file=sys.stderr)
  out = {
    'model': cfg.model,
    'ppl_texts_per_corpus': cfg.ppl_texts,
    'corpora': [name for name, _ in cfg.corpus_paths()],
    'rows': rows,
  }
  (REPORT / 'dct_cost.json').write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  app.run(main)
