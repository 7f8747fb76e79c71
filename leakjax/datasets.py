"""Named data sets: where each corpus comes from, its sha256, its licence.

`--data=film-enron` (and the other names below) works wherever a corpus
path does (:func:`leakjax.data.load_corpus`). A name resolves to a file in
the cache folder, `$LEAKJAX_DATA` (default `~/.cache/leakjax/data`), at
`<name>/<filename>`, which is filled on first use from

1. a local mirror: each folder of `$LEAKJAX_DATA_MIRROR` (a
   `os.pathsep`-separated list) holding the file in a folder named as the
   data set (the cache's layout, read first: a copy of a cache folder is a
   mirror) or in the folder of the older layout:

     named as the data set           older folder name
     film-enron/dataset.json         enron_film/dataset.json
     wikitext-2-valid/valid.txt      wikitext-2/valid.txt
     wikitext-2-test/test.txt        wikitext-2/test.txt
     wikitext-2-train/train.txt      wikitext-2/train.txt
     sms-spam/SMSSpamCollection.tsv  sms_spam/SMSSpamCollection.tsv

   (a mirror's `sms-spam` file may also be UCI's SMSSpamCollection as
   unzipped, without the `header` line, under either name above), or
2. the data set's URL (pinned to a commit where the source is a git
   repository),

and is verified against its pinned hash every time it is resolved (once
per process and file): its sha256 or, for a file only known by its place
in a git repository, its git blob id (`git hash-object`, the SHA-1 of
`blob <size>\\0` and the bytes; `wikitext-2-train`). An experiment
resolves all the data sets of its config before any work
(:func:`require`), and one error names every missing one with the command
or mirror layout that supplies them.

  python -m leakjax.data list            # names, sources, licences, status
  python -m leakjax.data fetch NAME...   # into the cache (all by default)
  python -m leakjax.data add NAME FILE   # a file got by hand, checked
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
    url: where to download it; None: no URL whose bytes are pinned (`how`
      says why and how to get the file).
    mirror_path: its path inside a mirror folder of the older layout (a
      mirror laid out as the cache, `<name>/<filename>`, is read first).
    source: where it comes from, in words.
    licence: its licence.
    citation: what to cite.
    how: how to get the file by hand, when `url` cannot serve it.
    git_blob: the file's git blob id in the repository `url` points into
      (at the pinned commit), checked when `sha256` is None.
    header: a first line the file has and its upstream copy lacks:
      `python -m leakjax.data add` puts it in front of a file without it.
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
  header: str = ''

  def __post_init__(self):
    if not self.sha256 and not self.git_blob:
      raise ValueError(f'data set {self.name!r} needs a sha256 or git_blob')

  @property
  def pin(self) -> str:
    """The pinned hash, as error messages name it."""
    if self.sha256:
      return f'sha256 {self.sha256}'
    return f'git blob {self.git_blob}'

  @property
  def mirror_paths(self) -> tuple[str, ...]:
    """Where a mirror folder may hold the file: laid out as the cache, then
    at the older `mirror_path`."""
    return tuple(
      dict.fromkeys((f'{self.name}/{self.filename}', self.mirror_path))
    )


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
      # No URL: UCI serves the collection only inside a zip archive, as
      # SMSSpamCollection without the header line, and the archive's bytes
      # are not pinned here; `add` checks the file against the sha256 above.
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
        'no URL is pinned (UCI serves it inside a zip archive whose bytes'
        ' are not pinned here): download "SMS Spam Collection" (data set'
        ' 228 of the UCI Machine Learning Repository,'
        ' https://archive.ics.uci.edu/static/public/228/'
        'sms+spam+collection.zip), unzip it and run: python -m leakjax.data'
        ' add sms-spam SMSSpamCollection (puts the header line Label<TAB>SMS'
        ' in front and checks the sha256), or put SMSSpamCollection in a'
        ' mirror folder as sms-spam/SMSSpamCollection.tsv'
      ),
      header='Label\tSMS\n',
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


def _install_checked(source: Path, dataset: Dataset, target: Path) -> bool:
  """Installs `source` at `target` if it has the pinned hash, or has it
  once `dataset.header` is put in front (the upstream copy without that
  line); False if neither."""
  if _matches(source, dataset):
    _install(source, target)
    return True
  if dataset.header:
    with tempfile.TemporaryDirectory() as tmp:
      joined = Path(tmp) / dataset.filename
      joined.write_bytes(dataset.header.encode() + source.read_bytes())
      if _matches(joined, dataset):
        _install(joined, target)
        return True
  return False


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


class MissingDataError(LeakjaxError):
  """A named data set is in neither the cache nor a mirror, and cannot be
  downloaded."""

  def __init__(self, names, reason: str):
    self.names = list(names)
    self.reason = reason
    super().__init__(*_missing_message(self.names, reason))


def _missing_message(names: list[str], reason: str) -> tuple[str, str]:
  """(problem, fix) for the data sets `names`, none of them available."""
  sets = [get(n) for n in names]
  folders = os.pathsep.join(str(m) for m in mirrors())
  mirror = (
    f'no folder of $LEAKJAX_DATA_MIRROR={folders} holds them'
    if folders
    else '$LEAKJAX_DATA_MIRROR is not set'
  )
  many = len(names) > 1
  problem = (
    f'data set{"s" if many else ""} {", ".join(names)}'
    f' {"are" if many else "is"} not in the cache {data_dir()}'
    f' ({reason}; {mirror})'
  )
  fixes = []
  fetchable = [d.name for d in sets if d.url]
  if fetchable:
    fixes.append(
      f'run: python -m leakjax.data fetch {" ".join(fetchable)} (needs network)'
    )
  fixes += [f'{d.name}: {d.how}' for d in sets if not d.url]
  fixes.append(
    'or set LEAKJAX_DATA_MIRROR to a folder holding '
    + ', '.join(d.mirror_paths[0] for d in sets)
    + f', or put the file{"s" if many else ""} at '
    + ', '.join(f'{cached_path(d.name)} ({d.pin})' for d in sets)
  )
  return problem, '; '.join(fixes)


def path(name: str, *, download: bool = True) -> Path:
  """The verified local file of data set `name`, fetched if needed.

  Raises:
    LeakjaxError: unknown name; a cached or mirrored file with another
      sha256.
    MissingDataError: no mirror holds it and it cannot be downloaded (the
      message names the file to put where).
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
  for candidate in (m / p for m in mirrors() for p in dataset.mirror_paths):
    if candidate.is_file():
      if not _install_checked(candidate, dataset, target):
        raise LeakjaxError(
          f'mirror file {candidate} does not have the pinned hash of data'
          f' set {name!r} ({dataset.pin[:20]}…)',
          'fix the mirror or drop it from $LEAKJAX_DATA_MIRROR',
        )
      return target
  reason = f'{name} has no URL' if not dataset.url else 'not downloaded'
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
  raise MissingDataError([name], reason)


