"""Tables of experiments.embed_parrot against the paper's numbers.

:func:`write_report` turns a :class:`leakjax.attacks.inversion.InversionRun`
into `summary.json` (the run's numbers, no timings) and `summary.md` (tables
against Wan et al. 2024, :mod:`experiments.embed_parrot_paper`, with
`layers.png` and `ep_training.png` from :mod:`experiments.embed_parrot_plots`);
`python -m experiments.embed_parrot_report W` re-draws the plots of a run
folder.
"""

from __future__ import annotations

import math

from experiments import embed_parrot_plots
from experiments.embed_parrot_paper import (
  PAPER_LAYERS,
  PAPER_TABLE2,
  PAPER_TABLE4,
  PAPER_TABLE5,
  PAPER_TABLE6,
  PAPER_TABLE8,
)
from leakjax import io
from leakjax.attacks.inversion import runner, scoring


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

  plots = embed_parrot_plots.plots(
    cfg, summary, names, layers, deep, writer, histories, variants
  )
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


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top

  if len(sys.argv) != 2:
    sys.exit('usage: python -m experiments.embed_parrot_report WORKDIR')
  print('\n'.join(embed_parrot_plots.rerender_plots(sys.argv[1])))
