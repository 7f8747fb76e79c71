"""The numbers in README.md's result tables come from the committed reports.

Each check formats values of a committed `reports/**/summary.json` (or, for
the speed table, `benchmarks/results/**.json`) the way the README writes
them and looks for that text in the README row it belongs to, so a
regenerated report that moves a number fails here until the README follows.
The headline table's paper column is checked against `PAPER`, the papers'
own values.
"""

import collections
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from leakjax import io
from leakjax.attacks.inversion import exact_perturb

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text(encoding='utf-8')
# The prose with its line breaks as spaces (sentences wrap across lines).
PROSE = ' '.join(README.split())


def summary(report: str) -> dict[str, float]:
  return json.loads((ROOT / 'reports' / report / 'summary.json').read_text())


def load_facts(report: str) -> dict:
  return json.loads((ROOT / 'reports' / report / 'facts.json').read_text())


def row(*anchors: str) -> str:
  """The one README line that contains every anchor."""
  lines = [
    line for line in README.splitlines() if all(a in line for a in anchors)
  ]
  assert len(lines) == 1, (anchors, len(lines))
  return lines[0]


def flag_header(name: str) -> str:
  """The comment lines of NAME.flags (in experiments/configs, or among a
  study's ablations in studies/*/configs), joined."""
  (path,) = [
    *ROOT.glob(f'experiments/configs/{name}.flags'),
    *ROOT.glob(f'studies/*/configs/{name}.flags'),
  ]
  return ' '.join(
    line.lstrip('#').strip()
    for line in path.read_text().splitlines()
    if line.startswith('#')
  )


def joined(values, digits: int = 2) -> str:
  return ' / '.join(f'{v:.{digits}f}' for v in values)


# The paper columns of README.md's headline table. Each value is copied
# from the paper named beside it, so that the README cannot drift from it.
PAPER = {
  # Gupta et al., FILM, NeurIPS 2022, Table 10 (Enron, ROUGE-L, GPT-2).
  'film_enron_rougeL': {1: 0.61, 16: 0.31, 64: 0.29, 128: 0.29},
  # FILM Table 4a, prune ratio 0 (GPT-2, WikiText-103, b = 16, Sec. 6.3):
  # bag precision / recall.
  'film_bag': (1.00, 1.00),
  # FILM Sec. 6.3: frozen word embeddings give bag precision = recall = 0.
  'film_freeze_bag': 0,
  # FILM Table 4 (test perplexity; prune ratio, DP-SGD ε; 'none' = prune
  # ratio 0) and Table 5 (from pretrained: unfrozen, frozen).
  'film_table4_ppl': {
    'none': 11.46,
    'prune:0.9': 11.57,
    'prune:0.9999': 19.21,
    'dp:15': 11.98,
    'dp:1': 16.31,
  },
  'film_table5_ppl': {'wikitext': (11.40, 11.48), 'enron': (7.09, 7.30)},
  # FILM Table 4b: bag precision / recall under DP-SGD, by ε.
  'film_dp': {15: (0.97, 0.49), 10: (0.88, 0.17)},
  # Petrov et al., DAGER, NeurIPS 2024 (arXiv 2405.15586), abstract:
  # "full batches of size up to 128", "ROUGE-1/2 > 0.99".
  'dager_rouge': 0.99,
  'dager_batch': 128,
  # Wan et al. 2024, Table 1: Embed Parrot on Llama2-7B layer 30, ROUGE-1
  # (%).
  'embed_parrot_rouge1': 65.97,
}


def headline_rows() -> list[list[str]]:
  """The cells of README.md's headline table, row by row."""
  return _table_rows(README, '| attack and setting | ours | paper |')


def headline(anchor: str) -> dict[str, str]:
  """The headline row whose first cell starts with `anchor`, by column."""
  (cells,) = [r for r in headline_rows() if r[0].startswith(anchor)]
  return dict(zip(('attack', 'ours', 'paper', 'report'), cells, strict=True))


def test_headline_table_is_short():
  # One row per attack or report, each cell a short phrase, each row
  # linking its report's README.
  rows = headline_rows()
  assert len(rows) == 12
  symbols = {'/', '=', 'x', '≤', '≥', '>', '<', '-', '|'}
  for cells in rows:
    assert len(cells) == 4, cells
    for cell in cells[:3]:
      words = [w for w in cell.split() if w not in symbols]
      assert len(words) <= 30, cell
    link = cells[3].split('](')[1].rstrip(')')
    assert link.endswith('/README.md') and (ROOT / link).is_file(), link


def test_quickstart_rouge_l():
  s = summary('film_quickstart')
  text = 'ROUGE-L ' + joined(s[f'rougeL@b={b}'] for b in (1, 4, 16))
  assert f'{text} at b = 1 / 4 / 16 (2 batches each' in PROSE
  profile = json.loads(
    (ROOT / 'reports' / 'film_quickstart' / 'profile.json').read_text()
  )
  run = profile['runs'][-1]  # the code as it is
  assert (
    f'Measured: {run["wall_s"]:.0f} s wall and {run["peak_rss_mib"]:,} MiB'
    ' peak memory' in PROSE
  )


def test_film_enron_row():
  line = row('| FILM, Enron')
  bs = (1, 16, 64, 128)
  main, test = summary('film_enron'), summary('film_enron/test')
  assert (
    'ROUGE-L ' + joined(test[f'rougeL@b={b}'] for b in bs) + ' at b = 1 / 16 /'
    ' 64 / 128, held out ('
    + joined(main[f'rougeL@b={b}'] for b in bs)
    + ' on the batches the stopping rule was chosen on) |'
    in line
  )
  paper = joined(PAPER['film_enron_rougeL'][b] for b in bs)
  assert f'| ROUGE-L {paper} (GPT-2, Table 10) |' in line


def test_film_bag_row():
  line = row('| FILM bag of words from the tied')
  t0 = summary('film_bag')
  p = [t0[f'bag_precision@b={b},method=tied'] for b in (1, 4, 16, 64, 128)]
  assert all(f'{v:.3f}' == '1.000' for v in p) and 'precision 1.000' in line
  r = [t0[f'bag_recall@b={b},method=tied'] for b in (1, 4, 16)]
  assert f'recall {min(r):.3f}-{max(r):.3f} at b ≤ 16' in line
  r = [t0[f'bag_recall@b={b},method=tied'] for b in (64, 128)]
  assert joined(r, 3) + ' at b = 64 / 128; same data |' in line
  assert (
    f'| precision / recall {joined(PAPER["film_bag"])} (GPT-2, b = 16, Table'
    ' 4a) |' in line
  )


def test_film_freeze_row():
  s = summary('film_freeze')
  line = row('| FILM against frozen word embeddings')
  bs = (1, 16, 64)
  frozen = joined(s[f'rougeL@b={b},defense=freeze'] for b in bs)
  plain = joined(s[f'rougeL@b={b},defense=none'] for b in bs)
  ends = summary('film_freeze/sentence_ends')
  like = joined(ends[f'rougeL@b={b}'] for b in bs)
  assert (
    f'ROUGE-L {frozen} at b = 1 / 16 / 64; undefended with the same sentence'
    f' ends {like} (without them {plain}); same data |' in line
  )
  assert s['bag_recall@b=64,defense=freeze'] == 0
  zero = PAPER['film_freeze_bag']
  assert (
    f'| bag precision = recall = {zero} (GPT-2, b = 16, Sec. 6.3) |' in line
  )


def test_differential_row():
  s = summary('differential')
  cells = headline('Differential rank')
  continued = {
    k: v
    for k, v in s.items()
    if k.startswith('dr@') and k.endswith(',method=continued')
  }
  assert len(continued) == 12  # 4 canaries x k = 2, 8, 16
  zero = [k for k, v in continued.items() if v == 0]
  assert zero == ['dr@canary=all_low,k=16,method=continued']
  assert len(zero) / 12 == pytest.approx(s['dr0_fraction@method=continued'])
  held = summary('differential/test')
  held_dr = {
    k: v
    for k, v in held.items()
    if k.startswith('dr@') and k.endswith(',method=continued')
  }
  found = held['dr@canary=high_to_low,k=16,method=continued']
  assert 0 < found <= 1000
  assert cells['ours'] == (
    f'held out: {list(held_dr.values()).count(0)} of {len(held_dr)} cells at'
    f' DR 0 (high → low found at k = 16, DR ≥ {found}); {len(zero)} of'
    f' {len(continued)} on the dev canaries'
  )


def _ratio(s, key):
  return s[key] / s['f1_upper' + key.removeprefix('f1')]


def test_gboard_row():
  # The strongest preset's rule measured out of sample (reports/gboard/
  # heldout/), beside the in-sample n_k = 256 cells of reports/gboard/.
  from leakjax.attacks.gboard import presets

  assert 'reports/gboard/heldout/' in presets.PRESETS['strongest'].measured
  held, ins = summary('gboard/heldout'), summary('gboard')
  cells = headline('GBoard word recovery')
  low = min(
    _ratio(held, k)
    for k in held
    if k.startswith('f1@') and 'noise=none' in k and 'scale' not in k
  )
  assert cells['ours'].startswith(
    f'held out: noise-free F1 ≥ {low:.3f} x upper bound;'
  )
  dp = joined(
    _ratio(held, f'f1@B=32,E={e},n_k=64,noise=dpsgd,sigma=0.1')
    for e in (50, 100)
  )
  assert f'σ = 0.1, B = 32, E = 50 / 100: {dp} at n_k = 64' in cells['ours']
  big = joined(
    _ratio(ins, f'f1@B=32,E={e},n_k=256,noise=dpsgd,sigma=0.1')
    for e in (50, 100)
  )
  assert f'(in sample, n_k = 256: {big})' in cells['ours']
  assert '(Sec. 6.1, Fig. 6; no number in the text)' in cells['paper']
  assert 'reports/gboard/heldout/README.md' in cells['report']


def test_gboard_dpsgd_e1000_report():
  # reports/gboard/dpsgd_e1000/README.md's table and the E=1000 cells of
  # reports/gboard/README.md against the committed summaries.
  here = ROOT / 'reports/gboard/dpsgd_e1000'
  text = (here / 'README.md').read_text('utf-8')
  main = (ROOT / 'reports/gboard/README.md').read_text('utf-8')

  def cell(s, n_k, e, noise='dpsgd', sigma='0.1'):
    k = f'B=32,E={e},n_k={n_k},noise={noise},sigma={sigma}'
    return (
      f'{_ratio(s, "f1@" + k):.3f} ({s["precision@" + k]:.2f} /'
      f' {s["recall@" + k]:.2f})'
    )

  for loss, ref, label in (
    ('sentence_sum', 'gboard', 'sentence-summed loss (main run)'),
    ('batch_sum', 'gboard/batch_sum', 'batch-summed loss'),
  ):
    new, old = summary(f'gboard/dpsgd_e1000/{loss}'), summary(ref)
    for n_k in (64, 256):
      line = (
        f'| {label}, n_k = {n_k} | {cell(old, n_k, 50)} |'
        f' {cell(old, n_k, 100)} | **{cell(new, n_k, 1000)}** |'
        f' {cell(new, n_k, 1000, "none", "0.0")} |'
      )
      assert line in text, line
      # The main report's E=1000 cells are these runs' values.
      k = f'B=32,E=1000,n_k={n_k},noise=dpsgd,sigma=0.1'
      assert f'{_ratio(new, "f1@" + k):.3f}' in main
      # Same θ0 recipe and client sentences: the noise-free E=1000 draw
      # gives the main runs' word F1 within 0.002.
      k = f'f1@B=32,E=1000,n_k={n_k},noise=none,sigma=0.0'
      assert abs(new[k] - old[k]) < 2e-3


