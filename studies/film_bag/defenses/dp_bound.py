"""How much any row-wise bag attack can recover under the committed DP-SGD run.

FILM Sec. 6.3 (Gupta et al., NeurIPS 2022) thresholds the noisy embedding
gradient's rows; Table 4b reports precision / recall 0.97 / 0.49 at ε = 15
and 0.88 / 0.17 at ε = 10. Our run of that rule finds nothing at any ε
(`reports/film_bag/defenses/README.md`). This script measures why, and
how far any stronger rule on the rows could go, on the same batches, model
and σ as the committed run (`config.json`, `dp_sigma.json` in that
folder):

1. For each batch it computes the DP-SGD sum without noise: every
   example's gradient clipped to norm C, summed (`fl.dp_sgd(C, 0)`). The
   client sends this sum plus N(0, σ²C²) on every coordinate (then divides
   by b, which changes nothing below). Each vocabulary row v of the tied
   embedding gradient is then `s_v + n_v`, with `s_v` the clean row and
   `n_v ~ N(0, σ²C² I_d)`.
2. The signal-to-noise ratio of a batch token is `|s_v| / (σC)`.
3. Two idealised attackers, both in the attacker's favour: every row
   outside the batch is taken to be pure noise (in the tied model it also
   carries a small head term), and
   * `matched`: the attacker knows each batch row's direction `s_v / |s_v|`
     (an oracle); its statistic `<r_v, s_v> / (|s_v| σC)` is N(SNR, 1) on a
     batch row and N(0, 1) elsewhere (for rows outside the batch, under the
     pure-noise assumption, any fixed unit direction gives N(0, 1));
   * `energy`: no direction, the row's squared norm over σ²C², a
     non-central χ²_d(SNR²) on a batch row and χ²_d elsewhere (the
     strongest test that knows only the noise law; the paper's max-entry
     rule is weaker for a row whose signal is spread over d coordinates).
   One threshold for all rows; the expected precision / recall follow in
   closed form. The script reports, per ε, the highest expected recall at
   which the expected precision still reaches the paper's, and the
   precision at the paper's recall.

A row-wise attack that beats `matched` would need information beyond one
row (structure across rows or layers). The statement is per batch and
averaged over the run's batches.

Usage (repository root; ~8 min on the 2-core CPU, per-example gradients
dominate):
  python -m studies.film_bag.defenses.dp_bound
  python -m studies.film_bag.defenses.dp_bound --reuse   # re-analyse
writes `reports/film_bag/defenses/dp_bound.json`.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np
from absl import app, flags
from scipy import stats

from leakjax import data as data_lib
from leakjax import fl, io, models
from leakjax.attacks.film import client, runner
from studies import report_dir

REPORT = report_dir(__file__)

# FILM Table 4b (GPT-2, WikiText-103, b = 16): ε -> (precision, recall).
PAPER = {15.0: (0.97, 0.49), 10.0: (0.88, 0.17), 5.0: (0.29, 0.01)}


def load_config() -> runner.FilmConfig:
  """The committed run's config (`reports/film_bag/defenses/config.json`)."""
  raw = json.loads((REPORT / 'config.json').read_text())
  return io.config_from_json(runner.FilmConfig, raw)


def run_fields(cfg) -> dict:
  """What the committed DP-SGD run fixes: model, data, b, batches, C."""
  return {
    'model': cfg.model,
    'data': cfg.data,
    'b': cfg.batch_sizes[0],
    'num_batches': cfg.num_batches,
    'clip_norm': cfg.dp_clip,
  }


def expected_pr(
  tp_survival: np.ndarray, null_survival: np.ndarray, num_null: int
) -> tuple[np.ndarray, np.ndarray]:
  """Expected precision / recall over thresholds.

  Args:
    tp_survival: [T, S] P(batch row s passes threshold t).
    null_survival: [T] P(a noise row passes threshold t).
    num_null: rows outside the batch.
  """
  tp = tp_survival.sum(1)
  fp = num_null * null_survival
  precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1e-300), 1.0)
  recall = tp / tp_survival.shape[1]
  return precision, recall


