"""The numbers in the flagfiles' headers come from the committed reports.

A flagfile's header gives its command, how long the command runs and what
it finds. Each check below formats values of the files under reports/ that
the command writes, or that the run the header names writes
(summary.json, results.jsonl, facts.json, profile.json, timings.json,
config.json; the summary.md header where no JSON records the value), the way
the header writes them and looks for that text in the header, so a
regenerated report that moves a number fails here until the header follows. `test_measured_numbers_are_checked` fails on a time, a
memory size, a score with two or three decimals or an "N of M" count in a
header that no check quotes and the flagfile's own flags do not set.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from experiments import film_tables

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / 'reports'
FLAGFILES = sorted(
  [
    *ROOT.glob('experiments/configs/*.flags'),
    *ROOT.glob('studies/*/configs/*.flags'),
  ]
)
# FILM Table 10, Enron Email rows (b -> ROUGE-1, ROUGE-2, ROUGE-L, NERR).
PAPER = film_tables.PAPER_TABLE10_ENRON


def path_of(name: str) -> Path:
  (path,) = [p for p in FLAGFILES if p.stem == name]
  return path


def header(name: str) -> str:
  """The comment lines of NAME.flags, joined with single spaces."""
  lines = path_of(name).read_text('utf-8').splitlines()
  text = ' '.join(x.lstrip('#').strip() for x in lines if x.startswith('#'))
  return ' '.join(text.split())


def flag_lines(name: str) -> str:
  lines = path_of(name).read_text('utf-8').splitlines()
  return '\n'.join(x for x in lines if x.startswith('--'))


def load(report: str, name: str = 'summary.json'):
  return json.loads((REPORTS / report / name).read_text())


def rows(report: str, **where) -> list[dict]:
  """The rows of REPORT's results.jsonl whose fields equal `where`."""
  lines = (REPORTS / report / 'results.jsonl').read_text().splitlines()
  out = [json.loads(x) for x in lines if x.strip()]
  return [r for r in out if all(r.get(k) == v for k, v in where.items())]


def summary_md(report: str) -> str:
  return ' '.join((REPORTS / report / 'summary.md').read_text('utf-8').split())


def minutes(seconds: float) -> str:
  return f'{seconds / 60:.0f} min'


def span(values, unit: str = ' s', fmt: str = '.0f') -> str:
  return f'{min(values):{fmt}}-{max(values):{fmt}}{unit}'


def seconds(report: str) -> list[float]:
  return [r['seconds'] for r in rows(report)]


def exact(rs: list[dict]) -> int:
  """Sentences recovered token for token over the rows."""
  return sum(round(r['b'] * r['exact']) for r in rs)


def rouge(report: str, b: int) -> float:
  """Mean ROUGE-L over REPORT's batches of size b."""
  return float(np.mean([r['rougeL'] for r in rows(report, b=b)]))


def first(report: str, b: int) -> dict:
  """REPORT's row of the first batch of size b."""
  return min(rows(report, b=b), key=lambda r: r['batch'])


def ratio(s: dict, key: str) -> float:
  """GBoard word F1 over its upper bound (the true in-vocabulary words)."""
  return s[key] / s['f1_upper' + key.removeprefix('f1')]


def pretraining(report: str) -> str:
  """GBoard θ0's pre-training minutes, as summary.md states them."""
  m = re.search(r'Adam \d+ steps \((\d+) min\)', summary_md(report))
  assert m, report
  return f'{m.group(1)} min'


CHECKS = {}


def check(name: str):
  """Registers the texts that NAME.flags' header must contain."""

  def register(fn):
    CHECKS[name] = fn
    return fn

  return register


# ------------------------------------------------------------------- audit


def audit(report: str) -> list[str]:
  facts = load(report, 'facts.json')
  return [
    f'{minutes(facts["seconds"])}, {facts["peak_memory_mib"]:,.0f} MiB peak'
    f' (reports/{report}/facts.json)'
  ]


@check('audit_quick')
def _audit_quick():
  cfg = load('audit/quick', 'config.json')
  beams, steps = cfg['film_beams'], cfg['film_steps']
  return [
    *audit('audit/quick'),
    f'FILM runs with {beams} beams and {steps} reordering steps',
    f'{cfg["finetune_steps"]} fine-tuning steps of'
    f' {cfg["finetune_batch_size"]} sentences per run',
  ]


@check('audit_enron')
def _audit_enron():
  cfg = load('audit/enron', 'config.json')
  defenses = [d for d in cfg['defenses'] if d != 'none']
  return [
    *audit('audit/enron'),
    f'under {len(defenses)} defenses (and none)',
    f'after {cfg["finetune_steps"]} fine-tuning steps'
    f' ({cfg["utility_seeds"]} seeds)',
  ]


# ------------------------------------------------------------------- DAGER


