"""The numbers of the GBoard, differential and audit report READMEs, and the
benchmarks' status words, against the committed files they come from.

Each check formats the committed value (`summary.json`, `results.jsonl`,
`config.json`, `facts.json`, `noise_detectors/bounds*.json`, the
benchmarks' `run.json`) the way the README writes it and looks for that
text, so a regenerated report that moves a number fails here until the
README follows. The tables of the GBoard sub-reports (`heldout/`,
`heldout_e1000/`, `dpsgd_e1000/`) are checked in readme_numbers_test.py,
their prose here. The commands the READMEs show are parsed into configs
and compared with the committed `config.json` they produced.
"""

import inspect
import json
import math
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GBOARD = ROOT / 'reports' / 'gboard'
DIFF = ROOT / 'reports' / 'differential'
AUDIT = ROOT / 'reports' / 'audit'


def text_of(path: Path) -> str:
  """The file's text with its line breaks as spaces."""
  return ' '.join(path.read_text('utf-8').split())


def load(path: Path):
  return json.loads(path.read_text())


def rows_of(path: Path) -> list[dict]:
  return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def key(b, e, n_k, noise='none', sigma='0.0') -> str:
  return f'B={b},E={e},n_k={n_k},noise={noise},sigma={sigma}'


def ratio(s: dict, k: str, metric: str = 'f1') -> float:
  """`metric` at setting `k` over the vocabulary upper bound."""
  return s[f'{metric}@{k}'] / s[f'f1_upper@{k}']


def span(values, fmt: str) -> str:
  lo, hi = f'{min(values):{fmt}}', f'{max(values):{fmt}}'
  return lo if lo == hi else f'{lo}-{hi}'


def joined(values, fmt: str) -> str:
  return ' / '.join(f'{v:{fmt}}' for v in values)


def parse_commands(text: str, module: str) -> list[list[str]]:
  """The args of each `python -m MODULE ...` in a README's code blocks."""
  out = []
  for block in re.findall(r'```bash\n(.*?)```', text, re.S):
    for line in block.replace('\\\n', ' ').splitlines():
      words = line.partition(' #')[0].split()
      if words[:3] == ['python', '-m', module]:
        out.append(words[3:])
  return out


# ------------------------------------------------------------------ GBoard
@pytest.fixture(scope='module')
def gboard_files():
  return {
    'text': text_of(GBOARD / 'README.md'),
    'raw': (GBOARD / 'README.md').read_text('utf-8'),
    'main': load(GBOARD / 'summary.json'),
    'config': load(GBOARD / 'config.json'),
    'rows': rows_of(GBOARD / 'results.jsonl'),
    'batch_sum': load(GBOARD / 'batch_sum' / 'summary.json'),
    'e1000': load(GBOARD / 'dpsgd_e1000' / 'sentence_sum' / 'summary.json'),
    'e1000_sum': load(GBOARD / 'dpsgd_e1000' / 'batch_sum' / 'summary.json'),
    'bounds': load(GBOARD / 'noise_detectors' / 'bounds.json'),
    'bounds_sum': load(GBOARD / 'noise_detectors' / 'bounds_batch_sum.json'),
    'quick': load(GBOARD / 'quick' / 'summary.json'),
    'quick_config': load(GBOARD / 'quick' / 'config.json'),
  }


def noise_free_rows(s: dict) -> list[str]:
  """The settings of the noise-free rule F1 cells (no FedSGD scaling)."""
  return [
    k[3:]
    for k in s
    if k.startswith('f1@') and 'noise=none' in k and 'scale' not in k
  ]


def noise_free_table_rows(s: dict) -> list[str]:
  """The rows of the README's noise-free word-recovery table."""
  out = []
  for n_k in (16, 32, 64, 128, 256):
    k = key('full', 1, n_k)
    cells = [
      f'{s["f1@" + k]:.3f}/{s["f1_upper@" + k]:.3f} = {ratio(s, k):.3f}',
      joined((ratio(s, key('full', e, n_k)) for e in (50, 100)), '.3f'),
    ]
    if n_k <= 32:  # B = 32 >= n_k is the full-batch run
      cells += ['(= full batch)', f'{ratio(s, key("full", 1000, n_k)):.3f}']
    else:
      cells += [
        joined((ratio(s, key('32', e, n_k)) for e in (1, 50, 100)), '.3f'),
        joined((ratio(s, key(b, 1000, n_k)) for b in ('full', '32')), '.3f'),
      ]
    worst = min(ratio(s, k) for k in noise_free_rows(s) if f'n_k={n_k},' in k)
    cells.append('met' if worst >= 0.95 else 'not met')
    out.append(f'| {n_k} | ' + ' | '.join(cells) + ' |')
  return out


def dpsgd_table_rows(f) -> list[str]:
  """The rows of the README's DPSGD-like σ = 0.1 table: the rule (bold
  where it meets 0.9 x upper), the Stouffer rule of bounds.json beside."""
  out = []
  for n_k, b, label in (
    (16, 'full', '16, full'),
    (64, '32', '64, B=32'),
    (256, '32', "256, B=32 (Fig. 4c's setting)"),
  ):
    cells = []
    for e in (1, 50, 100, 1000):
      k = key(b, e, n_k, 'dpsgd', '0.1')
      s = f['main'] if f'f1@{k}' in f['main'] else f['e1000']
      value = f'{ratio(s, k):.3f}'
      if ratio(s, k) >= 0.9:
        value = f'**{value}**'
      bound = f['bounds'].get(f'n_k={n_k},B={b},E={e}')
      beside = '–' if bound is None else f'{bound["stouffer_rule"]:.3f}'
      cells.append(f'{value} ({beside})')
    out.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  return out


def test_gboard_paper_statements(gboard_files):
  from experiments import gboard_claims

  lines = gboard_claims.paper_claims_markdown(gboard_files['main'])
  table = [x for x in '\n'.join(lines).splitlines() if x.startswith('|')]
  assert len(table) == 8
  for line in table:
    assert line in gboard_files['raw'], line
  s, text = gboard_files['main'], gboard_files['text']
  dp = {
    k: ratio(s, k[3:])
    for k in s
    if k.startswith('f1@')
    and 'noise=dpsgd,sigma=0.1' in k
    and ',E=1,' not in k
    and 'scale' not in k
  }
  low = min(dp, key=dp.get)
  assert 'B=32,' in low and 'n_k=256,' in low
  assert f'the low end ({dp[low]:.2f}, at n_k = 256, B = 32)' in text
  k = key('32', 1000, 256, 'single', '0.01')
  assert f'(E = 1000: {ratio(s, k):.2f} x upper)' in text


def test_gboard_noise_free_table(gboard_files):
  s, text = gboard_files['main'], gboard_files['text']
  for line in noise_free_table_rows(s):
    assert line in gboard_files['raw'], line
  rows = noise_free_rows(s)
  for other in ('zero_f1', 'oracle_f1'):
    assert max(abs(s[f'{other}@{k}'] - s[f'fdr_f1@{k}']) for k in rows) < 0.005
    assert all(s[f'{other}@{k}'] <= s[f'f1@{k}'] for k in rows)
  assert (
    "the bias FDR cut's F1 within 0.005 and never more than the rule" in text
  )
  # c (the share of the true words in the vocabulary), over every update.
  c = [r['auto_coverage'] for r in gboard_files['rows']]
  assert (
    f'c = share of the true words that are in the vocabulary ({span(c, ".2f")}'
    in (text)
  )


