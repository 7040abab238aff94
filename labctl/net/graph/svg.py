"""The topology as an SVG picture (:func:`to_svg`): deterministic, no scripts, no URLs.

The layout is deliberately simple: networks in a middle column, guests
stacked in columns on both sides with their NIC rows facing the networks,
guests and networks ordered by a few rounds of barycentre sorting so that
links cross little. The canvas grows with the lab.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from labctl.net.graph.nodes import GuestNode, MasterRow, NetworkNode, NicRow, Topology, VlanRow
from labctl.net.graph.style import (
    BAD_BG,
    BAR_COLOR,
    CARD,
    CHAR_WIDTH,
    FAILED_COLOR,
    FONT,
    GOOD,
    GRID_COLOR,
    HEAD,
    INK,
    MUTED,
    WARN,
)
from labctl.net.graph.style import short as _short
from labctl.net.graph.style import xml_text as _x

MARGIN = 16
TITLE_H = 46  # lab name and description
GAP_X = 96  # room for the curves between a guest column and the networks
GAP_Y = 18
GUEST_MIN_W, GUEST_MAX_W = 230, 360
NET_MIN_W, NET_MAX_W = 150, 320
HEAD_H = 42
ROW_H = 36
IMPAIR_H = 14
ATTACH_STEP = 16
BOLD_W = 9.0  # rough width of one 14 px bold character
SMALL_W = 6.3  # rough width of one 11 px character
BADGE_W = {"pcap": 32.0, "down": 36.0}
ROUNDS = 4  # rounds of barycentre ordering

def _f(value: float) -> str:
    return f"{value:.1f}"


@dataclass
class _Box:
    """A placed rectangle."""

    x: float
    y: float
    w: float
    h: float


def _nic_h(nic: NicRow) -> float:
    return ROW_H + (IMPAIR_H if nic.impairments else 0) + IMPAIR_H * len(nic.vlans)


def _master_h(m: MasterRow) -> float:
    return ROW_H + IMPAIR_H * len(m.vlans)


def _guest_h(guest: GuestNode) -> float:
    return (HEAD_H + (sum(_nic_h(n) for n in guest.nics) if guest.nics else ROW_H)
            + sum(_master_h(m) for m in guest.masters) + 4)


def _badges(nic: NicRow) -> list[str]:
    return (["pcap"] if nic.captured else []) + (["down"] if nic.down else [])


def _nic_line1(nic: NicRow) -> list[tuple[str, str]]:
    """The first line of a NIC row as (text, style) pieces."""
    pieces = [(nic.name, "b"), ("  " + nic.model, "")]
    if nic.driver:
        pieces.append((" · " + nic.driver, "driver"))
    return pieces


def _guest_w(guest: GuestNode) -> float:
    need = len(guest.name) * BOLD_W + len(guest.state or "") * SMALL_W + 40
    need = max(need, len(guest.info_text) * SMALL_W + 24)
    for nic in guest.nics:
        badges = sum(BADGE_W[b] + 4 for b in _badges(nic))
        need = max(need, sum(len(t) for t, _ in _nic_line1(nic)) * CHAR_WIDTH + badges + 28,
                   len(nic.address_text) * SMALL_W + 28, len(nic.impairment_text) * SMALL_W + 28,
                   *(len(v.text) * SMALL_W + 40 for v in nic.vlans))
    for m in guest.masters:
        need = max(need, len(m.title) * CHAR_WIDTH + 28, len(m.address_text) * SMALL_W + 28,
                   *(len(v.text) * SMALL_W + 40 for v in m.vlans))
    return min(max(need, GUEST_MIN_W), GUEST_MAX_W)


def _net_w(net: NetworkNode) -> float:
    need = len(net.name) * BOLD_W + (BADGE_W["pcap"] + 8 if net.captured else 0) + 24
    need = max([need] + [len(t) * SMALL_W + 24 for t in net.detail_lines])
    return min(max(need, NET_MIN_W), NET_MAX_W)


@dataclass
class _Layout:
    """Where everything goes: boxes, NIC row centres, sides and the canvas size."""

    guests: dict[str, _Box]
    nets: dict[str, _Box]
    rows: dict[tuple[str, int], float]  # (guest, nic index) -> row centre y
    side: dict[str, str]  # guest -> "L" or "R"
    width: float
    height: float


def _assign_sides(guests: Sequence[GuestNode]) -> dict[str, str]:
    """Guests alternate between the two columns, each to the shorter one (left on a tie)."""
    heights = {"L": 0.0, "R": 0.0}
    side = {}
    for g in guests:
        s = "L" if heights["L"] <= heights["R"] else "R"
        side[g.name] = s
        heights[s] += _guest_h(g) + GAP_Y
    return side


def _stack(order: Sequence[GuestNode], top: float) -> dict[str, float]:
    ys, y = {}, top
    for g in order:
        ys[g.name] = y
        y += _guest_h(g) + GAP_Y
    return ys


def _row_centres(guest: GuestNode, y: float) -> list[float]:
    out, cy = [], y + HEAD_H
    for nic in guest.nics:
        out.append(cy + ROW_H / 2)
        cy += _nic_h(nic)
    return out


def _order(topo: Topology, side: Mapping[str, str],
           top: float) -> tuple[list[GuestNode], list[GuestNode], list[NetworkNode]]:
    """Guest columns and network order after a few rounds of barycentre sorting (stable, deterministic)."""
    cols = {s: [g for g in topo.guests if side[g.name] == s] for s in "LR"}
    nets = list(topo.networks)
    for _ in range(ROUNDS):
        ys = {**_stack(cols["L"], top), **_stack(cols["R"], top)}
        attach: dict[str, list[float]] = {n.name: [] for n in nets}
        for g in topo.guests:
            for nic, cy in zip(g.nics, _row_centres(g, ys[g.name]), strict=True):
                attach.setdefault(nic.network, []).append(cy)
        nets.sort(key=lambda n: _mean(attach[n.name]))
        rank = {n.name: float(i) for i, n in enumerate(nets)}
        cols = {s: sorted(cols[s], key=lambda g: _mean([rank[n.network] for n in g.nics if n.network in rank]))
                for s in "LR"}
    return cols["L"], cols["R"], nets


def _mean(values: Sequence[float]) -> float:
    """The mean of ``values``; infinity for none (sorts last)."""
    return sum(values) / len(values) if values else float("inf")


def _net_h(net: NetworkNode, side_counts: tuple[int, int]) -> float:
    text_h = 30 + 14 * len(net.detail_lines)
    return max(text_h, max(side_counts) * ATTACH_STEP + 16, 52)


def _layout(topo: Topology) -> _Layout:
    top = MARGIN + TITLE_H
    side = _assign_sides(topo.guests)
    left, right, nets = _order(topo, side, top)
    lw = max((_guest_w(g) for g in left), default=0.0)
    rw = max((_guest_w(g) for g in right), default=0.0)
    nw = max((_net_w(n) for n in nets), default=NET_MIN_W)
    net_x = MARGIN + (lw + GAP_X if left else 0)
    right_x = net_x + nw + GAP_X
    boxes: dict[str, _Box] = {}
    rows: dict[tuple[str, int], float] = {}
    for col, x, w in ((left, MARGIN, lw), (right, right_x, rw)):
        for g, y in _stack(col, top).items():
            guest = topo.guest(g)
            boxes[g] = _Box(x, y, w, _guest_h(guest))
            for i, cy in enumerate(_row_centres(guest, y)):
                rows[(g, i)] = cy
    net_boxes = _place_nets(topo, nets, rows, side, net_x, nw, top)
    bottoms = [b.y + b.h for b in [*boxes.values(), *net_boxes.values()]] or [top + 20]
    width = (right_x + rw if right else net_x + nw) + MARGIN
    width = max(width, MARGIN * 2 + len(topo.name) * BOLD_W + 60, 320)
    return _Layout(boxes, net_boxes, rows, side, width, max(bottoms) + MARGIN)


def _place_nets(topo: Topology, nets: Sequence[NetworkNode], rows: Mapping[tuple[str, int], float],
                side: Mapping[str, str], x: float, w: float, top: float) -> dict[str, _Box]:
    """Each network centred on its members' rows if it can be, else just below the one above."""
    boxes: dict[str, _Box] = {}
    floor = top
    for net in nets:
        ys, counts = [], {"L": 0, "R": 0}
        for g in topo.guests:
            for i, nic in enumerate(g.nics):
                if nic.network == net.name:
                    ys.append(rows[(g.name, i)])
                    counts[side[g.name]] += 1
        h = _net_h(net, (counts["L"], counts["R"]))
        want = (sum(ys) / len(ys) - h / 2) if ys else floor
        y = max(want, floor)
        boxes[net.name] = _Box(x, y, w, h)
        floor = y + h + GAP_Y
    return boxes


