"""The numbers in the FILM reports' READMEs come from their committed files.

Each check formats values of a committed `summary.json`, `results.jsonl`,
`config.json`, `summary.md` header (the attacked model's step and eval
perplexity), `profile.json` or study JSON the way the README writes them
and looks for that text in the README, so a regenerated report that moves a
number fails here until the README follows. Every `python -m
experiments.film` command a README shows parses to the `config.json` of the
run it describes.
"""

import dataclasses
import inspect
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

from experiments import film as film_exp
from experiments import film_tables
from leakjax import runtime as stages
from leakjax.attacks.film import presets, runner, training
from leakjax.models import gpt2
from leakjax.recovery import bag as bow
from leakjax.tokenization import gpt2_tokenizer

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / 'reports'
PAPER = {**film_tables.PAPER_TABLE10_ENRON, **film_tables.PAPER_TABLE9_ENRON}
# The paper's protocol (Sec. 6.1, Table 10), as leakjax's `paper` preset.
PROTOCOL = presets.PAPER_FIELDS


def text(report: str) -> str:
  """reports/REPORT/README.md with its whitespace folded."""
  return ' '.join((REPORTS / report / 'README.md').read_text('utf-8').split())


def load(report: str, name: str):
  return json.loads((REPORTS / report / name).read_text())


def rows(report: str) -> list[dict]:
  lines = (REPORTS / report / 'results.jsonl').read_text().splitlines()
  return [json.loads(line) for line in lines if line.strip()]


def header(report: str) -> dict:
  """What summary.md's first paragraph says of the attacked model."""
  md = (REPORTS / report / 'summary.md').read_text('utf-8')
  m = re.search(
    r'fine-tuned for t = (\d+) steps( \(early stopping\))?'
    r'(?:, attacked at step (\d+) \(lowest eval loss\))?'
    r' on (\d+) private sentences(?: \(eval perplexity ([\d.]+)\))?',
    md,
  )
  assert m, report
  return {
    'steps': int(m.group(1)),
    'stopped_early': bool(m.group(2)),
    'attacked_step': int(m.group(3)) if m.group(3) else None,
    'num_train': int(m.group(4)),
    'eval_ppl': m.group(5),
  }


def pm(s: dict, metric: str, key: str) -> str:
  return f'{s[f"{metric}@{key}"]:.2f} ± {s[f"{metric}_std@{key}"]:.2f}'


def bag(s: dict, key: str) -> str:
  return f'{s[f"bag_precision@{key}"]:.3f} / {s[f"bag_recall@{key}"]:.3f}'


def seconds(report: str, b: int | None = None) -> list[float]:
  """Gradient + attack seconds of each attacked batch (at b)."""
  return [
    r['grad_seconds'] + r['attack_seconds']
    for r in rows(report)
    if b is None or r['b'] == b
  ]


def kernels() -> dict:
  """benchmarks/results/film_kernels.json: SmolLM2-135M's parameter count."""
  path = ROOT / 'benchmarks' / 'results' / 'film_kernels.json'
  out = json.loads(path.read_text())
  assert out['model'] == 'smollm2-135m'
  return out


def held_out(cfg: dict) -> int:
  return round(cfg['max_sentences'] * cfg['eval_fraction'])


def nerr_batches(report: str, b: int) -> int:
  return sum(r['nerr'] is not None for r in rows(report) if r['b'] == b)


# README -> the report folder of each `python -m experiments.film` command it
# shows, in order.
COMMANDS = {
  'film_enron': [
    'film_enron',
    'film_enron/test',
    'film_enron/fixed_2_epochs',
    'film_enron/attack_best',
    'film_enron/b1_beam32_reorder',
  ],
  'film_enron/more_data': ['film_enron/more_data'],
  'film_enron/multi_sentence': ['film_enron/multi_sentence'],
  'film_bag': ['film_bag'],
  'film_bag/defenses': ['film_bag/defenses'],
  'film_freeze': ['film_freeze', 'film_freeze/sentence_ends'],
  'film_utility': [
    'film_utility',
    'film_utility/enron',
    'film_utility/scratch',
    'film_utility/enron_scratch',
    'film_utility/dp_sigma',
  ],
  'film_quickstart': ['film_quickstart', 'film_quickstart'],
}


def commands(report: str) -> list[list[str]]:
  """The flags of each experiments.film command in the README."""
  raw = (REPORTS / report / 'README.md').read_text('utf-8')
  raw = raw.replace('\\\n', ' ')
  pattern = r'python3? (?:-u )?-m experiments\.film((?:\s+--[^\s`|]+)+)'
  return [m.group(1).split() for m in re.finditer(pattern, raw)]


@pytest.mark.parametrize('report', sorted(COMMANDS))
def test_commands_parse_to_the_committed_configs(fresh_flags, report):
  found = commands(report)
  assert len(found) == len(COMMANDS[report]), (report, found)
  film_exp.define_flags()
  for argv, folder in zip(found, COMMANDS[report]):
    fresh_flags.unparse_flags()
    fresh_flags(['prog', *argv])
    cfg = film_exp.config_from_flags()
    for name, value in load(folder, 'config.json').items():
      got = getattr(cfg, name)
      got = list(got) if isinstance(got, tuple) else got
      got = None if got == math.inf else got
      assert got == value, (report, folder, name, got, value)


def test_film_enron_report():
  t, s, cfg = text('film_enron'), load('film_enron', 'summary.json'), None
  cfg = load('film_enron', 'config.json')
  for b in cfg['batch_sizes']:
    k = f'b={b}'
    n = nerr_batches('film_enron', b)
    nerr = f'{s[f"nerr@{k}"]:.2f}'
    if n < cfg['num_batches']:
      nerr += f' ({n} batches)'
    line = (
      f'| {b} | {pm(s, "rouge1", k)} | {pm(s, "rouge2", k)} |'
      f' **{pm(s, "rougeL", k)}** | {PAPER[b][2]:.2f} | {nerr} |'
      f' {bag(s, k)} |'
    )
    assert line in t, line
    assert s[f'rougeL@{k}'] > PAPER[b][2]
  assert f'mean ± std over {cfg["num_batches"]} batches' in t
  p = [s[f'bag_precision@b={b}'] for b in (16, 64, 128)]
  assert f'Bag precision is {min(p):.3f}-{max(p):.3f} at b ≥ 16' in t
  r = [s[f'bag_recall@b={b}'] for b in (1, 128)]
  assert f'Bag recall falls with b ({r[0]:.2f} → {r[1]:.2f})' in t
  dim = load('film_bag/defenses', 'dp_bound.json')['dim']
  assert f'the width d = {dim}' in t
  # Set-up: the config and the attacked model.
  n_eval = held_out(cfg)
  n_train = cfg['max_sentences'] - n_eval
  h = header('film_enron')
  assert h['num_train'] == n_train and h['stopped_early']
  assert f'The first {cfg["max_sentences"]} are kept: {n_eval} held out' in t
  assert f'{n_train} private training sentences' in t
  assert f"{n_train} of the paper's Enron sentences" in t
  epoch = n_train // cfg['train_batch_size']
  assert epoch == cfg['eval_every']
  assert (
    f'batch {cfg["train_batch_size"]}, AdamW at lr'
    f' {cfg["learning_rate"]:.0e}'.replace('e-0', 'e-')
    in t
  )
  assert f'over at most {cfg["train_steps"]} steps' in t
  assert f'evaluated every epoch ({epoch} steps)' in t
  assert (
    f'It stopped at t = {h["steps"]} (eval perplexity {h["eval_ppl"]},' in t
  )
  assert f'beam search with {cfg["num_beams"][0]} beams over the' in t
  assert f'{cfg["max_prompts"]} likeliest capitalised start words' in t
  assert f'bigram ban, {cfg["length"]} tokens' in t and cfg['ngram_size'] == [2]
  assert f'β = {cfg["beta"][0]:g})' in t
  assert cfg['phrase_steps'] == cfg['token_steps'] == 0
  assert f'{cfg["num_batches"]} client batches per b' in t
  total = sum(seconds('film_enron'))
  one, big = seconds('film_enron', 1), seconds('film_enron', 128)
  assert (
    f'the {len(rows("film_enron"))} attacks took {total / 60:.0f} min in all'
    in t
  )
  assert f'{min(one):.0f}-{max(one):.0f} s a batch at b = 1' in t
  assert f'{min(big):.0f}-{max(big):.0f} s at b = 128' in t