def test_dager_rows():
  from leakjax.attacks.dager import presets

  quick = summary('dager/quick')
  line = row('| DAGER, b ≤ 16')
  bs = (1, 4, 16)
  assert 'ROUGE-1 ' + joined((quick[f'rouge1@b={b}'] for b in bs), 3) in line
  assert (
    'included) ' + joined(quick[f'exact@b={b}'] for b in bs) + ' at b = 1 /'
    ' 4 / 16; same data |' in line
  )
  assert f'| ROUGE-1/2 > {PAPER["dager_rouge"]} on LLMs' in line
  # Past the rank limit: the strongest preset, measured on the batches it
  # was not chosen on, beside the batches it was chosen on.
  strongest = presets.PRESETS['strongest']
  assert 'hybrid_evidence_oversample_heldout/' in strongest.measured
  assert 'hybrid_evidence_oversample/' in strongest.chosen
  line = row("| Past DAGER's rank limit")
  key = 'rougeL@attack=hybrid,b=64'
  held = summary('dager/hybrid_evidence_oversample_heldout')[key]
  chosen = summary('dager/hybrid_evidence_oversample')[key]
  assert (
    f'ROUGE-L {held:.3f} held out (six batches; {chosen:.3f} on the three'
    ' it was chosen on)' in line
  )
  assert summary('dager/enron_t0')['rougeL@b=64'] == 0
  film = summary('dager/film')['rougeL@attack=film,b=64']
  assert f'DAGER 0.000, FILM {film:.2f} |' in line
  assert f'| full batches up to {PAPER["dager_batch"]} on LLMs' in line


def test_dager_report_hybrid_variants():
  # The reports/dager README's figures on the two variants of the hybrid
  # that stay off, against their summaries, the default hybrid's row for
  # the same batch and head_ranks.json.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  rows = [
    json.loads(line)
    for line in (ROOT / 'reports/dager/hybrid/results.jsonl').open()
  ]
  (base,) = [r for r in rows if r['b'] == 64 and r['batch'] == 0]
  assert f"against the hybrid's {base['rougeL']:.3f} on that batch" in text
  got = summary('dager/hybrid_beams16')['rougeL@attack=hybrid,b=64']
  assert f'16 beams instead of 8 give ROUGE-L {got:.3f}' in text
  for name in (
    'hybrid_end',
    'hybrid_end_power',
    'hybrid_explain',
    'hybrid_oversample',
  ):
    got = summary(f'dager/{name}')['rougeL@attack=hybrid,b=64']
    assert f'ROUGE-L {got:.3f} (`{name}/`)' in text
  (over,) = [
    json.loads(line)
    for line in (ROOT / 'reports/dager/hybrid_oversample/results.jsonl').open()
  ]
  assert over['num_searched'] == 128 and over['num_recovered'] == 64
  kept = sum(s in base['recovered'] for s in over['recovered'])
  words = lambda r: np.mean([len(s.split()) for s in r['recovered']])  # noqa: E731
  assert (
    f"{kept} of the 64 kept sentences are among the default's 64; the kept"
    f' ones are shorter ({words(over):.1f} words against {words(base):.1f};'
    in text
  )
  assert f'at {over["seconds"]:.0f} s against {base["seconds"]:.0f} s' in text
  ranks = json.loads((ROOT / 'reports/dager/head_ranks.json').read_text())
  pct = lambda key: f'{round(100 * ranks[key]["top1"])} %'  # noqa: E731
  assert (
    f'the true end ranks first at {pct("lm+head,s=0.1,w=12.0,at_end")} with'
    f' its own row, {pct("lm+head,end=0.9,p=0.0,w=12.0,at_end")} with the'
    f' quantile, {pct("lm,at_end")} under the LM alone' in text
  )
  norm = lambda part: f'{ranks[f"norm_median,{part}"]:.3f}'  # noqa: E731
  assert (
    f'(median row norm {norm("embedding")}, against {norm("targets")} for'
    f" the targets' head inputs and {norm('expected')} for the LM's" in text
  )
  own, only = 'lm+head,own_part,w=12.0', 'lm+head,targets_only,w=12.0'
  top32 = f'{round(100 * ranks[own]["top32"])} %'
  assert (
    f"rank the true token first at {pct(own)} under the hybrid's sum"
    f" (top 32: {top32}), and the targets' part alone at {pct(only)}" in text
  )
  assert (
    f'first at {pct("lm+head,end=0.9,p=0.25,w=12.0")} of all positions'
    f' against {pct("lm+head,end=0.9,p=0.0,w=12.0")}' in text
  )


def test_embed_parrot_row():
  # The strongest preset's run (chosen and measured on the same texts).
  from leakjax.attacks.inversion import presets

  run = 'scratch_skip_samples_layer_25'
  assert run in presets.PRESETS['strongest'].chosen
  s = summary(f'embed_parrot/pretrained/{run}')
  assert s['num_train_samples'] == 3000
  r = {
    d: s[f'rouge1@data={d},layer=25,method=ep_skip']
    for d in ('enron', 'wikitext', 'sms')
  }
  t = summary(f'embed_parrot/pretrained/{run}_test')
  assert f'{run}_test/' in presets.PRESETS['strongest'].measured
  h = {
    d: t[f'rouge1@data={d},layer=25,method=ep_skip']
    for d in ('enron', 'wikitext', 'sms')
  }
  cells = headline('Embed Parrot')
  assert cells['ours'] == (
    f'ROUGE-1 {h["enron"]:.2f} on Enron, {h["wikitext"]:.2f} /'
    f' {h["sms"]:.2f} on WikiText-2 / SMS (off-domain), held out'
    f' ({joined(r.values())} on the texts it was chosen on)'
  )
  paper = PAPER['embed_parrot_rouge1'] / 100
  assert cells['paper'].startswith(f'ROUGE-1 {paper:.2f} (Llama2-7B, layer 30,')


def test_exact_inversion_row():
  # The row quotes the unperturbed Enron cells of the report's first table
  # (test_exact_inversion_tables checks that table against the summary).
  s = summary('inversion_exact')
  n = s['num_texts@data=enron,split=test']
  layers = ('10', '20', '25', 'last')
  exact = [
    s[f'exact@attack=exact,data=enron,layer={x},split=test'] for x in layers
  ]
  hei = [
    s[f'rouge1@attack=hei,data=enron,layer={x},split=test'] for x in layers
  ]
  assert all(e == 1.0 for e in exact)
  others = [
    s[f'exact@attack=exact,data={c},layer={x},split=test']
    for c in ('wikitext', 'sms')
    for x in layers
  ]
  assert all(e == 1.0 for e in others)
  assert load_facts('inversion_exact')['device'] == 'cpu'
  cells = headline('Exact inversion of hidden states')
  assert cells['attack'] == (
    f'Exact inversion of hidden states (Nikolaou et al.), SmolLM2-135M, {n}'
    ' Enron test sentences per layer, 2-core CPU'
  )
  assert cells['ours'].startswith(
    f'{n} of {n} exact at layers 10, 20, 25 and the last; held out'
    ' (nothing tuned on the test split); likewise on WikiText-2 and SMS;'
  )
  assert cells['ours'].endswith(f'HEI ROUGE-1 ≤ {max(hei):.2f} there')
  # The introduction says the same.
  assert (
    f'{n} of {n} Enron sentences read back token for token from SmolLM2'
    "'s states at layers 10, 20, 25 and the last, and as many of"
    " WikiText-2's and SMS's, on a 2-core CPU"
  ) in PROSE
  config = json.loads(
    (ROOT / 'reports/inversion_exact/config.json').read_text()
  )
  assert config['splits'] == ['test']


def test_embed_parrot_pretrained_report():
  # reports/embed_parrot/README.md's by-layer table against the committed
  # per-layer summaries and the scratch run beside them.
  text = (ROOT / 'reports/embed_parrot/README.md').read_text('utf-8')
  corpora = ('enron', 'wikitext', 'sms')

  def cells(s, layer, method):
    return ' / '.join(
      f'{s[f"rouge1@data={d},layer={layer},method={method}"]:.3f}'
      for d in corpora
    )

  for layer in (10, 20, 25, 30):
    s = summary(f'embed_parrot/pretrained/layer_{layer}')
    line = (
      f'| {layer} | {cells(s, layer, "ep_pretrained")} |'
      f' {cells(s, layer, "ep_pretrained_ppl")} | {cells(s, layer, "hei")} |'
      f' {s["final_cos_loss@method=ep_pretrained"]:.3f} |'
    )
    assert line in text, line
  g = summary('embed_parrot/pretrained/ppl_0.01_layer_25')
  assert (
    f'(`ppl_0.01_layer_25/`, H200, a re-run of EP beside it) |'
    f' {cells(g, 25, "ep_pretrained")} | {cells(g, 25, "ep_pretrained_ppl")} |'
    f' {cells(g, 25, "hei")} | {g["final_cos_loss@method=ep_pretrained"]:.3f} |'
    in text
  )
  flat = ' '.join(text.split())
  assert (
    f'EP+PPL {cells(g, 25, "ep_pretrained_ppl")} against EP'
    f' {cells(g, 25, "ep_pretrained")} in the same run' in flat
  )
  for rate in ('3e-5', '3e-4', '6e-4', '1e-3'):
    run = f'lr_{rate}_layer_25'
    c = summary(f'embed_parrot/pretrained/{run}')
    config = json.loads(
      (ROOT / f'reports/embed_parrot/pretrained/{run}/config.json').read_text()
    )
    assert config['ep_decoder_lr'] == float(rate)
    assert (
      f'| 25, decoder learning rate {rate} (`{run}/`, H200) |'
      f' {cells(c, 25, "ep_pretrained")} | not run | {cells(c, 25, "hei")} |'
      f' {c["final_cos_loss@method=ep_pretrained"]:.3f} |' in text
    )
  for run, method in (
    ('samples_layer_25', 'ep_pretrained'),
    ('scratch_samples_layer_25', 'ep'),
  ):
    c = summary(f'embed_parrot/pretrained/{run}')
    assert c['num_train_samples'] == 3000
    assert (
      f'(`{run}/`, H200) | {cells(c, 25, method)} | not run |'
      f' {cells(c, 25, "hei")} | {c[f"final_cos_loss@method={method}"]:.3f} |'
      in text
    )
  for run in ('scratch_layer_25', 'scratch_ppl_0.01_layer_25'):
    c = summary(f'embed_parrot/pretrained/{run}')
    assert (
      f'(`{run}/`, CPU) | {cells(c, 25, "ep")} | {cells(c, 25, "ep_ppl")} |'
      f' {cells(c, 25, "hei")} | {c["final_cos_loss@method=ep"]:.3f} |' in text
    )
  for run in (
    'scratch_skip_layer_25',
    'scratch_skip_4000_layer_25',
    'scratch_skip_8000_layer_25',
    'scratch_skip_samples_layer_25',
  ):
    k = summary(f'embed_parrot/pretrained/{run}')
    assert (
      f'(`{run}/`, CPU) | {cells(k, 25, "ep_skip")} | not run |'
      f' {cells(k, 25, "hei")} | {k["final_cos_loss@method=ep_skip"]:.3f} |'
      in text
    )