def test_gboard_dpsgd_table(gboard_files):
  s, text, b = (
    gboard_files['main'],
    gboard_files['text'],
    gboard_files['bounds'],
  )
  for line in dpsgd_table_rows(gboard_files):
    assert line in gboard_files['raw'], line
  e1 = gboard_files['e1000']
  k = key('32', 1000, 256, 'dpsgd', '0.1')
  assert f'for n_k=256 at E=1000 ({ratio(e1, k):.3f})' in text
  cells = [key('32', e, 256, 'dpsgd', '0.1') for e in (50, 100)]
  pr = ' and '.join(
    f'{s["precision@" + k]:.2f} / {s["recall@" + k]:.2f}' for k in cells
  )
  kept = ' and '.join(f'{s["auto_num_recovered@" + k]:.0f}' for k in cells)
  typed = {b[f'n_k=256,B=32,E={e}']['true_in_vocab'] for e in (50, 100)}
  (typed,) = typed
  assert (
    f'({joined((ratio(s, k) for k in cells), ".2f")} at E=50 / 100;'
    f' precision / recall {pr}, {kept} words kept for {typed} typed in the'
    ' vocabulary)'
  ) in text
  oracle = joined((ratio(s, k, 'oracle_f1') for k in cells), '.3f')
  low = joined(
    (
      ratio(s, key('32', e, 256, 'dpsgd', '0.01'), 'oracle_f1')
      for e in (50, 100)
    ),
    '.3f',
  )
  assert (
    f'**oracle** threshold gives {oracle} x upper here (σ=0.01: {low})' in text
  )


def test_gboard_sentence_table(gboard_files):
  s, text = gboard_files['main'], gboard_files['text']
  for n_k, b in (
    (16, 'full'),
    (32, 'full'),
    (64, 'full'),
    (64, '32'),
    (128, 'full'),
    (128, '32'),
    (256, 'full'),
    (256, '32'),
  ):
    k = key(b, 1000, n_k)
    label = f'{n_k}, {"full" if b == "full" else "B=32"}'
    line = (
      f'| {label} | {s["levenshtein_cover@" + k]:.1f} |'
      f' {s["levenshtein_topn@" + k]:.1f} |'
      f' {s["levenshtein_recall@" + k]:.1f} | {s["recon_f1@" + k]:.3f} |'
    )
    assert line in gboard_files['raw'], line
  k16 = key('full', 1000, 16)
  assert (
    f'Our n_k=16 point (F1 {s["recon_f1@" + k16]:.2f}, Lev.'
    f' {s["levenshtein_cover@" + k16]:.0f})'
  ) in text
  larger = [
    s[f'levenshtein_cover@{key(b, 1000, n)}']
    for n in (32, 64, 128, 256)
    for b in ('full', '32')
    if f'levenshtein_cover@{key(b, 1000, n)}' in s and (b == 'full' or n > 32)
  ]
  assert f'(n_k = 32-256: Lev. {span(larger, ".0f")})' in text
  # n_k = 64, B = 32: E x n_k / B local steps.
  steps = 1000 * 64 // 32
  assert f'(n_k=64, B=32: {steps:,} steps)' in text


def test_gboard_setup_numbers(gboard_files):
  cfg, s, text = (
    gboard_files['config'],
    gboard_files['main'],
    gboard_files['text'],
  )
  assert (
    f'V={cfg["vocab_size"]} incl. `<UNK>`/`<S>`, D={cfg["embed_dim"]},'
    f' {cfg["units"]} units, projection {cfg["units"]}->{cfg["embed_dim"]}'
  ) in text
  assert f'Adam ({cfg["pretrain_steps"]} steps)' in text
  assert (
    f'Held-out perplexity {s["theta0_eval_perplexity"]:.0f} (public mix),'
    f' {s["theta0_sms_perplexity"]:.0f} on held-out public SMS sentences'
  ) in text
  assert f'(top {cfg["vocab_size"] - 2:,} words)' in text
  assert (
    f'Client data: {cfg["client_pool"]} distinct'
    f' {cfg["sentence_length"]}-word sentences'
  ) in text
  n_k = ', '.join(map(str, cfg['num_sentences']))
  assert f'Datasets of n_k = {n_k} sentences' in text
  assert f'SGD η = {cfg["learning_rate"]:g} (Sec. 4.1)' in text
  assert f'B ∈ {{{", ".join(cfg["batch_sizes"])}}}' in text
  assert f'E ∈ {{{", ".join(map(str, cfg["epochs"]))}}}' in text
  assert f'(T = {cfg["sentence_length"]} targets per sentence)' in text
  dp = ', '.join(f'{x:g}' for x in cfg['dpsgd_sigmas'])
  single = ', '.join(f'{x:g}' for x in cfg['single_sigmas'])
  assert f'σ ∈ {{{dp}}}' in text and f'σ ∈ {{{single}}}' in text
  assert f'Benjamini-Hochberg test (q = {cfg["fdr_q"]:g})' in text
  assert (
    f'of the {cfg["vocab_size"] - 2:,} entries, i.e. of the untyped words'
    in text
  )
  assert f"each word's {cfg['embed_dim'] + 1} numbers" in text
  assert f'`--max_sentence_epochs={cfg["max_sentence_epochs"]}`' in text
  runs = {(n, b): e for n, b, e in cfg['dpsgd_runs']}
  assert runs == {(16, 'full'): 10**9, (64, '32'): 100, (256, '32'): 100}
  assert (
    'DPSGD-like runs in this run only for n_k=16 (full batch, E up to 1000),'
    ' n_k=64 and n_k=256 (B=32, E up to 100)'
  ) in text
  assert cfg['num_datasets'] == 1 and '(`--num_datasets=1`)' in text
  t = cfg['sentence_length']
  assert f'(`<S> w` + {t - 1} words,' in text and f'ceil(|words|/{t})' in text
  assert (
    f'{t + 1} decode steps of M rows on θ1 plus a forward pass of M x {t + 1}'
    f' tokens on θ0 and θ1; the {cfg["embed_dim"]} x {cfg["vocab_size"]}'
    ' output layer'
  ) in text
  held = load(GBOARD / 'heldout' / 'config.json')
  assert f'has {held["num_datasets"]} datasets per n_k' in text


def test_gboard_rule_constants(gboard_files):
  # The constants the README names are the code's defaults.
  from leakjax.attacks.gboard import mixture, thresholds

  def defaults(fn):
    return {
      k: p.default
      for k, p in inspect.signature(fn).parameters.items()
      if p.default is not inspect.Parameter.empty
    }

  text = gboard_files['text']
  auto = defaults(mixture.recover_words_auto)
  assert f'at most {auto["bias_first_drift"]:g} noise scales' in text
  assert f'(drift above {auto["max_drift"]:g} noise scales;' in text
  convex = defaults(thresholds.convexity_violations)
  assert f'The test takes the {convex["num_sources"]} most precise' in text
  assert f'by more than {convex["gate"]:g} noise scales' in text
  assert f'more than {convex["margin"]:g} below the highest plane' in text
  fell = 1 - math.exp(-convex['margin'])
  assert f'(its bias fell ≥ {100 * fell:.0f}% less' in text
  assert (
    f'({convex["num_sources"]} planes, margin {convex["margin"]:g}, gate'
    f' {convex["gate"]:g}) and the drift switch ({auto["max_drift"]:g})'
  ) in text
  assert f'the drift level ({auto["bias_first_drift"]:g})' in text
  slack = defaults(thresholds.max_f1_cut)['slack']
  assert f'- {slack:g} sqrt(V Φ(-t))`' in text
  post = defaults(mixture.mixture_word_posterior)
  assert f'started from the {100 * post["init_fraction"]:.0f} % longest' in text
  assert f'above {post["min_signal"]:g} x the edge' in text
  assert f'{thresholds._MAD_TO_STD:.4f} MAD' in text
  # Noise-free updates always take the bias rule.
  s = gboard_files['main']
  drift = [
    v
    for k, v in s.items()
    if k.startswith('drift_to_noise@') and 'noise=none' in k
  ]
  assert min(drift) > auto['bias_first_drift']
  assert f'always above {auto["bias_first_drift"]:g})' in text


