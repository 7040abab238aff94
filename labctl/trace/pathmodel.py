"""A followed packet's path as data: where each followed NIC is (:class:`Topology`), the frames QEMU saw
on the wire (:class:`Wire`), each hop, the end and the whole journey (:class:`Hop`, :class:`End`,
:class:`Journey`, with their ``journey.json`` records), the events the correlator took for one packet
(:class:`Cluster`), and the packets grouped by path with their figures (:func:`paths`, :func:`totals`).
Made by :mod:`.journey`; pure data, no correlation here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from labctl.trace.hops import (
    Event,
    Header,
)


@dataclass
class Topology:
    """Where each followed NIC is: ``nets[(guest, nic)]`` = network; ``impair[(guest, nic)]`` = the netem
    settings labctl put in force on its egress (``{"loss": "10%", ...}``); the followed guests;
    ``ifaces[(guest, dev)]``: what a lab interface is to another (``port of br0``, ``member of bond0
    (active-backup)``, ``VLAN 10 on eth1``), said at each hop on it; ``vlans[(guest, dev)]``: a VLAN
    device's ID (:mod:`.vlanhops`)."""

    nets: dict[tuple[str, str], str] = field(default_factory=dict)
    impair: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    guests: tuple[str, ...] = ()
    ifaces: dict[tuple[str, str], str] = field(default_factory=dict)
    vlans: dict[tuple[str, str], int] = field(default_factory=dict)

    def peers(self, guest: str, nic: str) -> list[tuple[str, str]]:
        """The followed NICs on the same network as ``guest.nic``."""
        net = self.nets.get((guest, nic))
        return [k for k, n in self.nets.items() if n == net and k != (guest, nic) and k[0] in self.guests]

    def impairment(self, guest: str, nic: str | None) -> str | None:
        imp = self.impair.get((guest, nic or ""))
        if not imp:
            return None
        return "netem " + " ".join(f"{k} {v}" for k, v in imp.items())


@dataclass
class Wire:
    """Frames QEMU saw on the host side of each NIC: ``seen[(guest, nic)][key]`` = host ns of each;
    ``tags[(guest, nic)][key]``: the VLAN IDs of their 802.1Q tags (untagged frames: none)."""

    seen: dict[tuple[str, str], dict[tuple[object, ...], list[int]]] = field(default_factory=dict)
    captured: set[tuple[str, str]] = field(default_factory=set)
    tags: dict[tuple[str, str], dict[tuple[object, ...], set[int]]] = field(default_factory=dict)

    def at(self, nic: tuple[str, str], key: tuple[object, ...]) -> int | None:
        times = self.seen.get(nic, {}).get(key)
        return times[0] if times else None


class HopRecord(TypedDict):
    """A hop of a packet in ``journey.json`` (:meth:`Hop.as_dict`)."""

    guest: str
    point: str
    where: str
    dev: str | None
    t_us: float  # since the packet's first hop
    delta_us: float | None  # since the previous hop (None: the first)
    task: NotRequired[str]  # "comm (pid)", unless on the wire or in an IRQ
    note: NotRequired[str]


class EndRecord(TypedDict):
    """How a packet ended (:meth:`End.as_dict`)."""

    kind: str
    guest: str
    text: str
    where: NotRequired[str]
    reason: NotRequired[str]


class JourneyRecord(TypedDict):
    """One packet of ``journey.json`` (:meth:`Journey.as_dict`)."""

    id: int
    packet: str
    start_ns: int
    duration_us: float
    hops: list[HopRecord]
    end: EndRecord
    out_of_order: int
    vlans: NotRequired[list[int]]


class Percentiles(TypedDict):
    """Latency percentiles and max in µs (:func:`paths`)."""

    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float


class PathHop(TypedDict):
    """A hop of a path (:func:`paths`): where it is and, after the first, its delta's percentiles."""

    guest: str
    where: str
    dev: str | None
    point: str
    note: NotRequired[str]  # the example packet's
    p50_us: NotRequired[float]
    p90_us: NotRequired[float]
    p99_us: NotRequired[float]
    max_us: NotRequired[float]


class PathRecord(TypedDict):
    """Packets that took one path, with the same end (:func:`paths`)."""

    count: int
    end: EndRecord
    hops: list[PathHop]
    total: Percentiles | dict[str, float]  # first hop to last ({}: no hops)
    example: str  # the first packet
    packets: list[int]  # the first 20 packets' ids


