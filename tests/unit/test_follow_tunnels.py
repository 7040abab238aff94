"""Following the inner packet through Geneve, GRE, GRETAP and IP in IP tunnels as through VXLAN: each
kind's framing (labctl.lab.tunnels.framing, in the kind's module), the probes it gives
(labctl.follow.tunnelprobes) and what their events mean (labctl.trace.encap, labctl.trace.hops), on
made-up lines of each framing and on a real run's traces (tests/fixtures/follow-tunnels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from labctl.follow import tunnelprobes
from labctl.lab import KINDS, Tunnel, load_lab_text
from labctl.pktfilter import parse as parse_filter
from labctl.trace import encap
from labctl.trace.hops import POINTS, identity, parse_line
from labctl.trace.journey import Journey
from labctl.trace.journeyfiles import journeys_of

OFF = {"skb_data": 208, "skb_head": 200, "skb_nh": 194, "skb_dev": 16, "dev_name": 0, "skb_protocol": 180}
LAB = """\
name: tun
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.2/24}]
    routes: [{to: 10.2.0.0/24, via: 10.1.0.1}]
    tunnels:
      gnv0: {type: geneve, vni: 7, remote: 10.2.0.2, dstport: 7000}
      tap0: {type: gretap, remote: 10.2.0.2, key: 5}
      gre1: {type: gre, remote: 10.2.0.2}
      tun0: {type: ipip, remote: 10.2.0.2}
      tun6: {type: ip6tnl, remote: "fd00:2::2"}
      wg0: {type: wireguard, peer: b.wg0, remote: 10.2.0.2, ip: 10.99.0.1/24}
  r:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.1/24}, {name: eth2, model: virtio, network: right, ip: 10.2.0.1/24}]
  b:
    nics: [{name: eth1, model: virtio, network: right, ip: [10.2.0.2/24, "fd00:2::2/64"]}]
    routes: [{to: 10.1.0.0/24, via: 10.2.0.1}]
    tunnels:
      gnv0: {type: geneve, vni: 7, remote: 10.1.0.2}
      wg0: {type: wireguard, peer: a.wg0, ip: 10.99.0.2/24}