def test_film_enron_test_split():
  # The stopping rule's dev batches (0-19) beside its test batches (20-39):
  # the same recipe, only the batches and the split record differ.
  t = text('film_enron')
  dev, test = (
    load('film_enron', 'config.json'),
    load('film_enron/test', 'config.json'),
  )
  assert (dev['split'], test['split']) == ('dev', 'test')
  assert (dev.get('first_batch', 0), test['first_batch']) == (0, 20)
  # Fields the dev run predates are at their defaults, the preset aside.
  default = {f.name: f.default for f in dataclasses.fields(runner.FilmConfig)}
  moved = {k for k in test if test[k] != dev.get(k, default[k])}
  assert moved == {'split', 'first_batch', 'preset'}, moved
  assert test['preset'] == 'paper'
  batches = sorted({r['batch'] for r in rows('film_enron/test')})
  assert batches == list(range(20, 40))
  d, s = (
    load('film_enron', 'summary.json'),
    load('film_enron/test', 'summary.json'),
  )
  for b in test['batch_sizes']:
    k = f'b={b}'
    line = (
      f'| {b} | {pm(d, "rougeL", k)} | {pm(s, "rougeL", k)} | {bag(s, k)} |'
    )
    assert line in t, line
    assert abs(s[f'rougeL@{k}'] - d[f'rougeL@{k}']) < d[f'rougeL_std@{k}']
  assert 'within one standard deviation of the dev numbers at every b' in t
  higher = [b for b in (16, 64) if s[f'rougeL@b={b}'] > d[f'rougeL@b={b}']]
  assert higher == [16, 64] and s['rougeL@b=128'] < d['rougeL@b=128']
  h, hd = header('film_enron/test'), header('film_enron')
  assert h['steps'] == hd['steps'] == 180 and h['stopped_early']
  assert (
    f'stopped at t = {h["steps"]} again, at eval perplexity {h["eval_ppl"]}'
    f" against the dev run's {hd['eval_ppl']}" in t
  )
  cpu = load('film_enron/test', 'provenance.json')['environment']['cpu']
  assert 'Intel' in cpu['model'] and 'avx512f' in cpu['vector']
  assert not (REPORTS / 'film_enron/provenance.json').exists()


def test_film_enron_scope(fresh_flags):
  # What the run covers, and the full protocol it was reduced from.
  t, cfg = text('film_enron'), load('film_enron', 'config.json')
  sizes = cfg['batch_sizes']
  assert f'at b = {", ".join(map(str, sizes[:-1]))} and {sizes[-1]}' in t
  assert (
    f'for up to {PROTOCOL["train_steps"]:,} iterations at lr'
    f' {PROTOCOL["learning_rate"]:.0e}'.replace('e-0', 'e-')
    in t
  )
  film_exp.define_flags()
  fresh_flags(['prog', '--flagfile=experiments/configs/film_enron.flags'])
  full = film_exp.config_from_flags()
  assert full.max_sentences is None  # all of the paper's sentences
  assert (
    f"(all of the paper's sentences, {full.num_beams[0]} beams,"
    f' {full.max_prompts} prompts, {full.phrase_steps} + {full.token_steps}'
    ' reordering steps)' in t
  )
  fixed = load('film_enron/fixed_2_epochs', 'config.json')
  assert (
    f'the same as with {fixed["num_beams"][0]} beams, {fixed["max_prompts"]}'
    ' prompts and truncation only' in t
  )
  assert fixed['phrase_steps'] == fixed['token_steps'] == 0
  multi = load('film_enron/multi_sentence', 'config.json')
  assert (
    f'b = {multi["batch_sizes"][0]}, {multi["num_batches"]} batches,'
    f' {multi["repetitions"]} repetitions of the beam search' in t
  )


