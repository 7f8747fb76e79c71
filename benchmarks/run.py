"""Runs every peer benchmark and writes one summary.

    python -m benchmarks.run --quick --out=benchmarks/results/cpu_quick

writes, under `--out`:

* `<bench>.json` -- each benchmark's full result (settings, every timing,
  the checks, the machine peak it measured);
* `summary.json` -- flat headline keys in the `leakjax.io.summary_key`
  convention, at least `speedup@bench=beam_search,beam=32`,
  `speedup@bench=grad_norms`, `speedup@bench=dr_search`,
  `speedup@bench=client_update` (ours / peer throughput, wall clock; the
  same with `speedup_cpu@` from process CPU seconds) and
  `match@bench=beam_search,beam=32` (1 when the best sentences agree); the
  beam keys are written both with `bench` first and with sorted
  parameters (`speedup@beam=32,bench=beam_search`), per-case keys carry
  `b=`, `model=`, `candidates=`; `peer_extrapolated@bench=NAME = 1` where
  the peer's time was extrapolated, not measured (dr_search's quick mode);
  a benchmark that could not run gets `skipped@bench=NAME = 1` instead of
  numbers, with the reason in `run.json` and `summary.md`;
* `summary.md` -- the headline table, then each benchmark's own table;
* `run.json` -- the command, versions, thread settings, load and status.

Status (`run.json`, `summary.md`), against the bar each benchmark states
(:data:`BARS`; dr_search also its own `bar_seconds`):

* `met` -- measured at or past the bar, with the outputs agreeing;
* `not met` -- measured short of the bar (`not met (outputs differ)`: the
  two sides disagree, so no ratio counts);
* `extrapolated` -- the peer's time is an extrapolation, so the ratio is an
  estimate and is not judged against the bar;
* `no bar` -- measured, no bar stated (client_update, FILM's full
  backward);
* `skipped`, `failed` -- no numbers (the reason beside).

A benchmark's status is its worst bar: `not met` before `extrapolated`
before `met`.

`python -m benchmarks.run --relabel --out=DIR` recomputes the status of a
finished run from DIR's JSON files (nothing is timed) and rewrites
`run.json`'s status and `summary.md`.

Threads. The default `--threads=1` runs both sides of every comparison on
one core (XLA: `--xla_cpu_multi_thread_eigen=false`; torch:
`set_num_threads(1)`). On a shared, oversubscribed machine multi-threaded
runs measure the scheduler, not the code: torch's OpenMP barriers lose
10-50x when a core is taken away, XLA's pool less, which would flatter us.
`--threads=0` keeps each library's default (use it on an idle machine or
an accelerator).

The benchmarks:

* beam_search -- `benchmarks.beam_search_vs_hf`: bag-restricted beam
  search vs transformers `generate` on the same weights;
* grad_norms -- `benchmarks.grad_norms_vs_torch`: the reorder scorer's
  per-candidate gradient norms vs a PyTorch loop of backwards;
* dr_search -- `benchmarks.dr_search`: differential-rank beam search vs a
  per-sequence implementation;
* client_update -- `benchmarks.client_update`: FedAvg local training as one
  `lax.scan` vs a Python loop of jitted steps.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

BENCHMARKS = {
  'beam_search': 'benchmarks.beam_search_vs_hf',
  'grad_norms': 'benchmarks.grad_norms_vs_torch',
  'dr_search': 'benchmarks.dr_search',
  'client_update': 'benchmarks.client_update',
}
REQUIRED_KEYS = (
  'speedup@beam=32,bench=beam_search',
  'match@beam=32,bench=beam_search',
  'speedup@bench=beam_search,beam=32',
  'match@bench=beam_search,beam=32',
  'speedup@bench=grad_norms',
  'speedup@bench=dr_search',
  'speedup@bench=client_update',
)
# The bars (ours / peer throughput, at least).
BARS = {
  'speedup@beam=32,bench=beam_search': 20.0,
  'speedup@bench=grad_norms': 5.0,
  'speedup@bench=dr_search': 10.0,
}
MET, NOT_MET, EXTRAPOLATED, NO_BAR = 'met', 'not met', 'extrapolated', 'no bar'
# The headline table: (label, benchmark, speedup key, match key).
HEADLINE_ROWS = (
  (
    'beam_search (beam 32)',
    'beam_search',
    'speedup@beam=32,bench=beam_search',
    'match@beam=32,bench=beam_search',
  ),
  (
    'grad_norms (same params)',
    'grad_norms',
    'speedup@bench=grad_norms',
    'match@bench=grad_norms',
  ),
  (
    'grad_norms (vs FILM full backward)',
    'grad_norms',
    'speedup@bench=grad_norms,peer=full_backward',
    'match@bench=grad_norms',
  ),
  (
    'dr_search',
    'dr_search',
    'speedup@bench=dr_search',
    'match@bench=dr_search',
  ),
  (
    'client_update',
    'client_update',
    'speedup@bench=client_update',
    'match@bench=client_update',
  ),
)


def _xla_backend_started() -> bool:
  """Whether XLA has read XLA_FLAGS already (it does at its first use)."""
  if 'jax' not in sys.modules:
    return False
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

    return bool(getattr(xla_bridge, '_backends', True))
  except Exception:  # pylint: disable=broad-except
    return True


def configure_threads(threads: int) -> dict[str, Any]:
  """Sets the thread counts of XLA (before its first use) and torch."""
  info: dict[str, Any] = {'requested': threads}
  if threads == 1:
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    os.environ.setdefault('MKL_NUM_THREADS', '1')
    if _xla_backend_started():
      info['xla'] = 'inherited (XLA was started before configure_threads)'
    else:
      flags = os.environ.get('XLA_FLAGS', '')
      if '--xla_cpu_multi_thread_eigen' not in flags:
        os.environ['XLA_FLAGS'] = (
          flags + ' --xla_cpu_multi_thread_eigen=false'
        ).strip()
      info['xla'] = os.environ['XLA_FLAGS']
  try:
    import torch  # pylint: disable=g-import-not-at-top

    if threads > 0:
      torch.set_num_threads(threads)
    info['torch'] = torch.get_num_threads()
  except ImportError:
    info['torch'] = None
  return info


# ------------------------------------------------------------ headlines
def _number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def headline(name: str, result: dict) -> dict[str, float]:
  """The summary keys of one benchmark's result dict.

  Our own benchmarks return `summary`; siblings may return a top-level
  `speedup` (dr_search) or a list of `results` with `loop_over_scan`
  (client_update, first workload = headline).
  """
  from leakjax.io import summary_key  # pylint: disable=g-import-not-at-top

  out: dict[str, float] = {}
  if isinstance(result.get('summary'), dict):
    out.update({k: v for k, v in result['summary'].items() if _number(v)})
  key = summary_key('speedup', bench=name)
  if not any(k.startswith('speedup@') and f'bench={name}' in k for k in out):
    if _number(result.get('speedup')):
      out[key] = float(result['speedup'])
    elif isinstance(result.get('results'), list) and result['results']:
      first = result['results'][0]
      for field in ('speedup', 'loop_over_scan'):
        if _number(first.get(field)):
          out[key] = float(first[field])
          break
  cpu_key = summary_key('speedup_cpu', bench=name)
  if cpu_key not in out:
    if _number(result.get('speedup_cpu')):
      out[cpu_key] = float(result['speedup_cpu'])
    elif isinstance(result.get('results'), list) and result['results']:
      first = result['results'][0]
      for field in ('speedup_cpu', 'loop_over_scan_cpu'):
        if _number(first.get(field)):
          out[cpu_key] = float(first[field])
          break
  if name == 'dr_search' and isinstance(result.get('agreement'), dict):
    agreement = result['agreement']
    if 'top_match' in agreement:
      out[summary_key('match', bench=name)] = int(bool(agreement['top_match']))
    if _number(agreement.get('overlap')):
      out[summary_key('overlap', bench=name)] = float(agreement['overlap'])
  if name == 'client_update' and isinstance(result.get('results'), list):
    diffs = [r.get('max_abs_diff_scan_vs_loop') for r in result['results']]
    if diffs and all(_number(d) for d in diffs):
      out[summary_key('match', bench=name)] = int(max(diffs) == 0.0)
  if peer_extrapolated(result) is not None:
    out[summary_key('peer_extrapolated', bench=name)] = int(
      peer_extrapolated(result)
    )
  # The beam-search keys are also written with `bench` first (the spelling
  # the headline keys use), beside the sorted convention.
  for k in list(out):
    if k.startswith(('speedup@beam=', 'match@beam=')) and ',bench=' in k:
      metric, params = k.split('@')
      beam, bench = params.split(',', 1)
      if bench.startswith('bench=') and ',' not in bench:
        out[f'{metric}@{bench},{beam}'] = out[k]
  return out


def peer_extrapolated(result: dict) -> bool | None:
  """Whether the peer's time in `result` was extrapolated (None: the result
  does not say; every peer time is then measured)."""
  for field in ('peer_extrapolated', 'straightforward_extrapolated'):
    if isinstance(result.get(field), bool):
      return result[field]
  return None


# --------------------------------------------------------------- status
def ratio_status(
  value: float | None,
  bar: float | None,
  *,
  match: int | None = None,
  extrapolated: bool = False,
) -> str:
  """The status of one ratio against its bar (module docstring)."""
  if bar is None:
    return NO_BAR
  if match == 0:
    return f'{NOT_MET} (outputs differ)'
  if extrapolated:
    return EXTRAPOLATED
  if value is None:
    return NOT_MET
  return MET if value >= bar else NOT_MET


def bar_checks(
  name: str, summary: dict[str, float], result: dict
) -> list[dict[str, Any]]:
  """Every bar benchmark `name` states, judged on its summary and result.

  Each entry: `what` (a summary key, or `ours_first_call_s` for
  dr_search's time bar), `value`, `bar`, `at_least` (a ratio must reach
  the bar; a time must stay under it) and `status`.
  """
  extrapolated = bool(peer_extrapolated(result))
  checks = []
  for _, bench, key, match_key in HEADLINE_ROWS:
    if bench != name or key not in summary:
      continue
    checks.append(
      {
        'what': key,
        'value': summary[key],
        'bar': BARS.get(key),
        'at_least': True,
        'status': ratio_status(
          summary[key],
          BARS.get(key),
          match=summary.get(match_key),
          extrapolated=extrapolated,
        ),
      }
    )
  if _number(result.get('bar_seconds')) and _number(
    result.get('ours_first_call_s')
  ):
    value, bar = result['ours_first_call_s'], result['bar_seconds']
    checks.append(
      {
        'what': 'ours_first_call_s',
        'value': value,
        'bar': bar,
        'at_least': False,
        'status': MET if value < bar else NOT_MET,
      }
    )
  return checks


def overall_status(checks: Sequence[dict[str, Any]]) -> str:
  """A benchmark's status: its worst bar (module docstring)."""
  judged = [c['status'] for c in checks if c['status'] != NO_BAR]
  if not judged:
    return NO_BAR
  if any(s.startswith(NOT_MET) for s in judged):
    return NOT_MET
  if EXTRAPOLATED in judged:
    return EXTRAPOLATED
  return MET


