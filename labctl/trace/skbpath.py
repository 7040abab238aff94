"""Follow each packet through the stack by its skb address, from a time-ordered event list.

Receive (one :class:`Packet` per frame the driver hands to the stack)::

    entry     net:napi_gro_receive_entry | net:netif_receive_skb_entry | net:netif_rx_entry
    netif     net:netif_receive_skb           (after GRO, in __netif_receive_skb_core)
    ip        kprobe ip_rcv_core              (both ip_rcv and the GRO list path ip_list_rcv)
    tcp       kprobe tcp_v4_rcv
    copy      skb:skb_copy_datagram_iovec     (the first copy to the reading process)

Transmit (one per skb that TCP hands to IP)::

    app       the tcp_sendmsg call that wrote the segment's last byte (by sequence number)
    tcp       kprobe __tcp_transmit_skb       (original skb; TCP sends a clone)
    ip        kprobe __ip_queue_xmit          (the clone: the next one on the same CPU)
    dev       kprobe __dev_queue_xmit
    xmit      net:net_dev_xmit                (the driver took it)

Addresses are reused as soon as an skb is freed (GRO frees a merged frame
and the next frame often gets the same address), so an address names a
packet only from its start event on: a start event always begins a new
packet, and a stage seen twice for one address means the start of the
second packet was lost. GRO merges (``napi_gro_receive_exit`` ret 0/1)
attach a frame to the flow's held head (ret 2) on the same device; TCP's
receive-queue coalescing (``skb_try_coalesce`` returning 1) attaches a
segment to the skb it was appended to, whose next copy delivers it. A gap
in the trace (``[N EVENTS DROPPED]``) marks every packet in flight as
disturbed and clears the state, so no packet is stitched across a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from labctl.trace.skbevents import Event, TraceLog

RX_POINTS = ("entry", "netif", "ip", "tcp", "copy")
TX_POINTS = ("app", "tcp", "ip", "dev", "xmit")
RX_STAGES = (("driver_netif", "entry", "netif"), ("netif_ip", "netif", "ip"), ("ip_tcp", "ip", "tcp"),
             ("tcp_app", "tcp", "copy"))
TX_STAGES = (("app_tcp", "app", "tcp"), ("tcp_ip", "tcp", "ip"), ("ip_dev", "ip", "dev"),
             ("dev_xmit", "dev", "xmit"))
STAGE_TITLES = {"driver_netif": "driver → netif_receive_skb", "netif_ip": "netif_receive_skb → IP",
                "ip_tcp": "IP → TCP", "tcp_app": "TCP → app (copy)", "app_tcp": "app (sendmsg) → TCP",
                "tcp_ip": "TCP → IP", "ip_dev": "IP → dev_queue_xmit", "dev_xmit": "dev_queue_xmit → driver xmit"}
RX_START = ("napi_gro_receive_entry", "netif_receive_skb_entry", "netif_rx_entry", "napi_gro_frags_entry")
GRO_MERGED, GRO_MERGED_FREE, GRO_HELD, GRO_NORMAL, GRO_CONSUMED = range(5)
IPPROTO_TCP = 6
_SEQ_MOD = 1 << 32


def seq_before(a: int, b: int) -> bool:
    """TCP's before(): ``a`` comes before ``b`` in 32-bit sequence space."""
    return ((a - b) % _SEQ_MOD) >= (1 << 31)


