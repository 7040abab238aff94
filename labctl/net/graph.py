"""A picture of a lab's topology: guests, their NICs and the networks they join.

:func:`topology` turns a resolved lab (``Lab.to_dict()``) and, for a lab that
is up, optional runtime facts into a small :class:`Topology`. Three renderers
draw it: :func:`to_svg` (self-contained, deterministic, no scripts and no
URLs, in the report's colours), :func:`to_dot` (Graphviz) and
:func:`to_mermaid` (a Mermaid flowchart). Everything here is pure: nothing
is read, run or printed.

Runtime facts (every key optional, unknown keys ignored, wrong types treated
as missing)::

    {
      "guests": {
        "a": {
          "state": "running",            # running | crashed | stopped | ...
          "host": "h1",                  # overrides the lab's host
          "nics": {
            "eth1": {
              "driver": "8139cp",        # the driver bound to the NIC
              "link": "down",            # "up" | "down" (also True/False)
              "impairments": {"delay": "20ms", "loss": "1%"},  # or one string
              "capture": True,           # traffic of this NIC is captured
            },
          },
        },
      },
      "networks": {
        "lan": {"mechanism": "switch",   # unix-dgram | switch | udp-tunnel | alone
                "capture": True},        # the whole network is captured
      },
    }

Without a runtime mechanism a network shows the one labctl plans for it
(:mod:`labctl.netplan`): two members on this machine ``unix-dgram``, three or
more ``switch``, one ``alone``, members on a remote host or on different
hosts ``udp-tunnel``. :func:`runtime_from_state` builds the runtime dict from
what ``labctl up`` records (drivers, network plan, hosts, guest states).

The SVG layout is deliberately simple: networks in a middle column, guests
stacked in columns on both sides with their NIC rows facing the networks,
guests and networks ordered by a few rounds of barycentre sorting so that
links cross little. The canvas grows with the lab.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from labctl.lab.model import DEFAULT_HOST
from labctl.report.charts import BAR_COLOR, CHAR_WIDTH, FAILED_COLOR, GRID_COLOR, INK, MUTED

__all__ = [
    "GuestNode",
    "NetworkNode",
    "NicRow",
    "Topology",
    "runtime_from_state",
    "to_dot",
    "to_mermaid",
    "to_svg",
    "topology",
]

# mechanisms, as labctl.netplan names them
DIRECT = "unix-dgram"
SWITCH = "switch"
UDP = "udp-tunnel"
ALONE = "alone"
MECHANISM_TEXT = {
    DIRECT: "direct link (unix-dgram)",
    SWITCH: "labctl L2 switch",
    UDP: "UDP tunnel",
    ALONE: "alone (no peer)",
}
# impairments in this order first, any others after them by name
IMPAIRMENT_ORDER = ("delay", "jitter", "loss", "duplicate", "corrupt", "reorder", "rate", "limit")

# colours beyond those of labctl.report.charts (the report's CSS variables)
CARD = "#ffffff"
HEAD = "#eef2f7"
LINE = "#d9dee6"
BAD_BG = "#fdecea"
GOOD = "#17803d"
WARN = "#8a5a00"
FONT = "system-ui, sans-serif"


# --------------------------------------------------------------------------- model

@dataclass(frozen=True)
class NicRow:
    """One lab NIC as drawn: the lab's facts plus what runtime knows of it.

    ``link`` is ``"up"``, ``"down"`` or None (unknown); ``impairments`` are
    ``(name, value)`` pairs in display order (value ``""`` for a bare flag).
    """

    name: str
    model: str
    network: str
    ip: str | None = None
    mac: str | None = None
    mtu: int | None = None
    queues: int = 1
    driver: str | None = None
    link: str | None = None
    impairments: tuple[tuple[str, str], ...] = ()
    captured: bool = False

    @property
    def down(self) -> bool:
        """True when the link is known to be down."""
        return self.link == "down"

    @property
    def impairment_text(self) -> str:
        """The impairments in force as short text, e.g. ``delay 20ms · loss 1%`` ('' when none)."""
        return " · ".join(f"{k} {v}" if v else k for k, v in self.impairments)

    @property
    def address_text(self) -> str:
        """Address, MTU and queue count as one short line."""
        parts = [self.ip or "no address"]
        if self.mtu is not None:
            parts.append(f"mtu {self.mtu}")
        if self.queues > 1:
            parts.append(f"{self.queues} queues")
        return " · ".join(parts)


@dataclass(frozen=True)
class GuestNode:
    """One guest: resources, host, runtime state and its NIC rows in lab order."""

    name: str
    nics: tuple[NicRow, ...]
    memory: int | None = None
    cpus: int | None = None
    host: str | None = None
    state: str | None = None

    @property
    def crashed(self) -> bool:
        """True when runtime says the guest crashed."""
        return self.state == "crashed"

    @property
    def info_text(self) -> str:
        """Host and resources as one short line."""
        parts = [f"host {self.host}"] if self.host else []
        if self.memory is not None:
            parts.append(f"{self.memory} MiB")
        if self.cpus is not None:
            parts.append(f"{self.cpus} CPU" + ("s" if self.cpus != 1 else ""))
        return " · ".join(parts)


@dataclass(frozen=True)
class NetworkNode:
    """One lab network and the ``(guest, nic)`` members attached to it."""

    name: str
    members: tuple[tuple[str, str], ...]
    mtu: int | None = None
    description: str = ""
    mechanism: str | None = None
    captured: bool = False

    @property
    def mechanism_text(self) -> str:
        """The mechanism in words ('' when unknown)."""
        if not self.mechanism:
            return ""
        return MECHANISM_TEXT.get(self.mechanism, self.mechanism)


@dataclass(frozen=True)
class Topology:
    """A lab's guests and networks, in lab order."""

    name: str
    guests: tuple[GuestNode, ...]
    networks: tuple[NetworkNode, ...]
    description: str = ""

    def guest(self, name: str) -> GuestNode:
        """The guest called ``name``; raises KeyError if there is none."""
        for g in self.guests:
            if g.name == name:
                return g
        raise KeyError(name)

    def network(self, name: str) -> NetworkNode:
        """The network called ``name``; raises KeyError if there is none."""
        for n in self.networks:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def has_marks(self) -> bool:
        """True when any runtime mark (capture, impairment, link down, crash) is drawn."""
        nics = [n for g in self.guests for n in g.nics]
        return (any(g.crashed for g in self.guests) or any(n.captured for n in self.networks)
                or any(n.captured or n.impairments or n.down for n in nics))


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _str(value: object) -> str | None:
    return str(value) if isinstance(value, str | int | float) and not isinstance(value, bool) and str(value) else None


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _flag(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("1", "yes", "true", "on"))