@check('dager_quick')
def _dager_quick():
  s = load('dager/quick')
  r1 = ' / '.join(f'{s[f"rouge1@b={b}"]:.3f}' for b in (1, 4, 16))
  return [
    f'sum to {sum(seconds("dager/quick")):.0f} s',
    f'rouge1@b=1/4/16 = {r1}',
    f'exact@b=16 = {s["exact@b=16"]:.3f} (last token included;'
    f' {s["exact_prefix@b=16"]:.3f} without it)',
  ]


@check('dager_defenses')
def _dager_defenses():
  s = load('dager/defenses')

  def pair(metric, defense, fmt='.3f'):
    return ' / '.join(
      f'{s[f"{metric}@b={b},defense={defense}"]:{fmt}}' for b in (4, 16)
    )

  prefix = {s[f'exact_prefix@b={b},defense=freeze'] for b in (4, 16)}
  assert len(prefix) == 1
  # noise:1e-6 and both FedAvg settings: every b = 16 batch rank-limited.
  for d in ('noise:1e-6', 'fedavg:1:4', 'fedavg:2:16'):
    got = rows('dager/defenses', b=16, defense=d)
    assert len(got) == 3 and all(r['rank_limited'] for r in got), d
    assert s[f'rougeL@b=16,defense={d}'] == 0.0
  return [
    f"the attacks' `seconds` sum to ~{minutes(sum(seconds('dager/defenses')))}",
    f'freeze rougeL@b=4/16 = {pair("rougeL", "freeze")}',
    f'exact {pair("exact", "freeze", ".2f")} ({prefix.pop():.2f} without the'
    ' last token)',
    f'noise:1e-8 rougeL {pair("rougeL", "noise:1e-8")}',
    f'noise:1e-7 {pair("rougeL", "noise:1e-7")}',
    'every b = 16 batch rank-limited, 0.000',
  ]


@check('dager_enron_finetuned')
def _dager_enron_finetuned():
  return [f"the attacks' {sum(seconds('dager/enron_finetuned')):.0f} s"]


@check('dager_fedavg')
def _dager_fedavg():
  hit = rows('dager/fedavg', b=4, defense='fedavg:1:4')
  others = [r for r in rows('dager/fedavg') if r not in hit]
  assert others and all(r['rank_limited'] and r['rougeL'] == 0 for r in others)
  s = load('dager/fedavg')
  return [
    f'sum to {sum(seconds("dager/fedavg")):.0f} s',
    f'(fedavg:1:4 at b = 4: rougeL {s["rougeL@b=4,defense=fedavg:1:4"]:.3f},'
    f' exact {s["exact@b=4,defense=fedavg:1:4"]:.2f}; every other cell'
    ' rank-limited, 0.000)',
  ]


def batches(report: str) -> str:
  """'~N min (measured: A-B s a batch' or '(measured: S s for the batch'."""
  s = seconds(report)
  if len(s) == 1:
    return f'~{minutes(s[0])} (measured: {s[0]:.0f} s for the batch'
  return f'~{minutes(sum(s))} (measured: {span(s)} a batch'


@check('dager_film')
def _dager_film():
  return [batches('dager/film')]


@check('dager_hybrid')
def _dager_hybrid():
  tokens = [r['num_tokens'] for r in rows('dager/hybrid')]
  return [
    f'({min(tokens):,} to {max(tokens):,} input positions',
    batches('dager/hybrid'),
    f'(ROUGE-L {rouge("dager/hybrid", 32):.3f} /'
    f' {rouge("dager/hybrid", 64):.3f} at b = 32 / 64;'
    f' {exact(rows("dager/hybrid", b=32))} of 96 sentences exact at b = 32,'
    f' {exact(rows("dager/hybrid", b=64))} of 192 at b = 64)',
  ]


@check('dager_hybrid_b128')
def _dager_hybrid_b128():
  (row,) = rows('dager/hybrid_b128')
  assert exact([row]) == 0
  return [
    f'~{minutes(row["seconds"])} (measured: {row["seconds"]:,.0f} s for the'
    ' batch',
    f'(ROUGE-L {row["rougeL"]:.3f}, no sentence exact; the LM and the span'
    ' alone on that batch:'
    f' {first("dager/hybrid_span_only", 128)["rougeL"]:.3f} in',
  ]


def one_batch(report: str) -> float:
  (row,) = rows(report)
  assert row['batch'] == 0 and row['b'] == 64
  return row['rougeL']


def base64() -> dict:
  """The default hybrid's row of the first b = 64 batch."""
  return first('dager/hybrid', 64)


@check('dager_hybrid_beams16')
def _dager_hybrid_beams16():
  return [
    batches('dager/hybrid_beams16'),
    f'(ROUGE-L {one_batch("dager/hybrid_beams16"):.3f}; 8 beams on that'
    f' batch: {base64()["rougeL"]:.3f} in',
  ]


