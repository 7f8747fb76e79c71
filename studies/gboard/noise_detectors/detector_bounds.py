"""How much of the σ = 0.1 word signal any per-word detector can reach.

Reads θ0 and the saved θ1 snapshots of a finished
`python -m experiments.gboard --flagfile=experiments/configs/gboard_sms.flags`
run (no training; its config from `<workdir>/config.json`), and writes
`reports/gboard/noise_detectors/bounds.json`:

* `genie_oracle`: a detector told every word's noise-free update vector
  (bias + 96 row entries, from the noise-free run with the same n_k, B, E)
  projects the noisy update on it; best single cut (chosen with the
  truth). A reference, not a strict bound: absent words are projected on
  their own noise-free drift, so frequent ones score high.
* `mixture_rule` / `mixture_oracle`: `gboard.mixture.mixture_word_posterior` with
  its no-oracle cut (`expected_f1_cut`) and with the best cut.
* `stouffer_rule` / `stouffer_oracle`: the rule it replaced (bias z +
  row chi-square, `max_f1_cut` among rising biases) and its best cut.
* `lambda1_over_edge`: the leading eigenvalue of the standardised
  (bias, row) updates in Marchenko-Pastur edges (the mixture's guard is 2).
All F1 values are divided by the vocabulary upper bound.

Usage (repository root):
  python -m studies.gboard.noise_detectors.detector_bounds \
      --workdir=W  # the workdir of experiments/configs/gboard_sms.flags
(`--bounds_settings`, `--bounds_out` and `--workdir` select another run,
e.g. the batch-summed loss of reports/gboard/batch_sum.)
"""

import json
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from absl import app, flags

from leakjax.attacks import gboard
from leakjax.attacks.gboard import clients, mixture, runner, thresholds
from leakjax.attacks.gboard import corpora as corpora_lib
from studies import report_dir

REPORT = report_dir(__file__)


def define_flags() -> None:
  flags.DEFINE_string(
    'workdir', None, 'A finished experiments.gboard run.', required=True
  )
  flags.DEFINE_string(
    'bounds_settings',
    '16:full:1,50,100,1000;64:32:1,50,100;256:32:1,50,100',
    'n_k:B:E,E,... groups with DPSGD-like σ = 0.1 and noise-free snapshots.',
  )
  flags.DEFINE_string(
    'bounds_out',
    'bounds.json',
    'Output file name, in reports/gboard/noise_detectors/.',
  )


def parse_settings(spec: str) -> list[tuple[int, str, tuple[int, ...]]]:
  """`--bounds_settings` as `(n_k, B, epochs)` groups."""
  out = []
  for group in spec.split(';'):
    n_k, batch, epochs = group.split(':')
    out.append((int(n_k), batch, tuple(int(e) for e in epochs.split(','))))
  return out


def word_f1(mask, truth, n_true):
  """F1 of the words in `mask` against the `n_true` typed words."""
  tp = int((mask & truth).sum())
  p = tp / max(int(mask.sum()), 1)
  r = tp / n_true
  return 0.0 if tp == 0 else 2 * p * r / (p + r)


def best_cut(score, truth, n_true, cand):
  """The best F1 over cuts of `score` among the candidates (chosen with
  the truth: an oracle)."""
  order = np.argsort(-np.where(cand, score, -np.inf))
  hits = np.cumsum(truth[order])
  k = np.arange(1, len(order) + 1)
  f1 = 2 * hits / (k + n_true)
  return float(f1[: int(cand.sum())].max())


def main(argv):
  del argv
  workdir = Path(flags.FLAGS.workdir)
  cfg = runner.load_config(workdir)
  corpora = corpora_lib.load_corpora(cfg)
  model, params0, _ = corpora_lib.pretrain(cfg, corpora, workdir)
  tok = model.tokenizer
  cand = np.asarray(
    gboard.candidate_mask(tok.vocab_size, (tok.unk_id, tok.bos_id))
  )
  index = {w: i for i, w in enumerate(tok.words)}
  datasets = {d.n_k: d for d in clients.make_datasets(cfg, corpora.pool, tok)}

  def update(name, e):
    p1 = gboard.load_snapshot(
      workdir / 'snapshots' / f'{name}_E{e}.safetensors', params0
    )
    return (
      np.asarray(gboard.bias_update(model, params0, p1)),
      np.asarray(gboard.output_rows_update(model, params0, p1)),
    )

  out = {}
  for n_k, batch, epochs in parse_settings(flags.FLAGS.bounds_settings):
    ds = datasets[n_k]
    truth = np.zeros(len(cand), bool)
    for w in ds.true_words:
      if w in index and cand[index[w]]:
        truth[index[w]] = True
    n_true = len(ds.true_words)
    upper = word_f1(truth, truth, n_true)
    for e in epochs:
      db, dw = update(f'n{n_k}_d0_B{batch}_dpsgd_0.1', e)
      cb, cw = update(f'n{n_k}_d0_B{batch}_none_0', e)
      steps = e * math.ceil(n_k / (n_k if batch == 'full' else int(batch)))
      sigma = cfg.learning_rate * 0.1 * math.sqrt(steps)  # Algorithm 3
      xn = np.concatenate([db[:, None], dw], 1) / sigma
      xc = np.concatenate([cb[:, None], cw], 1) / sigma
      unit = xc / (np.linalg.norm(xc, axis=1, keepdims=True) + 1e-12)
      genie = best_cut((xn * unit).sum(1), truth, n_true, cand)
      d, r, c = jnp.asarray(db), jnp.asarray(dw), jnp.asarray(cand)
      lo, post = mixture.mixture_word_posterior(d, r, c)
      lo = np.asarray(lo)
      rule = lo > float(mixture.expected_f1_cut(jnp.asarray(lo), post))
      old = np.asarray(thresholds.stouffer_words(d, r, c))
      z = np.asarray(thresholds.stouffer_scores(d, r, c))
      rose = db > 0
      x = xn[cand] - np.median(xn[cand], 0)
      x /= 1.4826 * np.median(np.abs(x))
      lam = np.linalg.eigvalsh(x.T @ x / len(x))[-1]
      edge = (1 + math.sqrt(x.shape[1] / len(x))) ** 2
      key = f'n_k={n_k},B={batch},E={e}'
      out[key] = {
        'noise_std': sigma,
        'genie_oracle': genie / upper,
        'mixture_rule': word_f1(rule & cand, truth, n_true) / upper,
        # None where the guard saw no signal (every log-odds -inf).
        'mixture_oracle': (
          best_cut(lo, truth, n_true, cand) / upper
          if float(post.sum()) > 0
          else None
        ),
        'mixture_kept': int(rule.sum()),
        'stouffer_rule': word_f1(old & cand, truth, n_true) / upper,
        'stouffer_oracle': best_cut(
          np.where(rose, z, -np.inf), truth, n_true, cand
        )
        / upper,
        'lambda1_over_edge': float(lam / edge),
        'true_in_vocab': int(truth.sum()),
        'f1_upper': upper,
      }
      print(
        key,
        {k: v if v is None else round(v, 3) for k, v in out[key].items()},
        flush=True,
      )
  path = REPORT / flags.FLAGS.bounds_out
  path.write_text(json.dumps(out, indent=1, sort_keys=True) + '\n')
  print(f'Wrote {path}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
