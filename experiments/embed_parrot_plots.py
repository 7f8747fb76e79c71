"""The Embed Parrot report's plots: ROUGE-1 and token F1 against the layer
(layers.png) and Embed Parrot's training curves (ep_training.png), the
paper's numbers beside ours. :func:`rerender_plots` re-draws them from a
run folder (`python -m experiments.embed_parrot_report W`).
"""

from __future__ import annotations

import numpy as np

from experiments.embed_parrot_paper import (
  PAPER_LAYERS,
  PAPER_TABLE2,
  PAPER_TABLE4,
)
from leakjax import io


def corpus_pairs(cfg) -> list[tuple[str, str]]:
  """The run's corpora as `(name, data)` pairs; config.json holds them as
  `name=data` strings or as pairs."""
  return [
    tuple(c.split('=', 1)) if isinstance(c, str) else tuple(c)
    for c in cfg.corpora
  ]


# Embed Parrot variants' markers at the deep layer, in `variants` order.
_VARIANT_MARKERS = '*PXdph'


def plots(
  cfg, summary, names, layers, deep, writer, histories, variants
) -> list[str]:
  """Draws `layers.png` and, with training histories, `ep_training.png`
  through `writer.save_figure`; returns the names written."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  out = []
  fig = layers_figure(cfg, summary, names, layers, deep, variants)
  out.append(writer.save_figure(fig, 'layers.png'))
  plt.close(fig)
  if any(histories.values()):
    fig = training_figure(cfg, summary, deep, histories)
    out.append(writer.save_figure(fig, 'ep_training.png'))
    plt.close(fig)
  return out


def layers_figure(cfg, summary, names, layers, deep, variants):
  """ROUGE-1 and token F1 against the layer, one panel per metric.

  Colour = test corpus, each corpus and the paper shifted a little along
  the layer axis so equal values stay apart; BEI dashed with triangles,
  HEI solid with circles, each Embed Parrot variant a large marker at the
  deep layer, the variants a few points apart. Grey, hollow: the paper's
  Llama2-7B (32 layers) at the run's layers that its Table 2 has, and its
  EP (and EP+PPL, where the run has one) at layer 30 on its training
  distribution (Table 4), where the run has layer 30. The legend sits
  right of the panels; the title names the run's model, deep layer and
  training corpus.
  """
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import transforms  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  labels = [str(x) for x in layers]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  xs = np.arange(len(layers), dtype=float)
  # The paper beside the corpora, each a little apart along the axis.
  offset = {name: 0.1 * (i - len(names) / 2) for i, name in enumerate(names)}
  offset['paper'] = 0.1 * len(names) / 2
  methods = (('bei', '--', 'v'), ('hei', '-', 'o'))
  marker = dict(zip(variants, _VARIANT_MARKERS))
  # The paper's EP (and EP+PPL, "LP") on Llama2-7B layer 30, Table 4.
  paper = PAPER_TABLE4['fingpt-sentiment (train distribution)']
  ppl = [v for v in variants if v.endswith('_ppl')]
  paper_ep = [('EP', paper['ep'], '*')] + (
    [('EP+PPL', paper['ep+ppl'], marker[ppl[0]])] if ppl else []
  )
  if '30' not in labels:
    paper_ep = []
  for ax, (metric, title) in zip(
    axes, (('rouge1', 'ROUGE-1'), ('f1', 'token F1'))
  ):
    for i, name in enumerate(names):
      for method, style, mark in methods:
        ys = [
          summary.get(
            io.summary_key(metric, data=name, layer=x, method=method), np.nan
          )
          for x in labels
        ]
        ax.plot(
          xs + offset[name],
          100 * np.array(ys, float),
          style,
          marker=mark,
          color=f'C{i}',
          markersize=5,
          clip_on=False,
        )
      for k, variant in enumerate(variants):
        key = io.summary_key(metric, data=name, layer=str(deep), method=variant)
        if key in summary:
          # Variants 8 points apart: equal scores stay visible.
          shift = transforms.ScaledTranslation(
            8 * (k - (len(variants) - 1) / 2) / 72, 0, fig.dpi_scale_trans
          )
          ax.plot(
            [labels.index(str(deep)) + offset[name]],
            [100 * summary[key]],
            marker[variant],
            color=f'C{i}',
            markersize=11,
            clip_on=False,
            transform=ax.transData + shift,
          )
    for method, style, mark in methods:
      ax.plot(
        xs + offset['paper'],
        [
          PAPER_TABLE2[method][metric][PAPER_LAYERS.index(x)]
          if x in PAPER_LAYERS
          else np.nan
          for x in labels
        ],
        style,
        marker=mark,
        color='grey',
        markerfacecolor='white',
        markersize=5,
        clip_on=False,
      )
    for k, (_, vals, mark) in enumerate(paper_ep):
      ax.plot(
        [labels.index('30') + offset['paper'] + 0.1 * k],
        [vals[metric]],
        mark,
        color='grey',
        markerfacecolor='white',
        markersize=11,
        clip_on=False,
      )
    ax.set_xticks(xs, labels)
    ax.set_xlim(-0.6, len(layers) - 0.4)
    ax.set_xlabel(f'layer of {cfg.model}')
    ax.set_ylabel(f'{title} (%)')
    ax.set_ylim(0, 102)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
  data = dict(corpus_pairs(cfg))
  handles = [
    Line2D([], [], color=f'C{i}', lw=6, label=f'{name} ({data.get(name, "")})')
    for i, name in enumerate(names)
  ]
  handles += [
    Line2D([], [], color='k', ls=style, marker=mark, label=method.upper())
    for method, style, mark in methods
  ]
  handles += [
    Line2D([], [], color='k', marker=marker[v], ls='', markersize=9, label=v)
    for v in variants
  ]
  handles.append(
    Line2D(
      [],
      [],
      color='grey',
      marker='o',
      markerfacecolor='white',
      label='paper, Llama2-7B:\nBEI/HEI (Table 2)',
    )
  )
  handles += [
    Line2D(
      [],
      [],
      color='grey',
      marker=mark,
      markerfacecolor='white',
      ls='',
      markersize=9,
      label=f'paper {name}, layer 30,\nits training data (Table 4)',
    )
    for name, _, mark in paper_ep
  ]
  fig.legend(
    handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), fontsize=8
  )
  fig.suptitle(
    f'Text recovered from the hidden states of {cfg.model}, by layer'
    f' (Embed Parrot at layer {deep}, trained on {cfg.train_corpus})',
    fontsize=10,
  )
  fig.tight_layout()
  return fig


def training_figure(cfg, summary, deep, histories):
  """Embed Parrot's training loss `1 - cos` against the step, one line per
  variant; the legend sits right of the panel, the title names the run's
  model, layer and training texts."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.5))
  for variant, history in histories.items():
    ax.plot(
      [h['step'] for h in history],
      [h['cos_loss'] for h in history],
      label=variant,
    )
  ax.legend(loc='center left', bbox_to_anchor=(1.02, 0.5), fontsize=8)
  ax.set_xlabel('step')
  ax.set_ylabel('1 - cos (train)')
  ax.set_yscale('log')
  ax.grid(alpha=0.3)
  texts = f'{summary.get("num_train_texts", "?")} {cfg.train_corpus} texts'
  if summary.get('num_train_samples'):
    texts += f' + {summary["num_train_samples"]} samples of the target'
  ax.set_title(
    f'Embed Parrot training on {cfg.model} layer {deep}\n{texts}', fontsize=9
  )
  fig.tight_layout()
  return fig


