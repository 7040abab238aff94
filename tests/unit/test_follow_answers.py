"""ICMP errors answer the packet they quote, IPv6 and ARP identities, repeated ARP requests
(labctl.trace.hops, labctl.trace.journey): events as the probes of labctl.follow.probes fetch them."""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path

from labctl.follow.probes import BASE, FIELDS
from labctl.trace.clocks import Clock
from labctl.trace.drops import table
from labctl.trace.hops import Event, drop_header, identity, parse_frame, window_words
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import journeys_of
from labctl.trace.pathmodel import Journey, Topology


def _fields(raw: bytes, family: int, at: int = 0) -> dict[str, str]:
    """What a probe of ``family`` fetches from the header bytes ``raw`` (little-endian reads)."""
    out = {}
    for name in BASE[family]:
        off, t = FIELDS[family][name]
        size = {"u8": 1, "u16": 2, "u32": 4}[t]
        out[name] = str(int.from_bytes(raw[at + off:at + off + size].ljust(size, b"\0"), "little"))
    if family != 4:
        out["pr"] = str(int.from_bytes({6: b"\x86\xdd", 0x806: b"\x08\x06"}[family], "little"))
    return out


def v4(src: str, dst: str, ttl: int, l4: bytes, ipid: int = 7) -> bytes:
    return (struct.pack(">BBHHHBBH", 0x45, 0, 20 + len(l4), ipid, 0, ttl, 1, 0)
            + ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed + l4)


def v6(src: str, dst: str, hl: int, l4: bytes) -> bytes:
    return (struct.pack(">IHBB", 0x60000000, len(l4), 58, hl) + ipaddress.IPv6Address(src).packed
            + ipaddress.IPv6Address(dst).packed + l4)


def arp(op: int, spa: str, tpa: str, sha: bytes = b"\x52\x54\0\0\0\1") -> bytes:
    return (struct.pack(">HHBBH", 1, 0x800, 6, 4, op) + sha + ipaddress.IPv4Address(spa).packed
            + b"\0" * 6 + ipaddress.IPv4Address(tpa).packed)


ECHO = struct.pack(">BBHHH", 8, 0, 0, 301, 1)
ERROR = struct.pack(">BBHI", 11, 0, 0x1234, 0)


def ev(guest: str, ms: float, point: str, raw: bytes, family: int = 4, dev: str | None = None, comm: str = "",
       at: int = 0) -> Event:
    f = _fields(raw, family, at)
    if dev:
        f["dev"] = dev
    f["skb"] = f"0x{abs(hash((guest, raw))) & 0xffffff:x}"
    return Event(guest, int(ms * 1e6), point, comm or "<idle>", 0 if not comm else 301, 0, not comm, f)


def drop(guest: str, ms: float, skb: str, reason: int, loc: str) -> Event:
    return Event(guest, int(ms * 1e6), "drop", "<idle>", 0, 0, True,
                 {"skb": skb, "proto": "2048", "reason": str(reason), "loc": loc})


TOPO = Topology({("a", "eth1"): "n1", ("r", "eth1"): "n1", ("r", "eth2"): "n2", ("b", "eth1"): "n2"},
                guests=("a", "r", "b"))


def _run(events: list[Event]) -> list[Journey]:
    corr = Correlator(TOPO, {g: Clock() for g in TOPO.guests})
    for e in sorted(events, key=lambda e: e.ts):
        corr.add(e)
    return corr.settle(None)


def _ttl_events(quoted_copy: bool, error: bool) -> list[Event]:
    req = v4("10.1.0.1", "10.2.0.1", 1, ECHO)
    err = v4("10.1.0.254", "10.1.0.1", 64, ERROR + req[:28], ipid=99)
    fwd = ev("r", 2.0, "ip_fwd", req)
    out = [ev("a", 0.0, "dev_queue", b"\0" * 14 + req, dev="eth1", comm="ping", at=14),
           ev("a", 0.1, "xmit", b"\0" * 14 + req, dev="eth1", comm="ping", at=14),
           ev("r", 1.0, "netif_rx", req, dev="eth1"), fwd,
           drop("r", 2.2, fwd.skb, 10, "ip_forward+0x1c5/0x6a0")]
    if error:
        out += [ev("r", 2.1, "dev_queue", b"\0" * 14 + err, dev="eth1", at=14),
                ev("r", 2.15, "xmit", b"\0" * 14 + err, dev="eth1", at=14),
                ev("a", 3.0, "netif_rx", err, dev="eth1"), ev("a", 3.1, "ip_local", err),
                ev("a", 3.5, "raw_read", err, comm="ping")]
    if quoted_copy:  # ping reads its error queue: the quoted request, header and all
        out.append(ev("a", 3.6, "raw_read", req, comm="ping"))
    return out


