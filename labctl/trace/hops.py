"""The events labctl's follow and drops probes leave in a guest's trace (ftrace text), parsed.

A line, as ``trace`` and ``trace_pipe`` print it (the trace clock is ``mono``, in seconds)::

    ping-217 [000] b..1. 432.690021: dev_queue: (net.net_dev_queue) skb=0xffff888005fa4b00 dev="eth1"
        vi=69 tl=84 id=21400 fo=64 proto=1 saddr=16777482 daddr=16777738 l4a=1548156936 l4b=16832768
    <idle>-0 [000] ..s2. 597.478476: drop: (skb.kfree_skb) skb=0xffff888005e85b00 reason=7 proto=2048
        dev="eth1" ... loc=nft_do_chain+0x47f/0x5e0 [nf_tables]
    bash-245 [000] ..... 601.104503: tracing_mark_write: labctl-sync 27

Each probe point (:data:`POINTS`) fetches the packet's IPv4 header fields at a known place relative to
``skb->data`` (the guest's CPU reads network-order bytes as little-endian integers; :func:`identity`
turns them back). A drop carries a window of bytes around ``skb->data`` and where the network
header is, so its headers are found wherever the packet was in the stack (:func:`drop_header`).
"""

from __future__ import annotations

import ipaddress
import itertools
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import labctl.trace.encap as encap  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.pktfilter import ARP, Packet

MARKER = "labctl-sync"


@dataclass(frozen=True)
class Point:
    """A place a packet is seen: its probe's event name, the kernel function or tracepoint, what it means."""

    name: str
    where: str  # the function or tracepoint, as the path shows it
    role: str  # tx, xmit (handed to the driver), rx (first seen on receive), stack, read (by a process), drop
    title: str


POINTS: dict[str, Point] = {p.name: p for p in (
    Point("ip_out", "ip_output", "tx", "IP output"),  # labctl's first follow probes (bundles of then)
    Point("dev_queue", "net_dev_queue", "tx", "queued to the device (before the qdisc)"),
    Point("xmit", "net_dev_start_xmit", "xmit", "handed to the driver"),
    Point("netif_rx", "netif_receive_skb", "rx", "received from the driver"),
    Point("ip_fwd", "ip_forward", "stack", "forwarding"),
    Point("ip_local", "ip_local_deliver", "stack", "local delivery"),
    Point("tcp_rcv", "tcp_v4_rcv", "stack", "TCP receive"),
    Point("raw_read", "skb_copy_datagram_iovec", "read", "read by a process (raw socket)"),
    Point("sock_read", "skb_copy_datagram_iovec", "read", "read by a process (ping socket)"),
    Point("udp_read", "skb_consume_udp", "read", "read by a process (UDP socket)"),
    Point("ip6_fwd", "ip6_forward", "stack", "forwarding (IPv6)"),
    Point("ip6_local", "ip6_input", "stack", "local delivery (IPv6)"),
    Point("tcp6_rcv", "tcp_v6_rcv", "stack", "TCP receive (IPv6)"),
    Point("arp_rcv", "arp_rcv", "stack", "ARP receive"),
    Point("nft", "nft_do_chain", "stack", "an nftables chain"),
    Point("drop", "kfree_skb", "drop", "dropped"),
)}
# the IPv6 and ARP probes on a point another family's probe also has: their events are that point's
VARIANTS = {"dev_queue6": "dev_queue", "xmit6": "xmit", "netif_rx6": "netif_rx", "read6": "sock_read",
            "udp6_read": "udp_read", "dev_queue_arp": "dev_queue", "xmit_arp": "xmit", "netif_rx_arp": "netif_rx", "nft6": "nft"}
