"""One followed packet's events as hops in the order the wire carried it (:class:`HopOrder`): the guests'
visits chained by the wire, each event at its mapped and aligned time, the wire hops between them and
the hops counted out of order (see :mod:`.journey`'s docstring)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import labctl.trace.encap as encap  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.trace.clocks import Alignment, Clock
from labctl.trace.hops import (
    POINTS,
    Event,
    identity,
)
from labctl.trace.nfhops import chain_name, ct_state
from labctl.trace.pathmodel import Hop, Topology, Wire
from labctl.trace.vlanhops import hop_note, wire_note


@dataclass
class HopOrder:
    """One packet's events as hops (:meth:`.journey.Correlator.journey`): the guests' visits in the order the wire
    carried it, each event a hop at its mapped and aligned time, the wire hops between, the causal
    order within the clocks' bounds (see :mod:`.journey`'s docstring). Shares the correlator's view of the
    lab, its clocks and their alignment, the guests whose packets had a conntrack entry."""

    topo: Topology
    clocks: dict[str, Clock]
    wire: Wire
    align: Alignment
    tracked: set[str]
    _bounds: dict[str, float] = field(default_factory=dict)  # each guest's bound at the journey being made

    def hops(self, key: tuple[object, ...], events: list[Event]) -> tuple[list[list[Event]], list[Hop]]:
        """A packet's visits (its events per guest, the guests in the order the wire carried it) and its
        hops: each event's (a drop's only when nothing else saw the packet), a wire hop between visits."""
        visits = self._visits(events)
        hops: list[Hop] = []
        only_drop = all(e.point == "drop" for e in events)  # dropped before any follow point saw it
        t = min((e.host_ns or 0 for e in events), default=0)  # the alignment around the packet's time
        self._bounds = {g: self._bound(g, t) for g in {e.guest for e in events}}  # a packet takes milliseconds
        for i, visit in enumerate(visits):
            here = [self._hop(e, t) for e in visit if e.point != "drop" or only_drop]
            if i and hops:
                wire = self._wire(key, visits[i - 1], visit, t)
                self._causal(hops[-1], wire, here)
                hops.append(wire)
            hops += here
        return visits, hops

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

    def out_of_order(self, hops: list[Hop]) -> int:
        bad = 0
        for prev, hop in itertools.pairwise(hops):
            if hop.t < prev.t - (self._bounds.get(prev.guest, 0.0) + self._bounds.get(hop.guest, 0.0)):
                bad += 1
        return bad

