"""Following the inner packet through Geneve, GRE, GRETAP and IP in IP tunnels as through VXLAN: each
kind's framing (labctl.lab.tunnels.framing, in the kind's module), the probes it gives
(labctl.follow.tunnelprobes) and what their events mean (labctl.trace.encap, labctl.trace.hops), on
made-up lines of each framing and on a real run's traces (tests/fixtures/follow-tunnels)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest

from labctl.follow import tunnelprobes
from labctl.follow.follower import WIRE_SNAPLEN
from labctl.lab import KINDS, Tunnel, load_lab_text
from labctl.pktfilter import parse as parse_filter
from labctl.trace import encap
from labctl.trace.clocks import Clock
from labctl.trace.hops import POINTS, identity, parse_line
from labctl.trace.journey import Correlator
from labctl.trace.journeyfiles import journeys_of
from labctl.trace.pathmodel import Journey, Topology

OFF = {"skb_data": 208, "skb_head": 200, "skb_nh": 194, "skb_dev": 16, "dev_name": 0, "skb_protocol": 180}
LAB = """\
name: tun
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: [10.1.0.2/24, "fd00:1::2/64"]}]
    routes: [{to: 10.2.0.0/24, via: 10.1.0.1}]
    tunnels:
      gnv0: {type: geneve, vni: 7, remote: 10.2.0.2, dstport: 7000}
      tap0: {type: gretap, remote: 10.2.0.2, key: 5}
      gre1: {type: gre, remote: 10.2.0.2}
      tun0: {type: ipip, remote: 10.2.0.2}
      tun6: {type: ip6tnl, remote: "fd00:2::2", local: "fd00:1::2"}
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


def _router_and_a(flt: str = "icmp") -> tuple[dict[str, str], dict[str, str]]:
    """r's outer probes (it forwards every framing's packets) with a's encapsulation and decapsulation."""
    (rd, rf), (ad, af) = (_defs_of(LAB, flt, g) for g in ("r", "a"))
    return {**rd, **ad}, {**rf, **af}


def test_each_tunnel_of_ipv4_has_a_framing_that_its_options_choose() -> None:
    gre, tap = KINDS["gre"], KINDS["gretap"]
    keyed = Tunnel("t", "gretap", options=(("remote", "10.2.0.2"), ("key", "0")))  # key 0 is a key
    assert tap.framing(keyed) is not None and tap.framing(keyed).tag == "gtapk"  # type: ignore[union-attr]
    assert tap.framing(Tunnel("t", "gretap")).inner == 4 + 14  # type: ignore[union-attr]
    assert gre.framing(Tunnel("t", "gre", options=(("key", "5"),))).inner == 8  # type: ignore[union-attr]
    six = KINDS["ip6tnl"]  # its mode says what it carries: both in the kernel's default, any
    assert [f.tag for f in six.framings_of(Tunnel("t", "ip6tnl"))] == ["ip4in6", "ip6in6"]
    assert [f.tag for f in six.framings_of(Tunnel("t", "ip6tnl", options=(("mode", "ipip6"),)))] == ["ip4in6"]
    assert [f.tag for f in six.framings_of(Tunnel("t", "ip6tnl", options=(("mode", "ip6ip6"),)))] == ["ip6in6"]
    wg = KINDS["wireguard"].framing(Tunnel("w", "wireguard"))
    assert wg is not None and wg.encrypted and wg.decap is not None and wg.decap.function == "wg_allowedips_lookup_src"
    lab = tunnelprobes.framings(load_lab_text(LAB, "lab.yaml").to_dict())
    assert {tag: ports for tag, (_, ports) in lab.items()} == {"gnv": [6081, 7000], "gre": [], "gtapk": [], "ipip": [],
                                                               "ip4in6": [], "ip6in6": [], "wg": []}


def test_geneve_probes_read_after_8_bytes_of_header_and_guard_its_ports_and_first_word() -> None:
    defs, filters = _router_and_a()
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
    defs, filters = _router_and_a()
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
    defs, filters = _router_and_a()
    assert "saddr=+46(+208($skbaddr)):u32" in defs["xmit_ipip"] and "ohd" not in defs["xmit_ipip"]
    assert filters["xmit_ipip"].endswith(") && opr == 4")
    assert "saddr=+12(+208(%di)):u32" in defs["encap_ipip"] and filters["encap_ipip"].endswith("&& opr == 4")
    assert defs["decap_ipip"].startswith("p:labctl_t/decap_ipip ipip:ipip_rcv skb=%di:x64") and not defs["decap_ipip"].endswith(" ")
    assert "decap_ipip" in filters and "opr" not in filters["decap_ipip"]