def test_gboard_convexity_ablation(gboard_files):
  s, text = gboard_files['main'], gboard_files['text']
  rows = noise_free_rows(s)
  worst = min(rows, key=lambda k: ratio(s, k))
  rescue = min(rows, key=lambda k: ratio(s, k, 'rescue_f1'))
  assert worst == key('32', 1, 256) and rescue == key('32', 50, 256)
  assert (
    f'Over the {len(rows)} noise-free rows of `summary.json`, the worst rule'
    f' F1 / upper is {ratio(s, worst):.3f} (`f1`, n_k=256, B=32, E=1) with'
    f' the convexity test and {ratio(s, rescue, "rescue_f1"):.3f}'
    ' (`rescue_f1`, n_k=256, B=32, E=50)'
  ) in text


def test_gboard_detector_bounds(gboard_files):
  b, text, raw = (
    gboard_files['bounds'],
    gboard_files['text'],
    gboard_files['raw'],
  )

  def cells(n_k, batch, epochs, field):
    out = []
    for e in epochs:
      v = b[f'n_k={n_k},B={batch},E={e}'][field]
      if field == 'mixture_rule' and e == 1:
        out.append(f'{v:.0f} (guard)')
      else:
        out.append('–' if v is None else f'{v:.3f}')
    return ' / '.join(out)

  for n_k, batch, epochs, label in (
    (16, 'full', (1, 50, 100, 1000), 'n_k=16, full, E=1 / 50 / 100 / 1000'),
    (64, '32', (1, 50, 100), 'n_k=64, B=32, E=1 / 50 / 100'),
    (256, '32', (1, 50, 100), 'n_k=256, B=32, E=1 / 50 / 100'),
  ):
    line = f'| {label} | ' + ' | '.join(
      cells(n_k, batch, epochs, f)
      for f in (
        'mixture_rule',
        'mixture_oracle',
        'stouffer_rule',
        'stouffer_oracle',
        'genie_oracle',
      )
    )
    assert line + ' |' in raw, line
  g = {k: v['genie_oracle'] for k, v in b.items()}
  assert (
    "at n_k=256 even knowing every word's direction gives only"
    f' {g["n_k=256,B=32,E=50"]:.2f} / {g["n_k=256,B=32,E=100"]:.2f} x upper'
    f' at E=50 / 100, and at E=1'
    f' {span([g["n_k=64,B=32,E=1"], g["n_k=256,B=32,E=1"]], ".2f")}'
    ' for n_k ≥ 64'
  ) in text
  gap = [
    g[f'n_k=256,B=32,E={e}'] - b[f'n_k=256,B=32,E={e}']['mixture_rule']
    for e in (50, 100)
  ]
  assert f'the mixture is {span(gap, ".2f")} below the told-directions' in text
  e1 = b['n_k=16,B=full,E=1']
  assert (
    f'the reference reaches {e1["genie_oracle"]:.2f} but needs the'
    f' directions: the leading eigenvalue of the noisy update is at the'
    f' noise edge, {e1["lambda1_over_edge"]:.2f} x'
  ) in text
  lam = {k: v['lambda1_over_edge'] for k, v in b.items()}

  def at(e):
    return [v for k, v in lam.items() if k.endswith(f',E={e}')]

  assert (
    f'At σ=0.1 it is {span(at(1), ".2f")} at E=1 (every n_k: the guard'
    f' refuses, the Stouffer rule applies), {span(at(50), ".1f")} at E=50,'
    f' {span(at(100), ".1f")} at E=100 and {span(at(1000), ".1f")} at'
    ' E=1000 (n_k=16)'
  ) in text
  told = [v['genie_oracle'] for v in gboard_files['bounds_sum'].values()]
  assert f'(the told-directions reference is {span(told, ".2f")} here)' in text


def test_gboard_batch_sum(gboard_files):
  bs, e1 = gboard_files['batch_sum'], gboard_files['e1000_sum']
  text, raw = gboard_files['text'], gboard_files['raw']

  def source(e, n_k):
    return e1 if (e == 1000 and n_k != 16) else bs

  every = []
  for n_k, label in (
    (16, 'n_k=16 (= full batch)'),
    (64, 'n_k=64'),
    (256, 'n_k=256'),
  ):
    cells = []
    for e in (1, 50, 100, 1000):
      s, k = source(e, n_k), key('32', e, n_k, 'dpsgd', '0.1')
      every.append(ratio(s, k))
      value = f'{ratio(s, k):.3f}'
      if ratio(s, k) >= 0.9:
        value = f'**{value}**'
      cells.append(
        f'{value} ({s["precision@" + k]:.2f} / {s["recall@" + k]:.2f})'
      )
    assert f'| {label} | ' + ' | '.join(cells) + ' |' in raw, label
  for metric, label in (
    ('stouffer_f1', 'n_k=256, Stouffer scores, FDR cut (`stouffer_f1`)'),
    ('oracle_f1', "n_k=256, oracle bias cut (the paper's rule)"),
  ):
    cells = [
      ratio(source(e, 256), key('32', e, 256, 'dpsgd', '0.1'), metric)
      for e in (1, 50, 100, 1000)
    ]
    assert f'| {label} | ' + ' | '.join(f'{v:.3f}' for v in cells) + ' |' in raw
  free = []
  for e in (1, 50, 100, 1000):
    s, k = source(e, 256), key('32', e, 256)
    free.append(f'{ratio(s, k):.3f} / {ratio(s, k, "oracle_f1"):.3f}')
  assert (
    '| n_k=256, noise-free: rule / oracle bias cut | ' + ' | '.join(free) + ' |'
  ) in raw
  # Levenshtein ratio, σ = 0.1 vs noise-free (this run's trajectory).
  parts = []
  for n_k in (16, 64, 256):
    epochs = (1, 50, 100, 1000) if n_k == 16 else (1, 50, 100)
    noisy = [
      bs['levenshtein@' + key('32', e, n_k, 'dpsgd', '0.1')] for e in epochs
    ]
    free = [bs['levenshtein@' + key('32', e, n_k)] for e in epochs]
    cells = [f'{a:.1f} / {b:.1f}' for a, b in zip(noisy, free)]
    parts.append(f'n_k={n_k}: ' + ', '.join(cells))
  assert (
    'Mean Levenshtein ratio of the kept reconstructions, σ=0.1 / noise-free,'
    ' E = 1 / 50 / 100 (/ 1000): ' + '; '.join(parts) + '.'
  ) in text
  # The paper's rule at σ = 0.1 against its noise-free value, E = 50, 100.
  gap = [
    ratio(bs, key('32', e, 256), 'oracle_f1')
    - ratio(bs, key('32', e, 256, 'dpsgd', '0.1'), 'oracle_f1')
    for e in (50, 100)
  ]
  assert f'lands within {span(gap, ".2f")} of its noise-free value' in text
  # Every cell meets 0.9 x upper but n_k = 256 at E = 1000 (the last one).
  assert min(every[:-1]) >= 0.9 > every[-1]
  assert f'E = 1 included (worst {min(every[:-1]):.3f})' in text
  lev = [bs['levenshtein_cover@' + key('32', 1000, n)] for n in (16, 64, 256)]
  f1 = [ratio(bs, key('32', 1000, n)) for n in (16, 64, 256)]
  assert (
    f'E=1000 gives {joined(lev, ".1f")} (n_k=16 / 64 / 256) at noise-free word'
    f' F1/upper {joined(f1, ".3f")}'
  ) in text
  main = gboard_files['main']
  sec31 = [
    main['levenshtein_cover@' + key('32', 1000, n)] for n in (16, 64, 256)
  ]
  assert f'where the Sec. 3.1 loss gives {joined(sec31, ".0f")}' in text
  e100 = [bs['levenshtein_cover@' + key('32', 100, n)] for n in (16, 64, 256)]
  assert f'E=100 already gives {joined(e100, ".0f")}' in text
  assert f'every size reaches Lev. {span(lev, ".0f")} at E=1000' in text