def require(names) -> dict[str, Path]:
  """The verified files of the data sets `names`, all resolved at once.

  An experiment calls it before any work, so a missing data set stops it
  at the start and one error names every missing one. After the first
  failed download no other is tried (offline, each would fail alike).

  Raises:
    MissingDataError: naming every unavailable data set of `names` and
      how to supply each (fetch, add, or a mirror folder).
    LeakjaxError: unknown name, or a file with another hash.
  """
  found, missing, reasons, download = {}, [], [], True
  for name in dict.fromkeys(names):
    try:
      found[name] = path(name, download=download)
    except MissingDataError as e:
      missing.append(name)
      reasons.append(e.reason)
      download = download and not e.reason.startswith('download failed')
  if missing:
    reason = '; '.join(
      dict.fromkeys(r for r in reasons if r != 'not downloaded')
    )
    raise MissingDataError(missing, reason or 'not downloaded')
  return found


def add(name: str, source: str | os.PathLike) -> Path:
  """Puts the file `source` into the cache as data set `name`.

  The file must have the pinned hash, or, for a data set with a `header`,
  have it once that line is put in front (the upstream copy without it).

  Raises:
    LeakjaxError: unknown name, unreadable file, or neither form matches.
  """
  dataset = get(name)
  source = Path(source).expanduser()
  if not source.is_file():
    raise LeakjaxError(f'{source} is not a file', 'check the path')
  target = cached_path(name)
  if _install_checked(source, dataset, target):
    return target
  raise LeakjaxError(
    f'{source} does not have the pinned hash of data set {name!r}'
    f' ({dataset.pin})',
    f'get the file as the data set says: {dataset.how or dataset.url}',
  )


def main(argv: list[str]) -> int:
  """`list | fetch [NAME...] | add NAME FILE | verify`; returns the exit
  status."""
  command, names = (argv[0] if argv else 'list'), argv[1:]
  if command == 'list':
    for d in REGISTRY.values():
      target = cached_path(d.name)
      state = 'cached' if target.exists() else 'not fetched'
      print(f'{d.name}: {d.source}; {d.licence}; cite {d.citation}')
      print(f'  {state}: {target}')
      print(f'  from: {d.url}' if d.url else f'  by hand: {d.how}')
    return 0
  if command == 'add' and len(names) == 2:
    try:
      print(f'{names[0]}: ok, {add(*names)}')
    except LeakjaxError as e:
      print(f'{names[0]}: {e}', file=sys.stderr)
      return 2
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
  print(
    'usage: python -m leakjax.data list|fetch [NAME...]|add NAME FILE|verify'
  )
  return 2


__all__ = [
  'REGISTRY',
  'Dataset',
  'MissingDataError',
  'add',
  'cached_path',
  'data_dir',
  'get',
  'main',
  'mirrors',
  'path',
  'require',
]