def test_a_ttl_exceeded_on_the_router_is_a_drop_and_its_answer_never_a_delivery() -> None:
    js = {j.header.describe().split(" id ")[0]: j for j in _run(_ttl_events(quoted_copy=True, error=True))}
    request = js["ICMP echo-request 10.1.0.1 > 10.2.0.1"]
    assert (request.end.kind, request.end.guest) == ("dropped", "r")
    assert request.end.text == "dropped on r at ip_forward: TTL exceeded; time-exceeded sent to a"
    assert [(h.guest, h.where) for h in request.hops] == [
        ("a", "net_dev_queue"), ("a", "net_dev_start_xmit"), ("a", "a.eth1 → r.eth1"), ("r", "netif_receive_skb"),
        ("r", "ip_forward")] and request.out_of_order == 0
    error = js["ICMP time-exceeded 10.1.0.254 > 10.1.0.1"]
    assert error.end.kind == "delivered" and error.end.guest == "a"


def test_without_the_error_followed_the_quoted_copy_still_says_an_answer_came() -> None:
    (request,) = _run(_ttl_events(quoted_copy=True, error=False))
    assert request.end.text == ("dropped on r at ip_forward: TTL exceeded; an ICMP error quoting it reached "
                                "ping (pid 301) on a")
    (bare,) = _run(_ttl_events(quoted_copy=False, error=False))
    assert bare.end.text == "dropped on r at ip_forward: TTL exceeded"


def test_a_read_after_receiving_is_a_delivery() -> None:
    reply = v4("10.2.0.1", "10.1.0.1", 63, struct.pack(">BBHHH", 0, 0, 0, 301, 1))
    (j,) = _run([ev("a", 1.0, "netif_rx", reply, dev="eth1"), ev("a", 1.1, "ip_local", reply),
                 ev("a", 1.2, "raw_read", reply, comm="ping")])
    assert j.end.kind == "delivered" and j.end.text == "delivered to ping (pid 301) on a"


def test_ipv6_identity_and_its_hop_limit() -> None:
    req = v6("fd00:1::2", "fd00:2::2", 1, struct.pack(">BBHHH", 128, 0, 0xabcd, 5, 1))
    e = ev("r", 1.0, "ip6_fwd", req, family=6)
    h = identity(e)
    assert h is not None and h.describe() == "ICMPv6 echo-request fd00:1::2 > fd00:2::2 id 5 seq 1"
    assert h.ttl == 1 and h.family == 6 and h.key()[-1] == 6 and h.is_echo(1)
    assert parse_frame(b"\0" * 12 + b"\x86\xdd" + req) == h
    err = v6("fd00:1::1", "fd00:1::2", 64, struct.pack(">BBHI", 3, 0, 0x55, 0) + req[:40])
    got = identity(ev("r", 1.1, "dev_queue", b"\0" * 14 + err, family=6, at=14))
    assert got is not None and got.is_error() and got.describe() == "ICMPv6 time-exceeded fd00:1::1 > fd00:1::2"


def test_repeated_arp_requests_are_three_packets_each_unanswered() -> None:
    who = arp(1, "10.1.0.1", "10.1.0.99")
    h = identity(ev("a", 0, "dev_queue", b"\0" * 14 + who, family=0x806, at=14))
    assert h is not None and h.describe() == "ARP who-has 10.1.0.99 tell 10.1.0.1" and h.repeats()
    events = []
    for k in range(3):
        t = 1000.0 * k
        events += [ev("a", t, "dev_queue", b"\0" * 14 + who, family=0x806, dev="eth1", at=14),
                   ev("a", t + 0.1, "xmit", b"\0" * 14 + who, family=0x806, dev="eth1", at=14),
                   ev("r", t + 1.0, "netif_rx", who, family=0x806, dev="eth1"),
                   ev("r", t + 1.2, "arp_rcv", who, family=0x806)]
    js = _run(events)
    assert len(js) == 3
    for j in js:
        assert [(x.guest, x.where) for x in j.hops] == [("a", "net_dev_queue"), ("a", "net_dev_start_xmit"),
                                                       ("a", "a.eth1 → r.eth1"), ("r", "netif_receive_skb"),
                                                       ("r", "arp_rcv")]
        assert j.end.kind == "unanswered" and j.end.text == ("unanswered: nobody has 10.1.0.99 (r took it in, "
                                                             "none replied)")