def test_gboard_heldout_report():
  # reports/gboard/heldout/README.md against both committed summaries.
  text = ' '.join(
    (ROOT / 'reports/gboard/heldout/README.md').read_text('utf-8').split()
  )
  held, ins = summary('gboard/heldout'), summary('gboard')

  def noise_free_min(s, epochs):
    return min(
      _ratio(s, k)
      for k in s
      if k.startswith('f1@')
      and 'noise=none' in k
      and 'scale' not in k
      and any(f'E={e},' in k for e in epochs)
    )

  assert f'| ≥ {noise_free_min(held, (1, 50, 100)):.3f} |' in text
  assert (
    f'| ≥ {noise_free_min(ins, (1, 50, 100, 1000)):.3f} (all E ≤ 1000) |'
    in (text)
  )

  def cells(s, fmt, values):
    return ' / '.join(f'{_ratio(s, fmt.format(v)):.3f}' for v in values)

  for fmt, values in (
    ('f1@B=full,E={},n_k=256,noise=none,sigma=0.0', (1, 50, 100)),
    ('f1@B=32,E={},n_k=64,noise=dpsgd,sigma=0.1', (50, 100)),
    ('f1@B=full,E={},n_k=16,noise=dpsgd,sigma=0.1', (50, 100)),
    ('f1@B=full,E=100,n_k={},noise=single,sigma=0.001', (64, 256)),
  ):
    assert f'| {cells(held, fmt, values)} | {cells(ins, fmt, values)} |' in (
      text
    ), fmt
  assert (
    f'{held["theta0_eval_perplexity"]:.0f} (public mix) and'
    f' {held["theta0_sms_perplexity"]:.0f} (public SMS) here, against'
    f' {ins["theta0_eval_perplexity"]:.0f} and'
    f' {ins["theta0_sms_perplexity"]:.0f}'
  ) in text


def _draws(report, key):
  """Each dataset's F1 / upper of the `key` cell in `report`'s results."""
  cell = dict(part.split('=') for part in key.split('@')[1].split(','))
  out = []
  for line in (ROOT / 'reports' / report / 'results.jsonl').open():
    r = json.loads(line)
    if (
      str(r['B']) == cell['B']
      and r['E'] == int(cell['E'])
      and r['n_k'] == int(cell['n_k'])
      and r['noise'] == cell['noise']
      and r['sigma'] == float(cell['sigma'])
    ):
      out.append(r['f1'] / r['f1_upper'])
  return out


def test_gboard_heldout_e1000_report():
  # reports/gboard/heldout_e1000/README.md and its flagfile's header against
  # the committed summaries.
  here = ROOT / 'reports/gboard/heldout_e1000'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  held, ins = summary('gboard/heldout_e1000'), summary('gboard')
  e1 = summary('gboard/dpsgd_e1000/sentence_sum')
  moved = []
  for key in held:
    if not key.startswith('f1@'):
      continue
    if key in ins:
      moved.append(abs(_ratio(held, key) - _ratio(ins, key)))
  assert moved and f'by more than {max(moved):.3f} from the in-sample' in text
  key = 'f1@B=full,E=1000,n_k=16,noise=single,sigma=0.001'
  assert (
    f'n_k = 16, {_ratio(held, key):.3f} against {_ratio(ins, key):.3f})'
    in (text)
  )
  for label, key in (
    (
      'noise-free, n_k = 256, full batch',
      'f1@B=full,E=1000,n_k=256,noise=none,sigma=0.0',
    ),
    (
      'DPSGD-like σ = 0.1, n_k = 16, full batch',
      'f1@B=full,E=1000,n_k=16,noise=dpsgd,sigma=0.1',
    ),
    (
      'local DP σ = 0.001, n_k = 256, full batch',
      'f1@B=full,E=1000,n_k=256,noise=single,sigma=0.001',
    ),
  ):
    assert (
      f'| {label} | {_ratio(held, key):.3f} | {_ratio(ins, key):.3f} |' in text
    ), label
  key = 'f1@B=32,E=1000,n_k=64,noise=dpsgd,sigma=0.1'
  assert (
    f'| {_ratio(held, key):.3f} | {_ratio(e1, key):.3f} (`dpsgd_e1000' in text
  )
  low = min(
    _ratio(held, k) for k in held if k.startswith('f1@') and 'noise=none' in k
  )
  assert f'at least {low:.3f} of its upper bound' in text
  e100 = summary('gboard/heldout')
  drift = 'drift_to_noise@B=full,E={},n_k=256,noise=single,sigma=0.001'
  assert (
    f'is {held[drift.format(1000)]:.1f}, against'
    f' {e100[drift.format(100)]:.1f} at E = 100' in text
  )
  # Each dataset is in results.jsonl, three per cell.
  assert len(_draws('gboard/heldout_e1000', key)) == 3
  header = flag_header('gboard_heldout_e1000')
  assert f'word F1 >= {low:.3f} x the' in header
  dp16 = _ratio(held, 'f1@B=full,E=1000,n_k=16,noise=dpsgd,sigma=0.1')
  assert (
    f'{dp16:.3f} x (n_k = 16, full batch), {_ratio(held, key):.3f} x' in header
  )


def test_gboard_heldout_seed0_section():
  # reports/gboard/heldout/README.md's noise-draw table against results.
  text = ' '.join(
    (ROOT / 'reports/gboard/heldout/README.md').read_text('utf-8').split()
  )
  key = 'f1@B=full,E=100,n_k=256,noise=single,sigma=0.001'
  for report in (
    'gboard/heldout/seed0/insample_sentences',
    'gboard/heldout/seed0/heldout_sentences',
    'gboard/heldout',
  ):
    d = _draws(report, key)
    assert len(d) == 3
    cell = (
      ' / '.join(f'{x:.3f}' for x in d)
      + f' ({np.mean(d):.3f} ± {np.std(d, ddof=1):.3f}) |'
    )
    assert cell in text, report
    # The summary's cell is the mean over the datasets.
    assert np.isclose(
      summary(report)[key] / summary(report)['f1_upper' + key[2:]],
      np.mean(d),
      atol=0.02,
    )
  # Same θ0 and sentences as the in-sample run: the noise-free cell agrees.
  ins = summary('gboard')
  nf = 'f1@B=full,E=100,n_k=256,noise=none,sigma=0.0'
  same = _draws('gboard/heldout/seed0/insample_sentences', nf)[0]
  assert np.isclose(same, _ratio(ins, nf), atol=1e-9)


def test_film_utility_row():
  line = row("| FILM defenses' utility")
  wt, en = summary('film_utility'), summary('film_utility/enron')

  def ratio(s, d):
    key = 'test_perplexity@defense='
    return s[key + d] / s[key + 'none']

  assert (
    f'frozen embeddings {ratio(wt, "freeze"):.3f} (WikiText-2) /'
    f' {ratio(en, "freeze"):.3f} (Enron)' in line
  )
  prune = joined(ratio(wt, f'prune:{p}') for p in ('0.9', '0.9999'))
  assert f'pruning 0.9 / 0.9999: {prune}' in line
  dp = joined(ratio(wt, f'dp:{e}') for e in (15, 1))
  assert f'DP-SGD ε = 15 / 1: {dp} |' in line
  t4, t5 = PAPER['film_table4_ppl'], PAPER['film_table5_ppl']
  freeze = ' / '.join(
    f'{t5[d][1] / t5[d][0]:.3f}' for d in ('wikitext', 'enron')
  )
  prune = joined(t4[f'prune:{p}'] / t4['none'] for p in ('0.9', '0.9999'))
  dp = joined(t4[f'dp:{e}'] / t4['none'] for e in (15, 1))
  assert (
    f'| {freeze} (Table 5); {prune}; {dp} (Table 4; GPT-2 trained to'
    ' convergence) |' in line
  )


def test_film_dp_bound_report():
  # reports/film_bag/defenses/README.md's bound table against dp_bound.json.
  here = ROOT / 'reports/film_bag/defenses'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  bound = json.loads((here / 'dp_bound.json').read_text())
  by_eps = {r['epsilon']: r for r in bound['epsilons']}
  for paper in bound['paper_rows']:
    eps = paper['epsilon']
    r = by_eps[eps]
    assert r['matched_recall_at_paper_precision'] < 5e-4
    assert r['energy_recall_at_paper_precision'] < 5e-4
    line = (
      f'| {eps:.0f} | {paper["paper_precision"]:.2f} /'
      f' {paper["paper_recall"]:.2f} |'
      f' {r["matched_precision_at_paper_recall"]:.3f} |'
      f' {r["energy_precision_at_paper_recall"]:.3f} |'
      f' {paper["matched_largest_sigma"]:.3f}'
      f' (ε ≈ {paper["matched_epsilon_needed"]:,.0f}) |'
    )
    assert line in text, line
  top = by_eps[15.0]
  tokens = sum(b['true_bag_size'] for b in bound['batches'])
  assert (
    f'median norm {top["snr_median"]:.2f} σC at ε = 15 (largest'
    f' {top["snr_max"]:.2f} σC; {round(100 * top["snr_fraction_above_1"])} %'
    f' of the {tokens:,} batch tokens' in text
  )
  share = sum(b['embedding_norm_over_b_clip'] for b in bound['batches'])
  assert f'hold {share / len(bound["batches"]):.2f} of the batch' in text


