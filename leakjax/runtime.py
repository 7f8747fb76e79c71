"""What a runner does between and around its stages: a heartbeat line
during long silent stages, and the heap given back after each.

Neither changes a result; both make a long CPU run observable and its
memory smaller (reports/film_quickstart/README.md, reports/audit/README.md).
Runners (FILM's, the audit's) use them; kernels never do.
"""

from __future__ import annotations

import ctypes
import threading
import time

from absl import logging


class Heartbeat:
  """Logs `<stage>: still working (N s)` whenever nothing was logged for
  `every` seconds (a compilation, a beam search), so that a run never
  looks hung.

  A context manager; set `stage` as the run moves on. It sees the lines of
  absl's handler (where `app.run` sends every log record); without that
  handler it logs every `every` seconds of a stage.
  """

  def __init__(self, every: float = 10.0):
    self.every = every
    self._stage = 'starting'
    self._stage_start = self._last = time.monotonic()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._handler = logging.get_absl_handler()

  @property
  def stage(self) -> str:
    return self._stage

  @stage.setter
  def stage(self, name: str) -> None:
    self._stage, self._stage_start = name, time.monotonic()

  def filter(self, record) -> bool:
    """A logging filter: notes that a line went out, lets it through."""
    del record
    self._last = time.monotonic()
    return True

  def __enter__(self) -> Heartbeat:
    self._handler.addFilter(self)
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self._handler.removeFilter(self)

  def _run(self) -> None:
    while not self._stop.wait(min(1.0, self.every / 4)):
      now = time.monotonic()
      if now - self._last >= self.every:
        self._last = now
        logging.info(
          '%s: still working (%.0f s)', self._stage, now - self._stage_start
        )


def return_freed_memory() -> None:
  """Gives the heap's free pages back to the system (glibc's malloc_trim).

  The buffers XLA frees (weight- and gradient-sized) stay in glibc's heap
  and count as resident memory until reused; between stages this returns
  them. Without glibc it does nothing.
  """
  try:
    ctypes.CDLL('libc.so.6').malloc_trim(0)
  except (OSError, AttributeError):
    pass


__all__ = ['Heartbeat', 'return_freed_memory']