POINTS.update({p[0]: Point(*p) for p in encap.POINTS})  # tunnels: encap and decap (labctl.trace.encap)
VARIANTS.update(encap.VARIANTS)  # ... and the outer packet's points
# a packet inside an 802.1Q tag in the frame (labctl.follow.vlanprobes; its VLAN: labctl.trace.vlanhops)
VARIANTS.update({"netif_rx_q": "netif_rx", "xmit_q": "xmit", "netif_rx6_q": "netif_rx", "xmit6_q": "xmit",
                 "netif_rx_arp_q": "netif_rx", "xmit_arp_q": "xmit"})
FORWARD = ("ip_fwd", "ip6_fwd")
LOCAL = ("ip_local", "ip6_local", "tcp_rcv", "tcp6_rcv", "arp_rcv")  # taken in by the receiving guest's stack

# 6.1's enum skb_drop_reason, for kernels whose trace prints the number (a probe's u32 field) when the
# kernel's own names are not known (a bundle of before, a kernel without debug info); 6.12's differ
DROP_REASONS = (
    "", "NOT_SPECIFIED", "NO_SOCKET", "PKT_TOO_SMALL", "TCP_CSUM", "SOCKET_FILTER", "UDP_CSUM", "NETFILTER_DROP",
    "OTHERHOST", "IP_CSUM", "IP_INHDR", "IP_RPFILTER", "UNICAST_IN_L2_MULTICAST", "XFRM_POLICY", "IP_NOPROTO",
    "SOCKET_RCVBUFF", "PROTO_MEM", "TCP_MD5NOTFOUND", "TCP_MD5UNEXPECTED", "TCP_MD5FAILURE", "SOCKET_BACKLOG",
    "TCP_FLAGS", "TCP_ZEROWINDOW", "TCP_OLD_DATA", "TCP_OVERWINDOW", "TCP_OFOMERGE", "TCP_RFC7323_PAWS",
    "TCP_INVALID_SEQUENCE", "TCP_RESET", "TCP_INVALID_SYN", "TCP_CLOSE", "TCP_FASTOPEN", "TCP_OLD_ACK",
    "TCP_TOO_OLD_ACK", "TCP_ACK_UNSENT_DATA", "TCP_OFO_QUEUE_PRUNE", "TCP_OFO_DROP", "IP_OUTNOROUTES",
    "BPF_CGROUP_EGRESS", "IPV6DISABLED", "NEIGH_CREATEFAIL", "NEIGH_FAILED", "NEIGH_QUEUEFULL", "NEIGH_DEAD",
    "TC_EGRESS", "QDISC_DROP", "CPU_BACKLOG", "XDP", "TC_INGRESS", "UNHANDLED_PROTO", "SKB_CSUM", "SKB_GSO_SEG",
    "SKB_UCOPY_FAULT", "DEV_HDR", "DEV_READY", "FULL_RING", "NOMEM", "HDR_TRUNC", "TAP_FILTER", "TAP_TXFILTER",
    "ICMP_CSUM", "INVALID_PROTO", "IP_INADDRERRORS", "IP_INNOROUTES", "PKT_TOO_BIG", "TC_CHAIN_NOTFOUND",
)

_LINE = re.compile(r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[(?P<cpu>\d+)\]\s+"
                   r"(?:(?P<flags>[.\w]{4,6})\s+)?(?P<ts>\d+(?:\.\d+)?):\s+(?P<event>[\w.]+):\s?(?P<rest>.*)$")
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
WINDOW_BEFORE = 24  # a drop's window of bytes w0.. starts this far before skb->data
WINDOW_WORDS = 12  # ... and is this many 8-byte words long (9 in bundles before IPv6: w0-w8)
WINDOW_LOW = 2  # words wm1, wm2 before w0: an IPv6 header pulled (40 bytes before skb->data)


def window_words() -> list[tuple[str, int]]:
    """The drop probe's window: each word's name and offset from ``skb->data``, lowest first."""
    return ([(f"wm{i}", -WINDOW_BEFORE - 8 * i) for i in range(WINDOW_LOW, 0, -1)]
            + [(f"w{i}", 8 * i - WINDOW_BEFORE) for i in range(WINDOW_WORDS)])


