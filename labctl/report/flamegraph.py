"""Flame graphs as SVG, plain and differential, from folded stacks (:mod:`labctl.trace.flamefold`).

Public API::

    render_svg(stacks, ...) -> str         render_diff_svg(before, after, ...) -> str
    frame_colour(frame) -> "#rrggbb"       module_hue(module) -> degrees

The SVG graphs are self-contained (no URL but the SVG namespace of a
standalone file), deterministic, and well-formed XML. Their one script is
:data:`SCRIPT` (search and click-to-zoom), embedded verbatim in a CDATA
section; a page whose Content-Security-Policy forbids inline scripts must
allow ``script-src`` :func:`script_csp_source` (its hash).
With ``inline=True`` the ``<svg>`` element goes straight into an HTML page:
no XML declaration and no ``xmlns``, ids start with ``id_prefix``; the
script finds every graph on the page by class, so any number of graphs
work side by side.
"""

from __future__ import annotations

import base64
import colorsys
import hashlib
import html
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from labctl.trace import Frame, Stack

# --------------------------------------------------------------------------- the script

SCRIPT = """(function () {
  "use strict";
  var HIGHLIGHT = "#fff200", INK = "#1f2933";
  function num(el, name) { return Number(el.getAttribute(name)); }
  function has(el, cls) {
    return el.getAttribute ? (" " + (el.getAttribute("class") || "") + " ").indexOf(" " + cls + " ") !== -1 : false;
  }
  function frames(svg) { return Array.prototype.slice.call(svg.querySelectorAll("g.lfg-f")); }
  function button(svg, cls, on) {
    var b = svg.querySelector("." + cls);
    if (b) { b.setAttribute("visibility", on ? "visible" : "hidden"); }
  }
  function place(svg, f, x, w) {
    var rect = f.querySelector("rect"), text = f.querySelector("text");
    if (w === null) { f.setAttribute("display", "none"); return; }
    var px = num(svg, "data-left") + x * num(svg, "data-plot"), pw = w * num(svg, "data-plot");
    var name = f.getAttribute("data-f"), fit = Math.floor((pw - 6) / num(svg, "data-cw"));
    f.removeAttribute("display");
    rect.setAttribute("x", px.toFixed(2));
    rect.setAttribute("width", pw.toFixed(2));
    text.setAttribute("x", (px + 3).toFixed(2));
    text.textContent = fit < 3 ? "" : (name.length > fit ? name.slice(0, fit - 2) + ".." : name);
  }
  function unzoom(svg) {
    var total = num(svg, "data-total");
    frames(svg).forEach(function (f) { place(svg, f, num(f, "data-s") / total, num(f, "data-n") / total); });
    button(svg, "lfg-reset", false);
  }
  function zoom(svg, target) {
    var s0 = num(target, "data-s"), n0 = num(target, "data-n"), d0 = num(target, "data-d");
    if (d0 === 0) { unzoom(svg); return; }
    frames(svg).forEach(function (f) {
      var s = num(f, "data-s"), n = num(f, "data-n"), d = num(f, "data-d");
      if (d <= d0) {
        place(svg, f, 0, s <= s0 && s + n >= s0 + n0 ? 1 : null);
      } else if (s >= s0 && s + n <= s0 + n0) {
        place(svg, f, (s - s0) / n0, n / n0);
      } else {
        place(svg, f, 0, null);
      }
    });
    button(svg, "lfg-reset", true);
  }
  function matcher(term) {
    var end = term.lastIndexOf("/");
    if (term.length > 2 && term.charAt(0) === "/" && end > 0) {
      var re = new RegExp(term.slice(1, end), term.slice(end + 1).replace(/[gy]/g, ""));
      return function (s) { return re.test(s); };
    }
    var low = term.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(low) !== -1; };
  }
  function paint(f, hit) {
    var rect = f.querySelector("rect"), text = f.querySelector("text");
    rect.setAttribute("fill", hit ? HIGHLIGHT : rect.getAttribute("data-fill"));
    rect.setAttribute("stroke", hit ? INK : "none");
    text.setAttribute("fill", hit ? INK : text.getAttribute("data-ink"));
  }
  function clear(svg) {
    frames(svg).forEach(function (f) { paint(f, false); });
    svg.querySelector(".lfg-matched").textContent = "";
    button(svg, "lfg-clear", false);
  }
  function search(svg, term) {
    var out = svg.querySelector(".lfg-matched"), total = num(svg, "data-total"), hits = [], test;
    try { test = matcher(term); } catch (e) { out.textContent = "not a regular expression: " + term; return; }
    frames(svg).forEach(function (f) {
      if (has(f, "lfg-root")) { return; }
      var hit = test(f.getAttribute("data-f"));
      paint(f, hit);
      if (hit) { hits.push([num(f, "data-s"), num(f, "data-s") + num(f, "data-n")]); }
    });
    hits.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
    var matched = 0, end = 0;
    hits.forEach(function (h) {
      if (h[1] > end) { matched += h[1] - Math.max(h[0], end); end = h[1]; }
    });
    out.textContent = "matched " + matched + " of " + total + " samples (" +
      (total ? (100 * matched / total).toFixed(2) : "0.00") + "%)";
    button(svg, "lfg-clear", true);
  }
  function init(svg) {
    if (svg.getAttribute("data-ready") === "1") { return; }
    svg.setAttribute("data-ready", "1");
    frames(svg).forEach(function (f) {
      var rect = f.querySelector("rect"), text = f.querySelector("text");
      rect.setAttribute("data-fill", rect.getAttribute("fill"));
      text.setAttribute("data-ink", text.getAttribute("fill") || "inherit");
    });
    svg.addEventListener("click", function (ev) {
      for (var el = ev.target; el && el !== svg; el = el.parentNode) {
        if (has(el, "lfg-f")) { zoom(svg, el); return; }
        if (has(el, "lfg-reset")) { unzoom(svg); return; }
        if (has(el, "lfg-clear")) { clear(svg); return; }
        if (has(el, "lfg-search")) {
          var term = window.prompt("Search functions (text, or /regex/flags):", svg.getAttribute("data-term") || "");
          if (term !== null) {
            svg.setAttribute("data-term", term);
            if (term) { search(svg, term); } else { clear(svg); }
          }
          return;
        }
      }
    });
  }
  function initAll() { Array.prototype.forEach.call(document.querySelectorAll("svg.lfg"), init); }
  initAll();
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", initAll); }
})();
"""
"""Search (text or ``/regex/``, highlights matches and shows their share of
samples, nested matches counted once) and click-to-zoom, for every graph on
the page. It needs no URL, ``eval`` or inline handler."""