def test_wireguard_has_its_encapsulation_and_decapsulation_at_the_inner_header() -> None:
    defs, filters = _defs("a")
    assert defs["encap_wg"].startswith("p:labctl_t/encap_wg wg_xmit skb=%di:x64")
    assert "saddr=+12(+208(%di)):u32" in defs["encap_wg"] and filters["encap_wg"] == "vi >= 69 && vi <= 79 && proto == 1"
    # decrypted: the skb (the 2nd argument) at the inner header, on the tunnel's device
    assert defs["decap_wg"].startswith("p:labctl_t/decap_wg wg_allowedips_lookup_src skb=%si:x64 dev=+0(+16(%si)):string")
    assert "saddr=+12(+208(%si)):u32" in defs["decap_wg"] and filters["decap_wg"] == "vi >= 69 && vi <= 79 && proto == 1"
    ev = parse_line("  <idle>-0 [000] ..s2. 601.000001: decap_wg: (wg_allowedips_lookup_src) skb=0xffff888005fa4b00 "
                    'dev="wg0" vi=69 tl=84 id=21400 fo=64 ttl=64 proto=1 saddr=16820416 daddr=33597632 l4a=8 l4b=0', "b")
    assert ev is not None and ev.point == "decap" and encap.note(ev.point, ev.fields) == "WireGuard, decrypted"
    assert encap.where(ev.point, ev.fields) == "wg_allowedips_lookup_src"


def test_a_guest_gets_encap_and_decap_of_its_own_tunnels_only() -> None:
    defs, _ = _defs("b")  # b has a Geneve and a WireGuard tunnel; its outer points follow every framing of the lab
    assert sorted(n for n in defs if n.startswith(("encap", "decap"))) == ["decap_gnv", "decap_wg", "encap_gnv", "encap_wg"]
    assert {n.rpartition("_")[2] for n in defs} == {"gnv", "gre", "gtapk", "ipip", "ip4in6", "wg"}  # IPv4 inside
    # its own framing's outer packet only where it forwards one for others; every point for the others
    assert sorted(n for n in defs if n.endswith("_gnv") and not n.startswith(("encap", "decap", "drop"))) == [
        "ip_fwd_gnv", "netif_rx_gnv", "xmit_gnv"]  # the wire's ends and what it forwards for others
    assert sorted(n for n in defs if n.endswith("_gre") and not n.startswith("drop")) == [
        f"{p}_gre" for p in sorted(tunnelprobes.ALL)]
    assert sorted(n for n in _defs("r")[0] if n.endswith("_gnv") and not n.startswith("drop")) == [
        f"{p}_gnv" for p in sorted(tunnelprobes.ALL)]
    # wherever the outer packet is dropped, every guest: received (at its IPv4 header), on its way out, delivered
    assert {n for n in _defs("r")[0] if n.startswith("drop")} == {f"{d}_{t}" for d in ("drop", "drop_tx", "drop_pulled")
                                                                  for t in ("gnv", "gtapk", "gre", "ipip", "ip4in6")}
    assert [n for n in defs if n.endswith("_wg")] == ["encap_wg", "decap_wg"]  # WireGuard's outer packet is not matched
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


# --------------------------------------------------------------------------- an inner IPv6 or ARP packet

VX_LAB = """\
name: vx6
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.2/24}]
    routes: [{to: 10.2.0.0/24, via: 10.1.0.1}]
    tunnels:
      vx0: {type: vxlan, vni: 42, remote: 10.2.0.2, dev: eth1, ip: [192.168.42.1/24, "fd00:42::1/64"]}
  r:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.1/24}, {name: eth2, model: virtio, network: right, ip: 10.2.0.1/24}]
  b:
    nics: [{name: eth1, model: virtio, network: right, ip: 10.2.0.2/24}]
    routes: [{to: 10.1.0.0/24, via: 10.2.0.1}]
    tunnels:
      vx0: {type: vxlan, vni: 42, remote: 10.1.0.2, dev: eth1, ip: [192.168.42.2/24, "fd00:42::2/64"]}
"""
FETCH = re.compile(r"(\w+)=\+(\d+)\(\+208\(\$skbaddr\)\):u(8|16|32)\b")


