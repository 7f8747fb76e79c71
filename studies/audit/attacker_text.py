"""How much text the audit's hidden-state proposer needs, and whose.

The audit's exact search (:mod:`leakjax.audit.hidden`) checks candidates in
the order of a softmax inverse trained on the attacker's text; its cost is
the place of the true token in that order. By default the attacker's text
is the user's sentences that no batch attacks (24 in the quick audit). The
provider holds the model, so it can also sample text from it for free
(:func:`leakjax.audit.hidden.attacker_samples`, which the audit now uses
at the 400 chosen here). For each
attacker text, on the audit's held-out sentences (the perplexity's text,
which no hidden-state cell attacks: the dev split of this choice), with the
true prefix given, the place of every true token in
:func:`leakjax.attacks.inversion.exact.proposal_order` (the softmax
inverse's cosine interleaved with the LM's prior), and the seconds the fit
took.

Writes `reports/audit/attacker_text/summary.json` with
`METRIC@layer=L,text=T` for METRIC in `mean_place`, `median_place`,
`top1` (place 0), `top128`, `max_place`, `fit_seconds`, and
`num_tokens@layer=L`; T is `user` or `user+samples:N`.

  python -m studies.audit.attacker_text \
      --flagfile=experiments/configs/audit_quick.flags --layers=15,last
"""

import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from absl import app, flags

import studies
from experiments import audit
from leakjax import io, models
from leakjax.attacks.dager import client as dager_client
from leakjax.attacks.inversion import exact
from leakjax.audit import hidden, runner

REPORT = Path(__file__).resolve().parents[2] / 'reports' / 'audit'


def main(argv):
  del argv
  f = flags.FLAGS
  cfg = audit.config_from_flags()
  model, params = models.load_model(cfg.model, seed=cfg.seed)
  splits = runner.splits_of(cfg, runner.load_texts(cfg), model.tokenizer)
  width = cfg.max_tokens + 1
  ids, mask = dager_client.padded_batch(model, splits.heldout, width)
  score = np.asarray(mask).copy()
  if model.tokenizer.bos_id is not None:
    score[:, 0] = 0
  logits = np.asarray(model.logits(params, jnp.asarray(ids)))
  embeddings = model.word_embeddings(params)
  config = exact.ExactConfig()
  out: dict[str, float] = {}
  for n in [int(x) for x in f.samples]:
    attacker = list(splits.attacker) + hidden.attacker_samples(
      model, params, n, cfg.max_tokens, cfg.seed
    )
    name = 'user' if not n else f'user+samples:{n}'
    for layer in cfg.layers:
      start = time.perf_counter()
      inverse = hidden.fit_inverse(model, params, attacker, layer, width)
      fit_seconds = time.perf_counter() - start
      states = np.asarray(hidden.states(model, params, ids, mask, layer))
      kernel, bias = inverse.softmax
      # Every position's scores in one call: [N * W, D] -> [N, W, V].
      scores = np.asarray(
        exact.proposal_scores(
          jnp.asarray(states.reshape(-1, states.shape[-1])),
          embeddings,
          kernel,
          bias,
          inverse.stats['input_shift'],
          inverse.stats['input_scale'],
        )
      ).reshape(*states.shape[:2], -1)
      places = [
        int(
          np.flatnonzero(
            exact.proposal_order(scores[i, t], logits[i, t - 1], config)
            == ids[i, t]
          )[0]
        )
        for i, t in zip(*np.nonzero(score))
      ]
      got = np.asarray(places)
      at = dict(layer=layer, text=name)
      out[io.summary_key('mean_place', **at)] = float(got.mean())
      out[io.summary_key('median_place', **at)] = float(np.median(got))
      out[io.summary_key('top1', **at)] = float(np.mean(got == 0))
      out[io.summary_key('top128', **at)] = float(np.mean(got < 128))
      out[io.summary_key('max_place', **at)] = int(got.max())
      out[io.summary_key('fit_seconds', **at)] = fit_seconds
      out[io.summary_key('num_tokens', layer=layer)] = len(got)
      print(
        name,
        layer,
        len(attacker),
        'texts',
        round(fit_seconds, 1),
        's',
        'mean',
        round(float(got.mean()), 1),
        'median',
        np.median(got),
        'top1',
        round(float(np.mean(got == 0)), 3),
        flush=True,
      )
  studies.write_summary(f.out, out)


def define_flags() -> None:
  audit.define_flags()
  flags.DEFINE_list('samples', ['0', '200', '400'], 'Model samples added.')
  flags.DEFINE_string(
    'out', str(REPORT / 'attacker_text' / 'summary.json'), 'Output JSON.'
  )


if __name__ == '__main__':
  define_flags()
  app.run(main)
