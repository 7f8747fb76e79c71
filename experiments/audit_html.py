"""The audit's report.html: one self-contained page, its plot, a screenshot.

:func:`page` renders a :class:`Page` (what :mod:`experiments.audit_report`
says, already in words) as one HTML file that opens from disk: inline CSS,
no script, the leakage-utility frontier a PNG embedded as a data URI, every
text escaped. :func:`screenshot` loads such a file in headless Chromium and
saves what it shows as a PNG.

Chromium is driven through its DevTools protocol (CDP) over a websocket
(:class:`Browser`); the websocket client is the minimal one of RFC 6455
below (text frames, no extensions), so nothing beyond Chromium itself is
needed.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import html
import io as _io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from leakjax import io
from leakjax.errors import LeakjaxError

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
class Point:
  """One defense at one b in one panel of the frontier plot."""

  panel: str  # e.g. 'client gradient', 'hidden states, layer 0'
  b: int
  defense: str  # its spec, as the plot labels it ('dp:8')
  exact: float
  rouge_l: float
  entities: float | None
  ratio: float | None  # perplexity ratio to no defense; None: unmeasured
  ratio_std: float = 0.0


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


def frontier_png(points: list[Point], x_notes: dict[str, str]) -> bytes:
  """:func:`frontier_figure` as PNG bytes."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig = frontier_figure(points, x_notes)
  buf = _io.BytesIO()
  fig.savefig(buf, format='png', dpi=100)
  plt.close(fig)
  return buf.getvalue()