# --------------------------------------------------------------------------- SVG drawing

def _text(x: float, y: float, text: str, *, anchor: str = "start", fill: str = INK, extra: str = "") -> str:
    return f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" fill="{fill}"{extra}>{_x(text)}</text>'


def _badge(x: float, y: float, kind: str, data: str) -> str:
    """A small filled label whose top-left corner is (x, y)."""
    w = BADGE_W[kind]
    color = FAILED_COLOR if kind == "down" else BAR_COLOR
    return (f'<g class="badge {kind}"{data}><rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="14" rx="3" '
            f'fill="{color}"/>' + _text(x + w / 2, y + 10.5, kind, anchor="middle", fill=CARD,
                                        extra=' font-size="10" font-weight="600"') + "</g>")


def _data(**attrs: str) -> str:
    return "".join(f' data-{k}="{_x(v)}"' for k, v in attrs.items())


def _nic_svg(guest: GuestNode, nic: NicRow, box: _Box, y: float, facing: str) -> list[str]:
    data = _data(guest=guest.name, nic=nic.name)
    tip = (f"{guest.name}.{nic.name}: {nic.model}" + (f", driver {nic.driver}" if nic.driver else "")
           + f", {nic.address_text}" + (f", mac {nic.mac}" if nic.mac else "") + f", network {nic.network}"
           + "".join(f", {v.text}" for v in nic.vlans)
           + (", VLAN offloads " + ", ".join(f"{k} {v}" for k, v in nic.offloads) if nic.offloads else "")
           + (", link down" if nic.down else "") + (", captured" if nic.captured else "")
           + (f", {nic.impairment_text}" if nic.impairments else ""))
    parts = [f'<g class="nic"{data}><title>{_x(tip)}</title>',
             f'<line x1="{_f(box.x)}" y1="{_f(y)}" x2="{_f(box.x + box.w)}" y2="{_f(y)}" stroke="{GRID_COLOR}"/>']
    badges = _badges(nic)
    bx = box.x + box.w - 8
    for kind in reversed(badges):
        bx -= BADGE_W[kind]
        parts.append(_badge(bx, y + 4, kind, data))
        bx -= 4
    budget = (bx - box.x - 12) / CHAR_WIDTH
    spans = []
    for text, style in _nic_line1(nic):
        if budget < 2:
            break
        shown = _short(text, budget)
        budget -= len(shown)
        if shown:
            attr = ' font-weight="600"' if style == "b" else f' fill="{BAR_COLOR}"' if style == "driver" else ""
            spans.append(f"<tspan{attr}>{_x(shown)}</tspan>")
    parts.append(f'<text x="{_f(box.x + 10)}" y="{_f(y + 15)}" fill="{INK}">{"".join(spans)}</text>')
    room = (box.w - 20) / SMALL_W
    parts.append(_text(box.x + 10, y + 29, _short(nic.address_text, room), fill=MUTED, extra=' font-size="11"'))
    ly = y + 43
    if nic.impairments:
        parts.append(_text(box.x + 10, ly, _short(nic.impairment_text, room), fill=WARN,
                           extra=' class="impair" font-size="11" font-weight="600"'))
        ly += IMPAIR_H
    parts += _vlan_lines(nic.vlans, box, ly, room)
    px = box.x + box.w if facing == "L" else box.x
    color = FAILED_COLOR if nic.down else BAR_COLOR
    parts.append(f'<circle cx="{_f(px)}" cy="{_f(y + ROW_H / 2)}" r="3.5" fill="{color}"/>')
    return parts + ["</g>"]