def test_an_answered_arp_request_names_who_has_it() -> None:
    who, reply = arp(1, "10.1.0.1", "10.1.0.254"), arp(2, "10.1.0.254", "10.1.0.1", b"\x52\x54\0\0\0\x99")
    js = _run([ev("a", 0, "xmit", b"\0" * 14 + who, family=0x806, dev="eth1", at=14),
               ev("r", 1, "netif_rx", who, family=0x806, dev="eth1"), ev("r", 1.1, "arp_rcv", who, family=0x806),
               ev("r", 1.5, "xmit", b"\0" * 14 + reply, family=0x806, dev="eth1", at=14),
               ev("a", 2, "netif_rx", reply, family=0x806, dev="eth1"), ev("a", 2.1, "arp_rcv", reply, family=0x806)])
    by = {j.header.proto: j for j in js}
    assert by[1].end.kind == "answered" and by[1].end.text == "answered by r (10.1.0.254 is-at 52:54:00:00:00:99)"
    assert by[2].end.kind == "consumed" and "ARP (arp_rcv) on a" in by[2].end.text


def test_a_drop_before_any_follow_point_is_a_packet_of_its_own() -> None:
    """An echo request queued for a neighbour that never answered: only its drop is seen, and the
    host-unreachable the kernel sends back answers it."""
    req = v4("10.1.0.1", "10.1.0.99", 64, ECHO)
    window = b"\0" * 24 + req + b"\0" * (96 - 24 - len(req))
    d = Event("a", 3_000_000_000, "drop", "<idle>", 0, 0, True,
              {"skb": "0x1", "proto": "2048", "reason": "41", "loc": "arp_error_report+0x2e/0x50",
               **{f"w{i}": str(int.from_bytes(window[8 * i:8 * i + 8], "little")) for i in range(12)}})
    err = v4("10.1.0.1", "10.1.0.1", 64, struct.pack(">BBHI", 3, 1, 0x77, 0) + req[:28], ipid=5)
    js = {j.header.describe().split(" id ")[0]: j for j in _run(
        [d, ev("a", 2999.9, "dev_queue", b"\0" * 14 + err, dev="lo", at=14)])}
    j = js["ICMP echo-request 10.1.0.1 > 10.1.0.99"]
    assert j.end.kind == "dropped" and j.end.reason == "NEIGH_FAILED"
    assert j.end.text == ("dropped on a at arp_error_report+0x2e/0x50 for NEIGH_FAILED; host-unreachable sent to a")
    assert [(h.guest, h.where) for h in j.hops] == [("a", "arp_error_report")]


def test_repeats_in_quick_succession_keep_their_own_hops_whatever_order_the_guests_streams_come_in() -> None:
    """Requests 100 ms apart, a's stream read before r's (a live follow reads each guest on its own)."""
    who = arp(1, "10.1.0.1", "10.1.0.99")
    a_side, r_side = [], []
    for k in range(3):
        t = 100.0 * k
        a_side.append(ev("a", t, "xmit", b"\0" * 14 + who, family=0x806, dev="eth1", at=14))
        r_side.append(ev("r", t + 1.0 + k, "netif_rx", who, family=0x806, dev="eth1"))
    corr = Correlator(TOPO, {g: Clock() for g in TOPO.guests})
    for e in a_side + r_side:
        corr.add(e)
    js = sorted(corr.settle(None), key=lambda j: j.start)
    assert [[round((h.t - j.start) / 1e6, 1) for h in j.hops] for j in js] == [[0, 1.0, 1.0], [0, 2.0, 2.0],
                                                                            [0, 3.0, 3.0]]