def frontier_figure(points: list[Point], x_notes: dict[str, str]):
  """The leakage-utility frontier: one panel per artefact, x the
  perplexity ratio (where any defense of a panel lacks one: the defenses
  evenly spaced, the axis label saying why), y the fraction recovered;
  points of different b are shifted a few pixels apart so equal values
  stay visible."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import transforms  # pylint: disable=g-import-not-at-top
  from matplotlib.lines import Line2D  # pylint: disable=g-import-not-at-top

  panels = list(dict.fromkeys(p.panel for p in points))
  sizes = sorted({p.b for p in points})
  ncols = min(len(panels), 3)
  nrows = math.ceil(len(panels) / ncols)
  fig, axes = plt.subplots(
    nrows,
    ncols,
    figsize=(3.0 * ncols + 0.4, 2.7 * nrows + 0.7),
    squeeze=False,
    sharey=True,
  )
  for ax, panel in zip(axes.flat, panels):
    pts = [p for p in points if p.panel == panel]
    defenses = list(dict.fromkeys(p.defense for p in pts))
    by_ratio = all(p.ratio is not None for p in pts)
    for p in pts:
      i = sizes.index(p.b)
      shift = transforms.ScaledTranslation(
        (i - (len(sizes) - 1) / 2) * 5 / 72, 0, fig.dpi_scale_trans
      )
      kw = dict(transform=ax.transData + shift, color=f'C{i % 10}')
      x = p.ratio if by_ratio else defenses.index(p.defense)
      if by_ratio and p.ratio_std:
        ax.errorbar(
          [x], [p.exact], xerr=[p.ratio_std], fmt='none', capsize=2, **kw
        )
      ax.plot([x], [p.rouge_l], 'o', mfc='none', ms=9, **kw)
      ax.plot([x], [p.exact], 'o', ms=6, **kw)
      if p.entities is not None:
        ax.plot([x], [p.entities], '^', ms=5, alpha=0.8, **kw)
    if by_ratio:
      xs = [p.ratio for p in pts]
      lo, hi = min(xs), max(xs)
      pad = max(0.05, 0.15 * (hi - lo))
      ax.set_xlim(lo - pad, hi + pad)
      _label_defenses(ax, pts, defenses, lo - pad, hi + pad)
      ax.set_xlabel('perplexity ratio to no defense', fontsize=8)
    else:
      ax.set_xticks(range(len(defenses)), defenses, fontsize=7, rotation=15)
      ax.set_xlim(-0.6, len(defenses) - 0.4)
      ax.set_xlabel(
        f'defense ({x_notes.get(panel) or "no measured cost"})', fontsize=7
      )
    ax.set_title(panel, fontsize=9)
    ax.set_ylim(-0.05, 1.12)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
  for ax in axes.flat[len(panels) :]:
    ax.axis('off')
  for row in axes:
    row[0].set_ylabel('fraction recovered', fontsize=8)
  handles = [
    Line2D([], [], color=f'C{i % 10}', marker='o', ls='', label=_b_label(b))
    for i, b in enumerate(sizes)
  ]
  handles += [
    Line2D([], [], color='k', marker='o', ls='', label='exact'),
    Line2D([], [], color='k', marker='o', mfc='none', ls='', label='ROUGE-L'),
  ]
  if any(p.entities is not None for p in points):
    handles.append(
      Line2D([], [], color='k', marker='^', ls='', label='named entities')
    )
  fig.legend(
    handles=handles, loc='lower center', ncol=len(handles), fontsize=7,
    frameon=False,
  )  # fmt: skip
  fig.tight_layout(rect=(0, 0.06 / nrows, 1, 1))
  return fig


def _label_defenses(ax, pts, defenses, left: float, right: float) -> None:
  """Names each defense above its highest point; defenses at almost the
  same ratio share one label ('none, freeze'), so names never overlap."""
  span = right - left
  spots = sorted(
    (
      next(p.ratio for p in pts if p.defense == d),
      max(max(p.exact, p.rouge_l) for p in pts if p.defense == d),
      d,
    )
    for d in defenses
  )
  groups: list[list] = []
  for spot in spots:
    if groups and spot[0] - groups[-1][-1][0] < 0.08 * span:
      groups[-1].append(spot)
    else:
      groups.append([spot])
  for group in groups:
    x = sum(s[0] for s in group) / len(group)
    where = (x - left) / span
    ax.annotate(
      ', '.join(s[2] for s in group),
      (x, max(s[1] for s in group)),
      xytext=(0, 7),
      textcoords='offset points',
      ha='left' if where < 0.3 else 'right' if where > 0.7 else 'center',
      fontsize=7,
    )


def _b_label(b: int) -> str:
  return f'b = {b}' if b else 'snapshot (no batch)'


# ------------------------------------------------------------- the browser
def find_chromium() -> str | None:
  """$LEAKJAX_CHROMIUM, else the first of chromium, chromium-browser and
  google-chrome on PATH; None if there is none."""
  if os.environ.get('LEAKJAX_CHROMIUM'):
    return os.environ['LEAKJAX_CHROMIUM']
  for name in ('chromium', 'chromium-browser', 'google-chrome'):
    if path := shutil.which(name):
      return path
  return None


class _WebSocket:
  """A websocket client (RFC 6455): masked text frames out, whole
  messages in (fragments joined, pings answered)."""

  def __init__(self, url: str, timeout: float):
    u = urllib.parse.urlsplit(url)
    self._sock = socket.create_connection((u.hostname, u.port), timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    self._sock.sendall(
      f'GET {u.path or "/"} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n'
      'Upgrade: websocket\r\nConnection: Upgrade\r\n'
      f'Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n'.encode()
    )
    head = b''
    while not head.endswith(b'\r\n\r\n'):  # byte by byte: no frame eaten
      head += self._exact(1)
    accept = base64.b64encode(
      hashlib.sha1(
        (key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()
      ).digest()
    )
    if b' 101 ' not in head.split(b'\r\n')[0] or accept not in head:
      raise ConnectionError(f'websocket handshake refused: {head[:200]!r}')

  def _exact(self, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
      chunk = self._sock.recv(min(n - len(buf), 1 << 20))
      if not chunk:
        raise ConnectionError('the browser closed the connection')
      buf += chunk
    return bytes(buf)

  def _send(self, opcode: int, data: bytes) -> None:
    n = len(data)
    head = bytes([0x80 | opcode])
    if n < 126:
      head += bytes([0x80 | n])
    elif n < 1 << 16:
      head += bytes([0x80 | 126]) + n.to_bytes(2, 'big')
    else:
      head += bytes([0x80 | 127]) + n.to_bytes(8, 'big')
    mask = os.urandom(4)
    pad = (mask * (n // 4 + 1))[:n]
    masked = (
      int.from_bytes(data, 'big') ^ int.from_bytes(pad, 'big')
    ).to_bytes(n, 'big')
    self._sock.sendall(head + mask + masked)

  def send(self, text: str) -> None:
    self._send(0x1, text.encode('utf-8'))

  def recv(self) -> str:
    message = b''
    while True:
      b0, b1 = self._exact(2)
      n = b1 & 0x7F
      if n >= 126:
        n = int.from_bytes(self._exact(2 if n == 126 else 8), 'big')
      mask = self._exact(4) if b1 & 0x80 else None
      data = self._exact(n)
      if mask:
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
      opcode = b0 & 0x0F
      if opcode == 0x8:
        raise ConnectionError('the browser closed the websocket')
      if opcode == 0x9:
        self._send(0xA, data)
      elif opcode in (0x0, 0x1, 0x2):
        message += data
        if b0 & 0x80:
          return message.decode('utf-8')

  def settimeout(self, seconds: float) -> None:
    self._sock.settimeout(seconds)

  def close(self) -> None:
    try:
      self._send(0x8, b'')
    except OSError:
      pass
    self._sock.close()


class Browser:
  """Headless Chromium with one page, driven over CDP.

  >>> with Browser() as b:                                  # doctest: +SKIP
  ...   b.open('report.html')
  ...   b.call('Runtime.evaluate', expression='1 + 1')['result']['value']
  2

  `events` collects the CDP events (`{'method': ..., 'params': ...}`) since
  the last :meth:`open`. The process and its profile folder are removed by
  :meth:`close` (or leaving the `with` block), whatever happened.
  """

  def __init__(
    self, binary: str | None = None, *, width: int = 1000, timeout: float = 20
  ):
    binary = binary or find_chromium()
    if not binary:
      raise LeakjaxError(
        'no Chromium found', 'install chromium or set LEAKJAX_CHROMIUM'
      )
    self.timeout = timeout
    self.events: list[dict] = []
    self._id = 0
    self._ws = None
    self._closed = False
    self._dir = tempfile.mkdtemp(prefix='leakjax-chromium-')
    # Its own session: close() ends the browser and every helper process
    # it started, and nothing else.
    self._proc = subprocess.Popen(
      [
        binary, '--headless=new', '--no-sandbox', '--disable-gpu',
        '--remote-debugging-port=0', f'--user-data-dir={self._dir}',
        f'--window-size={width},800', '--hide-scrollbars', '--no-first-run',
        '--no-default-browser-check', '--disable-dev-shm-usage', 'about:blank',
      ],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
      self._ws = _WebSocket(self._page_url(), timeout)
    except BaseException:
      self.close()
      raise

  def _page_url(self) -> str:
    """The page's websocket URL: the port from DevToolsActivePort, then
    the target list at /json (no proxy: it is this machine)."""
    deadline = time.monotonic() + self.timeout
    port_file = Path(self._dir) / 'DevToolsActivePort'
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
      if self._proc.poll() is not None:
        raise LeakjaxError(
          f'Chromium exited with status {self._proc.returncode} at start'
        )
      text = port_file.read_text() if port_file.exists() else ''
      if '\n' in text:
        try:
          with opener.open(
            f'http://127.0.0.1:{int(text.split()[0])}/json', timeout=2
          ) as r:
            targets = json.load(r)
        except OSError:
          targets = []
        for t in targets:
          if t.get('type') == 'page' and t.get('webSocketDebuggerUrl'):
            return t['webSocketDebuggerUrl']
      time.sleep(0.05)
    raise LeakjaxError(f'Chromium opened no page in {self.timeout:g} s')

  def _receive(self) -> dict:
    self._ws.settimeout(self.timeout)
    message = json.loads(self._ws.recv())
    if 'method' in message:
      self.events.append(message)
    return message

  def call(self, method: str, **params) -> dict:
    """Sends one CDP command and returns its result (events that arrive
    meanwhile go to `events`)."""
    self._id += 1
    self._ws.send(
      json.dumps({'id': self._id, 'method': method, 'params': params})
    )
    while True:
      message = self._receive()
      if message.get('id') == self._id:
        if 'error' in message:
          raise LeakjaxError(f'{method}: {message["error"]}')
        return message.get('result', {})

  def evaluate(self, expression: str):
    """The value of a JavaScript expression in the page."""
    result = self.call(
      'Runtime.evaluate', expression=expression, returnByValue=True
    )
    if 'exceptionDetails' in result:
      raise LeakjaxError(f'{expression[:60]}: {result["exceptionDetails"]}')
    return result['result'].get('value')

  def wait_for(self, method: str) -> dict:
    """The first event `method` since the last :meth:`open`, waiting for
    it up to `timeout` seconds."""
    deadline = time.monotonic() + self.timeout
    seen = 0
    while True:
      for event in self.events[seen:]:
        if event['method'] == method:
          return event
      seen = len(self.events)
      if time.monotonic() > deadline:
        raise LeakjaxError(f'no {method} in {self.timeout:g} s')
      self._receive()

  def open(self, path: str | os.PathLike) -> None:
    """Loads a local file and waits for its load event (images decoded)."""
    for domain in ('Page', 'Runtime', 'Log'):
      self.call(f'{domain}.enable')
    self.events = []
    self.call('Page.navigate', url=Path(path).resolve().as_uri())
    self.wait_for('Page.loadEventFired')

  def close(self) -> None:
    """Ends the browser and its helpers, removes the profile; once."""
    if self._closed:
      return
    self._closed = True
    if self._ws is not None:
      self._ws.close()
      self._ws = None
    # SIGTERM lets the browser end its helpers; SIGKILL then ends
    # whatever of its process group is left.
    for sig in (signal.SIGTERM, signal.SIGKILL):
      try:
        os.killpg(self._proc.pid, sig)
      except ProcessLookupError:
        break
      try:
        self._proc.wait(5)
      except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(self._dir, ignore_errors=True)

  def __enter__(self) -> Browser:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def screenshot(
  html_path: str | os.PathLike,
  png_path: str | os.PathLike,
  width: int = 1000,
  height: int | None = None,
) -> str:
  """Saves the page `html_path` as headless Chromium shows it at `width`
  CSS pixels to `png_path` (atomically): its first `height` pixels, or the
  whole page (None); returns `png_path`."""
  with Browser(width=width) as browser:
    browser.open(html_path)
    metrics = browser.call('Page.getLayoutMetrics')
    size = dict(metrics.get('cssContentSize') or metrics['contentSize'])
    if height is not None:
      size['height'] = min(size['height'], height)
    shot = browser.call(
      'Page.captureScreenshot',
      format='png',
      captureBeyondViewport=True,
      clip=dict(
        x=0, y=0, width=size['width'], height=math.ceil(size['height']), scale=1
      ),
    )
  io.atomic_write_bytes(png_path, base64.b64decode(shot['data']))
  return str(png_path)
