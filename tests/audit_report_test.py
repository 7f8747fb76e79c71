"""The audit report on a synthetic run (no model): summary keys and values,
the answer's wording, the utility rule, escaping, summary.md, re-rendering.

Every expected number below is worked out by hand from the rows of
:func:`synthetic_run` (tests/audit_browser_test.py loads the same run in a
browser).
"""

import dataclasses
import doctest
import html
import json
import re
import types

import pytest

from experiments import audit_html, audit_plot, audit_report, audit_words
from leakjax import io
from leakjax.audit.config import AuditConfig
from leakjax.audit.summary import THREAT_MODELS

SENTENCES = [
  'Alice Martin moved to Paris in 2019.',
  'The invoice for Bob totals 420 dollars.',
  'Please call me back after lunch.',
  'Our meeting with Carol is on Friday.',
  'I left the keys at the <script>alert(1)</script> desk.',
  'Dave flies to Berlin on Monday morning.',
  'The printer on floor 3 is broken again.',
  'Send the draft to Erin before noon.',
]
ENTITIES = {
  0: ['Alice Martin', 'Paris', '2019'],
  1: ['Bob', '420'],
  3: ['Carol', 'Friday'],
  5: ['Dave', 'Berlin', 'Monday'],
  7: ['Erin'],
}

CFG = AuditConfig(
  artefacts=('gradient', 'snapshot', 'hidden'),
  batch_sizes=(1, 4),
  num_batches=2,
  defenses=('none', 'dp:8', 'freeze', 'noise:1e-6'),
  layers=('0', 'last'),
  finetune_steps=10,
  utility_seeds=2,
)


def attack_row(artefact, b, batch, defense, attack, exact, rouge, ent=None):
  """One attack row: the first round(exact * n) originals come back
  exactly (with their entities), the others as their first two words."""
  first = batch * b if b else 0
  index = list(range(first, first + (b or 5)))
  hits = round(exact * len(index))
  each = [i < hits for i in range(len(index))]
  matched = [
    SENTENCES[j] if ok else ' '.join(SENTENCES[j].split()[:2])
    for j, ok in zip(index, each)
  ]
  return {
    'kind': 'attack',
    'artefact': artefact,
    'b': b,
    'batch': batch,
    'defense': defense,
    'attack': attack,
    'exact': exact,
    'rougeL': rouge,
    'rouge1': rouge,
    'entities': ent,
    'originals': [SENTENCES[j] for j in index],
    'matched': matched,
    'exact_each': each,
    'original_entities': [ENTITIES.get(j, []) for j in index],
    'leaked_entities': [
      ENTITIES.get(j, []) if ok else [] for j, ok in zip(index, each)
    ],
    'recovered': [m for m in matched if m],
    'seconds': 0.5,
    'note': '',
  }


def utility_row(defense, seed, after, before=40.0):
  return {
    'kind': 'utility',
    'defense': defense,
    'seed': seed,
    'ppl_before': before,
    'ppl_after': after,
    'steps': 10,
    'seconds': 2.0,
    'sigma': 1.1 if defense.startswith('dp') else None,
  }