def test_gboard_fedsgd_sigma_01(gboard_files):
  text, b, cfg = (
    gboard_files['text'],
    gboard_files['bounds'],
    gboard_files['config'],
  )
  rows = {
    (r['n_k'], str(r['B']), r['E']): r
    for r in gboard_files['rows']
    if r['noise'] == 'dpsgd' and r['sigma'] == 0.1
  }
  step = cfg['learning_rate'] * 0.1
  assert f'`η N(0, σ)` = {step:.1e} per step'.replace('e-0', 'e-') in text
  scale = rows[(16, 'full', 1)]['noise_scale']
  assert (
    f'(measured robust scale {scale:.2e} at n_k=16)'.replace('e-0', 'e-')
    in text
  )
  one = cfg['learning_rate'] / 16
  per = cfg['learning_rate'] / 32
  assert f'`η (1 - p) / n_k` = {one:.1e} (n_k=16)'.replace('e-0', 'e-') in text
  assert f'`η / 32` = {per:.1e} per step'.replace('e-0', 'e-') in text
  scale64 = rows[(64, '32', 1)]['noise_scale']
  assert (
    f'(n_k=64: noise {scale64:.2e} after 2 steps)'.replace('e-0', 'e-') in text
  )
  typed = [
    b[f'n_k={n},B={x},E=1']['true_in_vocab']
    for n, x in ((16, 'full'), (64, '32'))
  ]
  oracle = [
    rows[k]['oracle_f1'] / rows[k]['f1_upper']
    for k in ((16, 'full', 1), (64, '32', 1))
  ]
  st = [
    b[f'n_k={n},B={x},E=1']['stouffer_oracle']
    for n, x in ((16, 'full'), (64, '32'))
  ]
  assert (
    f'With {typed[0]} ({typed[1]}) typed words in the vocabulary, even the'
    f' *oracle* cut on the bias reaches F1/upper {oracle[0]:.3f}'
    f' ({oracle[1]:.3f}) and on the Stouffer scores {st[0]:.3f} ({st[1]:.3f})'
  ) in text
  e50 = b['n_k=16,B=full,E=50']['stouffer_oracle']
  assert f'E=50 gives an oracle Stouffer cut of {e50:.3f}' in text
  s = gboard_files['main']
  low = [
    ratio(s, key(x, 1, n, 'dpsgd', '0.01'))
    for n, x in ((16, 'full'), (64, '32'))
  ]
  assert f'where FedSGD gives {joined(low, ".2f")} here' in text


def test_gboard_sigma_001(gboard_files):
  s, text = gboard_files['main'], gboard_files['text']

  def cells(n_k, b, epochs):
    return [ratio(s, key(b, e, n_k, 'dpsgd', '0.01')) for e in epochs]

  assert (
    f'σ = 0.01 (the rule): {span(cells(16, "full", (1, 50, 100, 1000)), ".2f")}'
    f' x upper for n_k=16 (E ≤ 1000), {span(cells(64, "32", (1, 50, 100)), ".2f")}'
    f' for n_k=64, B=32 and {joined(cells(256, "32", (1, 50, 100)), ".2f")}'
    ' for n_k=256, B=32 at E = 1 / 50 / 100'
  ) in text
  st = [
    ratio(s, key('32', e, 256, 'dpsgd', '0.01'), 'stouffer_f1')
    for e in (1, 50, 100)
  ]
  assert f'(Stouffer scores, FDR cut: {joined(st, ".2f")})' in text
  noisy = [
    k[3:]
    for k in s
    if k.startswith('f1@') and 'noise=none' not in k and 'scale' not in k
  ]
  diff = [ratio(s, k) - ratio(s, k, 'stouffer_f1') for k in noisy]
  better = sum(d > 0.01 for d in diff)
  worse = sum(d < -0.01 for d in diff)
  assert (
    f'Over the {len(noisy)} noisy summary rows (DPSGD-like and single noise;'
    " n_k=16's B=32 rows repeat its full-batch ones), the rule is better than"
    f' the Stouffer scores under the FDR cut by > 0.01 in {better}, worse by'
    f' > 0.01 in {worse} and within 0.01 in {len(noisy) - better - worse}'
  ) in text


def test_gboard_scaling_and_reconstruction(gboard_files):
  s, text = gboard_files['main'], gboard_files['text']
  mid = [
    s[f'levenshtein@{key(b, e, n)}']
    for n in (16, 32, 64, 128, 256)
    for b in ('full', '32')
    for e in (50, 100)
    if f'levenshtein@{key(b, e, n)}' in s
  ]
  sgd = [s['levenshtein@' + key('full', 1, n)] for n in (16, 32, 64, 128, 256)]
  assert (
    f'E=50/100 give {span(mid, ".0f")} and FedSGD {span(sgd, ".0f")}' in text
  )
  base = s['levenshtein@' + key('full', 1, 16)]

  def scaled(x):
    return s[
      f'levenshtein@B=full,E=1,n_k=16,noise=none,scale={x:.1f},sigma=0.0'
    ]

  assert f'(n_k=16: {base:.1f} -> {scaled(10):.1f} at s=10;' in text
  assert scaled(100) < base and scaled(1000) < base
  assert 's ≥ 100 hurts at n_k=16' in text


def test_gboard_quick_check(gboard_files):
  q, cfg, text = (
    gboard_files['quick'],
    gboard_files['quick_config'],
    gboard_files['text'],
  )
  assert (
    f'θ0 with {cfg["pretrain_steps"]} Adam steps on {cfg["public_limit"]:,}'
    ' sentences per extra corpus, held-out perplexity'
    f' {q["theta0_eval_perplexity"]:.0f}'
  ) in text
  assert cfg['num_sentences'] == [16, 64] and cfg['epochs'] == [1, 50]
  r = lambda *a: ratio(q, key(*a))  # noqa: E731
  assert (
    f'noise-free {r("full", 1, 16):.3f} (n_k = 16, E = 1 and 50) and'
    f' {r("full", 1, 64):.3f} / {r("full", 50, 64):.3f} (n_k = 64, E = 1 / 50)'
  ) in text
  assert r('full', 50, 16) == r('full', 1, 16)
  dp = lambda e, sig: ratio(q, key('full', e, 16, 'dpsgd', sig))  # noqa: E731
  assert (
    f'DPSGD-like σ = 0.1, n_k = 16: {dp(50, "0.1"):.3f} at E = 50 and'
    f' {dp(1, "0.1"):.0f} at E = 1'
  ) in text
  assert (
    f'σ = 0.01: {dp(1, "0.01"):.3f} (E = 1) and {dp(50, "0.01"):.3f} (E = 50)'
  ) in text


def test_gboard_commands_parse(gboard_files, fresh_flags, monkeypatch):
  # Each `python -m experiments.gboard` command parses; the batch-summed
  # one gives the config that `batch_sum/` ran with.
  from experiments import gboard as gboard_exp
  from leakjax import io
  from leakjax.attacks.gboard import runner

  monkeypatch.chdir(ROOT)
  gboard_exp.define_flags()
  commands = parse_commands(gboard_files['raw'], 'experiments.gboard')
  assert len(commands) == 2
  for args in commands:
    fresh_flags.unparse_flags()
    fresh_flags(['prog', *args])
    cfg = io.jsonable(gboard_exp.config_from_flags())
    folder = GBOARD / 'batch_sum' if '--loss=batch_sum' in args else GBOARD
    stored = io.jsonable(runner.load_config(folder))
    assert {k: cfg[k] for k in stored if k != 'preset'} == {
      k: v for k, v in stored.items() if k != 'preset'
    }
  assert parse_commands(gboard_files['raw'], 'experiments.gboard_report') == [
    ['reports/gboard']
  ]