@check('dager_hybrid_cuts')
def _dager_hybrid_cuts():
  cuts = rows('dager/hybrid_cuts')
  secs = ' / '.join(f'{r["seconds"]:,.0f}' for r in cuts)
  return [
    f'~{minutes(sum(seconds("dager/hybrid_cuts")))} with other jobs beside'
    f' it (measured: {secs} s for the three batches',
    f'(ROUGE-L {rouge("dager/hybrid_cuts", 64):.3f} over the three batches,'
    f' {exact(cuts)} of 192 sentences exact; the default hybrid on them:'
    f' {rouge("dager/hybrid", 64):.3f},',
  ]


def search_select(report: str) -> str:
  (row,) = rows(report)
  stages = row['stage_seconds']
  return (
    f'{row["seconds"]:.0f} s for the batch (search {stages["search"]:.0f} s,'
    f' selection {stages["select"]:.0f} s)'
  )


@check('dager_hybrid_cuts_whiten')
def _dager_hybrid_cuts_whiten():
  (row,) = rows('dager/hybrid_cuts_whiten')
  return [
    search_select('dager/hybrid_cuts_whiten'),
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact([row])} of 64 sentences exact; the'
    f' raw rows on the same batch: {first("dager/hybrid_cuts", 64)["rougeL"]:.3f}',
  ]


@check('dager_hybrid_starts_cuts')
def _dager_hybrid_starts_cuts():
  (row,) = rows('dager/hybrid_starts_cuts')
  return [
    search_select('dager/hybrid_starts_cuts'),
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact([row])} of 64 sentences exact; the'
    " default hybrid's searches with the same selection:"
    f' {one_batch("dager/hybrid_cuts_whiten"):.3f}',
  ]


@check('dager_hybrid_defenses')
def _dager_hybrid_defenses():
  hyb, dager = load('dager/hybrid_defenses'), load('dager/defenses')
  four = ('none', 'noise:1e-7', 'noise:1e-6', 'fedavg:2:16')

  def cell(s, d, prefix):
    tail = '' if d == 'none' else f',defense={d}'
    return f'{s[f"rougeL@{prefix}b=16{tail}"]:.3f}'

  return [
    batches('dager/hybrid_defenses'),
    f'(ROUGE-L {" / ".join(cell(hyb, d, "attack=hybrid,") for d in four)}'
    ' with none',
    'DAGER on the same batches: '
    + ' / '.join(cell(dager, d, '') for d in four),
  ]


@check('dager_hybrid_noise')
def _dager_hybrid_noise():
  s = load('dager/hybrid_noise')
  got = [
    f'{s[f"rougeL@attack=hybrid,b=16,defense=noise:{x}"]:.3f}'
    for x in ('1e-5', '1e-4')
  ]
  return [batches('dager/hybrid_noise'), f'(ROUGE-L {" / ".join(got)} at std']


@check('dager_hybrid_end')
def _dager_hybrid_end():
  (row,) = rows('dager/hybrid_end')
  assert exact([base64()]) == 0
  return [
    batches('dager/hybrid_end'),
    f'(ROUGE-L {one_batch("dager/hybrid_end"):.3f}, {exact([row])} of 64'
    f' exact; the default hybrid on that batch: {base64()["rougeL"]:.3f},'
    ' none exact',
  ]


@check('dager_hybrid_end_power')
def _dager_hybrid_end_power():
  return [
    batches('dager/hybrid_end_power'),
    f'(ROUGE-L {one_batch("dager/hybrid_end_power"):.3f}; the default hybrid'
    f' on that batch: {base64()["rougeL"]:.3f} in',
  ]


def none_exact(report: str) -> str:
  (row,) = rows(report)
  assert exact([row]) == 0 == exact([base64()])
  return (
    f'(ROUGE-L {row["rougeL"]:.3f}, none exact; the default hybrid on that'
    f' batch: {base64()["rougeL"]:.3f}, none exact'
  )


@check('dager_hybrid_explain')
def _dager_hybrid_explain():
  return [batches('dager/hybrid_explain'), none_exact('dager/hybrid_explain')]


@check('dager_hybrid_oversample')
def _dager_hybrid_oversample():
  return [
    batches('dager/hybrid_oversample'),
    none_exact('dager/hybrid_oversample'),
  ]


@check('dager_hybrid_evidence')
def _dager_hybrid_evidence():
  got = rows('dager/hybrid_evidence')
  # The starts run's searches under the same selection (its selection study).
  study = load('dager/hybrid_starts', 'selection_whiten.json')
  before = [p['q=1']['cuts_first_b']['rougeL'] for p in study['batches']]
  return [
    batches('dager/hybrid_evidence') + ')',
    f'(ROUGE-L {rouge("dager/hybrid_evidence", 64):.3f} over the three'
    f' batches, {exact(got)} of 192 sentences exact; without the ratio:'
    f' {np.mean(before):.3f}, in reports/dager/hybrid_starts/'
    'selection_whiten.json)',
  ]


