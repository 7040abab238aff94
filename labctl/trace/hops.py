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

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from labctl.pktfilter import Packet

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
    Point("drop", "kfree_skb", "drop", "dropped"),
)}

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
WINDOW_BEFORE = 24  # a drop's window of bytes starts this far before skb->data
WINDOW_WORDS = 9  # ... and is this many 8-byte words long


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
        point = (names or {}).get(event, event)
        if point not in POINTS:
            return None
        fields = parse_fields(rest)
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


@dataclass(frozen=True)
class Header:
    """An IPv4 packet's identity and what a path shows of it."""

    saddr: int
    daddr: int
    proto: int
    ipid: int
    frag: int  # flags and fragment offset, as in the header
    length: int | None
    l4: bytes  # the first 8 bytes of the transport header (fewer when not fetched)
    ihl: int = 5

    @property
    def offset(self) -> int:
        return (self.frag & 0x1FFF) * 8

    @property
    def first_fragment(self) -> bool:
        return self.offset == 0

    def ports(self) -> tuple[int, int] | None:
        if self.proto in (6, 17) and self.first_fragment and self.ihl == 5 and len(self.l4) >= 4:
            sport, dport = struct.unpack(">HH", self.l4[:4])
            return sport, dport
        return None

    def key(self) -> tuple[object, ...]:
        """What names this packet in every kernel it crosses (skb addresses change between kernels;
        the TTL and checksum change on every router)."""
        l4: tuple[object, ...] = ()
        if self.first_fragment and self.ihl == 5 and len(self.l4) >= 8:
            if self.proto == 6:
                l4 = struct.unpack(">HHI", self.l4[:8])  # ports, sequence number
            elif self.proto == 17:
                l4 = struct.unpack(">HHHH", self.l4[:8])  # ports, length, checksum
            elif self.proto == 1:
                l4 = (self.l4[0], *struct.unpack(">HH", self.l4[4:8]))  # type, id, sequence
        return (self.saddr, self.daddr, self.proto, self.ipid, self.offset, l4)

    def packet(self) -> Packet:
        ports = self.ports()
        return Packet(self.saddr, self.daddr, self.proto, *(ports or (None, None)))

    def describe(self) -> str:
        """``ICMP echo-request 10.1.0.1 > 10.2.0.1 id 3 seq 1`` and the like."""
        s, d = _ip(self.saddr), _ip(self.daddr)
        frag = f" frag@{self.offset}" if self.offset else ""
        ports = self.ports()
        if self.proto == 1 and len(self.l4) >= 8 and self.first_fragment:
            kind = {0: "echo-reply", 8: "echo-request", 3: "unreachable", 11: "time-exceeded"}.get(
                self.l4[0], f"type {self.l4[0]}")
            ident, seq = struct.unpack(">HH", self.l4[4:8])
            return f"ICMP {kind} {s} > {d} id {ident} seq {seq}{frag}"
        if ports is not None:
            name = "TCP" if self.proto == 6 else "UDP"
            extra = f" seq {struct.unpack('>I', self.l4[4:8])[0]}" if self.proto == 6 and len(self.l4) >= 8 else ""
            return f"{name} {s}:{ports[0]} > {d}:{ports[1]}{extra}"
        name = {1: "ICMP", 6: "TCP", 17: "UDP"}.get(self.proto, f"proto {self.proto}")
        return f"{name} {s} > {d} ipid {self.ipid}{frag}"


def _ip(addr: int) -> str:
    return ".".join(str(b) for b in addr.to_bytes(4, "big"))


def identity(ev: Event) -> Header | None:
    """The header a follow probe fetched (None: not an IPv4 packet, or fields missing)."""
    vi = ev.num("vi")
    if vi is None or vi >> 4 != 4 or (vi & 15) < 5:
        return None
    sa, da, proto, ipid = (_le_bytes(ev.num(k), n) for k, n in (("saddr", 4), ("daddr", 4), ("proto", 1), ("id", 2)))
    if sa is None or da is None or proto is None or ipid is None:
        return None
    fo, tl = _le_bytes(ev.num("fo"), 2), _le_bytes(ev.num("tl"), 2)
    l4 = (_le_bytes(ev.num("l4a"), 4) or b"") + (_le_bytes(ev.num("l4b"), 4) or b"")
    return Header(int.from_bytes(sa, "big"), int.from_bytes(da, "big"), proto[0], int.from_bytes(ipid, "big"),
                  int.from_bytes(fo, "big") if fo else 0, int.from_bytes(tl, "big") if tl else None, l4, vi & 15)


def parse_ipv4(data: bytes) -> Header | None:
    """An IPv4 header (and the transport header's first 8 bytes) at the start of ``data``."""
    if len(data) < 20 or data[0] >> 4 != 4 or (data[0] & 15) < 5:
        return None
    ihl = data[0] & 15
    tl, ipid, frag = struct.unpack(">HHH", data[2:8])
    return Header(int.from_bytes(data[12:16], "big"), int.from_bytes(data[16:20], "big"), data[9], ipid, frag, tl,
                  data[4 * ihl:4 * ihl + 8], ihl)


def drop_header(ev: Event) -> Header | None:
    """The IPv4 header of a dropped skb, from the window of bytes its probe fetched around ``skb->data``
    and where ``skb->network_header`` points (``nh``, from ``skb->head``; 65535: not set)."""
    words = [ev.num(f"w{i}") for i in range(WINDOW_WORDS)]
    if any(w is None for w in words) or ev.num("proto") != 0x0800:
        return None
    window = b"".join((w or 0).to_bytes(8, "little") for w in words)
    head, data, nh = ev.num("head"), ev.num("data"), ev.num("nh")
    candidates = []
    if head is not None and data is not None and nh is not None and nh != 0xFFFF:
        candidates.append(head + nh - data + WINDOW_BEFORE)
    candidates += [WINDOW_BEFORE, WINDOW_BEFORE + 14, WINDOW_BEFORE - 20]  # rx, tx (Ethernet), after IP's pull
    for at in candidates:
        if 0 <= at <= len(window) - 20:
            h = parse_ipv4(window[at:])
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