def test_the_answer_is_found_whichever_guests_stream_brought_the_error_first() -> None:
    """Live, a's stream may bring the time-exceeded before r's: the error's hops on r still tie it."""
    events = _ttl_events(quoted_copy=False, error=True)
    corr = Correlator(TOPO, {g: Clock() for g in TOPO.guests})
    for e in sorted(events, key=lambda e: (e.guest != "a", e.ts)):  # a's events first
        corr.add(e)
    request = next(j for j in corr.settle(None) if "echo-request" in j.header.describe())
    assert request.end.text == "dropped on r at ip_forward: TTL exceeded; time-exceeded sent to a"


def test_an_icmpv6_error_freed_by_icmpv6_rcv_is_handed_over_not_dropped() -> None:
    req = v6("fd00:1::2", "fd00:2::2", 1, struct.pack(">BBHHH", 128, 0, 0xabcd, 5, 1))
    err = v6("fd00:1::1", "fd00:1::2", 64, struct.pack(">BBHI", 3, 0, 0x55, 0) + req[:40])
    rx = ev("a", 1.0, "netif_rx", err, family=6, dev="eth1")
    (j,) = _run([rx, ev("a", 1.1, "ip6_local", err, family=6),
                 drop("a", 1.2, rx.skb, 2, "icmpv6_rcv+0x258/0x690")])
    assert j.end.kind == "consumed" and j.end.text == (
        "delivered to the kernel (ip6_input) on a: an ICMPv6 error, for the socket that sent the packet it quotes "
        "(its error queue)")


def test_a_copy_read_after_the_packets_own_drop_is_not_its_delivery() -> None:
    """ping reads the echo request a host-unreachable quotes from its error queue, after the request was
    dropped (NEIGH_FAILED) on the same guest without any other hop."""
    req = v4("10.1.0.1", "10.1.0.99", 64, ECHO)
    window = b"\0" * 24 + req + b"\0" * (96 - 24 - len(req))
    d = Event("a", 3_000_000_000, "drop", "<idle>", 0, 0, True,
              {"skb": "0x1", "proto": "2048", "reason": "41", "loc": "arp_error_report+0x2e/0x50",
               **{f"w{i}": str(int.from_bytes(window[8 * i:8 * i + 8], "little")) for i in range(12)}})
    (j,) = _run([d, ev("a", 3001.0, "raw_read", req, comm="ping")])
    assert j.end.kind == "dropped" and j.end.text.endswith(
        "for NEIGH_FAILED; an ICMP error quoting it reached ping (pid 301) on a")


# Recorded on real guests (tests/fixtures/follow6: labs/dual-stack-router.yaml on Debian's 6.1 under TCG,
# the steps of tests/integration/test_follow_ipv6.py: three IPv6 pings a → b through r; a ping with TTL 1
# and one with hop limit 1; a ping to 10.1.0.99, which nobody has)
FIX6 = Path(__file__).resolve().parents[1] / "fixtures" / "follow6"


def _recorded(step: str) -> list[Journey]:
    got = journeys_of(FIX6 / step)
    assert got is not None
    return got[0]


def _where(j: Journey) -> list[tuple[str, str, str | None]]:
    return [(h.guest, h.where, h.dev) for h in j.hops]


A_OUT = [("a", "net_dev_queue", "br0"), ("a", "net_dev_start_xmit", "br0"), ("a", "net_dev_queue", "eth1"),
         ("a", "net_dev_start_xmit", "eth1"), ("a", "a.eth1 → r.eth1", None), ("r", "netif_receive_skb", "eth1")]


def test_recorded_ipv6_pings_through_the_router_each_with_its_full_path() -> None:
    js = _recorded("ipv6")
    requests = [j for j in js if j.header.is_echo(1)]
    replies = [j for j in js if j.header.is_echo(2)]
    assert len(requests) == len(replies) == 3 and len(js) == 6
    for j in requests:
        assert j.end.kind == "answered" and j.end.text == "answered by b's kernel (ICMPv6 echo reply sent)"
        assert _where(j) == [*A_OUT, ("r", "ip6_forward", None), ("r", "net_dev_queue", "eth2"),
                             ("r", "net_dev_start_xmit", "eth2"), ("r", "r.eth2 → b.eth1", None),
                             ("b", "netif_receive_skb", "eth1"), ("b", "ip6_input", None)] and j.out_of_order == 0
    for j in replies:
        assert j.end.kind == "delivered" and j.end.guest == "a" and j.out_of_order == 0
        assert _where(j)[-1] == ("a", "skb_copy_datagram_iovec", None)