def attack_rows():
  rows = []
  g = 'gradient'
  for batch in (0, 1):
    rows += [
      attack_row(g, 1, batch, 'none', 'dager', 1.0, 1.0),
      attack_row(g, 1, batch, 'dp:8', 'dager', 0.0, 0.1),
      attack_row(g, 1, batch, 'freeze', 'dager', 1.0, 1.0),
      attack_row(g, 1, batch, 'noise:1e-6', 'dager', 1.0, 1.0),
    ]
  rows += [
    # batch 0: DAGER wins; batch 1: DAGER again -> 'dager'.
    attack_row(g, 4, 0, 'none', 'dager', 1.0, 1.0, 1.0),
    attack_row(g, 4, 0, 'none', 'film', 0.5, 0.9, 0.5),
    attack_row(g, 4, 1, 'none', 'dager', 0.75, 0.95, 0.5),
    # batch 0: equal exact, FILM's ROUGE-L wins; batch 1: DAGER.
    attack_row(g, 4, 0, 'dp:8', 'dager', 0.0, 0.2),
    attack_row(g, 4, 0, 'dp:8', 'film', 0.0, 0.85),
    attack_row(g, 4, 1, 'dp:8', 'dager', 0.25, 0.5, 0.0),
    attack_row(g, 4, 1, 'dp:8', 'film', 0.0, 0.6, 0.0),
    attack_row(g, 4, 0, 'freeze', 'dager', 0.75, 0.9),
    attack_row(g, 4, 1, 'freeze', 'dager', 0.75, 0.9),
    attack_row(g, 4, 0, 'noise:1e-6', 'dager', 1.0, 1.0),
    attack_row(g, 4, 1, 'noise:1e-6', 'dager', 1.0, 1.0),
    attack_row('snapshot', 0, 0, 'none', 'differential', 0.4, 0.7, 0.5),
    attack_row('snapshot', 0, 0, 'dp:8', 'differential', 0.0, 0.3),
    attack_row('snapshot', 0, 0, 'freeze', 'differential', 0.2, 0.5),
  ]
  for batch in (0, 1):
    rows += [
      attack_row('hidden:0', 4, batch, 'none', 'bei', 0.0, 0.81),
      attack_row('hidden:0', 4, batch, 'none', 'ridge', 0.0, 0.4),
      attack_row('hidden:0', 4, batch, 'noise:1e-6', 'bei', 0.0, 0.3),
      attack_row('hidden:last', 4, batch, 'none', 'hei', 1.0, 1.0),
      attack_row('hidden:last', 4, batch, 'noise:1e-6', 'hei', 0.5, 0.8),
    ]
  return rows


EXTRA = {
  'model': 'tiny-test-model',
  'num_sentences': 13,
  'num_heldout': 3,
  'num_train': 10,
  'num_attacker': 4,
  'devices': {'platform': 'cpu', 'kind': 'cpu', 'count': 1, 'processes': 1},
  'hidden_size': 64,
  'num_layers': 2,
  'sigma': {'dp:8': 1.1},
  'seconds': 12.5,
  'peak_memory_mib': 512.0,
  'data_fingerprint': 'sha256:abc123',
  'versions': {'jax': '0.0.test', 'leakjax': '0.1.0'},
}


def synthetic_run(none_after=(30.0, 30.4), utility=True):
  """The rows above; the fine-tuning (seeds 0 and 1) ends at `none_after`
  without a defense, at 42.0 and 43.0 with DP-SGD, 30.3 and 30.7 with
  frozen embeddings, 30.1 and 30.5 with noise."""
  rows = attack_rows()
  if utility:
    for seed, (n, dp, fr, no) in enumerate(
      zip(none_after, (42.0, 43.0), (30.3, 30.7), (30.1, 30.5), strict=True)
    ):
      rows += [
        utility_row('none', seed, n),
        utility_row('dp:8', seed, dp),
        utility_row('freeze', seed, fr),
        utility_row('noise:1e-6', seed, no),
      ]
  return types.SimpleNamespace(results=rows, extra=dict(EXTRA))


ANSWER = (
  'From one client gradient at b = 4 without a defense, 7 of 8 sentences'
  ' are read back verbatim (DAGER); DP-SGD at ε = 8 leaves 1 of 8 at 1.41x'
  ' the perplexity (±0.01 over 2 seeds); frozen embeddings leave 6 of 8 at'
  ' 1.01x; Gaussian noise σ = 1e-06 leaves 8 of 8 at 1.00x.'
  ' From the model before and after fine-tuning without a defense, 2 of 5'
  " of the user's sentence openings are among the extracted sequences"
  ' (differential rank search); DP-SGD at ε = 8 leaves none verbatim,'
  ' ROUGE-L 0.30 at 1.41x; frozen embeddings leave 1 of 5 at 1.01x.'
  ' From hidden states at layer 0 (b = 4) without a defense, none of the 8'
  ' sentences is read back verbatim, though the recovery reaches ROUGE-L'
  ' 0.81 (BEI); Gaussian noise σ = 1e-06 leaves none verbatim, ROUGE-L'
  ' 0.30; at the last layer,'
  ' 8 of 8 (HEI); Gaussian noise σ = 1e-06 leaves 4 of 8.'
)