def test_film_dp_pooled_report():
  # reports/film_bag/defenses/README.md's whole-gradient bound against
  # dp_pooled.json, and the oracle's curve against a direct count.
  from studies.film_bag.defenses import dp_pooled

  here = ROOT / 'reports/film_bag/defenses'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  pooled = json.loads((here / 'dp_pooled.json').read_text())
  by_eps = {r['epsilon']: r for r in pooled['epsilons']}
  for paper in pooled['paper_rows']:
    eps = paper['epsilon']
    r = by_eps[eps]
    line = (
      f'| {eps:.0f} | {paper["paper_precision"]:.2f} /'
      f' {paper["paper_recall"]:.2f} | {r["all_mu_median"]:.2f} |'
      f' {r["all_recall_at_paper_precision"]:.3f} |'
      f' {r["all_precision_at_paper_recall"]:.3f} |'
      f' {paper["largest_sigma"]:.3f} (ε ≈ {paper["epsilon_needed"]:,.0f}) |'
    )
    assert line in text, line
  # The README's conclusion: out of reach at ε = 15 and 10, not at 5.
  sigma = {r['epsilon']: r['sigma_of_run'] for r in pooled['paper_rows']}
  reach = {r['epsilon']: r['largest_sigma'] for r in pooled['paper_rows']}
  assert reach[15.0] < sigma[15.0] and reach[10.0] < sigma[10.0]
  assert reach[5.0] > sigma[5.0]
  top = by_eps[15.0]
  assert (
    f'the medians are {top["embedding_mu_median"]:.2f} for the tied'
    f' embedding matrix (row and head together),'
    f" {top['layer0_qkv_mu_median']:.2f} for the first layer's q/k/v"
    f' kernels, {top["layer0_rest_mu_median"]:.2f} for the rest of the first'
    f' layer and {top["later_layers_mu_median"]:.2f} for layers 1-29 with the'
    f' final norm, against {top["all_mu_median"]:.2f}' in text
  )
  assert f'μ = 1/σ = {top["whole_example_mu"]:.2f} at ε = 15' in text
  n_types = sum(len(b['types']) for b in pooled['batches'])
  assert f'({n_types} in all)' in text and f'({n_types} types)' in text
  # Parts add up in squares to the whole difference.
  for b in pooled['batches']:
    for t in b['types']:
      parts = sum(t[f'diff_norm_{k}'] ** 2 for k in dp_pooled.PARTS)
      np.testing.assert_allclose(parts, t['diff_norm'] ** 2, rtol=1e-4)
      assert t['diff_norm'] == min(c['diff_norm'] for c in t['candidates'])

  # oracle_pr against a Monte Carlo count of one threshold over all rows.
  rng = np.random.default_rng(0)
  mu, bag, vocab = np.array([1.0, 2.5, 4.0]), 30, 3000
  precision, recall = dp_pooled.oracle_pr(mu, bag, vocab)
  t_index = int(np.argmin(np.abs(np.linspace(-2.0, 12.0, 2801) - 2.5)))
  t = np.linspace(-2.0, 12.0, 2801)[t_index]
  draws = 4000
  true_stat = rng.normal(np.tile(mu, bag // 3), 1.0, size=(draws, bag))
  null_stat = rng.normal(0.0, 1.0, size=(draws, vocab - bag))
  tp = (true_stat > t).sum(1).mean()
  fp = (null_stat > t).sum(1).mean()
  np.testing.assert_allclose(recall[t_index], tp / bag, atol=0.01)
  np.testing.assert_allclose(precision[t_index], tp / (tp + fp), atol=0.01)


def test_film_dp_row():
  line = row('| FILM bag of words under DP-SGD')
  s = summary('film_bag/defenses')
  pooled = json.loads(
    (ROOT / 'reports/film_bag/defenses/dp_pooled.json').read_text()
  )
  by_eps = {r['epsilon']: r for r in pooled['epsilons']}

  def rule(m):
    return joined(
      (s[f'bag_{m}@b=16,defense=dp:{e},method=dp'] for e in (15, 10)), 3
    )

  assert f'precision {rule("precision")}, recall {rule("recall")};' in line
  recall = joined(
    (by_eps[e]['all_recall_at_paper_precision'] for e in (15.0, 10.0)), 3
  )
  assert f'recall {recall} at the paper' in line
  paper = PAPER['film_dp']
  assert (
    f'| precision / recall {joined(paper[15])}, {joined(paper[10])} (GPT-2,'
    ' Table 4b) |' in line
  )
  # The bound was computed at the same paper rows.
  for r in pooled['paper_rows']:
    if r['epsilon'] in (15.0, 10.0):
      assert (r['paper_precision'], r['paper_recall']) == paper[r['epsilon']]


def test_embed_parrot_report():
  # reports/embed_parrot/README.md: headline, DCT paragraph and the
  # dct_cost table against summary.json and dct_cost.json.
  here = ROOT / 'reports/embed_parrot'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  s = summary('embed_parrot')
  for data, name in (
    ('enron', 'enron (held out, training distribution)'),
    ('wikitext', 'wikitext-2'),
    ('sms', 'sms'),
  ):
    vals = [
      s[f'rouge1@data={data},layer=25,method={m}']
      for m in ('bei', 'hei', 'ep', 'ep_skip')
    ]
    assert f'| {name} | ' + ' | '.join(f'{v:.3f}' for v in vals) in text
  dct = lambda m, k: s[  # noqa: E731
    f'rouge1@data=enron,defense=dct,layer=25,method={m},subsets={k}'
  ]
  assert (
    f'from ROUGE-1 {s["rouge1@data=enron,layer=25,method=ep"]:.3f} to'
    f' {dct("ep", 1):.3f} (k = 1) and {dct("ep", 2):.3f} (k = 2)' in text
  )
  assert all(
    s[f'f1@data={d},defense=dct,layer=0,method=hei,subsets={k}'] == 1.0
    for d in ('enron', 'wikitext', 'sms')
    for k in (1, 2)
  )
  ppl = lambda layer, k: s[f'ppl@defense=dct,layer={layer},subsets={k}']  # noqa: E731
  assert (
    f'here {s["ppl@defense=none"]:,.0f} -> {ppl(0, 1):,.0f} /'
    f' {ppl(0, 2):,.0f} at layer 0 and {ppl(25, 1):,.0f} /'
    f' {ppl(25, 2):,.0f} at layer 25' in text
  )
  cost = json.loads((here / 'dct_cost.json').read_text())
  for r in cost['rows']:
    assert abs(r['ppl_defended'] / r['ppl_committed'] - 1) < 1e-5
    if r['layer'] is None:
      continue
    line = (
      f'| {r["layer"]} | {r["subsets"]} | {r["rank"]} / {r["dim"]} |'
      f' {100 * r["lost_energy"]:.2f} % | {r["relative_change"]:.2f} |'
      f' {r["ppl_defended"]:,.0f} | {r["ppl_undone"]:,.0f} |'
    )
    assert line in text, line


def test_film_untied_pruning_report():
  # reports/film_bag/defenses/README.md's untied-head table and prose
  # against untied.json and the committed run's summary.
  here = ROOT / 'reports/film_bag/defenses'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  untied = json.loads((here / 'untied.json').read_text())
  tied = json.loads((here / 'summary.json').read_text())
  for spec, mean in untied['mean'].items():
    label = 'none' if spec == 'none' else f'prune {spec.split(":")[1]}'
    cell = '-'
    if spec != 'none':
      key = f'b=16,defense={spec},method=nonzero'
      cell = (
        f'{tied[f"bag_precision@{key}"]:.3f} / {tied[f"bag_recall@{key}"]:.3f}'
      )
    line = (
      f'| {label} | {cell} | {mean["bag_precision"]:.3f} /'
      f' {mean["bag_recall"]:.3f} |'
    )
    assert line in text, line
  # Without pruning the rule misses exactly the last-only tokens.
  clean = [r for r in untied['rows'] if r['defense'] == 'none']
  missed = [r['true_bag_size'] - r['bag_size'] for r in clean]
  assert missed == [r['missed_last_only'] for r in clean]
  assert missed == [r['last_only_tokens'] for r in clean]
  assert f'{min(missed)}-{max(missed)} per batch' in text
  recall = untied['mean']['prune:0.9999']['bag_recall']
  assert f"paper's at 0.9999 ({recall:.3f} against 0.90)" in text


def test_embed_parrot_lora_report():
  # reports/embed_parrot/README.md's LoRA table and perplexity against
  # lora.json, the paper's columns against the script's Table 10 copy.
  from studies.embed_parrot import lora as lora_report

  here = ROOT / 'reports/embed_parrot'
  text = ' '.join((here / 'README.md').read_text('utf-8').split())
  report = json.loads((here / 'lora.json').read_text())
  paper = lora_report.PAPER_TABLE10_ROUGE1
  for layer in report['settings']['layers']:
    cells = [
      f'{report[model][f"{method}@layer={layer}"]["rouge1"]:.3f}'
      for method in ('bei', 'hei')
      for model in ('base', 'lora')
    ]
    for name in ('Llama2-7B', 'ChatGLM-6B'):
      if layer in lora_report.PAPER_LAYERS:
        i = lora_report.PAPER_LAYERS.index(layer)
        cells.append(f'{paper[name][i]:.2f} -> {paper["FT " + name][i]:.2f}')
      else:
        cells.append('-')
    line = f'| {layer} | ' + ' | '.join(cells) + ' |'
    assert line in text, line
  ppl = report['ppl']
  assert f'perplexity on them {ppl["base"]:.1f} -> {ppl["lora"]:.1f}' in text
  s = report['settings']
  assert (
    f'{s["texts"]:,} Embed Parrot training texts, {s["epochs"]} epochs'
    f' ({s["steps"]} steps of {s["batch_size"]})' in text
  )


def test_dager_truncation_bound():
  # The reports/dager README's ceiling for better sentence ends, against
  # truncation_bound.json, whose committed ROUGE-L must be the hybrid's.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  bound = json.loads((ROOT / 'reports/dager/truncation_bound.json').read_text())
  hyb = summary('dager/hybrid')
  for b in (32, 64):
    mean = bound[f'b={b}']['mean']
    assert mean['rougeL'] == pytest.approx(hyb[f'rougeL@attack=hybrid,b={b}'])
    assert mean['rougeL_recomputed'] == pytest.approx(mean['rougeL'])
  m64, m32 = bound['b=64']['mean'], bound['b=32']['mean']
  assert (
    f"average {m64['words_recovered']:.1f} words against the originals'"
    f' {m64["words_original"]:.1f}' in text
  )
  assert (
    f'would lift ROUGE-L from {m64["rougeL"]:.3f} to'
    f' {m64["rougeL_ideal_cuts"]:.3f} (b = 32: from {m32["rougeL"]:.3f} to'
    f' {m32["rougeL_ideal_cuts"]:.3f})' in text
  )


def test_dager_hybrid_cuts_report():
  # The reports/dager README's paragraph on choosing sentence ends, against
  # hybrid_cuts/ (its rows and summary), the default hybrid's rows and the
  # selection study, which must reproduce both from the run's searches.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())

  def rows(name):
    path = ROOT / f'reports/dager/{name}/results.jsonl'
    out = [json.loads(line) for line in path.open()]
    return sorted((r for r in out if r['b'] == 64), key=lambda r: r['batch'])

  cuts, base = rows('hybrid_cuts'), rows('hybrid')
  per = lambda rs: ' / '.join(f'{r["rougeL"]:.3f}' for r in rs)  # noqa: E731
  key = 'rougeL@attack=hybrid,b=64'
  assert (
    f'ROUGE-L {per(cuts)} on the three b = 64 batches against the'
    f" default's {per(base)}, mean {summary('dager/hybrid_cuts')[key]:.3f}"
    f' against {summary("dager/hybrid")[key]:.3f} (`hybrid_cuts/`)' in text
  )
  sel = json.loads(
    (ROOT / 'reports/dager/hybrid_cuts/selection.json').read_text()
  )
  assert [p['batch'] for p in sel['batches']] == [r['batch'] for r in cuts]
  same = 0
  for p, c, b in zip(sel['batches'], cuts, base):
    # The first b searches are the default hybrid; one batch's searches
    # part from the committed default's at a near-tie (README).
    same += p['first_b']['rougeL'] == pytest.approx(b['rougeL'])
    assert abs(p['first_b']['rougeL'] - b['rougeL']) < 0.01
    run = p['q=1']['cuts_oversample']
    assert run['matches_run'] is True
    assert run['rougeL'] == pytest.approx(c['rougeL'])
  m = sel['mean']
  q = [
    f'{m[f"q={k}"]["cuts_first_b"]["rougeL"]:.3f}' for k in ('0', '0.5', '1')
  ]
  assert f'the cuts give ROUGE-L {" / ".join(q)} with the rows weighted' in text
  assert f'against {m["first_b"]["rougeL"]:.3f} without them' in text
  assert f'is {m["ceiling_variants_rougeL"]:.3f}:' in text
  # The flagfile's header.
  head = flag_header('dager_hybrid_cuts')
  secs = ' / '.join(f'{r["seconds"]:,.0f}' for r in cuts)
  assert f'(measured: {secs} s for the three batches' in head
  assert (
    f'(ROUGE-L {summary("dager/hybrid_cuts")[key]:.3f} over the three'
    f' batches, {sum(round(64 * r["exact"]) for r in cuts)} of 192 sentences'
    f' exact; the default hybrid on them: {summary("dager/hybrid")[key]:.3f},'
    in head
  )


def test_dager_hybrid_freeze():
  # The reports/dager README's paragraph on the hybrid against frozen
  # embeddings, and both flagfile headers, against the committed runs.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  key = 'rougeL@attack=hybrid,b=32'

  def rows(report):
    path = ROOT / 'reports/dager' / report / 'results.jsonl'
    out = [json.loads(x) for x in path.open()]
    return [r for r in out if r['b'] == 32]

  def per(report, field='rougeL'):
    return ' / '.join(
      f'{r[field]:.3f}' if field == 'rougeL' else str(r[field])
      for r in rows(report)
    )

  full, free = summary('dager/hybrid'), summary('dager/hybrid_freeze')
  span, span_free = (
    summary('dager/hybrid_span_only'),
    summary('dager/hybrid_span_only_freeze'),
  )
  fk = key + ',defense=freeze'
  assert (
    f'ROUGE-L {per("hybrid")} to {per("hybrid_freeze")} (`hybrid_freeze/`;'
    f' mean {full[key]:.3f} -> {free[fk]:.3f}), no sentence exact' in text
  )
  assert free['exact@attack=hybrid,b=32,defense=freeze'] == 0.0
  assert (
    f'{per("hybrid_span_only")} without the defense,'
    f' {per("hybrid_span_only_freeze")} with it (`hybrid_span_only_freeze/`;'
    f' mean {span[key]:.3f} -> {span_free[fk]:.3f})' in text
  )
  assert (
    f'({per("hybrid_span_only_freeze", "num_candidates")} tokens against'
    f' {per("hybrid_span_only", "num_candidates")})' in text
  )
  for report in ('hybrid_freeze', 'hybrid_span_only_freeze'):
    assert all(r['defense'] == 'freeze' for r in rows(report))
  for name, got, base in (
    ('dager_hybrid_freeze', free[fk], full[key]),
    ('dager_hybrid_span_only_freeze', span_free[fk], span[key]),
  ):
    header = flag_header(name)
    assert f'(ROUGE-L {got:.3f}, against {base:.3f} without' in header, name


def test_dager_hybrid_defenses():
  # The reports/dager README's paragraph on the hybrid under noise and
  # FedAvg at b = 16, and both flagfile headers, against the committed runs.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  hyb, noise = summary('dager/hybrid_defenses'), summary('dager/hybrid_noise')
  dager = summary('dager/defenses')

  def cell(src, metric, defense, prefix='attack=hybrid,'):
    tail = '' if defense == 'none' else f',defense={defense}'
    return src[f'{metric}@{prefix}b=16{tail}']

  assert (
    f'(ROUGE-L {cell(hyb, "rougeL", "none"):.3f} against'
    f' {cell(dager, "rougeL", "none", ""):.3f},'
    f' {cell(hyb, "exact", "none"):.3f} of the sentences exact)' in text
  )
  for d in ('noise:1e-7', 'noise:1e-6', 'fedavg:2:16'):
    assert cell(dager, 'rougeL', d, '') == 0.0  # "DAGER recovers nothing"
  r = lambda d: f'{cell(hyb, "rougeL", d):.3f}'  # noqa: E731
  e = lambda d: f'{cell(hyb, "exact", d):.3f}'  # noqa: E731
  assert (
    f'it keeps ROUGE-L {r("noise:1e-7")} / {r("noise:1e-6")}'
    f' ({e("noise:1e-7")} / {e("noise:1e-6")} exact); at 1e-5 / 1e-4 it keeps'
    f' {cell(noise, "rougeL", "noise:1e-5"):.3f} /'
    f' {cell(noise, "rougeL", "noise:1e-4"):.3f}' in text
  )
  assert f'it keeps {r("fedavg:2:16")} ({e("fedavg:2:16")} exact)' in text
  heads = {}
  for name in ('dager_hybrid_defenses', 'dager_hybrid_noise'):
    heads[name] = flag_header(name)
  four = ('none', 'noise:1e-7', 'noise:1e-6', 'fedavg:2:16')
  assert (
    f'(ROUGE-L {" / ".join(r(d) for d in four)} with none'
    in heads['dager_hybrid_defenses']
  )
  assert (
    'DAGER on the same batches: '
    + ' / '.join(f'{cell(dager, "rougeL", d, ""):.3f}' for d in four)
    in heads['dager_hybrid_defenses']
  )
  assert (
    f'(ROUGE-L {cell(noise, "rougeL", "noise:1e-5"):.3f} /'
    f' {cell(noise, "rougeL", "noise:1e-4"):.3f} at std'
    in heads['dager_hybrid_noise']
  )


def test_dager_defenses_row():
  line = row('| DAGER and the hybrid under gradient noise')
  hyb, dager = summary('dager/hybrid_defenses'), summary('dager/defenses')
  three = ('noise:1e-7', 'noise:1e-6', 'fedavg:2:16')
  d = joined((dager[f'rougeL@b=16,defense={x}'] for x in three), 3)
  h = joined((hyb[f'rougeL@attack=hybrid,b=16,defense={x}'] for x in three), 3)
  assert f'ROUGE-L: DAGER {d}; the hybrid {h}; same data |' in line


def test_dager_beams_study():
  # The reports/dager README's paragraph on the searches' other beams,
  # against beams.json; its ceilings against the selection study's.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager/hybrid_cuts'
  beams = json.loads((folder / 'beams.json').read_text())
  white = json.loads((folder / 'selection_whiten.json').read_text())
  m = beams['mean']
  pair = lambda k: f'{m[k]["upper"]:.3f} / {m[k]["assigned"]:.3f}'  # noqa: E731
  assert (
    f'the searched sentences {pair("searched")}, their cuts {pair("cuts")},'
    f" every beam's cuts {pair('beams_cuts')} (about"
    f' {m["beams_cuts"]["candidates"]:,.0f} candidates a batch against'
    f' {m["cuts"]["candidates"]:,.0f})' in text
  )
  assert m['beams_cuts']['assigned'] < 0.5
  for k in ('upper', 'assigned'):
    assert 0 < m['beams_cuts'][k] - m['cuts'][k] < 0.015  # "about 0.01"
  chosen = white['mean']['q=1']['cuts_first_b']['rougeL']
  assert (
    f"selection's {chosen:.3f} is"
    f' {round(100 * chosen / m["cuts"]["assigned"])} % of the cuts' in text
  )
  # The ceilings of the cuts are the selection study's, batch by batch,
  # where the re-run repeated the committed searches.
  for p, w in zip(beams['batches'], white['batches'], strict=True):
    assert p['batch'] == w['batch']
    if p['matches_run']:
      assert p['cuts']['upper'] == pytest.approx(w['ceiling_variants_rougeL'])
    for k in ('searched', 'cuts', 'beams_cuts'):
      assert p[k]['assigned'] <= p[k]['upper'] + 1e-12
  assert [p['matches_run'] for p in beams['batches']] == [True, False, True]


def test_dager_whitened_selection_and_refinement():
  # The reports/dager README's paragraphs on matching whitened rows and on
  # refining the kept sentences, against their studies of hybrid_cuts/.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager/hybrid_cuts'
  white = json.loads((folder / 'selection_whiten.json').read_text())
  raw = json.loads((folder / 'selection.json').read_text())
  cell = lambda p, q: p[f'q={q}']['cuts_first_b']['rougeL']  # noqa: E731
  per = ' / '.join(f'{cell(p, 1):.3f}' for p in white['batches'])
  assert (
    f'the same searches give ROUGE-L {per}, mean'
    f' {cell(white["mean"], 1):.3f}, against {cell(raw["mean"], 1):.3f}' in text
  )
  qs = ' / '.join(f'{cell(white["mean"], q):.3f}' for q in ('0', '0.5', '1'))
  assert f'weights q = 0 / 0.5 / 1: {qs})' in text
  # Whitening changes the choice, not the searches: the same first b.
  for w, r in zip(white['batches'], raw['batches'], strict=True):
    assert w['first_b'] == r['first_b'] and w['variants'] == r['variants']

  def share(s):
    m = s['mean']
    gain = cell(m, 1) - m['first_b']['rougeL']
    return round(
      100 * gain / (m['ceiling_variants_rougeL'] - m['first_b']['rougeL'])
    )

  assert (
    f'{share(white)} % of what ideal cuts would add, against {share(raw)} %'
    in text
  )
  ref = json.loads((folder / 'refine.json').read_text())
  rows = [json.loads(x) for x in (folder / 'results.jsonl').open()]
  for p, r in zip(ref['batches'], sorted(rows, key=lambda r: r['batch'])):
    # It starts from the run's own kept sentences.
    assert p['before']['rougeL'] == pytest.approx(r['rougeL'])
    assert p['sweeps'] == 2 and p['whiten'] and p['proposals'] == 16
  before = ' / '.join(f'{p["before"]["rougeL"]:.3f}' for p in ref['batches'])
  after = ' / '.join(f'{p["after"]["rougeL"]:.3f}' for p in ref['batches'])
  m = ref['mean']
  assert (
    f'ROUGE-L moves from {before} to {after} (mean'
    f' {m["before"]["rougeL"]:.3f} -> {m["after"]["rougeL"]:.3f})' in text
  )
  rise = [
    100 * (p['objective'][-1] / p['objective'][0] - 1) for p in ref['batches']
  ]
  assert f'raise the objective by {min(rise):.0f}-{max(rise):.0f} %' in text
  changed = [p['changed'] for p in ref['batches']]
  assert f'change {min(changed)}-{max(changed)} of the 64 sentences' in text


def test_dager_hybrid_cuts_whiten_run():
  # The experiment with whitened rows on batch 0 makes the study's choice,
  # and the README and the flagfile header quote its row.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager'
  (row,) = [
    json.loads(x) for x in (folder / 'hybrid_cuts_whiten/results.jsonl').open()
  ]
  config = json.loads((folder / 'hybrid_cuts_whiten/config.json').read_text())
  assert config['hybrid_select_whiten'] and row['batch'] == 0
  study = json.loads((folder / 'hybrid_cuts/selection_whiten.json').read_text())
  cell = study['batches'][0]['q=1']['cuts_first_b']
  assert row['rougeL'] == pytest.approx(cell['rougeL'])
  exact = round(64 * row['exact'])
  stages = row['stage_seconds']
  assert (
    f'gives the same ROUGE-L {row["rougeL"]:.3f}, {exact} of 64 sentences'
    f' exact, in {row["seconds"]:.0f} s (search {stages["search"]:.0f} s,'
    f' selection {stages["select"]:.0f} s;' in text
  )
  head = flag_header('dager_hybrid_cuts_whiten')
  raw = [json.loads(x) for x in (folder / 'hybrid_cuts/results.jsonl').open()]
  raw0 = [r for r in raw if r['batch'] == 0][0]['rougeL']
  assert (
    f'{row["seconds"]:.0f} s for the batch (search {stages["search"]:.0f} s,'
    f' selection {stages["select"]:.0f} s)' in head
  )
  assert (
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact} of 64 sentences exact; the raw'
    f' rows on the same batch: {raw0:.3f}' in head
  )


def test_dager_hybrid_starts():
  # The reports/dager README's paragraph on allocated starts, against
  # starts.json, the starts run, its selection study and the default's.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager'
  starts = json.loads((folder / 'starts.json').read_text())
  b64 = [p for p in starts['batches'] if p['b'] == 64]
  (b128,) = [p for p in starts['batches'] if p['b'] == 128]
  ints = lambda xs: ' / '.join(str(x) for x in xs)  # noqa: E731
  assert (
    f'first tokens match {ints(p["allocated_hits"] for p in b64)} of the 64'
    f" sentences' on the three b = 64 batches, and"
    f' {b128["allocated_hits"]} of 128 on the first b = 128 batch' in text
  )
  quoted = lambda xs: ', '.join(repr(x) for x in xs)  # noqa: E731
  prior = starts['prior']
  assert (
    f'likeliest next tokens are letters glued on ({quoted(prior["bos,The"])}),'
    f" after `<|endoftext|>` and 'The' they are"
    f' {quoted(prior["endoftext,The"])}' in text
  )
  assert all(not t.startswith(' ') for t in prior['bos,The'])
  corr = ' / '.join(f'{p["corr"]:.2f}' for p in starts['batches'])
  assert f'the estimates correlate {corr} with the true counts' in text
  assert (
    "the default hybrid's recovered first words match"
    f' {ints(p["first_word_hits,hybrid"] for p in b64)} of 64' in text
  )

  def rows(name):
    out = [json.loads(x) for x in (folder / name / 'results.jsonl').open()]
    return sorted(
      [r for r in out if r['b'] == 64 and r['attack'] == 'hybrid'],
      key=lambda r: r['batch'],
    )

  got, base = rows('hybrid_starts'), rows('hybrid')
  # The study scored the same rows the run wrote.
  for p, r in zip(b64, got, strict=True):
    assert p['rougeL,hybrid_starts'] == pytest.approx(r['rougeL'])
    assert p['first_word_hits,hybrid_starts'] <= 64
  config = json.loads((folder / 'hybrid_starts/config.json').read_text())
  assert config['hybrid_start_dims'] == starts['dims'] == 64
  assert config['hybrid_prior_start'] == 0
  r3 = lambda rs: ' / '.join(f'{r["rougeL"]:.3f}' for r in rs)  # noqa: E731
  mean = lambda rs: np.mean([r['rougeL'] for r in rs])  # noqa: E731
  exact = lambda rs: round(sum(64 * r['exact'] for r in rs))  # noqa: E731
  assert (
    f'ROUGE-L {r3(got)} on the three batches, mean {mean(got):.3f}, against'
    f" the default's {r3(base)} (mean {mean(base):.3f}), {exact(got)} of 192"
    f' sentences exact against {exact(base)}.' in text
  )
  assert (
    f'first words match {ints(p["first_word_hits,hybrid_starts"] for p in b64)}'
    in text
  )
  words = lambda rs, k: np.mean([len(s.split()) for r in rs for s in r[k]])  # noqa: E731
  assert (
    f'({words(got, "recovered"):.1f} words on average, the originals'
    f' {words(got, "originals"):.1f})' in text
  )
  sel = json.loads((folder / 'hybrid_starts/selection_whiten.json').read_text())
  old = json.loads((folder / 'hybrid_cuts/selection_whiten.json').read_text())
  cell = lambda p, q: p[f'q={q}']['cuts_first_b']['rougeL']  # noqa: E731
  per = ' / '.join(f'{cell(p, 1):.3f}' for p in sel['batches'])
  qs = ' / '.join(f'{cell(sel["mean"], q):.3f}' for q in ('0', '0.5', '1'))
  assert (
    f'they give ROUGE-L {per} (mean {cell(sel["mean"], 1):.3f}, against'
    f" {cell(old['mean'], 1):.3f} from the default's searches; q = 0 / 0.5 /"
    f' 1: {qs}; the kept sentences average'
    f' {sel["mean"]["q=1"]["cuts_first_b"]["words"]:.1f} words)' in text
  )
  assert (
    f'rises from {old["mean"]["ceiling_variants_rougeL"]:.3f} to'
    f' {sel["mean"]["ceiling_variants_rougeL"]:.3f}. Still short of 0.5' in text
  )
  assert sel['mean']['ceiling_variants_rougeL'] < 0.55
  # The study's first b are the run's searches, as searched.
  for p, r in zip(sel['batches'], got, strict=True):
    assert p['first_b']['rougeL'] == pytest.approx(r['rougeL'])
  head = flag_header('dager_hybrid_starts')
  seconds = [r['seconds'] for r in got]
  assert (
    f'(measured: {min(seconds):.0f}-{max(seconds):.0f} s a batch)' in head
    and f'(ROUGE-L {mean(got):.3f} over the three batches, {exact(got)} of 192'
    f' sentences exact; the default hybrid on them: {mean(base):.3f}'
    in head
  )


def test_dager_hybrid_starts_cuts_run():
  # The experiment with every option on batch 0 makes the study's choice
  # from the starts run's searches; the README and the flagfile header
  # quote its row.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager'
  (row,) = [
    json.loads(x) for x in (folder / 'hybrid_starts_cuts/results.jsonl').open()
  ]
  config = json.loads((folder / 'hybrid_starts_cuts/config.json').read_text())
  assert config['hybrid_select_whiten'] and config['hybrid_cuts']
  assert config['hybrid_start_dims'] == 64 and row['batch'] == 0
  study = json.loads(
    (folder / 'hybrid_starts/selection_whiten.json').read_text()
  )
  assert row['rougeL'] == pytest.approx(
    study['batches'][0]['q=1']['cuts_first_b']['rougeL']
  )
  (searched,) = [
    json.loads(x)
    for x in (folder / 'hybrid_starts/results.jsonl').open()
    if json.loads(x)['batch'] == 0
  ]
  assert row['searched_ids'] == searched['searched_ids']
  assert [s[1] for s in row['searched_ids']] == row['start_ids']
  exact = round(64 * row['exact'])
  stages = row['stage_seconds']
  timing = (
    f'in {row["seconds"]:.0f} s (search {stages["search"]:.0f} s,'
    f' selection {stages["select"]:.0f} s)'
  )
  assert (
    f'gives the same ROUGE-L {row["rougeL"]:.3f}, {exact} of 64 sentences'
    f' exact, {timing}.' in text
  )
  head = flag_header('dager_hybrid_starts_cuts')
  (white,) = [
    json.loads(x) for x in (folder / 'hybrid_cuts_whiten/results.jsonl').open()
  ]
  assert (
    f'{row["seconds"]:.0f} s for the batch (search {stages["search"]:.0f} s,'
    f' selection {stages["select"]:.0f} s)' in head
  )
  assert (
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact} of 64 sentences exact; the'
    " default hybrid's searches with the same selection:"
    f' {white["rougeL"]:.3f}' in head
  )


