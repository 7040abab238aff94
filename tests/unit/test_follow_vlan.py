"""``vlan [ID]`` in a follow (labctl.trace.vlanhops, labctl.trace.journey, labctl.trace.journeyfiles,
labctl.follow.vlanprobes): a journey's VLANs from the VLAN devices of its hops, the tags its hops read in
the frame and the 802.1Q tags of its wire frames, and the journeys a filter's ``vlan`` keeps; events as
the probes fetch them, and a real run's recorded traces (tests/fixtures/follow55)."""

from __future__ import annotations

import ipaddress
import json
import struct
import time
from pathlib import Path
from typing import Any

from labctl.follow.follower import Follower, vlan_ids
from labctl.pktfilter import Vlan, parse, vlan_of
from labctl.trace.clocks import Clock
from labctl.trace.hops import Event, frame_vlans, identity, parse_frame, parse_line
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import FOLLOW_DIR, FOLLOW_INPUTS, follow_inputs, journeys_of, read_inputs
from labctl.trace.pathmodel import Journey, Topology, Wire
from tests.unit.test_follow_answers import ECHO, ev, v4

ROOT = Path(__file__).resolve().parents[2]
# labs/dual-stack-router.yaml: a's br0 (eth1 in it) and br0.10; r's eth1 and eth1.10, on network left
TOPO = Topology({("a", "eth1"): "left", ("r", "eth1"): "left"}, guests=("a", "r"),
                vlans={("a", "br0.10"): 10, ("r", "eth1.10"): 10})
OVER_VLAN = v4("10.10.0.2", "10.10.0.1", 64, ECHO, ipid=11)
UNTAGGED = v4("10.1.0.2", "10.1.0.1", 64, struct.pack(">BBHHH", 8, 0, 0, 302, 1), ipid=12)


def frame(ip: bytes, *vids: int) -> bytes:
    """An Ethernet frame of ``ip`` with an 802.1Q tag for each of ``vids`` (outermost first)."""
    tags = b"".join(struct.pack(">HH", 0x8100, 0x2000 | v) for v in vids)  # priority 1: the VID is the low 12 bits
    return b"\x52\x54\0\0\0\2\x52\x54\0\0\0\1" + tags + b"\x08\x00" + ip


def _a_to_r(raw: bytes, devs: tuple[str, ...], t0: float) -> list[Event]:
    """``raw`` sent by a through each of ``devs`` (its VLAN device, the bridge, the NIC), taken in by r."""
    out = []
    for i, d in enumerate(devs):
        out += [ev("a", t0 + 0.2 * i, "dev_queue", b"\0" * 14 + raw, dev=d, comm="ping", at=14),
                ev("a", t0 + 0.2 * i + 0.1, "xmit", b"\0" * 14 + raw, dev=d, comm="ping", at=14)]
    return [*out, ev("r", t0 + 2.0, "netif_rx", raw, dev="eth1"), ev("r", t0 + 2.1, "ip_local", raw)]


def _journeys(events: list[Event], vlan: Vlan | None, wire: Wire | None = None,
              topo: Topology = TOPO) -> list[Journey]:
    corr = Correlator(topo, {g: Clock() for g in topo.guests}, wire or Wire(), vlan=vlan)
    for e in sorted(events, key=lambda e: e.ts):
        corr.add(e)
    return corr.settle(None)


def _pings() -> list[Event]:
    return _a_to_r(OVER_VLAN, ("br0.10", "br0", "eth1"), 0.0) + _a_to_r(UNTAGGED, ("br0", "eth1"), 10.0)


def test_a_journey_on_a_vlan_device_is_on_its_vlan_and_vlan_keeps_only_those() -> None:
    every = _journeys(_pings(), None)
    assert [(j.header.describe(), j.vlans) for j in every] == [
        ("ICMP echo-request 10.10.0.2 > 10.10.0.1 id 301 seq 1", (10,)),
        ("ICMP echo-request 10.1.0.2 > 10.1.0.1 id 302 seq 1", ())]
    assert every[0].as_dict()["vlans"] == [10] and "vlans" not in every[1].as_dict()
    for text in ("vlan 10 and icmp", "icmp and vlan 10", "vlan", "vlan and host 10.10.0.1"):
        (kept,) = _journeys(_pings(), vlan_of(parse(text)))
        assert kept.header.describe().startswith("ICMP echo-request 10.10.0.2 > 10.10.0.1"), text
        assert [(h.guest, h.where, h.dev) for h in kept.hops][:2] == [("a", "net_dev_queue", "br0.10"),
                                                                      ("a", "net_dev_start_xmit", "br0.10")]
        assert kept.id == 1  # numbered among the journeys kept
    assert _journeys(_pings(), Vlan(20)) == []