def test_film_enron_ablations():
  t = text('film_enron')
  main, cfg = (
    load('film_enron', 'summary.json'),
    load('film_enron', 'config.json'),
  )
  # Fixed 2 epochs.
  fixed = load('film_enron/fixed_2_epochs', 'summary.json')
  fixed_cfg = load('film_enron/fixed_2_epochs', 'config.json')
  h = header('film_enron/fixed_2_epochs')
  assert h['steps'] == fixed_cfg['train_steps'] and not h['stopped_early']
  epochs = fixed_cfg['train_steps'] // cfg['eval_every']
  assert (
    f'fixed {fixed_cfg["train_steps"]} steps ({epochs} epochs, lr decayed to'
    f' 0 at step {fixed_cfg["train_steps"]}; eval perplexity {h["eval_ppl"]})'
    in t
  )
  for b in cfg['batch_sizes']:
    k = f'b={b}'
    line = (
      f'| {b} | {pm(main, "rougeL", k)} | {pm(fixed, "rougeL", k)} |'
      f' {bag(fixed, k)} |'
    )
    assert line in t, line
  p = min(fixed[f'bag_precision@b={b}'] for b in cfg['batch_sizes'])
  assert f'Bag precision is {math.floor(p * 1000) / 1000:.3f} or more' in t
  # Early stopping trained one epoch more.
  assert (
    header('film_enron')['steps'] - fixed_cfg['train_steps']
    == (cfg['eval_every'])
  )
  assert 'trains one epoch more' in t
  # The lowest-loss model of the same run.
  best = load('film_enron/attack_best', 'summary.json')
  h = header('film_enron/attack_best')
  # Patience 1: the best model is the evaluation before the one that rose.
  assert cfg['early_stopping_patience'] == 1
  assert h['attacked_step'] == header('film_enron')['steps'] - cfg['eval_every']
  assert f'(t = {h["attacked_step"]}, eval perplexity {h["eval_ppl"]})' in t
  assert (
    f'ROUGE-L **{pm(best, "rougeL", "b=1")} / {pm(best, "rougeL", "b=16")}**'
    f' at b = 1 / 16 (bag P / R {bag(best, "b=1")}, {bag(best, "b=16")})' in t
  )
  assert f"above the paper's {PAPER[1][2]:.2f} / {PAPER[16][2]:.2f}" in t
  # More data.
  more = load('film_enron/more_data', 'summary.json')
  more_cfg = load('film_enron/more_data', 'config.json')
  assert more_cfg['max_sentences'] == 4 * cfg['max_sentences']
  assert (
    f'({more_cfg["max_sentences"]:,} kept,'
    f' {more_cfg["max_sentences"] - held_out(more_cfg):,} private)' in t
  )
  assert (
    f'ROUGE-L **{pm(more, "rougeL", "b=1")} / {pm(more, "rougeL", "b=16")}'
    ' at b = 1 / 16**' in t
  )
  # Beam 32, 64 prompts and reordering at b = 1.
  b1 = load('film_enron/b1_beam32_reorder', 'summary.json')
  assert (
    f'ROUGE-L {pm(b1, "rougeL", "b=1")}, the same as with 16 beams, 32'
    f' prompts and truncation only ({pm(fixed, "rougeL", "b=1")})' in t
  )
  # Multi-sentence: the k = 1 / 5 / 10 / 20 figures.
  multi = load('film_enron/multi_sentence', 'summary.json')
  parts = []
  for k in (1, 5, 10, 20):
    r = multi[f'multi_recall@b=16,iter={k}']
    p = multi[f'multi_precision@b=16,iter={k}']
    cell = f'{r:.2f} / {p:.2f} ({"k = 1" if k == 1 else k})'
    parts.append(f'**{cell}**' if k == 20 else cell)
  assert ', '.join(parts) in t
  paper = film_tables.PAPER_TABLE3[20]
  assert f'has {paper[0]:.2f} / {paper[1]:.2f} at k = 20' in t


def test_more_data_report():
  t = text('film_enron/more_data')
  s = load('film_enron/more_data', 'summary.json')
  cfg = load('film_enron/more_data', 'config.json')
  base = load('film_enron', 'summary.json')
  for b in cfg['batch_sizes']:
    k = f'b={b}'
    n = nerr_batches('film_enron/more_data', b)
    nerr = f'{s[f"nerr@{k}"]:.2f}'
    if n < cfg['num_batches']:
      nerr += f' ({n} batches)'
    line = (
      f'| {b} | {pm(s, "rouge1", k)} | {pm(s, "rouge2", k)} |'
      f' **{pm(s, "rougeL", k)}** | {PAPER[b][2]:.2f} |'
      f' {pm(base, "rougeL", k)} | {nerr} | {bag(s, k)} |'
    )
    assert line in t, line
  r = {b: (base[f'rougeL@b={b}'], s[f'rougeL@b={b}']) for b in (1, 16)}
  assert (
    f'from {r[1][0]:.2f} to {r[1][1]:.2f} at b = 1 and from'
    f' {r[16][0]:.2f} to {r[16][1]:.2f} at b = 16' in t
  )
  stderr = s['rougeL_std@b=1'] / math.sqrt(cfg['num_batches'])
  assert abs(r[1][1] - PAPER[1][2]) < stderr
  assert (
    f'{r[1][1]:.2f} vs {PAPER[1][2]:.2f}, well within one standard error,'
    f' {stderr:.2f})' in t
  )
  assert f'Mean ± std over {cfg["num_batches"]} batches' in t
  main = load('film_enron', 'config.json')
  assert cfg['max_sentences'] == 4 * main['max_sentences'] and '4x' in t
  assert cfg['num_beams'] == main['num_beams'] == [16]
  assert cfg['max_prompts'] == main['max_prompts'] == 32
  assert '16 beams, 32 prompts, truncation only' in t
  n_eval = held_out(cfg)
  n_train = cfg['max_sentences'] - n_eval
  assert f'first {cfg["max_sentences"]:,} of the paper' in t
  assert (
    f'instead of {load("film_enron", "config.json")["max_sentences"]})' in t
  )
  assert f'Of the {cfg["max_sentences"]:,} sentences {n_eval} are held out' in t
  assert f'and {n_train:,} are private' in t
  epoch = n_train // cfg['train_batch_size']
  assert epoch == cfg['eval_every']
  assert f'one epoch is {epoch} steps of batch {cfg["train_batch_size"]}' in t
  h = header('film_enron/more_data')
  assert h['stopped_early'] and h['num_train'] == n_train
  assert h['steps'] == 2 * epoch
  assert (
    f'ended the fine-tuning at t = {h["steps"]}, two epochs (eval perplexity'
    f' {h["eval_ppl"]},' in t
  )
  n = len(rows('film_enron/more_data'))
  total = sum(seconds('film_enron/more_data'))
  assert f'The {n} attacks took {total / 60:.0f} min in all' in t


def test_multi_sentence_report():
  t = text('film_enron/multi_sentence')
  s = load('film_enron/multi_sentence', 'summary.json')
  cfg = load('film_enron/multi_sentence', 'config.json')
  by = rows('film_enron/multi_sentence')
  assert len(by) == cfg['num_batches'] and cfg['repetitions'] == 20
  for k in (1, 5, 10, 20):
    r = np.array([x['multi_by_iter'][str(k)]['recall'] for x in by])
    p = np.array([x['multi_by_iter'][str(k)]['precision'] for x in by])
    assert r.mean() == pytest.approx(s[f'multi_recall@b=16,iter={k}'])
    assert p.mean() == pytest.approx(s[f'multi_precision@b=16,iter={k}'])
    cells = [
      f'{r.mean():.2f} ± {r.std():.2f}',
      f'{p.mean():.2f} ± {p.std():.2f}',
    ]
    if k == 20:
      cells = [f'**{c}**' for c in cells]
    paper = film_tables.PAPER_TABLE3[k]
    line = f'| {k} | {" | ".join(cells)} | {paper[0]:.2f} / {paper[1]:.2f} |'
    assert line in t, line
  recovered = round(s['multi_recall@b=16,iter=20'] * 16)
  assert f'about {recovered} of 16 sentences are partly recovered' in t
  p3 = film_tables.PAPER_TABLE3
  assert (
    f'(the paper: {p3[20][0]:.2f} after 20, {p3[100][0]:.2f} after 100' in t
  )
  total = sum(seconds('film_enron/multi_sentence'))
  assert f'The {len(by)} attacks took {total / 60:.0f} min in all' in t
  main = load('film_enron', 'config.json')
  assert f"The first {len(by)} of the main run's {main['num_batches']}" in t
  assert f'our {main["max_sentences"] - held_out(main)}-sentence' in t


