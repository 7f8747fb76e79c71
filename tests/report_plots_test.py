"""Every plot of the committed GBoard, differential, DAGER, FILM and Embed
Parrot reports renders, and reads: legends off the data, error bars inside the axes, the
paper drawn over the run's range only, titles from the run's config.

Each report module re-draws its figures from a finished run's folder
(config.json, summary.json, results.jsonl); the committed report folders
are such runs, copied here into tmp_path (the committed files stay).
"""

import json
import math
import pathlib
import shutil
import types

import matplotlib

matplotlib.use('Agg')

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from experiments import (  # noqa: E402
  dager_report,
  differential_plots,
  embed_parrot_paper,
  embed_parrot_plots,
  film_plots,
  film_tables,
  gboard_dp_plots,
  gboard_plots,
)
from leakjax.attacks.gboard import runner as gboard_runner  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
REPORTS = ROOT / 'reports'
RUN_FILES = ('config.json', 'summary.json', 'summary.md', 'results.jsonl')
PNG = b'\x89PNG\r\n\x1a\n'
MIN_BYTES = 10_000  # a drawn report figure; an empty canvas is ~2-5 KB


def _committed(pattern: str) -> list[str]:
  """Report folders (relative to reports/) that hold a committed `pattern`
  plot and the results it is drawn from."""
  return sorted(
    str(p.parent.relative_to(REPORTS))
    for p in REPORTS.glob(pattern)
    if (p.parent / 'results.jsonl').is_file()
  )


GBOARD = _committed('**/fig2_word_recovery.png')
DIFFERENTIAL = _committed('**/ds_dr.png')
DAGER = _committed('**/dager_vs_tokens.png')
EMBED_PARROT = _committed('embed_parrot/**/layers.png')
# Every attack-mode FILM run draws the plot, committed or not.
FILM = sorted(
  str(p.parent.relative_to(REPORTS))
  for p in REPORTS.glob('film_*/**/config.json')
  if json.loads(p.read_text()).get('mode') == 'attack'
  and (p.parent / 'results.jsonl').is_file()
)


def _copy_run(report: str, tmp_path) -> pathlib.Path:
  out = tmp_path / report.replace('/', '_')
  out.mkdir()
  # Embed Parrot's training curves are drawn from its histories.
  histories = [p.name for p in (REPORTS / report).glob('*_history.json')]
  for name in (*RUN_FILES, *histories):
    if (REPORTS / report / name).is_file():
      shutil.copy(REPORTS / report / name, out / name)
  return out


def _rows(folder: pathlib.Path) -> list[dict]:
  return [
    json.loads(line)
    for line in (folder / 'results.jsonl').read_text().splitlines()
    if line.strip()
  ]


def _assert_pngs(folder: pathlib.Path, names) -> None:
  for name in names:
    data = (folder / name).read_bytes()
    assert data.startswith(PNG), name
    assert len(data) > MIN_BYTES, (name, len(data))


def _assert_legends_off_the_data(fig) -> None:
  """No legend box overlaps a panel's data area."""
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  legends = list(fig.legends) + [
    ax.get_legend() for ax in fig.axes if ax.get_legend() is not None
  ]
  assert legends, 'the figure has no legend'
  for legend in legends:
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
      assert not box.overlaps(ax.get_window_extent(renderer)), (
        legend.get_texts()[0].get_text(),
        ax.get_title(),
      )


def test_committed_report_folders_are_found():
  assert 'gboard' in GBOARD and 'gboard/quick' in GBOARD
  assert 'differential' in DIFFERENTIAL
  assert 'dager/quick' in DAGER and len(DAGER) > 20
  assert 'embed_parrot' in EMBED_PARROT
  assert 'embed_parrot/pretrained/layer_30' in EMBED_PARROT
  assert 'film_quickstart' in FILM and 'film_freeze' in FILM


# ------------------------------------------------------------------ GBoard


def _gboard(report: str, tmp_path):
  run = _copy_run(report, tmp_path)
  cfg = gboard_runner.load_config(run)
  summary = json.loads((run / 'summary.json').read_text())
  res = [r for r in _rows(run) if r.get('kind') == 'attack']
  colors = {n: f'C{i}' for i, n in enumerate(cfg.num_sentences)}
  return cfg, summary, res, colors