def _link(value: object) -> str | None:
    if isinstance(value, bool):
        return "up" if value else "down"
    if isinstance(value, str) and value.lower() in ("up", "down"):
        return value.lower()
    return None


def _impairments(value: object) -> tuple[tuple[str, str], ...]:
    """Impairments as ordered ``(name, value)`` pairs; a string is kept as one entry."""
    if isinstance(value, str):
        return ((value, ""),) if value.strip() else ()
    pairs = []
    for key, val in _map(value).items():
        if val is None or val is False or val == "":
            continue
        pairs.append((str(key), "" if val is True else str(val)))

    def rank(pair: tuple[str, str]) -> tuple[int, str]:
        name = pair[0]
        return (IMPAIRMENT_ORDER.index(name), "") if name in IMPAIRMENT_ORDER else (len(IMPAIRMENT_ORDER), name)

    return tuple(sorted(pairs, key=rank))


def _nic_row(nic: Mapping[str, Any], facts: Mapping[str, Any]) -> NicRow:
    return NicRow(
        name=_str(nic.get("name")) or "?",
        model=_str(nic.get("model")) or "?",
        network=_str(nic.get("network")) or "?",
        ip=_str(nic.get("ip")),
        mac=_str(nic.get("mac")),
        mtu=_int(nic.get("mtu")),
        queues=_int(nic.get("queues")) or 1,
        driver=_str(facts.get("driver")),
        link=_link(facts.get("link")),
        impairments=_impairments(facts.get("impairments")),
        captured=_flag(facts.get("capture", facts.get("captured"))),
    )


