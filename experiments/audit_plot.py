"""The audit's leakage-utility frontier (report.html's plot).

:func:`frontier_figure` draws the :class:`Point` s that
:mod:`experiments.audit_report` reads off the results, one panel per
artefact; :func:`frontier_png` is what :mod:`experiments.audit_html`
embeds in the page.
"""

from __future__ import annotations

import dataclasses
import io as _io
import math


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