@dataclass
class Packet:
    id: int
    dir: str  # rx, tx
    addr: int
    cpu: int
    t: dict[str, int] = field(default_factory=dict)  # point -> ns
    dev: str | None = None
    len: int | None = None  # rx: frame (IP) length at entry; tx: skb length at net_dev_queue
    payload: int | None = None  # TCP payload bytes (rx: this frame; tx: end_seq - seq)
    proto: int | None = None  # IP protocol (rx)
    comm: str | None = None  # the process: rx reader (copy), tx writer (sendmsg)
    pid: int | None = None
    gro: str | None = None  # rx: held, merged, normal, consumed
    head: Packet | None = None  # rx: GRO head this frame was merged into
    into: Packet | None = None  # rx: skb this one was coalesced into (TCP receive queue)
    into_ts: int | None = None
    members: list[Packet] = field(default_factory=list)  # frames merged into this one by GRO
    appended: list[Packet] = field(default_factory=list)  # skbs coalesced into this one
    headers: int | None = None  # rx: IP + TCP header bytes (from the IP event)
    netif_len: int | None = None  # rx: length at netif_receive_skb (after GRO)
    unverified: bool = False  # rx: GRO merge whose lengths do not add up
    disturbed: bool = False  # lost trace events while in flight
    truncated: bool = False  # still in flight when the trace ended
    problem: str | None = None  # why it cannot be followed, when known
    sk: int | None = None  # tx socket
    seq: int | None = None
    end_seq: int | None = None
    retransmit: bool = False
    segments: int = 0  # tx: frames software GSO cut it into (0: sent as one skb)
    irq_ts: int | None = None  # rx timeline: last device irq and NET_RX softirq before entry
    softirq_ts: int | None = None
    napi_poll_ts: int | None = None

    def point(self, name: str) -> int | None:
        """The packet's time at ``name``, following GRO head and coalescing where needed."""
        if name in self.t:
            return self.t[name]
        if self.dir == "rx" and self.head is not None and name in ("netif", "ip", "tcp", "copy"):
            return self.head.point(name)
        return None

    def reader(self) -> tuple[str | None, int | None]:
        if self.comm is not None or self.head is None:
            return self.comm, self.pid
        return self.head.reader()

    def is_data(self) -> bool | None:
        """Whether it carries TCP payload (None: cannot tell, e.g. its IP event was lost)."""
        if self.dir == "tx":
            return bool(self.payload)
        if self.gro in ("merged",):
            return True  # GRO merges only segments with payload
        proto = self.proto if self.proto is not None else (self.head.proto if self.head else None)
        if proto is not None and proto != IPPROTO_TCP:
            return False
        if self.payload is not None:
            return self.payload > 0
        return None


@dataclass
class _SendWrite:
    ts: int
    start: int  # write_seq at entry
    size: int
    comm: str
    pid: int


@dataclass
class Correlation:
    rx: list[Packet] = field(default_factory=list)
    tx: list[Packet] = field(default_factory=list)
    disturbed_by_drops: int = 0
    gro_ambiguous: int = 0
    orphan_events: dict[str, int] = field(default_factory=dict)  # events for no known packet


class _State:
    """What following packets keeps between events, and what receive and transmit share."""

    def __init__(self) -> None:
        self.out = Correlation()
        self.rx_live: dict[int, Packet] = {}
        self.tx_live: dict[int, Packet] = {}
        self.gro_entry: dict[int, Packet] = {}  # cpu -> frame waiting for napi_gro_receive_exit
        self.gro_last: dict[str, Packet] = {}  # dev -> the latest GRO head held (GRO_HELD)
        self.coalesce: dict[int, tuple[int, int, int]] = {}  # cpu -> (ts, to, from) waiting for the return
        self.tx_pending: dict[int, Packet] = {}  # cpu -> transmitted skb waiting for its clone at IP
        self.writes: dict[int, list[_SendWrite]] = {}  # sk -> tcp_sendmsg calls
        self.sent_end: dict[int, int] = {}  # sk -> highest end_seq sent
        self.gso: dict[int, Packet] = {}  # cpu -> skb just cut by software GSO (its frames follow)
        self.irq: dict[int, int] = {}  # cpu -> last device irq entry
        self.softirq: dict[int, int] = {}  # cpu -> last NET_RX softirq entry
        self.next_id = 0

    # -- helpers -------------------------------------------------------------
    def _new(self, direction: str, ev: Event, addr: int) -> Packet:
        self.next_id += 1
        p = Packet(self.next_id, direction, addr, ev.cpu)
        (self.out.rx if direction == "rx" else self.out.tx).append(p)
        return p

    def _orphan(self, ev: Event) -> None:
        self.out.orphan_events[ev.name] = self.out.orphan_events.get(ev.name, 0) + 1

    def _rx_at(self, ev: Event, key: str, point: str) -> Packet | None:
        """The live rx packet at the skb address of ``ev``'s field ``key``, for a non-start event (None
        when the event has no address); a repeated point means a new packet."""
        addr = ev.addr(key)
        if addr is None:
            return None
        p = self.rx_live.get(addr)
        if p is not None and point in p.t:
            p.problem = p.problem or "its skb address was reused before it was delivered"
            p = None
        if p is None:
            p = self._new("rx", ev, addr)
            p.problem = "its start was not traced"
            self.rx_live[addr] = p
        p.t[point] = ev.ts
        return p

    def drop(self, ts: int) -> None:
        """Lost events: every packet in flight may miss a point; forget the state."""
        for p in {id(p): p for p in [*self.rx_live.values(), *self.tx_live.values(),
                                     *self.tx_pending.values(), *self.gro_entry.values()]}.values():
            if not p.disturbed and not _done(p):
                p.disturbed = True
                self.out.disturbed_by_drops += 1
                for m in p.members + p.appended:
                    m.disturbed = True
        self.rx_live.clear()
        self.tx_live.clear()
        self.gro_entry.clear()
        self.gro_last.clear()
        self.coalesce.clear()
        self.tx_pending.clear()
        self.gso.clear()