def test_gboard_word_recovery_axis_fits_the_data(tmp_path):
  # Fig. 2: rule F1 and its vocabulary bound on an axis fitted to them
  # (not 0-1), their ratio below; the caption says the paper gives no
  # values and what the dashed bound is.
  cfg, summary, res, colors = _gboard('gboard', tmp_path)
  fig = gboard_plots._word_recovery_figure(cfg, summary, res, colors)
  assert [ax.get_ylabel() for ax in fig.axes[::2]] == [
    'word F1',
    'F1 / vocabulary bound',
  ]
  low, high = fig.axes[0].get_ylim()
  ys = [
    y
    for line in fig.axes[0].get_lines()
    for y in line.get_ydata()
    if not math.isnan(y)
  ]
  assert low > 0.5 and low <= min(ys) and high >= max(ys)
  caption = ' '.join(t.get_text() for t in fig.texts)
  assert 'no values in its text' in caption
  assert 'Vocabulary bound' in caption
  _assert_legends_off_the_data(fig)
  plt.close(fig)


def test_gboard_reconstruction_and_scaling_legends_off_the_data(tmp_path):
  cfg, summary, res, colors = _gboard('gboard', tmp_path)
  fig = gboard_plots._reconstruction_figure(cfg, res, colors)
  # The F1 axis ends at a perfect 1 and starts just below the data.
  low, high = fig.axes[0].get_xlim()
  drawn = [
    r['recon_f1']
    for r in res
    if r['noise'] == 'none'
    and r['E'] > 1
    and not r.get('scale')
    and 'levenshtein' in r
  ]
  assert 0.5 < low < min(drawn)
  assert high >= 1.0
  _assert_legends_off_the_data(fig)
  plt.close(fig)
  fig = gboard_plots._scaling_figure(cfg, summary, colors)
  labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  assert labels == [f'{s:g}' for s in cfg.scales]  # s = 0 labelled 0
  _assert_legends_off_the_data(fig)
  plt.close(fig)


@pytest.mark.slow
@pytest.mark.parametrize('report', GBOARD)
def test_gboard_figures_render(report, tmp_path):
  run = _copy_run(report, tmp_path)
  written = gboard_plots.rerender_plots(run)
  # Every committed figure is re-drawn from the committed files.
  committed = sorted(p.name for p in (REPORTS / report).glob('fig*.png'))
  assert sorted(written) == committed
  _assert_pngs(run, written)


def _error_bars_inside(ax) -> None:
  """Every error bar of `ax` ends inside its y axis."""
  low, high = ax.get_ylim()
  for collection in ax.collections:
    for segment in collection.get_segments():
      for _, y in segment:
        assert low <= y <= high, (ax.get_title(), y, low, high)


@pytest.mark.parametrize('report', ['gboard', 'gboard/heldout'])
def test_gboard_dpsgd_figure_without_update_files(report, tmp_path):
  # Fig. 5 from the committed files: panels (a) and (c), the caption says
  # that (b) needs the run's update files, the title names the run's data.
  cfg, summary, res, colors = _gboard(report, tmp_path)
  dp = [r for r in res if r['noise'] == 'dpsgd']
  fig = gboard_dp_plots.dpsgd_figure(cfg, summary, dp, colors)
  assert [ax.get_title() for ax in fig.axes] == [
    '(a) Algorithm 2 (cut 0)',
    '(c) no-oracle threshold',
  ]
  caption = ' '.join(t.get_text() for t in fig.texts)
  assert 'no values in its text' in caption
  assert "Not drawn: the paper's panel (b)" in caption and 'deltas/' in caption
  assert cfg.sms in fig._suptitle.get_text()
  assert ('Bars: ±1 sd' in caption) == (cfg.num_datasets > 1)
  for ax in fig.axes:
    _error_bars_inside(ax)
  _assert_legends_off_the_data(fig)
  plt.close(fig)


def test_gboard_dpsgd_figure_with_magnitudes(tmp_path):
  # With a run's update files, panel (b) sits between (a) and (c), its
  # keys in the one legend right of the panels.
  cfg, summary, res, colors = _gboard('gboard/quick', tmp_path)
  dp = [r for r in res if r['noise'] == 'dpsgd']
  values = np.linspace(0.03, 0.0, 200)
  magnitudes = dict(
    values=values,
    typed=values > 0.01,
    threshold=0.012,
    oracle=0.01,
    rule='fdr',
    run='σ=0.01, B=full, n_k=16, E=50',
  )
  fig = gboard_dp_plots.dpsgd_figure(cfg, summary, dp, colors, magnitudes)
  titles = [ax.get_title() for ax in fig.axes]
  assert titles[1].startswith('(b) sorted bias updates') and len(titles) == 3
  caption = ' '.join(t.get_text() for t in fig.texts)
  assert 'Not drawn' not in caption
  labels = [t.get_text() for t in fig.legends[0].get_texts()]
  assert '(b) bias cut (fdr)' in labels
  _assert_legends_off_the_data(fig)
  plt.close(fig)


