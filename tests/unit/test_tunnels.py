"""Tunnels and VRFs as data (labctl.lab.tunnels), how up makes them (labctl.up.tunnels) and how
follow reads their encapsulation (labctl.follow.tunnelprobes, labctl.trace.encap); the lab file's problems
are golden (tests/labs/invalid/tunnel-problems)."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

import labctl.up.tunsetup as tunnels
from labctl.errors import LabFileError
from labctl.follow import tunnelprobes as follow_encap
from labctl.lab import guest_interfaces, load_lab_text, settings_text, tunnel_lines
from labctl.lab.tunnels import KINDS
from labctl.pktfilter import parse as parse_filter
from labctl.trace import encap
from labctl.trace.hops import POINTS, identity, parse_line

ROOT = Path(__file__).resolve().parents[2]
LAB = """\
name: tun
networks: {left: {}, right: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: [10.1.0.2/24, "fd00:1::2/64"]}]
    routes: [{to: 10.2.0.0/24, via: 10.1.0.1}]
    tunnels:
      vx0: {type: vxlan, vni: 42, remote: 10.2.0.2, dev: eth1, ip: 192.168.42.1/24, mtu: 1400}
      gnv0: {type: geneve, vni: 7, remote: 10.2.0.2}
      gre1: {type: gre, remote: 10.2.0.2, local: 10.1.0.2, key: 5}
      tap1: {type: gretap, remote: 10.2.0.2}
      tun0: {type: ipip, remote: 10.2.0.2}
      tun6: {type: ip6tnl, remote: "fd00:2::2", local: "fd00:1::2", mode: ipip6}
      wg0: {type: wireguard, peer: b.wg0, remote: 10.2.0.2, ip: 10.99.0.1/24}
    vrfs:
      blue: {table: 10, members: [eth2x, vx0], routes: [{to: 10.7.0.0/24, via: 192.168.42.2}]}
  b:
    nics: [{name: eth1, model: virtio, network: right, ip: [10.2.0.2/24, "fd00:2::2/64"]}]
    routes: [{to: 10.1.0.0/24, via: 10.2.0.1}]
    tunnels:
      wg0: {type: wireguard, peer: a.wg0, port: 51999, ip: 10.99.0.2/24}