def dager_rows(name: str) -> list[dict]:
  """The rows of `reports/dager/<name>/results.jsonl`, by batch."""
  path = ROOT / 'reports/dager' / name / 'results.jsonl'
  return sorted((json.loads(x) for x in path.open()), key=lambda r: r['batch'])


def dager_text() -> str:
  """reports/dager/README.md with its whitespace folded."""
  return ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())


def only_row(name: str) -> dict:
  """The one row of `reports/dager/<name>/results.jsonl`."""
  path = ROOT / 'reports/dager' / name / 'results.jsonl'
  (row,) = [json.loads(x) for x in path.open()]
  return row


def first_word_hits(row: dict) -> int:
  """Recovered first words that some original starts with (multiset)."""
  count = lambda texts: collections.Counter(  # noqa: E731
    t.split()[0] for t in texts if t.split()
  )
  return sum((count(row['originals']) & count(row['recovered'])).values())


def test_dager_hybrid_starts_b128():
  # The reports/dager README's b = 128 sentence and the flagfile header,
  # against the starts run and the default's row on that batch.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager'
  got, base = only_row('hybrid_starts_b128'), only_row('hybrid_b128')
  assert got['b'] == base['b'] == 128 and got['batch'] == base['batch'] == 0
  config = json.loads((folder / 'hybrid_starts_b128/config.json').read_text())
  assert config['hybrid_start_dims'] == 64 and config['hybrid_prior_start'] == 0

  exact = round(128 * got['exact'])
  none = 'none' if round(128 * base['exact']) == 0 else 'x'
  assert (
    f"ROUGE-L {got['rougeL']:.3f} against the default's {base['rougeL']:.3f},"
    f' {exact} of 128 sentences exact against {none}, and {first_word_hits(got)}'
    f' recovered first words right against {first_word_hits(base)}.' in text
  )
  head = flag_header('dager_hybrid_starts_b128')
  assert f'(measured: {got["seconds"]:.0f} s for the batch' in head
  assert (
    f'(ROUGE-L {got["rougeL"]:.3f}, {exact} of 128 sentences exact; the'
    f' default hybrid on that batch: {base["rougeL"]:.3f}' in head
  )