@check('dager_hybrid_evidence_b128')
def _dager_hybrid_evidence_b128():
  (row,) = rows('dager/hybrid_evidence_b128')
  (base,) = rows('dager/hybrid_starts_b128')
  return [
    f'~{minutes(row["seconds"])} (measured: {row["seconds"]:.0f} s,',
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact([row])} of 128 sentences exact;'
    f' without the ratio: {base["rougeL"]:.3f},',
  ]


@check('dager_hybrid_evidence_oversample')
def _dager_hybrid_evidence_oversample():
  got = rows('dager/hybrid_evidence_oversample')
  return [
    batches('dager/hybrid_evidence_oversample') + ')',
    f'(ROUGE-L {rouge("dager/hybrid_evidence_oversample", 64):.3f} over the'
    f' three batches, {exact(got)} of 192 sentences exact; with 64 searches:'
    f' {rouge("dager/hybrid_evidence", 64):.3f},',
  ]


@check('dager_hybrid_evidence_oversample_heldout')
def _dager_hybrid_evidence_oversample_heldout():
  report = 'dager/hybrid_evidence_oversample_heldout'
  got = sorted(rows(report), key=lambda r: r['batch'])
  assert [r['batch'] for r in got] == [3, 4, 5, 6, 7, 8]
  # Batches 6-8 shared the CPU with other runs: only 3-5's times are given.
  idle = [r['seconds'] for r in got[:3]]
  # The code as it is, on whole batches (benchmarks.hybrid_batch).
  now = json.loads((ROOT / 'benchmarks/results/hybrid_batch.json').read_text())
  assert [r['batch'] for r in now['rows']] == [3, 5]
  return [
    f'measured {span(idle)} a batch for batches 3-5 on an idle machine;'
    f' the code as it is: {span([r["seconds"]["run"] for r in now["rows"]])}'
    ' for batches 3 and 5 (benchmarks/results/hybrid_batch.json).',
    f'(ROUGE-L {rouge(report, 64):.3f} over the six'
    f' batches, {exact(got)} of 384 sentences exact)',
  ]


@check('dager_hybrid_finetuned')
def _dager_hybrid_finetuned():
  report = 'dager/hybrid_finetuned'
  return [
    f'+ {span(seconds(report))} a batch',
    f'(ROUGE-L {rouge(report, 32):.3f} at b = 32, {exact(rows(report))} of 96'
    ' sentences exact)',
  ]


@check('dager_hybrid_finetuned_full')
def _dager_hybrid_finetuned_full():
  report = 'dager/hybrid_finetuned_full'
  return [
    f'+ {span(seconds(report))} a batch',
    f'(ROUGE-L {rouge(report, 32):.3f} / {rouge(report, 64):.3f} at b = 32 /'
    f' 64; {exact(rows(report, b=32))} of 96 and {exact(rows(report, b=64))}'
    ' of 192 sentences exact)',
  ]


def three(report: str) -> str:
  got = ' / '.join(f'{rouge(report, b):.3f}' for b in (32, 64, 128))
  return f'(ROUGE-L {got} at b = 32 / 64 / 128)'


@check('dager_hybrid_finetuned_span_only')
def _dager_hybrid_finetuned_span_only():
  report = 'dager/hybrid_finetuned_span_only'
  return [f'+ {span(seconds(report))} a batch', three(report)]


@check('dager_hybrid_span_only')
def _dager_hybrid_span_only():
  return [batches('dager/hybrid_span_only'), three('dager/hybrid_span_only')]


def against(report: str, base: str) -> str:
  return (
    f'(ROUGE-L {rouge(report, 32):.3f}, against {rouge(base, 32):.3f} without'
  )


@check('dager_hybrid_freeze')
def _dager_hybrid_freeze():
  return [
    batches('dager/hybrid_freeze'),
    against('dager/hybrid_freeze', 'dager/hybrid'),
  ]


@check('dager_hybrid_span_only_freeze')
def _dager_hybrid_span_only_freeze():
  return [
    batches('dager/hybrid_span_only_freeze'),
    against('dager/hybrid_span_only_freeze', 'dager/hybrid_span_only'),
  ]


@check('dager_hybrid_head_only')
def _dager_hybrid_head_only():
  return [batches('dager/hybrid_head_only')]


@check('dager_hybrid_starts')
def _dager_hybrid_starts():
  got = rows('dager/hybrid_starts')
  return [
    batches('dager/hybrid_starts') + ')',
    f'(ROUGE-L {rouge("dager/hybrid_starts", 64):.3f} over the three batches,'
    f' {exact(got)} of 192 sentences exact; the default hybrid on them:'
    f' {rouge("dager/hybrid", 64):.3f}',
  ]