@dataclass
class Event:
    """One probe hit in one guest (``ts``: the guest's trace clock, ns)."""

    guest: str
    ts: int
    point: str  # a key of POINTS, or "marker"
    comm: str
    pid: int
    cpu: int
    irq: bool  # in hard or soft interrupt context: ``comm`` is whoever was interrupted
    fields: dict[str, str] = field(default_factory=dict)
    host_ns: int | None = None  # on the host's clock, once mapped (labctl.trace.journey.Clock)

    @property
    def skb(self) -> str:
        return self.fields.get("skb", "")

    @property
    def dev(self) -> str | None:
        d = self.fields.get("dev")
        return d if d and d != "(fault)" else None

    def num(self, name: str) -> int | None:
        v = self.fields.get(name)
        if v is None:
            return None
        try:
            return int(v, 0)
        except ValueError:
            return None


def _ts_ns(text: str) -> int:
    if "." in text:
        sec, _, frac = text.partition(".")
        return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
    return int(text)


def parse_fields(rest: str) -> dict[str, str]:
    """``key=value`` pairs of a probe's line (strings unquoted; ``loc`` takes the rest of the line)."""
    out: dict[str, str] = {}
    loc = rest.find(" loc=")
    if loc >= 0:
        out["loc"] = rest[loc + 5:].strip()
        rest = rest[:loc]
    for m in _FIELD.finditer(rest):
        v = m.group(2)
        out[m.group(1)] = v[1:-1] if v.startswith('"') and v.endswith('"') else v
    return out


def parse_line(line: str, guest: str, names: dict[str, str] | None = None) -> Event | None:
    """One trace line as an event of ``guest`` (None for headers, other events and lost-event notes).

    ``names`` maps the probes' event names to points (default: the points' own names).
    """
    m = _LINE.match(line)
    if m is None:
        return None
    event, rest = m.group("event"), m.group("rest")
    if event == "tracing_mark_write":
        if not rest.strip().startswith(MARKER):
            return None
        point, fields = "marker", {"marker": rest.strip()[len(MARKER):].strip()}
    elif event == "kfree_skb":  # the tracepoint itself (a kernel without event probes)
        point, fields = "drop", _tracepoint_fields(rest)
    else:
        raw = (names or {}).get(event, event)
        point = VARIANTS.get(raw, raw)
        if point not in POINTS:
            return None
        fields = parse_fields(rest)
        encap.mark(raw, fields)  # a tunnel's: the outer packet, encap, decap (labctl.trace.encap)
    flags = m.group("flags") or ""
    return Event(guest, _ts_ns(m.group("ts")), point, m.group("comm").strip(), int(m.group("pid")),
                 int(m.group("cpu")), len(flags) >= 3 and flags[2] in "sShHzZ", fields)


def _tracepoint_fields(rest: str) -> dict[str, str]:
    """``skbaddr=0x... protocol=2048 location=0xffffffff817c0afe reason: QDISC_DROP`` as a probe's fields."""
    body, _, reason = rest.partition(" reason: ")
    raw = parse_fields(body)
    out = {"skb": raw.get("skbaddr", ""), "proto": raw.get("protocol", ""), "loc": raw.get("location", "?")}
    if reason.strip():
        out["reason"] = reason.strip()
    return out


def parse_text(text: str, guest: str, names: dict[str, str] | None = None) -> tuple[list[Event], int]:
    """Every event of a trace's text, and the events the ring buffer lost (``CPU:N [LOST M EVENTS]``)."""
    events, lost = [], 0
    for line in text.splitlines():
        ev = parse_line(line, guest, names)
        if ev is not None:
            events.append(ev)
        elif "LOST" in line and "EVENTS" in line:
            m = re.search(r"LOST (\d+) EVENTS", line)
            lost += int(m.group(1)) if m else 0
    return events, lost


