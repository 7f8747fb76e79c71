"""Tables, plots and the paper's reference numbers of experiments.embed_parrot.

:func:`write_report` turns a :class:`leakjax.attacks.inversion.InversionRun`
into `summary.json` (the run's numbers, no timings) and `summary.md` (tables
against Wan et al. 2024, with `layers.png` and `ep_training.png`);
:func:`rerender_plots` re-draws the plots from a run folder
(`python -m experiments.embed_parrot_report W`).
"""

from __future__ import annotations

import math

import numpy as np

from leakjax import io
from leakjax.attacks.inversion import runner, scoring

# ---------------------------------------------------------- paper numbers
# Wan et al. 2024, Llama2-7B (32 layers), in %. Table 2: BEI/HEI by layer.
PAPER_LAYERS = ('0', '5', '10', '15', '20', '25', '30', 'last')
PAPER_TABLE2 = {
  'bei': {
    'f1': (0.17, 1.98, 2.46, 3.25, 13.10, 18.10, 20.41, 23.01),
    'rouge1': (0.33, 1.71, 1.75, 3.20, 9.33, 13.34, 16.66, 18.23),
    'rougeL': (0.33, 1.68, 1.69, 3.04, 8.57, 12.19, 15.69, 17.59),
    'sbert': (3.00, 2.31, 2.99, 6.62, 22.61, 30.95, 22.30, 32.41),
  },
  'hei': {
    'f1': (85.07, 73.44, 65.39, 61.73, 53.50, 39.30, 26.08, 16.67),
    'rouge1': (65.22, 58.93, 53.09, 50.11, 44.38, 34.39, 26.02, 19.51),
    'rougeL': (65.23, 58.95, 53.07, 50.04, 44.40, 34.37, 25.95, 19.13),
    'sbert': (90.15, 84.19, 80.27, 77.75, 72.65, 61.01, 50.48, 25.11),
  },
}
# Table 4, Llama2-7B layer 30, EP trained on fingpt-sentiment.
PAPER_TABLE4 = {
  'fingpt-sentiment (train distribution)': {
    'ep': dict(rouge1=67.30, rougeL=67.23, f1=61.69, sbert=71.47),
    'ep+ppl': dict(rouge1=66.28, rougeL=66.21, f1=60.73, sbert=70.91),
  },
  'fingpt-fiqa_qa': {
    'ep': dict(rouge1=65.99, rougeL=65.97, f1=62.48, sbert=68.85),
    'ep+ppl': dict(rouge1=64.98, rougeL=64.96, f1=61.42, sbert=67.70),
  },
  'wikitext': {
    'ep': dict(rouge1=66.03, rougeL=65.84, f1=63.55, sbert=60.46),
    'ep+ppl': dict(rouge1=65.45, rougeL=65.24, f1=62.93, sbert=60.26),
  },
}
# Table 5 (fingpt-sentiment) and Table 8 (wikitext): Llama2-7B EP by length.
PAPER_TABLE5 = {
  '1-8': dict(rouge1=67.23, rougeL=67.23, f1=66.49, sbert=74.28),
  '8-16': dict(rouge1=68.57, rougeL=68.55, f1=65.64, sbert=71.29),
  '16-32': dict(rouge1=66.78, rougeL=66.74, f1=61.80, sbert=70.91),
  '32-64': dict(rouge1=67.33, rougeL=67.25, f1=60.18, sbert=71.52),
  '64-128': dict(rouge1=68.59, rougeL=68.39, f1=63.07, sbert=75.07),
  '128-256': dict(rouge1=64.81, rougeL=64.24, f1=59.32, sbert=74.86),
}
PAPER_TABLE8 = {
  '1-8': dict(rouge1=98.58, rougeL=98.58, f1=98.58, sbert=98.87),
  '8-16': dict(rouge1=47.69, rougeL=47.69, f1=47.11, sbert=52.53),
  '16-32': dict(rouge1=49.78, rougeL=49.71, f1=47.40, sbert=48.19),
  '32-64': dict(rouge1=50.66, rougeL=50.61, f1=46.26, sbert=40.90),
  '64-128': dict(rouge1=48.29, rougeL=48.00, f1=43.16, sbert=33.84),
  '128-256': dict(rouge1=49.35, rougeL=48.86, f1=43.91, sbert=33.14),
}
# Table 6: EP on defended Llama2-7B hidden states; PPL origin/defense.
PAPER_TABLE6 = {
  '0': dict(rouge1=8.96, rougeL=8.93, f1=3.21, sbert=11.62, ppl=(5.44, 8.85)),
  '30': dict(
    rouge1=16.48, rougeL=16.00, f1=10.19, sbert=23.51, ppl=(5.44, 9.13)
  ),
}


