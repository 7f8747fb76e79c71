"""Embed Parrot with the pretrained Decode Model, by attacked layer.

Reads the committed runs in `reports/embed_parrot/pretrained/`:
`layer_L/summary.json` (L = 10, 20, 25, 30; one `experiments.embed_parrot`
run per layer with `experiments/configs/embed_parrot_pretrained.flags`)
and, where present, `scratch_layer_25/summary.json` and
`scratch_skip_layer_25/summary.json` (the same data and steps with the
small decoder trained from scratch, without and with the linear skip), and
draws `by_layer.png` there: held-out ROUGE-1
per test corpus against the layer, for EP, EP+PPL and HEI. One run per
point: there is no spread to draw.

Usage (repository root):
  python -m studies.embed_parrot.pretrained.by_layer
"""

import json

import matplotlib
from absl import app

from studies import report_dir

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

REPORT = report_dir(__file__)
LAYERS = (10, 20, 25, 30)
CORPORA = ('enron', 'wikitext', 'sms')
TITLES = {
  'enron': 'Enron (held out; EP trained on Enron)',
  'wikitext': 'WikiText-2 valid',
  'sms': 'UCI SMS',
}
# Wan et al. 2024, Table 1: EP on Llama2-7B, ROUGE-1 on its training
# distribution (fingpt-sentiment).
PAPER_EP = 0.673


def summary(folder: str) -> dict[str, float] | None:
  """The summary of the run in `folder`, None if it was not run."""
  path = REPORT / folder / 'summary.json'
  return json.loads(path.read_text()) if path.exists() else None


def rows() -> dict[str, dict[str, list[float]]]:
  """{corpus: {method: ROUGE-1 per layer of LAYERS}}."""
  out = {c: {} for c in CORPORA}
  for layer in LAYERS:
    s = summary(f'layer_{layer}')
    for c in CORPORA:
      for m in ('ep_pretrained', 'ep_pretrained_ppl', 'hei'):
        key = f'rouge1@data={c},layer={layer},method={m}'
        out[c].setdefault(m, []).append(s[key])
  return out


def main(argv) -> None:
  del argv
  data = rows()
  scratch = summary('scratch_layer_25')
  skip = summary('scratch_skip_layer_25')
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), sharey=True)
  styles = {
    'ep_pretrained': ('EP, pretrained SmolLM2-135M decoder', 'o-', 'C0'),
    'ep_pretrained_ppl': ('EP+PPL, same decoder', 's--', 'C1'),
    'hei': ('HEI (no training)', '^:', 'C7'),
  }
  for ax, c in zip(axes, CORPORA):
    for m, (label, fmt, color) in styles.items():
      ax.plot(LAYERS, data[c][m], fmt, color=color, label=label)
    points = (
      (
        scratch,
        'ep',
        'D',
        'C2',
        'EP, 2-layer decoder from scratch (same data)',
      ),
      (
        skip,
        'ep_skip',
        'P',
        'C3',
        'the same plus a ridge-initialised linear skip (ours)',
      ),
    )
    for s, method, marker, color, label in points:
      if s is not None:
        key = f'rouge1@data={c},layer=25,method={method}'
        ax.plot([25], [s[key]], marker, color=color, markersize=8, label=label)
    ax.axhline(
      PAPER_EP,
      color='k',
      lw=0.8,
      ls='-.',
      label='paper: EP on Llama2-7B, its training distribution',
    )
    ax.set_title(TITLES[c], fontsize=10)
    ax.set_xlabel('attacked layer of SmolLM2-135M (of 30)')
    ax.set_xticks(LAYERS)
    ax.set_ylim(0, 0.9)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('ROUGE-1, 100 held-out texts')
  handles, labels = axes[0].get_legend_handles_labels()
  fig.legend(handles, labels, loc='lower center', ncol=3, fontsize=8.5)
  fig.tight_layout(rect=(0, 0.14, 1, 1))
  out = REPORT / 'by_layer.png'
  fig.savefig(out, dpi=120)
  print(f'Wrote {out}')


if __name__ == '__main__':
  app.run(main)