def test_film_bag_report():
  t = text('film_bag')
  s = load('film_bag', 'summary.json')
  cfg = load('film_bag', 'config.json')
  by = rows('film_bag')
  dim = load('film_bag/defenses', 'dp_bound.json')['dim']
  distinct = {}
  for b in cfg['batch_sizes']:
    tied = [r for r in by if r['b'] == b and r['method'] == 'tied']
    assert len(tied) == cfg['num_batches']
    distinct[b] = statistics.mean(r['true_bag_size'] for r in tied)
    # The span test is valid exactly below the width.
    assert all(r['span_valid'] == (b <= 16) for r in tied)
    cells = [
      bag(s, f'b={b},method={m}') for m in ('tied', 'norm', 'norm_oracle')
    ]
    line = (
      f'| {b} | {distinct[b]:,.0f} | **{cells[0]}** | {cells[1]} | {cells[2]} |'
    )
    assert line in t, line
  assert f'({cfg["num_batches"]} Enron batches each)' in t
  assert f'mean over {cfg["num_batches"]} batches' in t
  assert f'(distinct inputs < d = {dim})' in t
  assert max(distinct[b] for b in (1, 4, 16)) < dim < distinct[64]
  assert f'({distinct[64]:,.0f} and {distinct[128]:,.0f} distinct tokens' in t
  r = joined3(s[f'bag_recall@b={b},method=tied'] for b in (64, 128))
  assert f'recall drops to {r} at precision 1.000' in t

  def f1(b, m):
    p = s[f'bag_precision@b={b},method={m}']
    r = s[f'bag_recall@b={b},method={m}']
    return 2 * p * r / (p + r)

  tied_f1 = joined3(f1(b, 'tied') for b in (64, 128))
  oracle_f1 = joined3(f1(b, 'norm_oracle') for b in (64, 128))
  assert f'in F1 ({tied_f1} vs {oracle_f1})' in t
  assert all(
    s[f'bag_recall@b={b},method=tied'] >= 0.99
    and s[f'bag_precision@b={b},method=tied'] >= 0.99
    for b in (1, 4, 16)
  )
  z = inspect.signature(bow.extract_bag).parameters['baseline_z'].default
  assert (
    f'norm (z > {z:g})' in t and f'(robust z > {z:g} on log row norms)' in t
  )
  assert f'first {cfg["max_sentences"]:,} of the paper' in t
  assert cfg['train_steps'] == 0 and 'SmolLM2-135M (t = 0)' in t
  grads = {
    (r['b'], r['batch']): r['grad_seconds'] for r in by if 'grad_seconds' in r
  }
  total = sum(grads.values()) + sum(r.get('bag_seconds') or 0 for r in by)
  assert f'took {total / 60:.0f} min in all' in t


def test_film_bag_microbatch_default(fresh_flags):
  film_exp.define_flags()
  default = fresh_flags['grad_microbatch'].default
  assert f'`--grad_microbatch` (default {default};' in text('film_bag')


def joined3(values) -> str:
  return ' / '.join(f'{v:.3f}' for v in values)


def test_film_defenses_report():
  # The numbers of reports/film_bag/defenses/README.md that
  # tests/readme_numbers_test.py does not check.
  here = 'film_bag/defenses'
  t, s, cfg = text(here), load(here, 'summary.json'), load(here, 'config.json')
  sigma = load(here, 'dp_sigma.json')
  bound = load(here, 'dp_bound.json')
  pooled = load(here, 'dp_pooled.json')
  paper = film_tables.PAPER_TABLE4
  for spec in cfg['defenses']:
    if spec == 'none':
      label, cells = 'none', ['-', bag(s, 'b=16,defense=none,method=tied'), '-']
    elif spec.startswith('prune'):
      label = f'prune {spec.split(":")[1]}'
      cells = [
        bag(s, f'b=16,defense={spec},method={m}') for m in ('nonzero', 'tied')
      ]
      cells.append('-')
    else:
      label = f'DP-SGD ε = {spec.split(":")[1]}'
      cells = ['-', '-', bag(s, f'b=16,defense={spec},method=dp')]
    line = (
      f'| {label} | {" | ".join(cells)} |'
      f' {paper[spec][0]:.2f} / {paper[spec][1]:.2f} |'
    )
    assert line in t, line
  n = cfg['num_batches']
  assert f'{n} Enron batches' in t and f'mean over {n} batches' in t
  b = cfg['batch_sizes'][0]
  n_sentences = cfg['max_sentences']
  assert f'first {n_sentences:,} of the paper' in t
  assert all(r['sampling_rate'] == b / n_sentences for r in sigma)
  assert all(r['steps'] == 1 and r['delta'] == cfg['dp_delta'] for r in sigma)
  assert t.count(f'sampling rate {b}/{n_sentences:,}') == 2
  assert f'δ = {cfg["dp_delta"]:.0e}'.replace('e-0', 'e-') in t
  assert f'norm C = {cfg["dp_clip"]:g} ' in t
  sigmas = ' / '.join(f'{r["sigma"]:.3f}' for r in sigma)
  epsilons = ' / '.join(f'{r["epsilon"]:g}' for r in sigma)
  assert f'(σ = {sigmas} for ε = {epsilons};' in t
  dim, vocab = bound['dim'], bound['vocab']
  assert f'd = {dim})' in t
  # Pruning, tied head.
  key = 'b=16,defense=prune:{},method={}'
  p = [s['bag_precision@' + key.format(q, 'nonzero')] for q in ('0.9', '0.99')]
  assert f'(precision {min(p):.3f}-{max(p):.3f})' in t
  p = [
    s['bag_precision@' + key.format(q, 'nonzero')] for q in ('0.999', '0.9999')
  ]
  assert f'(precision {p[0]:.2f} / {p[1]:.2f})' in t
  prunes = [d.split(':')[1] for d in cfg['defenses'] if d.startswith('prune')]
  p = [
    s['bag_precision@' + key.format(q, 'tied')] for q in prunes if q != '0.99'
  ]
  r = [s['bag_recall@' + key.format(q, 'tied')] for q in prunes]
  assert f'keeps precision {min(p):.2f}-{max(p):.2f} where' in t
  assert f'with recall {min(r):.2f}-{max(r):.2f}' in t
  r = min(s['bag_recall@' + key.format(q, 'nonzero')] for q in prunes)
  assert f'Recall of the non-zero rule stays ≥ {r:.3f}' in t
  # DP-SGD: the threshold's own false-positive rate.
  dp = [x for x in rows(here) if x['method'] == 'dp']
  size = statistics.mean(x['bag_size'] for x in dp)
  assert f'Bags hold ~{round(size, -2):,.0f} of the {vocab:,} tokens' in t
  assert f'({100 * size / vocab:.1f} %) at every ε' in t
  tau = math.sqrt(2 * math.log(dim))
  tail = math.erfc(tau / math.sqrt(2))  # P(|x| > τ) of one entry
  rate = 1 - (1 - tail) ** dim
  assert f'√(2 log d) = {tau:.2f} σ with probability {100 * rate:.1f} %' in t
  assert abs(rate - size / vocab) < 0.005
  noise = [r['noise_std'] for r in sigma]
  assert all(
    math.isclose(r['noise_std'], r['sigma'] / b, rel_tol=1e-6) for r in sigma
  )
  assert f'(σ_eff = {min(noise):.3f}-{max(noise):.3f} per coordinate)' in t
  millions = kernels()['model_params'] / 1e6
  assert f'the whole {millions:.0f}M-parameter per-example gradient' in t
  assert f'all {millions:.0f} M parameters' in t
  gpt2_vocab = gpt2_tokenizer().vocab_size
  assert f'GPT-2 with a {gpt2_vocab / 1000:.0f}K vocabulary' in t
  assert f'on a {vocab / 1000:.0f}K vocabulary' in t
  # Untied head: what 0.9999 keeps of the embedding tensor.
  untied = load(here, 'untied.json')
  entries = vocab * dim
  kept = entries * (1 - 0.9999)
  rows_in = untied['mean']['none']['bag_size']
  assert (
    f'keeps {100 * (1 - 0.9999):.2f} % of the {entries / 1e6:.1f} M entries'
    f' of the embedding tensor, about {round(kept, -2):,.0f}, spread over'
    f' ~{round(rows_in, -1):.0f} input rows of {dim} entries each' in t
  )
  # The bounds: how much less noise the oracles need than ε = 15 gives.
  run = next(r['sigma'] for r in sigma if r['epsilon'] == 15)
  row = next(r for r in bound['paper_rows'] if r['epsilon'] == 15)
  whole = next(r for r in pooled['paper_rows'] if r['epsilon'] == 15)
  row_x = run / row['matched_largest_sigma']
  whole_x = run / whole['largest_sigma']
  assert (
    f'about {row_x:.0f}x less noise than ε = 15 gives (σ = {run:.3f} against'
    f' {row["matched_largest_sigma"]:.3f})' in t
  )
  assert f'ε ≈ {row["matched_epsilon_needed"]:,.0f} for this sampling' in t
  assert (
    f'needs {whole_x:.0f}x less noise than ε = 15 gives (σ = {run:.3f}'
    f' against {whole["largest_sigma"]:.3f}), where the row oracle needs'
    f' {row_x:.0f}x less' in t
  )
  assert f'at least {whole_x:.0f}x less noise per token' in t
  assert f'one threshold for all {vocab:,} rows' in t
  assert f'one threshold over all {vocab:,} rows' in t
  assert f'samples {pooled["types_per_batch"]} token types v' in t
  p5 = paper['dp:5']
  assert f'(precision {p5[0]:.2f} at recall {p5[1]:.2f}) is inside' in t