def test_summary_keys_and_values():
  summary, _ = audit_report.summarize(CFG, synthetic_run())
  cells = [
    ('gradient', b, d)
    for b in (1, 4)
    for d in ('none', 'dp:8', 'freeze', 'noise:1e-6')
  ]
  attack_keys = set()
  for a, b, d in cells:
    for m in ('exact', 'rougeL', 'attack'):
      attack_keys.add(f'{m}@artefact={a},b={b},defense={d}')
  for d in ('none', 'dp:8', 'freeze'):
    for m in ('exact', 'rougeL', 'attack'):
      attack_keys.add(f'{m}@artefact=snapshot,defense={d}')
  for layer in ('0', 'last'):
    for d in ('none', 'noise:1e-6'):
      for m in ('exact', 'rougeL', 'attack'):
        attack_keys.add(f'{m}@artefact=hidden:{layer},b=4,defense={d}')
  entity_keys = {
    'entities@artefact=gradient,b=4,defense=none',
    'entities@artefact=gradient,b=4,defense=dp:8',
    'entities@artefact=snapshot,defense=none',
  }
  utility_keys = {'perplexity_before', 'utility_measurable'} | {
    f'{m}@defense={d}'
    for m in (
      'perplexity_after',
      'perplexity_after_std',
      'perplexity_ratio',
      'perplexity_ratio_std',
    )
    for d in ('none', 'dp:8', 'freeze', 'noise:1e-6')
  }
  assert set(summary) == attack_keys | entity_keys | utility_keys
  s = lambda m, **p: summary[io.summary_key(m, **p)]
  g4 = dict(artefact='gradient', b=4)
  # Best per batch: DAGER (1.0, 1.0) and DAGER (0.75, 0.95).
  assert s('exact', **g4, defense='none') == pytest.approx(0.875)
  assert s('rougeL', **g4, defense='none') == pytest.approx(0.975)
  assert s('entities', **g4, defense='none') == pytest.approx(0.75)
  assert s('attack', **g4, defense='none') == 'dager'
  # Batch 0: FILM (ROUGE-L 0.85 beats 0.2 at exact 0); batch 1: DAGER.
  assert s('exact', **g4, defense='dp:8') == pytest.approx(0.125)
  assert s('rougeL', **g4, defense='dp:8') == pytest.approx(0.675)
  assert s('entities', **g4, defense='dp:8') == 0.0  # batch 1 only
  assert s('attack', **g4, defense='dp:8') == 'film+dager'
  assert s('exact', artefact='snapshot', defense='none') == pytest.approx(0.4)
  assert s('rougeL', artefact='hidden:0', b=4, defense='none') == 0.81
  assert s('attack', artefact='hidden:0', b=4, defense='none') == 'bei'
  assert summary['perplexity_before'] == 40.0
  assert s('perplexity_after', defense='none') == pytest.approx(30.2)
  assert s('perplexity_after_std', defense='none') == pytest.approx(
    0.4 / 2**0.5
  )
  assert s('perplexity_after', defense='dp:8') == pytest.approx(42.5)
  # Per seed 42/30 = 1.4 and 43/30.4 = 1.41447.
  r0, r1 = 42 / 30, 43 / 30.4
  assert s('perplexity_ratio', defense='dp:8') == pytest.approx((r0 + r1) / 2)
  assert s('perplexity_ratio_std', defense='dp:8') == pytest.approx(
    abs(r1 - r0) / 2**0.5
  )
  assert s('perplexity_ratio', defense='freeze') == pytest.approx(
    (30.3 / 30 + 30.7 / 30.4) / 2
  )
  assert s('perplexity_ratio', defense='none') == 1.0
  assert summary['utility_measurable'] == 1
  for key, value in summary.items():
    want = str if key.startswith('attack@') else (int, float)
    assert isinstance(value, want), key


def test_the_answer_in_words():
  _, md = audit_report.summarize(CFG, synthetic_run())
  assert ANSWER in md


