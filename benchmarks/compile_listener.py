"""A pytest plugin: how much of a test run JAX spends making programs.

`python -m benchmarks.suite --compile_share` loads it (`-p
benchmarks.compile_listener`). Every process that runs tests (each xdist
worker) sums the durations JAX reports through `jax.monitoring` -- tracing
to a jaxpr, lowering to MLIR, XLA's backend compilation and reads from the
persistent compilation cache -- and at exit writes them as one JSON file
into the folder `LEAKJAX_COMPILE_SHARE_DIR` names. The experiments that
tests start as subprocesses do not load the plugin, so their compilations
are not counted. An eager `jnp` call compiles its primitive at each new
shape, so the counts include those one-primitive programs.

jax is imported at `pytest_sessionstart`, after `tests/conftest.py` has set
the XLA flags, never when the plugin module itself is imported.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import uuid
from pathlib import Path

ENV = 'LEAKJAX_COMPILE_SHARE_DIR'
# jax.monitoring's duration events and the names they get in the JSON.
EVENTS = {
  '/jax/core/compile/jaxpr_trace_duration': 'trace',
  '/jax/core/compile/jaxpr_to_mlir_module_duration': 'lower',
  '/jax/core/compile/backend_compile_duration': 'compile',
  '/jax/compilation_cache/cache_retrieval_time_sec': 'cache_read',
}
STAGES = tuple(EVENTS.values())


def pytest_sessionstart(session):  # pylint: disable=unused-argument
  folder = os.environ.get(ENV)
  if not folder:
    return
  from jax import monitoring  # pylint: disable=g-import-not-at-top

  seconds: collections.Counter = collections.Counter()
  counts: collections.Counter = collections.Counter()

  def listen(event: str, duration: float, **kwargs) -> None:
    del kwargs
    name = EVENTS.get(event)
    if name:
      seconds[name] += duration
      counts[name] += 1

  def write() -> None:
    if not counts:  # xdist's controller runs no test
      return
    record = {
      'pid': os.getpid(),
      'seconds': {k: round(seconds[k], 6) for k in STAGES},
      'counts': {k: counts[k] for k in STAGES},
    }
    path = Path(folder) / f'{os.getpid()}-{uuid.uuid4().hex[:8]}.json'
    path.write_text(json.dumps(record))

  monitoring.register_event_duration_secs_listener(listen)
  atexit.register(write)


def summarise(folder: str | Path, wall_s: float) -> dict:
  """The workers' files in `folder`, summed, beside their time.

  `worker_s` is the number of workers times the run's wall seconds (each
  worker lives the whole run), and `share` the part of it the four stages
  took.
  """
  files = sorted(Path(folder).glob('*.json'))
  records = [json.loads(p.read_text()) for p in files]
  seconds = {k: round(sum(r['seconds'][k] for r in records), 3) for k in STAGES}
  counts = {k: sum(r['counts'][k] for r in records) for k in STAGES}
  worker_s = round(len(records) * wall_s, 1)
  total = sum(seconds.values())
  return {
    'workers': len(records),
    'worker_s': worker_s,
    'seconds': seconds,
    'counts': counts,
    'share': round(total / worker_s, 3) if worker_s else None,
  }