def _vlan_lines(vlans: tuple[VlanRow, ...], box: _Box, y: float, room: float) -> list[str]:
    """One line per VLAN (``vlan 10 eth1.10: 10.10.0.1/24``), indented, from baseline ``y`` down."""
    return [_text(box.x + 22, y + IMPAIR_H * i, _short(v.text, room - 2), fill=BAR_COLOR,
                  extra=' class="vlan" font-size="11"') for i, v in enumerate(vlans)]


def _master_svg(guest: GuestNode, m: MasterRow, box: _Box, y: float) -> list[str]:
    """A bond or bridge: its name, mode or kind and members, then its addresses and VLANs."""
    tip = f"{guest.name}.{m.title}, {m.address_text}" + "".join(f", {v.text}" for v in m.vlans)
    room = (box.w - 20) / SMALL_W
    return [f'<g class="master {m.kind}"{_data(guest=guest.name, iface=m.name)}><title>{_x(tip)}</title>',
            f'<line x1="{_f(box.x)}" y1="{_f(y)}" x2="{_f(box.x + box.w)}" y2="{_f(y)}" stroke="{GRID_COLOR}"/>',
            _text(box.x + 10, y + 15, _short(m.title, (box.w - 20) / CHAR_WIDTH), extra=' font-weight="600"'),
            _text(box.x + 10, y + 29, _short(m.address_text, room), fill=MUTED, extra=' font-size="11"'),
            *_vlan_lines(m.vlans, box, y + 43, room), "</g>"]