# ----------------------------------------------------------- differential


@pytest.mark.parametrize('report', DIFFERENTIAL)
def test_differential_figure_renders(report, tmp_path):
  run = _copy_run(report, tmp_path)
  path = pathlib.Path(differential_plots.rerender_plot(run))
  assert path == run / 'ds_dr.png'
  _assert_pngs(run, ['ds_dr.png'])


def test_differential_one_method_per_column_legend_outside(tmp_path):
  run = _copy_run('differential', tmp_path)
  stored = json.loads((run / 'config.json').read_text())
  cfg = types.SimpleNamespace(
    insertions=stored['insertions'],
    methods=stored['methods'],
    score=stored['score'],
    data=stored['data'],
  )
  fig = differential_plots.ds_dr_figure(
    _rows(run), cfg, list(stored['canary_types'])
  )
  assert [ax.get_title() for ax in fig.axes[: len(cfg.methods)]] == list(
    cfg.methods
  )
  assert cfg.data in fig._suptitle.get_text()
  _assert_legends_off_the_data(fig)
  plt.close(fig)


# ------------------------------------------------------------------ DAGER


@pytest.mark.parametrize('report', DAGER)
def test_dager_figure_renders(report, tmp_path):
  run = _copy_run(report, tmp_path)
  path = pathlib.Path(dager_report.rerender_plot(run))
  assert path == run / 'dager_vs_tokens.png'
  _assert_pngs(run, ['dager_vs_tokens.png'])


def _dager_rows(points):
  return [
    dict(
      attack='dager',
      defense=defense,
      b=b,
      num_tokens=tokens,
      rougeL=r,
      exact=r,
    )
    for defense, b, tokens, r in points
  ]


def test_dager_title_names_the_configs_data():
  cfg = types.SimpleNamespace(model='tiny', data='/data/mails/sms.txt')
  rows = _dager_rows([('none', 1, 9, 1.0), ('none', 1, 9, 0.5)])
  fig = dager_report.plot(cfg, rows, {'hidden_size': 16})
  assert fig._suptitle.get_text() == 'tiny, consecutive sms.txt batches'
  plt.close(fig)
  cfg.data = 'hub:org/set:train'
  assert dager_report.data_name(cfg) == 'hub:org/set:train'
  cfg.data = None  # the runner's embedded sentences
  assert dager_report.data_name(cfg) == 'quickstart corpus'


def test_dager_committed_title_is_the_configs_data(tmp_path):
  run = _copy_run('dager/quick', tmp_path)
  stored = json.loads((run / 'config.json').read_text())
  cfg = types.SimpleNamespace(model=stored['model'], data=stored['data'])
  fig = dager_report.plot(cfg, _rows(run), {'hidden_size': 576})
  assert fig._suptitle.get_text() == (
    f'{stored["model"]}, consecutive {stored["data"]} batches'
  )
  plt.close(fig)


@pytest.mark.parametrize(
  'lo, hi',
  [(17.7, 749.0), (254.0, 749.0), (300.0, 420.0), (1700.0, 2900.0)],
)
def test_dager_log_ticks_are_few_and_at_least_two(lo, hi):
  ticks = dager_report.log_ticks(lo, hi)
  assert len(ticks) >= 2
  assert all(f'{t:g}'[0] in '125' for t in ticks)
  inside = [t for t in ticks if lo <= t <= hi]
  # Only a range without two 1-2-5 values is widened, by one each side.
  assert ticks == inside or (len(inside) < 2 and len(ticks) == len(inside) + 2)


def test_dager_single_point_is_inside_a_labelled_axis():
  # One batch size, far from the rank limit: the point sits inside the
  # axis, which has at least two labelled 1-2-5 ticks and no others.
  cfg = types.SimpleNamespace(model='m', data='film-enron')
  rows = _dager_rows([('none', 128, 2300, 0.3), ('none', 128, 2350, 0.25)])
  fig = dager_report.plot(cfg, rows, {'hidden_size': 576})
  ax = fig.axes[0]
  low, high = ax.get_xlim()
  assert low < 576 and 2325 * 1.2 < high
  fig.canvas.draw()
  labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
  assert len(labels) >= 2 and set(labels) <= {'500', '1000', '2000', '5000'}
  assert not [t for t in ax.get_xticklabels(minor=True) if t.get_text()]
  _assert_legends_off_the_data(fig)
  plt.close(fig)