def best_recall(precision, recall, target: float) -> float:
  ok = precision >= target
  return float(recall[ok].max()) if ok.any() else 0.0


def precision_at(precision, recall, target: float) -> float:
  ok = recall >= target
  return float(precision[ok].max()) if ok.any() else 0.0


def bounds(
  snr: np.ndarray, dim: int, vocab: int, names=('matched', 'energy')
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Expected P/R curves of the idealised attackers for one batch."""
  num_null = vocab - len(snr)
  out = {}
  if 'matched' in names:  # N(snr, 1) against N(0, 1)
    t = np.linspace(-2.0, 12.0, 2801)
    tp = stats.norm.sf(t[:, None] - snr[None, :])
    out['matched'] = expected_pr(tp, stats.norm.sf(t), num_null)
  if 'energy' in names:  # noncentral chi2_d(snr^2) against chi2_d
    t = dim + np.linspace(-3.0, 40.0, 861) * np.sqrt(2.0 * dim)
    lam = np.maximum(snr**2, 1e-12)
    tp = stats.ncx2.sf(t[:, None], dim, lam[None, :])
    out['energy'] = expected_pr(tp, stats.chi2.sf(t, dim), num_null)
  return out


def clean_rows(cfg) -> tuple[list[dict], int, int]:
  """Per batch: the clean clipped sum's row norms (no noise)."""
  texts = data_lib.load_corpus(cfg.data)
  model, params = models.load(cfg.model)
  sentences = runner.private_sentences(cfg, texts, model.tokenizer)
  train, _ = data_lib.train_eval_split(
    sentences, cfg.eval_fraction, seed=cfg.seed
  )
  b = cfg.batch_sizes[0]
  clean_defense = fl.dp_sgd(cfg.dp_clip, 0.0, microbatch=min(b, 4))
  vocab, dim = None, None
  batches = []
  for index in range(cfg.num_batches):
    start = time.perf_counter()
    rows_idx = client.draw_batch(len(train), b, index, cfg.seed)
    batch = [train[i] for i in rows_idx]
    grads, ids, mask = client.client_gradient(
      model, params, batch, clean_defense, jax.random.key(0)
    )
    # The client divides the clipped sum by the number of examples.
    rows = np.asarray(
      jax.device_get(models.get_path(grads, model.paths.word_embeddings)),
      np.float64,
    ) * float(len(batch))
    vocab, dim = rows.shape
    truth = np.asarray(sorted(client.true_tokens(ids, mask)))
    norms = np.linalg.norm(rows, axis=1)
    outside = np.setdiff1d(np.arange(vocab), truth)
    batches.append(
      {
        'batch': index,
        'true_bag_size': len(truth),
        'batch_row_norms': [round(x, 6) for x in norms[truth].tolist()],
        'outside_row_norm_median': float(np.median(norms[outside])),
        'outside_row_norm_max': float(norms[outside].max()),
        'embedding_norm_over_b_clip': float(
          np.linalg.norm(rows) / (cfg.dp_clip * len(batch))
        ),
      }
    )
    print(
      f'batch {index}: {len(truth)} tokens, batch-row norm median'
      f' {np.median(norms[truth]):.4f} max {norms[truth].max():.4f}'
      f' ({time.perf_counter() - start:.0f} s)',
      file=sys.stderr,
    )

  return batches, vocab, dim


def largest_noise(norms_per_batch, dim, vocab, precision, recall, name):
  """The largest per-coordinate noise std of the sum at which the idealised
  attacker `name` still reaches `precision` at `recall` (mean over batches;
  bisection on a log scale)."""

  def reaches(noise):
    got = []
    for norms in norms_per_batch:
      p, r = bounds(np.asarray(norms) / noise, dim, vocab, (name,))[name]
      got.append(best_recall(p, r, precision))
    return float(np.mean(got)) >= recall

  return largest_passing(reaches, 1e-4, 10.0)


def largest_passing(reaches, lo: float, hi: float, steps: int = 30) -> float:
  """The largest x in [lo, hi] with `reaches(x)` (monotone: true below
  some x, false above), by bisection on a log scale; 0 if `reaches(lo)` is
  false."""
  if not reaches(lo):
    return 0.0
  for _ in range(steps):
    mid = float(np.sqrt(lo * hi))
    lo, hi = (mid, hi) if reaches(mid) else (lo, mid)
  return lo


def define_flags() -> None:
  flags.DEFINE_bool(
    'reuse',
    False,
    "Re-analyse dp_bound.json's clean row norms instead of recomputing them.",
  )


def main(argv) -> None:
  del argv
  cfg = load_config()
  sigmas = json.loads((REPORT / 'dp_sigma.json').read_text())
  out_path = REPORT / 'dp_bound.json'
  if flags.FLAGS.reuse:
    old = json.loads(out_path.read_text())
    batches, vocab, dim = old['batches'], old['vocab'], old['dim']
  else:
    batches, vocab, dim = clean_rows(cfg)

  results = []
  for entry in sigmas:
    eps, sigma = entry['epsilon'], entry['sigma']
    noise = sigma * cfg.dp_clip  # per-coordinate std of the noisy sum
    per = {'matched': [], 'energy': []}
    snr_all = []
    for bt in batches:
      snr = np.asarray(bt['batch_row_norms']) / noise
      snr_all.append(snr)
      curves = bounds(snr, dim, vocab)
      for name, (p, r) in curves.items():
        target_p, target_r = PAPER.get(eps, (None, None))
        per[name].append(
          {
            'recall_at_paper_precision': (
              best_recall(p, r, target_p) if target_p is not None else None
            ),
            'precision_at_paper_recall': (
              precision_at(p, r, target_r) if target_r else None
            ),
            'best_f1': float(
              np.max(
                np.where(p + r > 0, 2 * p * r / np.maximum(p + r, 1e-300), 0)
              )
            ),
          }
        )
    snr_all = np.concatenate(snr_all)
    row = {
      'epsilon': eps,
      'sigma': sigma,
      'noise_std_of_sum': noise,
      'paper_precision': PAPER.get(eps, (None, None))[0],
      'paper_recall': PAPER.get(eps, (None, None))[1],
      'snr_median': float(np.median(snr_all)),
      'snr_max': float(snr_all.max()),
      'snr_fraction_above_1': float(np.mean(snr_all > 1.0)),
    }
    for name, vals in per.items():
      for key in vals[0]:
        xs = [v[key] for v in vals]
        row[f'{name}_{key}'] = None if xs[0] is None else float(np.mean(xs))
    results.append(row)
    print(json.dumps(row), file=sys.stderr)

  paper_rows = []
  for eps, (p_t, r_t) in sorted(PAPER.items(), reverse=True):
    row = {'epsilon': eps, 'paper_precision': p_t, 'paper_recall': r_t}
    for name in ('matched', 'energy'):
      noise = largest_noise(
        [bt['batch_row_norms'] for bt in batches], dim, vocab, p_t, r_t, name
      )
      row[f'{name}_largest_noise_std_of_sum'] = noise
      row[f'{name}_largest_sigma'] = noise / cfg.dp_clip
      # The ε that σ buys at the committed run's sampling rate and steps.
      row[f'{name}_epsilon_needed'] = fl.epsilon(
        noise / cfg.dp_clip,
        sigmas[0]['sampling_rate'],
        sigmas[0]['steps'],
        sigmas[0]['delta'],
      )
    paper_rows.append(row)
    print(json.dumps(row), file=sys.stderr)

  out = {
    **run_fields(cfg),
    'vocab': vocab,
    'dim': dim,
    'batches': batches,
    'epsilons': results,
    'paper_rows': paper_rows,
  }
  out_path.write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  define_flags()
  app.run(main)
