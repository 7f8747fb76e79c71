"""What a runner does between and around its stages: a heartbeat line
during long silent stages, the heap given back after each, and a
compilation cache on disk that later runs read.

None changes a result; they make a long CPU run observable, its memory
smaller (reports/film_quickstart/README.md, reports/audit/README.md) and a
repeated run quicker (benchmarks/results/main_job_cache.json). Runners and
entry points use them; kernels never do.
"""

from __future__ import annotations

import ctypes
import os
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


def release_programs() -> None:
  """Drops every compiled program and gives the freed memory back.

  A jitted program of a 135M-parameter model holds tens of MB of host
  memory (its HLO, buffer assignment and code) for as long as it stays in
  JAX's caches. Call this when no program compiled so far will run again;
  it drops a caller's own programs too. The runners drop only the stage
  they finished (:func:`leakjax.train.release_programs` after
  fine-tuning). A program needed later compiles again, or comes from the
  persistent cache (:func:`use_compilation_cache`).
  """
  import jax  # pylint: disable=g-import-not-at-top

  jax.clear_caches()
  return_freed_memory()


# The cache's size cap: least recently used programs go first past it.
COMPILATION_CACHE_MAX_BYTES = 2 * 1024**3


def default_compilation_cache() -> str:
  """`$XDG_CACHE_HOME/leakjax/xla` (default `~/.cache/leakjax/xla`)."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
    os.path.expanduser('~'), '.cache'
  )
  return os.path.join(base, 'leakjax', 'xla')


def use_compilation_cache(
  path: str | os.PathLike | None,
  *,
  max_bytes: int = COMPILATION_CACHE_MAX_BYTES,
) -> str | None:
  """Keeps the compiled programs of this run on disk for the next one.

  JAX's persistent compilation cache: a program compiled once (FILM's
  beam search, the training step) is read back by any later run with the
  same program, shapes, flags and JAX version instead of compiled again,
  which on the 2-core CPU saves most of a run's compile time (tracing
  still happens). The compiled program is the same either way, so results
  do not change. Every program is kept, the small ones too (JAX's
  `jax_persistent_cache_min_compile_time_secs`, 1 s by default, is set to
  0 unless the environment sets it): a run compiles a few hundred small
  ones (eager operations, the host loops' little kernels) at tens of ms
  each, and reads each back in a few ms. Past `max_bytes` the least
  recently used are removed.

  A cache already chosen (`JAX_COMPILATION_CACHE_DIR`, or
  `jax.config.jax_compilation_cache_dir` set by the caller) is kept as it
  is. A folder that cannot be created leaves the run uncached, with a
  warning.

  Args:
    path: the folder (or a `gs://` URL, which JAX reads through
      etils.epath); None or '' turns the cache off for this run.
    max_bytes: the cache's size cap.

  Returns:
    the folder in use, or None.
  """
  import jax  # pylint: disable=g-import-not-at-top

  chosen = jax.config.jax_compilation_cache_dir
  if chosen:
    return chosen
  if not path:
    return None
  path = os.fspath(path)
  try:
    if '://' not in path:  # JAX creates a bucket's (gs://...) itself
      os.makedirs(path, exist_ok=True)
  except OSError as e:
    logging.warning('no compilation cache: cannot create %s (%s)', path, e)
    return None
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_compilation_cache_max_size', int(max_bytes))
  if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return path


__all__ = [
  'COMPILATION_CACHE_MAX_BYTES',
  'Heartbeat',
  'default_compilation_cache',
  'return_freed_memory',
  'use_compilation_cache',
]
