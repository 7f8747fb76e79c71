"""Every plot of the GBoard, differential and DAGER reports renders.

Each report module re-draws its figures from a finished run's folder
(config.json, summary.json, results.jsonl); the committed report folders
are such runs, copied here into tmp_path.
"""

import json
import pathlib
import shutil
import types

import pytest

from experiments import dager_report, differential_report, gboard_report
from leakjax.attacks.gboard import runner

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUN_FILES = ('config.json', 'summary.json', 'summary.md', 'results.jsonl')
PNG = b'\x89PNG\r\n\x1a\n'


def _copy_run(report: str, tmp_path) -> pathlib.Path:
  out = tmp_path / report.replace('/', '_')
  out.mkdir()
  for name in RUN_FILES:
    if (ROOT / 'reports' / report / name).is_file():
      shutil.copy(ROOT / 'reports' / report / name, out / name)
  return out


def _assert_pngs(folder: pathlib.Path, names) -> None:
  for name in names:
    data = (folder / name).read_bytes()
    assert data.startswith(PNG) and len(data) > 1000, name


def test_gboard_word_recovery_figure(tmp_path):
  # Fig. 2 alone (the full set is slow): rule F1, its bound, their ratio.
  run = _copy_run('gboard/quick', tmp_path)
  cfg = runner.load_config(run)
  summary = json.loads((run / 'summary.json').read_text())
  res = [json.loads(x) for x in (run / 'results.jsonl').open()]
  colors = dict.fromkeys(cfg.num_sentences, 'k')
  fig = gboard_report._word_recovery_figure(cfg, summary, res, colors)
  assert [ax.get_ylabel() for ax in fig.axes[::2]] == [
    'word F1',
    'F1 / vocabulary bound',
  ]
  fig.savefig(tmp_path / 'fig2.png')
  _assert_pngs(tmp_path, ['fig2.png'])


@pytest.mark.slow
def test_gboard_figures_render(tmp_path):
  run = _copy_run('gboard/quick', tmp_path)
  written = gboard_report.rerender_plots(run)
  # Fig. 5 needs the run's update files (deltas/), which are not committed.
  assert written == [
    'fig2_word_recovery.png',
    'fig3_sentence_reconstruction.png',
    'fig4_fedsgd_scaling.png',
    'fig6_local_dp_words.png',
    'fig7_local_dp_sentences.png',
  ]
  _assert_pngs(run, written)


@pytest.mark.slow
def test_gboard_figures_render_with_several_datasets(tmp_path):
  # Several datasets per setting: Fig. 2 draws their spread.
  run = _copy_run('gboard/heldout', tmp_path)
  _assert_pngs(run, gboard_report.rerender_plots(run))


def test_differential_figure_renders(tmp_path):
  run = _copy_run('differential/retrain_rel_ds', tmp_path)
  path = pathlib.Path(differential_report.rerender_plot(run))
  assert path == run / 'ds_dr.png'
  _assert_pngs(run, ['ds_dr.png'])


def test_dager_figure_renders_and_names_the_data(tmp_path):
  run = _copy_run('dager/quick', tmp_path)
  path = pathlib.Path(dager_report.rerender_plot(run))
  assert path == run / 'dager_vs_tokens.png'
  _assert_pngs(run, ['dager_vs_tokens.png'])


def test_dager_title_names_the_configs_data():
  cfg = types.SimpleNamespace(model='tiny', data='/data/mails/sms.txt')
  rows = [
    dict(
      attack='dager', defense='none', b=b, num_tokens=9 * b, rougeL=r, exact=r
    )
    for b, r in ((1, 1.0), (1, 0.5), (4, 0.0))
  ]
  fig = dager_report.plot(cfg, rows, {'hidden_size': 16})
  assert fig._suptitle.get_text() == 'tiny, consecutive sms.txt batches'
  cfg.data = 'hub:org/set:train'
  assert dager_report.data_name(cfg) == 'hub:org/set:train'


@pytest.mark.parametrize('report', ['dager/hybrid_b128', 'dager/defenses'])
def test_dager_single_point_and_many_series(report, tmp_path):
  run = _copy_run(report, tmp_path)
  dager_report.rerender_plot(run)
  _assert_pngs(run, ['dager_vs_tokens.png'])
