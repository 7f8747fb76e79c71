"""The audit's report.html: one self-contained page.

:func:`page` renders a :class:`Page` (what :mod:`experiments.audit_report`
says, already in words) as one HTML file that opens from disk: inline CSS,
no script, the leakage-utility frontier (:mod:`experiments.audit_plot`) a
PNG embedded as a data URI, every text escaped.
:func:`experiments.browser.screenshot` saves what such a file shows.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import re

from experiments.audit_plot import Point, frontier_png

# At most this many sentences per (artefact, defense) in the table: a page
# read in a minute; results.jsonl keeps them all.
MAX_ROWS = 40

CSS = """
body{font:15px/1.45 system-ui,'Segoe UI',Helvetica,Arial,sans-serif;
 max-width:900px;margin:1.5em auto;padding:0 1em;color:#1f2328}
h1{font-size:1.45em;margin:.2em 0 .4em}
h2{font-size:1.12em;margin-top:1.6em;border-bottom:1px solid #d8dee4}
h3{font-size:1em;margin:1em 0 .2em}
#answer{font-size:1.06em;background:#f6f8fa;border-left:4px solid #cf222e;
 padding:.6em .9em;margin:.6em 0}
.muted{color:#59636e;font-size:.9em}
table{border-collapse:collapse;width:100%;font-size:.86em;margin:.4em 0}
td,th{border-bottom:1px solid #e4e8ec;padding:.25em .45em;text-align:left;
 vertical-align:top}
th{background:#f6f8fa}
tr.group th{background:#e8eef6}
td.ok{color:#1a7f37;font-weight:bold;text-align:center}
mark{background:#fff1a8;padding:0 1px}
img{max-width:100%;height:auto}
details summary{cursor:pointer;color:#0550ae;padding:.2em 0}
figure{margin:.5em 0}
figcaption{color:#59636e;font-size:.88em}
#facts th,#settings th{width:40%}
"""


@dataclasses.dataclass
class SentenceGroup:
  """One (artefact, b, defense) cell's sentences: each a dict with keys
  original, matched, exact (bool), entities and leaked (lists of str)."""

  title: str
  rows: list[dict]
  total: int  # sentences in the cell (rows may hold fewer: MAX_ROWS)


@dataclasses.dataclass
class Page:
  """Everything report.html shows, in words (no markup)."""

  title: str
  answer: list[str]  # one sentence per artefact
  perplexity: str
  threats: list[tuple[str, str, str]]  # (artefact, threat model, attacks)
  points: list[Point]
  x_notes: dict[str, str]  # panel -> why it shows no cost (short)
  sentences: list[tuple[SentenceGroup, list[SentenceGroup]]]  # main, rest
  settings: list[tuple[str, str]]
  facts: list[tuple[str, str]]


def mark_words(text: str, other: str) -> str:
  """`text` escaped, its words that also occur in `other` (ignoring case)
  wrapped in <mark>.

  >>> mark_words('Ann <b> met Bo', 'ann saw bo')
  '<mark>Ann</mark> &lt;b&gt; met <mark>Bo</mark>'
  """
  found = {w.lower() for w in re.findall(r'\w+', other)}
  out, pos = [], 0
  for m in re.finditer(r'\w+', text):
    out.append(html.escape(text[pos : m.start()]))
    word = html.escape(m.group())
    out.append(f'<mark>{word}</mark>' if m.group().lower() in found else word)
    pos = m.end()
  out.append(html.escape(text[pos:]))
  return ''.join(out)


def _rows_html(group: SentenceGroup) -> str:
  out = []
  for row in group.rows:
    leaked = ', '.join(row['leaked'])
    if row['entities']:
      n = f'{len(row["leaked"])} of {len(row["entities"])}'
      leaked = f'{leaked or "none"} ({n})'
    out.append(
      f'<tr><td>{mark_words(row["original"], row["matched"])}</td>'
      f'<td>{html.escape(row["matched"]) or "<i>nothing</i>"}</td>'
      + ('<td class="ok">✓</td>' if row['exact'] else '<td></td>')
      + f'<td>{html.escape(leaked)}</td></tr>'
    )
  if group.total > len(group.rows):
    out.append(
      f'<tr><td colspan="4" class="muted">... and'
      f' {group.total - len(group.rows)} more (results.jsonl has all)</td></tr>'
    )
  return '\n'.join(out)


def _sentences_html(groups) -> str:
  out = [
    '<table id="sentences"><thead><tr><th>original (words found in the'
    ' recovery marked)</th><th>best recovered sentence</th><th>exact</th>'
    '<th>named entities leaked</th></tr></thead>'
  ]
  for main, rest in groups:
    out.append(
      f'<tbody><tr class="group"><th colspan="4">{html.escape(main.title)}'
      f'</th></tr>\n{_rows_html(main)}'
    )
    for group in rest:
      out.append(
        '<tr><td colspan="4"><details><summary>'
        f'{html.escape(group.title)}</summary><table>{_rows_html(group)}'
        '</table></details></td></tr>'
      )
    out.append('</tbody>')
  out.append('</table>')
  return '\n'.join(out)


def facts_rows(model: str, data: str, extra: dict) -> list[tuple[str, str]]:
  """(name, value) of the run's facts (`AuditRun.extra`; any may be
  missing)."""
  get = lambda k: '–' if extra.get(k) is None else str(extra[k])
  rows = [
    ('model', model),
    ('data', data),
    ('data fingerprint', get('data_fingerprint')),
    (
      "sentences (in all / fine-tuned on / held out / the attacker's own)",
      ' / '.join(
        get(k)
        for k in ('num_sentences', 'num_train', 'num_heldout', 'num_attacker')
      ),
    ),
    ('hidden size, layers', f'{get("hidden_size")}, {get("num_layers")}'),
  ]
  if extra.get('num_attacker_samples') is not None:
    rows.append(
      ("model samples added to the attacker's own", get('num_attacker_samples'))
    )
  if devices := extra.get('devices'):
    rows.append(
      ('devices', f'{devices.get("count", "?")} x {devices.get("kind", "?")}')
    )
  for d, sigma in (extra.get('sigma') or {}).items():
    if sigma is not None:
      rows.append((f'DP noise multiplier, {d}', f'{sigma:.4g}'))
  if (seconds := extra.get('seconds')) is not None:
    took = f'{seconds / 60:.0f} min' if seconds >= 90 else f'{seconds:.0f} s'
    rows.append(('audit runtime', took))
  if extra.get('peak_memory_mib') is not None:
    rows.append(('peak memory', f'{extra["peak_memory_mib"]:.0f} MiB'))
  if versions := extra.get('versions'):
    rows.append(
      ('versions', ', '.join(f'{k} {v}' for k, v in sorted(versions.items())))
    )
  return rows


def settings_rows(cfg) -> list[tuple[str, str]]:
  """(field, value) of a config dataclass; None reads 'default'."""

  def fmt(value) -> str:
    if isinstance(value, (list, tuple)):
      return ', '.join(str(v) for v in value)
    return 'default' if value is None else str(value)

  return [(f.name, fmt(getattr(cfg, f.name))) for f in dataclasses.fields(cfg)]


def _pairs_table(pairs, table_id: str) -> str:
  rows = ''.join(
    f'<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>'
    for k, v in pairs
  )
  return f'<table id="{table_id}">{rows}</table>'


def page(p: Page) -> str:
  """The report as one HTML document (see the module docstring)."""
  threats = ''.join(
    f'<h3>{html.escape(name)}</h3><p>{html.escape(text)}</p>'
    + (
      f'<p class="muted">Attacks run: {html.escape(attacks)}</p>'
      * bool(attacks)
    )
    for name, text, attacks in p.threats
  )
  if p.points:
    png = base64.b64encode(frontier_png(p.points, p.x_notes)).decode('ascii')
    frontier = (
      f'<figure><img id="frontier" alt="leakage-utility frontier"'
      f' src="data:image/png;base64,{png}"><figcaption>Fraction of the'
      ' sentences recovered (filled: exact, open: ROUGE-L, triangles: named'
      ' entities) against the held-out perplexity of the same fine-tuning'
      ' with the defense, relative to none (bars: spread over seeds). One'
      ' panel per artefact, colour by batch size b.'
      + (
        ' Where a panel has no cost to show, its defenses sit at evenly'
        ' spaced x: '
        + html.escape('; '.join(f'{k} ({v})' for k, v in p.x_notes.items()))
        + '.'
      )
      * bool(p.x_notes)
      + '</figcaption></figure>'
    )
  else:
    frontier = '<p>No attack ran.</p>'
  return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(p.title)}</title><style>{CSS}</style></head><body>
<h1>{html.escape(p.title)}</h1>
<p id="answer">{'<br>'.join(html.escape(x) for x in p.answer)}</p>
<p id="perplexity" class="muted">{html.escape(p.perplexity)}</p>
<h2>Threat models and attacks</h2>
{threats}
<h2>Leakage against utility</h2>
{frontier}
<h2>Sentence by sentence</h2>
<p class="muted">Per artefact at its largest batch size: no defense in
full, each defense below it (click to open).</p>
{_sentences_html(p.sentences)}
<h2>Settings</h2>
<h3>The run</h3>
{_pairs_table(p.facts, 'facts')}
<h3>Its config (config.json)</h3>
{_pairs_table(p.settings, 'settings')}
</body></html>
"""
