"""Tunnels and a VRF as data on real guests: labs/vxlan-router.yaml, booted once for the module with
one follow step (a pings b over VXLAN), its bundle written by ``up``.

* a's ping over VXLAN reaches b through r, which has no tunnel of its own; the step's journeys show
  the inner packet encapsulated on a (udp_tunnel_xmit_skb), the outer one forwarded by r (its hops
  say the outer header), decapsulated on b (vxlan_rcv), answered; ``status`` shows the tunnels;
* a second follow step pings b over Geneve, GRETAP (with a key, checksums and sequence numbers), GRE
  and IP in IP: each is followed
  the same way, at its own encap and decap functions, the outer header in r's hops; over WireGuard
  (encrypted) the inner packet is encapsulated on a (wg_xmit) and seen again on b's wg0;
* a third pings b over VXLAN and GRE with IPv6 inside, and asks for b's vx0 address by ARP over
  VXLAN: followed the same way (encap, r, decap, the wire);
* a fourth pings b over vx6, VXLAN to b's IPv6 address: the outer IPv6 packet forwarded by r's
  ip6_forward, said in its hops, encapsulated by udp_tunnel6_xmit_skb;
* b's VRF blue routes 10.77.0.0/24 over WireGuard with its own table (the main table has no route);
* the WireGuard keys are this instance's: files 0600 in its run directory, in neither the lab's
  state nor the bundle; a second instance of the lab (warm, from the same post-boot snapshot) has
  other keys and its tunnel works;
* ``reset`` of b brings its tunnels, its VRF and its keys back;
* bad tunnels and VRFs: exit 2 at their lines, nothing started.
"""

from __future__ import annotations

OVER_3_MIN = ("one lab of three TCG guests booted with a follow step, then a second instance of it (warm) and a "
              "reset of one guest: the keys of two instances and a reset are the point")

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import harness
from tests.conftest import ROOT, Cli, new_cli
from tests.integration.conftest import qemu_pids_under, wait_for

NAME = "vxlan-router"
STEPS = """
steps:
  - name: vxlan
    follow: {filter: "icmp and host 192.168.42.2"}
    run:
      - {guest: a, command: "ping -c 2 -i 0.5 -W 3 192.168.42.2", timeout: 60}
  - name: tunnels
    follow: {filter: "icmp and (host 192.168.7.2 or host 192.168.5.2 or host 192.168.9.2 or host 192.168.8.2 or host 10.99.0.2 or host 192.168.6.2)"}
    run:
      - {guest: b, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done", timeout: 60}
      - {guest: a, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done; for ip in 192.168.7.2 192.168.5.2 192.168.9.2 192.168.8.2 10.99.0.2 192.168.6.2; do ping -c 1 -W 3 $ip || exit 1; done",
         timeout: 90}
  - name: v6
    follow: {filter: "(icmp6 and (host fd00:42::2 or host fd00:9::2 or host fd00:66::2)) or (arp and host 192.168.42.2)"}
    run:
      - {guest: b, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done", timeout: 60}
      - {guest: a, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done; ping -c 2 -i 0.5 -W 3 fd00:42::2; ping -c 1 -W 3 fd00:9::2; ping -c 1 -W 3 fd00:66::2; ip -4 neigh flush dev vx0; ping -c 1 -W 3 192.168.42.2; true",
         timeout: 90}
  - name: outer-drop
    follow: {filter: "icmp and host 192.168.42.2"}
    run:
      - {guest: r, command: "nft add table ip t; nft add chain ip t f '{ type filter hook forward priority 0; }'; nft add rule ip t f udp dport 4789 drop",
         timeout: 30}
      - {guest: a, command: "ping -c 1 -W 2 192.168.42.2; true", timeout: 30}
      - {guest: r, command: "nft delete table ip t", timeout: 30}
  - name: vx6
    follow: {filter: "icmp and host 192.168.46.2"}
    run:
      - {guest: b, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done", timeout: 60}
      - {guest: a, command: "for i in $(seq 60); do ip -6 addr show tentative | grep -q . || break; sleep 0.5; done; ping -c 2 -i 0.5 -W 3 192.168.46.2",
         timeout: 60}
"""