def _checksum(data: bytes) -> int:
    total = sum(int.from_bytes(data[i:i + 2].ljust(2, b"\0"), "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _vxlan_frame(etype: int = 0x86DD) -> bytes:
    """What a's eth1 sends for ``ping fd00:42::2`` over vx0: Ethernet, IPv4 10.1.0.2 > 10.2.0.2 (DF, its
    checksum), UDP to 4789, VXLAN (VNI 42), the inner Ethernet header (``etype``), IPv6 fd00:42::1 >
    fd00:42::2, an ICMPv6 echo request id 7 seq 1 (56 bytes of data) with its checksum."""
    src, dst = ipaddress.IPv6Address("fd00:42::1").packed, ipaddress.IPv6Address("fd00:42::2").packed
    echo = bytes([128, 0, 0, 0, 0, 7, 0, 1]) + b"labctl6!" * 7  # ping's 56 bytes
    pseudo = src + dst + len(echo).to_bytes(4, "big") + bytes([0, 0, 0, 58])
    echo = echo[:2] + _checksum(pseudo + echo).to_bytes(2, "big") + echo[4:]
    ipv6 = bytes([0x60, 0, 0, 0]) + len(echo).to_bytes(2, "big") + bytes([58, 64]) + src + dst + echo
    inner = bytes.fromhex("be5e00000002 be5e00000001") + etype.to_bytes(2, "big") + ipv6
    vxlan = bytes.fromhex("08000000 00002a00")
    udp = (54321).to_bytes(2, "big") + (4789).to_bytes(2, "big") + (8 + len(vxlan) + len(inner)).to_bytes(2, "big") + b"\0\0"
    outer = bytearray(bytes([0x45, 0]) + (20 + len(udp) + len(vxlan) + len(inner)).to_bytes(2, "big")
                      + bytes.fromhex("1c46 4000 40 11 0000 0a010002 0a020002"))
    outer[10:12] = _checksum(bytes(outer)).to_bytes(2, "big")
    return bytes.fromhex("525400000101 525400000102 0800") + bytes(outer) + udp + vxlan + inner


def _fires(definition: str, filt: str, frame: bytes) -> bool:
    """Whether a probe at ``skb->data`` at the frame's Ethernet header (``net_dev_start_xmit`` on r's
    eth2) records the frame: its fetches read as the kernel reads them (little-endian), its filter so
    evaluated (a field the probe does not fetch is a NameError: the kernel would refuse the filter)."""
    fields = {n: int.from_bytes(frame[int(at):int(at) + int(bits) // 8], "little") for n, at, bits in FETCH.findall(definition)}
    expr = filt.replace("&&", " and ").replace("||", " or ").replace("!(", " not (")
    return bool(eval(expr, {"__builtins__": {}}, fields))  # our own filter: numbers and names


def _vx(flt: str, guest: str = "r") -> tuple[dict[str, str], dict[str, str]]:
    defs, filters = tunnelprobes.definitions("labctl_t", parse_filter(flt), OFF, load_lab_text(VX_LAB, "lab.yaml").to_dict(),
                                             guest)
    return {d.split()[0].split("/")[1]: d for d in defs}, filters


def test_an_ipv6_filter_gets_each_framings_inner_ipv6_probes_guarded_by_the_inner_ethertype() -> None:
    defs, filters = _router_and_a("icmp6")
    assert sorted(n for n in defs if n.startswith("xmit")) == ["xmit6_gnv", "xmit6_gre", "xmit6_gtapk",
                                                               "xmit6_ip6in6"]  # not IPv4's IP in IP
    assert sorted(n for n in defs if n.startswith(("encap", "decap"))) == [
        "decap6_gnv", "decap6_gre", "decap6_gtapk", "decap6_ip6in6", "decap6_wg", "encap6_gnv", "encap6_gre",
        "encap6_gtapk", "encap6_ip6in6", "encap6_wg"]
    # Geneve: the inner IPv6 header after 14 + 20 + 8 + 8 + 14 bytes, its EtherType 2 bytes before, fetched as pr
    assert "vi=+64(+208($skbaddr)):u8" in defs["xmit6_gnv"] and "s6a=+72(+208($skbaddr)):u32" in defs["xmit6_gnv"]
    assert "pr=+62(+208($skbaddr)):u16" in defs["xmit6_gnv"] and filters["xmit6_gnv"].startswith("(pr == 0xdd86 && vi >= 96")
    assert filters["xmit6_gnv"].endswith("&& opr == 17 && (odp == 49431 || odp == 22555) && ohd == 1483014144")
    assert "pr=+54(+208($skbaddr)):u16" in defs["xmit6_gtapk"]  # GRETAP: 14 + 20 + 8 (GRE, key) + 12
    # GRE: the protocol field is the EtherType, in the header's first word (00 00 86 dd)
    assert "pr=+36(+208($skbaddr)):u16" in defs["xmit6_gre"] and filters["xmit6_gre"].endswith("&& opr == 47 && ohd == 3716546560")
    assert "pr=+2(+208(%di)):u16" in defs["decap6_gre"] and filters["decap6_gre"].endswith("&& ohd == 3716546560")
    assert "pr=+180(%di):u16" in defs["encap6_wg"]  # WireGuard: the skb's own protocol, at the inner header
    assert all("pr == 0xdd86" in filters[n] for n in defs)
    arp, arp_filters = _router_and_a("arp")  # ARP inside the Ethernet-carrying framings only
    assert sorted(n for n in arp if n.startswith("xmit")) == ["xmit_arp_gnv", "xmit_arp_gtapk"]
    assert "op=+70(+208($skbaddr)):u16" in arp["xmit_arp_gnv"] and "pr=+62(+208($skbaddr)):u16" in arp["xmit_arp_gnv"]
    assert arp_filters["xmit_arp_gnv"].startswith("(pr == 0x608) && opr == 17")
    assert {n for n in _router_and_a()[0] if n.startswith("xmit")} == {
        "xmit_gnv", "xmit_gre", "xmit_gtapk", "xmit_ipip", "xmit_ip4in6"}  # IPv4's as before: no IPv6 or ARP probe


def _defs_of(text: str, flt: str, guest: str) -> tuple[dict[str, str], dict[str, str]]:
    defs, filters = tunnelprobes.definitions("labctl_t", parse_filter(flt), OFF, load_lab_text(text, "lab.yaml").to_dict(),
                                             guest)
    return {d.split()[0].split("/")[1]: d for d in defs}, filters


def test_an_inner_ipv6_event_is_its_point_with_the_outer_header_in_its_note() -> None:
    six = ("vi=96 plen=4096 nxt=58 hl=64 s6a=1107296509 s6b=0 s6c=0 s6d=16777216 d6a=1107296509 d6b=0 d6c=0 d6d=33554432 "
           "l4a=128 l4b=16779008")
    line = (f"  <idle>-0 [000] ..s2. 601.000001: ip_fwd6_vx: (ip_forward) skb=0xffff888005fa4b00 {six} {OUTER} opr=17 "
            "odp=46354 pr=56710 ohd=8 oid=2752512")
    ev = parse_line(line, "r")
    assert ev is not None and ev.point == "ip_fwd" and ev.fields["outer"] == "vx"
    h = identity(ev)
    assert h is not None and h.describe() == "ICMPv6 echo-request fd00:42::1 > fd00:42::2 id 7 seq 1"
    assert encap.note(ev.point, ev.fields) == "outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"
    dec = parse_line(f"  <idle>-0 [000] ..s2. 601.000002: decap6_vx: (vxlan_rcv) skb=0xffff888005fa4b00 dev=\"eth1\" {six} "
                     "pr=56710 ohd=8 oid=2752512", "b")
    assert dec is not None and dec.point == "decap" and encap.note(dec.point, dec.fields) == "VXLAN vni 42"
    assert encap.where(dec.point, dec.fields) == "vxlan_rcv" and identity(dec) is not None
    arp = parse_line("  <idle>-0 [000] ..s2. 601.000003: xmit_arp_gtapk: (net.net_dev_start_xmit) skb=0xffff888005fa4b00 "
                     f"dev=\"eth1\" op=256 sha=0 shb=0 spa=16820416 tha=0 thb=0 tpa=33597632 {OUTER} opr=47 pr=1544 "
                     "ohd=1483014176 oid=83886080", "a")
    assert arp is not None and arp.point == "xmit" and identity(arp) is not None
    assert encap.note(arp.point, arp.fields) == "outer GRE 10.1.0.2 > 10.2.0.2 key 5"


def test_the_wire_captures_read_a_vxlan_frames_inner_ipv6_packet() -> None:
    lab = tunnelprobes.framings(load_lab_text(VX_LAB, "lab.yaml").to_dict())
    frame = _vxlan_frame()
    h = tunnelprobes.inner_header(frame, lab)
    assert h is not None and h.family == 6
    assert h.describe() == "ICMPv6 echo-request fd00:42::1 > fd00:42::2 id 7 seq 1" and h.ttl == 64
    assert tunnelprobes.frame_header(frame, parse_filter("icmp6 and host fd00:42::2"), lab) == h
    assert tunnelprobes.frame_header(frame, parse_filter("udp and host 10.2.0.2"), lab) is not None  # its own header
    assert tunnelprobes.frame_header(frame, parse_filter("icmp6 and host fd00:42::9"), lab) is None
    assert len(frame) > WIRE_SNAPLEN and tunnelprobes.inner_header(frame[:WIRE_SNAPLEN], lab) == h  # as captured


def test_the_probes_record_a_vxlan_frames_inner_ipv6_packet_and_only_as_ipv6() -> None:
    defs, filters = _vx("icmp6 and host fd00:42::2")
    frame = _vxlan_frame()
    assert _fires(defs["xmit6_vx"], filters["xmit6_vx"], frame)
    other_port = frame[:36] + (8472).to_bytes(2, "big") + frame[38:]  # not the lab's VXLAN port
    assert not _fires(defs["xmit6_vx"], filters["xmit6_vx"], other_port)
    v4, v4_filters = _vx("icmp or arp")
    assert not _fires(v4["xmit_vx"], v4_filters["xmit_vx"], frame) and not _fires(v4["xmit_arp_vx"], v4_filters["xmit_arp_vx"], frame)


def test_an_inner_frame_of_another_ethertype_is_not_read_as_ipv6() -> None:
    """The inner frame's EtherType is the guard, not the bytes after it: an IPv6-looking packet in a
    frame of another EtherType (0x88B5, for experiments) is neither recorded nor keyed on the wire."""
    lab = tunnelprobes.framings(load_lab_text(VX_LAB, "lab.yaml").to_dict())
    defs, filters = _vx("icmp6 and host fd00:42::2")
    other = _vxlan_frame(etype=0x88B5)
    assert tunnelprobes.inner_header(other, lab) is None
    assert tunnelprobes.frame_header(other, parse_filter("icmp6"), lab) is None
    for name in ("dev_queue6_vx", "xmit6_vx"):
        assert not _fires(defs[name], filters[name], other)
        assert _fires(defs[name], filters[name], _vxlan_frame())


def test_a_dropped_outer_packet_is_the_inner_packets_drop_with_the_outer_header_in_its_note() -> None:
    """An nft rule on r drops the VXLAN packet it forwards: the drop probe reads the inner header past
    the outer one (at skb->data there), so the drop joins the ping's journey, its end said with the outer header."""
    defs, filters = _vx("icmp", "r")
    drop = defs["drop_vx"]
    assert drop.startswith("e:labctl_t/drop_vx skb.kfree_skb skb=$skbaddr:x64 dev=")
    assert "saddr=+62(+208($skbaddr)):u32" in drop and drop.endswith("reason=$reason:u32 loc=$location:symbol")
    assert "saddr=+76(+208($skbaddr)):u32" in defs["drop_tx_vx"] and "saddr=+42(+208($skbaddr)):u32" in defs["drop_pulled_vx"]
    assert filters["drop_vx"].endswith("&& opr == 17 && (odp == 46354) && ohd == 8")
    inner = "vi=69 tl=84 id=21400 fo=64 ttl=63 proto=1 saddr=19572928 daddr=36350144 l4a=8 l4b=16777216"  # .42.1 > .42.2
    lines = [(f"  <idle>-0 [000] ..s2. 601.000001: netif_rx_vx: (net.netif_receive_skb) skb=0xffff888005fa4b00 "
              f'dev="eth1" {inner} {OUTER} opr=17 odp=46354 ohd=8 oid=2752512'),
             (f"  <idle>-0 [000] ..s2. 601.000101: ip_fwd_vx: (ip_forward) skb=0xffff888005fa4b00 {inner} {OUTER} "
              "opr=17 odp=46354 ohd=8 oid=2752512"),
             (f"  <idle>-0 [000] ..s2. 601.000201: drop_vx: (skb.kfree_skb) skb=0xffff888005fa4b00 dev=\"eth1\" {inner} "
              f"{OUTER} opr=17 odp=46354 ohd=8 oid=2752512 reason=7 loc=nft_do_chain+0x3c/0x420 [nf_tables]")]
    events = [parse_line(x, "r") for x in lines]
    assert all(e is not None for e in events)
    ev = events[2]
    assert ev is not None and ev.point == "drop" and ev.fields["outer"] == "vx"
    h = identity(ev)
    assert h is not None and h.describe().startswith("ICMP echo-request 192.168.42.1 > 192.168.42.2")
    assert encap.note(ev.point, ev.fields) == "outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"
    corr = Correlator(Topology(guests=("r",)), {"r": Clock()})
    for e in events:
        assert e is not None
        corr.add(e)
    (j,) = corr.settle()
    assert j.end.kind == "dropped" and j.end.guest == "r" and j.end.text == (
        "dropped on r at nft_do_chain+0x3c/0x420 [nf_tables] for NETFILTER_DROP "
        "(its outer packet, VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42)"), j.end
    assert [x.point for x in j.hops] == ["netif_rx", "ip_fwd"]


# --------------------------------------------------------------------------- an outer IPv6 header

VX6_LAB = """\
name: vx6u
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: [10.1.0.2/24, "fd00:1::2/64"]}]
    routes: [{to: "fd00:2::/64", via: "fd00:1::1"}]
    tunnels:
      vx6: {type: vxlan, vni: 46, remote: "fd00:2::2", ip: 192.168.46.1/24}
      gnv6: {type: geneve, vni: 8, remote: "fd00:2::2", ip: 192.168.48.1/24}
  r:
    nics: [{name: eth1, model: virtio, network: left, ip: [10.1.0.1/24, "fd00:1::1/64"]},
           {name: eth2, model: virtio, network: right, ip: [10.2.0.1/24, "fd00:2::1/64"]}]
  b:
    nics: [{name: eth1, model: virtio, network: right, ip: [10.2.0.2/24, "fd00:2::2/64"]}]
    routes: [{to: "fd00:1::/64", via: "fd00:2::1"}]
    tunnels:
      vx6: {type: vxlan, vni: 46, remote: "fd00:1::2", ip: 192.168.46.2/24}
      gnv6: {type: geneve, vni: 8, remote: "fd00:1::2", ip: 192.168.48.2/24}
"""


def _vxlan6_frame(vni: int = 46, port: int = 4789) -> bytes:
    """What a's eth1 sends for ``ping 192.168.46.2`` over vx6: Ethernet, IPv6 fd00:1::2 > fd00:2::2
    (next header UDP), UDP to ``port``, VXLAN (``vni``), the inner Ethernet header, IPv4 192.168.46.1 >
    192.168.46.2, an ICMP echo request id 7 seq 1."""
    echo = bytes([8, 0, 0, 0, 0, 7, 0, 1]) + b"labctl4!" * 7
    echo = echo[:2] + _checksum(echo).to_bytes(2, "big") + echo[4:]
    ip = bytearray(bytes([0x45, 0]) + (20 + len(echo)).to_bytes(2, "big") + bytes.fromhex("1234 4000 40 01 0000 c0a82e01 c0a82e02"))
    ip[10:12] = _checksum(bytes(ip)).to_bytes(2, "big")
    inner = bytes.fromhex("be5e00000002 be5e00000001 0800") + bytes(ip) + echo
    vxlan = bytes.fromhex("08000000") + (vni << 8).to_bytes(4, "big")
    udp = (54321).to_bytes(2, "big") + port.to_bytes(2, "big") + (8 + len(vxlan) + len(inner)).to_bytes(2, "big") + b"\0\0"
    payload = udp + vxlan + inner
    outer = (bytes([0x60, 0, 0, 0]) + len(payload).to_bytes(2, "big") + bytes([17, 64])
             + ipaddress.IPv6Address("fd00:1::2").packed + ipaddress.IPv6Address("fd00:2::2").packed)
    return bytes.fromhex("525400000101 525400000102 86dd") + outer + payload


def test_a_vxlan_or_geneve_tunnel_to_an_ipv6_remote_has_the_outer_ipv6_framing() -> None:
    vx, gnv = KINDS["vxlan"], KINDS["geneve"]
    six = vx.framing(Tunnel("t", "vxlan", options=(("vni", "1"), ("remote", "fd00:2::2"))))
    assert six is not None and (six.tag, six.outer, six.outer_len, six.encap.function) == ("vx6", 6, 40, "udp_tunnel6_xmit_skb")
    assert vx.framing(Tunnel("t", "vxlan", options=(("vni", "1"), ("group", "ff05::42")))).tag == "vx6"  # type: ignore[union-attr]
    assert vx.framing(Tunnel("t", "vxlan", options=(("vni", "1"), ("remote", "10.2.0.2")))).tag == "vx"  # type: ignore[union-attr]
    g6 = gnv.framing(Tunnel("t", "geneve", options=(("vni", "1"), ("remote", "fd00:2::2"))))
    assert g6 is not None and g6.tag == "gnv6" and g6.decap is not None and g6.decap.function == "geneve_udp_encap_recv"
    assert gnv.framing(Tunnel("t", "geneve", options=(("vni", "1"), ("remote", "10.2.0.2")))).tag == "gnv"  # type: ignore[union-attr]
    lab = tunnelprobes.framings(load_lab_text(VX6_LAB, "lab.yaml").to_dict())
    assert {tag: ports for tag, (_, ports) in lab.items()} == {"vx6": [4789], "gnv6": [6081]}


def test_the_probes_of_an_outer_ipv6_header_read_past_its_40_bytes_at_ipv6s_own_points() -> None:
    defs, filters = _defs_of(VX6_LAB, "icmp", "r")
    assert sorted(n for n in defs if n.endswith("_vx6")) == sorted(
        [f"{p}_vx6" for p in tunnelprobes.ALL6] + ["drop_vx6", "drop_tx_vx6", "drop_pulled_vx6"])
    xmit = defs["xmit_vx6"]
    assert "saddr=+96(+208($skbaddr)):u32" in xmit  # 14 + 40 + 8 (UDP) + 8 (VXLAN) + 14 + 12: the inner source
    assert "os6a=+22(+208($skbaddr)):u32" in xmit and "od6d=+50(+208($skbaddr)):u32" in xmit
    assert "opr=+20(+208($skbaddr)):u8" in xmit and "odp=+56(+208($skbaddr)):u16" in xmit  # next header; UDP's port
    assert filters["xmit_vx6"].endswith("&& opr == 17 && (odp == 46354) && ohd == 8")
    assert defs["ip6_fwd_vx6"].startswith("p:labctl_t/ip6_fwd_vx6 ip6_forward skb=%di:x64")
    assert "saddr=+82(+208(%di)):u32" in defs["ip6_fwd_vx6"]
    assert "saddr=+42(+208($skbaddr)):u32" in defs["drop_pulled_vx6"]  # delivered: its 40 bytes pulled
    frame = _vxlan6_frame()
    for name in ("xmit_vx6", "dev_queue_vx6"):
        assert _fires(defs[name], filters[name], frame)
        assert not _fires(defs[name], filters[name], _vxlan6_frame(port=4790))  # not the lab's port
    assert not _fires(defs["xmit_gnv6"], filters["xmit_gnv6"], frame)  # VXLAN's header is not Geneve's
    own, _ = _defs_of(VX6_LAB, "icmp", "a")  # a's own: the wire's ends and IPv6's forward, its encap and decap
    assert sorted(n for n in own if n.endswith("_vx6") and not n.startswith("drop")) == [
        "decap_vx6", "encap_vx6", "ip6_fwd_vx6", "netif_rx_vx6", "xmit_vx6"]
    assert own["encap_vx6"].startswith("p:labctl_t/encap_vx6 udp_tunnel6_xmit_skb skb=%dx:x64")


def test_the_wire_captures_read_a_frame_of_an_outer_ipv6_header_by_its_inner_one() -> None:
    lab = tunnelprobes.framings(load_lab_text(VX6_LAB, "lab.yaml").to_dict())
    h = tunnelprobes.inner_header(_vxlan6_frame(), lab)
    assert h is not None and h.describe() == "ICMP echo-request 192.168.46.1 > 192.168.46.2 id 7 seq 1"
    assert tunnelprobes.inner_header(_vxlan6_frame(port=4790), lab) is None
    assert tunnelprobes.inner_header(_vxlan_frame(), lab) is None  # over IPv4: the lab has no such tunnel
    assert tunnelprobes.frame_header(_vxlan6_frame(), parse_filter("icmp and host 192.168.46.2"), lab) == h


OUTER6 = ("os6a=16777469 os6b=0 os6c=0 os6d=33554432 od6a=33554685 od6b=0 od6c=0 od6d=33554432")  # fd00:1::2 > fd00:2::2


def test_an_outer_ipv6_packets_events_are_one_journey_at_ipv6s_points_with_the_outer_header_in_the_notes() -> None:
    inner = "vi=69 tl=21504 id=13330 fo=64 ttl=64 proto=1 saddr=19835072 daddr=36612288 l4a=8 l4b=16779008"  # .46.1 > .46.2, read little-endian
    tail = f"{OUTER6} opr=17 odp=46354 ohd=8 oid=3014656"
    lines = [f'  <idle>-0 [000] ..s2. 601.000001: netif_rx_vx6: (net.netif_receive_skb) skb=0xffff888005fa4b00 dev="eth1" {inner} {tail}',
             f"  <idle>-0 [000] ..s2. 601.000101: ip6_fwd_vx6: (ip6_forward) skb=0xffff888005fa4b00 {inner} {tail}",
             f'  <idle>-0 [000] ..s2. 601.000201: xmit_vx6: (net.net_dev_start_xmit) skb=0xffff888005fa4b00 dev="eth2" {inner} {tail}']
    events = [parse_line(x, "r") for x in lines]
    fwd = events[1]
    assert fwd is not None and fwd.point == "ip6_fwd" and fwd.fields["outer"] == "vx6"
    assert encap.note(fwd.point, fwd.fields) == "outer VXLAN fd00:1::2 > fd00:2::2 udp/4789 vni 46"
    h = identity(fwd)
    assert h is not None and h.describe().startswith("ICMP echo-request 192.168.46.1 > 192.168.46.2")
    corr = Correlator(Topology(guests=("r",)), {"r": Clock()})
    for e in events:
        assert e is not None
        corr.add(e)
    (j,) = corr.settle()
    assert [(x.point, x.where) for x in j.hops] == [("netif_rx", "netif_receive_skb"), ("ip6_fwd", "ip6_forward"),
                                                    ("xmit", "net_dev_start_xmit")], j.hops


def test_a_guest_with_vxlan_over_ipv4_and_ipv6_decapsulates_both_at_one_probe() -> None:
    """vxlan_rcv takes both framings' packets off: one probe there (two would make each decap a hop twice)."""
    both = VX6_LAB.replace('      gnv6: {type: geneve, vni: 8, remote: "fd00:2::2", ip: 192.168.48.1/24}\n',
                           '      vx0: {type: vxlan, vni: 42, remote: 10.2.0.2, ip: 192.168.42.1/24}\n')
    defs, _ = _defs_of(both, "icmp or icmp6", "a")
    assert sorted(n for n in defs if n.startswith(("encap", "decap"))) == [
        "decap6_vx", "decap_vx", "encap6_vx", "encap6_vx6", "encap_vx", "encap_vx6"]
    assert all(defs[n].split()[1] == "vxlan_rcv" for n in defs if n.startswith("decap"))


# --------------------------------------------------------------------------- IP in IPv6 (ip6tnl)

SIX_LAB = """\
name: six
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: "fd00:1::2/64"}]
    tunnels:
      tun6: {type: ip6tnl, local: "fd00:1::2", remote: "fd00:2::2", ip: [192.168.6.1/30, "fd00:66::1/64"]}
  r:
    nics: [{name: eth1, model: virtio, network: left, ip: "fd00:1::1/64"}, {name: eth2, model: virtio, network: right, ip: "fd00:2::1/64"}]
  b:
    nics: [{name: eth1, model: virtio, network: right, ip: "fd00:2::2/64"}]
    tunnels:
      tun6: {type: ip6tnl, local: "fd00:2::2", remote: "fd00:1::2", ip: [192.168.6.2/30, "fd00:66::2/64"]}
"""


def test_ip6tnl_is_followed_past_its_encapsulation_limit_option_for_either_inner_family() -> None:
    """ip6tnl's outer packet: an IPv6 header (next header 60), the kernel's 8-byte destination options
    with the tunnel encapsulation limit (their first word: the inner protocol, 4 or 41, then 00 04 01),
    then the inner header; ip6_local_out is where the headers are on (IPv6's), ip4ip6_rcv and ip6ip6_rcv
    where they are off (8 bytes back). Every offset and guard here breaks the probe on a real kernel."""
    rd, rf = _defs_of(SIX_LAB, "icmp", "r")
    assert "saddr=+60(+208($skbaddr)):u32" in rd["netif_rx_ip4in6"]  # 40 + 8 + 12: the inner IPv4 source
    assert "ohd=+40(+208($skbaddr)):u32" in rd["netif_rx_ip4in6"] and "opr=+6(+208($skbaddr)):u8" in rd["netif_rx_ip4in6"]
    assert rf["netif_rx_ip4in6"].endswith("&& opr == 60 && ohd == 17039364")  # 04 00 04 01 read little-endian
    assert "saddr=+74(+208($skbaddr)):u32" in rd["xmit_ip4in6"]  # past the Ethernet header
    assert "p:labctl_t/ip6_fwd_ip4in6 ip6_forward" in rd["ip6_fwd_ip4in6"] and not any("ip6in6" in n for n in rd)
    ad, af = _defs_of(SIX_LAB, "icmp", "a")
    assert ad["encap_ip4in6"].startswith("p:labctl_t/encap_ip4in6 ip6_local_out skb=%dx:x64")
    assert "saddr=+60(+208(%dx)):u32" in ad["encap_ip4in6"] and af["encap_ip4in6"].endswith("&& ohd == 17039364")
    assert ad["decap_ip4in6"].startswith("p:labctl_t/decap_ip4in6 ip6_tunnel:ip4ip6_rcv skb=%di:x64")
    assert "saddr=+12(+208(%di)):u32" in ad["decap_ip4in6"] and "ohd=-8(+208(%di)):u32" in ad["decap_ip4in6"]
    r6, f6 = _defs_of(SIX_LAB, "icmp6", "r")  # IPv6 inside: its family guard reads the outer skb's protocol
    assert "pr=+180($skbaddr):u16" in r6["netif_rx6_ip6in6"] and "s6a=+56(+208($skbaddr)):u32" in r6["netif_rx6_ip6in6"]
    assert f6["netif_rx6_ip6in6"].startswith("(pr == 0xdd86 && vi >= 96") and f6["netif_rx6_ip6in6"].endswith("ohd == 17039401")
    a6, _ = _defs_of(SIX_LAB, "icmp6", "a")
    assert "ip6_tunnel:ip6ip6_rcv" in a6["decap6_ip6in6"] and "pr=+180(%di):u16" in a6["decap6_ip6in6"]
    lab = tunnelprobes.framings(load_lab_text(SIX_LAB, "lab.yaml").to_dict())
    icmp = bytes([0x45, 0, 0, 84, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0, 192, 168, 6, 1, 192, 168, 6, 2, 8, 0, 0, 0, 1, 2, 0, 1])
    outer = bytes.fromhex("60000000 00543c3f") + ipaddress.IPv6Address("fd00:1::2").packed + \
        ipaddress.IPv6Address("fd00:2::2").packed
    frame = b"\x02" * 12 + b"\x86\xdd" + outer + bytes.fromhex("04000401 04010100") + icmp
    h = tunnelprobes.inner_header(frame, lab)
    assert h is not None and (h.family, h.saddr, h.daddr) == (4, 0xC0A80601, 0xC0A80602)
    assert tunnelprobes.inner_header(frame.replace(bytes.fromhex("04000401"), bytes.fromhex("29000401")), lab) is None
    no_limit = b"\x02" * 12 + b"\x86\xdd" + outer.replace(b"\x3c\x3f", b"\x04\x3f", 1) + icmp  # encaplimit none
    assert tunnelprobes.inner_header(no_limit, lab) is None
    words = {f"o{side}6{c}": str(int.from_bytes(ipaddress.IPv6Address(addr).packed[4 * i:4 * i + 4], "little"))
             for side, addr in (("s", "fd00:1::2"), ("d", "fd00:2::2")) for i, c in enumerate("abcd")}
    assert encap.note("netif_rx", {"outer": "ip4in6", **words}) == "outer IPIP6 fd00:1::2 > fd00:2::2"
    assert encap.where("decap", {"tunnel": "ip6in6"}) == "ip6ip6_rcv" and encap.note("encap", {"tunnel": "ip6in6"}) == "IP6IP6"
