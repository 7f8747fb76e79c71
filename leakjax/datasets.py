"""Named data sets: where each corpus comes from, its sha256, its licence.

`--data=film-enron` (and the other names below) works wherever a corpus
path does (:func:`leakjax.data.load_corpus`). A name resolves to a file in
the cache folder, `$LEAKJAX_DATA` (default `~/.cache/leakjax/data`), which
is filled on first use from

1. a local mirror: each folder of `$LEAKJAX_DATA_MIRROR` (a
   `os.pathsep`-separated list) holding the file at its `mirror_path`, or
2. the data set's URL (pinned to a commit where the source is a git
   repository),

and is verified against its pinned hash every time it is resolved (once
per process and file): its sha256 or, for a file only known by its place
in a git repository, its git blob id (`git hash-object`, the SHA-1 of
`blob <size>\\0` and the bytes; `wikitext-2-train`). Without a mirror or network, the error says which
file to put where.

  python -m leakjax.data list            # names, sources, licences, status
  python -m leakjax.data fetch NAME...   # into the cache (all by default)
  python -m leakjax.data verify          # hash of every cached file
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from leakjax.errors import LeakjaxError


@dataclasses.dataclass(frozen=True)
class Dataset:
  """One named corpus file.

  Attributes:
    name: what `--data` takes.
    filename: the file's name in the cache.
    sha256: of the file's bytes; None when only `git_blob` is known.
    url: where to download it; None: no stable URL (see `how`).
    mirror_path: its path inside a mirror folder.
    source: where it comes from, in words.
    licence: its licence.
    citation: what to cite.
    how: how to get the file by hand, when `url` cannot serve it.
    git_blob: the file's git blob id in the repository `url` points into
      (at the pinned commit), checked when `sha256` is None.
  """

  name: str
  filename: str
  sha256: str | None
  url: str | None
  mirror_path: str
  source: str
  licence: str
  citation: str
  how: str = ''
  git_blob: str | None = None

  def __post_init__(self):
    if not self.sha256 and not self.git_blob:
      raise ValueError(f'data set {self.name!r} needs a sha256 or git_blob')

  @property
  def pin(self) -> str:
    """The pinned hash, as error messages name it."""
    if self.sha256:
      return f'sha256 {self.sha256}'
    return f'git blob {self.git_blob}'


REGISTRY: dict[str, Dataset] = {
  d.name: d
  for d in (
    Dataset(
      name='film-enron',
      filename='dataset.json',
      sha256='e44d4b0a973d50565998b61a70148f5adbb7be132d3dbcc919a548c95a4f4fe7',
      url=(
        'https://raw.githubusercontent.com/Princeton-SysML/FILM/'
        'e615571b1562e35271e42c90151c5f950f92423e/experiments/enron/'
        'dataset.json'
      ),
      mirror_path='enron_film/dataset.json',
      source=(
        "FILM's preprocessed Enron e-mail sentences (31,797, JSON list), file"
        ' experiments/enron/dataset.json of github.com/Princeton-SysML/FILM'
      ),
      licence='CC0 1.0',
      citation=(
        'Gupta et al., Recovering Private Text in Federated Learning of'
        ' Language Models, NeurIPS 2022; Klimt & Yang, The Enron Corpus, 2004'
      ),
    ),
    Dataset(
      name='wikitext-2-valid',
      filename='valid.txt',
      sha256='f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8',
      url=(
        'https://raw.githubusercontent.com/pytorch/examples/'
        '37ce9402ff0cae48d764d7788810fd2ed8238b25/word_language_model/data/'
        'wikitext-2/valid.txt'
      ),
      mirror_path='wikitext-2/valid.txt',
      source=(
        'WikiText-2 validation split (tokenized, <unk>), as copied in'
        ' github.com/pytorch/examples word_language_model/data/wikitext-2'
      ),
      licence='CC BY-SA 3.0',
      citation='Merity et al., Pointer Sentinel Mixture Models, 2016',
    ),
    Dataset(
      name='wikitext-2-test',
      filename='test.txt',
      sha256='d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0',
      url=(
        'https://raw.githubusercontent.com/pytorch/examples/'
        '37ce9402ff0cae48d764d7788810fd2ed8238b25/word_language_model/data/'
        'wikitext-2/test.txt'
      ),
      mirror_path='wikitext-2/test.txt',
      source=(
        'WikiText-2 test split (tokenized, <unk>), as copied in'
        ' github.com/pytorch/examples word_language_model/data/wikitext-2'
      ),
      licence='CC BY-SA 3.0',
      citation='Merity et al., Pointer Sentinel Mixture Models, 2016',
    ),
    Dataset(
      name='wikitext-2-train',
      filename='train.txt',
      sha256=None,
      # The git blob of train.txt at that commit of pytorch/examples (the
      # file itself, 10.8 MB, was not reachable where this entry was made;
      # valid.txt and test.txt, at blobs eec944eb and 6f3fc88e of the same
      # tree, have the sha256 pinned above).
      git_blob='2d84b35af79e411d73ea7cae83c73964c6ac83b4',
      url=(
        'https://raw.githubusercontent.com/pytorch/examples/'
        '37ce9402ff0cae48d764d7788810fd2ed8238b25/word_language_model/data/'
        'wikitext-2/train.txt'
      ),
      mirror_path='wikitext-2/train.txt',
      source=(
        'WikiText-2 training split (tokenized, <unk>), as copied in'
        ' github.com/pytorch/examples word_language_model/data/wikitext-2'
      ),
      licence='CC BY-SA 3.0',
      citation='Merity et al., Pointer Sentinel Mixture Models, 2016',
    ),
    Dataset(
      name='sms-spam',
      filename='SMSSpamCollection.tsv',
      sha256='fae7ea7d915ef73903e5c2f46ffa2f4a39909a574e20fda4f2b81f7cb1e15e1f',
      url=None,
      mirror_path='sms_spam/SMSSpamCollection.tsv',
      source=(
        'UCI SMS Spam Collection v.1 (5,574 messages, label<TAB>text), with'
        ' a header line Label<TAB>SMS'
      ),
      licence='CC BY 4.0',
      citation=(
        'Almeida & Gómez Hidalgo, SMS Spam Collection v.1, UCI Machine'
        ' Learning Repository, 2011'
      ),
      how=(
        'download https://archive.ics.uci.edu/static/public/228/'
        'sms+spam+collection.zip, unzip SMSSpamCollection and add the header:'
        " printf 'Label\\tSMS\\n' | cat - SMSSpamCollection >"
        ' SMSSpamCollection.tsv'
      ),
    ),
  )
}

_VERIFIED: set[tuple[str, int, int]] = set()


def data_dir() -> Path:
  """The cache folder: `$LEAKJAX_DATA`, else `~/.cache/leakjax/data`."""
  env = os.environ.get('LEAKJAX_DATA')
  if env:
    return Path(env).expanduser()
  base = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
  return Path(base) / 'leakjax' / 'data'


def mirrors() -> list[Path]:
  """The folders of `$LEAKJAX_DATA_MIRROR`."""
  env = os.environ.get('LEAKJAX_DATA_MIRROR', '')
  return [Path(p).expanduser() for p in env.split(os.pathsep) if p]


def cached_path(name: str) -> Path:
  """Where `name` lives in the cache (whether or not it is there yet)."""
  return data_dir() / name / get(name).filename


def get(name: str) -> Dataset:
  if name not in REGISTRY:
    raise LeakjaxError(
      f'unknown data set {name!r}', f'use one of {", ".join(REGISTRY)}'
    )
  return REGISTRY[name]


def git_blob_id(path: str | os.PathLike) -> str:
  """`git hash-object PATH`: the SHA-1 of `blob <size>\\0` and the bytes."""
  digest = hashlib.sha1(f'blob {os.path.getsize(path)}\0'.encode())
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _matches(path: Path, dataset: Dataset) -> bool:
  from leakjax import provenance  # pylint: disable=g-import-not-at-top

  stat = path.stat()
  key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
  if key in _VERIFIED:
    return True
  if dataset.sha256:
    if provenance.file_sha256(path) != dataset.sha256:
      return False
  elif git_blob_id(path) != dataset.git_blob:
    return False
  _VERIFIED.add(key)
  return True


def _install(source: Path, target: Path) -> None:
  target.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=target.parent, prefix='.' + target.name)
  os.close(fd)
  shutil.copyfile(source, tmp)
  os.replace(tmp, target)


def _download(url: str, target: Path) -> Path:
  target.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=target.parent, prefix='.' + target.name)
  os.close(fd)
  try:
    with (
      urllib.request.urlopen(url, timeout=60) as response,
      open(tmp, 'wb') as out,
    ):
      shutil.copyfileobj(response, out)
  except (urllib.error.URLError, OSError) as e:
    os.unlink(tmp)
    raise OSError(str(getattr(e, 'reason', e))) from None
  return Path(tmp)


def path(name: str, *, download: bool = True) -> Path:
  """The verified local file of data set `name`, fetched if needed.

  Raises:
    LeakjaxError: unknown name; a cached or mirrored file with another
      sha256; no mirror holds it and it cannot be downloaded (the message
      names the file to put where).
  """
  dataset = get(name)
  target = cached_path(name)
  if target.exists():
    if _matches(target, dataset):
      return target
    raise LeakjaxError(
      f'{target} does not have the pinned hash of data set {name!r}'
      f' ({dataset.pin[:20]}…): damaged or replaced',
      f'delete it and run: python -m leakjax.data fetch {name}',
    )
  for mirror in mirrors():
    candidate = mirror / dataset.mirror_path
    if candidate.is_file():
      if not _matches(candidate, dataset):
        raise LeakjaxError(
          f'mirror file {candidate} does not have the pinned hash of data'
          f' set {name!r} ({dataset.pin[:20]}…)',
          'fix the mirror or drop it from $LEAKJAX_DATA_MIRROR',
        )
      _install(candidate, target)
      return target
  reason = 'no URL'
  if dataset.url and download:
    try:
      tmp = _download(dataset.url, target)
    except OSError as e:
      reason = f'download failed: {e}'
    else:
      if not _matches(tmp, dataset):
        tmp.unlink()
        raise LeakjaxError(
          f'{dataset.url} did not serve the pinned file of {name!r}'
          f' ({dataset.pin[:20]}…)',
          'report it; meanwhile put a verified copy in the cache',
        )
      os.replace(tmp, target)
      return target
  how = dataset.how or f'download {dataset.url}'
  raise LeakjaxError(
    f'data set {name!r} is not at {target} ({reason}; no mirror in'
    ' $LEAKJAX_DATA_MIRROR holds it)',
    f'{how}, and put it at {target} ({dataset.pin}), or set'
    f' $LEAKJAX_DATA_MIRROR to a folder holding {dataset.mirror_path}',
  )


def main(argv: list[str]) -> int:
  """`list | fetch [NAME...] | verify`; returns the exit status."""
  command, names = (argv[0] if argv else 'list'), argv[1:]
  if command == 'list':
    for d in REGISTRY.values():
      target = cached_path(d.name)
      state = 'cached' if target.exists() else 'not fetched'
      print(f'{d.name}: {d.source}; {d.licence}; cite {d.citation}')
      print(f'  {state}: {target}')
    return 0
  if command in ('fetch', 'verify'):
    status = 0
    for name in names or list(REGISTRY):
      try:
        if command == 'verify' and not cached_path(name).exists():
          print(f'{name}: not fetched')
          continue
        print(f'{name}: ok, {path(name, download=command == "fetch")}')
      except LeakjaxError as e:
        print(f'{name}: {e}', file=sys.stderr)
        status = 2
    return status
  print('usage: python -m leakjax.data list|fetch [NAME...]|verify')
  return 2


__all__ = [
  'REGISTRY',
  'Dataset',
  'cached_path',
  'data_dir',
  'get',
  'main',
  'mirrors',
  'path',
]