@check('dager_hybrid_starts_b128')
def _dager_hybrid_starts_b128():
  (row,) = rows('dager/hybrid_starts_b128')
  (base,) = rows('dager/hybrid_b128')
  return [
    batches('dager/hybrid_starts_b128'),
    f'(ROUGE-L {row["rougeL"]:.3f}, {exact([row])} of 128 sentences exact; the'
    f' default hybrid on that batch: {base["rougeL"]:.3f}',
  ]


# -------------------------------------------------------------------- FILM


def grad_and_bag_seconds(report: str) -> tuple[int, float]:
  """(gradients, seconds): each gradient's `grad_seconds` once, plus every
  method's `bag_seconds`."""
  grads = {
    (r['b'], r['batch'], r['defense']): r['grad_seconds']
    for r in rows(report)
    if 'grad_seconds' in r
  }
  total = sum(grads.values()) + sum(
    r.get('bag_seconds', 0) for r in rows(report)
  )
  return len(grads), total


def attack_seconds(report: str) -> float:
  return sum(r['grad_seconds'] + r['attack_seconds'] for r in rows(report))


def trained(report: str) -> dict:
  """What summary.md's first paragraph says of the fine-tuned model."""
  m = re.search(
    r'fine-tuned for t = (\d+) steps( \(early stopping\))? on (\d+) private'
    r' sentences(?: \(eval perplexity ([\d.]+)\))?',
    summary_md(report),
  )
  assert m, report
  return {
    'steps': int(m.group(1)),
    'early': bool(m.group(2)),
    'num_train': int(m.group(3)),
    'eval_ppl': m.group(4),
  }


@check('film_bag')
def _film_bag():
  n, total = grad_and_bag_seconds('film_bag')
  return [f"the {n} batches' gradients and bags take {minutes(total)}"]


@check('film_defenses')
def _film_defenses():
  n, total = grad_and_bag_seconds('film_bag/defenses')
  return [f'the {n} gradients and their bags take {minutes(total)}']


def rouge_l(s: dict, bs) -> str:
  return '/'.join(f'{s[f"rougeL@b={b}"]:.2f}' for b in bs)


@check('film_enron_cpu')
def _film_enron_cpu():
  s, cfg, h = (
    load('film_enron'),
    load('film_enron', 'config.json'),
    trained('film_enron'),
  )
  assert h['early']  # "stopped when the held-out loss goes up"
  bs = cfg['batch_sizes']
  each = ', '.join(f'rougeL@b={b} = {s[f"rougeL@b={b}"]:.2f}' for b in bs)
  paper = '/'.join(f'{PAPER[b][2]:.2f}' for b in bs)
  return [
    f'({cfg["max_sentences"] - h["num_train"]} held out)',
    f'stops at step {h["steps"]}, eval perplexity {h["eval_ppl"]}:',
    f'{minutes(attack_seconds("film_enron"))} for the'
    f' {len(rows("film_enron"))} attacks',
    f'{each} (paper Table 10: {paper})',
    f'{rouge_l(load("film_enron/fixed_2_epochs"), bs)}'
    ' (reports/film_enron/fixed_2_epochs/)',
  ]


@check('film_freeze')
def _film_freeze():
  s = load('film_freeze')

  def three(d):
    return ' / '.join(
      f'{s[f"rougeL@b={b},defense={d}"]:.2f}' for b in (1, 16, 64)
    )

  return [
    f'{minutes(attack_seconds("film_freeze"))} for the'
    f' {len(rows("film_freeze"))} attacks',
    f'rougeL@b=1/16/64 = {three("none")} without the defense, {three("freeze")}'
    ' with frozen embeddings',
  ]


@check('film_freeze_sentence_ends')
def _film_freeze_sentence_ends():
  s, frozen = load('film_freeze/sentence_ends'), load('film_freeze')
  name = 'film_freeze/sentence_ends'
  return [
    f'{minutes(attack_seconds(name))} for the {len(rows(name))} attacks',
    'rougeL@b=1/16/64 = '
    + ' / '.join(f'{s[f"rougeL@b={b}"]:.2f}' for b in (1, 16, 64))
    + ', against '
    + ' / '.join(
      f'{frozen[f"rougeL@b={b},defense=freeze"]:.2f}' for b in (1, 16, 64)
    )
    + ' with frozen embeddings',
  ]


@check('film_quickstart')
def _film_quickstart():
  profile = load('film_quickstart', 'profile.json')
  run = profile['runs'][-1]  # the last profile run: the code as it is
  s, h = load('film_quickstart'), trained('film_quickstart')
  bs = (1, 4, 16)
  recall = [s[f'bag_recall@b={b}'] for b in bs]
  assert {s[f'bag_precision@b={b}'] for b in bs} == {1.0}
  return [
    f'~{run["wall_s"] / 60:.1f} min wall (measured: {run["wall_s"]:.0f} s,'
    f' {run["peak_rss_mib"]:,} MiB peak, model load, {h["steps"]} fine-tuning'
    f' steps and {len(rows("film_quickstart"))} attacks included',
    ', '.join(f'rougeL@b={b} = {s[f"rougeL@b={b}"]:.2f}' for b in bs),
    f'bag precision 1.000, recall {span(recall, "", ".3f")}:'
    f' {h["num_train"]} embedded sentences, memorised after {h["steps"]} steps',
  ]