def test_dager_equal_series_are_marked(tmp_path):
  # Two defenses both at 0 everywhere: distinct markers, and the value
  # written where they coincide.
  cfg = types.SimpleNamespace(model='m', data='film-enron')
  rows = _dager_rows(
    [
      ('fedavg:1:4', 4, 90, 0.0),
      ('fedavg:2:4', 4, 92, 0.0),
      ('fedavg:1:4', 16, 330, 0.0),
      ('fedavg:2:4', 16, 335, 0.0),
    ]
  )
  fig = dager_report.plot(cfg, rows, {})
  markers = {
    line.get_marker()
    for line in fig.axes[0].get_lines()
    if line.get_linestyle() == '-'
  }
  assert len(markers) == 2
  notes = [t.get_text() for t in fig.axes[0].texts]
  assert notes == ['all 0.00', 'all 0.00']
  plt.close(fig)


# ------------------------------------------------------------------- FILM


@pytest.mark.parametrize('report', FILM)
def test_film_figure_renders(report, tmp_path):
  run = _copy_run(report, tmp_path)
  path = pathlib.Path(film_plots.rerender_plot(run))
  assert path == run / 'film_vs_batch_size.png'
  _assert_pngs(run, ['film_vs_batch_size.png'])


def test_film_other_modes_draw_no_plot(tmp_path):
  run = _copy_run('film_bag', tmp_path)
  with pytest.raises(ValueError, match='bag run draws no plot'):
    film_plots.rerender_plot(run)


def _film_figure(report: str, tmp_path):
  run = _copy_run(report, tmp_path)
  stored = json.loads((run / 'config.json').read_text())
  cfg = types.SimpleNamespace(model=stored['model'], data=stored['data'])
  rows = _rows(run)
  fig, _ = film_plots.plot(rows, cfg)
  return fig, rows, stored


def _paper_lines(ax):
  return [line for line in ax.get_lines() if line.get_linestyle() == ':']


def test_film_paper_line_stops_at_the_runs_largest_b(tmp_path):
  fig, rows, _ = _film_figure('film_quickstart', tmp_path)
  largest = max(r['b'] for r in rows)
  assert largest == 16
  paper = _paper_lines(fig.axes[0])
  # One dotted line per metric: ROUGE-1, ROUGE-2, ROUGE-L, NERR.
  assert len(paper) == 4
  for line in paper:
    # The points sit at b = 1, 4, 16, each shifted by under 15 %.
    xs = line.get_xdata()
    assert len(xs) == 3 and max(xs) < largest * 1.15
  ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  assert ticks == ['1', '4', '16']
  # The paper's numbers themselves: Table 10 at b = 1 and 16, Table 9 at 4.
  rouge_l = paper[2].get_ydata()
  assert list(rouge_l) == [
    film_tables.PAPER_TABLE10_ENRON[1][2],
    film_tables.PAPER_TABLE9_ENRON[4][2],
    film_tables.PAPER_TABLE10_ENRON[16][2],
  ]
  plt.close(fig)
  assert list(film_tables.paper_points([1, 16])) == [1, 4, 16]
  assert list(film_tables.paper_points([16, 64])) == [16, 64]
  assert film_tables.paper_points([]) == {}


def test_film_equal_metrics_stay_distinguishable(tmp_path):
  # At b = 4 and 16 every metric is 1.00: one marker per metric, the
  # markers side by side, and the shared value written beside them.
  fig, _, _ = _film_figure('film_quickstart', tmp_path)
  ax = fig.axes[0]
  ours = [line for line in ax.get_lines() if line.get_linestyle() == '-']
  assert len({line.get_marker() for line in ours}) == 4
  at_4 = sorted(x for line in ours for x in line.get_xdata() if 3 < x < 5)
  assert len(at_4) == 4 and min(b - a for a, b in zip(at_4, at_4[1:])) > 0.1
  assert sorted(t.get_text() for t in ax.texts) == ['all 1.00', 'all 1.00']
  _assert_legends_off_the_data(fig)
  plt.close(fig)


@pytest.mark.parametrize('report', ['film_quickstart', 'film_freeze'])
def test_film_title_and_error_bars(report, tmp_path):
  fig, rows, stored = _film_figure(report, tmp_path)
  name = stored['data'] or 'quickstart corpus'
  assert fig._suptitle.get_text() == f'FILM on {stored["model"]}, {name}'
  # Error bars (mean ± std) end inside the y axis.
  low, high = fig.axes[0].get_ylim()
  for defense in {r.get('defense', 'none') for r in rows}:
    for b in {r['b'] for r in rows}:
      rs = [
        r for r in rows if r['b'] == b and r.get('defense', 'none') == defense
      ]
      for f in ('rouge1', 'rouge2', 'rougeL', 'nerr'):
        mean, std = film_tables.mean_std(rs, f)
        if not math.isnan(mean):
          assert low <= mean - std and mean + std <= high, (b, f)
  # The paper is drawn on the undefended panel only.
  assert len(_paper_lines(fig.axes[0])) == 4
  assert all(not _paper_lines(ax) for ax in fig.axes[1:])
  plt.close(fig)