def rerender_plots(workdir) -> list[str]:
  """Re-draws the plots of a finished run from its config.json,
  summary.json and `<variant>_history.json` (a committed report folder);
  returns the names written. summary.md stays."""
  import json  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  workdir = Path(workdir)
  stored = json.loads((workdir / 'config.json').read_text())
  summary = json.loads((workdir / 'summary.json').read_text())
  cfg = types.SimpleNamespace(
    model=stored['model'],
    corpora=stored['corpora'],
    train_corpus=stored['train_corpus'],
  )
  deep = int(stored['deep_layer'])
  # As the runner's target: the BEI/HEI layers, the deep layer included.
  layers = [x if x == 'last' else int(x) for x in stored['layers']]
  if deep not in layers:
    layers.append(deep)
  base = list(stored['ep_variants'])
  variants = base + ([f'{base[0]}_ppl'] if stored['ep_ppl_steps'] else [])
  histories = {
    v: json.loads((workdir / f'{v}_history.json').read_text())
    for v in base
    if (workdir / f'{v}_history.json').is_file()
  }

  def save_figure(fig, name):
    io.atomic_write_bytes(workdir / name, io.figure_png(fig))
    return name

  folder = types.SimpleNamespace(workdir=workdir, save_figure=save_figure)
  names = [name for name, _ in corpus_pairs(cfg)]
  return plots(cfg, summary, names, layers, deep, folder, histories, variants)