class _Receive(_State):
    """Received packets, from the driver to the application."""

    def rx_start(self, ev: Event) -> None:
        addr = ev.addr("skbaddr")
        if addr is None:
            return
        p = self._new("rx", ev, addr)
        p.t["entry"] = ev.ts
        p.dev = ev.fields.get("dev")
        p.len = ev.int("len")
        p.irq_ts, p.softirq_ts = self.irq.get(ev.cpu), self.softirq.get(ev.cpu)
        self.rx_live[addr] = p
        if ev.name == "napi_gro_receive_entry":
            self.gro_entry[ev.cpu] = p

    def gro_exit(self, ev: Event) -> None:
        p = self.gro_entry.pop(ev.cpu, None)
        ret = ev.int("ret")
        if p is None or ret is None:
            return
        if ret == GRO_HELD:
            p.gro = "held"
            self.gro_last[p.dev or ""] = p
        elif ret in (GRO_MERGED, GRO_MERGED_FREE):
            p.gro = "merged"
            if self.rx_live.get(p.addr) is p:
                del self.rx_live[p.addr]
            head = self.gro_last.get(p.dev or "")
            # the head may already be delivered: a merge that fills it flushes it within this call
            if head is not None and head.t.get("netif", p.t["entry"]) >= p.t["entry"]:
                p.head = head
                head.members.append(p)
            else:
                p.problem = "GRO merged it into a flow whose head was not traced"
                self.out.gro_ambiguous += 1
        elif ret == GRO_NORMAL:
            p.gro = "normal"
        elif ret == GRO_CONSUMED:
            p.gro = "consumed"
            p.problem = "GRO consumed it"

    def netif(self, ev: Event) -> None:
        p = self._rx_at(ev, "skbaddr", "netif")
        if p is None:
            return
        p.netif_len = ev.int("len")
        if p.dev is None:
            p.dev = ev.fields.get("dev")

    def ip(self, ev: Event) -> None:
        p = self._rx_at(ev, "skb", "ip")
        if p is None:
            return
        p.proto = ev.int("proto")
        ihl, doff, tot = ev.int("ihl"), ev.int("tcpoff"), ev.int("tot_len")
        if p.proto == IPPROTO_TCP and ihl is not None and doff is not None and (ihl & 0xF) == 5:
            headers = 20 + (doff >> 4) * 4
            if tot is not None and "entry" not in p.t:
                p.len = ((tot & 0xFF) << 8) | (tot >> 8)  # fetched little-endian
            if p.len is not None:
                p.payload = max(0, p.len - headers)
            p.headers = headers

    def verify_gro(self, head: Packet) -> None:
        """Members get their payload; if the head's length after GRO is not the sum, none is trusted.

        GRO merges a frame into the held skb of its flow; the latest held
        head on the device is assumed to be that flow (one bulk flow per
        NIC). The lengths prove or refute it.
        """
        headers = head.headers
        if not head.members or headers is None:
            return
        for m in head.members:
            if m.len is not None:
                m.payload = max(0, m.len - headers)
        if head.len is None or head.netif_len is None:
            return
        if head.len + sum(m.payload or 0 for m in head.members) != head.netif_len:
            for m in head.members:
                m.unverified = True
                m.problem = "its GRO merge could not be verified (lengths do not add up)"
            self.out.gro_ambiguous += len(head.members)

    def tcp(self, ev: Event) -> None:
        p = self._rx_at(ev, "skb", "tcp")
        if p is None:
            return
        length, doff = ev.int("len"), ev.int("doff")
        if p.payload is None and length is not None and doff is not None and not p.members:
            p.payload = max(0, length - (doff >> 4) * 4)
        if p.proto is None:
            p.proto = IPPROTO_TCP

    def copy(self, ev: Event) -> None:
        addr = ev.addr("skbaddr")
        p = self.rx_live.get(addr) if addr is not None else None
        if p is None or "tcp" not in p.t:
            self._orphan(ev)
            return
        if "copy" not in p.t:
            p.t["copy"] = ev.ts
            p.comm, p.pid = ev.comm, ev.pid
        for q in p.appended:  # segments appended to this skb since its last copy
            if "copy" not in q.t and q.into_ts is not None and q.into_ts <= ev.ts:
                q.t["copy"] = ev.ts
                q.comm, q.pid = ev.comm, ev.pid

    def coalesce_call(self, ev: Event) -> None:
        to, frm = ev.addr("to"), ev.addr("from")
        if to is not None and frm is not None:
            self.coalesce[ev.cpu] = (ev.ts, to, frm)

    def coalesce_ret(self, ev: Event) -> None:
        call = self.coalesce.pop(ev.cpu, None)
        if call is None or ev.int("ret") != 1:
            return
        ts, to, frm = call
        src, dst = self.rx_live.get(frm), self.rx_live.get(to)
        if src is None or dst is None or "tcp" not in src.t:
            return
        src.into, src.into_ts = dst, ts
        dst.appended.append(src)
        dst.appended.extend(src.appended)  # a backlog skb carries what was appended to it
        del self.rx_live[frm]