def test_film_freeze_report():
  t, s = text('film_freeze'), load('film_freeze', 'summary.json')
  cfg = load('film_freeze', 'config.json')
  by = rows('film_freeze')
  assert cfg['defenses'] == ['none', 'freeze'] and cfg['batch_sizes'] == [
    1,
    16,
    64,
  ]
  assert 'at b = 1, 16 and 64.' in t
  ends_s = load('film_freeze/sentence_ends', 'summary.json')
  ends_cfg = load('film_freeze/sentence_ends', 'config.json')
  # Like for like: the same run but the defenses and the sentence ends.
  differ = {k for k in cfg if cfg[k] != ends_cfg.get(k)}
  assert {'defenses', 'sentence_ends'} <= differ, differ
  assert differ <= {'defenses', 'sentence_ends', 'workdir'}, differ
  assert (cfg['sentence_ends'], ends_cfg['sentence_ends']) == (
    'silent',
    'always',
  )
  assert ends_cfg['defenses'] == ['none']
  for b in cfg['batch_sizes']:
    none, frozen = f'b={b},defense=none', f'b={b},defense=freeze'
    cells = [bag(s, none), bag(s, frozen), pm(s, 'rougeL', none)]
    cells.append(pm(ends_s, 'rougeL', f'b={b}'))
    rl = s[f'rougeL@{frozen}']
    cells.append(f'{rl:.2f}' if rl == 0 else pm(s, 'rougeL', frozen))
    assert f'| {b} | {" | ".join(cells)} |' in t, b
  r = lambda x: f'{x:.2f}'  # noqa: E731
  f1, f16 = (r(s[f'rougeL@b={b},defense=freeze']) for b in (1, 16))
  e1, e16 = (r(ends_s[f'rougeL@b={b}']) for b in (1, 16))
  n1, n16 = (r(s[f'rougeL@b={b},defense=none']) for b in (1, 16))
  assert (
    f'ROUGE-L {f1} against {e1} at b = 1, {f16} against {e16} at b = 16' in t
  )
  assert abs(float(f1) - float(e1)) <= 0.02 and f16 == e16
  assert f'as the paper sets it up ({n1} / {n16})' in t
  assert f'({r(ends_s["rougeL@b=64"])} with the sentence ends)' in t
  ends_rows = rows('film_freeze/sentence_ends')
  n = cfg['num_batches']
  assert f'({n} batches per b;' in t and f'then {n} client batches per b' in t
  assert (
    f"{n} batches per b instead of the paper's {PROTOCOL['num_batches']}" in t
  )
  # b = 1: the undefended bags that missed a token are the sentences that
  # run on; with the sentence ends every sentence ends.
  ends = ('.', '!', '?')
  plain = [r for r in by if r['b'] == 1 and r['defense'] == 'none']
  missed = [
    round(r['bag_recall'] * r['true_bag_size']) < r['true_bag_size']
    for r in plain
  ]
  run_on = [not r['recovered'][0].rstrip().endswith(ends) for r in plain]
  assert missed == run_on
  assert f'in {sum(missed)} of the {len(plain)} b = 1 bags' in t
  assert f'exactly those {sum(missed)} recovered sentences run on' in t
  frozen = [r for r in by if r['b'] == 1 and r['defense'] == 'freeze']
  added = [r for r in ends_rows if r['b'] == 1]
  for arm in (frozen, added):
    assert all(r['recovered'][0].rstrip().endswith(ends) for r in arm)
  assert (
    len(frozen) == len(added) and f'all {len(frozen)} end in both arms' in t
  )
  # b = 64: more distinct tokens than the width, every bag empty.
  dim = load('film_bag/defenses', 'dp_bound.json')['dim']
  wide = [r['true_bag_size'] for r in by if r['b'] == 64]
  assert min(wide) > dim
  assert (
    f"has {min(wide)}-{max(wide)} distinct tokens, more than SmolLM2's d = {dim}"
    in t
  )
  assert f'On this {dim}-wide model' in t
  empty = [r for r in by if r['b'] == 64 and r['defense'] == 'freeze']
  assert all(r['bag_size'] == 0 for r in empty)
  assert f'All {len(empty)} bags are empty' in t
  assert f'The undefended attack gets {s["rougeL@b=64,defense=none"]:.2f}' in t
  dager = load('dager/defenses', 'summary.json')
  cells = ' / '.join(
    f'{dager[f"rougeL@b={b},defense=freeze"]:.3f}' for b in (4, 16)
  )
  assert f'ROUGE-L {cells} at b = 4 / 16 with the embeddings frozen' in t
  assert f'at most {bow.TiedBagConfig().max_rank_fraction:g} d' in t
  # Set-up: the model, its stop, and the comparison with reports/film_enron.
  h, main = header('film_freeze'), header('film_enron')
  assert h['stopped_early'] and f'it stopped at t = {h["steps"]})' in t
  assert (
    f'eval perplexity {h["eval_ppl"]} here against {main["eval_ppl"]} there'
    in t
  )
  assert f'the first {cfg["max_sentences"]} of' in t
  assert f'batch {cfg["train_batch_size"]}, lr 1e-4' in t
  assert cfg['learning_rate'] == 1e-4
  assert (
    f'Beam {cfg["num_beams"][0]} over the {cfg["max_prompts"]} likeliest' in t
  )
  total = sum(seconds('film_freeze'))
  wide_s = statistics.mean(seconds('film_freeze', 64))
  assert (
    f'The {len(by)} attacks took {total / 60:.0f} min in all (gradient +'
    f' attack, summed over `results.jsonl`; b = 64: {wide_s:.0f} s a batch),'
    f' and the {len(ends_rows)} of `sentence_ends/`'
    f' {sum(seconds("film_freeze/sentence_ends")) / 60:.0f} min'
  ) in t