"""
GOOD = LAB.replace("members: [eth2x, vx0]", "members: [vx0]")


def _lab(text: str = GOOD):  # type: ignore[no-untyped-def]
    return load_lab_text(text, "lab.yaml")


def test_each_kind_is_made_by_its_own_ip_link_argv() -> None:
    a = _lab().guests["a"]
    links = {t.name: KINDS[t.kind].link(t) for t in a.tunnels}
    assert links == {
        "vx0": ["ip", "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789", "remote", "10.2.0.2",
                "dev", "eth1"],
        "gnv0": ["ip", "link", "add", "gnv0", "type", "geneve", "id", "7", "remote", "10.2.0.2", "dstport", "6081"],
        "gre1": ["ip", "link", "add", "gre1", "type", "gre", "remote", "10.2.0.2", "local", "10.1.0.2", "key", "5"],
        "tap1": ["ip", "link", "add", "tap1", "type", "gretap", "remote", "10.2.0.2"],
        "tun0": ["ip", "link", "add", "tun0", "type", "ipip", "remote", "10.2.0.2"],
        "tun6": ["ip", "link", "add", "tun6", "type", "ip6tnl", "mode", "ipip6", "remote", "fd00:2::2", "local", "fd00:1::2"],
        "wg0": ["ip", "link", "add", "wg0", "type", "wireguard"],
    }
    assert sorted(KINDS) == ["geneve", "gre", "gretap", "ip6tnl", "ipip", "vxlan", "wireguard"]


def test_up_makes_the_vrfs_then_the_tunnels_then_enslaves_and_routes() -> None:
    steps = tunnels.steps(tunnels.GuestNet.of(_lab().guests["a"]))
    argvs = [" ".join(s.argv) for s in steps]
    assert argvs[:2] == ["ip link add blue type vrf table 10", "ip link set blue up"]
    assert argvs[2:6] == ["ip link add vx0 type vxlan id 42 dstport 4789 remote 10.2.0.2 dev eth1",
                          "ip link set vx0 mtu 1400", "ip addr add 192.168.42.1/24 dev vx0", "ip link set vx0 up"]
    assert argvs[-2:] == ["ip link set vx0 master blue", "ip -4 route add 10.7.0.0/24 via 192.168.42.2 table 10"]
    assert (steps[-1].line, steps[-1].path) == (16, "guests.a.vrfs.blue.routes[0]")
    # what a reset rebuilds from the lab's recorded state is the same
    recorded = json.loads(json.dumps(_lab().to_dict()))["guests"]
    assert [s.argv for s in tunnels.steps(tunnels.lab_nets(recorded)["a"])] == [s.argv for s in steps]


def test_a_step_the_guest_refuses_names_its_lab_line() -> None:
    steps = tunnels.steps(tunnels.GuestNet.of(_lab().guests["a"]))
    cmd = tunnels.command(steps)
    assert cmd.count("labctl-tun-failed") == len(steps)
    got = tunnels.problems("noise\nlabctl-tun-failed 2 Error: Unknown device type.\n", "a", steps, "lab.yaml")
    assert [str(p) for p in got] == [("lab.yaml:8: guests.a.tunnels.vx0: guest a: tunnel vx0 (vxlan 42 to "
                                     "10.2.0.2:4789 via eth1): Error: Unknown device type.")]
    assert tunnels.problems("labctl-tun-failed 999 x", "a", steps, "lab.yaml") == []


def test_wireguard_keys_are_new_for_every_up_0600_and_never_on_a_command_line(tmp_path: Path) -> None:
    nets = tunnels.lab_nets(_lab().guests)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    tunnels.make_keys(one, nets)
    tunnels.make_keys(two, nets)
    for d in (one, two):
        assert stat.S_IMODE((d / "wireguard").stat().st_mode) == 0o700
        assert stat.S_IMODE((d / "wireguard" / "a.wg0.key").stat().st_mode) == 0o600
        assert len(base64.b64decode((d / "wireguard" / "a.wg0.key").read_text())) == 32
    assert (one / "wireguard" / "a.wg0.key").read_text() != (two / "wireguard" / "a.wg0.key").read_text()
    assert tunnels.public_key(one, "a", "wg0") != tunnels.public_key(one, "b", "wg0")
    wg = dict(tunnels.wireguard(nets))["a"]
    cmd = tunnels.key_command(nets, wg, tunnels.public_key(one, "b", "wg0"))
    assert (one / "wireguard" / "a.wg0.key").read_text().strip() not in cmd
    assert tunnels.public_key(one, "b", "wg0") in cmd
    assert "endpoint 10.2.0.2:51999 allowed-ips 10.99.0.0/24" in cmd  # the peer's port, the peer's subnet
    assert "cat > /run/labctl-wg/key" in cmd and "rm -f /run/labctl-wg/key" in cmd
    ((job, key),) = tunnels.key_jobs(one, nets, "b")  # b gets a's public key and its own private one
    assert tunnels.public_key(one, "a", "wg0") in job and tunnels.public_key(one, "b", "wg0") not in job
    assert key == one / "wireguard" / "b.wg0.key" and "listen-port 51999" in job and "endpoint" not in job


def test_status_and_the_graph_show_the_tunnels_and_the_vrf() -> None:
    a = _lab().to_dict()["guests"]["a"]
    rows = {v.name: (v.kind, v.detail, v.address_text, v.network) for v in guest_interfaces(a)}
    assert rows["vx0"] == ("tunnel", "vxlan 42 to 10.2.0.2:4789 via eth1", "192.168.42.1/24", "over eth1")
    assert rows["wg0"] == ("tunnel", "wireguard to b.wg0 at 10.2.0.2, port 51820", "10.99.0.1/24", "")
    assert rows["blue"] == ("vrf", "vrf table 10 of vx0; 1 route", "", "")
    assert "tunnel gre1: gre to 10.2.0.2 from 10.1.0.2 key 5" in tunnel_lines(a)
    assert "vrf blue routes: 10.7.0.0/24 via 192.168.42.2" in settings_text(a)
    assert "tunnels" not in _lab().to_dict()["guests"]["b"] or _lab().guests["b"].tunnels


def test_a_guest_without_tunnels_keeps_its_dict_as_before() -> None:
    d = load_lab_text(GOOD.split("    tunnels:")[0] + "\n  b:\n    nics: [{name: eth1, model: virtio, network: right}]\n",
                      "lab.yaml").to_dict()
    assert "tunnels" not in d["guests"]["a"] and "vrfs" not in d["guests"]["a"]


def test_a_vrf_member_must_be_an_interface_of_the_guest() -> None:
    with pytest.raises(LabFileError) as info:
        _lab(LAB)
    assert [str(p) for p in info.value.problems] == [
        "lab.yaml:16: guests.a.vrfs.blue.members: 'eth2x' is not an interface of guest a (did you mean 'eth1'?)"]


def test_the_golden_problems_cover_every_check() -> None:
    expected = (ROOT / "tests" / "labs" / "invalid" / "tunnel-problems.expected").read_text()
    for words in ("unknown tunnel type 'vxlna' (did you mean 'vxlan'?)", "vni 16777216 is out of range",
                  "is not an address of the lab", "table 10 is VRF blue's too", "the kernel's main table",
                  "is an address of guest a itself", "has no wireguard tunnel", "goes through VRF blue's"):
        assert words in expected, words


# --------------------------------------------------------------------------- follow


def _resolved() -> dict[str, object]:
    return _lab().to_dict()


OFF = {"skb_data": 208, "skb_head": 200, "skb_nh": 194, "skb_dev": 16, "dev_name": 0, "skb_protocol": 180}


def test_no_encap_probes_without_a_tunnel_and_ipv6_ones_for_a_filter_of_ipv6() -> None:
    node = parse_filter("icmp")
    plain = load_lab_text(GOOD.split("    tunnels:")[0] + "\n  b:\n    nics: [{name: eth1, model: virtio, network: right}]\n",
                          "lab.yaml").to_dict()
    assert follow_encap.definitions("labctl_t", node, OFF, plain, "a") == ([], {})
    defs, filters = follow_encap.definitions("labctl_t", parse_filter("icmp6"), OFF, _resolved(), "a")
    names = [d.split()[0].split("/")[1] for d in defs]
    assert names and sorted(names) == sorted(filters)  # each with its filter: no IPv4 one, none of IP in IP's
    assert all(n.rpartition("_")[0].endswith("6") for n in names) and not any(n.endswith("_ipip") for n in names)
    assert "encap6_wg" in names and all("pr == 0xdd86" in f for f in filters.values())


def test_the_outer_packets_points_fetch_the_inner_header_and_filter_on_the_vxlan_port() -> None:
    all_defs, filters = follow_encap.definitions("labctl_t", parse_filter("icmp"), OFF, _resolved(), "a")
    ends = [d for d in all_defs if d.split()[0].endswith("_vx") and "/drop" not in d.split()[0]]
    # a ends the tunnel: its encapsulation and decapsulation, the outer packet at the wire's ends and where it forwards one
    assert [d.split()[0] for d in ends] == ["e:labctl_t/xmit_vx", "e:labctl_t/netif_rx_vx", "p:labctl_t/ip_fwd_vx",
                                            "p:labctl_t/encap_vx", "p:labctl_t/decap_vx"]
    assert "saddr=+34(+208(%dx)):u32" in ends[3] and "oid=+4(+208(%dx)):u32" in ends[3]  # at the VXLAN header
    assert "saddr=+42(+208(%si)):u32" in ends[4] and "oid=+12(+208(%si)):u32" in ends[4]  # at the UDP header
    assert "odp" not in filters["encap_vx"] and filters["encap_vx"].endswith("&& ohd == 8")  # Geneve's go there too
    # a router with no tunnel of its own follows the outer packets of each framing at every point, and has no encap or decap
    router = _resolved()
    router["guests"]["r"] = {"name": "r", "nics": []}  # type: ignore[index]
    defs, filters = follow_encap.definitions("labctl_t", parse_filter("icmp"), OFF, router, "r")
    defs = [d for d in defs if "/drop" not in d.split()[0]]  # the outer packet's drops: test_follow_tunnels
    vx = [d for d in defs if d.split()[0].endswith("_vx")]
    assert [d.split()[0] for d in vx] == ["e:labctl_t/dev_queue_vx", "e:labctl_t/xmit_vx", "e:labctl_t/netif_rx_vx",
                                          "p:labctl_t/ip_fwd_vx", "p:labctl_t/ip_local_vx"]
    xmit = vx[1]
    assert "saddr=+76(+208($skbaddr)):u32" in xmit  # 14 + 20 + 8 + 8 + 14 + 12: the inner source
    assert "odp=+36(+208($skbaddr)):u16 ohd=+42(+208($skbaddr)):u32 oid=+46(+208($skbaddr)):u32" in xmit
    assert "saddr=+62(+208(%di)):u32" in vx[3]  # ip_forward: at the outer IPv4 header
    # 4789 in network order, read little-endian; the VXLAN header's flags (0x08: a VNI) read so too
    assert filters["xmit_vx"].endswith("&& opr == 17 && (odp == 46354) && ohd == 8")
    assert sorted({d.split()[0].split("_", 1)[1].rpartition("_")[2] for d in defs}) == [
        "gnv", "grek", "gtap", "ip4in6", "ipip", "vx"]  # ip6tnl's mode ipip6: IPv4 inside IPv6
    assert len(defs) == 6 * 5 and not any("encap" in d or "decap" in d for d in defs)


LINE = ('  <idle>-0 [000] ..s2. 601.000001: xmit_vx: (net.net_dev_start_xmit) skb=0xffff888005fa4b00 dev="eth2" '
        "vi=69 tl=84 id=21400 fo=64 ttl=64 proto=1 saddr=16820416 daddr=33597632 l4a=8 l4b=0 "
        "osa=33554698 oda=33554954 odp=46354 ovni=2752512")


def test_an_outer_event_is_its_points_with_the_outer_header_in_its_note() -> None:
    ev = parse_line(LINE, "r")
    assert ev is not None and ev.point == "xmit" and ev.fields["outer"] == "vx"
    assert identity(ev) is not None
    assert encap.note(ev.point, ev.fields) == "outer VXLAN 10.1.0.2 > 10.2.0.2 udp/4789 vni 42"
    assert encap.note("encap", {"ovni": "2752512"}) == "VXLAN vni 42"
    assert encap.note("xmit", {}) == ""
    assert POINTS["decap"].where == "vxlan_rcv" and POINTS["encap"].where == "udp_tunnel_xmit_skb"


def test_the_graph_lists_a_guests_tunnels_and_vrfs() -> None:
    from labctl.net.graph import to_svg, topology

    node = topology(_lab()).guest("a")
    assert node.tunnels[0] == "tunnel vx0: vxlan 42 to 10.2.0.2:4789 via eth1"
    assert "vrf blue: table 10 of vx0; 1 route" in node.info_text
    assert "tunnel vx0: vxlan 42 to 10.2.0.2:4789 via eth1" in to_svg(topology(_lab()))


def test_a_vxlan_tunnel_that_does_not_learn() -> None:
    """learning: false keeps the remote the only end (a NAT between the ends would move it otherwise)."""
    lab = _lab(GOOD.replace("dev: eth1, ip: 192.168.42.1/24, mtu: 1400}", "dev: eth1, learning: false, ip: 192.168.42.1/24}"))
    vx0 = next(t for t in lab.guests["a"].tunnels if t.name == "vx0")
    assert KINDS["vxlan"].link(vx0)[-1] == "nolearning" and "no learning" in KINDS["vxlan"].describe(vx0)
    learns = next(t for t in _lab().guests["a"].tunnels if t.name == "vx0")
    assert "nolearning" not in KINDS["vxlan"].link(learns)
    with pytest.raises(LabFileError) as info:
        _lab(GOOD.replace("dev: eth1, ip: 192.168.42.1/24, mtu: 1400}", "dev: eth1, learning: 'no', ip: 192.168.42.1/24}"))
    assert any("guests.a.tunnels.vx0.learning: expected true or false, got 'no'" in str(p)
               for p in info.value.problems), info.value.problems


def test_a_guest_with_a_vrf_and_no_tunnel_shows_its_vrf() -> None:
    """labctl.lab.guestnet loads the tunnels' views for a guest with VRFs alone too (status, graph,
    compare)."""
    from labctl.lab.guestnet import guest_interfaces, net_settings, settings_text

    text = """\
name: vrfonly
networks: {left: {}}
guests:
  a:
    nics: [{name: eth1, model: virtio, network: left, ip: 10.1.0.2/24}]
    vrfs:
      blue: {table: 10, members: [eth1], routes: [{to: 10.7.0.0/24, via: 10.1.0.1}]}
"""
    guest = _lab(text).guests["a"].to_dict()
    names = [v.name for v in guest_interfaces(guest)]
    assert "blue" in names, names
    assert any("10.7.0.0/24" in line for line in settings_text(guest)), settings_text(guest)
    assert "blue" in json.dumps(net_settings(guest))