def _guest_node(name: str, guest: Mapping[str, Any], facts: Mapping[str, Any], show_host: bool) -> GuestNode:
    """A guest; its lab host is shown only when the lab places guests on hosts (runtime's always)."""
    nic_facts = _map(facts.get("nics"))
    nics = [n for n in guest.get("nics") or () if isinstance(n, Mapping)]
    rows = tuple(_nic_row(n, _map(nic_facts.get(str(n.get("name"))))) for n in nics)
    return GuestNode(name=name, nics=rows, memory=_int(guest.get("memory")), cpus=_int(guest.get("cpus")),
                     host=_str(facts.get("host")) or (_str(guest.get("host")) if show_host else None),
                     state=_str(facts.get("state")))


def _host_is_remote(uri: object) -> bool:
    from labctl.lab.uri import parse_uri

    try:
        return isinstance(uri, str) and parse_uri(uri).remote
    except ValueError:
        return False


def planned_mechanism(members: Sequence[tuple[str, str]], guest_hosts: Mapping[str, str | None],
                      host_uris: Mapping[str, str]) -> str | None:
    """The mechanism labctl plans for a network with ``members`` (None: labctl would refuse it).

    ``guest_hosts`` maps guests to their lab host names (None: the default
    host); ``host_uris`` are the lab's hosts. A host the lab does not define
    is taken to be this machine.
    """
    if len(members) < 2:
        return ALONE
    uris = {host_uris.get(h or "", f"local:{h}") for h in (guest_hosts.get(g) for g, _ in members)}
    if len(uris) > 1 or any(_host_is_remote(u) for u in uris):
        return UDP if len(members) == 2 else None
    return DIRECT if len(members) == 2 else SWITCH


def _members(name: str, net: Mapping[str, Any], guests: Sequence[GuestNode]) -> tuple[tuple[str, str], ...]:
    listed = net.get("members")
    if isinstance(listed, Sequence) and not isinstance(listed, str):
        pairs = [tuple(m) for m in listed if isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 2]
        return tuple((str(g), str(n)) for g, n in pairs)
    return tuple((g.name, nic.name) for g in guests for nic in g.nics if nic.network == name)


def topology(lab: Mapping[str, Any] | Any, runtime: Mapping[str, Any] | None = None) -> Topology:
    """The topology of ``lab`` (``Lab.to_dict()``, or a Lab), with ``runtime`` facts if given.

    Guests show their host only when the lab uses hosts (or runtime names
    one). Tolerates missing keys in both. A network a NIC names but the lab does
    not define is added after the lab's networks.
    """
    data: Mapping[str, Any] = lab.to_dict() if hasattr(lab, "to_dict") else _map(lab)
    rt = _map(runtime)
    rt_guests, rt_nets = _map(rt.get("guests")), _map(rt.get("networks"))
    lab_guests = _map(data.get("guests"))
    lab_hosts = {str(k): _str(_map(v).get("host")) for k, v in lab_guests.items()}
    host_uris = {str(k): str(_map(v).get("uri", "")) for k, v in _map(data.get("hosts")).items()}
    shown = bool(host_uris) or any(h not in (None, DEFAULT_HOST) for h in lab_hosts.values())
    guests = tuple(_guest_node(str(name), _map(g), _map(rt_guests.get(str(name))), shown)
                   for name, g in lab_guests.items())
    nets = {str(k): _map(v) for k, v in _map(data.get("networks")).items()}
    for g in guests:
        for nic in g.nics:
            nets.setdefault(nic.network, {})
    networks = []
    for name, net in nets.items():
        members = _members(name, net, guests)
        facts = _map(rt_nets.get(name))
        mechanism = _str(facts.get("mechanism")) or planned_mechanism(members, lab_hosts, host_uris)
        networks.append(NetworkNode(name=name, members=members, mtu=_int(net.get("mtu")),
                                    description=_str(net.get("description")) or "", mechanism=mechanism,
                                    captured=_flag(facts.get("capture", facts.get("captured")))))
    return Topology(name=_str(data.get("name")) or "lab", guests=guests, networks=tuple(networks),
                    description=_str(data.get("description")) or "")