def test_film_utility_dp_sigma_section():
  t = text('film_utility')
  eps = {r['defense']: r for r in rows('film_utility')}
  by = {r['defense']: r for r in rows('film_utility/dp_sigma')}
  cfg, base_cfg = (
    load(f'film_utility{x}', 'config.json') for x in ('/dp_sigma', '')
  )
  # The same run but the defenses (fields added since are new keys).
  assert {k for k in base_cfg if cfg[k] != base_cfg[k]} <= {
    'defenses',
    'workdir',
  }
  none = by['none']
  assert none['perplexity'] == eps['none']['perplexity']
  assert none['final_train_loss'] == eps['none']['final_train_loss']
  assert (
    f'(perplexity {none["perplexity"]:.2f}; `final_train_loss`'
    f' {none["final_train_loss"]:.4f} in both)' in t
  )
  sigmas = [
    r['noise_multiplier'] for d, r in eps.items() if d.startswith('dp:')
  ]
  assert f'σ = {min(sigmas):.3f}-{max(sigmas):.3f} that the ε rows' in t
  specs = [d for d in cfg['defenses'] if d.startswith('dpsigma:')]
  for d in specs:
    r = by[d]
    assert r['noise_multiplier'] == float(d.split(':')[1])
    line = (
      f'| {d} | {r["noise_multiplier"]:.3f} | {r["perplexity"]:.2f} |'
      f' {r["perplexity"] / none["perplexity"]:.3f} |'
      f' {r["final_train_loss"]:.2f} |'
    )
    assert line in t, line
  clip = by['dpsigma:0']['perplexity'] / none['perplexity']
  assert f'C = 1 alone costs {100 * (clip - 1):.1f} %' in t
  low = by[specs[1]]['perplexity'] / none['perplexity']
  assert f'the smallest σ measured already gives {low:.1f}x' in t


