"""report.html in a real browser: headless Chromium over the DevTools
protocol (:class:`experiments.browser.Browser`) loads the synthetic
audit of tests/audit_report_test.py from disk and the page must show its
answer, the frontier plot and the sentence table, with no console error,
no uncaught exception and no broken image. A copy broken on purpose shows
that the check finds each of those.

Skips only where no Chromium is installed.
"""

import base64
import shutil
from pathlib import Path

import audit_report_test as synthetic
import pytest

from experiments import audit_report
from experiments import browser as chromium
from leakjax import io

pytestmark = pytest.mark.slow

NO_CHROMIUM = (
  'no Chromium binary (chromium, chromium-browser, google-chrome or'
  ' $LEAKJAX_CHROMIUM): the browser check of report.html needs one'
  ' (apt-get install chromium)'
)

# Every <img> of the page: its id or alt, whether it loaded and its size.
IMAGES = """[...document.images].map(i => ({
  name: i.id || i.alt || i.src.slice(0, 40), complete: i.complete,
  width: i.naturalWidth}))"""

# What a reader sees of the three parts that carry the answer.
DOM = """(() => {
  const shown = e => !!e && e.getClientRects().length > 0
    && e.offsetWidth > 0 && e.offsetHeight > 0
    && getComputedStyle(e).visibility !== 'hidden';
  const answer = document.getElementById('answer');
  const img = document.getElementById('frontier');
  const table = document.getElementById('sentences');
  const first = table && table.querySelector('tbody tr:nth-child(2)');
  return {
    answer: answer && answer.innerText, answerShown: shown(answer),
    tag: img && img.tagName, alt: img && img.alt,
    imgShown: shown(img), imgWidth: img && img.naturalWidth,
    imgOnScreen: img && img.getBoundingClientRect().width,
    tableShown: shown(table),
    cells: first ? [...first.cells].map(c => c.innerText) : null,
    marked: document.querySelectorAll('#sentences mark').length,
    literal: [...document.querySelectorAll('#sentences td')].some(
      td => td.innerText.includes('<script>alert(1)</script>')),
    scripts: document.scripts.length,
  };
})()"""


def page_problems(browser: chromium.Browser, path) -> list[str]:
  """Loads `path` and lists what went wrong: uncaught exceptions, console
  errors, error log entries (failed loads), and images that did not load
  (not complete or no pixels)."""
  browser.open(path)
  images = browser.evaluate(IMAGES)  # also collects late events
  found = []
  for event in browser.events:
    method, params = event['method'], event.get('params', {})
    if method == 'Runtime.exceptionThrown':
      details = params['exceptionDetails']
      found.append(
        'exception: '
        + details.get('exception', {}).get('description', details['text'])
      )
    elif method == 'Runtime.consoleAPICalled' and params['type'] == 'error':
      found.append(
        'console error: '
        + ' '.join(
          str(a.get('value', a.get('description'))) for a in params['args']
        )
      )
    elif method == 'Log.entryAdded' and params['entry']['level'] == 'error':
      found.append(f'log error: {params["entry"]["text"]}')
  for image in images:
    if not image['complete'] or image['width'] == 0:
      found.append(f'broken image: {image["name"]}')
  return found


@pytest.fixture(scope='module')
def browser(request):
  if chromium.find_chromium() is None:
    pytest.skip(NO_CHROMIUM)
  b = chromium.Browser(timeout=15)
  request.addfinalizer(b.close)  # the process ends whatever the tests do
  return b


@pytest.fixture(scope='module')
def report(tmp_path_factory) -> Path:
  folder = tmp_path_factory.mktemp('audit')
  writer = io.ExperimentWriter(folder, synthetic.CFG, enabled=True)
  audit_report.write(writer, synthetic.CFG, synthetic.synthetic_run())
  return folder / 'report.html'


def test_the_report_renders_cleanly(browser, report):
  assert page_problems(browser, report) == []
  dom = browser.evaluate(DOM)
  assert ' '.join(dom['answer'].split()) == synthetic.ANSWER
  assert dom['answerShown']
  assert (dom['tag'], dom['alt']) == ('IMG', 'leakage-utility frontier')
  assert dom['imgShown'] and dom['imgWidth'] > 600
  assert 600 < dom['imgOnScreen'] <= 900  # fits the page's width
  assert dom['tableShown']
  # First sentence row: Alice's, recovered exactly with her entities.
  assert dom['cells'] == [
    'Alice Martin moved to Paris in 2019.',
    'Alice Martin moved to Paris in 2019.',
    '✓',
    'Alice Martin, Paris, 2019 (3 of 3)',
  ]
  assert dom['marked'] > 50
  assert dom['literal']  # an escaped <script> shows as text ...
  assert dom['scripts'] == 0  # ... and never runs


def test_the_check_finds_a_broken_page(browser, report, tmp_path):
  broken = tmp_path / 'broken.html'
  bad_png = base64.b64encode(b'not a png').decode()
  broken.write_text(
    report.read_text().replace(
      '</body>',
      f'<img id="planted" alt="planted" src="data:image/png;base64,{bad_png}">'
      '<script>console.error("planted console error");'
      ' throw new Error("planted exception")</script></body>',
    )
  )
  found = page_problems(browser, broken)
  assert 'broken image: planted' in found
  assert 'console error: planted console error' in found
  assert any(
    x.startswith('exception: Error: planted exception') for x in found
  ), found
  assert len(found) == 3, found
  # The same browser still reads a good page as clean.
  assert page_problems(browser, report) == []


def test_screenshot(report, tmp_path):
  if chromium.find_chromium() is None:
    pytest.skip(NO_CHROMIUM)
  png = Path(chromium.screenshot(report, tmp_path / 'report.png'))
  data = png.read_bytes()
  assert data.startswith(b'\x89PNG\r\n\x1a\n')
  width = int.from_bytes(data[16:20], 'big')
  height = int.from_bytes(data[20:24], 'big')
  assert width == 1000 and height > 2000  # the whole page, not a window


def test_close_ends_the_browser():
  if chromium.find_chromium() is None:
    pytest.skip(NO_CHROMIUM)
  b = chromium.Browser(timeout=15)
  profile = Path(b._dir)
  assert b._proc.poll() is None and profile.is_dir()
  b.close()
  assert b._proc.poll() is not None
  assert not profile.exists()
  b.close()  # twice is fine


def test_a_missing_chromium_is_one_clear_error(monkeypatch):
  monkeypatch.setenv('LEAKJAX_CHROMIUM', '')
  monkeypatch.setattr(shutil, 'which', lambda name: None)
  assert chromium.find_chromium() is None
  with pytest.raises(Exception, match='no Chromium found'):
    chromium.Browser()
