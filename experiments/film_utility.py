"""FILM's utility runs: the perplexity each defense leaves, beside the
paper's (FILM Tables 4 and 5).
"""

from __future__ import annotations

from experiments.film_tables import PAPER_TABLE4_PERPLEXITY, PAPER_TABLE5
from leakjax import io


def _paper_table5(cfg, defense: str):
  """FILM Table 5's perplexity for this init and defense, on the corpus
  (WikiText or Enron) the data name suggests; None if none fits."""
  name = str(cfg.data).lower()
  corpus = (
    'enron' if 'enron' in name else 'wikitext' if 'wikitext' in name else None
  )
  return PAPER_TABLE5.get((cfg.init, defense), {}).get(corpus)


def summarize_utility(cfg, rows: list[dict]) -> dict[str, float]:
  summary = {}
  for r in rows:
    if r.get('kind') == 'utility':
      key = io.summary_key('test_perplexity', defense=r['defense'])
      summary[key] = r['perplexity']
  return summary


def _paper_utility(cfg, spec: str):
  """(perplexity, perplexity / the paper's undefended one, source) of the
  paper cell that matches `spec`, or None."""
  if spec in ('none', 'freeze'):
    value = _paper_table5(cfg, spec)
    base = _paper_table5(cfg, 'none')
    if value is not None:
      return value, value / base, 'Table 5'
    if spec == 'freeze' or cfg.init != 'pretrained':
      return None
  if cfg.init != 'pretrained' or spec not in PAPER_TABLE4_PERPLEXITY:
    return None
  value = PAPER_TABLE4_PERPLEXITY[spec]
  return value, value / PAPER_TABLE4_PERPLEXITY['none'], 'Table 4'


def utility_markdown(cfg, rows: list[dict], extra: dict) -> str:
  """FILM Tables 4-5's perplexity columns beside ours."""
  by = {r['defense']: r for r in rows if r.get('kind') == 'utility'}
  base = by.get('none', {}).get('perplexity')
  table = []
  for spec in ['start', *cfg.defenses]:
    r = by.get(spec)
    if r is None:
      continue
    ppl = r['perplexity']
    paper = _paper_utility(cfg, spec) if spec != 'start' else None
    sigma = r.get('noise_multiplier')
    table.append(
      [
        spec,
        f'{sigma:.3f}' if sigma or spec.startswith('dpsigma:') else '–',
        f'{ppl:.2f}',
        f'{ppl / base:.3f}' if base and spec != 'start' else '–',
        f'{paper[0]:.2f}' if paper else '–',
        f'{paper[1]:.3f}' if paper else '–',
        paper[2] if paper else '–',
        f'{r["seconds"]:.0f}' if r.get('seconds') else '–',
      ]
    )
  return (
    '# FILM defenses: what they cost in utility\n\n'
    f'Model `{cfg.model}` ({cfg.init}), data `{cfg.data}`,'
    f' {extra.get("num_train", "?")} training sentences; every row trains'
    f' t = {cfg.train_steps} steps of b = {cfg.train_batch_size} at'
    f' learning rate {cfg.learning_rate:g} (linear decay) with the'
    " defense on every step's gradient, then measures the perplexity of"
    ' the held-out split (`start`: before training). DP-SGD: clip'
    f' C = {cfg.dp_clip:g}, δ = {cfg.dp_delta:g}, σ calibrated for these'
    ' steps at sampling rate b/N (`dp:ε`) or given (`dpsigma:σ`; σ = 0'
    ' clips and adds no noise). "paper" is FILM Table 4 (GPT-2 fine-tuned'
    ' from pretrained on WikiText-103: pruning and DP-SGD rows) or Table 5'
    ' (frozen vs. trained embeddings, from scratch or pretrained, for the'
    ' corpus named by the data); the ratio columns divide by the'
    ' undefended row of the same source, the comparable quantity across'
    ' models and training lengths.\n\n'
    + io.markdown_table(
      [
        'defense',
        'σ',
        'test perplexity',
        '/ none',
        'paper',
        'paper / none',
        'source',
        'seconds',
      ],
      table,
    )
  )