def test_dager_hybrid_evidence():
  # The reports/dager README's paragraph on the log-likelihood ratio and
  # the flagfile header, against the run, its searches as searched, the
  # starts run's selection study and head_ranks.json.
  text = dager_text()
  folder = ROOT / 'reports/dager'
  rows = dager_rows('hybrid_evidence')
  assert [r['batch'] for r in rows] == [0, 1, 2]
  config = json.loads((folder / 'hybrid_evidence/config.json').read_text())
  assert config['hybrid_weight_evidence'] == 30.0
  assert config['hybrid_start_dims'] == 64 and config['hybrid_prior_start'] == 0
  assert config['hybrid_cuts'] and config['hybrid_select_whiten']
  r3 = lambda xs: ' / '.join(f'{x:.3f}' for x in xs)  # noqa: E731
  got = [r['rougeL'] for r in rows]
  study = json.loads(
    (folder / 'hybrid_starts/selection_whiten.json').read_text()
  )
  before = [p['q=1']['cuts_first_b']['rougeL'] for p in study['batches']]
  exact = sum(round(64 * r['exact']) for r in rows)
  assert (
    f'ROUGE-L {r3(got)} on the three b = 64 batches, mean'
    f' {np.mean(got):.3f}, against {r3(before)} (mean {np.mean(before):.3f})'
    f' without the ratio, {exact} of 192 sentences exact' in text
  )
  searched = json.loads((folder / 'hybrid_evidence/searched.json').read_text())
  for p, r in zip(searched['batches'], rows, strict=True):
    assert p['kept']['rougeL'] == r['rougeL']
  mean_starts = np.mean(
    [
      json.loads(x)['rougeL']
      for x in (folder / 'hybrid_starts/results.jsonl').open()
    ]
  )
  assert (
    f'give {r3(p["searched"]["rougeL"] for p in searched["batches"])} (mean'
    f' {searched["mean"]["searched"]["rougeL"]:.3f}, against the starts'
    f" searches' {mean_starts:.3f})" in text
  )
  assert f'by {0.5 - np.mean(got):.3f} on the mean' in text
  chosen = json.loads(
    (folder / 'hybrid_evidence/selection_whiten.json').read_text()
  )
  for p, r in zip(chosen['batches'], rows, strict=True):
    assert p['q=1']['cuts_first_b']['rougeL'] == pytest.approx(r['rougeL'])
  weights = ' / '.join(
    f'{chosen["mean"][f"q={q}"]["cuts_first_b"]["rougeL"]:.3f}'
    for q in ('0', '0.5', '1')
  )
  ceilings = (
    f'{study["mean"]["ceiling_variants_rougeL"]:.3f} to'
    f' {chosen["mean"]["ceiling_variants_rougeL"]:.3f}'
  )
  assert (
    f'q = 0 / 0.5 / 1 it gives {weights}, and the ceiling, each original'
    f' against its best variant, rises from {ceilings}' in text
  )
  assert max(got) > 0.5 > np.mean(got)
  ranks = json.loads((folder / 'head_ranks.json').read_text())
  pct = lambda x: f'{100 * x:.0f} %'  # noqa: E731
  on, off = (
    ranks['lm+head+evidence,w=12.0,e=30.0'],
    ranks['lm+head,s=0.1,w=12.0'],
  )
  assert (
    f'first at {pct(on["top1"])} of positions against {pct(off["top1"])}'
    f' (top 32: {pct(on["top32"])} against {pct(off["top32"])};' in text
  )
  assert (
    f'({ranks["targets_estimated"]:,.0f} against the true'
    f' {ranks["targets"]:,} on batch 0' in text
  )
  seconds = [r['seconds'] for r in rows]
  search = [r['stage_seconds']['search'] for r in rows]
  select = [r['stage_seconds']['select'] for r in rows]
  span = lambda xs: f'{min(xs):.0f}-{max(xs):.0f} s'  # noqa: E731
  timing = (
    f'{span(seconds)} a batch (search {span(search)}, selection {span(select)})'
  )
  assert timing in text
  head = flag_header('dager_hybrid_evidence')
  assert f'(measured: {span(seconds)} a batch)' in head
  assert (
    f'(ROUGE-L {np.mean(got):.3f} over the three batches, {exact} of 192'
    f' sentences exact; without the ratio: {np.mean(before):.3f},' in head
  )


