"""Inline SVG bar charts for the HTML report: no scripts, no fonts, no URLs.

The output is deterministic (same input, same bytes) and well-formed XML. It
has no ``xmlns`` attribute on purpose: inline SVG inside HTML needs none, and
the report must not contain a single URL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from labctl.bundle import fmt_num, usable

WIDTH = 560
BAR_HEIGHT = 22
BAR_GAP = 10
TOP = 40  # room for the title
BOTTOM = 46  # room for tick labels and the value axis label
RIGHT = 64  # room for a value printed after a short bar
CHAR_WIDTH = 6.8  # rough width of one 12 px sans-serif character
MAX_LABEL_CHARS = 28
BAR_COLOR = "#3b6ea8"
FAILED_COLOR = "#b42318"
GRID_COLOR = "#e3e7ee"
INK = "#1f2933"
MUTED = "#6b7785"


def nice_ticks(vmax: float, target: int = 4) -> list[float]:
    """Round tick positions from 0 to the lowest round top >= ``vmax``, 2 to 5 intervals of 1, 2, 2.5 or 5 x 10^k."""
    if vmax <= 0:
        return [0.0, 1.0]
    mag = 10 ** math.floor(math.log10(vmax / target))
    options = []
    for m in (1, 2, 2.5, 5, 10, 20):
        step = m * mag
        count = max(1, math.ceil(round(vmax / step, 9)))
        if 2 <= count <= 5:
            options.append((round(step * count, 9), abs(count - target), step, count))
    _, _, step, count = min(options)
    return [round(i * step, 9) for i in range(count + 1)]


def _fmt_tick(value: float) -> str:
    return f"{value:g}"


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 1] + "…"


def _text(x: float, y: float, text: str, *, anchor: str = "start", fill: str = INK,
          extra: str = "") -> str:
    attrs = f'x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}"'
    return f"<text {attrs}{extra}>{escape(text)}</text>"


def _label_width(labels: Sequence[str]) -> float:
    longest = max((len(_short(lbl)) for lbl in labels), default=4)
    return min(max(longest * CHAR_WIDTH + 34, 90), MAX_LABEL_CHARS * CHAR_WIDTH + 34)


def _grid(left: float, plot_w: float, top: float, bottom: float, ticks: list[float]) -> list[str]:
    parts = []
    for t in ticks:
        x = left + plot_w * t / ticks[-1]
        parts.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}" '
                     f'stroke="{GRID_COLOR}" stroke-width="1"/>')
        parts.append(_text(x, bottom + 15, _fmt_tick(t), anchor="middle", fill=MUTED))
    parts.append(f'<line x1="{left:.1f}" y1="{top:.1f}" x2="{left:.1f}" y2="{bottom:.1f}" '
                 f'stroke="{MUTED}" stroke-width="1"/>')
    parts.append(f'<line x1="{left:.1f}" y1="{bottom:.1f}" x2="{left + plot_w:.1f}" y2="{bottom:.1f}" '
                 f'stroke="{MUTED}" stroke-width="1"/>')
    return parts


def _missing_bar(left: float, y: float, mid: float, failed: bool) -> list[str]:
    color, text = (FAILED_COLOR, "failed") if failed else (MUTED, "n/a")
    return [(f'<rect x="{left + 1:.1f}" y="{y:.1f}" width="52" height="{BAR_HEIGHT}" fill="none" '
             f'stroke="{color}" stroke-dasharray="3 3"/>'),
            _text(left + 27, mid, text, anchor="middle", fill=color, extra=' font-style="italic"')]


def _bar(left: float, y: float, plot_w: float, scale_max: float, label: str,
         value: float | None, unit: str, failed: bool) -> list[str]:
    mid = y + BAR_HEIGHT / 2 + 4
    status = " (step failed)" if failed else ""
    parts = [f"<g><title>{escape(label)}: {escape(_value_text(value, unit))}{status}</title>",
             _text(left - 8, mid, _short(label), anchor="end", fill=FAILED_COLOR if failed else INK)]
    if value is None:
        return parts + _missing_bar(left, y, mid, failed) + ["</g>"]
    width = plot_w * max(value, 0.0) / scale_max
    shown = _value_text(value, unit)
    parts.append(f'<rect x="{left:.1f}" y="{y:.1f}" width="{width:.1f}" height="{BAR_HEIGHT}" '
                 f'rx="2" fill="{FAILED_COLOR if failed else BAR_COLOR}"/>')
    if width >= len(shown) * CHAR_WIDTH + 12:
        parts.append(_text(left + width - 6, mid, shown, anchor="end", fill="#ffffff",
                           extra=' font-weight="600"'))
    else:
        parts.append(_text(left + width + 5, mid, shown, fill=INK, extra=' font-weight="600"'))
    return parts + ["</g>"]


def _value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{fmt_num(value)}%" if unit == "%" else f"{fmt_num(value)} {unit}"


def bar_chart_svg(title: str, labels: Sequence[str], values: Sequence[float | int | None], unit: str,
                  *, axis_label: str | None = None, failed: Sequence[bool] | None = None) -> str:
    """A horizontal bar chart, one bar per label, as an inline ``<svg>`` element.

    ``values`` may hold None (not measured): such a bar is drawn as a dashed
    ``n/a`` box. Each bar has its value printed on it, the value axis has
    ticks and is labelled with ``axis_label`` (default: ``unit``). Bars whose
    ``failed`` flag is set are red, and a missing one reads ``failed``.
    """
    flags = list(failed) if failed is not None else [False] * len(labels)
    if not len(labels) == len(values) == len(flags):
        raise ValueError(f"{len(labels)} labels, {len(values)} values and {len(flags)} failed flags")
    nums = [usable(v) for v in values]
    left = _label_width(labels)
    plot_w = WIDTH - left - RIGHT
    rows = max(len(labels), 1)
    bottom = TOP + rows * (BAR_HEIGHT + BAR_GAP) + BAR_GAP / 2
    height = bottom + BOTTOM
    ticks = nice_ticks(max((v for v in nums if v is not None), default=0.0))
    parts = [(f'<svg class="chart" width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
              f'role="img" aria-label="{escape(title)}" font-family="system-ui, sans-serif" font-size="12">'),
             f"<title>{escape(title)}</title>",
             _text(0, 18, title, extra=' font-size="14" font-weight="600"')]
    parts += _grid(left, plot_w, TOP - 4, bottom, ticks)
    for i, (label, value, bad) in enumerate(zip(labels, nums, flags, strict=True)):
        y = TOP + BAR_GAP / 2 + i * (BAR_HEIGHT + BAR_GAP)
        parts += _bar(left, y, plot_w, ticks[-1], label, value, unit, bad)
    if not labels:
        parts.append(_text(left + plot_w / 2, TOP + 20, "no data", anchor="middle", fill=MUTED))
    parts.append(_text(left + plot_w / 2, height - 8, axis_label or unit, anchor="middle", fill=MUTED))
    parts.append("</svg>")
    return "\n".join(parts)