def _guest_svg(guest: GuestNode, box: _Box, facing: str, gid: str) -> list[str]:
    stroke = FAILED_COLOR if guest.crashed else BAR_COLOR
    head = BAD_BG if guest.crashed else HEAD
    x, y, w, h, r = box.x, box.y, box.w, box.h, 6.0
    tip = f"guest {guest.name}" + (f" ({guest.info_text})" if guest.info_text else "") + (
        f", {guest.state}" if guest.state else "") + "".join(f"\nfirewall: {line}" for line in guest.firewall)
    parts = [f'<g class="guest{" crashed" if guest.crashed else ""}" id="{gid}"{_data(guest=guest.name)}>',
             f"<title>{_x(tip)}</title>",
             f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(h)}" rx="{r:g}" fill="{CARD}"/>',
             (f'<path d="M{_f(x)} {_f(y + HEAD_H)} V{_f(y + r)} Q{_f(x)} {_f(y)} {_f(x + r)} {_f(y)} '
              f'H{_f(x + w - r)} Q{_f(x + w)} {_f(y)} {_f(x + w)} {_f(y + r)} V{_f(y + HEAD_H)} Z" fill="{head}"/>')]
    state_w = 0.0
    if guest.state:
        color = FAILED_COLOR if guest.crashed else GOOD if guest.state == "running" else MUTED
        parts.append(_text(x + w - 10, y + 18, guest.state, anchor="end", fill=color,
                           extra=' class="state" font-size="11" font-weight="600"'))
        state_w = len(guest.state) * SMALL_W + 8
    parts.append(_text(x + 10, y + 19, _short(guest.name, (w - 24 - state_w) / BOLD_W),
                       extra=' font-size="14" font-weight="600"'))
    if guest.info_text:
        parts.append(_text(x + 10, y + 34, _short(guest.info_text, (w - 20) / SMALL_W), fill=MUTED,
                           extra=' font-size="11"'))
    cy = y + HEAD_H
    for nic in guest.nics:
        parts += _nic_svg(guest, nic, box, cy, facing)
        cy += _nic_h(nic)
    if not guest.nics:
        parts.append(_text(x + 10, cy + 22, "no lab NICs", fill=MUTED, extra=' font-style="italic"'))
        cy += ROW_H
    for m in guest.masters:
        parts += _master_svg(guest, m, box, cy)
        cy += _master_h(m)
    dash = ' stroke-dasharray="5 3"' if guest.state == "stopped" else ""
    parts.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(h)}" rx="{r:g}" fill="none" '
                 f'stroke="{stroke}" stroke-width="{2 if guest.crashed else 1.2}"{dash}/>')
    return parts + ["</g>"]