def test_dager_hybrid_evidence_b128():
  # The b = 128 sentence and the flagfile header, against the ratio's run
  # and the starts run on the same batch.
  text = ' '.join((ROOT / 'reports/dager/README.md').read_text('utf-8').split())
  folder = ROOT / 'reports/dager'
  got, base = only_row('hybrid_evidence_b128'), only_row('hybrid_starts_b128')
  assert got['b'] == base['b'] == 128 and got['batch'] == base['batch'] == 0
  config = json.loads((folder / 'hybrid_evidence_b128/config.json').read_text())
  assert config['hybrid_weight_evidence'] == 30.0 and not config['hybrid_cuts']

  exact, exact_base = round(128 * got['exact']), round(128 * base['exact'])
  assert exact == exact_base
  assert (
    f"ROUGE-L {got['rougeL']:.3f} against the starts' {base['rougeL']:.3f},"
    f' {exact} of 128 sentences exact as with the starts, and {first_word_hits(got)}'
    f' recovered first words right against {first_word_hits(base)}, in'
    f' {got["seconds"]:.0f} s' in text
  )
  head = flag_header('dager_hybrid_evidence_b128')
  assert f'(measured: {got["seconds"]:.0f} s,' in head
  assert (
    f'(ROUGE-L {got["rougeL"]:.3f}, {exact} of 128 sentences exact;'
    f' without the ratio: {base["rougeL"]:.3f},' in head
  )


def test_dager_hybrid_evidence_oversample():
  # The paragraph on 1.5 b searches and the flagfile header, against the
  # run, its searches as searched and the run with b searches.
  text = dager_text()
  folder = ROOT / 'reports/dager'
  rows = dager_rows('hybrid_evidence_oversample')
  base = dager_rows('hybrid_evidence')
  assert [r['batch'] for r in rows] == [r['batch'] for r in base] == [0, 1, 2]
  config = json.loads(
    (folder / 'hybrid_evidence_oversample/config.json').read_text()
  )
  assert config['hybrid_oversample'] == 1.5
  for r, q in zip(rows, base, strict=True):
    assert r['num_searched'] == 96 and r['num_recovered'] == 64
    # The first 64 searches are the b-search run's own.
    assert r['searched_ids'][:64] == q['searched_ids']
  r3 = lambda xs: ' / '.join(f'{x:.3f}' for x in xs)  # noqa: E731
  got = [r['rougeL'] for r in rows]
  exact = sum(round(64 * r['exact']) for r in rows)
  assert (
    f'ROUGE-L {r3(got)} on the three batches, mean {np.mean(got):.3f},'
    f' against {np.mean([q["rougeL"] for q in base]):.3f} with 64 searches;'
    f' {exact} of 192 sentences exact. Every batch passes the goal of 0.5.'
    in text
  )
  assert min(got) >= 0.5
  searched = json.loads(
    (folder / 'hybrid_evidence_oversample/searched.json').read_text()
  )
  beyond = [p['kept']['kept_beyond_b'] for p in searched['batches']]
  assert (
    f'{r3(p["searched"]["rougeL"] for p in searched["batches"])} as searched)'
    in text
  )
  assert (
    f'{" / ".join(map(str, beyond))} of the kept sentences come from the'
    ' extra searches' in text
  )
  span = lambda xs: f'{min(xs):.0f}-{max(xs):.0f} s'  # noqa: E731
  seconds = [r['seconds'] for r in rows]
  search = [r['stage_seconds']['search'] for r in rows]
  select = [r['stage_seconds']['select'] for r in rows]
  assert (
    f'{span(seconds)} a batch (search {span(search)}, selection'
    f' {span(select)}; a test run' in text
  )
  assert f'of batch 0), against {span([q["seconds"] for q in base])}' in text
  head = flag_header('dager_hybrid_evidence_oversample')
  assert f'(measured: {span(seconds)} a batch)' in head
  assert (
    f'(ROUGE-L {np.mean(got):.3f} over the three batches, {exact} of 192'
    f' sentences exact; with 64 searches: {np.mean([q["rougeL"] for q in base]):.3f},'
    in head
  )


def test_dager_hybrid_evidence_oversample_heldout():
  # The held-out sentence and the flagfile header, against the run on
  # b = 64 batches 3-8 and its searches as searched.
  from leakjax.attacks.dager import runner

  text = dager_text()
  folder = ROOT / 'reports/dager/hybrid_evidence_oversample_heldout'
  rows = dager_rows('hybrid_evidence_oversample_heldout')
  assert [r['batch'] for r in rows] == [3, 4, 5, 6, 7, 8]
  config = json.loads((folder / 'config.json').read_text())
  tuned = json.loads(
    (ROOT / 'reports/dager/hybrid_evidence_oversample/config.json').read_text()
  )
  assert (tuned['split'], config['split']) == ('dev', 'test')
  # The same settings as the run on batches 0-2, but for the batches.
  held_cfg, tuned_cfg = map(runner.config_from_json, (config, tuned))
  assert held_cfg.hybrid == tuned_cfg.hybrid
  moved = {
    f.name
    for f in dataclasses.fields(held_cfg)
    if getattr(held_cfg, f.name) != getattr(tuned_cfg, f.name)
  }
  assert moved == {'first_batch', 'num_batches', 'split', 'preset'}, moved
  r3 = lambda xs: ' / '.join(f'{x:.3f}' for x in xs)  # noqa: E731
  got = [r['rougeL'] for r in rows]
  exact = sum(round(64 * r['exact']) for r in rows)
  seconds = [r['seconds'] for r in rows]
  idle = f'{min(seconds[:3]):.0f}-{max(seconds[:3]):.0f} s'
  shared = f'{min(seconds[3:]):.0f}-{max(seconds[3:]):.0f} s'
  assert (
    f'give ROUGE-L {r3(got)}, mean {np.mean(got):.3f}, with {exact} of 384'
    f' sentences exact. Batches 3-5 took {idle} a batch on an idle CPU;'
    f' batches 6-8 ran later on another CPU beside two other runs ({shared}'
    ' a batch)' in text
  )
  cpu = json.loads((folder / 'provenance.json').read_text())['environment']
  assert cpu['cpu']['model'] == 'AMD EPYC'  # the first run's; 6-8: Intel
  searched = json.loads((folder / 'searched.json').read_text())
  assert [p['batch'] for p in searched['batches']] == [3, 4, 5, 6, 7, 8]
  beyond = ' / '.join(
    str(p['kept']['kept_beyond_b']) for p in searched['batches']
  )
  assert (
    f'give {r3(p["searched"]["rougeL"] for p in searched["batches"])}'
    f' (`searched.json`); {beyond} of the kept sentences' in text
  )
  head = flag_header('dager_hybrid_evidence_oversample_heldout')
  assert f'measured {idle} a batch for batches 3-5 on an idle machine' in head
  assert (
    f'(ROUGE-L {np.mean(got):.3f} over the six batches, {exact} of 384'
    ' sentences exact)' in head
  )


def test_quick_audit_answer():
  s = summary('audit/quick')

  def count(defense):
    key = f'exact@artefact=gradient,b=16,defense={defense}'
    return f'{round(s[key] * 16)} of 16'

  ratio = s['perplexity_ratio@defense=dp:8']
  assert (
    f'{count("none")} sentences are read back verbatim; DP-SGD at ε = 8'
    f' brings that to {round(s["exact@artefact=gradient,b=16,defense=dp:8"] * 16)}'
    f' at {ratio:.2f}x'
  ) in PROSE
  freeze = s['perplexity_ratio@defense=freeze']
  assert f'frozen embeddings leave {count("freeze")} at {freeze:.2f}x' in PROSE
  facts = json.loads(
    (ROOT / 'reports' / 'audit' / 'quick' / 'facts.json').read_text()
  )
  assert (
    f'Measured: {facts["seconds"]:.0f} s and'
    f' {facts["peak_memory_mib"]:,.0f} MiB peak memory'
  ) in PROSE


def _table_rows(text: str, header_start: str) -> list[list[str]]:
  """The body rows of the markdown table whose header starts so."""
  lines = text.splitlines()
  start = next(i for i, x in enumerate(lines) if x.startswith(header_start))
  rows = []
  for line in lines[start + 2 :]:
    if not line.startswith('|'):
      break
    rows.append([c.strip() for c in line.strip('|').split('|')])
  return rows


def _shown(value: float, cell: str) -> bool:
  """`cell` is `value` at the decimals it is written with."""
  decimals = len(cell.split('.')[1]) if '.' in cell else 0
  return f'{value:.{decimals}f}' == cell.replace(',', '')


def _exact_keys(at: str, shown: tuple[str, ...]) -> list[str]:
  """The summary keys of one exact-inversion table row: the search's
  exact, ROUGE-1, candidates and seconds, then `shown` (metric@attack)."""
  return [
    f'exact@attack=exact,{at}',
    f'rouge1@attack=exact,{at}',
    f'candidates_per_token@attack=exact,{at}',
    f'seconds_per_sentence@attack=exact,{at}',
    *(f'{x},{at}' for x in shown),
  ]


def test_exact_inversion_tables():
  text = (ROOT / 'reports' / 'inversion_exact' / 'README.md').read_text()
  main, robust = summary('inversion_exact'), summary('inversion_exact/robust')
  quick = summary('inversion_exact/quick')
  one_shot = ('rouge1@attack=softmax', 'rouge1@attack=ridge')
  rows = _table_rows(text, '| corpus | layer | exact |')
  assert len(rows) == 15
  reads = ('rouge1@attack=softmax', 'rouge1@attack=ep_skip')
  reads += ('rouge1@attack=ridge', 'rouge1@attack=hei', 'rouge1@attack=bei')
  for corpus, layer, *cells in rows:
    at = f'data={corpus},layer={layer},split=test'
    keys = _exact_keys(at, reads)
    for key, cell in zip(keys, cells, strict=True):
      assert _shown(main[key], cell), (key, cell)
  specs = json.loads(
    (ROOT / 'reports/inversion_exact/robust/config.json').read_text()
  )['perturbations']
  rows = _table_rows(text, '| corpus | perturbation |')
  assert len(rows) == 3 * len(specs) and {r[1] for r in rows} == set(specs)
  for corpus, spec, *cells in rows:
    params = exact_perturb.parse(spec).summary_params()
    at = io.summary_key(
      'x', data=corpus, layer='25', split='test', **params
    ).partition('@')[2]
    beside = ('rouge1@attack=softmax', 'rouge1@attack=ep_skip')
    keys = _exact_keys(
      at, ('undecided@attack=exact', *beside, 'rouge1@attack=ridge')
    )
    for key, cell in zip(keys, cells, strict=True):
      assert _shown(robust[key], cell), (key, cell)
  for folder, header, shown in (
    ('robust/unbounded', '| corpus | perturbation, no budget |', one_shot),
    (
      'noise',
      '| corpus | noise |',
      ('rouge1@attack=softmax', 'rouge1@attack=ep_skip', 'rouge1@attack=ridge'),
    ),
  ):
    got = summary(f'inversion_exact/{folder}')
    specs = json.loads(
      (ROOT / f'reports/inversion_exact/{folder}/config.json').read_text()
    )['perturbations']
    rows = _table_rows(text, header)
    assert len(rows) == 3 * len(specs), folder
    for corpus, spec, *cells in rows:
      spec = f'noise:{spec}' if spec[0].isdigit() else spec
      params = exact_perturb.parse(spec).summary_params()
      at = io.summary_key(
        'x', data=corpus, layer='25', split='test', **params
      ).partition('@')[2]
      keys = _exact_keys(at, ('undecided@attack=exact',) + shown)
      for key, cell in zip(keys, cells, strict=True):
        assert _shown(got[key], cell), (folder, key, cell)
  levels = summary('inversion_exact/noise_levels')
  rows = _table_rows(text, '| corpus | none |')
  header = next(
    x for x in text.splitlines() if x.startswith('| corpus | none |')
  )
  scales = [c.strip() for c in header.strip('|').split('|')][2:]
  assert len(rows) == 3 and scales
  for corpus, *cells in rows:
    at = f'attack=ep_skip,data={corpus},layer=25'
    keys = [f'rouge1@{at},split=dev']
    keys += [f'rouge1@{at},noise={x},split=dev' for x in scales]
    for key, cell in zip(keys, cells, strict=True):
      assert _shown(levels[key], cell), (key, cell)
  rows = _table_rows(text, '| layer | perturbation |')
  assert len(rows) == 4
  for layer, spec, *cells in rows:
    extra = '' if spec == 'none' else f',noise={spec.split(":")[1]}'
    at = f'data=enron,layer={layer}{extra},split=test'
    for key, cell in zip(_exact_keys(at, one_shot), cells, strict=True):
      assert _shown(quick[key], cell), (key, cell)


