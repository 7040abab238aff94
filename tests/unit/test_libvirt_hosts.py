"""Labs across libvirt hosts, as data: URIs, placement, link plans, volume and domain XML."""

from __future__ import annotations

import os
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from labctl.backends.base import GuestPlan
from labctl.backends.libvirt import storage
from labctl.backends.libvirt.host import QemuUser
from labctl.backends.libvirt.xml import FW_CFG_NAMES, QEMU_NS, DomainFiles, build_domain, planned_files
from labctl.backends.owned import backends, entries, record
from labctl.backends.qemu.argv import lab_nic_args
from labctl.errors import LabFileError, UsageError
from labctl.image.store import Image
from labctl.lab import load_lab_text
from labctl.lab.addresses import mgmt_mac
from labctl.lab.hosts import host_place, place_guests
from labctl.lab.uri import parse_uri, with_no_verify
from labctl.net.plan import ALONE, DIRECT, SWITCH, UDP, UdpAddr, plan_networks
from labctl.ssh import Endpoint
from tests.conftest import fake_kernel

REMOTE = "qemu+ssh://root@127.0.0.1:2222/system?keyfile=/k/id"


def _lab(hosts: str, guests: dict[str, tuple[str | None, list[str]]], nets: tuple[str, ...] = ("l",)) -> Any:
    """A lab: guest -> (host or None, [networks of its NICs])."""
    lines = ["name: t", "backend: libvirt", f"hosts: {hosts}", "networks:"]
    lines += [f"  {n}: {{}}" for n in nets]
    lines.append("guests:")
    for g, (host, networks) in guests.items():
        nics = ", ".join(f"{{name: eth{i + 1}, model: e1000, network: {n}}}" for i, n in enumerate(networks))
        lines.append(f"  {g}: {{{f'host: {host}, ' if host else ''}nics: [{nics}]}}")
    return load_lab_text("\n".join(lines) + "\n", "t.yaml")


def _ports() -> Any:
    counter = iter(range(50000, 51000))
    return lambda: next(counter)


# --- URIs -----------------------------------------------------------------------------------------

def test_remote_uri_gives_the_ssh_account() -> None:
    uri = parse_uri(with_no_verify(REMOTE))  # what --no-verify-host-keys makes of it
    assert uri.remote and uri.default_address == "127.0.0.1"
    hop = uri.ssh_hop()
    assert hop is not None
    assert (hop.user, hop.host, hop.port, hop.keyfile, hop.no_verify) == ("root", "127.0.0.1", 2222, "/k/id", True)
    assert not parse_uri(REMOTE).ssh_hop().no_verify  # type: ignore[union-attr]
    plain = parse_uri("qemu+ssh://lab2/system").ssh_hop()
    assert plain is not None and plain.port == 22 and plain.keyfile is None and not plain.no_verify


def test_local_uri_has_no_ssh_and_a_loopback_address() -> None:
    uri = parse_uri("qemu:///system")
    assert not uri.remote and uri.ssh_hop() is None and uri.default_address == "127.0.0.1"


