"""benchmarks/reorder_stages.py: its sentences, and the committed run that
benchmarks/README.md quotes."""

import json
import pathlib

from benchmarks import reorder_stages
from leakjax.attacks.film import pipeline

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _Tokenizer:
  bos_id = 1

  def encode(self, text):
    return [10 + len(w) for w in text.split()]


def test_beam_sentence_is_the_sentence_then_tokens_of_its_bag():
  ids = reorder_stages.beam_sentence(_Tokenizer(), 'a bb ccc.', 12, seed=0)
  assert ids[:4] == [1, 11, 12, 14] and len(ids) == 12
  assert set(ids[4:]) <= {11, 12, 14}
  again = reorder_stages.beam_sentence(_Tokenizer(), 'a bb ccc.', 12, seed=0)
  assert again == ids


def _text() -> str:
  return ' '.join((ROOT / 'benchmarks/README.md').read_text('utf-8').split())


def test_committed_run_and_its_readme_section():
  d = json.loads((ROOT / 'benchmarks/results/reorder_stages.json').read_text())
  text = _text()
  assert d['command'].startswith(
    f'python -m benchmarks.reorder_stages --steps={d["phrase_steps"]}'
  )
  assert f'`{d["command"]}`' in text
  assert (
    f'fp32 matmul peak {d["matmul_peak_flops_per_second"] / 1e9:.1f} GFLOP/s'
    in text
  )
  rows = d['sentences']
  for r in rows:
    assert r['same_sentence'] and r['same_accepted']
    assert r['score_rel_diff'] < 1e-5
    widths = ', '.join(str(w) for w in r['stage_widths'])
    note = ' (compiles included)' if r['includes_compilation'] else ''
    assert (
      f'| {r["sentence"]}{note} | {r["input_tokens"]} / {r["final_tokens"]} |'
      f' {widths} | {r["one_buffer_s"]} s | {r["staged_s"]} s |'
      f' {r["speedup"]}x | yes |' in text
    )
  warm = [r for r in rows if not r['includes_compilation']]
  assert d['warm_one_buffer_s'] == round(
    sum(r['one_buffer_s'] for r in warm), 2
  )
  assert (
    f'Without compilations: {d["warm_one_buffer_s"]} s in one buffer,'
    f' {d["warm_staged_s"]} s in stages.' in text
  )
  worst = max(r['score_rel_diff'] for r in rows)
  assert f'(at most {worst:.1e} relative)' in text
  for p in d['step_seconds_by_width']:
    assert (
      f'| {p["width"]} | {p["step_s"]} | {p["fraction_of_peak"] * 100:.0f} % |'
      in text
    )


def test_quickstart_runs_and_their_readme_sentence():
  doc = json.loads(
    (ROOT / 'benchmarks/results/reorder_stages_quickstart.json').read_text()
  )
  runs = {r['run']: r for r in doc['runs']}
  one, every, final = (
    runs[n]
    for n in (
      'before-no-cache',
      'every-stage-narrowed-no-cache',
      'stages-of-32-steps-no-cache',
    )
  )
  for r in (one, every, final):
    assert r['summary_equal'] and r['max_summary_diff'] == 0.0
  assert every['wall_s'] > one['wall_s']
  assert (
    f'took {every["wall_s"]} s against {one["wall_s"]} s in one buffer, and'
    f' {final["wall_s"]} s with'
  ) in _text()
  # The runs that made every stage narrow by default.
  cold = [
    runs[f'{n}-fresh-cache'] for n in ('every-stage-narrowed', 'one-buffer')
  ]
  warm = [
    [runs[f'{n}-filled-cache{k}'] for k in ('', '-2')]
    for n in ('every-stage-narrowed', 'one-buffer')
  ]
  for r in (*cold, *warm[0], *warm[1]):
    assert r['summary_equal'] and r['max_summary_diff'] == 0.0
  assert cold[0]['wall_s'] < cold[1]['wall_s']
  assert max(r['wall_s'] for r in warm[0]) < min(r['wall_s'] for r in warm[1])
  rss = [sorted(r['peak_rss_mib'] for r in (cold[i], *warm[i])) for i in (1, 0)]
  assert (
    f'{cold[0]["wall_s"]} s against {cold[1]["wall_s"]} s with an empty cache'
    f' folder, {warm[0][0]["wall_s"]} s and {warm[0][1]["wall_s"]} s against'
    f' {warm[1][0]["wall_s"]} s and {warm[1][1]["wall_s"]} s with the folder'
    f' filled'
  ) in _text()
  assert (
    f'the peak memory rose from {rss[0][0]}-{rss[0][-1]} MiB to'
    f' {rss[1][0]}-{rss[1][-1]} MiB'
  ) in _text()


def test_the_bag_bucket_runs_and_their_readme_sentence():
  doc = json.loads(
    (ROOT / 'benchmarks/results/reorder_stages_quickstart.json').read_text()
  )
  runs = {r['run']: r for r in doc['runs']}
  narrow, wide = runs['bag-bucket-64-no-cache'], runs['bag-bucket-256-no-cache']
  for r in (narrow, wide):
    assert r['summary_equal'] and r['max_summary_diff'] == 0.0
    assert r['command'].endswith('--compilation_cache=none')
  first_b16 = 4  # attacks: b = 1, 1, 4, 4, 16, 16
  assert (
    f'took {wide["wall_s"]} s against {narrow["wall_s"]} s (its first b = 16'
    f' batch {wide["stages"]["attack_s"][first_b16]} s against'
    f' {narrow["stages"]["attack_s"][first_b16]} s)'
  ) in _text()
  assert pipeline.FilmAttackConfig().bag_bucket == 256