@check('film_utility')
def _film_utility():
  timed = [r for r in rows('film_utility') if 'seconds' in r]
  total = sum(r['seconds'] for r in timed)
  dp = sum(r['seconds'] for r in timed if r['defense'].startswith('dp:'))
  assert dp > total / 2  # "DP-SGD's per-example gradients dominate"
  return [f'sum to {minutes(total)}']


@check('film_utility_dp_sigma')
def _film_utility_dp_sigma():
  rs = {r['defense']: r for r in rows('film_utility/dp_sigma')}
  total = sum(r.get('seconds', 0) for r in rs.values())

  def ratio(d):
    return f'{rs[d]["perplexity"] / rs["none"]["perplexity"]:.3f}'

  return [
    f'sum to {minutes(total)}',
    f'{ratio("dpsigma:0")} with clipping alone',
    f'{ratio("dpsigma:0.03")} at sigma = 0.03',
    f'{ratio("dpsigma:0.2")} at sigma = 0.2',
  ]


@check('film_utility_scratch')
def _film_utility_scratch():
  total = sum(r.get('seconds', 0) for r in rows('film_utility/scratch'))
  return [f'about {minutes(total)}', f'sum to {total:.0f} s']


# ------------------------------------------------------------------ GBoard


@check('gboard_quick')
def _gboard_quick():
  s = load('gboard/quick')
  k1 = 'f1@B=full,E=1,n_k=16,noise=none,sigma=0.0'
  k64 = 'f1@B=full,E=1,n_k=64,noise=none,sigma=0.0'
  kdp = 'f1@B=full,E=50,n_k=16,noise=dpsgd,sigma=0.1'
  kdp1 = 'f1@B=full,E=1,n_k=16,noise=dpsgd,sigma=0.01'
  return [
    f'pre-training θ0 takes {pretraining("gboard/quick")}',
    f'held-out perplexity {s["theta0_eval_perplexity"]:.0f}',
    f'({k1} = {s[k1]:.3f} = {ratio(s, k1):.3f} x f1_upper; n_k=64:'
    f' {ratio(s, k64):.3f} x; {kdp} = {s[kdp]:.3f} = {ratio(s, kdp):.3f} x'
    f' f1_upper; sigma=0.01, E=1: {ratio(s, kdp1):.3f} x)',
  ]


def noise_free(s: dict) -> list[float]:
  return [ratio(s, k) for k in s if k.startswith('f1@') and 'noise=none' in k]


@check('gboard_sms')
def _gboard_sms():
  s = load('gboard')

  def dp(b, e, n):
    return ratio(s, f'f1@B={b},E={e},n_k={n},noise=dpsgd,sigma=0.1')

  def lev(b, n):
    return s[f'levenshtein_cover@B={b},E=1000,n_k={n},noise=none,sigma=0.0']

  n16 = [dp(b, e, 16) for b in ('full', '32') for e in (50, 100, 1000)]
  e1 = [dp('full', 1, 16), *(dp('32', 1, n) for n in (16, 64, 256))]
  big = [lev(b, n) for b in ('full', '32') for n in (64, 128, 256)]
  assert lev('32', 16) == pytest.approx(lev('full', 16))
  return [
    f'~{pretraining("gboard")} pre-training',
    f'noise-free word F1 >= {min(noise_free(s)):.2f} x the vocabulary upper'
    ' bound',
    f'{span(n16, "", ".2f")} x at n_k=16, E>=50,'
    f' {dp("32", 50, 64):.2f}/{dp("32", 100, 64):.2f} x at n_k=64 B=32 E=50/100,'
    f' {dp("32", 50, 256):.2f}/{dp("32", 100, 256):.2f} x at n_k=256 B=32'
    f' E=50/100, {max(e1):.2f} x or less at E=1',
    f'E=1000: {lev("full", 16):.0f} (n_k=16) to {span(big, "")} (n_k=64-256)',
  ]


