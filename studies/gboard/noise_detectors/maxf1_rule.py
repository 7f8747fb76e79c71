"""The superseded 'maxf1' bias threshold, kept for comparison.

Until the Stouffer and mixture rules (leakjax.attacks.gboard), the noisy
regime was cut on the bias alone by `choose_threshold(delta, 'maxf1')`:
the cut on the robust bias z-scores that maximises the *estimated* F1 under
a Gaussian null (:func:`leakjax.attacks.gboard.thresholds.max_f1_cut`). Above a cut t,
`k(t)` entries pass and `V Φ(-t)` of them are expected from the null, so
`TP(t) ≈ k(t) - V Φ(-t)`; the number of typed words is estimated as
`n1 = max_t TP(t)` and the cut maximises `2 TP(t) / (k(t) + n1)`. Unlike
'fdr' (precision >= 1 - q) it trades precision for recall when the typed
words sit only 2-4 noise scales up. No experiment selects it any more; it
left the library's `choose_threshold` in the stage-2 redesign.

Reads the DPSGD-like bias updates (`<workdir>/deltas/*.npy`) of a finished
`python -m experiments.gboard` run (no training: θ0 is loaded from
`<workdir>/pretrain`) and prints word F1 / upper bound of the 'fdr' bias
cut, the 'maxf1' bias cut and the run's own rule (results.jsonl).

Usage (repository root):
  python -m studies.gboard.noise_detectors.maxf1_rule \
      --workdir=W  # the workdir of experiments/configs/gboard_sms.flags
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax import metrics
from leakjax.attacks import gboard
from leakjax.attacks.gboard import clients, runner, thresholds
from leakjax.attacks.gboard import corpora as corpora_lib


def define_flags() -> None:
  flags.DEFINE_string(
    'workdir', None, 'A finished experiments.gboard run.', required=True
  )


def maxf1_threshold(
  delta: jax.Array,
  candidates: jax.Array | None = None,
  eligible: jax.Array | None = None,
) -> jax.Array:
  """The former `choose_threshold(delta, 'maxf1')`: float32 cut, >= 0.

  Args:
    delta: `b1 - b0`, float `[vocab]`.
    candidates: optional bool `[vocab]` of ids that may be words; the noise
      and the number of tests V are taken over them.
    eligible: optional bool `[vocab]`: only these entries are counted in
      `k(t)` (e.g. `b1 - b0 > 0`).
  """
  delta = delta.astype(jnp.float32)
  if candidates is None:
    candidates = jnp.ones(delta.shape, bool)
  center, scale = thresholds.robust_noise_scale(delta, candidates)
  cut = thresholds.max_f1_cut((delta - center) / scale, candidates, eligible)
  return jnp.maximum(center + scale * cut, 0.0)


def main(argv):
  del argv
  workdir = Path(flags.FLAGS.workdir)
  cfg = runner.load_config(workdir)
  corpora = corpora_lib.load_corpora(cfg)
  model, _, _ = corpora_lib.pretrain(cfg, corpora, workdir)
  tok = model.tokenizer
  cand = gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  vocab, vocab_set = tok.words, set(tok.words[2:])
  datasets = {
    (d.n_k, d.index): d for d in clients.make_datasets(cfg, corpora.pool, tok)
  }
  rows = [
    json.loads(line)
    for line in (workdir / 'results.jsonl').read_text().splitlines()
  ]
  for path in sorted((workdir / 'deltas').glob('*.npy')):
    # n{n_k}_d{index}_B{B}_dpsgd_{sigma}_E{E}.npy
    name, e = path.stem.rsplit('_E', 1)
    n_k, d, b, _, sigma = name.split('_')
    ds = datasets[(int(n_k[1:]), int(d[1:]))]
    delta = jnp.asarray(np.load(path))

    def f1(mask, ds=ds):
      words = [vocab[k] for k in np.flatnonzero(np.asarray(mask))]
      m = metrics.word_metrics(words, ds.true_words, vocab_set)
      return m.f1 / m.f1_upper if m.f1_upper else 0.0

    fdr = gboard.choose_threshold(delta, 'fdr', q=cfg.fdr_q, candidates=cand)
    got = {
      'fdr': f1(gboard.recover_words(delta, fdr, cand)),
      'maxf1': f1(gboard.recover_words(delta, maxf1_threshold(delta, cand))),
    }
    rule = [
      r
      for r in rows
      if r.get('noise') == 'dpsgd'
      and r['n_k'] == ds.n_k
      and r['dataset'] == ds.index
      and r['B'] == b[1:]
      and f'{r["sigma"]:g}' == sigma
      and r['E'] == int(e)
    ]
    if rule:
      got[cfg.threshold_rule] = rule[0]['f1'] / rule[0]['f1_upper']
    print(path.stem, {k: round(v, 3) for k, v in got.items()}, flush=True)


if __name__ == '__main__':
  define_flags()
  app.run(main)