def test_film_utility_report():
  t = text('film_utility')
  runs = {
    name: {r['defense']: r for r in rows(f'film_utility{name}')}
    for name in ('', '/enron', '/scratch', '/enron_scratch')
  }
  wt = runs['']
  cfg = load('film_utility', 'config.json')
  t4, t5 = film_tables.PAPER_TABLE4_PERPLEXITY, film_tables.PAPER_TABLE5
  base = wt['none']['perplexity']
  for spec, r in wt.items():
    sigma = r.get('noise_multiplier')
    ratio = f'{r["perplexity"] / base:.3f}' if spec != 'start' else '–'
    if spec == 'start':
      paper = '– | –'
    elif spec == 'freeze':
      cell = t5[('pretrained', 'freeze')]['wikitext']
      ratio5 = cell / t5[('pretrained', 'none')]['wikitext']
      paper = f'{cell:.2f} (Table 5) | {ratio5:.3f}'
    else:
      paper = f'{t4[spec]:.2f} | {t4[spec] / t4["none"]:.3f}'
    line = (
      f'| {spec} | {f"{sigma:.3f}" if sigma else "–"} |'
      f' {r["perplexity"]:.2f} | {ratio} | {paper} |'
    )
    assert line in t, line
  table5 = [
    ('pretrained', 'WikiText-2 (paper: WikiText-103)', '', 'wikitext'),
    ('pretrained', 'Enron', '/enron', 'enron'),
    ('scratch', 'WikiText-2 (paper: WikiText-103)', '/scratch', 'wikitext'),
    ('scratch', 'Enron', '/enron_scratch', 'enron'),
  ]
  ratios = {}
  for init, corpus, name, paper_corpus in table5:
    ours = [runs[name][d]['perplexity'] for d in ('none', 'freeze')]
    key = 'random' if init == 'scratch' else init
    theirs = [t5[(key, d)][paper_corpus] for d in ('none', 'freeze')]
    ratios[name] = (ours[1] / ours[0], theirs[1] / theirs[0])
    line = (
      f'| {init} | {corpus} | {ours[0]:.2f} | {ours[1]:.2f} |'
      f' {ours[1] / ours[0]:.3f} | {theirs[0]:.2f} | {theirs[1]:.2f} |'
      f' {theirs[1] / theirs[0]:.3f} |'
    )
    assert line in t, line
  # Wall time: the rows' seconds.
  minutes = lambda specs: [  # noqa: E731
    runs[n][d]['seconds'] / 60
    for n in ('', '/enron')
    for d in specs
    if d in runs[n]
  ]
  plain = minutes(('none', 'freeze'))
  prune = minutes([d for d in cfg['defenses'] if d.startswith('prune')])
  dp = minutes([d for d in cfg['defenses'] if d.startswith('dp')])
  assert (
    f'{min(plain):.0f}-{max(plain):.0f} min per undefended or frozen run from'
    f' the pretrained model, {min(prune):.0f} min per pruning run,'
    f' {min(dp):.0f}-{max(dp):.0f} min per DP-SGD run' in t
  )
  assert f'{min(prune):.0f}' == f'{max(prune):.0f}'
  # Set-up.
  n_test = held_out(cfg)
  assert (
    f'fine-tuned for t = {cfg["train_steps"]} steps of b ='
    f' {cfg["train_batch_size"]} sentences' in t
  )
  assert (
    f'the first {cfg["max_sentences"]:,} sentences (< {cfg["max_tokens"]} tokens'
    in t
  )
  assert f'{cfg["max_sentences"] - n_test:,} train, {n_test} test' in t
  assert cfg['learning_rate'] == 1e-4 and 'learning rate 1e-4' in t
  assert (
    f'from {wt["start"]["perplexity"]:.1f} to {base:.2f} on WikiText-2' in t
  )
  scratch_cfg = load('film_utility/scratch', 'config.json')
  tiny = gpt2.GPT2Config.tiny()
  assert scratch_cfg['model'] == 'gpt2-tiny' and scratch_cfg['init'] == 'random'
  assert f'a {tiny.n_layer}-layer GPT-2 with d = {tiny.n_embd}' in t
  assert (
    f'{scratch_cfg["train_steps"]} steps at'
    f' {scratch_cfg["learning_rate"]:.0e}'.replace('e-0', 'e-')
    in t
  )
  # What the gaps are.
  assert (
    f'{ratios[""][0]:.3f}x on WikiText-2 and {ratios["/enron"][0]:.3f}x on'
    f" Enron against the paper's {ratios[''][1]:.3f}x /"
    f' {ratios["/enron"][1]:.3f}x' in t
  )
  s1, s2 = ratios['/scratch'], ratios['/enron_scratch']
  assert (
    f'({s1[0]:.1f}x and {s2[0]:.1f}x against {s1[1]:.1f}x / {s2[1]:.1f}x)' in t
  )
  vocab = gpt2_tokenizer().vocab_size
  loss = [
    runs[n][d]['final_train_loss']
    for d in ('freeze', 'none')
    for n in ('/scratch', '/enron_scratch')
  ]
  assert f'{tiny.n_embd}-dimensional map over {vocab:,} tokens' in t
  assert (
    f'stays at {loss[0]:.2f} / {loss[1]:.2f} nats, near ln {vocab:,} ='
    f' {math.log(vocab):.2f}, while the trained runs reach {loss[2]:.2f} /'
    f' {loss[3]:.2f}' in t
  )
  assert f'{scratch_cfg["train_steps"]} steps of a d = {tiny.n_embd} model' in t
  pr = {q: wt[f'prune:{q}']['perplexity'] / base for q in ('0.9', '0.9999')}
  pp = {q: t4[f'prune:{q}'] / t4['none'] for q in ('0.9', '0.9999')}
  assert (
    f'(0.9: {pr["0.9"]:.2f}x against {pp["0.9"]:.2f}x; 0.9999:'
    f' {pr["0.9999"]:.2f}x against {pp["0.9999"]:.2f}x)' in t
  )
  assert f'In a {cfg["train_steps"]}-step budget' in t
  dp15 = wt['dp:15']
  assert (
    f'ε = 15 gives {dp15["perplexity"] / base:.2f}x where the paper reports'
    f' {t4["dp:15"] / t4["none"]:.2f}x' in t
  )
  sigma = dp15['noise_multiplier']
  noise = sigma * cfg['dp_clip'] / cfg['train_batch_size']
  params = kernels()['model_params']
  signal = cfg['dp_clip'] / math.sqrt(params)
  assert f'σ = {sigma:.3f} puts noise of std σC/b = {noise:.4f} on every' in t
  assert f'norm at most C = {cfg["dp_clip"]:g} over {params:,} coordinates' in t
  assert f'at most {signal:.1e} per coordinate'.replace('e-05', 'e-5') in t
  assert f'about {round(noise / signal, -1):.0f}x below the noise' in t
  step = [wt[d]['seconds'] / wt[d]['steps'] for d in wt if d.startswith('dp')]
  assert f'take {min(step):.0f}-{max(step):.0f} s a step here' in t
  assert f'δ = {cfg["dp_delta"]:.0e}'.replace('e-0', 'e-') in t


# The quickstart's profile run with the one-factor clip, and the runs of
# the programs kept, the GGUF reader and the small programs cached.
CLIPPED = 'after, one-factor clip'
KEPT = (
  'before, all programs released when b changes',
  'after, the gradient released when b changes',
  'after, the GGUF metadata read in one pass',
  'after, every program kept in the cache',
)
# The last run, on another CPU kind (AVX-512): compared with other_cpu/.
NARROWED = 'after, every reordering stage narrowed'


def _profile_row(run, *cells):
  """A profile table's row: the run, its wall, CPU and peak, then `cells`."""
  cpu = run['user_cpu_s'] + run['system_cpu_s']
  head = [run['run'], f'{run["wall_s"]} s', f'{cpu:.1f} s']
  return '| ' + ' | '.join([*head, f'{run["peak_rss_mib"]} MiB', *cells]) + ' |'