def test_a_tagged_wire_frame_puts_a_journey_on_its_vlan_and_its_wire_hop_says_the_tag() -> None:
    # the VLAN devices not followed (no topology of them): only the frames QEMU saw on the wire tell
    bare = Topology(TOPO.nets, guests=TOPO.guests)
    req, plain = parse_frame(frame(OVER_VLAN, 10)), parse_frame(frame(UNTAGGED))
    assert req is not None and plain is not None
    wire = Wire(captured={("a", "eth1"), ("r", "eth1")})
    for nic in wire.captured:
        wire.seen[nic] = {req.key(): [1_000_000], plain.key(): [11_000_000]}
        wire.tags[nic] = {req.key(): set(frame_vlans(frame(OVER_VLAN, 10)))}
    every = _journeys(_pings(), None, wire, bare)
    assert [j.vlans for j in every] == [(10,), ()]
    hop = next(h for h in every[0].hops if h.point == "wire")
    assert (hop.where, hop.note) == ("a.eth1 → r.eth1", "seen on the host side at both ends; tagged VLAN 10")
    assert next(h for h in every[1].hops if h.point == "wire").note == "seen on the host side at both ends"
    assert [j.header.describe()[:40] for j in _journeys(_pings(), Vlan(10), wire, bare)] == [
        "ICMP echo-request 10.10.0.2 > 10.10.0.1 "]


def test_a_frames_tags_are_read_outermost_first_and_skipped_for_its_header() -> None:
    assert frame_vlans(frame(OVER_VLAN)) == ()
    assert frame_vlans(frame(OVER_VLAN, 10)) == (10,)
    assert frame_vlans(frame(OVER_VLAN, 100, 4095)) == (100, 4095)
    for f in (frame(OVER_VLAN), frame(OVER_VLAN, 10), frame(OVER_VLAN, 100, 4095)):
        h = parse_frame(f)
        assert h is not None and h.describe() == "ICMP echo-request 10.10.0.2 > 10.10.0.1 id 301 seq 1"
    assert frame_vlans(frame(OVER_VLAN, 10)[:16]) == ()  # cut inside the tag: none read


def test_the_vlan_devices_of_a_lab_by_name_and_id() -> None:
    from labctl.lab import load_lab

    lab = load_lab(str(ROOT / "labs" / "dual-stack-router.yaml")).to_dict()
    assert {g: vlan_ids(spec) for g, spec in lab["guests"].items()} == {
        "a": {"br0.10": 10}, "r": {"eth1.10": 10}, "b": {}}


def test_a_steps_inputs_keep_the_vlan_devices_and_the_tags_and_its_filter_keeps_the_journeys(tmp_path: Path) -> None:
    req = parse_frame(frame(OVER_VLAN, 10))
    assert req is not None
    wire = Wire({("a", "eth1"): {req.key(): [1]}}, {("a", "eth1")}, {("a", "eth1"): {req.key(): {10}}})
    data = json.loads(json.dumps(follow_inputs("icmp and vlan 10", ["a", "r"], TOPO, {}, wire, {}, {})))
    topo, back = read_inputs(data)
    assert topo.vlans == TOPO.vlans and back.tags == wire.tags
    d = tmp_path / FOLLOW_DIR
    d.mkdir()
    (d / FOLLOW_INPUTS).write_text(json.dumps({**data, "wire": [], "wire_tags": []}))
    for g in ("a", "r"):  # each guest's trace, as the probes print it
        lines = [f"  ping-301 [000] ..... {e.ts / 1e9:.6f}: {e.point}: " + " ".join(
            f"{k}={v}" for k, v in e.fields.items()) for e in _pings() if e.guest == g]
        (d / f"{g}.txt").write_text("\n".join(lines) + "\n")
    got = journeys_of(tmp_path)
    assert got is not None
    assert [j.header.describe()[:40] for j in got[0]] == ["ICMP echo-request 10.10.0.2 > 10.10.0.1 "]
    (d / FOLLOW_INPUTS).write_text(json.dumps({**data, "filter": "icmp"}))
    assert len(journeys_of(tmp_path)[0]) == 2  # type: ignore[index]


def test_an_address_on_another_vlan_is_not_on_this_one() -> None:
    other = v4("10.20.0.2", "10.20.0.1", 64, ECHO, ipid=13)
    topo = Topology(TOPO.nets, guests=TOPO.guests, vlans={**TOPO.vlans, ("a", "br0.20"): 20})
    events = _a_to_r(OVER_VLAN, ("br0.10", "br0", "eth1"), 0.0) + _a_to_r(other, ("br0.20", "br0", "eth1"), 10.0)
    assert [j.vlans for j in _journeys(events, None, topo=topo)] == [(10,), (20,)]
    assert [str(ipaddress.IPv4Address(j.header.saddr)) for j in _journeys(events, Vlan(20), topo=topo)] == [
        "10.20.0.2"]