def test_gboard_dpsgd_e1000_prose():
  # The prose of dpsgd_e1000/README.md (its table: readme_numbers_test).
  here = GBOARD / 'dpsgd_e1000'
  text = text_of(here / 'README.md')
  new = {
    loss: load(here / loss / 'summary.json')
    for loss in ('sentence_sum', 'batch_sum')
  }
  old = {
    'sentence_sum': load(GBOARD / 'summary.json'),
    'batch_sum': load(GBOARD / 'batch_sum' / 'summary.json'),
  }
  oracle = {
    loss: joined(
      (
        ratio(new[loss], key('32', 1000, n, 'dpsgd', '0.1'), 'oracle_f1')
        for n in (64, 256)
      ),
      '.3f',
    )
    for loss in new
  }
  assert (
    f'gives {oracle["sentence_sum"]} x upper at n_k = 64 / 256 with the'
    f' sentence-summed loss and {oracle["batch_sum"]} with the batch-summed'
    ' loss at E = 1000'
  ) in text

  def drift(loss, n_k):
    cells = [
      old[loss][f'drift_to_noise@{key("32", e, n_k, "dpsgd", "0.1")}']
      for e in (50, 100)
    ]
    return cells + [
      new[loss][f'drift_to_noise@{key("32", 1000, n_k, "dpsgd", "0.1")}']
    ]

  assert (
    f'{joined(drift("sentence_sum", 256), ".2f")} at E = 50 / 100 / 1000'
    in text
  )
  d = drift('batch_sum', 256)
  assert f'from {d[0]:.2f} / {d[1]:.2f} at E = 50 / 100 to {d[2]:.2f}' in text
  free = key('32', 1000, 256)
  recall = (
    new['batch_sum']['recall@' + free],
    old['batch_sum']['recall@' + key('32', 100, 256)],
  )
  assert f'{recall[0]:.2f}' == f'{recall[1]:.2f}'
  assert (
    f'as many words at E = 1000 as at E = 100 ({recall[0]:.2f} both)' in text
  )
  f1 = (new['batch_sum']['f1@' + free], old['batch_sum']['f1@' + free])
  assert f'{f1[0]:.3f} against {f1[1]:.3f} at n_k = 256' in text
  ppl = (
    new['batch_sum']['theta0_eval_perplexity'],
    old['sentence_sum']['theta0_eval_perplexity'],
  )
  assert new['sentence_sum']['theta0_eval_perplexity'] == ppl[0]
  assert f'(held-out perplexity {ppl[0]:.8f})' in text
  assert f'perplexity ({ppl[1]:.8f})' in text


def per_dataset(path: Path) -> dict[tuple, list[float]]:
  """Each cell's rule F1 / upper of every dataset in a results.jsonl."""
  out: dict[tuple, list[float]] = {}
  for r in rows_of(path):
    cell = (str(r['B']), r['E'], r['n_k'], r['noise'], r['sigma'])
    out.setdefault(cell, []).append(r['f1'] / r['f1_upper'])
  return out


def test_gboard_heldout_prose():
  # The prose of heldout/README.md (its tables: readme_numbers_test).
  here = GBOARD / 'heldout'
  text = text_of(here / 'README.md')
  held, ins = load(here / 'summary.json'), load(GBOARD / 'summary.json')
  cfg, main_cfg = load(here / 'config.json'), load(GBOARD / 'config.json')
  assert (
    f'same {cfg["pretrain_steps"]} Adam steps' in text
    and f'from the {cfg["client_pool"]} distinct'
    f" {cfg['sentence_length']}-word SMS ham sentences outside that run's"
    f' pool of {main_cfg["client_pool"]} (the ham set has'
    f' {cfg["client_pool"] + main_cfg["client_pool"]})'
  ) in text
  assert cfg['num_datasets'] == 3 and cfg['num_sentences'] == [16, 64, 256]
  assert 'three client datasets per n_k (16, 64, 256)' in text
  assert cfg['epochs'] == [1, 50, 100] and cfg['single_sigmas'] == [1e-4, 1e-3]
  common = [k[3:] for k in held if k.startswith('f1@') and 'f1@' + k[3:] in ins]
  moved = {k: ratio(held, k) - ratio(ins, k) for k in common}
  free = {k: v for k, v in moved.items() if 'noise=none' in k}
  worst = min(free, key=lambda k: -abs(free[k]))
  assert 'n_k=256,' in worst and free[worst] < 0
  spread = [
    statistics.stdev(v)
    for (b, e, n_k, noise, _), v in per_dataset(here / 'results.jsonl').items()
    if noise == 'none' and n_k == 256
  ]
  dp = [
    abs(v) for k, v in moved.items() if 'noise=dpsgd' in k and ',E=1,' not in k
  ]
  assert (
    f'The noise-free ratio moves by at most {abs(free[worst]):.3f} from the'
    ' in-sample value, at n_k = 256 and lower, about two of the'
    ' between-dataset standard deviations of those cells'
    f' ({span(spread, ".3f")} over the three datasets in `results.jsonl`);'
    f' the DPSGD-like cells at E ≥ 50 by at most {max(dp):.3f}'
  ) in text
  k = key('full', 50, 256, 'single', '0.001')
  assert (
    f'at E = 50 both runs are near zero ({ratio(held, k):.3f} /'
    f' {ratio(ins, k):.3f})'
  ) in text
  seed0 = {
    name: load(here / 'seed0' / name / 'summary.json')
    for name in ('insample_sentences', 'heldout_sentences')
  }
  for name, words in (
    ('insample_sentences', 'held-out perplexity'),
    ('heldout_sentences', 'perplexity'),
  ):
    s = seed0[name]
    assert (
      f'({words} {s["theta0_eval_perplexity"]:.0f} /'
      f' {s["theta0_sms_perplexity"]:.0f}'
    ) in text
  nf = key('full', 100, 256)
  ins_draws = per_dataset(here / 'seed0/insample_sentences/results.jsonl')
  assert f'({ratio(ins, nf):.3f} of the upper bound both)' in text
  assert f'{ins_draws[("full", 100, 256, "none", 0.0)][0]:.3f}' == (
    f'{ratio(ins, nf):.3f}'
  )
  draws = ins_draws[('full', 100, 256, 'single', 0.001)]
  assert f'{statistics.stdev(draws):.1f}' == '0.2'
  assert 'about ±0.2' in text


def test_gboard_heldout_e1000_prose():
  # heldout_e1000/README.md's table and prose (readme_numbers_test checks
  # some of the rows).
  here = GBOARD / 'heldout_e1000'
  raw, text = (
    (here / 'README.md').read_text('utf-8'),
    text_of(here / 'README.md'),
  )
  held, ins = load(here / 'summary.json'), load(GBOARD / 'summary.json')
  e1 = load(GBOARD / 'dpsgd_e1000' / 'sentence_sum' / 'summary.json')
  for label, k in (
    ('noise-free, n_k = 16, full batch', key('full', 1000, 16)),
    ('noise-free, n_k = 64, full batch', key('full', 1000, 64)),
    ('noise-free, n_k = 256, full batch', key('full', 1000, 256)),
    ('noise-free, n_k = 64, B = 32', key('32', 1000, 64)),
    ('noise-free, n_k = 256, B = 32', key('32', 1000, 256)),
    (
      'DPSGD-like σ = 0.1, n_k = 16, full batch',
      key('full', 1000, 16, 'dpsgd', '0.1'),
    ),
    *(
      (
        f'local DP σ = {sigma}, n_k = {n_k}, full batch',
        key('full', 1000, n_k, 'single', sigma),
      )
      for sigma in ('0.0001', '0.001')
      for n_k in (64, 256)
    ),
  ):
    line = f'| {label} | {ratio(held, k):.3f} | {ratio(ins, k):.3f} |'
    assert line in raw, line
  k = key('32', 1000, 64, 'dpsgd', '0.1')
  assert (
    f'| DPSGD-like σ = 0.1, n_k = 64, B = 32 | {ratio(held, k):.3f} |'
    f' {ratio(e1, k):.3f} (`dpsgd_e1000/sentence_sum/`) |'
  ) in raw
  assert (
    f'same held-out perplexity, {held["theta0_eval_perplexity"]:.0f}'
    f' (public mix) and {held["theta0_sms_perplexity"]:.0f} (public SMS)'
  ) in text
  heldout = load(GBOARD / 'heldout' / 'summary.json')
  assert f'{heldout["theta0_eval_perplexity"]:.0f}' == (
    f'{held["theta0_eval_perplexity"]:.0f}'
  )
  lev = [held[f'levenshtein@{key("full", 1000, n)}'] for n in (16, 64, 256)]
  lev_in = [ins[f'levenshtein@{key("full", 1000, n)}'] for n in (16, 64, 256)]
  assert (
    f'{joined(lev, ".0f")} at n_k = 16 / 64 / 256 held out, against'
    f' {joined(lev_in, ".0f")} in sample'
  ) in text
  cfg = load(here / 'config.json')
  assert cfg['num_sentences'] == [16, 64, 256] and cfg['scales'] == [0.0]
  assert cfg['single_sigmas'] == [1e-4, 1e-3] and cfg['client_pool'] == 350
  k = key('full', 1000, 256, 'single', '0.001')
  assert (
    f'holds at E = 1000 ({ratio(held, k):.3f} against {ratio(ins, k):.3f})'
    in (text)
  )