"""


def _defs(guest: str) -> tuple[dict[str, str], dict[str, str]]:
    defs, filters = tunnelprobes.definitions("labctl_t", parse_filter("icmp"), OFF, load_lab_text(LAB, "lab.yaml").to_dict(),
                                             guest)
    return {d.split()[0].split("/")[1]: d for d in defs}, filters


def test_each_tunnel_of_ipv4_has_a_framing_that_its_options_choose() -> None:
    gre, tap = KINDS["gre"], KINDS["gretap"]
    keyed = Tunnel("t", "gretap", options=(("remote", "10.2.0.2"), ("key", "0")))  # key 0 is a key
    assert tap.framing(keyed) is not None and tap.framing(keyed).tag == "gtapk"  # type: ignore[union-attr]
    assert tap.framing(Tunnel("t", "gretap")).inner == 4 + 14  # type: ignore[union-attr]
    assert gre.framing(Tunnel("t", "gre", options=(("key", "5"),))).inner == 8  # type: ignore[union-attr]
    assert KINDS["ip6tnl"].framing(Tunnel("t", "ip6tnl")) is None
    wg = KINDS["wireguard"].framing(Tunnel("w", "wireguard"))
    assert wg is not None and wg.encrypted and wg.decap is None
    lab = tunnelprobes.framings(load_lab_text(LAB, "lab.yaml").to_dict())
    assert {tag: ports for tag, (_, ports) in lab.items()} == {"gnv": [6081, 7000], "gre": [], "gtapk": [], "ipip": [],
                                                               "wg": []}


def test_geneve_probes_read_after_8_bytes_of_header_and_guard_its_ports_and_first_word() -> None:
    defs, filters = _defs("a")
    xmit = defs["xmit_gnv"]
    assert "saddr=+76(+208($skbaddr)):u32" in xmit  # 14 + 20 + 8 (UDP) + 8 (Geneve) + 14 + 12: the inner source
    assert "odp=+36(+208($skbaddr)):u16 ohd=+42(+208($skbaddr)):u32 oid=+46(+208($skbaddr)):u32" in xmit
    # 6081 and 7000 in network order read little-endian; 00 00 65 58 (no options, Ethernet inside) so too
    assert filters["xmit_gnv"].endswith("&& opr == 17 && (odp == 49431 || odp == 22555) && ohd == 1483014144")
    assert defs["encap_gnv"].startswith("p:labctl_t/encap_gnv udp_tunnel_xmit_skb skb=%dx:x64")
    assert "saddr=+34(+208(%dx)):u32" in defs["encap_gnv"] and "ohd=+0(+208(%dx)):u32" in defs["encap_gnv"]
    assert defs["decap_gnv"].startswith("p:labctl_t/decap_gnv geneve_udp_encap_recv skb=%si:x64")
    assert "saddr=+42(+208(%si)):u32" in defs["decap_gnv"] and "oid=+12(+208(%si)):u32" in defs["decap_gnv"]


def test_gre_probes_read_after_its_header_of_4_or_8_bytes_as_the_key_makes_it() -> None:
    defs, filters = _defs("a")
    assert "saddr=+68(+208($skbaddr)):u32" in defs["xmit_gtapk"]  # 14 + 20 + 8 (GRE, key) + 14 + 12
    assert "oid=+38(+208($skbaddr)):u32" in defs["xmit_gtapk"]  # the key after flags and protocol
    assert "saddr=+50(+208($skbaddr)):u32" in defs["xmit_gre"] and "oid" not in defs["xmit_gre"]  # 14 + 20 + 4 + 12
    assert filters["ip_fwd_gtapk"].endswith("&& opr == 47 && ohd == 1483014176")  # 20 00 65 58: K, Ethernet
    assert filters["ip_fwd_gre"].endswith("&& opr == 47 && ohd == 524288")  # 00 00 08 00: no flag, IPv4
    # encapsulation in ip_tunnel_xmit (ipip's too: its 4th argument the outer protocol), decapsulation in ip_gre's gre_rcv
    assert "opr=%cx:u8 ohd=+0(+208(%di)):u32" in defs["encap_gtapk"] and "saddr=+34(+208(%di))" in defs["encap_gtapk"]
    assert filters["encap_gtapk"].endswith("&& opr == 47 && ohd == 1483014176")
    assert defs["decap_gre"].startswith("p:labctl_t/decap_gre ip_gre:gre_rcv skb=%di:x64")


def test_ipip_probes_read_right_after_the_outer_header_and_guard_its_protocol() -> None:
    defs, filters = _defs("a")
    assert "saddr=+46(+208($skbaddr)):u32" in defs["xmit_ipip"] and "ohd" not in defs["xmit_ipip"]
    assert filters["xmit_ipip"].endswith(") && opr == 4")
    assert "saddr=+12(+208(%di)):u32" in defs["encap_ipip"] and filters["encap_ipip"].endswith("&& opr == 4")
    assert defs["decap_ipip"].startswith("p:labctl_t/decap_ipip ipip:ipip_rcv skb=%di:x64") and not defs["decap_ipip"].endswith(" ")
    assert "decap_ipip" in filters and "opr" not in filters["decap_ipip"]


def test_wireguard_has_its_encapsulation_only_at_the_inner_header() -> None:
    defs, filters = _defs("a")
    assert defs["encap_wg"].startswith("p:labctl_t/encap_wg wg_xmit skb=%di:x64")
    assert "saddr=+12(+208(%di)):u32" in defs["encap_wg"] and filters["encap_wg"] == "vi >= 69 && vi <= 79 && proto == 1"


def test_a_guest_gets_encap_and_decap_of_its_own_tunnels_only() -> None:
    defs, _ = _defs("b")  # b has a Geneve and a WireGuard tunnel; its outer points follow every framing of the lab
    assert sorted(n for n in defs if n.startswith(("encap", "decap"))) == ["decap_gnv", "encap_gnv", "encap_wg"]
    assert {n.rpartition("_")[2] for n in defs} == {"gnv", "gre", "gtapk", "ipip", "wg"}
    assert [n for n in defs if n.endswith("_wg")] == ["encap_wg"]  # WireGuard's outer packet is not matched
    assert _defs("r")[0] and not any(n.startswith("encap") for n in _defs("r")[0])


def _line(event: str, place: str, fields: str, dev: str = "eth1") -> str:
    return (f"  <idle>-0 [000] ..s2. 601.000001: {event}: ({place}) skb=0xffff888005fa4b00 dev=\"{dev}\" "
            "vi=69 tl=84 id=21400 fo=64 ttl=64 proto=1 saddr=16820416 daddr=33597632 l4a=8 l4b=0 " + fields)


OUTER = "osa=33554698 oda=33554954"  # 10.1.0.2 > 10.2.0.2, read little-endian
CASES: list[tuple[str, str, str, str, str, str]] = [  # event, place, fields, point, where, note
    ("ip_fwd_gtapk", "ip_forward", f"{OUTER} opr=47 ohd=1483014176 oid=83886080", "ip_fwd", "ip_forward",
     "outer GRE 10.1.0.2 > 10.2.0.2 key 5"),
    ("xmit_gre", "net.net_dev_start_xmit", f"{OUTER} opr=47 ohd=524288", "xmit", "net_dev_start_xmit",
     "outer GRE 10.1.0.2 > 10.2.0.2"),
    ("netif_rx_gnv", "net.netif_receive_skb", f"{OUTER} opr=17 odp=49431 ohd=1483014144 oid=458752", "netif_rx",
     "netif_receive_skb", "outer Geneve 10.1.0.2 > 10.2.0.2 udp/6081 vni 7"),
    ("ip_local_ipip", "ip_local_deliver", f"{OUTER} opr=4", "ip_local", "ip_local_deliver", "outer IPIP 10.1.0.2 > 10.2.0.2"),
    ("encap_gnv", "udp_tunnel_xmit_skb", "ohd=1483014144 oid=458752", "encap", "udp_tunnel_xmit_skb", "Geneve vni 7"),
    ("decap_gnv", "geneve_udp_encap_recv", "ohd=1483014144 oid=458752", "decap", "geneve_udp_encap_recv", "Geneve vni 7"),
    ("encap_gtapk", "ip_tunnel_xmit", "opr=47 ohd=1483014176 oid=83886080", "encap", "ip_tunnel_xmit", "GRE key 5"),
    ("decap_gre", "ip_gre:gre_rcv", "ohd=524288", "decap", "gre_rcv", "GRE"),
    ("encap_ipip", "ip_tunnel_xmit", "opr=4", "encap", "ip_tunnel_xmit", "IPIP"),
    ("decap_ipip", "ipip:ipip_rcv", "", "decap", "ipip_rcv", "IPIP"),
    ("decap_vx", "vxlan_rcv", "ohd=8 oid=2752512", "decap", "vxlan_rcv", "VXLAN vni 42"),
    ("encap_wg", "wg_xmit", "", "encap", "wg_xmit", "WireGuard, encrypted"),
]


@pytest.mark.parametrize(("event", "place", "fields", "point", "where", "note"), CASES, ids=[c[0] for c in CASES])
def test_a_tunnel_event_is_its_point_at_its_function_with_the_tunnel_in_its_note(
        event: str, place: str, fields: str, point: str, where: str, note: str) -> None:
    ev = parse_line(_line(event, place, fields), "r")
    assert ev is not None and ev.point == point
    assert identity(ev) is not None  # the inner packet's: it joins its journey
    assert (encap.where(ev.point, ev.fields) or POINTS[ev.point].where) == where
    assert encap.note(ev.point, ev.fields) == note


def test_a_vxlan_event_of_before_still_reads() -> None:
    """A bundle's trace of before: VXLAN's VNI was ``ovni``, and encap and decap said no framing."""
    line = _line("xmit_vx", "net.net_dev_start_xmit", f"{OUTER} odp=46354 ovni=2752512")
    ev = parse_line(line, "a")
    assert ev is not None and encap.note(ev.point, ev.fields) == "outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"
    fields: dict[str, Any] = {"ovni": "2752512"}
    assert encap.note("encap", fields) == "VXLAN vni 42" and encap.where("encap", fields) is None


# --------------------------------------------------------------------------- a real run's traces

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "follow-tunnels"
"""The follow directory of the ``tunnels`` step of tests/integration/test_tunnels.py, recorded from a
real run of labs/vxlan-router.yaml on the image's Debian 6.1 kernel: a pings b once over gnv0, tap0
(GRETAP, key 5), gre1, tun0 (IP in IP) and wg0, followed with ``icmp and (host 192.168.7.2 or ...)``."""
HOPS = {  # each request's inner destination: its hops (guest, function, device, note), the wire's left out
    "192.168.7.2": [("a", "net_dev_queue", "gnv0", ""), ("a", "net_dev_start_xmit", "gnv0", ""),
                    ("a", "udp_tunnel_xmit_skb", "gnv0", "Geneve vni 7"),
                    *[(g, w, d, "outer Geneve 10.1.0.2 > 10.2.0.2 udp/6081 vni 7") for g, w, d in (
                        ("a", "net_dev_queue", "eth1"), ("a", "net_dev_start_xmit", "eth1"), ("r", "netif_receive_skb", "eth1"),
                        ("r", "ip_forward", None), ("r", "net_dev_queue", "eth2"), ("r", "net_dev_start_xmit", "eth2"),
                        ("b", "netif_receive_skb", "eth1"), ("b", "ip_local_deliver", None))],
                    ("b", "geneve_udp_encap_recv", "eth1", "Geneve vni 7"), ("b", "netif_receive_skb", "gnv0", ""),
                    ("b", "ip_local_deliver", None, "")],
    "192.168.9.2": [("a", "ip_tunnel_xmit", "gre1", "GRE"),  # an L3 device: no hop of its own before
                    *[(g, w, d, "outer GRE 10.1.0.2 > 10.2.0.2") for g, w, d in (
                        ("a", "net_dev_queue", "eth1"), ("a", "net_dev_start_xmit", "eth1"), ("r", "netif_receive_skb", "eth1"),
                        ("r", "ip_forward", None), ("r", "net_dev_queue", "eth2"), ("r", "net_dev_start_xmit", "eth2"),
                        ("b", "netif_receive_skb", "eth1"), ("b", "ip_local_deliver", None))],
                    ("b", "gre_rcv", "eth1", "GRE"), ("b", "netif_receive_skb", "gre1", ""), ("b", "ip_local_deliver", None, "")],
    "10.99.0.2": [("a", "wg_xmit", "wg0", "WireGuard, encrypted"), ("b", "netif_receive_skb", "wg0", ""),
                  ("b", "ip_local_deliver", None, "")],
}
VIA = {"192.168.5.2": ("ip_tunnel_xmit", "GRE key 5", "outer GRE 10.1.0.2 > 10.2.0.2 key 5", "gre_rcv"),
       "192.168.8.2": ("ip_tunnel_xmit", "IPIP", "outer IPIP 10.1.0.2 > 10.2.0.2", "ipip_rcv")}


def _recorded() -> list[Journey]:
    got = journeys_of(FIX / "tunnels")
    assert got is not None
    return got[0]


def test_a_real_runs_pings_over_each_tunnel_are_one_journey_each_way_answered_and_delivered() -> None:
    js = _recorded()
    assert [j.header.describe().rsplit(" id ", 1)[0] for j in js] == [
        f"ICMP echo-{kind} {a} > {b}" for x, y in (("192.168.7.1", "192.168.7.2"), ("192.168.5.1", "192.168.5.2"),
                                                   ("192.168.9.1", "192.168.9.2"), ("192.168.8.1", "192.168.8.2"),
                                                   ("10.99.0.1", "10.99.0.2"))
        for kind, a, b in (("request", x, y), ("reply", y, x))]
    assert [j.end.kind for j in js] == ["answered", "delivered"] * 5
    wires = [[h.note for h in j.hops if h.point == "wire"] for j in js]  # the captures keyed by the inner header
    assert wires == [["seen on the host side at both ends"] * 2] * 8 + [[""], [""]]  # WireGuard's: not matched


@pytest.mark.parametrize("dst", sorted(HOPS))
def test_a_real_runs_request_has_its_tunnels_hops_in_order(dst: str) -> None:
    (j,) = [j for j in _recorded() if j.header.describe().startswith("ICMP echo-request") and f"> {dst} " in j.header.describe()]
    assert [(h.guest, h.where, h.dev, h.note) for h in j.hops if h.point != "wire"] == HOPS[dst]


@pytest.mark.parametrize("dst", sorted(VIA))
def test_a_real_runs_gretap_and_ipip_go_through_r_with_their_outer_header(dst: str) -> None:
    enc, enc_note, outer, dec = VIA[dst]
    (j,) = [j for j in _recorded() if j.header.describe().startswith("ICMP echo-request") and f"> {dst} " in j.header.describe()]
    hops = [(h.guest, h.point, h.where, h.note) for h in j.hops if h.point != "wire"]
    assert ("a", "encap", enc, enc_note) in hops and ("b", "decap", dec, enc_note) in hops
    assert [h[3] for h in hops if h[0] == "r"] == [outer] * 4
    assert hops.index(("a", "encap", enc, enc_note)) < hops.index(("r", "ip_fwd", "ip_forward", outer)) < hops.index(
        ("b", "decap", dec, enc_note))


def _frame(outer_proto: int, header: bytes, inner_eth: bool) -> bytes:
    """An Ethernet frame from 10.1.0.2 to 10.2.0.2 carrying ``header`` then an ICMP echo 192.168.5.1 > 192.168.5.2."""
    inner = bytes([0x45, 0, 0, 84, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0, 192, 168, 5, 1, 192, 168, 5, 2, 8, 0, 0, 0, 1, 2, 0, 1])
    outer = bytes([0x45, 0, 0, 0, 0, 0, 0, 0, 63, outer_proto, 0, 0, 10, 1, 0, 2, 10, 2, 0, 2])
    return b"\x02" * 12 + b"\x08\x00" + outer + header + (b"\x04" * 12 + b"\x08\x00" if inner_eth else b"") + inner


def test_the_wire_captures_read_a_tunnels_frame_by_its_inner_header() -> None:
    lab = tunnelprobes.framings(load_lab_text(LAB, "lab.yaml").to_dict())
    gretap = _frame(47, bytes.fromhex("20006558 00000005"), inner_eth=True)
    h = tunnelprobes.inner_header(gretap, lab)
    assert h is not None and (h.saddr, h.daddr, h.ipid) == (0xC0A80501, 0xC0A80502, 0x1234)
    assert tunnelprobes.inner_header(_frame(47, bytes.fromhex("00006558"), inner_eth=True), lab) is None  # no key: not the lab's
    assert tunnelprobes.inner_header(_frame(47, bytes.fromhex("00000800"), inner_eth=False), lab) is not None  # gre1's
    assert tunnelprobes.inner_header(_frame(4, b"", inner_eth=False), lab) is not None
    udp = bytes.fromhex("c35017c1 00000000")  # to 6081
    assert tunnelprobes.inner_header(_frame(17, udp + bytes.fromhex("00006558 00000700"), inner_eth=True), lab) is not None
    assert tunnelprobes.inner_header(_frame(17, bytes.fromhex("c35012b5 00000000 00006558 00000700"), inner_eth=True),
                                     lab) is None  # to 4789: the lab has no VXLAN tunnel
    assert tunnelprobes.inner_header(_frame(1, b"", inner_eth=False), lab) is None
    node = parse_filter("icmp and host 192.168.5.2")
    h = tunnelprobes.frame_header(gretap, node, lab)  # the outer header does not match: the inner one does
    assert h is not None and h.daddr == 0xC0A80502 and tunnelprobes.frame_header(gretap, node, {}) is None
    assert tunnelprobes.frame_header(gretap, parse_filter("host 10.2.0.2"), lab) is not None  # its own header
