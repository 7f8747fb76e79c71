"""Named data sets: cache, mirror, download, sha256 checks, the CLI."""

import hashlib
from pathlib import Path

import pytest

from leakjax import data, datasets, provenance
from leakjax.errors import LeakjaxError

TEXT = 'First line of the corpus.\nSecond line.\n'


@pytest.fixture
def toy(tmp_path, monkeypatch):
  """A registry with one data set `toy`, an empty cache and no mirror."""
  source = tmp_path / 'src' / 'toy.txt'
  source.parent.mkdir()
  source.write_text(TEXT)
  entry = datasets.Dataset(
    name='toy',
    filename='toy.txt',
    sha256=hashlib.sha256(TEXT.encode()).hexdigest(),
    url=source.as_uri(),
    mirror_path='toys/toy.txt',
    source='a test file',
    licence='CC0',
    citation='none',
  )
  monkeypatch.setattr(datasets, 'REGISTRY', {'toy': entry})
  monkeypatch.setenv('LEAKJAX_DATA', str(tmp_path / 'cache'))
  monkeypatch.delenv('LEAKJAX_DATA_MIRROR', raising=False)
  return entry, source, tmp_path


def test_download_verifies_and_caches(toy):
  entry, _, tmp = toy
  path = datasets.path('toy')
  assert path == tmp / 'cache' / 'toy' / 'toy.txt'
  assert path.read_text() == TEXT
  assert data.load_corpus('toy') == [
    'First line of the corpus.',
    'Second line.',
  ]


def test_a_download_with_other_bytes_is_refused(toy, monkeypatch):
  entry, source, tmp = toy
  source.write_text(TEXT + 'tampered\n')
  with pytest.raises(LeakjaxError, match='did not serve the pinned file'):
    datasets.path('toy')
  assert not (tmp / 'cache' / 'toy' / 'toy.txt').exists()


def test_mirror_is_used_before_the_url(toy, monkeypatch):
  entry, _, tmp = toy
  mirror = tmp / 'mirror'
  (mirror / 'toys').mkdir(parents=True)
  (mirror / 'toys' / 'toy.txt').write_text(TEXT)
  monkeypatch.setattr(
    datasets,
    'REGISTRY',
    {'toy': datasets.Dataset(**{**vars(entry), 'url': None})},
  )
  monkeypatch.setenv('LEAKJAX_DATA_MIRROR', str(mirror))
  assert datasets.path('toy').read_text() == TEXT
  (mirror / 'toys' / 'toy.txt').write_text('other')
  (tmp / 'cache' / 'toy' / 'toy.txt').unlink()
  with pytest.raises(LeakjaxError, match='mirror file .* does not have'):
    datasets.path('toy')


def test_offline_error_says_what_to_put_where(toy, monkeypatch):
  entry, _, tmp = toy
  offline = datasets.Dataset(
    **{**vars(entry), 'url': None, 'how': 'ask the authors'}
  )
  monkeypatch.setattr(datasets, 'REGISTRY', {'toy': offline})
  with pytest.raises(LeakjaxError) as info:
    datasets.path('toy')
  message = str(info.value)
  assert 'ask the authors' in message
  assert str(tmp / 'cache' / 'toy' / 'toy.txt') in message
  assert entry.sha256 in message


def test_a_damaged_cached_file_is_refused(toy):
  path = datasets.path('toy')
  path.write_text('damaged')
  with pytest.raises(LeakjaxError, match='damaged or replaced'):
    datasets.path('toy')


def test_unknown_name_lists_the_known_ones():
  with pytest.raises(LeakjaxError, match='use one of film-enron'):
    datasets.get('enron')


def test_provenance_fingerprints_a_named_data_set(toy):
  record = provenance.fingerprint_inputs({'data': 'toy'})
  assert record['data']['sha256'] == toy[0].sha256
  assert record['data']['path'].endswith('toy/toy.txt')


def test_cli(toy, capsys):
  assert datasets.main(['verify']) == 0
  assert 'toy: not fetched' in capsys.readouterr().out
  assert datasets.main(['fetch']) == 0
  assert datasets.main(['verify']) == 0
  assert 'toy: ok' in capsys.readouterr().out
  assert datasets.main(['list']) == 0
  assert 'CC0' in capsys.readouterr().out
  assert datasets.main(['nonsense']) == 2


def test_registry_pins_every_entry():
  for d in datasets.REGISTRY.values():
    if d.sha256 is not None:
      assert len(d.sha256) == 64
    else:
      assert len(d.git_blob) == 40 and d.url  # a git blob needs its repo
    assert d.licence and d.citation
    assert d.url or d.how  # some way to get the file
  with pytest.raises(ValueError, match='needs a sha256 or git_blob'):
    datasets.Dataset('x', 'x', None, None, 'x', 'x', 'x', 'x')


def test_git_blob_pin_is_git_hash_object(toy, monkeypatch):
  # `git hash-object` of TEXT, computed by git: the id a pinned blob has.
  entry, _, tmp = toy
  want = '253cf60d833651e7ef5f833617f26ffd18748fdb'
  assert datasets.git_blob_id(toy[1]) == want
  by_blob = datasets.Dataset(
    **{**vars(entry), 'sha256': None, 'git_blob': want}
  )
  monkeypatch.setattr(datasets, 'REGISTRY', {'toy': by_blob})
  assert datasets.path('toy').read_text() == TEXT
  datasets.path('toy').write_text('damaged')
  with pytest.raises(LeakjaxError, match='damaged or replaced'):
    datasets.path('toy')


@pytest.mark.slow
def test_nothing_in_the_repository_points_at_a_local_mirror():
  # Flagfiles, defaults, reports and benchmarks name data sets; a path
  # into one machine's mirror folder would not exist anywhere else.
  root = Path(__file__).resolve().parents[1]
  needles = ('../' + 'shared/', 'shared/' + 'data/')  # split: no self-match
  offenders = []
  for path in root.rglob('*'):
    rel = path.relative_to(root)
    if rel.parts[0].startswith('.') and rel.parts[0] != '.ci':
      continue
    if not path.is_file() or path.suffix in ('.png', '.pyc', '.safetensors'):
      continue
    try:
      text = path.read_text()
    except (UnicodeDecodeError, OSError):
      continue
    if any(n in text for n in needles):
      offenders.append(str(rel))
  assert not offenders
