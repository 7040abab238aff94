"""Packets followed through every kernel and wire of a lab: events of several guests → one path each.

Inputs (pure data): each followed guest's probe events (:mod:`.hops`), each guest's clock samples
(:class:`Clock`), the lab's topology and impairments (:class:`Topology`) and, optionally, the
frames QEMU saw on the host side of each NIC (:class:`Wire`).

* **Clocks.** Each guest's trace clock is mapped onto the host's ``CLOCK_MONOTONIC`` from marker round
  trips, within a proven bound, then aligned within that bound by the packets that cross the wire
  both ways (:mod:`.clocks`).
* **Identity.** A packet is named by what no kernel changes on the way: addresses, protocol, IP
  id, fragment offset, ICMP type/id/sequence or ports (and TCP's sequence number)
  (:meth:`.hops.Header.key`); skb addresses only tie a drop to the packet within one guest.
* **Order.** Hops within one guest are in that guest's clock order. Guests are chained by the
  wire: the visit that handed the packet to a driver on a NIC comes before the visit that received
  it on a NIC of the same network, whatever the clocks say; a hop shown earlier than the one
  before it by more than both guests' bounds together is counted ``out_of_order``.
* **Ends** (:class:`End`): ``delivered`` (read by a process: a copy read counts, as a raw
  socket's clone of a ping reply), ``dropped`` (kfree_skb: where and why; netfilter's rule when
  counters said it), ``lost`` (left a NIC and never reached the next followed guest, or netem's
  loss of labctl's impairment in the sender's qdisc), ``answered`` (an ICMP echo request the
  kernel answered), ``consumed`` (delivered to the kernel, no reader seen), ``left`` (sent out of
  the followed part of the lab), ``open`` (the trace ended first).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import labctl.trace.encap as encap  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.pktfilter import ARP, Vlan
from labctl.trace.clocks import Alignment, Clock
from labctl.trace.hops import (
    ECHO,
    FORWARD,
    ICMP6_NAMES,
    ICMP6_UNREACH,
    ICMP_NAMES,
    ICMP_UNREACH,
    LOCAL,
    ND,
    POINTS,
    Event,
    Header,
    drop_header,
    identity,
    reason_name,
)
from labctl.trace.nfhops import chain_name, continues, ct_state, dropping_rule, rewrite
from labctl.trace.vlanhops import hop_note, journey_vlans, wire_note

CLUSTER_GAP_NS = 2_000_000_000  # the same identity again after this long: another packet
DROP_TIE_NS = 2_000_000_000  # a drop belongs to the last hop of its skb in the same guest within this
QUIET_NS = 500_000_000  # an end by absence (lost, consumed...) once nothing came for this long
REPEAT_NS = 500_000_000  # a message sent again unchanged (ARP, ND) is another one once this much later
ANSWER_NS = 50_000_000  # an ICMP error answers a drop of the same guest within this
ARP_REPLY_NS = 1_000_000_000  # an ARP reply answers a request sent at most this much earlier
NAT_TIE_NS = 1_000_000_000  # a rewritten skb is the same packet when seen again in the same guest within this
_NO_TTL = Header(0, 0, 0, 0, 0, None, b"")


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
class _Cluster:
    key: tuple[object, ...]
    header: Header
    events: list[Event] = field(default_factory=list)
    done: bool = False
    rewritten: list[Header] = field(default_factory=list)  # what NAT made of it, in order (:mod:`.nfhops`)

    @property
    def headers(self) -> list[Header]:
        return [self.header, *self.rewritten]


@dataclass
class Correlator:
    """Events in (any order across guests), journeys out (:meth:`settle`). ``clocks`` map each guest's
    trace clock; ``netfilter`` names the rules that dropped (guest -> text, from counters); ``reasons``:
    each guest's drop reasons by number (6.1's where not given); ``rulesets``: each guest's ``nft -a list
    ruleset`` when the follow started (which rule of a chain dropped, :func:`.nfhops.dropping_rule`);
    ``vlan``: the filter's ``vlan [ID]``, the only journeys :meth:`settle` hands over are on it."""

    topo: Topology
    clocks: dict[str, Clock]
    wire: Wire = field(default_factory=Wire)
    netfilter: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)  # guest -> its kernel's drop reasons by number
    align: Alignment = field(default_factory=Alignment)
    clusters: dict[tuple[object, ...], list[_Cluster]] = field(default_factory=dict)
    last_by_skb: dict[tuple[str, str], tuple[int, _Cluster]] = field(default_factory=dict)
    replies: dict[tuple[object, ...], int] = field(default_factory=dict)  # ICMP echo replies seen (from, to, l4), host ns
    errors: list[_Cluster] = field(default_factory=list)  # the ICMP errors seen (what may answer a drop)
    arp_replies: dict[tuple[int, int], list[tuple[int, str, bytes]]] = field(default_factory=dict)
    drops_seen: int = 0
    count: int = 0
    rulesets: dict[str, str] = field(default_factory=dict)
    rulesets_after: dict[str, str] = field(default_factory=dict)  # a later listing (its counters), step mode
    skb_last: dict[tuple[str, str], tuple[Event, Header]] = field(default_factory=dict)  # each skb's last event
    tracked: set[str] = field(default_factory=set)  # guests where a followed packet had a conntrack entry
    vlan: Vlan | None = None

    def __post_init__(self) -> None:
        self.path = _Hops(self.topo, self.clocks, self.wire, self.align, self.tracked)

    def add(self, ev: Event) -> None:
        """One event of a followed guest."""
        if ev.point == "marker":
            return
        clock = self.clocks.get(ev.guest)
        ev.host_ns = clock.host(ev.ts) if clock else ev.ts
        cluster = self._cluster_of(ev)
        if cluster is None:
            return
        cluster.events.append(ev)
        if ev.point != "drop" and ev.skb:
            self.last_by_skb[(ev.guest, ev.skb)] = (ev.ts, cluster)

    def _cluster_of(self, ev: Event) -> _Cluster | None:
        if ev.point == "drop":
            self.drops_seen += 1
            tie = self.last_by_skb.get((ev.guest, ev.skb))
            if tie is not None and 0 <= ev.ts - tie[0] <= DROP_TIE_NS and not tie[1].done:
                return tie[1]
            # a tunnel's outer packet: its inner header (labctl.follow.tunnelprobes' DROP_POINTS); else the window's
            header = identity(ev) if "outer" in ev.fields else drop_header(ev)
            if header is None:
                return None
            found = self.clusters.get(header.key())
            if found and not found[-1].done:
                return found[-1]
            # a packet dropped before any follow point saw it (queued for a neighbour that never answered)
            return self._new(header, ev)
        header = identity(ev)
        if header is None:
            return None
        key = header.key()
        if header.is_echo(2):
            self.replies[(key[0], key[1], key[5])] = ev.host_ns or 0  # what answered() looks up
        if ev.num("ct"):
            self.tracked.add(ev.guest)
        cluster = self._rewritten(ev, header) or self._by_key(ev, header)
        if ev.skb:
            self.skb_last[(ev.guest, ev.skb)] = (ev, header)
        return cluster

    def _by_key(self, ev: Event, header: Header) -> _Cluster:
        chain = self.clusters.setdefault(header.key(), [])
        assert ev.host_ns is not None
        if header.repeats():
            slack = 2 * max((self.path._bound(g) for g in self.clocks), default=0.0) + 1_000_000
            return _sending(chain, ev, slack) or self._new(header, ev)
        if chain and not chain[-1].done and ev.host_ns - max(e.host_ns or 0 for e in chain[-1].events) < CLUSTER_GAP_NS:
            return chain[-1]
        return self._new(header, ev)

    def _rewritten(self, ev: Event, header: Header) -> _Cluster | None:
        """The packet ``ev`` is when NAT rewrote its skb since its last event in this guest
        (:func:`.nfhops.continues`): the hop notes the rewrite, the packet is known by its new name too,
        and what was already seen by that name (another guest's stream may come first) is merged in."""
        tie = self.last_by_skb.get((ev.guest, ev.skb)) if ev.skb else None
        prev = self.skb_last.get((ev.guest, ev.skb)) if ev.skb else None
        if tie is None or prev is None or tie[1].done or not 0 <= ev.ts - tie[0] <= NAT_TIE_NS:
            return None
        old = prev[1]
        if not continues(prev[0], ev, old, header):
            return None
        c = tie[1]
        reply = "reply" in f"{ct_state(ev)} {ct_state(prev[0])}"
        ev.fields["nat"] = rewrite(old, header, reply)
        c.rewritten.append(header)
        chain = self.clusters.setdefault(header.key(), [])
        for other in [o for o in chain if not o.done and o is not c]:
            if abs(min(e.host_ns or 0 for e in other.events) - (ev.host_ns or 0)) < CLUSTER_GAP_NS:
                self._merge(c, other, chain)
        if c not in chain:
            chain.append(c)
        return c

    def _merge(self, into: _Cluster, other: _Cluster, chain: list[_Cluster]) -> None:
        into.events += other.events
        other.done = True
        chain.remove(other)
        for k, (ts, cl) in list(self.last_by_skb.items()):
            if cl is other:
                self.last_by_skb[k] = (ts, into)

    def _new(self, header: Header, ev: Event) -> _Cluster:
        """A new packet, first seen at ``ev``; an ICMP error or an ARP reply is kept as what may answer another."""
        c = _Cluster(header.key(), header)
        self.clusters.setdefault(c.key, []).append(c)
        if header.is_error():
            self.errors.append(c)
        elif header.family == ARP and header.proto == 2:
            self.arp_replies.setdefault((header.saddr, header.daddr), []).append((ev.host_ns or 0, ev.guest, header.hw))
        return c

    def settle(self, marks: Mapping[str, int] | None = None, quiet_ns: int = QUIET_NS) -> list[Journey]:
        """Journeys that ended (``marks`` None: the trace is over, every journey ends now).

        ``marks``: how far each followed guest's stream has come, on the host clock (its latest event or
        heartbeat); a packet is judged only once every guest in ``marks`` is past its last hop by the
        clocks' bounds (a slower stream may still bring hops of it), and then at once when its end is
        known (read by a process, an echo request answered), else after ``quiet_ns`` more.
        """
        if marks is None:
            horizon = None
        else:
            slack = max((self.path._bound(g) for g in marks), default=0.0)
            horizon = min(marks.values(), default=0) - 2 * slack
        ready: list[_Cluster] = []
        seen: set[int] = set()  # a packet NAT rewrote is in the chains of each of its names
        for chain in self.clusters.values():
            for c in chain:
                if c.done or id(c) in seen:
                    continue
                seen.add(id(c))
                if horizon is not None:
                    last = max(e.host_ns or 0 for e in c.events)
                    if horizon < last or (not self._ended(c) and horizon - last < quiet_ns):
                        continue
                ready.append(c)
        for c in ready:  # mapped again: a clock round since its events came maps them better
            for e in c.events:
                clock = self.clocks.get(e.guest)
                if clock is not None and clock.known:
                    e.host_ns = clock.host(e.ts)
        self._learn(ready)
        out = []
        for c in ready:
            c.done = True
            if all(POINTS[e.point].role == "read" for e in c.events):
                # Not a packet: skb_copy_datagram_iovec is also a TCP socket's copy, at its payload, where the
                # reader probe's header is any bytes (sshd's stream passed the kernel filter's version byte
                # and protocol once in a test run). A real packet has a hop before its read.
                continue
            j = self.journey(c, final=horizon is None)
            if self.vlan is not None and not self.vlan.passes(j.vlans):
                continue
            self.count += 1
            j.id = self.count
            out.append(j)
        out.sort(key=lambda j: j.start)
        self._forget()
        return out

    def _learn(self, clusters: list[_Cluster]) -> None:
        """The clocks' alignment (:class:`labctl.trace.clocks.Alignment`) from these packets' wire crossings."""
        for c in clusters:
            visits = self.path._visits(c.events)
            for a, b in itertools.pairwise(visits):
                tx = next((e for e in reversed(a) if e.point == "xmit"), None)
                rx = next((e for e in b if e.point == "netif_rx"), None)
                if tx is not None and rx is not None and tx.host_ns is not None and rx.host_ns is not None:
                    self.align.learn(tx.guest, rx.guest, rx.host_ns - tx.host_ns, tx.host_ns)
        latest = max((e.host_ns or 0 for c in clusters for e in c.events), default=0)
        self.align.solve({g: self.path._bound(g, latest) for g in self.clocks})

    def _ended(self, c: _Cluster) -> bool:
        """Whether the packet's end is already known: a process read it (not a copy an ICMP error quoted),
        it is an echo request whose reply left, or an ARP request answered."""
        events, _ = quoted(c.events)
        if any(POINTS[e.point].role == "read" for e in events):
            return True
        h = c.header
        ends = self._ends()
        if h.family == ARP:
            return h.proto == 1 and ends.arp_reply(h, min(e.host_ns or 0 for e in events)) is not None
        last = max(events, key=lambda e: e.host_ns or 0)  # the last hop on the host's clock, not a guest's
        return (h.is_echo(1) and last.point in ("ip_local", "ip6_local")
                and any(ends.answered(x) for x in c.headers))

    def _ends(self) -> _Ends:
        return _Ends(self.topo, self.wire, self.netfilter, self.replies, self.errors, self.arp_replies, self.reasons,
                     self.rulesets, self.rulesets_after)

    def _forget(self) -> None:
        """Drop settled clusters (a live follow runs for hours)."""
        for key in [k for k, chain in self.clusters.items() if all(c.done for c in chain)]:
            del self.clusters[key]
        self.last_by_skb = {k: v for k, v in self.last_by_skb.items() if not v[1].done}
        self.skb_last = {k: v for k, v in self.skb_last.items() if k in self.last_by_skb}
        if self.replies:
            newest = max(self.replies.values())
            self.replies = {k: t for k, t in self.replies.items() if newest - t < 4 * CLUSTER_GAP_NS}
        if len(self.errors) > 1000:
            self.errors = [c for c in self.errors[-500:] if not c.done]
        for k, seen in list(self.arp_replies.items()):
            if len(seen) > 50:
                self.arp_replies[k] = seen[-20:]

    # ------------------------------------------------------------------ one journey

    def journey(self, c: _Cluster, final: bool = False) -> Journey:
        events, copies = quoted(c.events)
        p = self.path
        visits = p._visits(events)
        hops: list[Hop] = []
        only_drop = all(e.point == "drop" for e in events)  # dropped before any follow point saw it
        t = min((e.host_ns or 0 for e in events), default=0)  # the alignment around the packet's time
        p._bounds = {g: p._bound(g, t) for g in {e.guest for e in events}}  # a packet takes milliseconds
        for i, visit in enumerate(visits):
            here = [p._hop(e, t) for e in visit if e.point != "drop" or only_drop]
            if i and hops:
                wire = p._wire(c.key, visits[i - 1], visit, t)
                p._causal(hops[-1], wire, here)
                hops.append(wire)
            hops += here
        end = self._ends().end(c, visits, final, copies)
        j = Journey(c.header, hops, end)
        j.out_of_order = p._out_of_order(hops)
        j.vlans = journey_vlans(events, [h.key() for h in c.headers], self.topo.vlans, self.wire.tags)
        return j