# ------------------------------------------------------------ Embed Parrot


@pytest.mark.parametrize('report', EMBED_PARROT)
def test_embed_parrot_figures_render(report, tmp_path):
  run = _copy_run(report, tmp_path)
  written = embed_parrot_plots.rerender_plots(run)
  committed = sorted(
    p.name
    for p in (REPORTS / report).glob('*.png')
    if p.name in ('layers.png', 'ep_training.png')
  )
  assert sorted(written) == committed
  _assert_pngs(run, written)


def _embed_parrot_inputs(report: str, tmp_path):
  run = _copy_run(report, tmp_path)
  stored = json.loads((run / 'config.json').read_text())
  cfg = types.SimpleNamespace(
    model=stored['model'],
    corpora=stored['corpora'],
    train_corpus=stored['train_corpus'],
  )
  summary = json.loads((run / 'summary.json').read_text())
  names = [name for name, _ in embed_parrot_plots.corpus_pairs(cfg)]
  return run, stored, cfg, summary, names


def _grey(line) -> bool:
  return matplotlib.colors.same_color(line.get_color(), 'grey')


def test_embed_parrot_layers_legend_outside_paper_at_the_runs_layers(
  tmp_path,
):
  _, stored, cfg, summary, names = _embed_parrot_inputs(
    'embed_parrot', tmp_path
  )
  layers = [x if x == 'last' else int(x) for x in stored['layers']]
  deep = stored['deep_layer']
  variants = list(stored['ep_variants'])
  fig = embed_parrot_plots.layers_figure(
    cfg, summary, names, layers, deep, variants
  )
  title = fig._suptitle.get_text()
  assert cfg.model in title and f'trained on {cfg.train_corpus}' in title
  for ax in fig.axes:
    # The paper: Table 2's BEI and HEI over the run's 8 layers, and its
    # EP (Table 4) at layer 30 only.
    paper = [line for line in ax.get_lines() if _grey(line)]
    assert [len(line.get_xdata()) for line in paper] == [8, 8, 1]
    low, high = ax.get_xlim()
    assert all(low < x < high for line in paper for x in line.get_xdata())
    (ep,) = [line for line in paper if len(line.get_xdata()) == 1]
    assert round(ep.get_xdata()[0]) == 6  # layer 30, the 7th tick
  hei_rouge1 = embed_parrot_paper.PAPER_TABLE2['hei']['rouge1']
  assert list(
    next(
      line.get_ydata()
      for line in fig.axes[0].get_lines()
      if _grey(line) and line.get_linestyle() == '-'
    )
  ) == list(hei_rouge1)
  _assert_legends_off_the_data(fig)
  plt.close(fig)


def test_embed_parrot_single_layer_run_draws_both_paper_points(tmp_path):
  # A run at layer 30 with EP+PPL: the paper's EP and EP+PPL (Table 4)
  # beside the run's points, apart from each other.
  _, stored, cfg, summary, names = _embed_parrot_inputs(
    'embed_parrot/pretrained/layer_30', tmp_path
  )
  fig = embed_parrot_plots.layers_figure(
    cfg, summary, names, [30], 30, ['ep_pretrained', 'ep_pretrained_ppl']
  )
  points = [
    line
    for line in fig.axes[0].get_lines()
    if _grey(line) and line.get_marker() in ('*', 'P')
  ]
  assert sorted(line.get_marker() for line in points) == ['*', 'P']
  assert len({line.get_xdata()[0] for line in points}) == 2
  _assert_legends_off_the_data(fig)
  plt.close(fig)


def test_embed_parrot_training_legend_outside_title_from_config(tmp_path):
  run, _, cfg, summary, _ = _embed_parrot_inputs(
    'embed_parrot/pretrained/samples_layer_25', tmp_path
  )
  history = json.loads((run / 'ep_pretrained_history.json').read_text())
  fig = embed_parrot_plots.training_figure(
    cfg, summary, 25, {'ep_pretrained': history}
  )
  title = fig.axes[0].get_title()
  assert cfg.model in title and cfg.train_corpus in title
  assert f'{summary["num_train_samples"]} samples' in title
  _assert_legends_off_the_data(fig)
  plt.close(fig)