@pytest.mark.parametrize(("text", "message"), [
    ("qemu://lab2/system", "names a host without SSH"),
    ("qemu+tls://lab2/system", "unsupported libvirt URI"),
    ("qemu+ssh:///system", "needs a host name"),
    ("qemu:///nowhere", "must end in /system or /session"),
    ("qemu+ssh://lab2/system?command=./prog", "parameters labctl does not pass on: command"),
    ("qemu+ssh://lab2/system?socket=/tmp/x&netcat=nc", "parameters labctl does not pass on: netcat, socket"),
    ("qemu+ssh://-oProxyCommand=x/system", "needs a host name|invalid"),
    ("qemu+ssh://a;b@lab2/system", "invalid user name"),
])
def test_unusable_uris_are_explained(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_uri(text)


# --- placement and link plans ---------------------------------------------------------------------

def test_guests_without_host_run_on_the_backends_uri() -> None:
    lab = _lab(f'{{h2: {{uri: "{REMOTE}"}}}}', {"a": (None, ["l"]), "b": ("h2", ["l"])})
    places = place_guests(lab, "qemu:///system")
    assert (places["a"].name, places["a"].uri, places["a"].remote) == ("local", "qemu:///system", False)
    assert (places["b"].name, places["b"].remote, places["b"].address) == ("h2", True, "127.0.0.1")


def test_a_link_across_hosts_is_a_udp_tunnel_between_the_host_addresses() -> None:
    lab = _lab(f'{{h1: {{uri: "qemu:///system"}}, h2: {{uri: "{REMOTE}"}}}}',
               {"a": ("h1", ["l"]), "b": ("h2", ["l"])})
    seg = plan_networks(lab, Path("/n"), place_guests(lab, "qemu:///system"), _ports())["l"]
    assert seg.mechanism == UDP == "udp-tunnel"
    a, b = seg.ports
    assert isinstance(a.local, UdpAddr) and a.remote == b.local and b.remote == a.local
    assert a.local != b.local
    netdev = lab_nic_args(lab.guests["a"].nics[0], a)[1]
    assert f"local.type=inet,local.host=127.0.0.1,local.port={a.local.port}" in netdev
    assert f"remote.type=inet,remote.host=127.0.0.1,remote.port={b.local.port}" in netdev
    view = seg.to_dict(place_guests(lab, "qemu:///system"))
    assert view["mechanism"] == "udp-tunnel" and [p["host"] for p in view["ports"]] == ["h1", "h2"]


def test_tunnel_ends_bind_their_own_hosts_address() -> None:
    lab = _lab('{h1: {uri: "qemu+ssh://lab1/system"}, h2: {uri: "qemu+ssh://lab2/system", address: 192.0.2.2}}',
               {"a": ("h1", ["l"]), "b": ("h2", ["l"])})
    a, b = plan_networks(lab, Path("/n"), place_guests(lab, "qemu:///system"), _ports())["l"].ports
    assert isinstance(a.local, UdpAddr) and isinstance(b.local, UdpAddr)
    assert (a.local.host, b.local.host) == ("lab1", "192.0.2.2")


def test_same_host_links_keep_unix_sockets_and_the_switch() -> None:
    lab = _lab('{h1: {uri: "qemu:///system"}, also: {uri: "qemu:///system"}}',
               {"a": ("h1", ["p", "s"]), "b": ("also", ["p", "s"]), "c": (None, ["s"])}, nets=("p", "s", "x"))
    segs = plan_networks(lab, Path("/n"), place_guests(lab, "qemu:///system"), _ports())
    assert segs["p"].mechanism == DIRECT == "unix-dgram" and segs["s"].mechanism == SWITCH
    assert all(isinstance(p.local, Path) for s in segs.values() for p in s.ports)
    assert plan_networks(lab, Path("/n"))["p"].mechanism == DIRECT  # no hosts: everything here


def test_two_guests_on_one_remote_host_use_its_loopback() -> None:
    lab = _lab(f'{{h2: {{uri: "{REMOTE.replace("127.0.0.1", "lab2")}"}}}}',
               {"a": ("h2", ["l", "one"]), "b": ("h2", ["l"])}, nets=("l", "one"))
    segs = plan_networks(lab, Path("/n"), place_guests(lab, "qemu:///system"), _ports())
    a, _b = segs["l"].ports
    assert segs["l"].mechanism == UDP and isinstance(a.local, UdpAddr) and a.local.host == "127.0.0.1"
    assert segs["one"].mechanism == ALONE and isinstance(segs["one"].ports[0].local, UdpAddr)


def test_three_guests_across_hosts_are_refused() -> None:
    # what the file decides is refused when it is loaded, with the network's line
    with pytest.raises(LabFileError, match="t.yaml:5: networks.l: network l has 3 guests and spans hosts h2, local"):
        _lab(f'{{h2: {{uri: "{REMOTE}"}}}}', {"a": (None, ["l"]), "b": ("h2", ["l"]), "c": ("h2", ["l"])})
    # the default host's URI comes from the environment: up checks the plan again
    lab = _lab("{}", {"a": (None, ["l"]), "b": (None, ["l"]), "c": (None, ["l"])})
    with pytest.raises(UsageError, match="network l has 3 guests and is on remote host local"):
        plan_networks(lab, Path("/n"), place_guests(lab, REMOTE), _ports())


def test_a_loopback_end_cannot_reach_a_routable_host() -> None:
    lab = _lab('{h2: {uri: "qemu+ssh://root@lab2/system"}}', {"a": (None, ["l"]), "b": ("h2", ["l"])})
    with pytest.raises(UsageError, match="local's address is a loopback address") as info:
        plan_networks(lab, Path("/n"), place_guests(lab, "qemu:///system"), _ports())
    assert info.value.hint and "hosts.local.address" in info.value.hint


def test_hosts_imply_the_libvirt_backend_in_the_resolved_lab() -> None:
    lab = load_lab_text(f'name: t\nhosts: {{h2: {{uri: "{REMOTE}"}}}}\nnetworks: {{}}\nguests:\n  a: {{host: h2}}\n',
                        "t.yaml")
    assert lab.backend == "libvirt" and lab.uses_hosts
    assert lab.to_dict()["hosts"]["h2"]["uri"] == REMOTE and lab.to_dict()["guests"]["a"]["host"] == "h2"


# --- storage and domain XML -----------------------------------------------------------------------

def test_overlay_volume_is_qcow2_backed_by_the_raw_rootfs() -> None:
    vol = ET.fromstring(storage.volume_xml("d.qcow2", 1 << 30, fmt="qcow2", backing="/p/rootfs"))
    assert vol.findtext("name") == "d.qcow2" and vol.findtext("capacity") == str(1 << 30)
    assert vol.find("target/format").get("type") == "qcow2"  # type: ignore[union-attr]
    assert vol.findtext("target/permissions/mode") == "0600"
    assert vol.find("target/permissions/owner") is None  # libvirtd's own user unless told
    assert vol.findtext("backingStore/path") == "/p/rootfs"
    assert vol.find("backingStore/format").get("type") == "raw"  # type: ignore[union-attr]
    pool = ET.fromstring(storage.pool_xml())
    assert pool.get("type") == "dir" and pool.findtext("target/path") == storage.POOL_DIR


def test_image_volume_names_carry_the_sum() -> None:
    img = Image("debian-12", "k", Path("/i"), {})
    assert storage.image_volume_name(img, "rootfs.img", "ab" * 32) == "debian-12-rootfs.img-" + "ab" * 8


def test_hole_handler_walks_a_sparse_file(tmp_path: Path) -> None:
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.write(b"x" * 4096)
        f.seek(1 << 20)
        f.write(b"y" * 4096)
        f.truncate(2 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        sections = []
        pos = 0
        while pos < (2 << 20):
            in_data, length = storage._hole(None, fd)
            sections.append((in_data, length))
            pos = os.lseek(fd, length, os.SEEK_CUR)
    finally:
        os.close(fd)
    assert sum(n for _, n in sections) == 2 << 20
    if sections == [(True, 2 << 20)]:
        pytest.skip("this file system does not report holes (SEEK_DATA): the whole file is data")
    assert [d for d, _ in sections] == [True, False, True, False]
    assert sum(n for d, n in sections if d) < 1 << 20  # holes are not sent


def _plan(tmp_path: Path) -> GuestPlan:
    lab = _lab(f'{{h2: {{uri: "{REMOTE}"}}}}', {"a": ("h2", ["l"])})
    hosts = place_guests(lab, "qemu:///system")
    seg = plan_networks(lab, tmp_path, hosts, _ports())["l"]
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": [], "kernel": {"release": "6.1"}})
    return GuestPlan("t", lab.guests["a"], tmp_path / "a", img, "tcg", 40000, mgmt_mac("t", "a"),
                     {"eth1": seg.ports[0]}, ("console=ttyS0",), fake_kernel(tmp_path / "kernel"),
                     tmp_path / "initrd.img", host=hosts["a"])


def test_remote_domain_uses_pool_volumes_and_a_pty_console(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    fw = {n: f"/pool/v-{i}" for i, n in enumerate(FW_CFG_NAMES)}
    files = DomainFiles("/pool/vmlinux", "/pool/initrd", "/pool/disk.qcow2", fw, "/run/x/gdb.sock")
    dom = build_domain(plan, QemuUser(64055, 107), files=files)
    assert dom.findtext("os/kernel") == "/pool/vmlinux" and dom.findtext("os/initrd") == "/pool/initrd"
    assert dom.find("devices/disk/source").get("file") == "/pool/disk.qcow2"  # type: ignore[union-attr]
    assert dom.find("devices/serial").get("type") == "pty"  # type: ignore[union-attr]
    assert dom.find("devices/serial/source") is None
    assert {e.get("name"): e.get("file") for e in dom.findall("sysinfo/entry")} == fw
    assert dom.findtext("description") == f"labctl run directory {plan.dir}"
    args = [a.get("value") for a in dom.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert any(a and a.startswith("dgram,id=lab0,local.type=inet") for a in args)
    assert "socket,id=gdb0,path=/run/x/gdb.sock,server=on,wait=off" in args  # on the host, in its 0700 dir
    assert str(tmp_path) not in ET.tostring(dom, encoding="unicode").replace(str(plan.dir), "")


def test_a_local_guest_uses_its_hosts_pool_and_directory_too(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    files = planned_files(plan)
    assert files.disk == f"{storage.POOL_DIR}/labctl-t-a-disk.qcow2"
    assert files.gdb_socket == "/var/lib/libvirt/labctl-run/labctl-t-a/gdb.sock"
    text = ET.tostring(build_domain(plan, QemuUser(64055, 107)), encoding="unicode")
    assert str(tmp_path) not in text.replace(str(plan.dir), "")  # nothing of root's run directory


def test_remote_guests_ssh_goes_through_the_host(tmp_path: Path) -> None:
    hop = host_place("h2", with_no_verify(REMOTE)).ssh_hop
    ep = Endpoint("b", 40001, tmp_path / "id", tmp_path / "kh", via=hop)
    argv = ep.openssh_argv()
    (proxy,) = [a for a in argv if a.startswith("ProxyCommand=")]
    cmd = shlex.split(proxy.split("=", 1)[1])
    assert cmd[:1] == ["ssh"] and cmd[-4:] == ["-W", "127.0.0.1:40001", "--", "127.0.0.1"]
    assert ["-p", "2222"] == cmd[1:3] and "/k/id" in cmd and "StrictHostKeyChecking=no" in cmd
    assert not any(a.startswith("ProxyCommand") for a in Endpoint("a", 1, Path("k"), Path("h")).openssh_argv())


def test_ownership_journal_lists_each_thing_once(tmp_path: Path) -> None:
    gdir = tmp_path / "guests" / "b"
    gdir.mkdir(parents=True)
    vol = {"backend": "libvirt", "kind": "volume", "name": "v"}
    record(gdir, vol)
    record(gdir, vol)
    record(gdir, {"backend": "libvirt", "kind": "domain", "name": "d"})
    assert [e["kind"] for e in entries(gdir)] == ["volume", "domain"]
    assert backends(tmp_path) == {"libvirt": [gdir]}
    assert entries(tmp_path / "nowhere") == []


class _Vol:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.deleted = False

    def delete(self, _flags: int) -> None:
        self.deleted = True


def test_a_volume_without_its_sum_marker_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    vols = {"img": _Vol(b"partial"), "ok": _Vol(b""), "ok.sha256": _Vol(b"abc  rootfs.img\n")}
    monkeypatch.setattr(storage, "lookup_volume", lambda _pool, name: vols.get(name))
    monkeypatch.setattr(storage, "read_volume", lambda _conn, vol: vol.data)
    monkeypatch.setattr(storage, "delete_volume", lambda _pool, name: vols.pop(name, None) is not None)
    assert storage._verified(None, None, "ok", "abc") is True
    assert storage._verified(None, None, "img", "abc") is False and "img" not in vols
    assert storage._verified(None, None, "ok", "other") is False and "ok" not in vols  # a new build's sum
