"""Headless Chromium for the audit's report: load a page, screenshot it.

Chromium is driven through its DevTools protocol (CDP) over a websocket
(:class:`Browser`); the websocket client is the minimal one of RFC 6455
below (text frames, no extensions), so nothing beyond Chromium itself is
needed. :func:`screenshot` saves what a page shows as a PNG
(:mod:`experiments.audit_report` uses it for report.png).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
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