OFF = {"skb_data": 208, "skb_head": 200, "skb_nh": 184, "skb_dev": 16, "dev_name": 0,
       "skb_protocol": 180}  # Debian's 6.1.0-56


def test_a_filter_with_vlan_reads_a_packet_inside_a_tag_in_the_frame_where_the_nic_leaves_it() -> None:
    from labctl.follow import vlanprobes

    assert vlanprobes.definitions("labctl_t", parse("icmp"), OFF) == ([], {})  # no vlan: no probe, no cost
    defs, filters = vlanprobes.definitions("labctl_t", parse("vlan 10 and icmp"), OFF)
    assert filters == {"netif_rx_q": "pr == 0x81 && et == 0x8 && vi >= 69 && vi <= 79 && proto == 1",
                       "xmit_q": "pr == 0x81 && et == 0x8 && vi >= 69 && vi <= 79 && proto == 1"}
    rx, tx = defs
    # on receive at the tag (the header 4 bytes on), on transmit after the Ethernet header and the tag (18)
    assert rx.startswith("e:labctl_t/netif_rx_q net.netif_receive_skb ") and "saddr=+16(+208($skbaddr)):u32" in rx
    assert rx.endswith(" pr=+180($skbaddr):u16 et=+2(+208($skbaddr)):u16 tci=+0(+208($skbaddr)):u16")
    assert tx.startswith("e:labctl_t/xmit_q net.net_dev_start_xmit ") and "saddr=+30(+208($skbaddr)):u32" in tx
    assert tx.endswith(" et=+16(+208($skbaddr)):u16 tci=+14(+208($skbaddr)):u16")
    _, filters = vlanprobes.definitions("labctl_t", parse("vlan and (icmp6 or arp host 10.10.0.1)"), OFF)
    assert filters["xmit6_q"] == "pr == 0x81 && et == 0xdd86 && vi >= 96 && vi <= 111 && nxt == 58"
    assert filters["netif_rx_arp_q"] == "pr == 0x81 && et == 0x608 && (spa == 0x1000a0a || tpa == 0x1000a0a)"
    assert sorted(filters) == ["netif_rx6_q", "netif_rx_arp_q", "xmit6_q", "xmit_arp_q"]  # no IPv4 probe


def test_a_hop_read_inside_a_tag_is_its_point_with_its_vlan() -> None:
    raw = OVER_VLAN
    # priority 7 and the drop-eligible bit set, VLAN 10, read little-endian: only the low 12 bits are the VID
    tci = str(int.from_bytes(struct.pack(">H", 0xF000 | 10), "little"))
    rx = ev("r", 2.0, "netif_rx", raw, dev="eth1")
    line = (f"  <idle>-0 [000] ..s1. 0.002000: netif_rx_q: (net.netif_receive_skb) skb={rx.skb} dev=\"eth1\" "
            + " ".join(f"{k}={v}" for k, v in rx.fields.items() if k not in ("skb", "dev")) + f" pr=129 et=8 tci={tci}")
    parsed = parse_line(line, "r")
    assert parsed is not None and parsed.point == "netif_rx" and parsed.fields["tci"] == tci
    assert identity(parsed) == identity(rx)
    events = _a_to_r(raw, ("eth1",), 0.0)  # no VLAN device known, no wire: the tag read is all there is
    events[-2] = parsed
    (j,) = _journeys(events, Vlan(10), topo=Topology(TOPO.nets, guests=TOPO.guests))
    assert j.vlans == (10,)
    assert [(h.guest, h.where, h.dev, h.note) for h in j.hops][2:4] == [
        ("a", "a.eth1 → r.eth1", None, ""), ("r", "netif_receive_skb", "eth1", "tagged VLAN 10 in the frame")]


# Recorded on real guests (tests/fixtures/follow55/vlan: test_follow_ipv6's 'vlan' step, labs/dual-stack-router.yaml
# on Debian's 6.1 under TCG): 'icmp and vlan 10' while a pinged r twice over VLAN 10 (10.10.0.1) and twice over the
# untagged network (10.1.0.1); every ICMP packet was recorded (vlan puts nothing into the kernel's filter)
FIX55 = ROOT / "tests" / "fixtures" / "follow55" / "vlan"
REQUEST = [("a", "net_dev_queue", "br0.10", "VLAN 10 on br0"), ("a", "net_dev_start_xmit", "br0.10", "VLAN 10 on br0"),
           ("a", "net_dev_queue", "br0", ""), ("a", "net_dev_start_xmit", "br0", ""),
           ("a", "net_dev_queue", "eth1", "port of br0"), ("a", "net_dev_start_xmit", "eth1", "port of br0"),
           ("a", "a.eth1 → r.eth1", None, "seen on the host side at both ends; tagged VLAN 10"),
           ("r", "netif_receive_skb", "eth1", "tagged VLAN 10 in the frame"), ("r", "ip_local_deliver", None, "")]