def test_defense_words():
  words = audit_words.defense_words
  assert words('dp:8') == 'DP-SGD at ε = 8'
  assert words('prune:0.99') == 'pruning 99% of each gradient'
  assert words('prune:0.5', 'update') == 'pruning 50% of each update'
  assert words('freeze') == 'frozen embeddings'
  assert words('noise:1e-6') == 'Gaussian noise σ = 1e-06'
  assert audit_words.attack_words('dager+film') == 'DAGER+FILM'


@pytest.mark.parametrize(
  'none_after, why',
  [
    ((39.5, 39.9), 'a drop of 0.3 is under 5% of 40'),
    ((30.0, 36.0), 'a drop of 7 is under 3 std (12.7)'),
  ],
)
def test_a_fine_tuning_too_short_shows_no_cost(none_after, why):
  summary, md = audit_report.summarize(CFG, synthetic_run(none_after))
  assert summary['utility_measurable'] == 0, why
  assert not [k for k in summary if k.startswith('perplexity_ratio')]
  assert 'perplexity_after@defense=dp:8' in summary
  mean = sum(none_after) / 2
  answer = md.split('\n\n')[1]
  assert answer.count('too short to show a cost') == 1
  assert (
    'DP-SGD at ε = 8 leaves 1 of 8 (the fine-tuning was too short to show a'
    f' cost: held-out perplexity 40.00 before, {mean:.2f} after);'
  ) in answer
  assert not re.search(r'\d\.\d\dx', md)  # no ratio anywhere, not 1.00x
  assert '| gradient | 4 | dp:8 | film+dager |' in md
  # Every gradient and snapshot cell; hidden states have no ratio.
  assert md.count('too short to show |') == 8 + 3


def test_the_cost_threshold_is_strict_at_5_percent():
  # 40 -> 38 is exactly 5%: not more than 5%, so not measurable.
  summary, _ = audit_report.summarize(CFG, synthetic_run((38.0, 38.0)))
  assert summary['utility_measurable'] == 0
  summary, _ = audit_report.summarize(CFG, synthetic_run((37.9, 37.9)))
  assert summary['utility_measurable'] == 1


def test_no_utility_rows_no_utility_keys():
  summary, md = audit_report.summarize(CFG, synthetic_run(utility=False))
  assert not [k for k in summary if 'perplexity' in k or 'utility' in k]
  assert 'No fine-tuning ran' in md
  assert 'the perplexity' not in md.split('\n\n')[1]


def test_the_markdown_table():
  _, md = audit_report.summarize(CFG, synthetic_run())
  assert md.startswith('# Leakage audit: tiny-test-model on the quickstart')
  assert (
    '| artefact | b | defense | attack | exact | ROUGE-L | entities |'
    ' perplexity ratio |'
  ) in md
  assert (
    '| gradient | 4 | dp:8 | film+dager | 0.125 | 0.675 | 0.000 |'
    ' 1.41x ± 0.01 |'
  ) in md
  assert (
    '| gradient | 4 | none | dager | 0.875 | 0.975 | 0.750 | baseline |' in md
  )
  assert '| snapshot | – | none | differential | 0.400 | 0.700 | 0.500 |' in md
  assert (
    '| gradient | 1 | noise:1e-6 | dager | 1.000 | 1.000 | – | 1.00x ± 0.00 |'
  ) in md
  assert '| hidden:0 | 4 | none | bei | 0.000 | 0.810 | – | – |' in md
  assert '| hidden:last | 4 | noise:1e-6 | hei | 0.500 | 0.800 | – | – |' in md
  lines = [x for x in md.splitlines() if x.startswith('| ')]
  assert len(lines) == 1 + 8 + 3 + 4  # header + gradient, snapshot, hidden
  assert (
    'Held-out perplexity (3 sentences): 40.00 before fine-tuning; after 10'
    ' steps 30.20 without a defense, 42.50 with DP-SGD at ε = 8, 30.50 with'
    ' frozen embeddings, 30.30 with Gaussian noise σ = 1e-06 (mean over 2'
    ' seeds).'
  ) in md


