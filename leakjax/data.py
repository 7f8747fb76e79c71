"""Text corpora: one loader for every experiment, and fixed-shape batches.

:func:`load_corpus` reads the `--data` of every experiment: a local `.txt`
(one example per line), `.json` / `.jsonl` (strings, or objects with a text
field), `.tsv` (header row, tab-separated, no quoting: the UCI SMS Spam file
is `Label<TAB>SMS`), or a Hugging Face `datasets` name (needs network).

:func:`encode_corpus` turns texts into one right-padded `[num_texts, width]`
array pair, and :func:`batch_indices` / :func:`take_batch` cut it into
batches that all have the same shape, so a jitted step compiles once:

>>> ids, mask, _ = encode_corpus(tok, texts, 64)  # doctest: +SKIP
>>> for rows in batch_indices(len(ids), 16, seed=0):  # doctest: +SKIP
...   batch_ids, batch_mask = take_batch(ids, mask, rows)
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from leakjax import datasets
from leakjax.errors import LeakjaxError

SUFFIXES = ('.txt', '.json', '.jsonl', '.tsv')
HUB_PREFIX = (
  'hub:'  # hub:NAME[@REVISION][:CONFIG[:SPLIT]], a Hugging Face dataset
)
_TEXT_COLUMNS = ('text', 'sentence', 'content', 'sms')


# ------------------------------------------------------------------ loading
def load_corpus(
  source: str | os.PathLike,
  *,
  split: str = 'train',
  column: str | None = None,
  label: tuple[str, str | Sequence[str]] | str | None = None,
  limit: int | None = None,
) -> list[str]:
  """Loads a list of texts from a named data set, a file or the Hub.

  Args:
    source: the name of a data set of :mod:`leakjax.datasets` (e.g.
      'film-enron'); a `.txt` file (one example per line, blank lines
      skipped), a `.json` file (a list of strings, or a list of objects with
      a text field), a `.jsonl` file (one string or object per line), a
      `.tsv` file (header row; tabs separate fields, quotes are literal); or
      `hub:NAME[@REVISION][:CONFIG[:SPLIT]]`, a Hugging Face dataset
      loaded with `datasets.load_dataset(NAME, CONFIG, split=SPLIT,
      revision=REVISION)` (needs the Hub or its local cache; NAME may also
      be a local folder, without a revision). REVISION, a commit hash of
      the dataset's repository, pins the bytes a run reads; without it the
      Hub serves its latest files (the run's `provenance.json` records
      the sha256 of the texts as loaded either way).
    split: the split of a hub dataset, unless `source` names one.
    column: the text field of objects / TSV rows / hub rows. Default: the
      last TSV column; the field named 'text' (or 'sentence', 'content',
      'sms', any case) of objects and hub rows.
    label: `(field, value)` keeps only the rows whose `field` equals `value`
      (or is one of the values, if a list), e.g. `('Label', 'ham')` for the
      personal messages of the UCI SMS Spam Collection; the string form
      `'Label=ham'` (values separated by commas) is what `--data_label`
      takes.
    limit: keep the first `limit` examples (after filtering).

  Returns:
    The texts, stripped of surrounding whitespace, in file order.

  Raises:
    LeakjaxError: missing or unreadable file, unsupported extension, bad
      JSON, unknown column or label field, or no usable example.
  """
  if limit is not None and limit < 1:
    raise LeakjaxError(f'limit must be positive, got {limit}')
  if isinstance(label, str):
    label = parse_label(label)
  source = str(source)
  if source in datasets.REGISTRY:  # a named data set (leakjax.datasets)
    source = str(datasets.path(source))
  if source.startswith(HUB_PREFIX):
    name, revision, config, hub_split = _parse_hub(source)
    split = hub_split or split
    rows = _read_hub(
      name,
      revision=revision,
      config=config,
      split=split,
      column=column,
      label=label,
    )
    where = f'dataset {source!r} (split {split})'
  else:
    path = Path(source).expanduser()
    if path.is_dir():
      raise LeakjaxError(
        f'{path} is a directory', 'pass a .txt, .json, .jsonl or .tsv file'
      )
    if not path.is_file():
      if _looks_like_path(source):
        raise LeakjaxError(
          f'corpus file {path} does not exist', 'check the path'
        )
      raise LeakjaxError(
        f'{source!r} is neither a file nor a named data set',
        f'use a path, one of {", ".join(datasets.REGISTRY)} (python -m'
        f' leakjax.data list), or {HUB_PREFIX}NAME[@REVISION][:CONFIG[:SPLIT]] for a'
        ' Hugging Face dataset',
      )
    rows = _read_file(path, column=column, label=label)
    where = str(path)
  texts = [t.strip() for t in rows]
  texts = [t for t in texts if t]
  if not texts:
    raise LeakjaxError(
      f'{where} has no non-empty example',
      'check the file, column and label filter',
    )
  return texts[:limit] if limit is not None else texts


def _parse_hub(
  source: str,
) -> tuple[str, str | None, str | None, str | None]:
  """`hub:NAME[@REVISION][:CONFIG[:SPLIT]]` -> (NAME, REVISION, CONFIG,
  SPLIT), each absent part None."""
  parts = source[len(HUB_PREFIX) :].split(':')
  name, _, revision = parts[0].partition('@')
  if not name or len(parts) > 3 or ('@' in parts[0] and not revision):
    raise LeakjaxError(
      f'{source!r} is not {HUB_PREFIX}NAME[@REVISION][:CONFIG[:SPLIT]]',
      f'e.g. {HUB_PREFIX}wikitext:wikitext-2-raw-v1:test',
    )
  parts += [''] * (3 - len(parts))
  return name, revision or None, parts[1] or None, parts[2] or None


def parse_label(text: str) -> tuple[str, tuple[str, ...]]:
  """`'FIELD=VALUE[,VALUE...]'` (what `--data_label` takes) -> (FIELD,
  VALUES)."""
  field, sep, values = text.partition('=')
  wanted = tuple(v.strip() for v in values.split(',') if v.strip())
  if not sep or not field.strip() or not wanted:
    raise LeakjaxError(
      f'label {text!r} is not FIELD=VALUE[,VALUE...]', 'e.g. Label=ham'
    )
  return field.strip(), wanted


def _looks_like_path(source: str) -> bool:
  # Hub names are 'name' or 'owner/name'; anything else is meant as a file.
  return (
    bool(Path(source).suffix)
    or os.path.isabs(source)
    or source.startswith(('.', '~'))
    or source.count('/') > 1
    or '\\' in source
  )


def _read_text(path: Path) -> str:
  try:
    return path.read_text(encoding='utf-8-sig')
  except UnicodeDecodeError as e:
    raise LeakjaxError(
      f'{path} is not UTF-8 text ({e.reason} at byte {e.start})',
      'convert the file to UTF-8',
    ) from None
  except OSError as e:
    raise LeakjaxError(f'cannot read {path}: {e.strerror}') from None


def _read_file(path: Path, *, column, label) -> list[str]:
  suffix = path.suffix.lower()
  if suffix == '.txt':
    if column is not None or label is not None:
      raise LeakjaxError(
        f'{path} is plain text: it has no columns or labels',
        'drop column=/label= or pass a .tsv or .json file',
      )
    return _read_text(path).splitlines()
  if suffix == '.tsv':
    return _read_tsv(path, column=column, label=label)
  if suffix == '.json':
    try:
      items = json.loads(_read_text(path))
    except json.JSONDecodeError as e:
      raise LeakjaxError(f'{path} is not valid JSON: {e}') from None
    if not isinstance(items, list):
      raise LeakjaxError(
        f'{path} holds a JSON {type(items).__name__}, not a list',
        'write a list of strings or of objects with a text field',
      )
    return _texts_from_items(items, str(path), column=column, label=label)
  if suffix == '.jsonl':
    items = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
      if line.strip():
        try:
          items.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise LeakjaxError(
            f'{path} line {n} is not valid JSON: {e}'
          ) from None
    return _texts_from_items(items, str(path), column=column, label=label)
  raise LeakjaxError(
    f'{path} has an unsupported extension {path.suffix!r}',
    'pass a .txt, .json, .jsonl or .tsv file',
  )


def _read_tsv(path: Path, *, column, label) -> list[str]:
  lines = [ln for ln in _read_text(path).splitlines() if ln.strip()]
  if not lines:
    raise LeakjaxError(f'{path} is empty', 'pass a non-empty corpus')
  header = lines[0].split('\t')
  index = {name: i for i, name in enumerate(header)}
  if column is None:
    text_col = len(header) - 1
  elif column in index:
    text_col = index[column]
  else:
    raise LeakjaxError(
      f'{path} has no column {column!r} (columns: {", ".join(header)})',
      'pick one of the columns',
    )
  label_col, wanted = None, None
  if label is not None:
    field, wanted = _parse_label(label)
    if field not in index:
      raise LeakjaxError(
        f'{path} has no label column {field!r} (columns: {", ".join(header)})',
        'pick one of the columns',
      )
    label_col = index[field]
  texts, seen = [], set()
  for n, line in enumerate(lines[1:], 2):
    fields = line.split('\t')
    if len(fields) != len(header):
      raise LeakjaxError(
        f'{path} line {n} has {len(fields)} tab-separated fields, the'
        f' header has {len(header)}',
        'fix the row or remove it',
      )
    if label_col is not None:
      seen.add(fields[label_col])
      if fields[label_col] not in wanted:
        continue
    texts.append(fields[text_col])
  if label is not None and not texts:
    raise LeakjaxError(
      f'no row of {path} has {label[0]} in {sorted(wanted)} (values:'
      f' {", ".join(sorted(seen)[:10])})',
      'fix the label value',
    )
  return texts


def _parse_label(label) -> tuple[str, frozenset[str]]:
  if isinstance(label, str):
    label = parse_label(label)
  try:
    field, value = label
  except (TypeError, ValueError):
    raise LeakjaxError(
      f'label must be a (field, value) pair, got {label!r}'
    ) from None
  values = [value] if isinstance(value, str) else list(value)
  return field, frozenset(str(v) for v in values)


def _texts_from_items(
  items: list[Any], where: str, *, column, label
) -> list[str]:
  """Texts from JSON items: strings, or objects with a text field."""
  if not items:
    return []
  if all(isinstance(x, str) for x in items):
    if column is not None or label is not None:
      raise LeakjaxError(
        f'{where} is a list of strings: it has no fields', 'drop column=/label='
      )
    return items
  if not all(isinstance(x, dict) for x in items):
    kinds = sorted({type(x).__name__ for x in items})
    raise LeakjaxError(
      f'{where} mixes JSON types ({", ".join(kinds)})',
      'write a list of strings or a list of objects with a text field',
    )
  fields = list(items[0])
  column = column or _default_column(fields, where)
  field, wanted = _parse_label(label) if label is not None else (None, None)
  texts = []
  for n, item in enumerate(items):
    if column not in item:
      raise LeakjaxError(
        f'{where} item {n} has no field {column!r} (fields:'
        f' {", ".join(map(str, item))})',
        'pass column= naming the text field',
      )
    if field is not None:
      if field not in item:
        raise LeakjaxError(f'{where} item {n} has no label field {field!r}')
      if str(item[field]) not in wanted:
        continue
    if not isinstance(item[column], str):
      raise LeakjaxError(
        f'{where} item {n}: field {column!r} is a'
        f' {type(item[column]).__name__}, not text'
      )
    texts.append(item[column])
  if field is not None and not texts:
    raise LeakjaxError(
      f'no item of {where} has {field} in {sorted(wanted)}',
      'fix the label value',
    )
  return texts


def _default_column(fields: Sequence[str], where: str) -> str:
  lower = {str(f).lower(): f for f in fields}
  for name in _TEXT_COLUMNS:
    if name in lower:
      return lower[name]
  raise LeakjaxError(
    f'{where}: no text field among {", ".join(fields)}',
    'pass column= naming the text field',
  )


def _hub_unreachable() -> bool:
  """True if the Hub is surely out of reach (saves a minute of retries)."""
  if any(
    os.environ.get(v, '').lower() in ('1', 'true', 'yes')
    for v in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')
  ):
    return False  # datasets fails fast, or finds the dataset in its cache
  if any(
    os.environ.get(v)
    for v in ('HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')
  ):
    return False  # the proxy may reach it even if DNS here cannot
  import socket  # pylint: disable=g-import-not-at-top

  try:
    socket.create_connection(('huggingface.co', 443), timeout=5).close()
  except OSError:
    return True
  return False


def _read_hub(
  name: str, *, revision=None, config, split, column, label
) -> list[str]:
  local = Path(name).expanduser().is_dir()
  if local and revision is not None:
    raise LeakjaxError(
      f'{name} is a local folder: a revision (@{revision}) names a commit'
      ' of a dataset on the Hub',
      f"drop @{revision}, or give the dataset's Hub name",
    )
  try:
    import datasets as hf_datasets  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise LeakjaxError(
      f'{HUB_PREFIX}{name} needs the Hugging Face datasets package',
      'pip install datasets',
    ) from None
  if not local and _hub_unreachable():
    raise LeakjaxError(
      f'dataset {name!r}: the Hugging Face Hub is out of reach (offline)',
      'pass a local .txt, .json, .jsonl or .tsv file, or a named data set',
    )
  try:
    ds = hf_datasets.load_dataset(
      str(Path(name).expanduser()) if local else name,
      config,
      split=split,
      revision=revision,
    )
  except Exception as e:  # noqa: BLE001 (offline, unknown name, ...)
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ''
    raise LeakjaxError(
      f'dataset {name!r} (config {config}, split {split}'
      + (f', revision {revision}' if revision else '')
      + f') could not be loaded with datasets.load_dataset'
      f' ({type(e).__name__}: {first})',
      'check the name, config and split, or pass a local file',
    ) from None
  fields = list(ds.column_names)
  column = column or _default_column(fields, f'dataset {name!r}')
  if column not in fields:
    raise LeakjaxError(
      f'dataset {name!r} has no column {column!r} (columns:'
      f' {", ".join(fields)})',
      'pick one of the columns',
    )
  if label is None:
    return [t for t in ds[column] if isinstance(t, str)]
  field, wanted = _parse_label(label)
  if field not in fields:
    raise LeakjaxError(f'dataset {name!r} has no label column {field!r}')
  return [
    t
    for t, v in zip(ds[column], ds[field], strict=True)
    if isinstance(t, str) and str(v) in wanted
  ]


# -------------------------------------------------------------- sentences
# Words that end in a period without ending a sentence.
_ABBREVIATIONS = frozenset(
  'mr mrs ms dr prof sr jr st mt vs etc inc ltd co corp no fig approx dept'
  ' est gen gov sen rep col capt lt sgt jan feb mar apr jun jul aug sep sept'
  ' oct nov dec e.g i.e a.m p.m u.s u.k cf al'.split()
)
# A candidate boundary: end punctuation, optional closing quotes/brackets,
# whitespace, then something that can start a sentence.
_BOUNDARY = re.compile(r'[.!?]+["\')\]]*\s+(?=["\'(\[]?[A-Z0-9])')
_LAST_WORD = re.compile(r'(\S+)$')


def split_sentences(text: str) -> list[str]:
  """Splits text into sentences with a regex (no model, no extra deps).

  A sentence ends at `.`, `!` or `?` (plus closing quotes or brackets)
  followed by whitespace and an upper-case letter, digit, or opening quote.
  Common abbreviations (`Mr.`, `e.g.`, `Jan.`) and single initials
  (`J. Smith`) do not end a sentence.

  >>> split_sentences('Mr. Smith went home. He slept! Did he? Yes.')
  ['Mr. Smith went home.', 'He slept!', 'Did he?', 'Yes.']
  """
  sentences, start = [], 0
  for m in _BOUNDARY.finditer(text):
    if text[m.start()] == '.':
      word = _LAST_WORD.search(text, 0, m.start())
      word = word.group(1).lstrip('("\'[').lower() if word else ''
      if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        continue
    piece = text[start : m.end()].strip()
    if piece:
      sentences.append(piece)
    start = m.end()
  piece = text[start:].strip()
  if piece:
    sentences.append(piece)
  return sentences


def preprocess_sentences(
  texts: Sequence[str],
  tokenizer,
  *,
  max_tokens: int,
  require_entity: bool = False,
  max_perplexity: float | None = None,
  perplexity_fn: Callable[[list[str]], Sequence[float]] | None = None,
  max_sentences: int | None = None,
  min_sentences: int = 1,
) -> list[str]:
  """The private sentences of FILM's experiments (Gupta et al., App. B.1).

  The texts' sentences (:func:`split_sentences`), each once, with fewer
  than `max_tokens` tokens; with `require_entity`, only those with a named
  entity (spaCy, :func:`leakjax.metrics.named_entities`); with both
  `max_perplexity` and `perplexity_fn` (texts -> perplexities), only those
  below it; then the first `max_sentences` (None: all).

  Raises:
    LeakjaxError: fewer than `min_sentences` (the largest batch) survive.
  """
  seen, kept = set(), []
  for s in (s for t in texts for s in split_sentences(t)):
    if s not in seen and len(tokenizer.encode(s)) < max_tokens:
      seen.add(s)
      kept.append(s)
  if require_entity:
    from leakjax import metrics  # pylint: disable=g-import-not-at-top

    ents = metrics.named_entities(kept)
    kept = [s for s, e in zip(kept, ents, strict=True) if e]
  if max_perplexity is not None and perplexity_fn is not None and kept:
    ppl = perplexity_fn(kept)
    kept = [s for s, p in zip(kept, ppl, strict=True) if p < max_perplexity]
  kept = kept[:max_sentences]
  if len(kept) < min_sentences:
    raise LeakjaxError(
      f'only {len(kept)} sentences survive preprocessing (Appendix B.1),'
      f' fewer than the largest batch size {min_sentences}',
      'use more data, smaller --batch_sizes or relax --require_entity',
    )
  return kept


# ---------------------------------------------------------------- splitting
def train_eval_split(
  items: Sequence[Any], eval_fraction: float, *, seed: int
) -> tuple[list[Any], list[Any]]:
  """Randomly splits `items` into (train, eval), deterministic in `seed`.

  Both parts keep the original order of their items. The eval part has
  `round(len(items) * eval_fraction)` items, at least 1 when
  `eval_fraction > 0`, and the train part is never empty.

  >>> train_eval_split(list('abcdefghij'), 0.2, seed=0)  # doctest: +SKIP
  (['a', 'b', 'c', 'e', 'f', 'g', 'h', 'j'], ['d', 'i'])
  """
  if not 0.0 <= eval_fraction < 1.0:
    raise LeakjaxError(f'eval_fraction must be in [0, 1), got {eval_fraction}')
  items = list(items)
  n = len(items)
  num_eval = round(n * eval_fraction)
  if eval_fraction > 0:
    num_eval = max(num_eval, 1)
  if n - num_eval < 1:
    raise LeakjaxError(
      f'cannot split {n} examples into train and eval sets',
      'use more data or a smaller eval_fraction',
    )
  perm = np.random.default_rng(seed).permutation(n)
  is_eval = np.zeros(n, bool)
  is_eval[perm[:num_eval]] = True
  return (
    [x for x, e in zip(items, is_eval, strict=True) if not e],
    [x for x, e in zip(items, is_eval, strict=True) if e],
  )


# ----------------------------------------------------------------- batching
def encode_corpus(
  tokenizer,
  texts: Sequence[str],
  max_length: int | None,
  *,
  add_bos: bool = True,
  add_eos: bool = False,
  truncate: bool = True,
) -> tuple[np.ndarray, np.ndarray, int]:
  """Tokenizes `texts` into one right-padded array pair.

  Args:
    tokenizer: a leakjax tokenizer (`encode`, `pad_id`, `bos_id`, `eos_id`).
    texts: the examples.
    max_length: the most tokens per example (BOS/EOS included). The width
      of the arrays is `min(max_length, longest example)`; None means the
      longest example.
    add_bos: start every example with the tokenizer's BOS token (skipped if
      it has none).
    add_eos: end every example with the EOS token (skipped if none).
    truncate: cut longer examples to `max_length` (keeping the start);
      False raises LeakjaxError instead.

  Returns:
    `(ids, mask, num_truncated)`: int32 `[len(texts), width]` arrays and how
    many examples were cut.
  """
  if not texts:
    raise LeakjaxError('nothing to encode: the corpus is empty')
  if max_length is not None and max_length < 1:
    raise LeakjaxError(f'max_length must be positive, got {max_length}')
  bos = tokenizer.bos_id if add_bos else None
  eos = getattr(tokenizer, 'eos_id', None) if add_eos else None
  seqs = []
  for t in texts:
    ids = tokenizer.encode(t)
    seqs.append(
      ([bos] if bos is not None else [])
      + list(ids)
      + ([eos] if eos is not None else [])
    )
  longest = max(len(s) for s in seqs)
  width = longest if max_length is None else min(longest, max_length)
  num_truncated = sum(len(s) > width for s in seqs)
  if num_truncated and not truncate:
    worst = int(np.argmax([len(s) for s in seqs]))
    raise LeakjaxError(
      f'{num_truncated} of {len(seqs)} examples are longer than'
      f' max_length={width} tokens (example {worst} has {longest})',
      'raise max_length or allow truncation',
    )
  width = max(width, 1)
  pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  ids = np.full((len(seqs), width), pad, np.int32)
  mask = np.zeros((len(seqs), width), np.int32)
  for row, s in enumerate(seqs):
    s = s[:width]
    ids[row, : len(s)] = s
    mask[row, : len(s)] = 1
  return ids, mask, num_truncated


def num_batches(
  num_examples: int, batch_size: int, *, drop_remainder: bool
) -> int:
  """Batches per epoch."""
  if drop_remainder:
    return num_examples // batch_size
  return -(-num_examples // batch_size)


def batch_indices(
  num_examples: int,
  batch_size: int,
  *,
  seed: int,
  epoch: int = 0,
  shuffle: bool = True,
  drop_remainder: bool = False,
) -> list[np.ndarray]:
  """The example indices of each batch of one epoch, each `[batch_size]`.

  The order depends only on `(seed, epoch)`, so a resumed run sees the same
  batches. In the last partial batch missing rows are -1 (see
  :func:`take_batch`), unless `drop_remainder` drops that batch.
  """
  if batch_size < 1:
    raise LeakjaxError(f'batch_size must be positive, got {batch_size}')
  order = (
    np.random.default_rng([seed, epoch]).permutation(num_examples)
    if shuffle
    else np.arange(num_examples)
  )
  count = num_batches(num_examples, batch_size, drop_remainder=drop_remainder)
  padded = np.full(count * batch_size, -1, np.int64)
  used = min(len(order), len(padded))
  padded[:used] = order[:used]
  return list(padded.reshape(count, batch_size))


def take_batch(
  ids: np.ndarray, mask: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Rows `rows` of `(ids, mask)`; a row index -1 gives a fully masked row."""
  real = rows >= 0
  batch_ids = ids[np.where(real, rows, 0)]
  batch_mask = mask[np.where(real, rows, 0)] * real[:, None].astype(mask.dtype)
  batch_ids = np.where(real[:, None], batch_ids, 0).astype(ids.dtype)
  return batch_ids, batch_mask