def _net_svg(net: NetworkNode, box: _Box, nid: str) -> list[str]:
    x, y, w, h = box.x, box.y, box.w, box.h
    lines = net.detail_lines
    tip = f"network {net.name}" + "".join(f"; {t}" for t in lines) + f"; {len(net.members)} member(s)"
    data = _data(network=net.name)
    cls = "network captured" if net.captured else "network"
    parts = [f'<g class="{cls}" id="{nid}"{data}><title>{_x(tip)}</title>',
             (f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(h)}" rx="10" fill="{HEAD}" '
              f'stroke="{BAR_COLOR}" stroke-width="1.6"/>')]
    badge_w = 0.0
    if net.captured:
        badge_w = BADGE_W["pcap"] + 6
        parts.append(_badge(x + w - 8 - BADGE_W["pcap"], y + 7, "pcap", data))
    parts.append(_text(x + 12, y + 20, _short(net.name, (w - 24 - badge_w) / BOLD_W),
                       extra=' font-size="14" font-weight="600"'))
    for i, line in enumerate(lines):
        italic = ' font-style="italic"' if line == net.description and i == len(lines) - 1 else ""
        parts.append(_text(x + 12, y + 36 + 14 * i, _short(line, (w - 24) / SMALL_W), fill=MUTED,
                           extra=f' font-size="11"{italic}'))
    return parts + ["</g>"]


def _edges_svg(topo: Topology, lay: _Layout) -> list[str]:
    """One curve per NIC from its row to its network, attachment points sorted so they do not cross."""
    ends: dict[tuple[str, str], list[tuple[float, str, NicRow]]] = {}
    for g in topo.guests:
        for i, nic in enumerate(g.nics):
            if nic.network in lay.nets:
                ends.setdefault((nic.network, lay.side[g.name]), []).append((lay.rows[(g.name, i)], g.name, nic))
    parts = []
    for (net_name, side), items in sorted(ends.items()):
        box = lay.nets[net_name]
        items.sort(key=lambda t: t[0])
        for k, (y1, gname, nic) in enumerate(items):
            gbox = lay.guests[gname]
            x1 = gbox.x + gbox.w if side == "L" else gbox.x
            x2 = box.x if side == "L" else box.x + box.w
            y2 = box.y + box.h * (k + 1) / (len(items) + 1)
            parts.append(_edge(x1, y1, x2, y2, gname, nic))
    return parts


def _edge(x1: float, y1: float, x2: float, y2: float, guest: str, nic: NicRow) -> str:
    dx = (x2 - x1) / 2
    color, extra = (FAILED_COLOR, ' stroke-dasharray="6 4"') if nic.down else (BAR_COLOR, "")
    cls = "link down" if nic.down else "link"
    tip = f"{guest}.{nic.name} to {nic.network}" + (" (link down)" if nic.down else "")
    return (f'<path class="{cls}"{_data(guest=guest, nic=nic.name, network=nic.network)} '
            f'd="M{_f(x1)} {_f(y1)} C{_f(x1 + dx)} {_f(y1)} {_f(x2 - dx)} {_f(y2)} {_f(x2)} {_f(y2)}" '
            f'fill="none" stroke="{color}" stroke-width="1.6"{extra}><title>{_x(tip)}</title></path>')