@dataclass
class Hop:
    guest: str
    point: str  # a key of hops.POINTS, or "wire"
    where: str
    dev: str | None
    t: int  # host ns
    comm: str = ""
    pid: int = 0
    irq: bool = False
    note: str = ""
    skb: str = ""

    def as_dict(self, t0: int, prev: int | None) -> HopRecord:
        d: HopRecord = {"guest": self.guest, "point": self.point, "where": self.where, "dev": self.dev,
                             "t_us": round((self.t - t0) / 1000, 1),
                             "delta_us": None if prev is None else round((self.t - prev) / 1000, 1)}
        if self.point != "wire" and not self.irq:
            d["task"] = f"{self.comm} ({self.pid})"
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class End:
    kind: str  # delivered, dropped, lost, answered, consumed, left, open
    guest: str
    text: str
    where: str | None = None
    reason: str | None = None

    def as_dict(self) -> EndRecord:
        out: EndRecord = {"kind": self.kind, "guest": self.guest, "text": self.text}
        if self.where is not None:
            out["where"] = self.where
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass
class Journey:
    header: Header
    hops: list[Hop]
    end: End
    out_of_order: int = 0
    id: int = 0
    vlans: tuple[int, ...] = ()  # the 802.1Q VLANs it travelled on (:mod:`.vlanhops`)

    @property
    def start(self) -> int:
        return self.hops[0].t if self.hops else 0

    def signature(self) -> tuple[object, ...]:
        return (tuple((h.guest, h.where, h.dev) for h in self.hops), self.end.kind, self.end.guest,
                self.end.where, self.end.reason)

    def as_dict(self) -> JourneyRecord:
        t0 = self.start
        hops: list[HopRecord] = []
        prev = None
        for h in self.hops:
            hops.append(h.as_dict(t0, prev))
            prev = h.t
        out: JourneyRecord = {"id": self.id, "packet": self.header.describe(), "start_ns": t0,
                              "duration_us": round((self.hops[-1].t - t0) / 1000, 1) if self.hops else 0.0,
                              "hops": hops, "end": self.end.as_dict(), "out_of_order": self.out_of_order}
        if self.vlans:
            out["vlans"] = list(self.vlans)
        return out


@dataclass
class Cluster:
    key: tuple[object, ...]
    header: Header
    events: list[Event] = field(default_factory=list)
    done: bool = False
    rewritten: list[Header] = field(default_factory=list)  # what NAT made of it, in order (:mod:`.nfhops`)

    @property
    def headers(self) -> list[Header]:
        return [self.header, *self.rewritten]



def _pcts(values: list[float]) -> Percentiles:
    s = sorted(values)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 1)

    return {"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "max_us": round(s[-1], 1)}


END_ORDER = ("dropped", "lost", "unanswered", "open", "consumed", "left", "answered", "delivered")



def paths(journeys: list[Journey]) -> list[PathRecord]:
    """Packets grouped by path (the same hops, the same end): count and each hop's delta percentiles;
    dropped and lost ones first, then by count."""
    groups: dict[tuple[object, ...], list[Journey]] = {}
    for j in journeys:
        groups.setdefault(j.signature(), []).append(j)
    out: list[PathRecord] = []
    for group in groups.values():
        first = group[0]
        hops: list[PathHop] = []
        for i, h in enumerate(first.hops):
            deltas = [(j.hops[i].t - j.hops[i - 1].t) / 1000 for j in group if i]
            hop: PathHop = {"guest": h.guest, "where": h.where, "dev": h.dev, "point": h.point}
            if h.note and h.point != "wire":
                hop["note"] = h.note  # the example's
            if deltas:
                pcts = _pcts(deltas)
                hop["p50_us"], hop["p90_us"], hop["p99_us"] = pcts["p50_us"], pcts["p90_us"], pcts["p99_us"]
                hop["max_us"] = pcts["max_us"]
            hops.append(hop)
        total = [(j.hops[-1].t - j.hops[0].t) / 1000 for j in group if j.hops]
        out.append({"count": len(group), "end": first.end.as_dict(), "hops": hops,
                    "total": _pcts(total) if total else {}, "example": first.header.describe(),
                    "packets": [j.id for j in group[:20]]})
    rank = {k: i for i, k in enumerate(END_ORDER)}
    return sorted(out, key=lambda p: (rank.get(p["end"]["kind"], 9), -p["count"]))


class Totals(TypedDict):
    """How a step's followed packets ended (:func:`totals`)."""

    packets: int
    by_end: dict[str, int]  # end kind -> packets
    out_of_order_hops: int
    packets_out_of_order: int
    nat_rewritten: int
    dropped_by_rule: NotRequired[dict[str, int]]  # "GUEST: nft rule" -> packets it dropped


def totals(journeys: list[Journey]) -> Totals:
    by_end: dict[str, int] = {}
    for j in journeys:
        by_end[j.end.kind] = by_end.get(j.end.kind, 0) + 1
    rules: dict[str, int] = {}
    for j in journeys:
        if j.end.kind == "dropped" and j.end.text.startswith(f"dropped on {j.end.guest} by nft "):
            rule = j.end.text.removeprefix(f"dropped on {j.end.guest} by ").rsplit(" (NETFILTER_DROP", 1)[0]
            rules[f"{j.end.guest}: {rule}"] = rules.get(f"{j.end.guest}: {rule}", 0) + 1
    out: Totals = {"packets": len(journeys), "by_end": by_end,
                   "out_of_order_hops": sum(j.out_of_order for j in journeys),
                   "packets_out_of_order": sum(1 for j in journeys if j.out_of_order),
                   "nat_rewritten": sum(1 for j in journeys if any("NAT " in h.note for h in j.hops))}
    if rules:
        out["dropped_by_rule"] = rules
    return out
