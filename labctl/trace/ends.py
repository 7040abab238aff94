"""How a followed packet's path ended (:class:`Ends`; the kinds are in :mod:`.journey`'s docstring): read by
a process or only a quoted copy read (:func:`quoted`), dropped and where (an ICMP error's answer to it
named, :func:`error_name`), lost on a wire, answered, consumed, left or open."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import labctl.trace.encap as encap  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.pktfilter import ARP
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
    identity,
    reason_name,
)
from labctl.trace.nfhops import dropping_rule
from labctl.trace.pathmodel import Cluster, End, Topology, Wire

ANSWER_NS = 50_000_000  # an ICMP error answers a drop of the same guest within this
ARP_REPLY_NS = 1_000_000_000  # an ARP reply answers a request sent at most this much earlier
_NO_TTL = Header(0, 0, 0, 0, 0, None, b"")


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
class Ends:
    """How a packet's path ended (see :mod:`.journey`'s docstring): the correlator's view of the lab, its echo
    replies, ICMP errors and ARP replies seen, netfilter's rules."""

    topo: Topology
    wire: Wire
    netfilter: dict[str, str]
    replies: dict[tuple[object, ...], int]
    errors: list[Cluster] = field(default_factory=list)
    arp_replies: dict[tuple[int, int], list[tuple[int, str, bytes]]] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    rulesets: dict[str, str] = field(default_factory=dict)
    rulesets_after: dict[str, str] = field(default_factory=dict)

    def end(self, c: Cluster, visits: list[list[Event]], final: bool, copies: list[Event] | None = None) -> End:
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

    def _sent_end(self, c: Cluster, tx: Event, final: bool) -> End:
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





def error_name(h: Header) -> str:
    """``time-exceeded``, ``host-unreachable``... of an ICMP or ICMPv6 error."""
    kind, code = h.l4[0], h.l4[1] if len(h.l4) > 1 else 0
    if h.family == 6:
        return ICMP6_UNREACH.get(code, "unreachable") if kind == 1 else ICMP6_NAMES.get(kind, f"ICMPv6 type {kind}")
    return ICMP_UNREACH.get(code, "unreachable") if kind == 3 else ICMP_NAMES.get(kind, f"ICMP type {kind}")