@dataclass
class _Hops:
    """One packet's events as hops (:meth:`Correlator.journey`): the guests' visits in the order the wire
    carried it, each event a hop at its mapped and aligned time, the wire hops between, the causal
    order within the clocks' bounds (see the module docstring). Shares the correlator's view of the
    lab, its clocks and their alignment, the guests whose packets had a conntrack entry."""

    topo: Topology
    clocks: dict[str, Clock]
    wire: Wire
    align: Alignment
    tracked: set[str]
    _bounds: dict[str, float] = field(default_factory=dict)  # each guest's bound at the journey being made

    def _visits(self, events: list[Event]) -> list[list[Event]]:
        """The events per guest (in its clock's order), the guests in the order the wire carried the packet."""
        by_guest: dict[str, list[Event]] = {}
        for e in sorted(events, key=lambda e: e.ts):
            by_guest.setdefault(e.guest, []).append(e)
        pending = sorted(by_guest.values(), key=lambda v: v[0].host_ns or 0)
        if not pending:
            return []
        # the origin: a visit that does not start by receiving, else the earliest
        origin = next((v for v in pending if v[0].point != "netif_rx"), pending[0])
        order = [origin]
        pending.remove(origin)
        while pending:
            nxt = self._next_visit(order[-1], pending) or pending[0]
            order.append(nxt)
            pending.remove(nxt)
        return order

    def _next_visit(self, visit: list[Event], pending: list[list[Event]]) -> list[Event] | None:
        out = [(visit[0].guest, e.dev) for e in visit if e.point == "xmit" and e.dev]
        for v in pending:
            rx = next((e for e in v if e.point == "netif_rx" and e.dev), None)
            if rx is not None and any((rx.guest, rx.dev) in self.topo.peers(g, d) for g, d in out if d):
                return v
        return None

    def _hop(self, e: Event, t: int | None = None) -> Hop:
        p = POINTS[e.point]
        note = ""
        if e.point == "drop":  # a tunnel's outer packet's: its outer header in the note
            return Hop(e.guest, e.point, (e.fields.get("loc") or p.where).split("+")[0], e.dev,
                       (e.host_ns or 0) + round(self.align.at(e.guest, t)), e.comm, e.pid, e.irq, encap.note(e.point, e.fields),
                       e.skb)
        if e.point == "xmit":
            imp = self.topo.impairment(e.guest, e.dev)
            note = f"after the qdisc ({imp}, labctl's impairment)" if imp else ""
        notes = [encap.noted(note, e.point, e.fields),  # a tunnel's outer header (labctl.trace.encap)
                 self.topo.ifaces.get((e.guest, e.dev or ""), ""), hop_note(e), e.fields.get("nat", "")]
        state = ct_state(e)
        if state == "none":
            state = "invalid (no entry)" if e.guest in self.tracked and e.point != "nft" else None
        if state:
            notes.append(f"conntrack {state}")
        where = chain_name(e) if e.point == "nft" else encap.where(e.point, e.fields) or p.where
        assert e.host_ns is not None
        return Hop(e.guest, e.point, where, e.dev, e.host_ns + round(self.align.at(e.guest, t)), e.comm, e.pid, e.irq,
                   "; ".join(n for n in notes if n), e.skb)

    def _wire(self, key: tuple[object, ...], a: list[Event], b: list[Event], at: int | None = None) -> Hop:
        tx = next((e for e in reversed(a) if e.point == "xmit" and e.dev), None)
        rx = next((e for e in b if e.point == "netif_rx" and e.dev), None)
        sent = identity(tx) if tx is not None else None
        key = sent.key() if sent is not None else key  # its name on this wire (NAT may have renamed it)
        src = (a[0].guest, tx.dev) if tx and tx.dev else None
        dst = (b[0].guest, rx.dev) if rx and rx.dev else None
        name = f"{'.'.join(src) if src else a[0].guest} → {'.'.join(dst) if dst else b[0].guest}"
        notes = []
        looked = [n for n in (src, dst) if n is not None and n in self.wire.captured]
        if looked:
            seen = [n for n in looked if self.wire.at(n, key) is not None]
            if len(seen) == len(looked):
                notes.append("seen on the host side" + (" at both ends" if len(seen) == 2 else f" of {'.'.join(seen[0])}"))
            else:
                missing = [".".join(n) for n in looked if n not in seen]
                notes.append(f"not seen on the host side of {', '.join(missing)}")
            notes.append(wire_note(looked, key, self.wire.tags))
        imp = self.topo.impairment(*src) if src else None
        if imp:
            notes.append(f"{imp} in force on {'.'.join(src) if src else ''}")
        t = ((rx.host_ns if rx and rx.host_ns is not None else b[0].host_ns) or 0) + round(self.align.at(b[0].guest, at))
        return Hop(a[0].guest, "wire", name, None, t, note="; ".join(n for n in notes if n))

    def _causal(self, last: Hop, wire: Hop, here: list[Hop]) -> None:
        """The next guest's hops shown after the last one of the previous guest: moved later by at most
        both clocks' bounds together (the clocks cannot tell which came first within them); beyond
        that they stay as measured and count as out of order. The wire hop sits at the receiver's
        first hop: its delta is the time on the wire."""
        first = here[0].t if here else wire.t
        gap = last.t - first
        guest = here[0].guest if here else wire.guest
        if 0 < gap <= self._bounds.get(last.guest, 0.0) + self._bounds.get(guest, 0.0):
            for h in here:
                h.t += gap
            wire.note = "; ".join(x for x in (wire.note, (f"{guest}'s hops shown {gap / 1000:.0f} µs later, "
                                              "within the clocks' bounds")) if x)
        wire.t = here[0].t if here else max(wire.t, last.t)

    def _bound(self, guest: str, at: int | None = None) -> float:
        """How well ``guest``'s mapped clock is known (at host time ``at``: past its last round, less)."""
        c = self.clocks.get(guest)
        if not c or not c.known:
            return 0.0
        return c.bound_ns if at is None else c.bound_at(at)

    def _out_of_order(self, hops: list[Hop]) -> int:
        bad = 0
        for prev, hop in itertools.pairwise(hops):
            if hop.t < prev.t - (self._bounds.get(prev.guest, 0.0) + self._bounds.get(hop.guest, 0.0)):
                bad += 1
        return bad