class _Transmit(_State):
    """Transmitted packets, from the application's write to the driver."""

    def sendmsg(self, ev: Event) -> None:
        sk, start, size = ev.addr("sk"), ev.int("wseq"), ev.int("size")
        if sk is None or start is None or size is None:
            return
        writes = self.writes.setdefault(sk, [])
        writes.append(_SendWrite(ev.ts, start, size, ev.comm, ev.pid))
        del writes[:-256]

    def transmit(self, ev: Event) -> None:
        sk, skb = ev.addr("sk"), ev.addr("skb")
        if skb is None:
            return
        p = self._new("tx", ev, skb)
        p.t["tcp"] = ev.ts
        p.sk, p.seq, p.end_seq = sk, ev.int("seq"), ev.int("end_seq")
        if p.seq is not None and p.end_seq is not None:
            p.payload = (p.end_seq - p.seq) % _SEQ_MOD
        if sk is not None and p.payload and p.seq is not None and p.end_seq is not None:
            high = self.sent_end.get(sk)
            if high is not None and seq_before(p.seq, high):
                p.retransmit = True
            if high is None or seq_before(high, p.end_seq):
                self.sent_end[sk] = p.end_seq
            if not p.retransmit:
                self._attribute_write(p, sk)
        self.tx_pending[ev.cpu] = p
        self.gso.pop(ev.cpu, None)

    def _attribute_write(self, p: Packet, sk: int) -> None:
        assert p.end_seq is not None
        last = (p.end_seq - 1) % _SEQ_MOD
        for w in reversed(self.writes.get(sk, [])):
            if (last - w.start) % _SEQ_MOD < w.size:
                p.t["app"] = w.ts
                p.comm, p.pid = w.comm, w.pid
                return
        p.problem = "the write that queued its data was not traced"

    def ip_queue(self, ev: Event) -> None:
        p = self.tx_pending.pop(ev.cpu, None)
        addr = ev.addr("skb")
        if p is None or addr is None:
            self._orphan(ev)
            return
        p.addr = addr
        p.t["ip"] = ev.ts
        self.tx_live[addr] = p

    def tx_point(self, ev: Event, key: str, point: str) -> None:
        addr = ev.addr(key)
        p = self.tx_live.get(addr) if addr is not None else None
        if p is None:
            seg = self.gso.get(ev.cpu)
            if point == "xmit" and seg is not None and seg.dev == ev.fields.get("dev"):
                seg.t["xmit"] = ev.ts  # the last frame handed to the driver completes it
                seg.segments += 1
            return  # else not a TCP segment (ARP, ICMP, ...) or its start was not traced
        if point in p.t:
            if point == "xmit":  # a requeued skb goes out again
                return
            del self.tx_live[p.addr]
            return
        p.t[point] = ev.ts
        if ev.name == "net_dev_queue":
            p.len = ev.int("len")
        if p.dev is None and "dev" in ev.fields:
            p.dev = ev.fields["dev"]
        if point == "xmit":
            del self.tx_live[p.addr]