def batches(
  tokenizer,
  texts: Sequence[str],
  batch_size: int,
  max_length: int | None,
  *,
  seed: int = 0,
  shuffle: bool = True,
  drop_remainder: bool = False,
  add_bos: bool = True,
  truncate: bool = True,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """One epoch of fixed-shape `(ids, mask)` int32 `[batch_size, width]` batches.

  Every batch has the same shape, so a jitted step compiles once: the last
  partial batch is filled with fully masked rows, or dropped if
  `drop_remainder`. See :func:`encode_corpus` for `max_length`, `add_bos`
  and `truncate`.
  """
  ids, mask, _ = encode_corpus(
    tokenizer, texts, max_length, add_bos=add_bos, truncate=truncate
  )
  for rows in batch_indices(
    len(ids),
    batch_size,
    seed=seed,
    shuffle=shuffle,
    drop_remainder=drop_remainder,
  ):
    yield take_batch(ids, mask, rows)


__all__ = [
  'load_corpus',
  'split_sentences',
  'preprocess_sentences',
  'train_eval_split',
  'encode_corpus',
  'batch_indices',
  'take_batch',
  'batches',
  'num_batches',
  'HUB_PREFIX',
  'SUFFIXES',
  'parse_label',
]


if __name__ == '__main__':
  sys.exit(datasets.main(sys.argv[1:]))
