"""The pcap-filter subset labctl follows by (labctl.pktfilter): parsing, matching on the host, and the
kernel's event filter it becomes (the fields the follow probes fetch, little-endian as a guest's CPU reads
network-order bytes)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from labctl.follow.follower import pcap_text
from labctl.pktfilter import FilterError, Packet, Vlan, kernel_filter, parse, vlan_of


def pkt(src: str, dst: str, proto: int, sport: int | None = None, dport: int | None = None) -> Packet:
    return Packet(int(ipaddress.IPv4Address(src)), int(ipaddress.IPv4Address(dst)), proto, sport, dport)


PING = pkt("10.1.0.1", "10.2.0.1", 1)
REPLY = pkt("10.2.0.1", "10.1.0.1", 1)
DNS = pkt("10.1.0.1", "10.2.0.53", 17, 40000, 53)
WEB = pkt("10.1.0.7", "10.3.0.1", 6, 51000, 80)


@pytest.mark.parametrize(("text", "matches"), [
    ("", [PING, REPLY, DNS, WEB]),
    ("icmp", [PING, REPLY]),
    ("host 10.2.0.1", [PING, REPLY]),
    ("src host 10.2.0.1", [REPLY]),
    ("dst 10.2.0.1", [PING]),
    ("src and dst net 10.0.0.0/8", [PING, REPLY, DNS, WEB]),
    ("net 10.2.0.0/24", [PING, REPLY, DNS]),
    ("net 10.2", [PING, REPLY, DNS]),
    ("net 10.0.0.0 mask 255.254.0.0", [PING, REPLY, DNS, WEB]),
    ("dst net 10.2.0.0/31", [PING]),
    ("port 53", [DNS]),
    ("udp dst port 53", [DNS]),
    ("tcp port 53", []),
    ("tcp or udp", [DNS, WEB]),
    ("not icmp and not port 80", [DNS]),
    ("host 10.1.0.1 or 10.1.0.7", [PING, REPLY, DNS, WEB]),  # pcap repeats the qualifier
    ("icmp && !(src 10.2.0.1)", [PING]),
    ("ip proto 17", [DNS]),
    ("ip and tcp port 80", [WEB]),
])
def test_filters_match_what_tcpdump_would(text: str, matches: list[Packet]) -> None:
    node = parse(text)
    assert [p for p in (PING, REPLY, DNS, WEB) if node.match(p)] == matches


@pytest.mark.parametrize(("text", "word"), [
    ("rarp", "rarp"), ("portrange 1-100", "portrange"), ("mpls 5", "mpls"),
    ("ether host 52:54:00:00:00:01", "ether"), ("tcp[13] & 2 != 0", "tcp[13]"), ("less 100", "less"),
])
def test_primitives_outside_the_subset_are_refused_by_name(text: str, word: str) -> None:
    with pytest.raises(FilterError, match=re.escape(f"does not follow by '{word}'") + ".*IPv6 and ARP.*host, net, port"):
        parse(text)


@pytest.mark.parametrize("text", ["host", "host 10.1.0", "port http", "icmp and", "(icmp", "host example.org",
                                  "net 10.1.0.0/40", "tcp host 10.0.0.1", "ip6 host 10.0.0.1", "arp host fd00::1",
                                  "icmp and ip6", "-w /tmp/x", " --version", "ip6 port 80"])
def test_bad_filters_are_refused(text: str) -> None:
    with pytest.raises(FilterError):
        parse(text)


def test_the_kernel_filter_compares_little_endian_fields() -> None:
    filt, extra = kernel_filter(parse("icmp and host 10.2.0.1"))
    assert filt == "vi >= 69 && vi <= 79 && (proto == 1 && (saddr == 0x100020a || daddr == 0x100020a))"
    assert extra == set()
    filt, extra = kernel_filter(parse("udp dst port 53"))
    assert "dport == 0x3500" in filt and "proto == 17" in filt and "vi == 69" in filt and "!(fo & 0xff1f)" in filt
    assert extra == {"sport", "dport", "fo"}


def test_networks_become_byte_ranges_in_the_kernel() -> None:
    filt, extra = kernel_filter(parse("src net 10.2.16.0/20"))
    assert filt.endswith("(sb0 == 10 && sb1 == 2 && sb2 >= 16 && sb2 <= 31)")
    assert extra == {"sb0", "sb1", "sb2"}
    assert kernel_filter(parse("not net 10.0.0.0/8"))[0].endswith("!(((sb0 == 10) || (db0 == 10)))")


def pkt6(src: str, dst: str, proto: int, sport: int | None = None, dport: int | None = None) -> Packet:
    return Packet(int(ipaddress.IPv6Address(src)), int(ipaddress.IPv6Address(dst)), proto, sport, dport, family=6)


PING6 = pkt6("fd00:1::2", "fd00:2::2", 58)
WEB6 = pkt6("fd00:1::2", "fd00:3::1", 6, 51000, 80)
NS = pkt6("fe80::1", "ff02::1:ff00:2", 58)
WHO = Packet(int(ipaddress.IPv4Address("10.1.0.2")), int(ipaddress.IPv4Address("10.1.0.99")), 0, family=0x806)
ALL = (PING, REPLY, DNS, WEB, PING6, WEB6, NS, WHO)


@pytest.mark.parametrize(("text", "matches"), [
    ("", list(ALL)),
    ("ip", [PING, REPLY, DNS, WEB]),
    ("ip6", [PING6, WEB6, NS]),
    ("arp", [WHO]),
    ("icmp6", [PING6, NS]),
    ("icmp", [PING, REPLY]),
    ("host fd00:1::2", [PING6, WEB6]),
    ("dst host fd00:2::2 or fd00:3::1", [PING6, WEB6]),
    ("net fd00::/16", [PING6, WEB6]),
    ("src net fe80::/10", [NS]),
    ("ip6 net fd00:2::/64", [PING6]),
    ("host 10.1.0.99", [WHO]),  # pcap's host: IPv4 and ARP
    ("ip host 10.1.0.99", []),
    ("arp dst host 10.1.0.99", [WHO]),
    ("net 10.1.0.0/24", [PING, REPLY, DNS, WEB, WHO]),
    ("port 80", [WEB, WEB6]),
    ("tcp port 80 and ip6", [WEB6]),
    ("ip6 proto 6", [WEB6]),
    ("proto 6", [WEB, WEB6]),
    ("not ip6 and not arp", [PING, REPLY, DNS, WEB]),
])
def test_ipv6_and_arp_filters_match_what_tcpdump_would(text: str, matches: list[Packet]) -> None:
    node = parse(text)
    assert [p for p in ALL if node.match(p)] == matches


def test_each_family_gets_its_own_kernel_filter_or_none() -> None:
    node = parse("icmp6 and host fd00:1::2")
    assert kernel_filter(node, 4)[0] is None and kernel_filter(node, 0x806)[0] is None
    filt, extra = kernel_filter(node, 6)
    # skb->protocol in network order read little-endian (0x86dd: 0xdd86), the version nibble, next header 58
    assert filt == ("pr == 0xdd86 && vi >= 96 && vi <= 111 && (nxt == 58 && ((s6a == 0x10000fd && s6b == 0x0 && "
                    "s6c == 0x0 && s6d == 0x2000000) || (d6a == 0x10000fd && d6b == 0x0 && d6c == 0x0 && d6d == 0x2000000)))")
    assert extra == set()
    filt, extra = kernel_filter(parse("arp host 10.1.0.99"), 0x806)
    assert filt == "pr == 0x608 && (spa == 0x6300010a || tpa == 0x6300010a)" and extra == {"spa", "tpa"}
    filt, extra = kernel_filter(parse("src net fd00:1::/56"), 6)
    assert filt is not None and filt.endswith("(s6a == 0x10000fd && s6b4 == 0 && s6b5 == 0 && s6b6 == 0)")
    assert extra == {"s6b4", "s6b5", "s6b6"}
    filt, _ = kernel_filter(parse("udp port 53"), 6)
    assert filt is not None and filt.endswith("(nxt == 17 && (sport == 0x3500 || dport == 0x3500))")
    assert kernel_filter(parse("ip6"), 6)[0] == "pr == 0xdd86 && vi >= 96 && vi <= 111"
    assert kernel_filter(parse("not ip6"), 6)[0] is None


@pytest.mark.parametrize(("text", "vlan", "rest"), [
    ("vlan", Vlan(), "vi >= 69 && vi <= 79"),
    ("vlan 10", Vlan(10), "vi >= 69 && vi <= 79"),
    ("vlan 10 and icmp", Vlan(10), "vi >= 69 && vi <= 79 && proto == 1"),
    ("icmp and vlan 10", Vlan(10), "vi >= 69 && vi <= 79 && proto == 1"),  # either side of and, the same
    ("vlan and host 10.0.0.1", Vlan(), "vi >= 69 && vi <= 79 && (saddr == 0x100000a || daddr == 0x100000a)"),
    ("(vlan 0 && icmp) and not host 10.1.0.1", Vlan(0), ("vi >= 69 && vi <= 79 && (proto == 1 && "
     "!((saddr == 0x100010a || daddr == 0x100010a)))")),
    ("VLAN 4095 and (icmp or udp)", Vlan(4095), "vi >= 69 && vi <= 79 && (proto == 1 || proto == 17)"),
])
def test_vlan_is_a_conjunct_of_the_whole_filter_and_nothing_in_the_kernel(text: str, vlan: Vlan, rest: str) -> None:
    node = parse(text)
    assert vlan_of(node) == vlan
    assert kernel_filter(node, 4)[0] == rest  # the probes record what the rest matches; journeys are kept by it


def test_vlan_alone_follows_every_family_and_the_rest_keeps_its_families() -> None:
    from labctl.pktfilter import families

    assert families(parse("vlan 10")) == [4, 6, 0x806]
    assert families(parse("vlan 10 and icmp6")) == [6]
    assert vlan_of(parse("icmp and host 10.0.0.1")) is None
    # on the host, a packet's header is matched by the rest (the journey's VLANs by vlan_of's Vlan)
    assert parse("vlan 10 and icmp").match(PING) and not parse("vlan 10 and udp").match(PING)


@pytest.mark.parametrize(("text", "says"), [
    ("vlan or icmp", "only ANDed with the whole filter"),
    ("not vlan 10", "only ANDed with the whole filter"),
    ("icmp and (vlan 10 or arp)", "only ANDed with the whole filter"),
    ("vlan 10 and icmp or arp", "only ANDed with the whole filter"),  # and binds first: (vlan 10 and icmp) or arp
    ("icmp and !vlan", "only ANDed with the whole filter"),
    ("vlan 10 and vlan 20", "one 'vlan', not stacked tags (vlan 10, vlan 20)"),
    ("vlan 4096", "VLAN ID 4096 is more than 4095"),
    ("vlan 10.0.0.1", "unexpected '10.0.0.1'"),
])
def test_vlan_elsewhere_is_refused_with_why(text: str, says: str) -> None:
    with pytest.raises(FilterError, match=re.escape(f"'{text}': ") + ".*" + re.escape(says)):
        parse(text)


@pytest.mark.parametrize(("vlan", "seen", "passes"), [
    (Vlan(), (), False), (Vlan(), (10,), True), (Vlan(10), (10,), True), (Vlan(10), (20,), False),
    (Vlan(10), (), False), (Vlan(20), (10, 20), True), (Vlan(0), (0,), True),
])
def test_a_journey_passes_vlan_when_it_was_seen_on_that_vlan(vlan: Vlan, seen: tuple[int, ...], passes: bool) -> None:
    assert vlan.passes(seen) is passes


@pytest.mark.parametrize(("text", "checked"), [
    ("icmp and vlan 10", "vlan 10 and (icmp)"),  # pcap itself would say "expression rejects all packets"
    ("vlan 10 and icmp", "vlan 10 and (icmp)"),
    ("host 10.0.0.1 && vlan", "vlan and (host 10.0.0.1)"),
    ("(vlan 10) and icmp", "vlan 10 and (icmp)"),
    ("host 10.0.0.1 and (icmp and vlan 7)", "vlan 7 and (host 10.0.0.1 and ( icmp ))"),
    ("vlan 10", "vlan 10"),
    ("icmp or host 10.0.0.1", "icmp or host 10.0.0.1"),  # no vlan: as it is
    ("vlan or icmp", "vlan or icmp"),  # refused by parse: as it is
])
def test_libpcap_checks_a_vlan_filter_with_its_vlan_first(text: str, checked: str) -> None:
    assert pcap_text(text) == checked


@pytest.mark.parametrize(("text", "family", "expected"), [
    ("icmp", 4, {1}), ("tcp port 80", 4, {6}), ("port 53", 6, {6, 17}), ("udp or icmp", 4, {1, 17}),
    ("host 10.0.0.1", 4, None), ("icmp or host 10.0.0.1", 4, None), ("not tcp", 4, None),
    ("icmp6", 6, {58}), ("icmp6", 4, set()), ("tcp and host 10.0.0.1", 4, {6}), ("tcp and udp", 4, set())])
def test_a_filter_says_which_protocols_its_packets_can_carry(text: str, family: int, expected: set[int] | None) -> None:
    assert parse(text).protocols(family) == (None if expected is None else frozenset(expected))
