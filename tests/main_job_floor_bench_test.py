"""benchmarks.main_job_floor's FLOP counts on a synthetic run of the tiny
GPT-2, and the FILM quickstart report's quote of its committed run."""

import dataclasses
import json
import pathlib

import pytest

from benchmarks import main_job_floor, peak
from leakjax import models, quickstart_corpus
from leakjax.attacks.film import runner
from leakjax.train import TrainConfig
from leakjax.train import language_model as lm

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_floors_count_each_stage_at_the_runs_shapes(tmp_path):
  cfg = runner.FilmConfig(
    model=models.GPT2_TINY,
    batch_sizes=(1, 2),
    num_batches=1,
    train_steps=3,
    train_batch_size=2,
    num_beams=(4,),
    length=6,
    phrase_steps=2,
    token_steps=3,
    reorder_candidates=4,
  )
  (tmp_path / 'config.json').write_text(json.dumps(dataclasses.asdict(cfg)))
  short, long_ = quickstart_corpus.SENTENCES[:2]
  rows = [
    {
      'b': b,
      'originals': texts,
      'recovered': ['The office is open.'],
      'num_prompts': 3,
      'grad_seconds': 2.0,
      'stage_seconds': {'bag': 0.1, 'search': 1.0, 'reorder': 5.0},
    }
    for b, texts in ((1, [short]), (2, [short, long_]))
  ]
  with (tmp_path / 'results.jsonl').open('w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)
  run = {'stages': {'train_step_compiled_s': 4.0, 'training_done_s': 10.0}}
  got = main_job_floor.floors(run, tmp_path, peak_flops=1e9)
  model, _ = models.load_model(cfg.model)
  shape = peak.shape_of(model)
  tok = model.tokenizer
  # The widths the library computes at: the fine-tuning's batches ...
  texts = runner.private_sentences(cfg, runner.load_texts(cfg), tok)
  config = TrainConfig(max_length=cfg.max_tokens + 1)
  width = lm._prepare(model, texts, config, model.max_length, 'train')[0]
  width = width.shape[1]
  # ... the client's batches (BOS + the longest sentence, padded to 8) ...
  widths = [
    -(-(1 + max(len(tok.encode(t)) for t in r['originals'])) // 8) * 8
    for r in rows
  ]

  def fwd_bwd(w):
    return 3 * peak.forward_flops(shape, w)  # the backward is twice it

  by = {s['stage']: s for s in got['stages']}
  assert list(by) == [
    'fine-tuning',
    'client gradients',
    'beam searches',
    'reordering',
  ]
  assert by['fine-tuning']['flops'] == pytest.approx(3 * 2 * fwd_bwd(width))
  assert by['fine-tuning']['seconds'] == 6.0
  assert by['client gradients']['flops'] == pytest.approx(
    fwd_bwd(widths[0]) + 2 * fwd_bwd(widths[1])
  )
  assert by['client gradients']['seconds'] == 4.0

  # ... and the reordering's buffers: step 0 in the one buffer (BOS, start
  # word, 6 tokens, 8 more for insertions, rounded up to 8: 16 tokens),
  # the 2 phrase-wise steps in the sentence's width rounded up to 8, the
  # 3 token-wise ones in that of the sentence plus 3 insertions; 4
  # candidates a step.
  def step(w):
    return peak.forward_flops(shape, w) + peak.backward_flops(
      shape, w, last_layers=1
    )

  final = 1 + len(tok.encode(rows[0]['recovered'][0]))
  assert final <= 8 < final + 3 <= 16  # the widths below
  assert by['reordering']['flops'] == pytest.approx(
    2 * 4 * (step(16) + 2 * step(8) + 3 * step(16))
  )
  assert by['reordering']['note'] == (
    '6 steps of 4 candidates a batch, step 0 x 16 tokens, the rest x 8-16'
  )
  assert by['reordering']['seconds'] == 10.0
  assert by['beam searches']['seconds'] == 2.0
  for s in got['stages']:
    assert s['seconds_at_peak'] == pytest.approx(s['flops'] / 1e9, abs=0.01)
    assert s['fraction_of_peak'] == pytest.approx(
      s['flops'] / s['seconds'] / 1e9, abs=1e-3
    )
  unpadded = got['reorder_unpadded']
  assert (
    unpadded['final_lengths']
    == [1 + len(tok.encode(rows[0]['recovered'][0]))] * 2
  )
  assert unpadded['flops'] < by['reordering']['flops']
  assert got['job_seconds_at_peak'] == pytest.approx(
    sum(s['seconds_at_peak'] for s in got['stages']), abs=0.1
  )
  assert got['job_seconds_at_peak_unpadded'] < got['job_seconds_at_peak']


def test_the_quickstart_report_quotes_the_committed_run():
  got = json.loads(
    (ROOT / 'benchmarks/results/main_job_floor.json').read_text()
  )
  assert got['summary_equal'] is True
  assert got['command'] == (
    'python -m experiments.film'
    ' --flagfile=experiments/configs/film_quickstart.flags'
  )
  text = (ROOT / 'reports/film_quickstart/README.md').read_text()
  for s in got['stages']:
    row = (
      f'| {s["stage"]} | {s["seconds"]:.1f} s | {s["seconds_at_peak"]:.1f} s'
      f' | {100 * s["fraction_of_peak"]:.0f} % | {s["note"]} |'
    )
    assert row in text, row
  st = {s['stage']: s for s in got['stages']}
  unpadded = got['reorder_unpadded']
  memory = got['run_stages']['sampled_rss_peak_mib']
  flat = ' '.join(text.split())
  for phrase in (
    f'--reference={got["reference"]}',
    f'runs the main job once ({got["wall_s"]} s wall, that summary;',
    f'({got["matmul_peak_flops_per_second"] / 1e9:.1f} GFLOP/s)',
    f"the run's matmuls alone take {got['job_seconds_at_peak']} s",
    f'its FLOPs take {st["reordering"]["seconds_at_peak"]:.1f} s at the peak,'
    f' and {unpadded["seconds_at_peak"]:.1f} s with no padding at all (its'
    f' sentences end with {min(unpadded["final_lengths"])}-'
    f'{max(unpadded["final_lengths"])} tokens',
    f"the whole job's {got['job_seconds_at_peak_unpadded']} s",
    f"the fine-tuning's {8 * 19}-row products run at"
    f' {100 * st["fine-tuning"]["fraction_of_peak"]:.0f} % of the peak',
    f"The attacks' peak memory was {memory['attacks']} MiB in this run, above"
    f" the fine-tuning's ({memory['fine-tuning']} MiB)",
  ):
    assert phrase in flat, phrase
  assert memory['attacks'] > memory['fine-tuning']
  assert st['fine-tuning']['note'] == '30 steps of 8 x 19 tokens'
