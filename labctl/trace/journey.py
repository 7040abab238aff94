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
from collections.abc import Mapping
from dataclasses import dataclass, field

from labctl.pktfilter import ARP, Vlan
from labctl.trace.clocks import Alignment, Clock
from labctl.trace.ends import Ends, quoted
from labctl.trace.hoporder import HopOrder
from labctl.trace.hops import (
    POINTS,
    Event,
    Header,
    drop_header,
    identity,
)
from labctl.trace.nfhops import continues, ct_state, rewrite
from labctl.trace.pathmodel import Cluster, Journey, Topology, Wire
from labctl.trace.vlanhops import journey_vlans

CLUSTER_GAP_NS = 2_000_000_000  # the same identity again after this long: another packet
DROP_TIE_NS = 2_000_000_000  # a drop belongs to the last hop of its skb in the same guest within this
QUIET_NS = 500_000_000  # an end by absence (lost, consumed...) once nothing came for this long
REPEAT_NS = 500_000_000  # a message sent again unchanged (ARP, ND) is another one once this much later
NAT_TIE_NS = 1_000_000_000  # a rewritten skb is the same packet when seen again in the same guest within this


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
    clusters: dict[tuple[object, ...], list[Cluster]] = field(default_factory=dict)
    last_by_skb: dict[tuple[str, str], tuple[int, Cluster]] = field(default_factory=dict)
    replies: dict[tuple[object, ...], int] = field(default_factory=dict)  # ICMP echo replies seen (from, to, l4), host ns
    errors: list[Cluster] = field(default_factory=list)  # the ICMP errors seen (what may answer a drop)
    arp_replies: dict[tuple[int, int], list[tuple[int, str, bytes]]] = field(default_factory=dict)
    drops_seen: int = 0
    count: int = 0
    rulesets: dict[str, str] = field(default_factory=dict)
    rulesets_after: dict[str, str] = field(default_factory=dict)  # a later listing (its counters), step mode
    skb_last: dict[tuple[str, str], tuple[Event, Header]] = field(default_factory=dict)  # each skb's last event
    tracked: set[str] = field(default_factory=set)  # guests where a followed packet had a conntrack entry
    vlan: Vlan | None = None

    def __post_init__(self) -> None:
        self.path = HopOrder(self.topo, self.clocks, self.wire, self.align, self.tracked)

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

    def _cluster_of(self, ev: Event) -> Cluster | None:
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

    def _by_key(self, ev: Event, header: Header) -> Cluster:
        chain = self.clusters.setdefault(header.key(), [])
        assert ev.host_ns is not None
        if header.repeats():
            slack = 2 * max((self.path._bound(g) for g in self.clocks), default=0.0) + 1_000_000
            return _sending(chain, ev, slack) or self._new(header, ev)
        if chain and not chain[-1].done and ev.host_ns - max(e.host_ns or 0 for e in chain[-1].events) < CLUSTER_GAP_NS:
            return chain[-1]
        return self._new(header, ev)

    def _rewritten(self, ev: Event, header: Header) -> Cluster | None:
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

    def _merge(self, into: Cluster, other: Cluster, chain: list[Cluster]) -> None:
        into.events += other.events
        other.done = True
        chain.remove(other)
        for k, (ts, cl) in list(self.last_by_skb.items()):
            if cl is other:
                self.last_by_skb[k] = (ts, into)

    def _new(self, header: Header, ev: Event) -> Cluster:
        """A new packet, first seen at ``ev``; an ICMP error or an ARP reply is kept as what may answer another."""
        c = Cluster(header.key(), header)
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
        ready: list[Cluster] = []
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

    def _learn(self, clusters: list[Cluster]) -> None:
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

    def _ended(self, c: Cluster) -> bool:
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

    def _ends(self) -> Ends:
        return Ends(self.topo, self.wire, self.netfilter, self.replies, self.errors, self.arp_replies, self.reasons,
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

    def journey(self, c: Cluster, final: bool = False) -> Journey:
        events, copies = quoted(c.events)
        visits, hops = self.path.hops(c.key, events)
        end = self._ends().end(c, visits, final, copies)
        return Journey(c.header, hops, end, out_of_order=self.path.out_of_order(hops),
                       vlans=journey_vlans(events, [h.key() for h in c.headers], self.topo.vlans, self.wire.tags))


def _sending(chain: list[Cluster], ev: Event, slack: float) -> Cluster | None:
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