def _le_bytes(value: int | None, size: int) -> bytes | None:
    if value is None:
        return None
    return (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


ICMP_NAMES = {0: "echo-reply", 8: "echo-request", 3: "unreachable", 11: "time-exceeded", 4: "source-quench",
              5: "redirect", 12: "parameter-problem"}
ICMP_UNREACH = {0: "net-unreachable", 1: "host-unreachable", 2: "protocol-unreachable", 3: "port-unreachable",
                4: "fragmentation-needed", 9: "net-prohibited", 10: "host-prohibited", 13: "admin-prohibited"}
ICMP6_NAMES = {128: "echo-request", 129: "echo-reply", 1: "unreachable", 2: "packet-too-big", 3: "time-exceeded",
               4: "parameter-problem", 133: "router-solicitation", 134: "router-advertisement",
               135: "neighbour-solicitation", 136: "neighbour-advertisement", 137: "redirect"}
ICMP6_UNREACH = {0: "no-route", 1: "admin-prohibited", 3: "address-unreachable", 4: "port-unreachable"}
ICMP_ERRORS = {4: (3, 4, 5, 11, 12), 6: (1, 2, 3, 4)}  # ICMP and ICMPv6 types that quote a packet
ECHO = {4: (1, 8, 0), 6: (58, 128, 129)}  # protocol, echo request, echo reply
ND = (133, 134, 135, 136, 137)


@dataclass(frozen=True)
class Header:
    """A packet's identity and what a path shows of it: an IPv4 or IPv6 header with the transport
    header's first 8 bytes, or an ARP message (``family`` :data:`ARP`: ``saddr``/``daddr`` the sender's
    and target's IPv4 addresses, ``proto`` the operation, ``hw`` the sender's and target's MACs)."""

    saddr: int
    daddr: int
    proto: int  # IPv4's protocol, IPv6's next header, ARP's operation
    ipid: int
    frag: int  # flags and fragment offset, as in the header
    length: int | None
    l4: bytes  # the first 8 bytes of the transport header (fewer when not fetched)
    ihl: int = 5
    family: int = 4
    ttl: int | None = None  # IPv4's TTL, IPv6's hop limit
    hw: bytes = b""

    @property
    def offset(self) -> int:
        return (self.frag & 0x1FFF) * 8 if self.family == 4 else 0

    @property
    def first_fragment(self) -> bool:
        return self.offset == 0

    @cached_property
    def icmp(self) -> int | None:
        """The ICMP (IPv4) or ICMPv6 (IPv6) type, None for any other packet."""
        if self.family in ECHO and self.proto == ECHO[self.family][0] and self.l4 and self.first_fragment:
            return self.l4[0]
        return None

    def is_error(self) -> bool:
        """An ICMP or ICMPv6 error: it quotes the packet it answers."""
        return self.icmp is not None and self.icmp in ICMP_ERRORS[self.family]

    def is_echo(self, which: int) -> bool:
        """An echo request (``which`` 1) or reply (2), ICMP or ICMPv6, with its id and sequence."""
        return self.icmp is not None and len(self.l4) >= 8 and self.icmp == ECHO[self.family][which]

    def repeats(self) -> bool:
        """Whether the same message is sent again unchanged (ARP, neighbour discovery): nothing in it tells
        one sending from the next, the time does."""
        return self.family == ARP or (self.family == 6 and self.icmp in ND)

    def ports(self) -> tuple[int, int] | None:
        if self.proto in (6, 17) and self.family != ARP and self.first_fragment and self.ihl == 5 and len(self.l4) >= 4:
            sport, dport = struct.unpack(">HH", self.l4[:4])
            return sport, dport
        return None

    def key(self) -> tuple[object, ...]:
        """What names this packet in every kernel it crosses (skb addresses change between kernels;
        the TTL and checksum change on every router). IPv4's is (saddr, daddr, proto, id, offset,
        transport); IPv6's and ARP's have their family after those."""
        return self._key

    @cached_property
    def _key(self) -> tuple[object, ...]:  # a follow asks each packet's many times (a header never changes)
        if self.family == ARP:
            return (self.saddr, self.daddr, self.proto, 0, 0, (int.from_bytes(self.hw, "big"),), ARP)
        l4: tuple[object, ...] = ()
        if self.first_fragment and self.ihl == 5 and len(self.l4) >= 8:
            if self.proto == 6:
                l4 = struct.unpack(">HHI", self.l4[:8])  # ports, sequence number
            elif self.proto == 17:
                l4 = struct.unpack(">HHHH", self.l4[:8])  # ports, length, checksum
            elif self.is_echo(1) or self.is_echo(2) or (self.family == 4 and self.proto == 1):
                l4 = (self.l4[0], *struct.unpack(">HH", self.l4[4:8]))  # type, id, sequence
            elif self.family == 6 and self.proto == 58:  # type, code, checksum (no router changes it), the rest
                l4 = (self.l4[0], self.l4[1], *struct.unpack(">HI", self.l4[2:8]))
        if self.family == 6:
            return (self.saddr, self.daddr, self.proto, 0, self.length or 0, l4, 6)
        return (self.saddr, self.daddr, self.proto, self.ipid, self.offset, l4)

    def packet(self) -> Packet:
        sport, dport = self.ports() or (None, None)
        return Packet(self.saddr, self.daddr, 0 if self.family == ARP else self.proto, sport, dport, self.family)

    def describe(self) -> str:
        """``ICMP echo-request 10.1.0.1 > 10.2.0.1 id 3 seq 1``, ``ICMPv6 echo-request fd00:1::2 >
        fd00:2::2 id 5 seq 1``, ``ARP who-has 10.1.0.99 tell 10.1.0.2`` and the like."""
        if self.family == ARP:
            return self._describe_arp()
        s, d = _ip(self.saddr, self.family), _ip(self.daddr, self.family)
        frag = f" frag@{self.offset}" if self.offset else ""
        ports = self.ports()
        kind = self.icmp
        if kind is not None and len(self.l4) >= 8:
            v6 = self.family == 6
            name = (ICMP6_NAMES if v6 else ICMP_NAMES).get(kind, f"type {kind}")
            if kind == (1 if v6 else 3):
                name = (ICMP6_UNREACH if v6 else ICMP_UNREACH).get(self.l4[1], name)
            head = f"{'ICMPv6' if v6 else 'ICMP'} {name} {s} > {d}"
            if self.is_echo(1) or self.is_echo(2):
                ident, seq = struct.unpack(">HH", self.l4[4:8])
                return f"{head} id {ident} seq {seq}{frag}"
            return head + frag
        if ports is not None:
            name = "TCP" if self.proto == 6 else "UDP"
            extra = f" seq {struct.unpack('>I', self.l4[4:8])[0]}" if self.proto == 6 and len(self.l4) >= 8 else ""
            if self.family == 6:
                return f"{name} [{s}]:{ports[0]} > [{d}]:{ports[1]}{extra}"
            return f"{name} {s}:{ports[0]} > {d}:{ports[1]}{extra}"
        name = {1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6"}.get(self.proto, f"proto {self.proto}")
        if self.family == 6:
            return f"IPv6 {name} {s} > {d}"
        return f"{name} {s} > {d} ipid {self.ipid}{frag}"

    def _describe_arp(self) -> str:
        s, d = _ip(self.saddr, 4), _ip(self.daddr, 4)
        if self.proto == 1:
            return f"ARP who-has {d} tell {s}"
        if self.proto == 2:
            mac = ":".join(f"{b:02x}" for b in self.hw[:6])
            return f"ARP reply {s} is-at {mac} to {d}"
        return f"ARP op {self.proto} {s} > {d}"


def _ip(addr: int, family: int = 4) -> str:
    if family == 6:
        return str(ipaddress.IPv6Address(addr))
    return ".".join(str(b) for b in addr.to_bytes(4, "big"))


def _le_int(ev: Event, name: str, size: int) -> int | None:
    raw = _le_bytes(ev.num(name), size)
    return None if raw is None else int.from_bytes(raw, "big")


def identity(ev: Event) -> Header | None:
    """The header a follow probe fetched (None: not an IPv4, IPv6 or ARP packet, or fields missing);
    the family from the fields the probe has (IPv6's ``s6a``, ARP's ``op``)."""
    if "op" in ev.fields:
        return _arp_identity(ev)
    if "s6a" in ev.fields:
        return _ipv6_identity(ev)
    vi = ev.num("vi")
    if vi is None or vi >> 4 != 4 or (vi & 15) < 5:
        return None
    sa, da, proto, ipid = (_le_bytes(ev.num(k), n) for k, n in (("saddr", 4), ("daddr", 4), ("proto", 1), ("id", 2)))
    if sa is None or da is None or proto is None or ipid is None:
        return None
    fo, tl = _le_bytes(ev.num("fo"), 2), _le_bytes(ev.num("tl"), 2)
    l4 = (_le_bytes(ev.num("l4a"), 4) or b"") + (_le_bytes(ev.num("l4b"), 4) or b"")
    return Header(int.from_bytes(sa, "big"), int.from_bytes(da, "big"), proto[0], int.from_bytes(ipid, "big"),
                  int.from_bytes(fo, "big") if fo else 0, int.from_bytes(tl, "big") if tl else None, l4, vi & 15,
                  ttl=ev.num("ttl"))


def _ipv6_identity(ev: Event) -> Header | None:
    vi, nxt = ev.num("vi"), ev.num("nxt")
    words = [_le_bytes(ev.num(f"{s}6{c}"), 4) for s in "sd" for c in "abcd"]
    if vi is None or vi >> 4 != 6 or nxt is None or any(w is None for w in words):
        return None
    raw = b"".join(w or b"" for w in words)
    l4 = (_le_bytes(ev.num("l4a"), 4) or b"") + (_le_bytes(ev.num("l4b"), 4) or b"")
    return Header(int.from_bytes(raw[:16], "big"), int.from_bytes(raw[16:], "big"), nxt & 0xFF, 0, 0,
                  _le_int(ev, "plen", 2), l4, 5, family=6, ttl=ev.num("hl"))


def _arp_identity(ev: Event) -> Header | None:
    op, spa, tpa = _le_int(ev, "op", 2), _le_int(ev, "spa", 4), _le_int(ev, "tpa", 4)
    parts = [_le_bytes(ev.num(n), k) for n, k in (("sha", 4), ("shb", 2), ("tha", 2), ("thb", 4))]
    if op is None or spa is None or tpa is None or any(x is None for x in parts):
        return None
    return Header(spa, tpa, op, 0, 0, None, b"", family=ARP, hw=b"".join(x or b"" for x in parts))


def parse_ipv4(data: bytes) -> Header | None:
    """An IPv4 header (and the transport header's first 8 bytes) at the start of ``data``."""
    if len(data) < 20 or data[0] >> 4 != 4 or (data[0] & 15) < 5:
        return None
    ihl = data[0] & 15
    tl, ipid, frag = struct.unpack(">HHH", data[2:8])
    return Header(int.from_bytes(data[12:16], "big"), int.from_bytes(data[16:20], "big"), data[9], ipid, frag, tl,
                  data[4 * ihl:4 * ihl + 8], ihl, ttl=data[8])


def parse_ipv6(data: bytes) -> Header | None:
    """An IPv6 header (and the next header's first 8 bytes) at the start of ``data``."""
    if len(data) < 40 or data[0] >> 4 != 6:
        return None
    plen = struct.unpack(">H", data[4:6])[0]
    return Header(int.from_bytes(data[8:24], "big"), int.from_bytes(data[24:40], "big"), data[6], 0, 0, plen,
                  data[40:48], 5, family=6, ttl=data[7])


def parse_arp(data: bytes) -> Header | None:
    """An Ethernet/IPv4 ARP message at the start of ``data``."""
    if len(data) < 28 or data[0:6] != b"\x00\x01\x08\x00\x06\x04":
        return None
    return Header(int.from_bytes(data[14:18], "big"), int.from_bytes(data[24:28], "big"),
                  struct.unpack(">H", data[6:8])[0], 0, 0, None, b"", family=ARP, hw=data[8:14] + data[18:24])


PARSERS = {0x0800: parse_ipv4, 0x86DD: parse_ipv6, 0x0806: parse_arp}


VLAN_TYPES = (0x8100, 0x88A8)  # 802.1Q's and 802.1ad's tag protocol identifiers


def _tags(data: bytes) -> tuple[int, list[int]]:
    """Where an Ethernet frame's EtherType is past its VLAN tags, and each tag's VLAN ID (outermost first)."""
    at, etype, vids = 12, int.from_bytes(data[12:14], "big") if len(data) >= 14 else 0, []
    while etype in VLAN_TYPES and len(data) >= at + 6:
        vids.append(int.from_bytes(data[at + 2:at + 4], "big") & 0xFFF)
        at += 4
        etype = int.from_bytes(data[at:at + 2], "big")
    return at, vids


def parse_frame(data: bytes) -> Header | None:
    """The IPv4, IPv6 or ARP header of an Ethernet frame (VLAN tags skipped), or None."""
    at, _ = _tags(data)
    parser = PARSERS.get(int.from_bytes(data[at:at + 2], "big"))
    return parser(data[at + 2:]) if parser else None


def frame_vlans(data: bytes) -> tuple[int, ...]:
    """The VLAN IDs an Ethernet frame's 802.1Q (and 802.1ad) tags carry, outermost first; none untagged."""
    return tuple(_tags(data)[1])


def drop_header(ev: Event) -> Header | None:
    """The IPv4, IPv6 or ARP header of a dropped skb, from the window of bytes its probe fetched around
    ``skb->data`` and where ``skb->network_header`` points (``nh``, from ``skb->head``; 65535: not set).
    The family is the tracepoint's protocol (host order)."""
    parser = PARSERS.get(ev.num("proto") or 0)
    present = [(name, at) for name, at in window_words() if name in ev.fields]
    if parser is None or not present or any(b[1] - a[1] != 8 for a, b in itertools.pairwise(present)):
        return None
    words = [ev.num(name) for name, _ in present]
    if any(w is None for w in words):
        return None
    window = b"".join((w or 0).to_bytes(8, "little") for w in words)
    before = -present[0][1]  # skb->data is this far into the window
    head, data, nh = ev.num("head"), ev.num("data"), ev.num("nh")
    candidates = []
    if head is not None and data is not None and nh is not None and nh != 0xFFFF:
        candidates.append(head + nh - data + before)
    # rx, tx (Ethernet), after IP's pull (IPv4's 20 bytes, IPv6's 40)
    candidates += [before, before + 14, before - (40 if parser is parse_ipv6 else 20)]
    for at in candidates:
        if 0 <= at < len(window):
            h = parser(window[at:])
            if h is not None:
                return h
    return None


def reason_name(ev: Event, names: Sequence[str] | None = None) -> str | None:
    """The drop's reason (``NETFILTER_DROP``...) by ``names``, its kernel's enum by value (default:
    6.1's, :data:`DROP_REASONS`); None on a kernel without reasons."""
    r = ev.fields.get("reason")
    if r is None:
        return None
    if r.isdigit():
        n, table = int(r), names or DROP_REASONS
        return table[n] if 0 < n < len(table) and table[n] else f"reason {n}"
    return r