def test_gboard_named_code_exists():
  # Every `leakjax...` or `gboard...` name the README points to resolves.
  import importlib

  text = (GBOARD / 'README.md').read_text('utf-8')
  names = re.findall(r'`((?:leakjax\.|gboard\.)[\w.]+)`', text)
  assert names
  for name in names:
    if name.startswith('gboard.'):
      name = 'leakjax.attacks.' + name
    parts = name.split('.')
    for i in range(len(parts), 0, -1):
      try:
        obj = importlib.import_module('.'.join(parts[:i]))
        break
      except ImportError:
        continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)


# ------------------------------------------------------------ differential
CANARIES = ('all_low', 'low_to_high', 'mixed', 'high_to_low')
# The paper's PTB training set, "around 900,000 tokens" (Sec. 4.1).
PTB_TOKENS = 900_000


def ds_text(x: float) -> str:
  """A DS as the README writes it: 0.040, 1.7e-4."""
  if x >= 0.01:
    return f'{x:.3f}'
  mantissa, exponent = f'{x:.1e}'.split('e')
  return f'{mantissa}e{int(exponent)}'


def dr_text(dr: int) -> str:
  if dr == 0:
    return '**DR 0**'
  return f'DR ≥ {dr}' if dr <= 1000 else '>1000'


@pytest.fixture(scope='module')
def diff_files():
  return {
    'text': text_of(DIFF / 'README.md'),
    'raw': (DIFF / 'README.md').read_text('utf-8'),
    'main': load(DIFF / 'summary.json'),
    'config': load(DIFF / 'config.json'),
    'rows': rows_of(DIFF / 'results.jsonl'),
    'rel': rows_of(DIFF / 'retrain_rel_ds' / 'results.jsonl'),
    'lr1': load(DIFF / 'continued_sgd_lr1' / 'summary.json'),
  }


def diff_row(rows, method, canary, k, prefix=0) -> dict:
  (row,) = [
    r
    for r in rows
    if (r['method'], r['canary'], r['k'], r['prefix'])
    == (method, canary, k, prefix)
  ]
  return row


def test_differential_table(diff_files):
  s, raw = diff_files['main'], diff_files['raw']
  for method, k, label in (
    ('continued', 2, 'continued, k=2'),
    ('continued', 8, 'continued, k=8'),
    ('continued', 16, 'continued, k=16'),
    ('continued_extra', 16, 'continued + D_extra, k=16'),
    ('retrain', 2, 'retrain, k=2'),
    ('retrain', 16, 'retrain, k=16'),
  ):
    cells = []
    for c in CANARIES:
      p = f'canary={c},k={k},method={method}'
      cells.append(f'{ds_text(s["ds@" + p])} ({dr_text(s["dr@" + p])})')
    line = f'| {label} | ' + ' | '.join(cells) + ' |'
    assert line in raw, line
  text = diff_files['text']
  cont = [
    s[f'dr@canary={c},k={k},method=continued']
    for c in CANARIES
    for k in diff_files['config']['insertions']
  ]
  assert s['dr0_fraction@method=continued'] == cont.count(0) / len(cont)
  assert (
    f'`dr0_fraction@method=continued` ='
    f' {s["dr0_fraction@method=continued"]:.3f} ({cont.count(0)} of'
    f' {len(cont)} cells), 0 for retraining and for continued training with'
    ' D_extra'
  ) in text
  assert s['dr0_fraction@method=retrain'] == 0
  assert s['dr0_fraction@method=continued_extra'] == 0
  rq3 = diff_row(diff_files['rows'], 'continued', 'low_to_high', 16, 2)
  assert rq3['dr'] == 0 and rq3['found_rank'] == 0
  assert 'low → high reaches DR 0 at k=16 (found at rank 0)' in text
  moved = [
    c
    for m in ('retrain', 'continued', 'continued_extra')
    for k in (2, 8, 16)
    for c in CANARIES
    if s.get(f'dr@canary={c},k={k},method={m},prefix=2') == 0
    and s[f'dr@canary={c},k={k},method={m}'] != 0
  ]
  assert moved == ['low_to_high']
  bench = load(ROOT / 'benchmarks/results/cpu_quick/dr_search.json')
  assert bench['workload']['num_tokens'] == 10_000
  assert (
    f'|T| = 10,000 takes {bench["ours_median_cpu_s"]:.1f} CPU-seconds in'
    ' `benchmarks/results/cpu_quick/dr_search.json`'
  ) in text


def test_differential_heldout_canaries(diff_files):
  """`test/`: the settings chosen with the dev canaries, on new phrases."""
  test = DIFF / 'test'
  s, cfg = load(test / 'summary.json'), load(test / 'config.json')
  dev_cfg = diff_files['config']
  assert (dev_cfg['split'], cfg['split']) == ('dev', 'test')
  assert not set(cfg['canaries']) & set(dev_cfg['canaries'])
  same = ('continue_learning_rate', 'continue_epochs', 'continue_batch_size')
  assert all(cfg[k] == dev_cfg[k] for k in (*same, 'seed', 'epochs'))
  assert cfg['methods'] == ['continued', 'continued_extra']
  raw, text = diff_files['raw'], diff_files['text']
  names = {
    'all_low': 'all low',
    'low_to_high': 'low → high',
    'mixed': 'mixed',
    'high_to_low': 'high → low',
  }
  for c, phrase in zip(CANARIES, cfg['canaries']):
    cells = [
      f'{ds_text(s[f"ds@canary={c},k={k},method=continued"])}'
      f' ({dr_text(s[f"dr@canary={c},k={k},method=continued"])})'
      for k in cfg['insertions']
    ]
    line = f'| {names[c]}: "{phrase}" | ' + ' | '.join(cells) + ' |'
    assert line in raw, line
  cont = [
    s[f'dr@canary={c},k={k},method=continued']
    for c in CANARIES
    for k in cfg['insertions']
  ]
  frac = s['dr0_fraction@method=continued']
  assert frac == cont.count(0) / len(cont)
  extra = s['dr0_fraction@method=continued_extra']
  assert (
    f'`dr0_fraction@method=continued` = {frac:.3f} on the held-out canaries'
    f' ({cont.count(0)} of {len(cont)} cells; {extra:.0f} with D_extra),'
    f' against {diff_files["main"]["dr0_fraction@method=continued"]:.3f}'
  ) in text
  md = (test / 'summary.md').read_text('utf-8')
  ppl = re.search(r'M perplexity \*\*([\d.]+)\*\*', md).group(1)
  dev_md = (DIFF / 'summary.md').read_text('utf-8')
  assert f'M perplexity **{ppl}**' in dev_md  # the same M
  assert f'(held-out perplexity {ppl} again)' in text
  low = s['ds@canary=all_low,k=16,method=continued']
  assert f'all-low canary gains DS {ds_text(low)} at k=16' in text
  row = diff_row(
    rows_of(test / 'results.jsonl'), 'continued', 'high_to_low', 16
  )
  assert row['found'] and row['dr'] == row['found_rank']
  assert (
    f'k=16: DS {ds_text(row["ds"])}; the search found the canary itself,'
    f' with {row["dr"]} sequences scoring higher'
  ) in text
  worst = max(
    s[f'ds@canary={c},k={k},method=continued_extra']
    for c in CANARIES
    for k in cfg['insertions']
  )
  assert f'D_extra keeps every canary at DS ≤ {ds_text(worst)}' in text
  for c in CANARIES:
    ds = [s[f'ds@canary={c},k={k},method=continued'] for k in cfg['insertions']]
    assert ds == sorted(ds), c  # DS grows with k