def test_the_page_escapes_every_text():
  run = synthetic_run()
  run.extra['model'] = 'model <b>bold</b>'
  text = audit_html.page(audit_report.build_page(CFG, run))
  assert '<script' not in text  # no script at all, none smuggled in
  assert 'alert(1)' in text
  assert '&lt;script&gt;alert(1)&lt;/script&gt;' in text
  assert '<b>bold' not in text and 'model &lt;b&gt;bold&lt;/b&gt;' in text
  answer = re.search(r'<p id="answer">(.*?)</p>', text, re.S).group(1)
  assert answer.replace('<br>', ' ') == ANSWER.replace("'", '&#x27;')
  assert answer.count('<br>') == 2  # one line per artefact


def test_the_page_sections():
  text = audit_html.page(audit_report.build_page(CFG, synthetic_run()))
  order = [
    'id="answer"',
    'id="perplexity"',
    'Threat models and attacks',
    'id="frontier"',
    'id="sentences"',
    'id="settings"',
  ]
  where = [text.index(x) for x in order]
  assert where == sorted(where)
  assert 'Petrov et al., NeurIPS 2024' in text
  assert 'Zanella-Béguelin et al., CCS 2020' in text
  assert 'Wan et al. 2024' in text
  # A run whose facts name no threat models gets the audit's own words.
  assert 'threat_models' not in synthetic_run().extra
  for artefact in ('gradient', 'snapshot', 'hidden'):
    assert html.escape(THREAT_MODELS[artefact]) in text
  png = re.search(
    r'id="frontier" alt="leakage-utility frontier"'
    r' src="data:image/png;base64,([A-Za-z0-9+/=]+)"',
    text,
  )
  assert png and len(png.group(1)) > 10_000
  # Alice's sentence, recovered in full by DAGER at b = 4, no defense.
  assert (
    '<td><mark>Alice</mark> <mark>Martin</mark> <mark>moved</mark>'
    ' <mark>to</mark> <mark>Paris</mark> <mark>in</mark>'
    ' <mark>2019</mark>.</td>'
  ) in text
  assert 'Alice Martin, Paris, 2019 (3 of 3)' in text
  # The fourth sentence of batch 1 (Erin's) came back as two words only.
  assert (
    '<td><mark>Send</mark> <mark>the</mark> draft to Erin before noon.</td>'
    '<td>Send the</td><td></td><td>none (0 of 1)</td>'
  ) in text
  assert '<td>dp_delta</td>' not in text and '<th>dp_delta</th>' in text
  assert '<td>sha256:abc123</td>' in text
  assert 'the fine-tuning was too short' not in text


def test_mark_words():
  assert audit_html.mark_words('Ann <b> met Bo', 'ann saw bo') == (
    '<mark>Ann</mark> &lt;b&gt; met <mark>Bo</mark>'
  )


def test_the_plot_falls_back_to_evenly_spaced_defenses():
  hidden = 'noise at inference: no fine-tuning cost'
  page = audit_report.build_page(CFG, synthetic_run((39.5, 39.9)))
  short = 'fine-tuning too short to show a cost'
  assert page.x_notes == {
    'client gradient': short,
    'model before/after': short,
    'hidden states, layer 0': hidden,
    'hidden states, the last layer': hidden,
  }
  assert all(p.ratio is None for p in page.points)
  fig = audit_plot.frontier_figure(page.points, page.x_notes)
  assert fig.axes[0].get_xlabel() == f'defense ({short})'
  page = audit_report.build_page(CFG, synthetic_run())
  assert set(page.x_notes.values()) == {hidden}
  fig = audit_plot.frontier_figure(page.points, page.x_notes)
  assert [ax.get_xlabel() for ax in fig.axes[:4]] == [
    'perplexity ratio to no defense',
    'perplexity ratio to no defense',
    f'defense ({hidden})',
    f'defense ({hidden})',
  ]
  labels = [t.get_text() for t in fig.axes[0].texts]
  # none, noise and freeze at 1.00x-1.01x share one label.
  assert labels == ['none, noise:1e-6, freeze', 'dp:8']
  dp = [p for p in page.points if p.defense == 'dp:8' and p.b == 4]
  assert dp[0].panel == 'client gradient' and dp[0].ratio == pytest.approx(
    (42 / 30 + 43 / 30.4) / 2
  )
  assert dp[0].ratio_std == pytest.approx(abs(43 / 30.4 - 42 / 30) / 2**0.5)
  noise = [p.ratio for p in page.points if p.defense == 'noise:1e-6']
  assert noise[:2] == [pytest.approx((30.1 / 30 + 30.5 / 30.4) / 2)] * 2
  assert noise[2:] == [None, None]  # hidden states