def _sending(chain: list[_Cluster], ev: Event, slack: float) -> _Cluster | None:
    """Which sending of a message sent again unchanged ``ev`` belongs to: the latest one that started
    before it (within ``slack``, the clocks' bounds), less than :data:`REPEAT_NS` earlier, not yet seen
    at this point of this guest."""
    assert ev.host_ns is not None
    for c in reversed(chain):
        start = min(e.host_ns or 0 for e in c.events)
        if c.done or start > ev.host_ns + slack or ev.host_ns - start >= REPEAT_NS:
            continue
        if not any((e.guest, e.point, e.dev) == (ev.guest, ev.point, ev.dev) for e in c.events):
            return c
    return None


def quoted(events: list[Event]) -> tuple[list[Event], list[Event]]:
    """A packet's events without the copies an ICMP error quoted, and those copies. A process that reads
    its error queue (ping's ``IP_RECVERR``) reads the packet the error quotes, header and all: that read
    is the answer coming back, not the packet's delivery. A read is a delivery when the last hop before
    it in the same guest took the packet in (received, or handed to the local stack); after a send (or
    with only its drop before it there), it is a quoted copy."""
    kept: list[Event] = []
    copies: list[Event] = []
    last: dict[str, Event] = {}
    dropped: set[str] = set()  # guests where it was dropped before any other hop (never sent, never received)
    for e in sorted(events, key=lambda e: e.ts):
        if POINTS[e.point].role == "read":
            before = last.get(e.guest)
            if (before.point in ("dev_queue", "xmit") if before else e.guest in dropped):
                copies.append(e)
                continue
        elif e.point == "drop":
            dropped.add(e.guest)
        else:
            last[e.guest] = e
        kept.append(e)
    return kept, copies