def test_differential_setup(diff_files):
  from leakjax.attacks.differential import halving_widths

  s, cfg, text = diff_files['main'], diff_files['config'], diff_files['text']
  words = s['train_words']
  assert (
    f'{100 * cfg["eval_fraction"]:.0f} % are held out for perplexity,'
    f' {100 * cfg["extra_fraction"]:.0f} % are the D_extra pool, the rest'
    f' ({words:,.0f} words) is D'
  ) in text
  assert f'the {cfg["vocab_size"]:,} most frequent words of D' in text
  assert f'{PTB_TOKENS / words:.0f}x fewer words' in text
  rates = ', '.join(
    f'{words / (5 * k) / 1000:.1f}K' for k in cfg['insertions'][:-1]
  )
  last = f'{words / (5 * cfg["insertions"][-1]) / 1000:.1f}K'
  ks = ', '.join(map(str, cfg['insertions']))
  assert (
    f"k = {ks} give PTB's canary *rates*: 1 canary word in {rates} and"
    f' {last} training words'
  ) in text
  for phrase in cfg['canaries']:
    assert phrase in text
  assert list(cfg['canary_types']) == list(CANARIES)
  assert (
    f'Adam at rate {cfg["learning_rate"]:g} linearly decayed,'
    f' {cfg["epochs"]} epochs, batches of {cfg["batch_size"]} rows of'
    f' {cfg["row_width"]} packed words; held-out perplexity'
    f' **{s["ppl@model=M"]:.1f}**'
  ) in text
  assert cfg['retrain_insertions'] == [2, 16]
  assert 'only k = 2 and 16 are retrained' in text
  rows = [r for r in diff_files['rows'] if r['method'] == 'retrain']
  assert all(r['dr_own'] == r['dr'] for r in rows if r['prefix'] == 0)
  assert 'within Hamming distance 2' in text
  assert (
    f'batch {cfg["continue_batch_size"]}, {cfg["continue_epochs"]} epochs:'
    f' k/2 SGD steps at rate {cfg["continue_learning_rate"]:g})'
  ) in text
  assert cfg['continue_epochs'] / cfg['continue_batch_size'] == 0.5
  assert f'mixes in {cfg["extra_sentences"]} D_extra sentences' in text
  full = halving_widths(cfg['vocab_size'], 5, min_width=cfg['min_width'])
  rq3 = halving_widths(cfg['vocab_size'], 3, min_width=cfg['min_width'])
  assert f'widths {"/".join(map(str, full))} (the paper' in text
  assert f'(widths {"/".join(map(str, rq3))})' in text


def test_differential_studies(diff_files):
  s, text, rows = diff_files['main'], diff_files['text'], diff_files['rows']
  # 1. Retraining.
  low16 = diff_row(rows, 'retrain', 'all_low', 16)
  retrain16 = [s[f'ds@canary={c},k=16,method=retrain'] for c in CANARIES]
  assert max(retrain16) == low16['ds']
  per_word = low16['ds'] / 5
  rel = low16['rel_ds']
  mantissa, exponent = f'{rel / 5:.1e}'.split('e+')
  assert (
    f"the canary gains DS {low16['ds']:.3f} (all low) or less: M' gives its"
    f" words on average {mantissa}e{int(exponent)} times M's probability"
    f' (relative DS {rel:.1e} over 5 words)'.replace('e+04', 'e4')
  ) in text
  start = f'{low16["ds"] / rel:.0e}'.replace('e-07', 'e-7')
  assert (
    f'lifts them from about {start} to {per_word:.1e}'.replace('e-03', 'e-3')
    in text
  )
  tops = {k: diff_row(rows, 'retrain', 'all_low', k)['top'][0] for k in (2, 16)}
  assert (
    f'differ by DS {tops[2]["ds"]:.2f}-{tops[16]["ds"]:.2f} on common'
    f' 5-grams (top found: "{tops[2]["text"]}" at k=2, "{tops[16]["text"]}"'
    f" at k=16), {tops[16]['ds'] / low16['ds']:.0f}x the canary's DS at k=16"
  ) in text
  for k in (2, 16):
    top = diff_row(diff_files['rel'], 'retrain', 'all_low', k)['top'][0]
    assert f'"{top["text"]}"' in text
  assert all(
    r['dr'] > 1000 for r in diff_files['rel'] if r['method'] == 'retrain'
  )
  # 2. Frequent words.
  h2l = diff_row(rows, 'continued', 'high_to_low', 16)
  low = diff_row(rows, 'continued', 'all_low', 16)
  mixed = diff_row(rows, 'continued', 'mixed', 16)
  assert (
    f'the high → low canary has DS {h2l["ds"]:.3f},'
    f" {h2l['ds'] / low['ds']:.0f} times all-low's {low['ds']:.3f}"
  ) in text
  assert f'mostly "troops" (+{h2l["token_ds"][0]:.3f} after `<S>`)' in text
  assert f'the search finds {h2l["num_found"]} sequences' in text
  assert f'("{h2l["top"][0]["text"]}", DS {h2l["top"][0]["ds"]:.3f})' in text
  assert (
    f'("quickly" +{mixed["token_ds"][1]:.3f}; "{mixed["top"][0]["text"]}",'
    f' DS {mixed["top"][0]["ds"]:.3f})'
  ) in text
  assert low['found_rank'] == 0

  # 3. The size of the update: median perplexity of M' per k.
  def medians(summary, method):
    return [
      statistics.median(
        summary[f'ppl@canary={c},k={k},method={method}'] for c in CANARIES
      )
      for k in (2, 8, 16)
    ]

  assert (
    f'(median perplexity {joined(medians(s, "continued"), ".0f")} at'
    f' k = 2 / 8 / 16, from {s["ppl@model=M"]:.0f})'
  ) in text
  lr1 = diff_files['lr1']
  at16 = [lr1[f'ds@canary={c},k=16,method=continued'] for c in CANARIES]
  assert all(lr1[f'dr@canary={c},k=16,method=continued'] == 0 for c in CANARIES)
  assert f'at DR 0 at k=16 (DS {span(at16, ".1f")})' in text
  k2 = 'canary=all_low,k=2,method=continued'
  assert (
    f'found at k=2 (DR ≥ {lr1["dr@" + k2]}, DS {lr1["ds@" + k2]:.1f})' in text
  )
  ruined = [x / 1000 for x in medians(lr1, 'continued')]
  assert f'(median perplexity {min(ruined):.0f}K-{max(ruined):.0f}K)' in text
  # 4. D_extra.
  extra = [v for k, v in s.items() if k.startswith('ds@') and 'extra' in k]
  assert f'DS above {max(extra):.4f} at any k' in text
  top = diff_row(rows, 'continued_extra', 'all_low', 16)['top'][0]
  assert f'"{top["text"]}", DS {top["ds"]:.2f} at k=16)' in text
  kept = medians(s, 'continued_extra')[-1]
  assert f"keeps M's perplexity ({kept:.0f} vs {s['ppl@model=M']:.0f})" in text
  # 5. RQ3.
  for c in ('high_to_low', 'mixed'):
    row = diff_row(rows, 'continued', c, 16, 2)
    assert row['dr'] >= 2500 and max(row['token_ds']) < 0.01
  assert 'finds 2,500 or more better continuations' in text