@pytest.fixture(scope="module")
def lab(image: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, Path]]:
    """The lab up, with its follow step run and its bundle."""
    cli = new_cli(tmp_path_factory, "tun")
    assert cli.tracked is not None
    cli.tracked.test = f"test_tunnels lab (first used by {harness.current_test()})"
    d = tmp_path_factory.mktemp("tunnels")
    (d / "lab.yaml").write_text((ROOT / "labs" / "vxlan-router.yaml").read_text() + STEPS)
    try:
        up = cli("up", str(d / "lab.yaml"), "--out", str(d / "runs"), "--json", timeout=1800)
        assert up.returncode == 0, up.stdout + up.stderr
        yield cli, Path(json.loads(up.stdout)["bundle"])
    finally:
        harness.teardown(cli.tracked)


def _sh(cli: Cli, guest: str, command: str, lab: str = NAME, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return cli("exec", lab, guest, "--timeout", str(timeout), "--", command, timeout=timeout + 60)


def _ok(cli: Cli, guest: str, command: str, lab: str = NAME) -> bool:
    return "ok" in _sh(cli, guest, f"{command} >/dev/null 2>&1 && echo ok || echo failed", lab).stdout.split()


def _packets(bundle: Path, name: str = "vxlan") -> list[dict[str, Any]]:
    summary = json.loads((bundle / "summary.json").read_text())
    step = next(s for s in summary["steps"] if s["name"] == name)
    doc = json.loads((bundle / step["dir"] / "journey.json").read_text())
    assert doc["totals"]["out_of_order_hops"] == 0, doc["totals"]
    return list(doc["packets"])


def test_a_ping_over_vxlan_goes_through_the_router(lab: tuple[Cli, Path]) -> None:
    cli, _ = lab
    assert _ok(cli, "a", "ping -c 1 -W 3 192.168.42.2")
    assert "vxlan id 42 remote 10.2.0.2 dev eth1" in _sh(cli, "a", "ip -d link show vx0").stdout
    assert "vxlan" not in _sh(cli, "r", "ip -d link show").stdout  # r only forwards the outer packets
    status = json.loads(cli("status", NAME, "--json", check=True).stdout)
    (b,) = [g for g in status["labs"][0]["guests"] if g["name"] == "b"]
    assert [(t["name"], t["type"]) for t in b["tunnels"]] == [("vx0", "vxlan"), ("wg0", "wireguard"), ("gnv0", "geneve"),
                                                             ("tap0", "gretap"), ("gre1", "gre"), ("tun0", "ipip"),
                                                             ("vx6", "vxlan"), ("tun6", "ip6tnl")]
    assert b["vrfs"][0]["table"] == 10 and b["vrfs"][0]["members"] == ["wg0"]
    text = " ".join(cli("status", NAME, check=True).stdout.split())  # a row per tunnel and VRF (wrapped as wide as it is)
    assert "│ vx0 │ vxlan 42 to" in text and "│ blue │ vrf table 10" in text, text
    assert "b vrf blue routes: 10.77.0.0/24 via 10.99.0.1" in text, text


def test_follow_shows_the_inner_packet_encapsulated_carried_and_decapsulated(lab: tuple[Cli, Path]) -> None:
    _, bundle = lab
    packets = _packets(bundle)
    requests = [p for p in packets if "echo-request" in p["packet"]]
    replies = [p for p in packets if "echo-reply" in p["packet"]]
    assert len(requests) == 2 and len(replies) == 2, [p["packet"] for p in packets]
    for p in requests:
        hops = [(h["guest"], h["point"], h.get("dev"), h.get("note", "")) for h in p["hops"] if h["point"] != "wire"]
        points = [(g, pt) for g, pt, _, _ in hops]
        assert ("a", "encap") in points and ("r", "ip_fwd") in points and ("b", "decap") in points, hops
        assert points.index(("a", "encap")) < points.index(("r", "ip_fwd")) < points.index(("b", "decap")), hops
        (fwd,) = [h for h in hops if h[:2] == ("r", "ip_fwd")]
        assert fwd[3] == "outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42", hops
        assert ("b", "netif_rx", "vx0", "") in hops and ("a", "xmit", "vx0", "") in hops, hops  # the inner one
        # the ends have their own framing's outer packet only where it leaves and arrives: encap, the wire, decap say the rest
        assert [h[:2] for h in hops if h[0] != "r" and h[3].startswith("outer ")] == [("a", "xmit"), ("b", "netif_rx")], hops
        assert [h["where"] for h in p["hops"] if h["point"] == "wire"] == ["a.eth1 → r.eth1", "r.eth2 → b.eth1"]
        assert p["end"]["kind"] == "answered", p["end"]
    for p in replies:
        assert [h["guest"] for h in p["hops"] if h["point"] in ("encap", "decap")] == ["b", "a"], p["hops"]
        assert p["end"]["kind"] == "delivered", p["end"]


def test_follow_shows_an_inner_ipv6_packet_encapsulated_carried_and_decapsulated(lab: tuple[Cli, Path]) -> None:
    """The same for IPv6 inside VXLAN (the inner frame's EtherType, 0x86DD, says the family)."""
    _, bundle = lab
    packets = _packets(bundle, "v6")
    requests = [p for p in packets if "echo-request" in p["packet"] and "> fd00:42::2 " in p["packet"]]
    replies = [p for p in packets if "echo-reply" in p["packet"] and "fd00:42::2 >" in p["packet"]]
    assert len(requests) == 2 and len(replies) == 2, [p["packet"] for p in packets]
    for p in requests:
        hops = [(h["guest"], h["point"], h.get("dev"), h.get("note", "")) for h in p["hops"] if h["point"] != "wire"]
        points = [(g, pt) for g, pt, _, _ in hops]
        assert ("a", "encap") in points and ("r", "ip_fwd") in points and ("b", "decap") in points, hops
        assert points.index(("a", "encap")) < points.index(("r", "ip_fwd")) < points.index(("b", "decap")), hops
        notes = [h[3] for h in hops if h[0] == "r"]  # netif_rx, ip_fwd, dev_queue, xmit: one outer packet
        assert notes == ["outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"] * 4, hops
        assert [h[3] for h in hops if h[1] in ("encap", "decap")] == ["VXLAN vni 42"] * 2, hops
        assert ("b", "netif_rx", "vx0", "") in hops and ("a", "xmit", "vx0", "") in hops, hops  # the inner one
        wires = [(h["where"], h["note"]) for h in p["hops"] if h["point"] == "wire"]  # by the inner IPv6 header
        assert wires == [("a.eth1 → r.eth1", "seen on the host side at both ends"),
                         ("r.eth2 → b.eth1", "seen on the host side at both ends")], wires
        assert p["end"]["kind"] == "answered", p["end"]
    for p in replies:
        assert [h["guest"] for h in p["hops"] if h["point"] in ("encap", "decap")] == ["b", "a"], p["hops"]
        assert p["end"]["kind"] == "delivered", p["end"]


def test_follow_goes_through_vxlan_over_ipv6_with_the_outer_ipv6_header_in_the_routers_hops(lab: tuple[Cli, Path]) -> None:
    """vx6 is VXLAN to b's IPv6 address: encapsulated by udp_tunnel6_xmit_skb, the outer IPv6 packet
    forwarded by r's ip6_forward (its hops say the outer header), decapsulated by vxlan_rcv."""
    _, bundle = lab
    packets = _packets(bundle, "vx6")
    requests = [p for p in packets if "echo-request" in p["packet"] and "> 192.168.46.2 " in p["packet"]]
    replies = [p for p in packets if "echo-reply" in p["packet"] and "192.168.46.2 >" in p["packet"]]
    assert len(requests) == 2 and len(replies) == 2, [p["packet"] for p in packets]
    for p in requests:
        hops = [(h["guest"], h["point"], h["where"], h.get("note", "")) for h in p["hops"] if h["point"] != "wire"]
        assert ("a", "encap", "udp_tunnel6_xmit_skb", "VXLAN vni 46") in hops, hops
        assert ("b", "decap", "vxlan_rcv", "VXLAN vni 46") in hops, hops
        points = [h[:2] for h in hops]
        assert points.index(("a", "encap")) < points.index(("r", "ip6_fwd")) < points.index(("b", "decap")), hops
        assert [h[1:] for h in hops if h[0] == "r"] == [  # one outer IPv6 packet through r
            (pt, where, "outer VXLAN fd00:1::2 > fd00:2::2 udp/4789 vni 46") for pt, where in (
                ("netif_rx", "netif_receive_skb"), ("ip6_fwd", "ip6_forward"), ("dev_queue", "net_dev_queue"),
                ("xmit", "net_dev_start_xmit"))], hops
        wires = [(h["where"], h["note"]) for h in p["hops"] if h["point"] == "wire"]  # by the inner header
        assert wires == [("a.eth1 → r.eth1", "seen on the host side at both ends"),
                         ("r.eth2 → b.eth1", "seen on the host side at both ends")], wires
        assert p["end"]["kind"] == "answered", p["end"]
    for p in replies:
        assert [(h["guest"], h["where"]) for h in p["hops"] if h["point"] in ("encap", "decap")] == [
            ("b", "udp_tunnel6_xmit_skb"), ("a", "vxlan_rcv")], p["hops"]
        assert p["end"]["kind"] == "delivered", p["end"]


@pytest.mark.parametrize(("step", "dst", "title", "decap"), [("tunnels", "192.168.6.2", "IPIP6", "ip4ip6_rcv"),
                                                          ("v6", "fd00:66::2", "IP6IP6", "ip6ip6_rcv")])
def test_follow_goes_through_ip6tnl_past_its_encapsulation_limit_for_ipv4_and_ipv6_inside(
        lab: tuple[Cli, Path], step: str, dst: str, title: str, decap: str) -> None:
    """tun6 is ip6tnl (mode any) over r: the outer IPv6 packet carries the kernel's tunnel encapsulation
    limit (a destination options header) before the inner IPv4 or IPv6 one; ip6_local_out has the
    headers on, r forwards it (its hops say the outer header), ip4ip6_rcv or ip6ip6_rcv has them off."""
    _, bundle = lab
    packets = _packets(bundle, step)
    requests = [p for p in packets if "echo-request" in p["packet"] and f"> {dst} " in p["packet"]]
    replies = [p for p in packets if "echo-reply" in p["packet"] and f"{dst} >" in p["packet"]]
    assert len(requests) == 1 and len(replies) == 1, [p["packet"] for p in packets]
    hops = [(h["guest"], h["point"], h["where"], h.get("note", "")) for h in requests[0]["hops"] if h["point"] != "wire"]
    assert ("a", "encap", "ip6_local_out", title) in hops and ("b", "decap", decap, title) in hops, hops
    points = [h[:2] for h in hops]
    assert points.index(("a", "encap")) < points.index(("r", "ip6_fwd")) < points.index(("b", "decap")), hops
    assert [h[1:] for h in hops if h[0] == "r"] == [(pt, where, f"outer {title} fd00:1::2 > fd00:2::2") for pt, where in (
        ("netif_rx", "netif_receive_skb"), ("ip6_fwd", "ip6_forward"), ("dev_queue", "net_dev_queue"),
        ("xmit", "net_dev_start_xmit"))], hops
    wires = [(h["where"], h["note"]) for h in requests[0]["hops"] if h["point"] == "wire"]  # by the inner header
    assert wires == [("a.eth1 → r.eth1", "seen on the host side at both ends"),
                     ("r.eth2 → b.eth1", "seen on the host side at both ends")], wires
    assert requests[0]["end"]["kind"] == "answered", requests[0]["end"]
    assert [(h["guest"], h["where"]) for h in replies[0]["hops"] if h["point"] in ("encap", "decap")] == [
        ("b", "ip6_local_out"), ("a", decap)], replies[0]["hops"]
    assert replies[0]["end"]["kind"] == "delivered", replies[0]["end"]


def test_follow_shows_an_inner_ipv6_packet_through_gre(lab: tuple[Cli, Path]) -> None:
    """IPv6 inside GRE: the GRE header's protocol (0x86DD) says the family."""
    _, bundle = lab
    packets = _packets(bundle, "v6")
    (request,) = [p for p in packets if "echo-request" in p["packet"] and "> fd00:9::2 " in p["packet"]]
    hops = [(h["guest"], h["point"], h["where"], h.get("note", "")) for h in request["hops"] if h["point"] != "wire"]
    assert ("a", "encap", "ip_tunnel_xmit", "GRE") in hops and ("b", "decap", "gre_rcv", "GRE") in hops, hops
    assert [h[3] for h in hops if h[0] == "r"] == ["outer GRE 10.1.0.2 > 10.2.0.2"] * 4, hops
    assert request["end"]["kind"] == "answered", request["end"]


def test_follow_shows_an_inner_arp_request_carried_by_vxlan(lab: tuple[Cli, Path]) -> None:
    """An ARP request inside VXLAN (the inner frame's EtherType 0x0806): encapsulated, through r, decapsulated."""
    _, bundle = lab
    packets = _packets(bundle, "v6")
    asks = [p for p in packets if p["packet"].startswith("ARP who-has 192.168.42.2 tell 192.168.42.1")]
    assert asks, [p["packet"] for p in packets]
    hops = [(h["guest"], h["point"], h.get("note", "")) for h in asks[0]["hops"] if h["point"] != "wire"]
    points = [h[:2] for h in hops]
    assert points.index(("a", "encap")) < points.index(("r", "ip_fwd")) < points.index(("b", "decap")), hops
    assert [h[2] for h in hops if h[0] == "r"] == ["outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"] * 4, hops
    assert ("b", "arp_rcv") in points, hops
    wires = [h["note"] for h in asks[0]["hops"] if h["point"] == "wire"]
    assert wires == ["seen on the host side at both ends"] * 2, asks[0]["hops"]


# each tunnel's inner destination: its device on b, the outer header r's hops say (a pattern), its encap and
# decap functions; tap0 has a checksum and sequence numbers (csum, seq): their words before and after the key
OVER = {
    "192.168.7.2": ("gnv0", re.escape("outer Geneve 10.1.0.2 > 10.2.0.2 udp/6081 vni 7"), "udp_tunnel_xmit_skb",
                    "geneve_udp_encap_recv"),
    "192.168.5.2": ("tap0", re.escape("outer GRE 10.1.0.2 > 10.2.0.2 key 5") + r" seq \d+ csum", "ip_tunnel_xmit", "gre_rcv"),
    "192.168.9.2": ("gre1", re.escape("outer GRE 10.1.0.2 > 10.2.0.2"), "ip_tunnel_xmit", "gre_rcv"),
    "192.168.8.2": ("tun0", re.escape("outer IPIP 10.1.0.2 > 10.2.0.2"), "ip_tunnel_xmit", "ipip_rcv"),
}


def test_follow_goes_through_geneve_gretap_gre_and_ipip_as_through_vxlan(lab: tuple[Cli, Path]) -> None:
    _, bundle = lab
    packets = _packets(bundle, "tunnels")
    for dst, (dev, outer, enc, dec) in OVER.items():
        requests = [p for p in packets if "echo-request" in p["packet"] and f"> {dst} " in p["packet"]]
        replies = [p for p in packets if "echo-reply" in p["packet"] and f"{dst} >" in p["packet"]]
        assert len(requests) == 1 and len(replies) == 1, (dst, [p["packet"] for p in packets])
        hops = [(h["guest"], h["point"], h["where"], h.get("dev"), h.get("note", "")) for h in requests[0]["hops"]
                if h["point"] != "wire"]
        points = [h[:2] for h in hops]
        assert ("a", "encap", enc) in [h[:3] for h in hops] and ("b", "decap", dec) in [h[:3] for h in hops], hops
        assert points.index(("a", "encap")) < points.index(("r", "ip_fwd")) < points.index(("b", "decap")), hops
        notes = [h[4] for h in hops if h[0] == "r"]  # netif_rx, ip_fwd, dev_queue, xmit: one outer packet
        assert len(notes) == 4 and len(set(notes)) == 1 and re.fullmatch(outer, notes[0]), hops
        if dev == "tap0":  # the one sequence number of this packet, as a pushed it and b took it off
            (seq,) = re.findall(r" seq (\d+) ", notes[0])
            ends = [h[4] for h in hops if h[1] in ("encap", "decap")]
            assert ends == [f"GRE key 5 seq {seq} csum"] * 2, hops
        assert ("b", "netif_rx", "netif_receive_skb", dev) in [h[:4] for h in hops] and points[-1] == ("b", "ip_local"), hops
        assert requests[0]["end"]["kind"] == "answered", requests[0]["end"]
        wires = [(h["where"], h["note"]) for h in requests[0]["hops"] if h["point"] == "wire"]  # by the inner header
        assert wires == [("a.eth1 → r.eth1", "seen on the host side at both ends"),
                         ("r.eth2 → b.eth1", "seen on the host side at both ends")], wires
        assert [(h["guest"], h["where"]) for h in replies[0]["hops"] if h["point"] in ("encap", "decap")] == [
            ("b", enc), ("a", dec)], replies[0]["hops"]
        assert replies[0]["end"]["kind"] == "delivered", replies[0]["end"]


def test_follow_over_wireguard_has_the_encapsulation_then_the_decrypted_packet(lab: tuple[Cli, Path]) -> None:
    _, bundle = lab
    packets = _packets(bundle, "tunnels")
    (request,) = [p for p in packets if "echo-request" in p["packet"] and "> 10.99.0.2 " in p["packet"]]
    (reply,) = [p for p in packets if "echo-reply" in p["packet"] and "10.99.0.2 >" in p["packet"]]
    hops = [(h["guest"], h["point"], h["where"], h.get("dev"), h.get("note", "")) for h in request["hops"]]
    assert hops[0] == ("a", "encap", "wg_xmit", "wg0", "WireGuard, encrypted"), hops
    assert not [h for h in hops if h[0] == "r"] and ("b", "netif_rx", "netif_receive_skb", "wg0") in [h[:4] for h in hops], hops
    decrypted = ("b", "decap", "wg_allowedips_lookup_src", "wg0", "WireGuard, decrypted")  # before it reaches wg0
    assert decrypted in hops and hops.index(decrypted) < [h[:4] for h in hops].index(("b", "netif_rx", "netif_receive_skb", "wg0"))
    assert request["end"]["kind"] == "answered", request["end"]
    assert [(h["guest"], h["point"]) for h in reply["hops"] if h["point"] in ("encap", "decap")] == [("b", "encap"), ("a", "decap")]
    assert reply["end"]["kind"] == "delivered", reply["end"]


def test_follow_says_the_router_dropped_the_outer_packet_of_a_tunnelled_ping(lab: tuple[Cli, Path]) -> None:
    """r's nft rule drops the VXLAN packets it forwards: the ping's journey ends there, the drop its own
    (the outer packet's, read by its inner header), said with the outer header."""
    _, bundle = lab
    (request,) = [p for p in _packets(bundle, "outer-drop") if "echo-request" in p["packet"]]
    end = request["end"]
    assert end["kind"] == "dropped" and end["guest"] == "r" and end.get("reason") == "NETFILTER_DROP", end
    assert end["text"].startswith("dropped on r ") and end["text"].endswith(
        "(its outer packet, VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42)"), end
    points = [(h["guest"], h["point"]) for h in request["hops"] if h["point"] != "wire"]
    assert ("a", "encap") in points and points[-1] == ("r", "ip_fwd") and not [p for p in points if p[0] == "b"], points


def test_the_vrf_routes_with_its_own_table_over_wireguard(lab: tuple[Cli, Path]) -> None:
    cli, _ = lab
    assert _ok(cli, "b", "ping -c 1 -W 3 -I blue 10.77.0.1")
    assert not _ok(cli, "b", "ip route get 10.77.0.1")  # not in the main table
    assert "10.77.0.0/24 via 10.99.0.1 dev wg0" in _sh(cli, "b", "ip route show vrf blue").stdout


def _keys(cli: Cli, lab: str) -> dict[str, str]:
    """Each guest's wireguard public key, as the guest says it."""
    return {g: _sh(cli, g, "wg show wg0 public-key", lab).stdout.strip() for g in ("a", "b")}


def test_wireguard_keys_are_the_instances_own_and_never_in_the_bundle(lab: tuple[Cli, Path]) -> None:
    cli, bundle = lab
    run = cli.state_dir / "labs" / NAME
    files = sorted((run / "wireguard").iterdir())
    assert [f.name for f in files] == ["a.wg0.key", "a.wg0.pub", "b.wg0.key", "b.wg0.pub"]
    private = [f.read_text().strip() for f in files if f.suffix == ".key"]
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files if f.suffix == ".key")
    assert (run / "wireguard").stat().st_mode & 0o777 == 0o700
    mine = _keys(cli, NAME)
    assert mine == {"a": (run / "wireguard" / "a.wg0.pub").read_text().strip(),
                    "b": (run / "wireguard" / "b.wg0.pub").read_text().strip()}
    for f in [*bundle.rglob("*"), run / "state.json"]:
        if f.is_file():
            data = f.read_bytes()
            assert not any(k.encode() in data for k in private), f
    up = cli("up", str(ROOT / "labs" / "vxlan-router.yaml"), "--instance", "two", "--json", timeout=1200)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        other = _keys(cli, f"{NAME}@two")
        assert other["a"] and other["a"] != mine["a"] and other["b"] != mine["b"], (mine, other)
        assert _ok(cli, "a", "ping -c 1 -W 3 10.99.0.2", f"{NAME}@two")  # its keys were exchanged
    finally:
        cli("down", f"{NAME}@two", timeout=300)