@check('gboard_heldout')
def _gboard_heldout():
  h, ins = load('gboard/heldout'), load('gboard')
  cfg, seed0 = (
    load('gboard/heldout', 'config.json'),
    load('gboard', 'config.json'),
  )
  key = 'f1@B=32,E={},n_k=64,noise=dpsgd,sigma=0.1'
  ldp = 'f1@B=full,E=100,n_k=256,noise=single,sigma=0.001'
  return [
    f'{pretraining("gboard/heldout")} pre-training θ0 (summary.md)',
    f'the {cfg["client_pool"]} distinct 4-word ham sentences outside its pool'
    f' of {seed0["client_pool"]}',
    f'noise-free word F1 >= {min(noise_free(h)):.3f} x the vocabulary upper'
    f' bound for every n_k <= 256 (in sample: >= {min(noise_free(ins)):.3f})',
    f'E = 50 / 100: {ratio(h, key.format(50)):.2f} /'
    f' {ratio(h, key.format(100)):.2f} x',
    f'E = 100: {ratio(h, ldp):.2f} x (in sample {ratio(ins, ldp):.2f})',
  ]


@check('gboard_heldout_e1000')
def _gboard_heldout_e1000():
  s = load('gboard/heldout_e1000')
  dp16 = ratio(s, 'f1@B=full,E=1000,n_k=16,noise=dpsgd,sigma=0.1')
  dp64 = ratio(s, 'f1@B=32,E=1000,n_k=64,noise=dpsgd,sigma=0.1')
  ldp = ratio(s, 'f1@B=full,E=1000,n_k=256,noise=single,sigma=0.001')
  return [
    f'{pretraining("gboard/heldout_e1000")} pre-training θ0 (summary.md)',
    f'word F1 >= {min(noise_free(s)):.3f} x the',
    f'{dp16:.3f} x (n_k = 16, full batch), {dp64:.3f} x (n_k = 64, B = 32)',
    f'n_k = 256, full batch: {ldp:.3f} x',
  ]


# ------------------------------------------------- differential, inversion


def _differential_costs(s, trained_once, searched) -> list[str]:
  """What a differential flag header says of its cost, M and headline."""
  search = sum(r['search_seconds'] for r in searched)
  return [
    f"the {len(trained_once)} continued-training M' take"
    f' {minutes(sum(trained_once.values()))} and the {len(searched)} beam'
    f' searches over |T| = 10,000 take {minutes(search)}',
    f'M perplexity {s["ppl@model=M"]:.0f}',
    f'dr0_fraction@method=continued = {s["dr0_fraction@method=continued"]:.3f}',
  ]


@check('differential_wikitext')
def _differential_wikitext():
  s = load('differential')
  # Each M' is trained once; its rows (canaries x prefixes) repeat its time.
  trained_once = {
    (r['method'], r['k'], tuple(r['planted'])): r['train_seconds']
    for r in rows('differential', method='continued')
    + rows('differential', method='continued_extra')
  }
  searched = rows('differential', searched=True)
  far = [
    v
    for k, v in s.items()
    if k.startswith('dr@') and re.search(r'method=(retrain|continued_extra)', k)
  ]
  assert far and min(far) > 1000
  assert s['dr@canary=all_low,k=16,method=continued'] == 0
  return [
    *_differential_costs(s, trained_once, searched),
    'DR > 1000 for every retrained and D_extra cell',
  ]


@check('differential_wikitext_test')
def _differential_wikitext_test():
  s, dev = load('differential/test'), load('differential')
  rs = rows('differential/test')
  trained_once = {
    (r['method'], r['k'], tuple(r['planted'])): r['train_seconds'] for r in rs
  }
  searched = [r for r in rs if r['searched']]
  (found,) = [
    r
    for r in rs
    if r['found'] and r['prefix'] == 0 and r['method'] == 'continued'
  ]
  assert (found['canary'], found['k']) == ('high_to_low', 16)
  return [
    *_differential_costs(s, trained_once, searched),
    f'found at k=16 with {found["dr"]} sequences above it',
    f'against {dev["dr0_fraction@method=continued"]:.3f} with the dev canaries',
  ]


@check('embed_parrot_smollm2')
def _embed_parrot_smollm2():
  s = load('embed_parrot')

  def r1(data, method):
    return s[f'rouge1@data={data},layer=25,method={method}']

  assert all(
    s[f'f1@data={d},layer=0,method=hei'] == 1.0
    for d in ('enron', 'wikitext', 'sms')
  )
  deep = [
    v
    for k, v in s.items()
    if re.fullmatch(
      r'rouge1@data=\w+,layer=(5|10|15|20|25|30),method=(bei|hei)', k
    )
  ]
  assert len(deep) == 36 and max(deep) < 0.1
  others = [r1(d, m) for d in ('wikitext', 'sms') for m in ('ep', 'ep_skip')]
  return [
    'HEI at layer 0 recovers the text (f1 = 1.0)',
    '< 0.1 ROUGE-1 at layers 5 to 30',
    f'ROUGE-1 {r1("enron", "ep"):.2f} (ep) and {r1("enron", "ep_skip"):.2f}'
    f' (ep_skip) on held-out Enron, {span(others, "", ".2f")} on WikiText-2'
    ' and SMS',
  ]