def test_film_quickstart_report():
  t = text('film_quickstart')
  s, cfg = (
    load('film_quickstart', 'summary.json'),
    load('film_quickstart', 'config.json'),
  )
  h = header('film_quickstart')
  assert h['steps'] == cfg['train_steps'] and not h['stopped_early']
  for b in cfg['batch_sizes']:
    k = f'b={b}'
    paper = f'{PAPER[b][2]:.2f}' + (' (Table 9)' if b == 4 else '')
    line = f'| {b} | {pm(s, "rougeL", k)} | {paper} | {bag(s, k)} |'
    assert line in t, line
  assert (
    f'after {cfg["train_steps"]} simulated-FL fine-tuning steps on the'
    f' {h["num_train"]} invented' in t
  )
  assert '(2 batches each)' in t and cfg['num_batches'] == 2
  assert f'mean ± std over {cfg["num_batches"]} batches' in t
  assert f'memorised {h["num_train"]} sentences, easy regime' in t
  assert (
    f'for up to {PROTOCOL["train_steps"]:,} iterations (Sec. 6.1),'
    f' {PROTOCOL["num_batches"]} batches per b' in t
  )
  assert f'Ours: {h["num_train"]} sentences the model has memorised after' in t
  assert f'{cfg["train_steps"]} steps, the easy regime' in t
  assert (
    f'fine-tuned for {cfg["train_steps"]} steps of {cfg["train_batch_size"]}'
    ' sentences' in t
  )
  assert f'beam search ({cfg["num_beams"][0]} beams)' in t
  assert f'({cfg["phrase_steps"]} + {cfg["token_steps"]} steps)' in t
  p = [s[f'bag_precision@b={b}'] for b in cfg['batch_sizes']]
  r = [s[f'bag_recall@b={b}'] for b in cfg['batch_sizes']]
  assert min(p) == max(p)
  assert f'bag precision {p[0]:.3f}, recall {min(r):.3f}-{max(r):.3f}' in t
  # Across CPUs: what provenance.json and profile.json record.
  env = load('film_quickstart', 'provenance.json')['environment']
  vector = ', '.join(v.upper() for v in env['cpu']['vector'])
  assert (
    f'the CPU, an {env["cpu"]["model"]}, and its vector extensions: {vector})'
    in t
  )
  profile = load('film_quickstart', 'profile.json')
  by = {r['run']: r for r in profile['runs']}
  names = [r['run'] for r in profile['runs']]
  cut = names.index(CLIPPED)
  same, later = profile['runs'][:cut], profile['runs'][cut + 1 : -1]
  last = profile['runs'][-1]
  assert all(r['summary_equal'] for r in same + later)
  assert not by[CLIPPED]['summary_equal']
  assert names[cut + 1 :] == [*KEPT, NARROWED]
  # Its summary_equal is against other_cpu/'s summary, as its note says.
  assert last['summary_equal'] and last['max_summary_diff'] == 0.0
  assert 'AVX-512' in last['note'] and 'other_cpu/summary.json' in last['note']
  assert (
    "The last, on an AMD EPYC with AVX-512, gave `other_cpu/`'s summary" in t
  )
  words = {4: 'four', 6: 'six'}
  assert f'the first {words[len(same)]} runs of `profile.json`, on one' in t
  assert f'and the {words[len(later)]} after it gave this summary' in t
  assert f'with {cfg["num_batches"]} batches per b, one batch' in t
  assert (
    f'(`profile.json`, its last run): {last["wall_s"]} s wall and'
    f' {last["peak_rss_mib"]} MiB peak memory' in t
  )
  # The profile: before and after.
  after = by['after']
  for label, name in (('before', 'before (idle)'), ('after', 'after')):
    r = by[name]
    cpu = r['user_cpu_s'] + r['system_cpu_s']
    line = (
      f'| {label} | {r["wall_s"]} s | {cpu:.1f} s | {r["peak_rss_mib"]} MiB |'
      f' {r["workdir_bytes"]} B | {r["longest_silence_s"]} s |'
    )
    assert line in t, line
  parts = by['before (idle)']['workdir_parts_bytes']
  assert f'`train/checkpoint/` ({parts["train/checkpoint"]} B' in t
  assert f'`train/model/` ({parts["train/model"]} B' in t
  assert f'`CHECKPOINT_MIN_STEPS` ({training.CHECKPOINT_MIN_STEPS})' in t
  assert cfg['train_steps'] < training.CHECKPOINT_MIN_STEPS
  every = inspect.signature(stages.Heartbeat).parameters['every'].default
  assert f'after {every:.0f} s without a line' in t
  st = after['stages']
  attacks = ', '.join(f'{a}' for a in st['attack_s'][:-1])
  assert (
    f'takes {st["model_load_to_end_of_training_s"]} s (the step compiles in'
    f' {st["train_step_compile_s"]} s) and the six attacks {attacks} and'
    f' {st["attack_s"][-1]} s' in t
  )
  assert len(st['attack_s']) == len(cfg['batch_sizes']) * cfg['num_batches']
  steps = cfg['phrase_steps'] + cfg['token_steps']
  assert (
    f'{steps} reordering steps of {cfg["reorder_candidates"]} candidates' in t
  )
  # The one-factor clip: before and after, and the key it moved.
  for name in ('before, optax clip', CLIPPED):
    peaks = by[name]['stages']['sampled_rss_peak_mib']
    line = _profile_row(
      by[name], f'{peaks["fine-tuning"]} MiB', f'{peaks["attacks"]} MiB'
    )
    assert line in t, line
  assert by['before, optax clip']['summary_equal']
  was, now = by['before, optax clip']['stages'], by[CLIPPED]['stages']
  assert (
    f"b = 4's first batch took {now['attack_s'][2]} s against"
    f' {was["attack_s"][2]} s, while the fine-tuning, with one copy of the'
    f' gradients, ended at {now["training_done_s"]} s against'
    f' {was["training_done_s"]} s' in t
  )
  old = {'bag_recall@b=16': 0.927710843373494}  # the summary before the clip
  assert abs(s['bag_recall@b=16'] - old['bag_recall@b=16']) == pytest.approx(
    by[CLIPPED]['max_summary_diff']
  )
  assert (
    f'bag recall at b = 16 went from {old["bag_recall@b=16"]:.3f} to'
    f' {s["bag_recall@b=16"]:.3f}' in t
  )
  row = next(
    json.loads(x)
    for x in (REPORTS / 'film_quickstart' / 'results.jsonl').open()
    if json.loads(x)['b'] == 16 and json.loads(x)['batch'] == 0
  )
  assert row['span_valid'] and row['bag_recall'] == 1.0
  # The programs kept across batch sizes: before and after.
  for name in KEPT:
    st = by[name]['stages']
    line = _profile_row(
      by[name],
      f'{st["sampled_rss_peak_mib"]["attacks"]} MiB',
      f'{st["attack_s"][2]} s',
      f'{st["attack_s"][4]} s',
    )
    assert line in t, line
  was, now = (by[name]['stages']['model_loaded_s'] for name in KEPT[1:3])
  assert f'loaded {now} s after the start, against {was} s' in t
  # The cache's run: its second batches (no compilation) moved too.
  a, b = (by[name]['stages']['attack_s'][1::2] for name in KEPT[2:])
  less = [x - y for x, y in zip(a, b)]
  assert f'also took about {min(less):.0f}-{max(less):.0f} s less' in t
  warm, cold = by['after, warm XLA cache'], by['after, cold XLA cache']
  assert f'takes {warm["wall_s"]} s once warm, against {cold["wall_s"]} s' in t
  assert profile['command'] in ' '.join(
    f'python -m experiments.film {" ".join(a)}'
    for a in commands('film_quickstart')
  )


def test_film_quickstart_on_another_cpu():
  # How far the quickstart moves on a second CPU: the keys that differ and
  # the two the README names, from the two committed summaries.
  t = text('film_quickstart')
  a = load('film_quickstart', 'summary.json')
  b = load('film_quickstart/other_cpu', 'summary.json')
  assert set(a) == set(b)
  timing = {k for k in a if 'second' in k}
  equal = [k for k in a if k not in timing and a[k] == b[k]]
  assert f'{len(equal)} of its {len(a) - len(timing)} `summary.json` keys' in t
  assert (
    f'At b = 4 it gives ROUGE-L {b["rougeL@b=4"]:.2f} instead of'
    f' {a["rougeL@b=4"]:.2f};' in t
  )
  assert b['bag_recall@b=16'] == a['bag_recall@b=16']
  assert f'had also read {b["bag_recall@b=16"]:.3f} there' in t
  cpu = load('film_quickstart/other_cpu', 'provenance.json')['environment']
  assert 'Intel' in cpu['cpu']['model'] and 'avx512f' in cpu['cpu']['vector']
  # Same settings: the keys both configs have agree (the other run, of an
  # older commit, predates a few config fields, at their defaults here).
  mine = load('film_quickstart', 'config.json')
  other = load('film_quickstart/other_cpu', 'config.json')
  assert {k: mine[k] for k in other if k in mine} == {
    k: v for k, v in other.items() if k in mine
  }
  assert len(set(mine) & set(other)) > 40
