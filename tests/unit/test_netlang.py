"""The lab file's network language from the model down: addresses (v4 and v6), VLANs, bonds, bridges,
routes and sysctls as the model resolves them, the guest configuration its init applies (and how
the init's failures map back to lines), the QEMU argv, the kernel's needs, and every view of them
(status, graph, handout, report, compare). Real guests: tests/integration/test_netlang.py."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestPlan
from labctl.backends.qemu.argv import build_argv, restores_vlan_filter, vlan_carriers
from labctl.backends.qemu.machines import QemuBackend
from labctl.bundle import Run
from labctl.cli.netview import iface_rows, offload_lines, settings_lines
from labctl.errors import LabFileError
from labctl.image.store import Image
from labctl.kernel.requirements import config_fragment, lab_requirements
from labctl.lab import Bond, Route, guest_interfaces, load_lab, load_lab_text, mgmt_mac, net_settings, nic_addresses
from labctl.net import to_mermaid, to_svg, topology
from labctl.net.plan import plan_networks
from labctl.report.comparison import differences
from labctl.report.document import Meta
from labctl.report.header import header_blocks
from labctl.up import guestconf
from labctl.up.bootargs import kernel_args
from labctl.up.snapshots import key as snapshot_key
from tests.conftest import fake_kernel

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "labs" / "dual-stack-router.yaml"


def test_the_dual_stack_router_lab_resolves_every_setting() -> None:
    lab = load_lab(LAB)
    a, r, b = (lab.guests[g] for g in "arb")
    assert [str(x) for x in r.nics[0].addresses] == ["10.1.0.1/24", "fd00:1::1/64"]
    assert str(r.nics[0].ip) == "10.1.0.1/24" and r.nics[0].vlans[0].name == "eth1.10"
    assert a.nics[0].addresses == () and a.bridges[0].members == ("eth1",) and a.bridges[0].vlans[0].name == "br0.10"
    assert b.bonds == (Bond("bond0", "active-backup", ("eth1", "eth2"),
                            (ipaddress.ip_interface("10.2.0.2/24"), ipaddress.ip_interface("fd00:2::2/64")),
                            miimon=100, primary="eth1", line=b.bonds[0].line),)
    assert [x.text() for x in b.routes] == ["default via 10.2.0.1", "default via fd00:2::1"]
    assert [(s.path, s.value) for s in r.sysctls] == [("net/ipv4/ip_forward", "1"), ("net/ipv6/conf/all/forwarding", "1")]
    assert b.address_keys() == {"b.bond0.ip": "10.2.0.2", "b.bond0.ip4": "10.2.0.2", "b.bond0.ip6": "fd00:2::2"}
    assert a.address_keys()["a.br0.10.ip6"] == "fd00:10::2"
    assert a.tagged_nics() == ["eth1"] and r.tagged_nics() == ["eth1"] and b.tagged_nics() == []
    d = b.to_dict()
    assert d["nics"][0]["addresses"] == [] and d["bonds"][0]["members"] == ["eth1", "eth2"]
    assert d["routes"][1] == {"to": "default", "via": "fd00:2::1", "dev": None, "metric": None, "family": "ipv6"}
    assert r.to_dict()["sysctls"] == [{"name": "net.ipv4.ip_forward", "value": "1"},
                                      {"name": "net.ipv6.conf.all.forwarding", "value": "1"}]


def test_an_ipv6_only_nic_is_its_own_ip_and_unknown_address_keys_are_refused() -> None:
    text = ("name: t\nnetworks: {n: {}}\nguests:\n  g:\n    nics: [{name: eth1, model: e1000, network: n, "
            "ip: \"fd00::1/64\"}]\nsteps:\n  - name: s\n    run:\n      - {guest: g, command: \"ping {{g.eth1.ip}} "
            "{{g.eth1.ip6}} {{g.eth1.ip4}}\"}\n")
    with pytest.raises(LabFileError) as err:
        load_lab_text(text, "t.yaml")
    assert str(err.value) == "t.yaml:9: steps[0].run[0].command: unknown variable '{{g.eth1.ip4}}' (did you mean 'g.eth1.ip'?)"
    lab = load_lab_text(text.replace(" {{g.eth1.ip4}}", ""), "t.yaml")
    assert lab.guests["g"].address_keys() == {"g.eth1.ip": "fd00::1", "g.eth1.ip6": "fd00::1"}


ROUTES = ("name: t\nnetworks: {n: {}}\nguests:\n  g:\n    nics: [{name: eth1, model: e1000, network: n, "
          "ip: [10.0.0.2/24, \"fd00::2/64\"]}]\n    routes:\n      - {to: default, via: VIA1}\n"
          "      - {to: default, via: VIA2, metric: METRIC}\n")


@pytest.mark.parametrize("via1, via2, metric, clash", [
    ("\"fd00::1\"", "\"fd00::3\"", 1024, True),  # the kernel gives an IPv6 route without a metric 1024
    ("\"fd00::1\"", "\"fd00::3\"", 0, False),
    ("10.0.0.1", "10.0.0.3", 0, True),  # ... and an IPv4 one 0
    ("10.0.0.1", "10.0.0.3", 1024, False),
])
def test_two_routes_to_one_destination_with_the_kernels_metric_are_refused(via1: str, via2: str, metric: int,
                                                                           clash: bool) -> None:
    text = ROUTES.replace("VIA1", via1).replace("VIA2", via2).replace("METRIC", str(metric))
    if not clash:
        routes = load_lab_text(text, "t.yaml").guests["g"].routes
        assert [r.metric for r in routes] == [None, metric]
        return
    with pytest.raises(LabFileError) as err:
        load_lab_text(text, "t.yaml")
    assert str(err.value) == (f"t.yaml:8: guests.g.routes[1]: a route to default with metric {metric} is already "
                              "given at line 7 (give this one another metric)")


def test_the_views_read_an_older_labctls_dicts() -> None:
    old = {"nics": [{"name": "eth1", "model": "e1000", "network": "lan", "ip": "10.0.0.1/24"}]}
    assert nic_addresses(old["nics"][0]) == ["10.0.0.1/24"]
    (view,) = guest_interfaces(old)
    assert (view.name, view.kind, view.address_text, view.network) == ("eth1", "nic", "10.0.0.1/24", "lan")
    assert net_settings(old) == {"interfaces": {"eth1": {"what": "nic", "addresses": ["10.0.0.1/24"]}}}


# --------------------------------------------------------------------------- the guest's configuration


def test_the_guest_config_carries_every_setting_in_the_order_init_applies_them() -> None:
    lab = load_lab(LAB)
    lines = guestconf.render(lab.guests["a"], "52:55:00:00:00:01").splitlines()
    assert lines[:2] == ["hostname a", "nic 52:55:00:00:00:01 mgmt0 10.0.2.15/24"]
    assert lines[2].startswith("nic 52:54:00:") and lines[2].endswith(" eth1 -")
    assert lines[3:] == ["bridge 0 br0 eth1", "vlan 3 br0.10 br0 10", "addr 1 br0 10.1.0.2/24",
                         "addr 2 br0 fd00:1::2/64", "addr 4 br0.10 10.10.0.2/24", "addr 5 br0.10 fd00:10::2/64",
                         "route 6 0.0.0.0/0 10.1.0.1 - -", "route 7 ::/0 fd00:1::1 - -", "offloads eth1", "dad wait"]
    b = guestconf.render(lab.guests["b"], "52:55:00:00:00:02").splitlines()
    assert "bond 0 bond0 active-backup 100 eth1 eth1,eth2" in b
    r = guestconf.render(lab.guests["r"], "52:55:00:00:00:03").splitlines()
    assert r[4:] == ["vlan 2 eth1.10 eth1 10", "sysctl 7 net/ipv4/ip_forward 1",
                     "sysctl 8 net/ipv6/conf/all/forwarding 1", "addr 0 eth1 10.1.0.1/24", "addr 1 eth1 fd00:1::1/64",
                     "addr 3 eth1.10 10.10.0.1/24", "addr 4 eth1.10 fd00:10::1/64", "addr 5 eth2 10.2.0.1/24",
                     "addr 6 eth2 fd00:2::1/64", "offloads eth1", "dad wait"]
    items = guestconf.items(lab.guests["r"])
    assert [i.what for i in items] == [
        "address 10.1.0.1/24 on eth1", "address fd00:1::1/64 on eth1", "VLAN 10 (eth1.10) on eth1",
        "address 10.10.0.1/24 on eth1.10", "address fd00:10::1/64 on eth1.10", "address 10.2.0.1/24 on eth2",
        "address fd00:2::1/64 on eth2", "sysctl net.ipv4.ip_forward", "sysctl net.ipv6.conf.all.forwarding"]
    assert items[7].path == "guests.r.sysctls.net.ipv4.ip_forward"
    assert items[1].path == "guests.r.nics[0].ip[1]"
    # a v4-only guest waits for no DAD
    v4 = load_lab_text("name: t\nnetworks: {n: {}}\nguests:\n  g:\n    nics: [{name: eth1, model: e1000, network: n, "
                       "ip: 10.0.0.1/24}]\n", "t.yaml")
    assert "dad wait" not in guestconf.render(v4.guests["g"], "52:55:00:00:00:01")


def test_the_inits_failures_become_the_lab_files_lines() -> None:
    lab = load_lab(LAB)
    r = lab.guests["r"]
    console = (b"booting\nlabctl-init: config 7: this kernel has no such sysctl (no /proc/sys/net/ipv4/ip_forward)\n"
               b"LABCTL-FAILED config 7: this kernel has no such sysctl (no /proc/sys/net/ipv4/ip_forward)\r\n"
               b"LABCTL-FAILED config 99: out of range\nLABCTL-FAILED no NIC with MAC x\n"
               b"LABCTL-FAILED config 3: Error: Nexthop has invalid gateway.\n")
    problems = [str(p) for p in guestconf.config_failures(console, r, "lab.yaml")]
    line = r.sysctls[0].line
    assert problems == [
        (f"lab.yaml:{line}: guests.r.sysctls.net.ipv4.ip_forward: guest r: sysctl net.ipv4.ip_forward: "
        "this kernel has no such sysctl (no /proc/sys/net/ipv4/ip_forward)"),
        (f"lab.yaml:{r.nics[0].vlans[0].line}: guests.r.nics[0].vlans[0].ip[0]: guest r: address 10.10.0.1/24 on "
        "eth1.10: Error: Nexthop has invalid gateway.")]


def test_the_vlan_offloads_the_guest_said() -> None:
    console = (b"x\nLABCTL-OFFLOADS eth1 rx-vlan-offload=on tx-vlan-offload=on,fixed rx-vlan-filter=off,fixed\n"
               b"LABCTL-OFFLOADS eth2\nLABCTL-OFFLOADS eth3 rx-vlan-offload=\x1b[2J\n")
    assert guestconf.offloads(console) == {
        "eth1": {"rx-vlan-offload": "on", "tx-vlan-offload": "on [fixed]", "rx-vlan-filter": "off [fixed]"},
        "eth2": {}}


# --------------------------------------------------------------------------- QEMU, the kernel, snapshots


def _plan(tmp_path: Path, lab_path: Path, guest: str) -> GuestPlan:
    lab = load_lab(lab_path)
    g = lab.guests[guest]
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": ["quiet"], "kernel": {"release": "6.1"}})
    segs = plan_networks(lab, tmp_path / "net")
    ports = {n.name: next(p for p in segs[n.network].ports if p.guest == g.name and p.nic == n.name) for n in g.nics}
    return GuestPlan(lab.name, g, tmp_path / "guests" / g.name, img, "tcg", 40000, mgmt_mac(lab.name, g.name), ports,
                     ("console=ttyS0",), fake_kernel(tmp_path / "kernel"), tmp_path / "initrd.img")


def test_qemu_before_8_1_gets_virtio_nics_that_carry_vlans_without_a_vlan_filter(tmp_path: Path) -> None:
    assert not restores_vlan_filter("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)")
    assert restores_vlan_filter("QEMU emulator version 8.1.0") and restores_vlan_filter("QEMU emulator version 10.0.2")
    assert not restores_vlan_filter("unknown")
    r = _plan(tmp_path, LAB, "r")
    devices = [a for a in build_argv(r, vlan_filter=False) if a.startswith("virtio-net-pci,netdev=lab")]
    assert devices == [f"virtio-net-pci,netdev=lab0,mac={r.guest.nics[0].mac},ctrl_vlan=off"]
    assert not any("ctrl_vlan" in a for a in build_argv(r, vlan_filter=True))
    bonded = dataclasses.replace(r.guest, bonds=(Bond("bond0", "active-backup", ("eth2",), vlans=r.guest.nics[0].vlans),))
    assert vlan_carriers(bonded) == {"eth1", "eth2"}  # a bond gives its VLANs to its members
    assert vlan_carriers(load_lab(LAB).guests["a"]) == set()  # a bridge makes its ports promiscuous


def test_a_guest_with_bonds_boots_with_no_bond_of_the_drivers_own(tmp_path: Path) -> None:
    lab = load_lab(LAB)
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": [], "kernel": {"release": "6.1"}})
    kernel = fake_kernel(tmp_path / "kernel")
    assert "bonding.max_bonds=0" in kernel_args(img, lab.guests["b"], kernel)
    assert "bonding.max_bonds=0" not in kernel_args(img, lab.guests["r"], kernel)


def test_the_snapshot_key_follows_the_network_settings(tmp_path: Path) -> None:
    plan = _plan(tmp_path, LAB, "b")

    def key(guest: Any) -> str:
        return snapshot_key(dataclasses.replace(plan, guest=guest), QemuBackend())

    g = plan.guest
    base = key(g)
    route = Route(ipaddress.ip_network("10.9.0.0/16"), ipaddress.ip_address("10.2.0.1"))
    assert key(dataclasses.replace(g, routes=(*g.routes, route))) != base
    assert key(dataclasses.replace(g, sysctls=load_lab(LAB).guests["r"].sysctls)) != base
    assert key(dataclasses.replace(g, bonds=(dataclasses.replace(g.bonds[0], mode="balance-rr", primary=None),))) != base
    moved = dataclasses.replace(g, routes=tuple(dataclasses.replace(x, line=x.line + 7) for x in g.routes))
    assert key(moved) == base  # a setting's line is no part of it


def test_the_lab_needs_ipv6_vlans_bonding_and_bridges_of_the_kernel() -> None:
    lab = load_lab(LAB)
    needs = {(r.guest, r.key): (r.line, r.path) for r in lab_requirements(lab) if r.key in
             ("ipv6", "vlan", "bonding", "bridge")}
    a, b = lab.guests["a"], lab.guests["b"]
    assert needs[("a", "bridge")] == (a.bridges[0].line, "guests.a.bridges.br0")
    assert needs[("a", "vlan")] == (a.bridges[0].vlans[0].line, "guests.a.bridges.br0.vlans[0]")
    assert needs[("b", "bonding")] == (b.bonds[0].line, "guests.b.bonds.bond0")
    assert needs[("r", "ipv6")][1] == "guests.r.nics[0].ip"
    assert ("b", "vlan") not in needs
    fragment = config_fragment(lab)
    for option in ("IPV6", "VLAN_8021Q", "BRIDGE", "NETDEVICES", "MODULES"):
        assert f"CONFIG_{option}=y" in fragment, option
    assert "CONFIG_BONDING=m" in fragment  # Kconfig holds it to a module where TLS is one


# --------------------------------------------------------------------------- views


def test_status_rows_and_lines() -> None:
    lab = load_lab(LAB)
    b = lab.guests["b"].to_dict()
    rows = iface_rows(b, [{**n, "driver": "e1000" if n["model"] == "e1000" else "virtio_net"} for n in b["nics"]])
    assert [r[:5] for r in rows] == [
        ("eth1", "e1000", "e1000", "in bond0", "pair"), ("eth2", "virtio-net-pci", "virtio_net", "in bond0", "pair"),
        ("bond0", "active-backup bond of eth1, eth2", "bonding", "10.2.0.2/24\nfd00:2::2/64", "pair")]
    a = lab.guests["a"].to_dict()
    assert [r[:2] for r in iface_rows(a, a["nics"])][2] == ("br0.10", "vlan 10 of br0")
    assert settings_lines("b", b) == ["b routes: default via 10.2.0.1; default via fd00:2::1"]
    assert offload_lines("r", [{"name": "eth1", "vlan_offloads": {"rx-vlan-offload": "off [fixed]"}}, {"name": "eth2"}]) \
        == ["r eth1 VLAN offloads: rx-vlan-offload off [fixed]"]


def test_the_graph_draws_vlans_bonds_and_bridges() -> None:
    topo = topology(load_lab(LAB))
    a, b = topo.guest("a"), topo.guest("b")
    assert a.nics[0].master == "br0" and a.nics[0].address_text == "in br0"
    assert [m.title for m in (*a.masters, *b.masters)] == ["br0 bridge: eth1", "bond0 active-backup: eth1, eth2"]
    assert a.masters[0].vlans[0].text == "vlan 10 br0.10: 10.10.0.2/24, fd00:10::2/64"
    assert topo.network("left").tags == (10,) and topo.network("pair").tags == ()
    assert "vlans 10" in topo.network("left").detail_lines
    svg = to_svg(topo)
    assert 'class="master bond"' in svg and 'class="master bridge"' in svg and "vlan 10 eth1.10: 10.10.0.1/24" in svg
    mermaid = to_mermaid(topo)
    assert "g2n0 -.- g2m0" in mermaid and "g2n1 -.- g2m0" in mermaid and "fd00:2::1/64" in mermaid


def _run(tmp_path: Path, name: str, lab_text: str) -> Run:
    lab = load_lab_text(lab_text, "lab.yaml")
    manifest = {"lab": {"name": lab.name, "sha256": lab.sha256, "resolved": lab.to_dict()}}
    return Run(tmp_path / name, manifest, {"lab": lab.name})


def test_the_run_card_lists_routes_and_sysctls_and_compare_names_what_changed(tmp_path: Path) -> None:
    text = LAB.read_text()
    a = _run(tmp_path, "a", text)
    meta = next(b for b in header_blocks(a) if isinstance(b, Meta))
    rows = {k: "".join(s.text for s in v) for k, v in meta.rows}
    assert rows["sysctls of r"] == "net.ipv4.ip_forward=1, net.ipv6.conf.all.forwarding=1"
    assert rows["routes of b"] == "default via 10.2.0.1; default via fd00:2::1"
    changed = (text.replace("net.ipv4.ip_forward: 1", "net.ipv4.ip_forward: 0")
               .replace("primary: eth1, ip: [10.2.0.2/24", "primary: eth2, ip: [10.2.0.3/24")
               .replace("{to: default, via: \"fd00:2::1\"}", "{to: \"fd00:1::/64\", via: \"fd00:2::1\"}")
               .replace("mode: active-backup", "mode: balance-xor").replace("primary: eth2, ", ""))
    diff = {d["what"]: (d["a"], d["b"]) for d in differences(a, _run(tmp_path, "b", changed))}
    assert diff["sysctl net.ipv4.ip_forward of r"] == ("1", "0")
    assert diff["interface b.bond0"] == ("bond active-backup bond of eth1, eth2, 10.2.0.2/24, fd00:2::2/64",
                                         "bond balance-xor bond of eth1, eth2, 10.2.0.3/24, fd00:2::2/64")
    assert diff["routes of b"] == ("default via 10.2.0.1; default via fd00:2::1",
                                   "default via 10.2.0.1; fd00:1::/64 via fd00:2::1")
    assert not any(k.startswith(("interface a.", "addresses of a.", "routes of a")) for k in diff)
    # an address alone, and a sysctl only one run sets
    moved = (text.replace('ip: [10.1.0.1/24, "fd00:1::1/64"]', 'ip: [10.1.0.1/24, "fd00:1::3/64"]')
             .replace("net.ipv6.conf.all.forwarding: 1\n",
                      "net.ipv6.conf.all.forwarding: 1\n      net.ipv4.conf.all.rp_filter: 2\n"))
    diff = {d["what"]: (d["a"], d["b"]) for d in differences(a, _run(tmp_path, "c", moved))}
    assert diff["addresses of r.eth1"] == ("10.1.0.1/24, fd00:1::1/64", "10.1.0.1/24, fd00:1::3/64")
    assert diff["sysctl net.ipv4.conf.all.rp_filter of r"] == ("not set", "2")
    assert [k for k in diff if k != "lab file sha256"] == ["addresses of r.eth1", "sysctl net.ipv4.conf.all.rp_filter of r"]


def test_a_handout_lists_every_interface_and_the_routes(tmp_path: Path) -> None:
    from labctl.state.runstate import LabState
    from labctl.training.handout import _readme

    state = LabState(lab="dual-stack-router@al", source=str(LAB), dir=str(tmp_path), backend="qemu", accel="tcg",
                     image={}, started_at="", resolved=load_lab(LAB).to_dict())
    text = _readme(state, "al", tmp_path, [])
    assert "| b | bond0 (active-backup bond of eth1, eth2) | 10.2.0.2/24<br>fd00:2::2/64 | pair |" in text
    assert "| a | br0.10 (vlan 10 of br0) | 10.10.0.2/24<br>fd00:10::2/64 | left (tag 10) |" in text
    assert "- r sysctls: net.ipv4.ip_forward=1, net.ipv6.conf.all.forwarding=1" in text


def test_once_its_own_key_is_handed_over_a_guest_boots_with_a_listening_sshd(tmp_path: Path) -> None:
    """A boot that became the post-boot snapshot ran only a standby sshd; a later boot of that QEMU
    (a reset whose snapshot was pruned meanwhile) must not wait for a key nobody hands it."""
    from labctl.up.warm import BOOT_KEY, CONFIG, HOST_KEY, boot_with_own_key

    (tmp_path / HOST_KEY).write_text("OWN KEY\n")
    conf = tmp_path / CONFIG
    conf.write_text("hostname a\nnic 52:55:00:00:00:01 mgmt0 10.0.2.15/24\nsshd standby\nnic 52:54:00:00:00:02 eth1 -\n")
    boot_with_own_key(tmp_path)
    assert conf.read_text() == "hostname a\nnic 52:55:00:00:00:01 mgmt0 10.0.2.15/24\nnic 52:54:00:00:00:02 eth1 -\n"
    assert (tmp_path / BOOT_KEY).read_text() == "OWN KEY\n"