@check('embed_parrot_pretrained')
def _embed_parrot_pretrained():
  total, devices = [], set()
  for layer in (10, 20, 25, 30):
    folder = f'embed_parrot/pretrained/layer_{layer}'
    total.append(load(folder, 'timings.json')['seconds_total'])
    devices.add(
      load(folder, 'provenance.json')['environment']['devices']['kind']
    )
  assert devices == {'NVIDIA H200'}
  return [f'on one H200 a layer took {span(total)}']


def cells(report: str) -> tuple[int, int]:
  """(layers x corpora x perturbations, test sentences) of REPORT's run."""
  cfg = load(report, 'config.json')
  n = len(cfg['layers']) * len(cfg['corpora']) * len(cfg['perturbations'])
  return n, cfg['num_test']


def per_sentence(report: str, deep: bool = True) -> list[float]:
  """Seconds per sentence of the exact search (past layer 0 when deep)."""
  return [
    r['seconds_per_sentence']
    for r in rows(report, attack='exact')
    if not deep or r['layer'] != '0'
  ]


@check('inversion_exact')
def _inversion_exact():
  n, k = cells('inversion_exact')
  assert load('inversion_exact', 'facts.json')['device'] == 'cpu'
  secs = load('inversion_exact', 'facts.json')['seconds']
  return [
    f'{n} cells of {k} sentences; {minutes(secs)} on a 2-core CPU',
    f'the exact search {span(per_sentence("inversion_exact"), " s", ".1f")}'
    ' a sentence past layer 0',
  ]


@check('inversion_exact_quick')
def _inversion_exact_quick():
  secs = load('inversion_exact/quick', 'facts.json')['seconds']
  return [f'about {secs / 60:.0f} minutes', f'facts.json: {secs:.0f} s,']


def _perturbed_run(report: str) -> list[str]:
  """Cells, run time and seconds a sentence of a layer-25 run."""
  n, k = cells(report)
  assert load(report, 'facts.json')['device'] == 'cpu'
  secs = load(report, 'facts.json')['seconds']
  return [
    f'{n} cells of {k} sentences; {minutes(secs)} on a 2-core CPU',
    f'{span(per_sentence(report), " s", ".1f")} a sentence',
  ]


@check('inversion_exact_robust')
def _inversion_exact_robust():
  return _perturbed_run('inversion_exact/robust')


@check('inversion_exact_robust_unbounded')
def _inversion_exact_robust_unbounded():
  report = 'inversion_exact/robust/unbounded'
  n, k = cells(report)
  assert load(report, 'facts.json')['device'] == 'cpu'
  searches = rows(report, attack='exact')
  int8 = [
    r['seconds_per_sentence'] for r in searches if r['perturbation'] == 'int8'
  ]
  rest = [
    r['seconds_per_sentence'] for r in searches if r['perturbation'] != 'int8'
  ]
  return [
    f"{n} cells of {k} sentences; the attacks' rows add up to"
    f' {minutes(sum(seconds(report)))} on a 2-core CPU',
    f'{span(rest, " s", ".1f")} a sentence, {span(int8, " s", ".1f")} under int8',
  ]


@check('inversion_exact_noise')
def _inversion_exact_noise():
  return _perturbed_run('inversion_exact/noise')


# ------------------------------------------------------------------- tests


@pytest.mark.parametrize('name', sorted(CHECKS))
def test_header_quotes_its_report(name):
  head = header(name)
  for text in CHECKS[name]():
    assert text in head, (name, text)


# A time or memory size, a perplexity, a score with two or three decimals,
# an "N of M" count.
MEASURED = re.compile(
  r'\d[\d,.]*(?:\s*(?:[-/]|and)\s*\d[\d,.]*)*\s?'
  r'(?:s|min|minutes|h|hours|GB|GiB|MB|MiB)\b'
  r'|(?:perplexity|ppl) ~?\d[\d,]*(?:\.\d+)?'
  r'|(?<![\w.])\d\.\d{2,3}(?![\w.])'
  r'|\b\d+ of \d+\b'
)


@pytest.mark.parametrize('path', FLAGFILES, ids=lambda p: p.stem)
def test_measured_numbers_are_checked(path):
  name = path.stem
  head = header(name)
  covered = np.zeros(len(head), bool)
  for text in CHECKS[name]() if name in CHECKS else ():
    start = head.find(text)
    while start >= 0:
      covered[start : start + len(text)] = True
      start = head.find(text, start + 1)
  settings = flag_lines(name)
  loose = [
    m.group(0)
    for m in MEASURED.finditer(head)
    if not covered[m.start() : m.end()].all()
    and not re.search(rf'(?<![\d.]){re.escape(m.group(0))}(?![\d.])', settings)
  ]
  assert not loose, (name, loose)


def test_every_check_names_a_flagfile():
  assert set(CHECKS) <= {p.stem for p in FLAGFILES}