def _legend(topo: Topology, y: float) -> tuple[list[str], float]:
    """A one-line key to the marks that appear (none: no legend)."""
    if not topo.has_marks:
        return [], 0.0
    nics = [n for g in topo.guests for n in g.nics]
    parts, x = ['<g class="legend">'], float(MARGIN)
    if any(n.captured for n in nics) or any(n.captured for n in topo.networks):
        parts += [_badge(x, y, "pcap", ""), _text(x + BADGE_W["pcap"] + 5, y + 11, "traffic captured", fill=MUTED)]
        x += BADGE_W["pcap"] + 5 + 16 * CHAR_WIDTH + 18
    if any(n.down for n in nics):
        parts += [(f'<line x1="{_f(x)}" y1="{_f(y + 7)}" x2="{_f(x + 28)}" y2="{_f(y + 7)}" '
                   f'stroke="{FAILED_COLOR}" stroke-width="1.6" stroke-dasharray="6 4"/>'),
                  _text(x + 33, y + 11, "link down", fill=MUTED)]
        x += 33 + 9 * CHAR_WIDTH + 18
    if any(n.impairments for n in nics):
        parts += [_text(x, y + 11, "delay …", fill=WARN, extra=' font-size="11" font-weight="600"'),
                  _text(x + 56, y + 11, "impairment in force", fill=MUTED)]
        x += 56 + 19 * CHAR_WIDTH + 18
    if any(g.crashed for g in topo.guests):
        parts += [(f'<rect x="{_f(x)}" y="{_f(y)}" width="22" height="14" rx="3" fill="{BAD_BG}" '
                   f'stroke="{FAILED_COLOR}" stroke-width="2"/>'),
                  _text(x + 27, y + 11, "crashed guest", fill=MUTED)]
        x += 27 + 13 * CHAR_WIDTH + 18
    return parts + ["</g>"], x + MARGIN


def _ids(prefix: str, kind: str, names: Iterable[str]) -> dict[str, str]:
    """XML ids for names: ``prefix-kind-name`` with unsafe characters replaced, made unique."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for name in names:
        base = f"{prefix}-{kind}-{re.sub(r'[^A-Za-z0-9_-]', '_', name)}"
        ident, n = base, 2
        while ident in used:
            ident, n = f"{base}-{n}", n + 1
        used.add(ident)
        out[name] = ident
    return out


def to_svg(topo: Topology, *, standalone: bool = True, id_prefix: str = "topo") -> str:
    """The topology as an SVG picture: deterministic, no scripts, no URLs.

    ``standalone`` gives an XML document with the SVG namespace (the only
    URL); otherwise an inline ``<svg>`` element for an HTML5 page, without
    ``xmlns`` and XML declaration, like :mod:`labctl.report.charts`.
    ``id_prefix`` starts every ``id`` (use distinct ones for several
    pictures on one page).
    """
    prefix = re.sub(r"[^A-Za-z0-9_-]", "_", id_prefix) or "topo"
    if not prefix[0].isalpha():
        prefix = "t" + prefix
    lay = _layout(topo)
    legend, legend_w = _legend(topo, lay.height - MARGIN + 10)
    width = max(lay.width, legend_w)
    height = lay.height + (24 if legend else 0)
    title = f"Topology of lab {topo.name}"
    ns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    parts = ['<?xml version="1.0" encoding="UTF-8"?>'] if standalone else []
    parts += [(f'<svg{ns} class="chart topology" id="{prefix}" width="{width:.0f}" height="{height:.0f}" '
               f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{_x(title)}" '
               f'font-family="{FONT}" font-size="12">'),
              f"<title>{_x(title)}</title>",
              _text(MARGIN, MARGIN + 14, f"lab {topo.name}", extra=' font-size="14" font-weight="600"')]
    if topo.description:
        room = (width - 2 * MARGIN) / SMALL_W
        parts.append(_text(MARGIN, MARGIN + 31, _short(topo.description, room), fill=MUTED, extra=' font-size="11"'))
    parts += _edges_svg(topo, lay)
    gids = _ids(prefix, "guest", (g.name for g in topo.guests))
    nids = _ids(prefix, "net", (n.name for n in topo.networks))
    for net in topo.networks:
        parts += _net_svg(net, lay.nets[net.name], nids[net.name])
    for g in topo.guests:
        parts += _guest_svg(g, lay.guests[g.name], lay.side[g.name], gids[g.name])
    if not topo.guests and not topo.networks:
        parts.append(_text(width / 2, MARGIN + TITLE_H + 12, "no guests", anchor="middle", fill=MUTED))
    parts += legend
    parts.append("</svg>")
    return "\n".join(parts) + ("\n" if standalone else "")