def test_exact_inversion_noise_rule_table():
  text = (ROOT / 'reports' / 'inversion_exact' / 'README.md').read_text()
  got = summary('inversion_exact/noise_rule')
  rows = _table_rows(text, '| corpus | noise, dev |')
  assert len(rows) == 6
  metrics = (
    'exact',
    'rouge1',
    'candidates_per_token',
    'candidates_mean',
    'seconds_per_sentence',
    'undecided',
  )
  for corpus, noise, *cells in rows:
    at = f'data={corpus},layer=25,noise={noise},rule=calibrated,split=dev,z=6'
    for metric, cell in zip(metrics, cells, strict=True):
      assert _shown(got[f'{metric}@{at}'], cell), (at, metric, cell)


def test_exact_inversion_proposal_ranks():
  text = (ROOT / 'reports' / 'inversion_exact' / 'README.md').read_text()
  ranks = summary('inversion_exact/proposals')
  rows = _table_rows(text, '| corpus | layer | ridge |')
  assert len(rows) == 6
  names = ('ridge', 'ridge_context', 'softmax', 'prior', 'order_ridge', 'order')
  for corpus, layer, *cells in rows:
    for ranking, cell in zip(names, cells, strict=True):
      at = f'data={corpus},layer={layer},ranking={ranking}'
      top1, top128, mean = cell.split(' / ')
      assert _shown(ranks[f'top1@{at}'], top1), (at, cell)
      assert _shown(ranks[f'top128@{at}'], top128), (at, cell)
      assert _shown(ranks[f'mean_rank@{at}'], mean), (at, cell)


def test_exact_inversion_gradient_policy_ranks():
  text = (ROOT / 'reports' / 'inversion_exact' / 'README.md').read_text()
  got = summary('inversion_exact/gradient_policy')
  rows = _table_rows(text, '| corpus | layer | tokens | gradient |')
  assert len(rows) == 6
  for corpus, layer, tokens, *cells, secs in rows:
    at = f'data={corpus},layer={layer}'
    assert int(tokens) == got[f'num_tokens@{at}'], (at, tokens)
    assert _shown(got[f'seconds_per_token@{at}'], secs), (at, secs)
    for ranking, cell in zip(
      ('gradient', 'order', 'order_gradient'), cells, strict=True
    ):
      key = f'{at},ranking={ranking}'
      top1, top128, mean, worst = cell.split(' / ')
      assert _shown(got[f'top1@{key}'], top1), (key, cell)
      assert _shown(got[f'top128@{key}'], top128), (key, cell)
      assert _shown(got[f'mean_rank@{key}'], mean), (key, cell)
      assert int(worst.replace(',', '')) == got[f'max_rank@{key}'], (key, cell)


# ------------------------------------------------------------ speed table
BENCH = ROOT / 'benchmarks' / 'results'


def bench(name: str) -> dict:
  return json.loads((BENCH / name).read_text())


def speed_row(anchor: str) -> dict[str, str]:
  """The speed table's row whose first cell starts with `anchor` (a cell's
  escaped `\\|` is its own text)."""
  lines = README.splitlines()
  start = lines.index('| benchmark | peer | ratio | same output |')
  rows = []
  for line in lines[start + 2 :]:
    if not line.startswith('|'):
      break
    cells = re.split(r'(?<!\\)\|', line.strip().strip('|'))
    rows.append([c.strip() for c in cells])
  (cells,) = [r for r in rows if r[0].startswith(anchor)]
  return dict(zip(('benchmark', 'peer', 'ratio', 'same'), cells, strict=True))


def test_speed_beam_search():
  quick = bench('cpu_quick/beam_search.json')['rows']
  full = bench('cpu_full/beam_search.json')['rows']
  tiny = bench('cpu_tiny/beam_search.json')['rows']
  (head,) = [
    r for r in quick if (r['model'], r['b'], r['beam']) == ('gpt2-mini', 16, 32)
  ]
  assert {r['model'] for r in full} == {'gpt2-small', 'smollm2-135m'}
  median = np.median([r['speedup'] for r in full])
  cells = speed_row('bag-restricted beam search')
  assert cells['ratio'] == (
    f'{head["speedup"]:.1f}x on `gpt2-mini`, b = 16 (`cpu_quick/`); median'
    f' {median:.1f}x over {len(full)} GPT-2 small / SmolLM2 cases (`cpu_full/`)'
  )
  cases = quick + full + tiny
  assert all(r['match'] == 1 for r in cases)
  assert cells['same'] == f'yes, all {len(cases)} cases (with `cpu_tiny/`)'


def test_speed_grad_norms():
  (quick,) = bench('cpu_quick/grad_norms.json')['rows']
  full = bench('cpu_full/grad_norms.json')['rows']
  assert [r['model'] for r in full] == ['gpt2-small', 'smollm2-135m']
  (shown,) = {f'{r["speedup"]:.1f}' for r in full}
  cells = speed_row('per-candidate gradient norms')
  assert cells['ratio'] == (
    f'{quick["speedup"]:.1f}x on `gpt2-mini` (`cpu_quick/`); {shown}x on'
    ' GPT-2 small and SmolLM2 (`cpu_full/`)'
  )
  assert all(r['match'] == 1 for r in [quick, *full])


def test_speed_dr_search():
  # Only ratios whose peer was timed whole; the quick runs extrapolate it.
  full, second = bench('cpu_full/dr_search.json'), bench('dr_search_full.json')
  for r in (full, second):
    assert r['straightforward_extrapolated'] is False
    assert r['agreement']['top_match'] and r['agreement']['overlap'] == 1.0
  for name in ('cpu_quick/dr_search.json', 'dr_search.json'):
    assert bench(name)['straightforward_extrapolated'] is True
    assert f'`{name}`' in PROSE
  cells = speed_row('differential-rank search')
  assert cells['ratio'] == (
    f'{full["speedup"]:.1f}x (`cpu_full/dr_search.json`);'
    f' {second["speedup"]:.1f}x in a second full run (`dr_search_full.json`)'
  )


def test_speed_client_update():
  quick = bench('cpu_quick/client_update.json')['results']
  full = bench('cpu_full/client_update.json')['results']
  ratios = [r['loop_over_scan'] for r in quick + full]
  assert all(r['max_abs_diff_scan_vs_loop'] == 0 for r in quick + full)
  assert min(ratios) == quick[0]['loop_over_scan']
  assert max(ratios) == full[0]['loop_over_scan']
  cells = speed_row('FedAvg `client_update`')
  assert cells['ratio'] == (
    f'{min(ratios):.1f}x (`cpu_quick/`) to {max(ratios):.2f}x (`cpu_full/`)'
  )
  assert cells['same'] == 'bitwise'


def test_speed_dager():
  default = bench('dager_vs_reference_default_l1.json')
  assert default['reference']['extra_args'] == ''

  def over(b):
    rows = [r for r in default['rows'] if r['b'] == b]
    assert [r['batch'] for r in rows] == [0, 1, 2]
    ours = sum(r['ours']['seconds'] for r in rows)
    last = sum(r['ours']['seconds_without_last_token'] for r in rows)
    ref = sum(r['reference']['seconds'] for r in rows)
    exact = sum(round(b * r['ours']['exact']) for r in rows)
    theirs = sum(round(b * r['reference']['exact_prefix']) for r in rows)
    assert sum(round(b * r['reference']['exact']) for r in rows) == 0
    return ours, last, ref, exact, theirs, 3 * b

  o16, _, r16, e16, x16, n16 = over(16)
  o4, l4, r4, e4, x4, n4 = over(4)
  cells = speed_row('DAGER, SmolLM2, three Enron batches at b = 4 and at 16')
  assert cells['ratio'] == (
    f'with its default flags, {r16 / o16:.1f}x at b = 16 ({o16:.1f} s vs'
    f' {r16:.1f} s over the three batches) and {r4 / o4:.1f}x at b = 4'
    f' ({o4:.1f} s vs {r4:.1f} s; {r4 / l4:.1f}x without our last-token'
    ' step), `dager_vs_reference_default_l1.json`'
  )
  assert cells['same'] == (
    f'ours: {e4} of {n4} and {e16} of {n16} sentences exact; theirs: {x4}'
    f' of {n4} and {x16} of {n16} up to the last token, never the last token'
  )


def test_speed_peer_fraction_of_peak():
  # The peers' matmul rates in the rows above: HF at beam 32, b = 16, and
  # the PyTorch gradient-norm loop, quick and full runs.
  fractions = []
  for run in ('cpu_quick', 'cpu_full'):
    s = bench(f'{run}/summary.json')
    fractions += [
      v
      for k, v in s.items()
      if k.startswith('flops_frac_peak_hf@b=16,beam=32,')
      or k.startswith('flops_frac_peak_torch@bench=grad_norms,')
    ]
  assert len(fractions) == 6
  low, high = round(100 * min(fractions)), round(100 * max(fractions))
  assert f'Both peers already run at {low}-{high} % of the measured' in PROSE


def test_audit_attacker_text_table():
  # reports/audit/README.md's proposer table against the study's summary.
  s = summary('audit/attacker_text')
  text = (ROOT / 'reports/audit/README.md').read_text('utf-8')
  rows = _table_rows(text, '| attacker text |')
  assert len(rows) == 3
  for row, name in zip(rows, ('user', 'user+samples:200', 'user+samples:400')):
    values = [
      s[f'mean_place@layer=15,text={name}'],
      s[f'top1@layer=15,text={name}'],
      s[f'mean_place@layer=last,text={name}'],
      s[f'top1@layer=last,text={name}'],
      s[f'fit_seconds@layer=last,text={name}'],
    ]
    for value, cell in zip(values, row[1:]):
      assert _shown(value, cell), (name, value, cell)


def test_test_loop_times():
  """The test loop's counts and minutes are the last run of both tiers in
  `benchmarks/results/suite.json` (`python -m benchmarks.suite`)."""
  doc = json.loads((ROOT / 'benchmarks/results/suite.json').read_text())
  run = [r for r in doc['runs'] if {'full', 'fast'} <= set(r)][-1]
  full, fast = run['full'], run['fast']
  assert full['exit_code'] == 0 and fast['exit_code'] == 0
  assert run['cpu']['model'] in PROSE
  assert (
    f'full suite ran {full["counts"]["passed"]:,} tests '
    f'({full["counts"]["skipped"]} skipped) in {full["wall_s"] / 60:.1f} min'
  ) in PROSE
  assert (
    f'the fast tier {fast["counts"]["passed"]:,} in {fast["wall_s"] / 60:.1f} min'
  ) in PROSE