def test_reset_brings_the_tunnels_the_vrf_and_the_keys_back(lab: tuple[Cli, Path]) -> None:
    cli, _ = lab
    before = _keys(cli, NAME)["b"]
    _sh(cli, "b", "ip link del vx0; ip link del wg0; ip link del blue")
    assert not _ok(cli, "a", "ping -c 1 -W 2 192.168.42.2")
    cli("reset", NAME, "b", "--json", check=True, timeout=600)
    assert _ok(cli, "a", "ping -c 1 -W 3 192.168.42.2")
    assert _keys(cli, NAME)["b"] == before  # the instance's key, given again (the snapshot holds none)
    wait_for(lambda: _ok(cli, "b", "ping -c 1 -W 3 -I blue 10.77.0.1"), 60, "b's VRF over WireGuard after reset")


BAD = """\
name: bad-tunnels
networks: {n: {}}
guests:
  g:
    memory: 256
    nics: [{name: eth1, model: virtio, network: n, ip: 10.5.0.1/24}]
    tunnels:
      vx0: {type: vxlen, vni: 1, remote: 10.5.0.2}
      vx1: {type: vxlan, vni: 16777216, remote: 10.5.0.2}
      vx2: {type: vxlan, vni: 3, remote: 10.6.0.9}
    vrfs:
      red: {table: 5, members: [eth1]}
      green: {table: 5}
  h:
    memory: 256
    nics: [{name: eth1, model: virtio, network: n, ip: 10.5.0.2/24}]
"""


def test_bad_tunnels_fail_up_at_their_lines_and_start_nothing(cli: Cli, image: object, tmp_path: Path) -> None:
    lab = tmp_path / "bad-tunnels.yaml"
    lab.write_text(BAD)
    up = cli("up", str(lab))
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.splitlines() == [
        f"{lab}:8: guests.g.tunnels.vx0.type: unknown tunnel type 'vxlen' (did you mean 'vxlan'?)",
        f"{lab}:9: guests.g.tunnels.vx1.vni: vni 16777216 is out of range (0..16777215)",
        (f"{lab}:10: guests.g.tunnels.vx2.remote: 10.6.0.9 is not an address of the lab (a tunnel's remote is an "
         "address of another guest)"),
        f"{lab}:13: guests.g.vrfs.green.table: table 5 is VRF red's too (line 12): each VRF has a table of its own",
    ], up.stderr
    assert "Traceback" not in up.stderr
    assert not (cli.state_dir / "labs" / "bad-tunnels").exists() and qemu_pids_under(cli.state_dir) == []