# ---------------------------------------------------------------- report
def _pct(x) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '-'
  return f'{100 * x:.1f}'


def write_report(cfg: runner.InversionConfig, run: runner.InversionRun) -> None:
  """Writes `summary.json` and `summary.md` (with plots) of `run`."""
  run.writer.write_summary(run.summary, render_markdown(cfg, run))


def render_markdown(
  cfg: runner.InversionConfig, run: runner.InversionRun
) -> str:
  """The human summary: Tables 2, 4, 5/8 and 6 next to the paper's."""
  summary, tests, layers, deep = run.summary, run.tests, run.layers, run.deep
  writer, histories, variants = run.writer, run.histories, run.variants
  names = list(tests)
  get = lambda m, **p: summary.get(io.summary_key(m, **p))
  lines = [
    f'# Embedding inversion (Wan et al. 2024) on `{cfg.model}`\n',
    f'Target: {run.model_family}, {run.model_num_layers} blocks, hidden'
    f' {run.model_hidden_size}, {run.model_num_params:,} parameters.'
    f' Test texts per corpus: {", ".join(f"{n} {len(tests[n].texts)}" for n in names)}'
    f' (held out, at most {cfg.max_length} tokens).'
    f' Embed Parrot: layer {deep}, trained on {summary["num_train_texts"]}'
    f' `{cfg.train_corpus}` texts for {cfg.ep_steps} steps. Scores in %;'
    ' "paper" = Llama2-7B (32 layers) from the paper.'
    f' Sentence-BERT on the first {cfg.sbert_limit} texts of each row.\n',
    '## BEI / HEI by layer (Table 2 analogue)\n',
    'BEI = LM head without the final norm (Sec. 4.1, Eq. 8); layer'
    ' "last" = final-normed output of the last block (as HF'
    ' `hidden_states[-1]`).\n',
  ]
  for metric in ('f1', 'rouge1', 'rougeL', 'sbert'):
    header = ['method', 'data'] + [str(x) for x in layers]
    rows = []
    for method in ('bei', 'hei'):
      for name in names:
        rows.append(
          [method, name]
          + [
            _pct(get(metric, data=name, layer=str(x), method=method))
            for x in layers
          ]
        )
      paper = PAPER_TABLE2[method][metric]
      rows.append(
        [method, 'paper']
        + [
          f'{paper[PAPER_LAYERS.index(str(x))]:.1f}'
          if str(x) in PAPER_LAYERS
          else '-'
          for x in layers
        ]
      )
    lines.append(f'\n**{metric}**\n\n' + io.markdown_table(header, rows))

  lines.append(
    f'\n## Embed Parrot vs BEI/HEI at layer {deep} (Tables 1, 4)'
    "\n\n`ep` = Embed Parrot with the paper's architecture (Input-Adapter,"
    ' decoder, Output-Adapter; cosine loss), decoded with HEI; `ep_skip` ='
    ' the same plus a ridge-initialised linear skip from input to output'
    " (ours, not in the paper); `ep_pretrained` = the paper's architecture"
    ' with a pretrained Decode Model (`--ep_decoder`), all of it fine-tuned;'
    ' `*_ppl` = EP+PPL; `*_bei` = BEI on the predicted H^0.\n'
  )
  header = ['data', 'method', 'ROUGE-1', 'ROUGE-L', 'F1', 'SBERT']
  rows = []
  methods = ['bei', 'hei'] + [m for v in variants for m in (v, f'{v}_bei')]
  for name in names:
    for method in methods:
      rows.append(
        [name, method]
        + [
          _pct(get(m, data=name, layer=str(deep), method=method))
          for m in ('rouge1', 'rougeL', 'f1', 'sbert')
        ]
      )
  for pname, prow in PAPER_TABLE4.items():
    for method, vals in prow.items():
      rows.append(
        [f'paper: {pname}', method]
        + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      )
  lines.append(io.markdown_table(header, rows))

  lines.append('\n## Embed Parrot by token length (Tables 5, 8)\n')
  header = [
    'method',
    'data',
    'bucket',
    'n',
    'ROUGE-1',
    'ROUGE-L',
    'F1',
    'SBERT',
  ]
  rows = []
  bucket_rows = {
    (r['method'], r['data'], r['bucket']): r
    for r in writer.results
    if r.get('kind') == 'bucket'
  }
  for variant in variants:
    for name in names:
      for lo, hi in scoring.BUCKETS:
        r = bucket_rows.get((variant, name, scoring.bucket_name(lo, hi)))
        if r is not None:
          rows.append(
            [variant, name, scoring.bucket_name(lo, hi), r['n']]
            + [_pct(r.get(m)) for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
          )
  for pname, table in (
    ('paper: fingpt-sentiment (T5)', PAPER_TABLE5),
    ('paper: wikitext (T8)', PAPER_TABLE8),
  ):
    for bucket, vals in table.items():
      rows.append(
        ['ep', pname, bucket, '-']
        + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      )
  lines.append(io.markdown_table(header, rows))

  lines.append(
    '\n## DCT defense (Table 6 analogue)\n\n'
    '`E_trans = IDCT(DCT(E) O_s)` along the feature axis (orthonormal'
    ' DCT-II), `O_s` one of k overlap matrices built from a random'
    ' permutation of the d features split into k subsets (Sec. 5.3.1).'
    ' Attacks run on the defended hidden states (EP is the one trained'
    ' on undefended states); perplexity of the target with the'
    ' defense applied at that layer, on'
    f' {cfg.ppl_texts} texts per corpus.\n'
  )
  header = [
    'layer',
    'k subsets',
    'method',
    'data',
    'ROUGE-1',
    'ROUGE-L',
    'F1',
    'SBERT',
    'PPL origin/defense',
  ]
  rows = []
  base = summary.get(io.summary_key('ppl', defense='none'))
  for layer in cfg.defense_layers:
    for subsets in cfg.defense_subsets:
      tag = dict(defense='dct', layer=str(layer), subsets=subsets)
      ppl = summary.get(io.summary_key('ppl', **tag))
      for method in ['bei', 'hei'] + list(variants):
        for name in names:
          vals = [
            get(m, data=name, method=method, **tag)
            for m in ('rouge1', 'rougeL', 'f1', 'sbert')
          ]
          if all(v is None for v in vals):
            continue
          rows.append(
            [layer, subsets, method, name]
            + [_pct(v) for v in vals]
            + [f'{base:.2f}/{ppl:.2f}']
          )
  for layer, vals in PAPER_TABLE6.items():
    rows.append(
      [f'paper {layer}', '?', 'ep', 'fingpt']
      + [f'{vals[m]:.1f}' for m in ('rouge1', 'rougeL', 'f1', 'sbert')]
      + [f'{vals["ppl"][0]}/{vals["ppl"][1]}']
    )
  lines.append(io.markdown_table(header, rows))

  plots = _plots(cfg, summary, names, layers, deep, writer, histories, variants)
  if plots:
    lines.append('\n## Plots\n')
    lines.extend(f'![{p}]({p})\n' for p in plots)
  lines.append(
    f'\nTimings of this invocation (cached hidden states and checkpoints'
    f' count ~0): hidden states {run.timings["seconds_hidden_states"]:.0f}'
    f' s, Embed Parrot training {run.timings["seconds_ep_train"]:.0f} s,'
    f' total {run.timings["seconds_total"]:.0f} s.\n'
  )
  return '\n'.join(lines)


def _corpus_pairs(cfg) -> list[tuple[str, str]]:
  """The run's corpora as `(name, data)` pairs; config.json holds them as
  `name=data` strings or as pairs."""
  return [
    tuple(c.split('=', 1)) if isinstance(c, str) else tuple(c)
    for c in cfg.corpora
  ]


# Embed Parrot variants' markers at the deep layer, in `variants` order.
_VARIANT_MARKERS = '*PXdph'


def _plots(
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
  data = dict(_corpus_pairs(cfg))
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
  import io as _io  # pylint: disable=g-import-not-at-top
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
    buf = _io.BytesIO()
    fig.savefig(buf, format='png', dpi=120, bbox_inches='tight')
    io.atomic_write_bytes(workdir / name, buf.getvalue())
    return name

  folder = types.SimpleNamespace(workdir=workdir, save_figure=save_figure)
  names = [name for name, _ in _corpus_pairs(cfg)]
  return _plots(cfg, summary, names, layers, deep, folder, histories, variants)


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.embed_parrot_report WORKDIR')
  print('\n'.join(rerender_plots(sys.argv[1])))