def benchmark_status(
  name: str, summary: dict[str, float], result: dict
) -> dict[str, Any]:
  """`{'status', 'bars'[, 'peer_extrapolated']}` of a finished benchmark."""
  checks = bar_checks(name, summary, result)
  out: dict[str, Any] = {'status': overall_status(checks), 'bars': checks}
  if not any(
    k.startswith('speedup@') and f'bench={name}' in k for k in summary
  ):
    out['status'] = 'no speedup key found'
  if peer_extrapolated(result) is not None:
    out['peer_extrapolated'] = peer_extrapolated(result)
  return out


# ------------------------------------------------------------------- run
def _call_run(module, quick: bool, kwargs: dict[str, Any]) -> dict:
  """`module.run(quick=...)` with those of `kwargs` it accepts."""
  params = inspect.signature(module.run).parameters
  accepted = {k: v for k, v in kwargs.items() if k in params}
  return module.run(quick=quick, **accepted)


def run_all(
  quick: bool = True,
  out: str | os.PathLike | None = None,
  *,
  names: Sequence[str] | None = None,
  settings: dict[str, Any] | None = None,
  peak_n: int | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Runs the benchmarks and writes the files (see module docstring).

  Args:
    quick: each benchmark's quick mode.
    out: output folder; None writes nothing.
    names: a subset of :data:`BENCHMARKS` (default all).
    settings: per-benchmark `settings=` objects (our benchmarks accept
      them, e.g. the tiny test settings); siblings get `quick` only.
    peak_n: size of the peak matmul (default 1024 quick, 2048 full).
    log: progress printer.

  Returns:
    `{'summary': {...}, 'status': {...}, 'results': {...}, 'markdown'}`.
  """
  from benchmarks import peak as peak_lib  # pylint: disable=g-import-not-at-top
  from leakjax.io import (  # pylint: disable=g-import-not-at-top
    atomic_write_text,
    jsonable,
    summary_key,
  )

  names = list(names or BENCHMARKS)
  settings = settings or {}
  out_dir = Path(out) if out is not None else None
  start = time.perf_counter()
  load_before = os.getloadavg()[0]
  peak = peak_lib.measure_peak(peak_n or (1024 if quick else 2048), repeats=5)
  log(
    f'[run] peak {peak["peak_flops"] / 1e9:.1f} GFLOP/s'
    f' (median {peak["median_flops"] / 1e9:.1f}), load {load_before:.1f}'
  )
  summary: dict[str, float] = {}
  status: dict[str, dict[str, Any]] = {}
  results: dict[str, Any] = {}
  for name in names:
    module_name = BENCHMARKS[name]
    t0 = time.perf_counter()
    try:
      module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
      if e.name in (module_name, module_name.rsplit('.', 1)[0]):
        reason = f'{module_name} does not exist yet'
      else:
        reason = f'importing {module_name} failed: {e!r}'
      status[name] = {'status': 'skipped', 'reason': reason}
      summary[summary_key('skipped', bench=name)] = 1
      log(f'[run] {name}: skipped ({reason})')
      continue
    except Exception as e:  # pylint: disable=broad-except
      status[name] = {
        'status': 'skipped',
        'reason': f'importing {module_name} failed: {e!r}',
      }
      summary[summary_key('skipped', bench=name)] = 1
      log(f'[run] {name}: skipped ({e!r})')
      continue
    kwargs = {'peak': peak, 'log': log}
    if name in settings:
      kwargs['settings'] = settings[name]
    try:
      result = _call_run(module, quick, kwargs)
    except Exception as e:  # pylint: disable=broad-except
      status[name] = {
        'status': 'failed',
        'reason': repr(e),
        'traceback': traceback.format_exc(),
      }
      summary[summary_key('skipped', bench=name)] = 1
      log(f'[run] {name}: FAILED {e!r}')
      continue
    keys = headline(name, result)
    summary.update(keys)
    results[name] = result
    status[name] = {
      **benchmark_status(name, keys, result),
      'seconds': time.perf_counter() - t0,
    }
    log(
      f'[run] {name}: {time.perf_counter() - t0:.0f}s, {status[name]["status"]}'
    )
    if out_dir is not None:
      atomic_write_text(
        out_dir / f'{name}.json',
        json.dumps(jsonable(result), indent=2, sort_keys=True),
      )
  elapsed = time.perf_counter() - start
  summary['seconds@bench=run'] = elapsed
  summary['peak_gflops@bench=run'] = peak['peak_flops'] / 1e9
  md = markdown(summary, status, results, peak, quick=quick)
  info = {
    'command': ' '.join(['python -m benchmarks.run'] + sys.argv[1:]),
    'quick': quick,
    'seconds': elapsed,
    'python': platform.python_version(),
    'platform': platform.platform(),
    'cpu_count': os.cpu_count(),
    'load_average_before': load_before,
    'load_average_after': os.getloadavg()[0],
    'peak': peak,
    'status': status,
    'versions': _versions(),
  }
  if out_dir is not None:
    atomic_write_text(
      out_dir / 'summary.json',
      json.dumps(jsonable(summary), indent=2, sort_keys=True),
    )
    atomic_write_text(out_dir / 'summary.md', md)
    atomic_write_text(
      out_dir / 'run.json',
      json.dumps(jsonable(info), indent=2, sort_keys=True),
    )
  return {
    'summary': summary,
    'status': status,
    'results': results,
    'markdown': md,
    'info': info,
  }


def _versions() -> dict[str, str]:
  out = {}
  for mod in ('jax', 'jaxlib', 'flax', 'torch', 'transformers', 'numpy'):
    try:
      out[mod] = importlib.import_module(mod).__version__
    except Exception:  # pylint: disable=broad-except
      out[mod] = 'absent'
  return out


def markdown(summary, status, results, peak, *, quick: bool) -> str:
  lines = [
    f'# leakjax peer benchmarks ({"quick" if quick else "full"})',
    '',
    f'Machine peak (fp32 matmul n={peak["n"]}, best of'
    f' {len(peak["seconds"])}): {peak["peak_flops"] / 1e9:.1f} GFLOP/s'
    f' (median {peak["median_flops"] / 1e9:.1f}); device'
    f' {peak["device"]}; total {summary["seconds@bench=run"]:.0f} s.',
    '',
    '| benchmark | ours / peer (wall) | ours / peer (CPU s) | bar | match |'
    ' status |',
    '|---|---|---|---|---|---|',
  ]
  for label, name, key, match_key in HEADLINE_ROWS:
    value = summary.get(key)
    cpu_value = summary.get(key.replace('speedup@', 'speedup_cpu@'))
    bar = BARS.get(key)
    st = status.get(name, {'status': 'not run'})
    word = next(
      (c['status'] for c in st.get('bars', ()) if c['what'] == key),
      st['status'],
    )
    estimate = ' (peer extrapolated)' if st.get('peer_extrapolated') else ''
    lines.append(
      f'| {label} |'
      f' {"-" if value is None else f"{value:.2f}x{estimate}"} |'
      f' {"-" if cpu_value is None else f"{cpu_value:.2f}x{estimate}"} |'
      f' {"-" if bar is None else f">= {bar:g}x"} |'
      f' {summary.get(match_key, "-")} |'
      f' {word}{": " + st["reason"] if "reason" in st else ""} |'
    )
  listed = {row[1] for row in HEADLINE_ROWS}
  for name, st in status.items():
    if name not in listed:
      lines.append(
        f'| {name} | - | - | - | - | {st["status"]}'
        f'{": " + st["reason"] if "reason" in st else ""} |'
      )
  for name, st in status.items():
    for c in st.get('bars', ()):
      if c['what'] == 'ours_first_call_s':
        lines += [
          '',
          f'{name}, one full search including compilation:'
          f' {c["value"]:.1f} s (bar < {c["bar"]:g} s): {c["status"]}.',
        ]
  for name, result in results.items():
    if isinstance(result, dict) and result.get('markdown'):
      lines += ['', f'## {name}', '', result['markdown'].rstrip()]
  return '\n'.join(lines) + '\n'


def relabel(out: str | os.PathLike) -> str:
  """Recomputes the status of the finished run in `out` from its JSON files.

  Nothing is timed: each benchmark's status comes from `summary.json` and
  its `<bench>.json` (:func:`benchmark_status`); `run.json`'s status (the
  seconds kept) and `summary.md` are rewritten. Returns the markdown.
  """
  from leakjax.io import atomic_write_text  # pylint: disable=g-import-not-at-top

  out = Path(out)
  summary = json.loads((out / 'summary.json').read_text())
  info = json.loads((out / 'run.json').read_text())
  results = {}
  for name in BENCHMARKS:  # the order run_all writes them in
    if (out / f'{name}.json').is_file() and name in info['status']:
      results[name] = json.loads((out / f'{name}.json').read_text())
  for name, result in results.items():
    old = info['status'][name]
    info['status'][name] = {
      **benchmark_status(name, summary, result),
      **({'seconds': old['seconds']} if 'seconds' in old else {}),
    }
  md = markdown(
    summary, info['status'], results, info['peak'], quick=info['quick']
  )
  atomic_write_text(
    out / 'run.json', json.dumps(info, indent=2, sort_keys=True)
  )
  atomic_write_text(out / 'summary.md', md)
  return md


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--relabel',
    action='store_true',
    help='recompute the status of the finished run in --out (times nothing)',
  )
  parser.add_argument(
    '--quick',
    action='store_true',
    help='each benchmark in quick mode (< 10 min total)',
  )
  parser.add_argument('--out', required=True, help='output folder')
  parser.add_argument(
    '--only',
    default=None,
    help='comma-separated subset of ' + ','.join(BENCHMARKS),
  )
  parser.add_argument(
    '--threads',
    type=int,
    default=1,
    help='1: both sides on one core (default); 0: library'
    ' defaults; N: torch N threads, XLA default',
  )
  args = parser.parse_args(argv)
  if args.relabel:
    print(relabel(args.out))
    return
  threads = configure_threads(args.threads)
  print(f'[run] threads: {threads}')
  names = args.only.split(',') if args.only else None
  unknown = set(names or ()) - set(BENCHMARKS)
  if unknown:
    parser.error(f'unknown benchmarks {sorted(unknown)}')
  result = run_all(args.quick, args.out, names=names)
  info_path = Path(args.out) / 'run.json'
  info = json.loads(info_path.read_text())
  info['threads'] = threads
  from leakjax.io import atomic_write_text  # pylint: disable=g-import-not-at-top

  atomic_write_text(info_path, json.dumps(info, indent=2, sort_keys=True))
  print(result['markdown'])
  missing = [k for k in REQUIRED_KEYS if k not in result['summary']]
  if missing:
    print(f'[run] missing headline keys: {missing}')


if __name__ == '__main__':
  main()
