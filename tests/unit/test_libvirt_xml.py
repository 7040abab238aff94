"""The libvirt domain XML is data: built from the plan, checked here."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from labctl.backends import get_backend
from labctl.backends.base import GuestPlan
from labctl.backends.libvirt.api import HostFacts, libvirt_uri
from labctl.backends.libvirt.api import log_reason as _log_reason
from labctl.backends.libvirt.host import RUN_ROOT, QemuUser
from labctl.backends.libvirt.storage import POOL_DIR
from labctl.backends.libvirt.xml import (
    FIRST_NIC_SLOT,
    QEMU_NS,
    domain_name,
    pin_pci_slot,
)
from labctl.backends.libvirt.xml import build_domain as _build_domain
from labctl.backends.libvirt.xml import domain_xml as _domain_xml
from labctl.backends.qemu.argv import lab_nic_args, mgmt_nic_args
from labctl.image.store import Image
from labctl.lab import load_lab
from labctl.lab.addresses import mgmt_mac
from labctl.net.plan import plan_networks
from tests.conftest import fake_kernel

ROOT = Path(__file__).resolve().parents[2]
Q = f"{{{QEMU_NS}}}"
QEMU_USER = QemuUser(64055, 107)  # Debian's libvirt-qemu:kvm
SUMS = {f: {"sha256": c * 64} for f, c in (("vmlinux", "a"), ("initrd.img", "b"), ("rootfs.img", "c"))}


def build_domain(plan: GuestPlan, user: QemuUser = QEMU_USER, **kw: object) -> ET.Element:
    return _build_domain(plan, user, **kw)  # type: ignore[arg-type]


def domain_xml(plan: GuestPlan, user: QemuUser = QEMU_USER) -> str:
    return _domain_xml(plan, user)


def _plans(tmp_path: Path, lab_file: Path = ROOT / "labs" / "quickstart.yaml", accel: str = "tcg") -> dict[str, GuestPlan]:
    lab = load_lab(lab_file)
    img = Image("debian-12", "k", tmp_path / "img", {"boot_args": ["quiet"], "kernel": {"release": "6.1"},
                                                     "files": SUMS})
    segs = plan_networks(lab, tmp_path / "net")
    plans = {}
    for i, g in enumerate(lab.guests.values()):
        ports = {n.name: next(p for p in segs[n.network].ports if p.guest == g.name and p.nic == n.name)
                 for n in g.nics}
        plans[g.name] = GuestPlan(lab.name, g, tmp_path / g.name, img, accel, 40000 + i,
                                  mgmt_mac(lab.name, g.name), ports, ("console=ttyS0", "quiet"),
                                  fake_kernel(tmp_path / "kernel"), tmp_path / "initrd.img")
    return plans


def _find(el: ET.Element, path: str) -> ET.Element:
    found = el.find(path)
    assert found is not None, path
    return found


def _args(dom: ET.Element) -> list[str]:
    return [a.get("value", "") for a in dom.findall(f"{Q}commandline/{Q}arg")]


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_xml_is_well_formed_and_names_the_domain(tmp_path: Path) -> None:
    plan = _plans(tmp_path)["a"]
    text = domain_xml(plan)
    dom = ET.fromstring(text)  # parses: well formed
    assert dom.tag == "domain" and dom.get("type") == "qemu"
    assert dom.findtext("name") == domain_name("quickstart", "a") == "labctl-quickstart-a"
    assert 'xmlns:qemu="http://libvirt.org/schemas/domain/qemu/1.0"' in text
    assert dom.findtext("memory") == str(plan.guest.memory) and _find(dom, "memory").get("unit") == "MiB"
    assert dom.findtext("vcpu") == str(plan.guest.cpus)


def test_direct_kernel_boot_disk_console_and_panic(tmp_path: Path) -> None:
    plan = _plans(tmp_path)["b"]
    dom = build_domain(plan)
    assert _find(dom, "os/type").get("machine") == "pc"
    # the kernel's volumes in the host's pool, named with its manifest's sums (never the root-only cache)
    assert dom.findtext("os/kernel") == f"{POOL_DIR}/kernel-boot-{'a' * 16}"
    assert dom.findtext("os/initrd") == f"{POOL_DIR}/kernel-initrd-..."  # named by its sum once it is placed
    assert dom.findtext("os/cmdline") == "console=ttyS0 quiet"
    disk, mods = dom.findall("devices/disk")
    assert _find(disk, "source").get("file") == f"{POOL_DIR}/labctl-quickstart-b-disk.qcow2"
    assert _find(disk, "target").get("bus") == "virtio" and _find(disk, "target").get("dev") == "vda"
    assert _find(disk, "driver").get("type") == "qcow2"
    # the kernel's modules: a second, read-only disk
    assert _find(mods, "source").get("file") == f"{POOL_DIR}/kernel-modules-{'c' * 16}"
    assert _find(mods, "target").get("dev") == "vdb" and mods.find("readonly") is not None
    # a pty, read by labctl's relay through libvirt: no console file in a directory QEMU can write
    assert _find(dom, "devices/serial").get("type") == "pty"
    assert dom.find("devices/serial/source") is None
    assert _find(dom, "devices/console/target").get("type") == "serial"
    assert _find(dom, "devices/panic").get("model") == "isa"
    assert dom.find("features/acpi") is not None  # the power button that 'down' presses
    assert dom.findtext("on_reboot") == "destroy"


def test_fw_cfg_entries_are_the_qemu_backends(tmp_path: Path) -> None:
    plan = _plans(tmp_path)["c"]
    sysinfo = _find(build_domain(plan), "sysinfo")
    assert sysinfo.get("type") == "fwcfg"
    entries = {e.get("name"): e.get("file") for e in sysinfo.findall("entry")}
    assert entries == {"opt/labctl/guest": f"{POOL_DIR}/labctl-quickstart-c-guest",
                       "opt/labctl/authorized_keys": f"{POOL_DIR}/labctl-quickstart-c-authorized_keys",
                       "opt/labctl/host_key": f"{POOL_DIR}/labctl-quickstart-c-host_key"}


def test_every_nic_reaches_qemu_as_the_qemu_backend_builds_it(tmp_path: Path) -> None:
    for plan in _plans(tmp_path).values():
        args = _args(build_domain(plan))
        mgmt = mgmt_nic_args(plan)
        assert mgmt[1] in _pairs(args, "-netdev")
        assert f"{mgmt[3]},bus=pci.0,addr={FIRST_NIC_SLOT:#x}" in _pairs(args, "-device")
        for nic in plan.guest.nics:
            lab = lab_nic_args(nic, plan.ports[nic.name])
            assert lab[1] in _pairs(args, "-netdev")
            assert any(d.startswith(lab[3] + ",bus=pci.0,addr=") for d in _pairs(args, "-device"))
        (user,) = [n for n in _pairs(args, "-netdev") if n.startswith("user,")]
        assert "restrict=on" in user and f"hostfwd=tcp:127.0.0.1:{plan.ssh_port}-:22" in user


def test_nics_get_distinct_pci_slots_clear_of_libvirts(tmp_path: Path) -> None:
    plan = _plans(tmp_path)["a"]
    devices = _pairs(_args(build_domain(plan)), "-device")
    slots = [int(d.rsplit("addr=", 1)[1], 16) for d in devices]
    assert len(set(slots)) == len(slots) and min(slots) > 2
    assert pin_pci_slot(["-device", "e1000,netdev=x"], 0x20) == ["-device", "e1000,netdev=x"]


def test_gdbstub_is_a_unix_socket(tmp_path: Path) -> None:
    for plan in _plans(tmp_path).values():
        args = _args(build_domain(plan))
        assert _pairs(args, "-gdb") == ["chardev:gdb0"]
        sock = f"{RUN_ROOT}/labctl-quickstart-{plan.guest.name}/gdb.sock"  # the guest's 0700 directory
        assert f"socket,id=gdb0,path={sock},server=on,wait=off" in _pairs(args, "-chardev")
        assert "-s" not in args
        assert [a for a in args if "tcp:" in a] == [n for n in _pairs(args, "-netdev") if n.startswith("user,")]


def test_qemu_runs_as_the_hosts_qemu_user_without_relabelling(tmp_path: Path) -> None:
    dom = build_domain(_plans(tmp_path)["a"], security_models=["apparmor", "none", "dac"])
    labels = {s.get("model"): s for s in dom.findall("seclabel")}
    dac = labels["dac"]
    assert (dac.get("type"), dac.get("relabel"), dac.findtext("label")) == ("static", "no", "+64055:+107")
    assert len(dom.findall("seclabel[@model='dac']")) == 1
    assert labels["apparmor"].get("type") == "none"
    assert "none" not in labels
    # a host whose libvirt runs QEMU as root gets root, as it says
    root = build_domain(_plans(tmp_path)["a"], QemuUser(0, 0))
    assert _find(root, "seclabel").findtext("label") == "+0:+0"


def test_accelerator_and_cpu(tmp_path: Path) -> None:
    tcg = build_domain(_plans(tmp_path)["a"])
    assert tcg.get("type") == "qemu" and _find(tcg, "cpu").get("mode") == "maximum"
    kvm = build_domain(_plans(tmp_path, accel="kvm")["a"])
    assert kvm.get("type") == "kvm" and _find(kvm, "cpu").get("mode") == "host-passthrough"


def test_awkward_paths_are_escaped_for_xml_and_qemu(tmp_path: Path) -> None:
    odd = tmp_path / "a,b&c<d>'e\""
    plan = _plans(odd)["c"]
    dom = ET.fromstring(domain_xml(plan))  # still well formed
    assert dom.findtext("description") == f"labctl run directory {plan.dir}"
    netdevs = _pairs(_args(dom), "-netdev")
    assert any("a,,b&c<d>'e\"" in n for n in netdevs)  # QEMU's ',' -> ',,' survives the XML


def test_backend_is_registered_and_shows_its_xml(tmp_path: Path) -> None:
    backend = get_backend("libvirt")
    assert backend.name == "libvirt"
    backend.starter._facts[libvirt_uri()] = HostFacts(QEMU_USER, ("none", "dac"))  # type: ignore[attr-defined]
    lines = backend.command(_plans(tmp_path)["a"])
    assert "<label>+64055:+107</label>" in "".join(lines)
    assert lines[0].startswith("<domain") and lines[-1] == "</domain>"


@pytest.mark.parametrize(("lines", "expected"), [
    (["x: starting up libvirt",
      "2026-01-01T00:00:00Z qemu-system-x86_64: -netdev user: Could not set up host forwarding rule",
      "2026-01-01 00:00:00: shutting down, reason=failed"],
     "Could not set up host forwarding rule"),
    (["x: starting up libvirt", "qemu-system-x86_64: terminating on signal 15 from pid 1 (libvirtd)",
      "y: shutting down, reason=destroyed"], "y: shutting down, reason=destroyed"),
])
def test_exit_reason_from_libvirts_log(lines: list[str], expected: str) -> None:
    assert expected in _log_reason(lines)