def test_differential_commands_parse(diff_files, fresh_flags, monkeypatch):
  # The command and each variant's flags give the configs they ran with.
  from experiments import differential as exp
  from leakjax import io

  monkeypatch.chdir(ROOT)
  exp.define_flags()
  main, test = parse_commands(diff_files['raw'], 'experiments.differential')
  variants = re.findall(r'\| `(\w+)/` \| `([^`]*)` \|', diff_files['raw'])
  assert [v for v, _ in variants] == ['retrain_rel_ds', 'continued_sgd_lr1']
  runs = [
    (main, '', ''),
    *((main, v, x) for v, x in variants),
    (test, 'test', ''),
  ]
  for command, folder, extra in runs:
    fresh_flags.unparse_flags()
    fresh_flags(['prog', *command, *extra.split()])
    cfg = io.jsonable(exp.config_from_flags())
    stored = load(DIFF / folder / 'config.json')
    assert {k: cfg[k] for k in stored} == stored, folder


# ------------------------------------------------------------------- audit
def quoted(text: str, after: str) -> str:
  """The `>` block that follows the line containing `after`, joined."""
  lines = text.splitlines()
  start = next(i for i, x in enumerate(lines) if after in x) + 1
  block = []
  for line in lines[start:]:
    if not line.startswith('>'):
      if block:
        break
      continue
    block.append(line.lstrip('>').strip() or '\n')
  return ' '.join(block).replace(' \n ', '\n')


@pytest.mark.parametrize('name', ['quick', 'enron'])
def test_audit_answers(name):
  # The quoted answers are what experiments.audit_report writes from the
  # committed rows, config and facts.
  from experiments import audit_report

  cfg, run = audit_report.load_run(AUDIT / name)
  _, md = audit_report.summarize(cfg, run)
  paragraphs = md.split('\n\n')
  answer = paragraphs[1]
  text = (AUDIT / 'README.md').read_text('utf-8')
  block = quoted(text, f'`{name}/summary.md`:')
  parts = block.split('\n')
  assert parts[0] == answer
  if name == 'enron':
    assert parts[1] == paragraphs[2]  # the perplexity line
  assert md == (AUDIT / name / 'summary.md').read_text('utf-8')


def test_audit_facts():
  from leakjax.audit.config import AuditConfig

  text = text_of(AUDIT / 'README.md')
  quick, enron = (
    load(AUDIT / 'quick/facts.json'),
    load(AUDIT / 'enron/facts.json'),
  )
  assert (
    f'the {quick["num_sentences"]} embedded office sentences' in text
    and f'the runtime ({quick["seconds"]:.0f} s,'
    f' {quick["peak_memory_mib"]:,.0f} MiB peak on the 2-core CPU:'
    ' `quick/facts.json`)'
  ) in text
  assert (
    f'It ran {enron["seconds"]:,.0f} s with a'
    f' {enron["peak_memory_mib"]:,.0f} MiB peak on the 2-core CPU'
    ' (`enron/facts.json`)'
  ) in text
  cfg = load(AUDIT / 'enron/config.json')
  assert (
    f"the first {cfg['max_sentences']:,} of FILM's Enron sentences,"
    f' SmolLM2-135M, gradients, FedAvg updates and hidden states at'
    f' b = {", ".join(map(str, cfg["batch_sizes"]))},'
    f' no defense and {len(cfg["defenses"]) - 1} defenses,'
    f' {cfg["finetune_steps"]}'
    f' fine-tuning steps of {cfg["finetune_batch_size"]} sentences'
  ) in text
  quick_cfg, default = load(AUDIT / 'quick/config.json'), AuditConfig()
  assert (
    f'The quick audit runs FILM with {quick_cfg["film_beams"]} beams and'
    f" {quick_cfg['film_steps']} reordering steps instead of the preset's"
    f' {default.film_beams} and {default.film_steps}, to fit the quick'
    " audit's time budget"
  ) in text


def test_audit_commands_parse(fresh_flags, monkeypatch):
  # The regenerate commands give the configs the committed audits ran with.
  from experiments import audit
  from leakjax import io

  monkeypatch.chdir(ROOT)
  audit.define_flags()
  raw = (AUDIT / 'README.md').read_text('utf-8')
  commands = parse_commands(raw, 'experiments.audit')
  assert len(commands) == 2
  for args, name in zip(commands, ('quick', 'enron')):
    assert f'audit_{name}.flags' in ' '.join(args)
    fresh_flags.unparse_flags()
    fresh_flags(['prog', *args])
    cfg = io.jsonable(audit.config_from_flags())
    stored = load(AUDIT / name / 'config.json')
    assert {k: cfg[k] for k in stored} == stored, name
  assert parse_commands(raw, 'experiments.audit_report') == [
    ['reports/audit/quick', '--screenshot']
  ]


# -------------------------------------------------------------- benchmarks
def test_benchmark_status_words():
  from benchmarks import run

  assert run.ratio_status(2.1, 20.0, match=1) == 'not met'
  assert run.ratio_status(21.0, 20.0, match=1) == 'met'
  assert run.ratio_status(21.0, 20.0, match=0) == 'not met (outputs differ)'
  assert run.ratio_status(21.0, 20.0, extrapolated=True) == 'extrapolated'
  assert run.ratio_status(0.9, None) == 'no bar'
  # A benchmark is its worst bar; an extrapolated peer is flagged.
  dr = {
    'speedup': 12.0,
    'straightforward_extrapolated': True,
    'bar_seconds': 30.0,
    'ours_first_call_s': 19.0,
    'agreement': {'top_match': True, 'overlap': 1.0},
  }
  keys = run.headline('dr_search', dr)
  assert keys['peer_extrapolated@bench=dr_search'] == 1
  status = run.benchmark_status('dr_search', keys, dr)
  assert status['status'] == 'extrapolated' and status['peer_extrapolated']
  assert [c['status'] for c in status['bars']] == ['extrapolated', 'met']
  measured = {**dr, 'straightforward_extrapolated': False}
  keys = run.headline('dr_search', measured)
  assert run.benchmark_status('dr_search', keys, measured)['status'] == 'met'
  slow = {**measured, 'ours_first_call_s': 31.0}
  assert run.benchmark_status('dr_search', keys, slow)['status'] == 'not met'
  grad = {'speedup@bench=grad_norms': 1.4, 'match@bench=grad_norms': 1}
  assert run.benchmark_status('grad_norms', grad, {})['status'] == 'not met'
  cu = {'speedup@bench=client_update': 0.9, 'match@bench=client_update': 1}
  assert run.benchmark_status('client_update', cu, {})['status'] == 'no bar'


@pytest.mark.parametrize('name', ['cpu_quick', 'cpu_full'])
def test_committed_benchmark_status(name):
  # run.json's status and summary.md are what `--relabel` computes from the
  # folder's JSON files, and benchmarks/README.md shows that table.
  from benchmarks import run

  out = ROOT / 'benchmarks' / 'results' / name
  summary, info = load(out / 'summary.json'), load(out / 'run.json')
  results = {}
  for bench in run.BENCHMARKS:
    result = load(out / f'{bench}.json')
    results[bench] = result
    want = run.benchmark_status(bench, summary, result)
    got = {k: v for k, v in info['status'][bench].items() if k != 'seconds'}
    assert got == want, bench
    assert got['status'] in ('met', 'not met', 'extrapolated', 'no bar')
  md = run.markdown(
    summary, info['status'], results, info['peak'], quick=info['quick']
  )
  assert md == (out / 'summary.md').read_text()
  readme = (ROOT / 'benchmarks' / 'README.md').read_text()
  head = md.split('\n## ')[0].split('\n\n', 2)[2].rstrip()
  assert head in readme
  if info['quick']:
    assert info['status']['dr_search']['peer_extrapolated']
    assert load(out / 'dr_search.json')['straightforward_extrapolated']