def _handled_error(drop: Event, visit: list[Event]) -> bool:
    """An ICMP or ICMPv6 error freed once it reached the local stack, the kernel's way to end an error it
    passed to the socket of the packet it quotes: 6.1's icmpv6_rcv frees every error with kfree_skb
    (NOT_SPECIFIED), and a socket closed with the error still in its error queue frees it in
    inet_sock_destruct (ping reads the error's copy, not the queue's end)."""
    fn = (drop.fields.get("loc") or "").split("+")[0]
    return (fn in ("icmp_rcv", "icmpv6_rcv", "inet_sock_destruct")
            and any(e.point in ("ip_local", "ip6_local") for e in visit))


@dataclass
class _Ends:
    """How a packet's path ended (see the module docstring): the correlator's view of the lab, its echo
    replies, ICMP errors and ARP replies seen, netfilter's rules."""

    topo: Topology
    wire: Wire
    netfilter: dict[str, str]
    replies: dict[tuple[object, ...], int]
    errors: list[_Cluster] = field(default_factory=list)
    arp_replies: dict[tuple[int, int], list[tuple[int, str, bytes]]] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    rulesets: dict[str, str] = field(default_factory=dict)
    rulesets_after: dict[str, str] = field(default_factory=dict)

    def end(self, c: _Cluster, visits: list[list[Event]], final: bool, copies: list[Event] | None = None) -> End:
        events = [e for v in visits for e in v]
        read = next((e for e in events if POINTS[e.point].role == "read"), None)
        if read is not None:
            return End("delivered", read.guest, f"delivered to {read.comm} (pid {read.pid}) on {read.guest}",
                       where=POINTS[read.point].where)
        if not visits:
            return End("open", "", "no hop")
        last = visits[-1]
        guest = last[0].guest
        h = c.header
        drop = next((e for e in reversed(last) if e.point == "drop"), None)
        if drop is not None and (h.is_error() or (h.family == 6 and h.icmp in ND)) and _handled_error(drop, last):
            drop = None  # ICMPv6 frees an error it handed to the socket, or an ND message ndisc took, with kfree_skb
        if drop is not None:
            end = self._drop_end(drop, last)
            if "outer" in drop.fields:  # a tunnel's outer packet was dropped (labctl.follow.tunnelprobes' DROP_POINTS)
                end.text += f" (its outer packet, {encap.note(drop.point, drop.fields).removeprefix('outer ')})"
            if end.kind == "dropped" and not h.is_error():  # no error is sent about an error
                end.text += self._answer(h, drop, last, visits[0][0].guest, copies or [])
            return end
        if h.family == ARP and h.proto == 1:
            return self._arp_end(h, visits)
        tail = next((e for e in reversed(last) if e.point not in ("drop", "nft")), last[-1])  # a chain is on the way
        if tail.point == "drop":
            return self._drop_end(tail, last)
        if tail.point == "xmit":
            return self._sent_end(c, tail, final)
        if tail.point in LOCAL:
            v6 = h.family == 6
            if h.is_echo(1) and any(self.answered(x) for x in c.headers):
                return End("answered", guest, f"answered by {guest}'s kernel (ICMP{'v6' if v6 else ''} echo reply sent)",
                           where="icmpv6_rcv" if v6 else "icmp_rcv")
            what = {"tcp_rcv": "TCP (tcp_v4_rcv)", "tcp6_rcv": "TCP (tcp_v6_rcv)", "arp_rcv": "ARP (arp_rcv)",
                    "ip6_local": "the kernel (ip6_input)"}.get(tail.point, "the kernel (ip_local_deliver)")
            if h.is_error() and tail.point in ("ip_local", "ip6_local"):
                return End("consumed", guest, f"delivered to {what} on {guest}: an ICMP{'v6' if v6 else ''} error, "
                           "for the socket that sent the packet it quotes (its error queue)", where=POINTS[tail.point].where)
            return End("consumed", guest, f"delivered to {what} on {guest}; no process read it while followed",
                       where=POINTS[tail.point].where)
        seen = encap.where(tail.point, tail.fields) or POINTS[tail.point].where
        return End("open", guest, f"last seen at {seen} on {guest}" + (" when the trace ended" if final else ""),
                   where=seen)

    def answered(self, h: Header) -> bool:
        """An echo reply to ``h`` (an echo request) was seen: the same id and sequence, the other way."""
        l4 = (ECHO[h.family][2], *struct.unpack(">HH", h.l4[4:8]))
        return (h.daddr, h.saddr, l4) in self.replies

    def arp_reply(self, h: Header, start: int) -> tuple[int, str, bytes] | None:
        """The ARP reply to the request ``h`` sent at ``start`` (host ns): from its target, to its sender."""
        return next((r for r in self.arp_replies.get((h.daddr, h.saddr), [])
                     if 0 <= r[0] - start <= ARP_REPLY_NS), None)

    def _arp_end(self, h: Header, visits: list[list[Event]]) -> End:
        start = min(e.host_ns or 0 for v in visits for e in v)
        target = h.describe().split()[2]
        reply = self.arp_reply(h, start)
        if reply is not None:
            mac = ":".join(f"{b:02x}" for b in reply[2][:6])
            return End("answered", reply[1], f"answered by {reply[1]} ({target} is-at {mac})", where="arp_rcv")
        took = [v[0].guest for v in visits[1:] if any(e.point == "arp_rcv" for e in v)]
        heard = [v[0].guest for v in visits[1:]]
        who = f"{', '.join(took or heard)} {'took it in' if took else 'received it'}" if heard else "no followed guest received it"
        return End("unanswered", (took or heard or [visits[0][0].guest])[-1],
                   f"unanswered: nobody has {target} ({who}, none replied)", where="arp_rcv" if took else None)

    def _answer(self, h: Header, drop: Event, visit: list[Event], origin: str, copies: list[Event]) -> str:
        """``; time-exceeded sent to a``: the ICMP error the dropping guest sent back to the packet's source
        (seen as a packet of its own, or as the copy its reader got), or ""."""
        before = [e.ts for e in visit if e.point != "drop" and e.ts <= drop.ts]
        lo = before[-1] if before else drop.ts - ANSWER_NS
        for err in self.errors:  # its events on the dropping guest: sent from there (in any stream order)
            if (err.header.family == h.family and err.header.daddr == h.saddr
                    and any(e.guest == drop.guest and lo <= e.ts <= drop.ts + ANSWER_NS for e in err.events)):
                return f"; {error_name(err.header)} sent to {origin}"
        if copies:
            r = copies[0]
            return f"; an ICMP error quoting it reached {r.comm} (pid {r.pid}) on {r.guest}"
        return ""

    def _drop_end(self, drop: Event, visit: list[Event]) -> End:
        reason = reason_name(drop, self.reasons.get(drop.guest))
        loc = drop.fields.get("loc") or "?"
        guest = drop.guest
        before = next((e for e in reversed(visit) if e.point != "drop" and e.ts <= drop.ts), None)
        dev = before.dev if before else drop.dev
        imp = self.topo.impair.get((guest, dev or ""), {})
        if reason == "QDISC_DROP" and imp.get("loss"):
            peers = self.topo.peers(guest, dev or "")
            to = ", ".join(".".join(p) for p in peers) or "its network"
            return End("lost", guest, f"lost on the wire {guest}.{dev} → {to}: netem loss {imp['loss']} "
                       f"(labctl's impairment of {guest}.{dev}), dropped in {guest}'s qdisc at {loc}",
                       where=loc, reason=reason)
        if before is not None and before.point in FORWARD and (identity(before) or _NO_TTL).ttl in (0, 1):
            fn = POINTS[before.point].where
            what = "hop limit exceeded" if before.point == "ip6_fwd" else "TTL exceeded"
            return End("dropped", guest, f"dropped on {guest} at {fn}: {what}", where=fn, reason=reason)
        nft = next((e for e in reversed(visit) if e.point == "nft" and e.ts <= drop.ts
                    and e.skb == drop.skb), None) if reason == "NETFILTER_DROP" else None
        if nft is not None:  # the last chain it entered dropped it
            by = dropping_rule(nft, self.rulesets.get(guest, ""), self.rulesets_after.get(guest, ""))
            return End("dropped", guest, f"dropped on {guest} by {by} ({reason} at {loc})", where=loc, reason=reason)
        text = f"dropped on {guest} at {loc}" + (f" for {reason}" if reason else "")
        rule = self.netfilter.get(guest) if reason == "NETFILTER_DROP" else None
        if rule:
            text += f" by {rule}"
        return End("dropped", guest, text, where=loc, reason=reason)

    def _sent_end(self, c: _Cluster, tx: Event, final: bool) -> End:
        peers = self.topo.peers(tx.guest, tx.dev or "")
        nic = f"{tx.guest}.{tx.dev}"
        if not peers:
            return End("left", tx.guest, f"sent out of {nic} (no followed guest on its network)", where=nic)
        to = ", ".join(".".join(p) for p in peers)
        key = (identity(tx) or c.header).key()  # its name on this wire (NAT may have renamed it)
        seen = [p for p in peers if p in self.wire.captured and self.wire.at(p, key) is not None]
        left = (tx.guest, tx.dev or "") in self.wire.captured and self.wire.at((tx.guest, tx.dev or ""), key)
        if seen:
            how = f"reached {', '.join('.'.join(p) for p in seen)}'s NIC on the host side, never its driver"
        elif left:
            how = "seen leaving on the host side, never reaching the other end"
        else:
            how = "not seen on the host side"
        imp = self.topo.impairment(tx.guest, tx.dev)
        return End("lost", tx.guest, f"lost on the wire {nic} → {to} ({how})" + (f"; {imp} in force" if imp else ""),
                   where=nic)



# ---------------------------------------------------------------------- paths, figures


def _pcts(values: list[float]) -> Percentiles:
    s = sorted(values)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 1)

    return {"p50_us": at(0.5), "p90_us": at(0.9), "p99_us": at(0.99), "max_us": round(s[-1], 1)}


END_ORDER = ("dropped", "lost", "unanswered", "open", "consumed", "left", "answered", "delivered")


def error_name(h: Header) -> str:
    """``time-exceeded``, ``host-unreachable``... of an ICMP or ICMPv6 error."""
    kind, code = h.l4[0], h.l4[1] if len(h.l4) > 1 else 0
    if h.family == 6:
        return ICMP6_UNREACH.get(code, "unreachable") if kind == 1 else ICMP6_NAMES.get(kind, f"ICMPv6 type {kind}")
    return ICMP_UNREACH.get(code, "unreachable") if kind == 3 else ICMP_NAMES.get(kind, f"ICMP type {kind}")


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