def test_recorded_ttl_and_hop_limit_exceeded_on_the_router() -> None:
    by = {j.header.describe().split(" id ")[0]: j for j in _recorded("ttl")}
    assert by["ICMP echo-request 10.1.0.2 > 10.2.0.2"].end.text == (
        "dropped on r at ip_forward: TTL exceeded; time-exceeded sent to a")
    assert by["ICMPv6 echo-request fd00:1::2 > fd00:2::2"].end.text == (
        "dropped on r at ip6_forward: hop limit exceeded; time-exceeded sent to a")
    assert _where(by["ICMP echo-request 10.1.0.2 > 10.2.0.2"]) == [*A_OUT, ("r", "ip_forward", None)]
    for name in ("ICMP time-exceeded 10.1.0.1 > 10.1.0.2", "ICMPv6 time-exceeded fd00:1::1 > fd00:1::2"):
        assert by[name].end.kind == "consumed" and by[name].end.text.endswith("(its error queue)"), by[name].end
    # the copy of the request ping read from its error queue is in the raw trace, and is not a hop
    assert any("ping-247" in ln and " sock_read: " in ln for ln in (FIX6 / "ttl" / "follow" / "a.txt").open())
    assert not [j for j in by.values() if j.end.kind == "delivered"]


def test_recorded_arp_for_an_address_nobody_has() -> None:
    js = _recorded("arp")
    asks = [j for j in js if j.header.describe() == "ARP who-has 10.1.0.99 tell 10.1.0.2"]
    assert len(asks) == 3 and all(j.end.kind == "unanswered" for j in asks)
    assert all(_where(j) == [*A_OUT, ("r", "arp_rcv", None)] for j in asks)
    (ping,) = [j for j in js if j.header.is_echo(1)]
    assert ping.end.text == "dropped on a at neigh_invalidate+0x7f/0x120 for NEIGH_FAILED; host-unreachable sent to a"
    (unreach,) = [j for j in js if j.header.is_error()]
    assert unreach.end.kind == "consumed" and "error queue" in unreach.end.text


def test_a_dropped_ipv6_packets_header_is_found_where_ipv6_pulled_it() -> None:
    """The drop probe's window reaches 40 bytes before skb->data (wm2, wm1): an IPv6 header already
    pulled (a TCP or UDP socket's drop) is read there; the drop table shows it."""
    pkt = v6("fd00:1::2", "fd00:2::2", 63, struct.pack(">HHHH", 40000, 9, 16, 0x1234))
    pkt = pkt[:6] + b"\x11" + pkt[7:]  # next header UDP
    window = pkt + b"\0" * (112 - len(pkt))  # from skb->data - 40: skb->data at the UDP header
    names = window_words()
    fields = {n: str(int.from_bytes(window[8 * i:8 * i + 8], "little")) for i, (n, _) in enumerate(names)}
    d = Event("b", 1, "drop", "<idle>", 0, 0, True,
              {"skb": "0x1", "proto": str(0x86DD), "reason": "2", "loc": "udpv6_rcv+0x1/0x2", **fields})
    h = drop_header(d)
    assert h is not None and h.describe() == "UDP [fd00:1::2]:40000 > [fd00:2::2]:9"
    (row,), _ = table([d])
    assert row.protocol == "IPv6" and row.headers == ["UDP [fd00:1::2]:40000 > [fd00:2::2]:9"]


def test_a_read_with_no_hop_before_it_is_no_packet() -> None:
    """A TCP socket's copy (sshd's) read at its payload can pass the reader probe's filter by chance: a
    "packet" of that read alone is none, while a read after the packet's own hops is its delivery."""
    req = v4("10.1.0.1", "10.2.0.1", 64, ECHO)
    noise = ev("a", 0.5, "raw_read", bytes.fromhex("45000f00d6560000400100000d143228e1335d6b") + ECHO, comm="sshd")
    real = [ev("b", 0.0, "netif_rx", req, dev="eth1"), ev("b", 0.2, "ip_local", req),
            ev("b", 0.4, "raw_read", req, comm="ping")]
    (j,) = _run([noise, *real])
    assert j.end.kind == "delivered" and j.end.guest == "b", j.end
    assert [h.point for h in j.hops if h.guest == "b"][-1] == "raw_read"