def runtime_from_state(drivers: Mapping[str, Mapping[str, str]] | None = None,
                       networks: Mapping[str, Mapping[str, Any]] | None = None,
                       hosts: Mapping[str, Mapping[str, Any]] | None = None,
                       states: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The runtime dict from what ``labctl up`` records.

    :param drivers: ``LabState.drivers`` (guest -> NIC -> driver; '' = unknown).
    :param networks: ``LabState.networks`` (network -> ``Segment.to_dict()``; its ``mechanism``).
    :param hosts: ``LabState.hosts`` (guest -> host dict with a ``name``).
    :param states: guest -> state (e.g. from ``GuestStatus.state``).
    """
    guests: dict[str, dict[str, Any]] = {}
    for guest, nics in _map(drivers).items():
        entry = guests.setdefault(str(guest), {"nics": {}})
        for nic, driver in _map(nics).items():
            if driver:
                entry["nics"][str(nic)] = {"driver": str(driver)}
    for guest, host in _map(hosts).items():
        if _str(_map(host).get("name")):
            guests.setdefault(str(guest), {"nics": {}})["host"] = str(_map(host)["name"])
    for guest, state in _map(states).items():
        if state:
            guests.setdefault(str(guest), {"nics": {}})["state"] = str(state)
    nets = {str(n): {"mechanism": str(_map(seg)["mechanism"])}
            for n, seg in _map(networks).items() if _str(_map(seg).get("mechanism"))}
    return {"guests": guests, "networks": nets}


# --------------------------------------------------------------------------- SVG layout

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

_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _x(text: object) -> str:
    """``text`` escaped for XML text and attribute values (characters XML forbids dropped)."""
    return escape(_XML_BAD.sub("", str(text)), quote=True)


def _short(text: str, chars: float) -> str:
    limit = max(int(chars), 2)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    return ROW_H + (IMPAIR_H if nic.impairments else 0)


def _guest_h(guest: GuestNode) -> float:
    return HEAD_H + (sum(_nic_h(n) for n in guest.nics) if guest.nics else ROW_H) + 4


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
                   len(nic.address_text) * SMALL_W + 28, len(nic.impairment_text) * SMALL_W + 28)
    return min(max(need, GUEST_MIN_W), GUEST_MAX_W)


def _net_lines(net: NetworkNode) -> list[str]:
    lines = [t for t in (net.mechanism_text, f"mtu {net.mtu}" if net.mtu is not None else "") if t]
    return lines + ([net.description] if net.description else [])


def _net_w(net: NetworkNode) -> float:
    need = len(net.name) * BOLD_W + (BADGE_W["pcap"] + 8 if net.captured else 0) + 24
    need = max([need] + [len(t) * SMALL_W + 24 for t in _net_lines(net)])
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
    text_h = 30 + 14 * len(_net_lines(net))
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
    if nic.impairments:
        parts.append(_text(box.x + 10, y + 43, _short(nic.impairment_text, room), fill=WARN,
                           extra=' class="impair" font-size="11" font-weight="600"'))
    px = box.x + box.w if facing == "L" else box.x
    color = FAILED_COLOR if nic.down else BAR_COLOR
    parts.append(f'<circle cx="{_f(px)}" cy="{_f(y + ROW_H / 2)}" r="3.5" fill="{color}"/>')
    return parts + ["</g>"]


def _guest_svg(guest: GuestNode, box: _Box, facing: str, gid: str) -> list[str]:
    stroke = FAILED_COLOR if guest.crashed else BAR_COLOR
    head = BAD_BG if guest.crashed else HEAD
    x, y, w, h, r = box.x, box.y, box.w, box.h, 6.0
    tip = f"guest {guest.name}" + (f" ({guest.info_text})" if guest.info_text else "") + (
        f", {guest.state}" if guest.state else "")
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
    dash = ' stroke-dasharray="5 3"' if guest.state == "stopped" else ""
    parts.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(w)}" height="{_f(h)}" rx="{r:g}" fill="none" '
                 f'stroke="{stroke}" stroke-width="{2 if guest.crashed else 1.2}"{dash}/>')
    return parts + ["</g>"]


def _net_svg(net: NetworkNode, box: _Box, nid: str) -> list[str]:
    x, y, w, h = box.x, box.y, box.w, box.h
    lines = _net_lines(net)
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


# --------------------------------------------------------------------------- Graphviz

def _dot_str(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + _XML_BAD.sub("", text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _h(text: str) -> str:
    """Text for a DOT HTML-like label."""
    return _x(text)


def _dot_guest(guest: GuestNode) -> str:
    color = FAILED_COLOR if guest.crashed else BAR_COLOR
    head = f"<B>{_h(guest.name)}</B>"
    sub = " · ".join(t for t in (guest.info_text, guest.state or "") if t)
    if sub:
        head += f'<BR/><FONT POINT-SIZE="9" COLOR="{MUTED}">{_h(sub)}</FONT>'
    rows = [f'<TR><TD ALIGN="LEFT" BGCOLOR="{BAD_BG if guest.crashed else HEAD}">{head}</TD></TR>']
    for i, nic in enumerate(guest.nics):
        line1 = f"<B>{_h(nic.name)}</B> {_h(nic.model)}"
        if nic.driver:
            line1 += f' <FONT COLOR="{BAR_COLOR}">· {_h(nic.driver)}</FONT>'
        marks = [m for m, on in (("pcap", nic.captured), ("link down", nic.down)) if on]
        if marks:
            line1 += f' <FONT COLOR="{FAILED_COLOR if nic.down else BAR_COLOR}">[{_h(", ".join(marks))}]</FONT>'
        cell = f'{line1}<BR ALIGN="LEFT"/><FONT COLOR="{MUTED}">{_h(nic.address_text)}</FONT><BR ALIGN="LEFT"/>'
        if nic.impairments:
            cell += f'<FONT COLOR="{WARN}">{_h(nic.impairment_text)}</FONT><BR ALIGN="LEFT"/>'
        rows.append(f'<TR><TD PORT="p{i}" ALIGN="LEFT" BALIGN="LEFT">{cell}</TD></TR>')
    table = (f'<TABLE BORDER="{2 if guest.crashed else 1}" CELLBORDER="0" CELLSPACING="0" CELLPADDING="4" '
             f'COLOR="{color}">' + "".join(rows) + "</TABLE>")
    return f"  {_dot_str('guest:' + guest.name)} [shape=plain, label=<{table}>];"


def _dot_net(net: NetworkNode) -> str:
    label = f"<B>{_h(net.name)}</B>" + (' <FONT COLOR="#3b6ea8">[pcap]</FONT>' if net.captured else "")
    for line in _net_lines(net):
        label += f'<BR/><FONT POINT-SIZE="9" COLOR="{MUTED}">{_h(line)}</FONT>'
    return (f"  {_dot_str('net:' + net.name)} [shape=box, style=\"rounded,filled\", fillcolor=\"{HEAD}\", "
            f'color="{BAR_COLOR}", label=<{label}>];')


def to_dot(topo: Topology) -> str:
    """The topology as a Graphviz ``graph``: one HTML-like table node per guest (a port per NIC),
    one node per network, one edge per NIC. Render with ``dot -Tsvg``."""
    out = [f"graph {_dot_str(topo.name)} {{",
           (f'  graph [rankdir=LR, nodesep=0.3, ranksep=1.2, fontname="{FONT}", fontsize=12, labelloc=t, '
            f"label=<<B>lab {_h(topo.name)}</B>>];"),
           f'  node [fontname="{FONT}", fontsize=11, fontcolor="{INK}"];',
           f'  edge [color="{BAR_COLOR}", penwidth=1.4, fontname="{FONT}", fontsize=10];']
    out += [_dot_guest(g) for g in topo.guests]
    out += [_dot_net(n) for n in topo.networks]
    for g in topo.guests:
        for i, nic in enumerate(g.nics):
            attrs = []
            if nic.down:
                attrs += ["style=dashed", f'color="{FAILED_COLOR}"']
            if nic.impairments:
                attrs.append(f'label=<<FONT COLOR="{WARN}">{_h(nic.impairment_text)}</FONT>>')
            tail = f"{_dot_str('guest:' + g.name)}:p{i}:e"
            edge = f"  {tail} -- {_dot_str('net:' + nic.network)}"
            out.append(edge + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    out.append("}")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- Mermaid

_MERMAID_ENTITIES = {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "&": "#amp;", "|": "#124;",
                     "`": "#96;", "\n": " ", "\r": " "}


def _m(text: str) -> str:
    """Text for a quoted Mermaid label: special characters as Mermaid entity codes."""
    return "".join(_MERMAID_ENTITIES.get(c, c) for c in _XML_BAD.sub("", text))


def to_mermaid(topo: Topology) -> str:
    """The topology as a Mermaid ``flowchart LR``: a subgraph per guest holding a node per NIC,
    a node per network, a link per NIC (dashed and red when down, labelled with impairments)."""
    out = ["flowchart LR"]
    net_ids = {n.name: f"net{i}" for i, n in enumerate(topo.networks)}
    links: list[tuple[str, str, NicRow]] = []
    styles: list[str] = []
    for gi, g in enumerate(topo.guests):
        gid = f"g{gi}"
        head = " · ".join(t for t in (g.name, g.info_text, g.state or "") if t)
        out.append(f'  subgraph {gid}["{_m(head)}"]')
        for ni, nic in enumerate(g.nics):
            line1 = " ".join(t for t in (nic.name, nic.model, nic.driver and f"· {nic.driver}",
                                         "[pcap]" if nic.captured else "", "[link down]" if nic.down else "") if t)
            out.append(f'    {gid}n{ni}["{_m(line1)}<br/>{_m(nic.address_text)}"]')
            links.append((f"{gid}n{ni}", nic.network, nic))
        if not g.nics:
            out.append(f'    {gid}none["{_m("no lab NICs")}"]')
        out.append("  end")
        if g.crashed:
            styles.append(f"  style {gid} fill:{BAD_BG},stroke:{FAILED_COLOR},stroke-width:2px")
    for n in topo.networks:
        label = _m(n.name + (" [pcap]" if n.captured else "")) + "".join(f"<br/>{_m(t)}" for t in _net_lines(n))
        out.append(f'  {net_ids[n.name]}(["{label}"])')
    for k, (src, net, nic) in enumerate(links):
        label = f'|"{_m(nic.impairment_text)}"|' if nic.impairments else ""
        arrow = "-.-" if nic.down else "---"
        out.append(f"  {src} {arrow}{label} {net_ids.get(net, 'net_missing')}")
        if nic.down:
            styles.append(f"  linkStyle {k} stroke:{FAILED_COLOR},stroke-width:2px")
    return "\n".join(out + styles) + "\n"