REPLY = [("r", "net_dev_queue", "eth1.10", "VLAN 10 on eth1"), ("r", "net_dev_start_xmit", "eth1.10", "VLAN 10 on eth1"),
         ("r", "net_dev_queue", "eth1", ""), ("r", "net_dev_start_xmit", "eth1", "tagged VLAN 10 in the frame"),
         ("r", "r.eth1 → a.eth1", None, "seen on the host side at both ends; tagged VLAN 10"),
         ("a", "netif_receive_skb", "eth1", "port of br0"), ("a", "netif_receive_skb", "br0", ""),
         ("a", "ip_local_deliver", None, ""), ("a", "skb_copy_datagram_iovec", None, "")]


def test_recorded_vlan_pings_are_kept_with_every_hop_and_the_untagged_ones_are_not(tmp_path: Path) -> None:
    got = journeys_of(FIX55)
    assert got is not None
    js, facts = got
    assert facts["filter"] == "icmp and vlan 10"
    assert [(j.id, j.header.describe().split(" id ")[0], j.vlans, j.end.kind) for j in js] == [
        (1, "ICMP echo-request 10.10.0.2 > 10.10.0.1", (10,), "answered"),
        (2, "ICMP echo-reply 10.10.0.1 > 10.10.0.2", (10,), "delivered"),
        (3, "ICMP echo-request 10.10.0.2 > 10.10.0.1", (10,), "answered"),
        (4, "ICMP echo-reply 10.10.0.1 > 10.10.0.2", (10,), "delivered")]
    for j in js:
        assert [(h.guest, h.where, h.dev, h.note) for h in j.hops] == (REQUEST if j.header.is_echo(1) else REPLY)
        assert j.out_of_order == 0
    # the same recording followed by 'icmp': the two untagged pings are there too, on no VLAN
    (tmp_path / FOLLOW_DIR).mkdir()
    for f in (FIX55 / FOLLOW_DIR).iterdir():
        (tmp_path / FOLLOW_DIR / f.name).write_bytes(f.read_bytes())
    data = json.loads((FIX55 / FOLLOW_DIR / FOLLOW_INPUTS).read_text())
    (tmp_path / FOLLOW_DIR / FOLLOW_INPUTS).write_text(json.dumps({**data, "filter": "icmp"}))
    every = journeys_of(tmp_path)
    assert every is not None
    untagged = [j for j in every[0] if not j.vlans]
    assert [j.header.describe().split(" id ")[0] for j in untagged] == [
        "ICMP echo-request 10.1.0.2 > 10.1.0.1", "ICMP echo-reply 10.1.0.1 > 10.1.0.2"] * 2
    assert all("VLAN" not in h.note for j in untagged for h in j.hops)
    assert len(every[0]) == 8


class _Tail:
    """A capture's tail that hands out its frames once."""

    def __init__(self, *frames: bytes) -> None:
        self.frames = list(frames)

    def read(self) -> list[object]:
        from types import SimpleNamespace

        out, self.frames = [SimpleNamespace(data=f, ts_us=int(time.time() * 1e6)) for f in self.frames], []
        return out


def _reader(*frames: bytes) -> Any:
    from types import SimpleNamespace

    from labctl.follow.follower import Unlooked

    return SimpleNamespace(tails={("a", "eth1"): _Tail(*frames)}, wire=Wire(), node=parse("vlan 10 and icmp"),
                           tunnels={}, wall_minus_mono=time.time_ns() - time.monotonic_ns(), _unlooked=Unlooked())


def test_a_frame_read_before_its_guest_events_is_still_on_the_wire_once_they_come() -> None:
    # live follow: the host side's frame is read on a tick where no journey is in flight yet (the guest's
    # events are still on their way through SSH); the next tick, with the journey, must still see it
    f = _reader(frame(OVER_VLAN, 10))
    Follower.read_wire(f, look=False)
    assert f.wire.seen[("a", "eth1")] == {}
    Follower.read_wire(f, look=True)
    (key,) = f.wire.seen[("a", "eth1")]
    assert f.wire.tags[("a", "eth1")][key] == {10}


def test_frames_nothing_was_in_flight_for_are_let_go_unparsed_after_a_while(monkeypatch: Any) -> None:
    from labctl.follow import follower

    f = _reader(frame(OVER_VLAN, 10))
    monkeypatch.setattr(follower, "UNLOOKED_NS", 0)
    Follower.read_wire(f, look=False)
    assert not f._unlooked.frames
    Follower.read_wire(f, look=True)
    assert f.wire.seen[("a", "eth1")] == {}