def script_csp_source() -> str:
    """The CSP source (``'sha256-<base64>'``) that allows :data:`SCRIPT`, the exact text the graphs embed."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii") + "'"


# --------------------------------------------------------------------------- colours

FRAME_H = 16
FONT_SIZE = 11
CHAR_W = 6.6  # one monospace character at FONT_SIZE
PAD = 10
TOP = 50  # title, subtitle and buttons
ROW = 17  # legend and note lines
INK = "#1f2933"
MUTED = "#5b6673"
ROOT_FILL = "#d5d9de"
NEUTRAL = "#e4e4e4"
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]*")


def _esc(text: str) -> str:
    """Text or attribute value, escaped, with characters XML forbids replaced."""
    return html.escape(_XML_BAD.sub("\ufffd", text), quote=True)


def _unit(text: str) -> float:
    """A stable number in [0, 1) from ``text`` (sha256, not Python's salted hash)."""
    digest = hashlib.sha256(text.encode("utf-8", "replace")).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def _hsl(hue: float, sat: float, light: float) -> str:
    r, g, b = colorsys.hls_to_rgb(hue / 360, light, sat)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def module_hue(module: str) -> float:
    """The hue (degrees) of a kernel module's frames: from a hash of its name, within 170-320 (cyan to magenta),
    clear of kernel core's orange and user space's green."""
    return 170 + 150 * _unit("module:" + module)


def frame_colour(frame: Frame, shade: float | None = None) -> str:
    """Fill of a frame: a family per kind (kernel orange, module by :func:`module_hue`, user green,
    process sand, unknown grey), its shade from the function name unless ``shade`` (0..1) is given."""
    v = _unit(frame.function) if shade is None else shade
    if frame.kind == "kernel":
        return _hsl(16 + 24 * v, 0.85, 0.58)
    if frame.kind == "module":
        return _hsl(module_hue(frame.module), 0.6, 0.5 + 0.14 * v)
    if frame.kind == "user":
        return _hsl(92 + 36 * v, 0.5, 0.48 + 0.12 * v)
    if frame.kind == "process":
        return _hsl(42, 0.3, 0.74 + 0.08 * v)
    return _hsl(0, 0, 0.64 + 0.1 * v)


def _ink(fill: str) -> str:
    """Label colour readable on ``fill`` (``#rrggbb``): white on dark fills, else the ink."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#ffffff" if 0.299 * r + 0.587 * g + 0.114 * b < 128 else INK


def _diff_colour(grew: int, delta: float, max_delta: float) -> str:
    """Red (grew > 0) or blue (< 0), deeper for a larger change; neutral when the share did not change."""
    if grew == 0 or max_delta <= 0:
        return NEUTRAL
    v = round(210 * (1 - min(abs(delta) / max_delta, 1.0)))
    return f"#ff{v:02x}{v:02x}" if grew > 0 else f"#{v:02x}{v:02x}ff"


# --------------------------------------------------------------------------- layout


@dataclass
class _Node:
    frame: Frame
    count: int = 0
    children: dict[Frame, _Node] = field(default_factory=dict)


def _tree(stacks: Mapping[Stack, int]) -> _Node:
    root = _Node(Frame("all", "root"))
    for stack, n in stacks.items():
        if n <= 0:
            continue
        node = root
        node.count += n
        for f in stack:
            node = node.children.setdefault(f, _Node(f))
            node.count += n
    return root


@dataclass(frozen=True)
class _Box:
    node: _Node
    twin: _Node | None  # the same path in the other profile (diff graphs)
    depth: int
    start: int  # samples left of it


def _layout(root: _Node, scale: float, min_width: float,
            other: _Node | None = None) -> tuple[list[_Box], int]:
    """Frames to draw, children in name order, and the samples in frames narrower than ``min_width`` px."""
    boxes: list[_Box] = []
    hidden = 0
    todo = [_Box(root, other, 0, 0)]
    while todo:
        box = todo.pop()
        boxes.append(box)
        start, kids = box.start, []
        for key in sorted(box.node.children):
            child = box.node.children[key]
            if child.count * scale < min_width:
                hidden += child.count
            else:
                twin = box.twin.children.get(key) if box.twin is not None else None
                kids.append(_Box(child, twin, box.depth + 1, start))
            start += child.count
        todo.extend(reversed(kids))
    return boxes, hidden


def _samples(n: int) -> str:
    return f"{n} sample" if n == 1 else f"{n} samples"


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.2f}%" if total else "0.00%"


def _label(name: str, width: float) -> str:
    fit = int((width - 6) // CHAR_W)
    if fit < 3:
        return ""
    return name if len(name) <= fit else name[: fit - 2] + ".."


# --------------------------------------------------------------------------- drawing


def _text(x: float, y: float, text: str, *, extra: str = "") -> str:
    return f'<text x="{x:.2f}" y="{y:.2f}"{extra}>{_esc(text)}</text>'


def _button(x: float, label: str, cls: str, ident: str, *, hidden: bool = False) -> str:
    width = len(label) * CHAR_W + 12
    vis = ' visibility="hidden"' if hidden else ""
    return (f'<g class="lfg-btn {cls}" id="{ident}" cursor="pointer"{vis}>'
            f'<rect x="{x:.2f}" y="8" width="{width:.2f}" height="18" rx="3" fill="#f4f6f8" stroke="#aab2bd"/>'
            + _text(x + 6, 21, label) + "</g>")


def _legend(items: Sequence[tuple[str, str]], width: float, y: float) -> tuple[list[str], float]:
    """Swatches with labels, wrapped to ``width``; returns the parts and the y after the last row."""
    parts, x = ['<g class="lfg-legend">'], float(PAD)
    for fill, label in items:
        step = 18 + len(label) * CHAR_W + 14
        if x > PAD and x + step > width - PAD:
            x, y = float(PAD), y + ROW
        parts.append(f'<rect x="{x:.2f}" y="{y - 10:.2f}" width="12" height="12" rx="2" fill="{fill}"/>')
        parts.append(_text(x + 18, y, label))
        x += step
    parts.append("</g>")
    return parts, y + ROW


def _render(root: _Node, *, fill: Mapping[int, str], tooltip: Mapping[int, str], boxes: list[_Box],
            title: str, subtitle: str, legend: Sequence[tuple[str, str]], notes: Sequence[str],
            inline: bool, prefix: str, width: int, with_script: bool) -> str:
    """The SVG document around laid-out boxes; ``fill``/``tooltip`` are keyed by ``id(box)``."""
    total = root.count
    plot = width - 2 * PAD
    scale = plot / total if total else 0.0
    depth = max((b.depth for b in boxes), default=0)
    frames_bottom = TOP + (depth + 1) * FRAME_H
    legend_parts, notes_y = _legend(legend, width, frames_bottom + 22)
    height = notes_y + ROW * len(notes) + 10
    ns = "" if inline else ' xmlns="http://www.w3.org/2000/svg" version="1.1"'
    head = "" if inline else '<?xml version="1.0" encoding="UTF-8"?>\n'
    parts = [(f'{head}<svg{ns} class="lfg" id="{prefix}svg" width="{width}" height="{height:.0f}" '
              f'viewBox="0 0 {width} {height:.0f}" font-family="ui-monospace, Menlo, Consolas, monospace" '
              f'font-size="{FONT_SIZE}" fill="{INK}" aria-label="{_esc(title)}" '
              f'data-total="{total}" data-left="{PAD}" data-plot="{plot}" data-cw="{CHAR_W}">'),
             f"<title>{_esc(title)}</title>",
             f'<rect x="0" y="0" width="{width}" height="{height:.0f}" fill="#ffffff"/>',
             _text(width / 2, 20, title, extra=' text-anchor="middle" font-size="14" font-weight="bold"'),
             _text(width / 2, 38, subtitle, extra=f' text-anchor="middle" fill="{MUTED}"'),
             _button(PAD, "Reset zoom", "lfg-reset", f"{prefix}reset", hidden=True)]
    if with_script or inline:  # an inline graph is searched by its page's one script
        parts += [_button(width - PAD - 6 * CHAR_W - 12, "Search", "lfg-search", f"{prefix}search"),
                  _button(width - PAD - 13 * CHAR_W - 30, "Clear", "lfg-clear", f"{prefix}clear", hidden=True)]
    parts.append(_text(width - PAD, 42, "", extra=f' class="lfg-matched" id="{prefix}matched" text-anchor="end"'))
    parts.append(f'<g class="lfg-frames" id="{prefix}frames">')
    if not total:
        parts.append(_text(width / 2, TOP + FRAME_H - 4, "no samples", extra=' text-anchor="middle"'))
    for box in boxes if total else []:
        node = box.node
        x, w = PAD + box.start * scale, node.count * scale
        y = TOP + (depth - box.depth) * FRAME_H
        cls = "lfg-f lfg-root" if box.depth == 0 else "lfg-f"
        parts.append(f'<g class="{cls}" data-f="{_esc(node.frame.function)}" data-s="{box.start}" '
                     f'data-n="{node.count}" data-d="{box.depth}"><title>{_esc(tooltip[id(box)])}</title>'
                     f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{FRAME_H - 1}" rx="2" '
                     f'fill="{fill[id(box)]}"/>'
                     + _text(x + 3, y + FRAME_H - 4.5, _label(node.frame.function, w),
                             extra="" if _ink(fill[id(box)]) == INK else ' fill="#ffffff"') + "</g>")
    parts.append("</g>")
    parts += legend_parts
    for i, note in enumerate(notes):
        parts.append(_text(PAD, notes_y + i * ROW, note, extra=f' class="lfg-note" fill="{MUTED}"'))
    if with_script:
        parts.append(f"<script><![CDATA[{SCRIPT}]]></script>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _check(prefix: str, width: int, min_width: float) -> None:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"id prefix {prefix!r}: must start with a letter and hold only letters, digits, _.:-")
    if width < 200 or min_width < 0:
        raise ValueError(f"width {width} (at least 200) or min_width {min_width} (not negative) out of range")


def _hidden_note(hidden: int, total: int, min_width: float) -> str:
    if not hidden:
        return f"every frame is drawn (none narrower than {min_width:g} px)"
    return (f"not drawn: frames narrower than {min_width:g} px, holding {_samples(hidden)} "
            f"({_pct(hidden, total)}; their callers' widths include them)")


def _legend_items(stacks: Mapping[Stack, int]) -> list[tuple[str, str]]:
    kinds = {f.kind for stack in stacks for f in stack}
    modules = sorted({f.module for stack in stacks for f in stack if f.kind == "module"})
    items = [(frame_colour(Frame("", "process"), 0.5), "process")] if "process" in kinds else []
    if "kernel" in kinds:
        items.append((frame_colour(Frame("", "kernel"), 0.5), "kernel"))
    items += [(frame_colour(Frame("", "module", m), 0.5), f"module {m}") for m in modules]
    items += [(frame_colour(Frame("", k), 0.5), {"user": "user space"}.get(k, k))
              for k in ("user", "unknown") if k in kinds]
    return items


def render_svg(stacks: Mapping[Stack, int], *, title: str = "Flame graph", subtitle: str = "",
               notes: Sequence[str] = (), inline: bool = False, id_prefix: str = "fg-",
               width: int = 1200, min_width: float = 0.1, with_script: bool = True) -> str:
    """A flame graph of ``stacks`` as SVG text: the same input gives the same bytes.

    Frame widths are proportional to samples, siblings in name order, the
    root ``all`` at the bottom. Frames narrower than ``min_width`` px are
    not drawn, and a note in the graph says how many samples they hold.
    Each frame's ``<title>`` reads ``function [where]: N samples, P%``
    (P of all samples); fills follow :func:`frame_colour`, with a legend of
    the kinds and modules present. ``subtitle`` and each of ``notes`` are
    printed as given. ``inline`` and ``id_prefix``: see the module
    docstring; ``with_script=False`` leaves the script out (a page may then
    embed :data:`SCRIPT` once itself). Raises ValueError for a prefix that
    is not a valid id start, ``width`` < 200 or a negative ``min_width``.
    """
    _check(id_prefix, width, min_width)
    root = _tree(stacks)
    total = root.count
    boxes, hidden = _layout(root, (width - 2 * PAD) / total if total else 0.0, min_width)
    fill = {id(b): ROOT_FILL if b.depth == 0 else frame_colour(b.node.frame) for b in boxes}
    tooltip = {id(b): (f"{b.node.frame.function}" + ("" if b.depth == 0 else f" [{b.node.frame.where}]")
                       + f": {_samples(b.node.count)}, {_pct(b.node.count, total)}") for b in boxes}
    sub = ", ".join(p for p in (subtitle, _samples(total)) if p)
    return _render(root, fill=fill, tooltip=tooltip, boxes=boxes, title=title, subtitle=sub,
                   legend=_legend_items(stacks), notes=[_hidden_note(hidden, total, min_width), *notes],
                   inline=inline, prefix=id_prefix, width=width, with_script=with_script)


def _vanished(after: _Node, before: _Node) -> Iterator[tuple[int, Frame]]:
    """(samples, frame) of the highest ``before`` frames whose path ``after`` lacks."""
    todo = [(after, before)]
    while todo:
        a, b = todo.pop()
        for key in sorted(b.children):
            if key in a.children:
                todo.append((a.children[key], b.children[key]))
            else:
                yield b.children[key].count, key


def _vanished_note(after: _Node, before: _Node) -> str:
    gone = sorted(_vanished(after, before), key=lambda item: (-item[0], item[1]))
    lost = sum(n for n, _ in gone)
    if not before.count:
        return "before: no samples"
    if not lost:
        return "before: every path also occurs in after"
    largest = ", ".join(f"{f.function} ({n})" for n, f in gone[:3])
    return (f"before: {lost} of {before.count} samples ({_pct(lost, before.count)}) are on paths after lacks "
            f"and not drawn; largest: {largest}")


def render_diff_svg(before: Mapping[Stack, int], after: Mapping[Stack, int], *,
                    title: str = "Differential flame graph", subtitle: str = "", notes: Sequence[str] = (),
                    inline: bool = False, id_prefix: str = "fg-", width: int = 1200, min_width: float = 0.1,
                    with_script: bool = True) -> str:
    """A differential flame graph: frames sized by ``after``, coloured by the change of their share.

    A frame's share is its samples (itself and its callees) over its side's
    total, so profiles of different lengths compare. Red: the share grew,
    blue: it shrank, deeper for a larger change (relative to the largest
    change drawn); neutral grey: exactly unchanged. Tooltips give both
    counts and shares and the change in percentage points. Frames of
    ``before`` whose path ``after`` lacks cannot be drawn; a note says how
    many samples of ``before`` they hold and names the largest. Otherwise
    as :func:`render_svg` (modes, search, hidden-sample note, ValueError).
    """
    _check(id_prefix, width, min_width)
    a_root, b_root = _tree(after), _tree(before)
    ta, tb = a_root.count, b_root.count
    boxes, hidden = _layout(a_root, (width - 2 * PAD) / ta if ta else 0.0, min_width, b_root)
    changes: dict[int, tuple[int, float, int]] = {}
    for box in boxes:
        a, b = box.node.count, box.twin.count if box.twin is not None else 0
        grew = a * tb - b * ta if tb else a  # sign of a/ta - b/tb, exact
        changes[id(box)] = (grew, (a / ta - (b / tb if tb else 0.0)) * 100 if ta else 0.0, b)
    max_delta = max((abs(changes[id(box)][1]) for box in boxes if box.depth), default=0.0)
    fill, tooltip = {}, {}
    for box in boxes:
        grew, delta, b = changes[id(box)]
        fill[id(box)] = ROOT_FILL if box.depth == 0 else _diff_colour(grew, delta, max_delta)
        where = "" if box.depth == 0 else f" [{box.node.frame.where}]"
        tooltip[id(box)] = (f"{box.node.frame.function}{where}: after {_samples(box.node.count)} "
                            f"({_pct(box.node.count, ta)}), before {b} ({_pct(b, tb)}), {delta:+.2f} points")
    sub = ", ".join(p for p in (subtitle, f"after {_samples(ta)}, before {tb}; width: after") if p)
    legend = [(_diff_colour(1, 1.0, 1.0), "share grew"), (_diff_colour(-1, 1.0, 1.0), "share shrank"),
              (NEUTRAL, "unchanged"), (_diff_colour(1, 0.2, 1.0), "paler: smaller change")]
    return _render(a_root, fill=fill, tooltip=tooltip, boxes=boxes, title=title, subtitle=sub, legend=legend,
                   notes=[_hidden_note(hidden, ta, min_width), _vanished_note(a_root, b_root), *notes],
                   inline=inline, prefix=id_prefix, width=width, with_script=with_script)