def test_a_defense_without_a_fine_tuning_has_no_cost():
  run = synthetic_run()
  run.results = [r for r in run.results if r.get('seed') != 1]  # one seed
  run.results = [
    r for r in run.results if (r['kind'], r['defense']) != ('utility', 'freeze')
  ]
  summary, md = audit_report.summarize(CFG, run)
  assert 'perplexity_ratio@defense=freeze' not in summary
  assert summary['perplexity_ratio_std@defense=dp:8'] == 0.0
  assert (
    'DP-SGD at ε = 8 leaves 1 of 8 at 1.40x the perplexity (1 seed);'
    ' frozen embeddings leave 6 of 8; Gaussian noise'
  ) in md
  page = audit_report.build_page(CFG, run)
  # One defense lacks a cost: the panel spaces them all evenly.
  fig = audit_plot.frontier_figure(page.points, page.x_notes)
  assert fig.axes[0].get_title() == 'client gradient'
  assert fig.axes[0].get_xlabel() == 'defense (no measured cost)'
  ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  assert ticks == ['none', 'dp:8', 'freeze', 'noise:1e-6']
  assert fig.axes[1].get_xlabel() == 'defense (no measured cost)'  # freeze
  assert fig.axes[2].get_xlabel() == (
    'defense (noise at inference: no fine-tuning cost)'
  )


def test_write_and_rerender(tmp_path):
  writer = io.ExperimentWriter(tmp_path, CFG, enabled=True)
  run = synthetic_run()
  for row in run.results:
    writer.add_result(row)
  # The runner writes its facts (`AuditRun.extra`) to facts.json.
  (tmp_path / 'facts.json').write_text(json.dumps(EXTRA))
  summary = audit_report.write(writer, CFG, run)
  stored = json.loads((tmp_path / 'summary.json').read_text())
  assert stored == summary
  html_text = (tmp_path / 'report.html').read_text()
  assert 'id="frontier"' in html_text
  assert '<td>13 / 10 / 3 / 4</td>' in html_text
  for name in ('summary.json', 'summary.md', 'report.html'):
    (tmp_path / name).unlink()
  written = audit_report.rerender(tmp_path)
  assert [p.rsplit('/', 1)[1] for p in written] == [
    'summary.json',
    'summary.md',
    'report.html',
  ]
  assert json.loads((tmp_path / 'summary.json').read_text()) == stored
  assert (tmp_path / 'report.html').read_text() == html_text


def test_write_writes_nothing_when_disabled(tmp_path):
  writer = io.ExperimentWriter(tmp_path / 'w', CFG, enabled=False)
  summary = audit_report.write(writer, CFG, synthetic_run())
  assert summary['utility_measurable'] == 1
  assert not (tmp_path / 'w').exists()


def test_the_rerender_command_says_what_is_wrong(tmp_path, capsys):
  with pytest.raises(SystemExit, match='usage: python -m'):
    audit_report.main([])
  with pytest.raises(SystemExit, match='config.json does not exist'):
    audit_report.main([str(tmp_path)])


def test_load_run_drops_unknown_config_fields(tmp_path):
  stored = io.jsonable(CFG)
  stored['a_field_of_a_later_version'] = 1
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  (tmp_path / 'results.jsonl').write_text('')
  cfg, run = audit_report.load_run(tmp_path)
  assert cfg == CFG and run.results == [] and run.extra == {}
  assert dataclasses.asdict(cfg)['layers'] == ('0', 'last')


def test_docstring_examples():
  result = doctest.testmod(audit_html)
  assert result.attempted > 0 and result.failed == 0