class _Follower(_Receive, _Transmit):
    """Follows every packet of a recording (the handlers of :data:`_HANDLERS`), with the context
    of the timeline and the frees that end a packet."""

    def context(self, ev: Event) -> None:
        if ev.name == "irq_handler_entry":
            self.irq[ev.cpu] = ev.ts
        elif ev.name == "softirq_entry" and ev.fields.get("action") == "NET_RX":
            self.softirq[ev.cpu] = ev.ts
        elif ev.name == "napi_poll":
            dev = ev.fields.get("dev")
            for p in self.rx_live.values():
                if p.dev == dev and p.napi_poll_ts is None and p.cpu == ev.cpu and "entry" in p.t:
                    p.napi_poll_ts = ev.ts

    def free(self, ev: Event) -> None:
        addr = ev.addr("skbaddr")
        if addr is None:
            return
        self.rx_live.pop(addr, None)
        p = self.tx_live.pop(addr, None)
        if p is not None and "queue" in p.t and "xmit" not in p.t:
            # freed between the queue and the driver: software GSO replaced it by frames
            # (validate_xmit_skb), which net_dev_xmit reports under their own addresses
            self.gso[ev.cpu] = p


def _done(p: Packet) -> bool:
    points = RX_POINTS if p.dir == "rx" else TX_POINTS
    return all(p.point(x) is not None for x in points)


_HANDLERS: dict[str, Callable[[_Follower, Event], None]] = {
    "netif_receive_skb": _Follower.netif,
    "napi_gro_receive_exit": _Follower.gro_exit,
    "ip_rcv_core": _Follower.ip,
    "tcp_v4_rcv": _Follower.tcp,
    "skb_copy_datagram_iovec": _Follower.copy,
    "skb_try_coalesce": _Follower.coalesce_call,
    "skb_try_coalesce_ret": _Follower.coalesce_ret,
    "tcp_sendmsg": _Follower.sendmsg,
    "tcp_transmit_skb": _Follower.transmit,
    "ip_queue_xmit": _Follower.ip_queue,
    "kfree_skb": _Follower.free,
    "consume_skb": _Follower.free,
}
_TX_POINTS = {"dev_queue_xmit": ("skb", "dev"), "net_dev_queue": ("skbaddr", "queue"),
              "net_dev_xmit": ("skbaddr", "xmit")}


def follow(log: TraceLog) -> Correlation:
    """Every packet of the trace with the times it passed each point."""
    f = _Follower()
    drops = sorted(log.drops, key=lambda d: d.ts)
    di = 0
    for ev in log.events:
        while di < len(drops) and drops[di].ts <= ev.ts:
            f.drop(drops[di].ts)
            di += 1
        if ev.name in RX_START:
            f.rx_start(ev)
        elif ev.name in _TX_POINTS:
            key, point = _TX_POINTS[ev.name]
            f.tx_point(ev, key, point)
        elif ev.name in _HANDLERS:
            _HANDLERS[ev.name](f, ev)
        else:
            f.context(ev)
    for p in f.out.rx:
        f.verify_gro(p)
    _mark_truncated(f.out.rx, "copy")
    _mark_truncated(f.out.tx, "xmit")
    return f.out


def _mark_truncated(packets: list[Packet], last_point: str) -> None:
    """Packets that never reached ``last_point`` but were still in flight after the last packet that did."""
    ends = [t for p in packets if (t := p.point(last_point)) is not None]
    if not ends:
        return
    end = max(ends)
    for p in packets:
        if p.point(last_point) is None and not p.disturbed and max(p.t.values(), default=0) >= end:
            p.truncated = True
