"""libvirt domain XML for one guest, built by pure functions from its plan.

The domain runs the same machine as the qemu backend's argv
(:mod:`labctl.backends.qemu.argv`): direct kernel boot, the qcow2 overlay on
virtio, the serial console (a pty, which labctl's relay reads through
libvirt), pvpanic, the fw_cfg entries, and the same NICs. libvirt has no element for a unix ``dgram`` netdev nor for a
``restrict=on`` slirp with host forwarding on 127.0.0.1, so the NICs (and the
gdbstub) reach QEMU through ``<qemu:commandline>``, built by the very
functions that build the qemu backend's argv.

Every file the domain names is on the host that runs it, where QEMU's user
can reach it (:mod:`labctl.backends.libvirt.host`): volumes of the
``labctl`` pool and the guest's directory below ``RUN_ROOT``. QEMU runs as
that user with a static DAC label and ``relabel='no'``: libvirt changes the
owner of no file, so the image stays root's and read-only to QEMU, and only
the guest's own volumes (made for QEMU's user) are writable by it.

Nothing here touches the host: tests parse the XML directly and ``labctl up
--show-command`` can print it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass

from labctl.backends.base import GuestPlan
from labctl.backends.libvirt.host import QemuUser, guest_run_dir
from labctl.backends.libvirt.storage import POOL_DIR
from labctl.backends.qemu.argv import gdb_args, lab_nic_args, mgmt_nic_args, vlan_carriers

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
EMULATOR = "/usr/bin/qemu-system-x86_64"
FIRST_NIC_SLOT = 0x8  # libvirt's own devices take slots 0-2 (host bridge, PIIX3, disk)
LAST_PCI_SLOT = 0x1F
FW_CFG_NAMES = ("opt/labctl/guest", "opt/labctl/authorized_keys", "opt/labctl/host_key")

ET.register_namespace("qemu", QEMU_NS)


def domain_name(lab: str, guest: str) -> str:
    """The libvirt domain name of a guest: ``labctl-<lab>-<guest>``."""
    return f"labctl-{lab}-{guest}"


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    """Append a child element with attributes and optional text."""
    el = ET.SubElement(parent, tag, attrs)
    if text is not None:
        el.text = text
    return el


@dataclass(frozen=True)
class DomainFiles:
    """The files a domain uses, as paths on the host that runs it: volumes of
    the ``labctl`` pool, and the gdbstub's socket in the guest's 0700 directory."""

    kernel: str
    initrd: str
    disk: str
    fw_cfg: dict[str, str]  # fw_cfg name -> volume
    gdb_socket: str
    modules: str | None = None  # the kernel's modules disk (read-only vdb)


def volume_prefix(plan: GuestPlan) -> str:
    """The start of every per-guest volume's name: ``labctl-<lab>-<guest>-``."""
    return domain_name(plan.lab, plan.guest.name) + "-"


def disk_volume(plan: GuestPlan) -> str:
    """The name of the guest's qcow2 overlay volume."""
    return volume_prefix(plan) + "disk.qcow2"


def fw_cfg_volumes(plan: GuestPlan) -> dict[str, str]:
    """fw_cfg name -> the name of its volume."""
    return {name: volume_prefix(plan) + name.rsplit("/", 1)[1] for name in FW_CFG_NAMES}


def gdb_socket(plan: GuestPlan) -> str:
    """The gdbstub's socket on the guest's host, in the guest's 0700 directory."""
    return guest_run_dir(domain_name(plan.lab, plan.guest.name)) + "/gdb.sock"


def planned_files(plan: GuestPlan, pool_dir: str = POOL_DIR) -> DomainFiles:
    """The files the backend will give the domain, in a pool at ``pool_dir``.

    The image's volume names carry the manifest's sums; without a sum the
    name ends in ``...`` (it is only shown, never used).
    """
    sums = plan.kernel.manifest.get("files") or {}

    def kernel(label: str, file: str) -> str:
        sha = (sums.get(file) or {}).get("sha256")
        return f"{pool_dir}/kernel-{label}-" + (sha[:16] if sha else "...")

    return DomainFiles(kernel("boot", "boot"), f"{pool_dir}/kernel-initrd-...", f"{pool_dir}/{disk_volume(plan)}",
                       {n: f"{pool_dir}/{v}" for n, v in fw_cfg_volumes(plan).items()}, gdb_socket(plan),
                       kernel("modules", "modules.img") if plan.kernel.modules_img else None)


def pin_pci_slot(args: list[str], slot: int) -> list[str]:
    """``args`` with its ``-device`` on PCI slot ``slot`` of ``pci.0``.

    libvirt gives its own devices explicit addresses from slot 2 on, but QEMU
    creates the raw ``-device``s first; unpinned, a NIC takes slot 2 and the
    disk cannot start. Past the last slot the device is left to QEMU.
    """
    if slot > LAST_PCI_SLOT:
        return list(args)
    return [f"{a},bus=pci.0,addr={slot:#x}" if i and args[i - 1] == "-device" else a
            for i, a in enumerate(args)]


def qemu_extra_args(plan: GuestPlan, files: DomainFiles) -> list[str]:
    """What libvirt cannot express: the management NIC, the lab NICs and the gdbstub
    (a unix socket, as with the qemu backend). A host's QEMU may lose a virtio-net NIC's VLAN
    filter when it restores a saved state (before 8.1): a NIC that carries VLANs gets none."""
    args = pin_pci_slot(mgmt_nic_args(plan), FIRST_NIC_SLOT)
    carriers = vlan_carriers(plan.guest)
    for i, nic in enumerate(plan.guest.nics, start=1):
        args += pin_pci_slot(lab_nic_args(nic, plan.ports[nic.name], nic.name not in carriers), FIRST_NIC_SLOT + i)
    return args + gdb_args(files.gdb_socket)


def _os(dom: ET.Element, plan: GuestPlan, files: DomainFiles) -> None:
    """Direct kernel boot of the image's kernel and initramfs on a ``pc`` machine."""
    os_el = _sub(dom, "os")
    _sub(os_el, "type", "hvm", arch="x86_64", machine="pc")
    _sub(os_el, "kernel", files.kernel)
    _sub(os_el, "initrd", files.initrd)
    _sub(os_el, "cmdline", " ".join(plan.kernel_args))


def _cpu(dom: ET.Element, plan: GuestPlan) -> None:
    """``-cpu host`` under KVM, ``-cpu max`` under TCG (libvirt >= 7.1: mode='maximum')."""
    _sub(dom, "cpu", mode="host-passthrough" if plan.accel == "kvm" else "maximum")


def _sysinfo(dom: ET.Element, files: DomainFiles) -> None:
    """The guest's configuration as fw_cfg files (libvirt >= 6.5)."""
    sysinfo = _sub(dom, "sysinfo", type="fwcfg")
    for name, path in files.fw_cfg.items():
        _sub(sysinfo, "entry", name=name, file=path)


def _devices(dom: ET.Element, files: DomainFiles) -> None:
    """Disk, serial console (a pty: what ``virDomainOpenConsole`` reads), pvpanic;
    no USB, balloon, video or default NIC."""
    devs = _sub(dom, "devices")
    _sub(devs, "emulator", EMULATOR)
    disk = _sub(devs, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", cache="unsafe", discard="unmap")
    _sub(disk, "source", file=files.disk)
    _sub(disk, "target", dev="vda", bus="virtio")
    if files.modules:  # the kernel's modules, read-only (labctl.modules=vdb)
        mods = _sub(devs, "disk", type="file", device="disk")
        _sub(mods, "driver", name="qemu", type="raw")
        _sub(mods, "source", file=files.modules)
        _sub(mods, "target", dev="vdb", bus="virtio")
        _sub(mods, "readonly")
    serial = _sub(devs, "serial", type="pty")
    _sub(serial, "target", port="0")
    console = _sub(devs, "console", type="pty")
    _sub(console, "target", type="serial", port="0")
    _sub(devs, "controller", type="usb", model="none")
    _sub(devs, "memballoon", model="none")
    _sub(devs, "panic", model="isa")


def _seclabels(dom: ET.Element, user: QemuUser, other_models: Iterable[str]) -> None:
    """QEMU runs as the host's QEMU user (``user``, from libvirt's DAC base
    label), and libvirt relabels nothing: labctl made every file the domain
    writes for that user, and the shared image stays root's."""
    dac = _sub(dom, "seclabel", type="static", model="dac", relabel="no")
    _sub(dac, "label", user.label)
    for model in other_models:
        if model not in ("dac", "none"):
            _sub(dom, "seclabel", type="none", model=model)


def _commandline(dom: ET.Element, args: list[str]) -> None:
    """Raw QEMU arguments, one ``<qemu:arg value=.../>`` each (ElementTree escapes them)."""
    cl = _sub(dom, f"{{{QEMU_NS}}}commandline")
    for arg in args:
        _sub(cl, f"{{{QEMU_NS}}}arg", value=arg)


def build_domain(plan: GuestPlan, user: QemuUser, security_models: Iterable[str] = (),
                 files: DomainFiles | None = None) -> ET.Element:
    """The ``<domain>`` element for ``plan``, its QEMU running as ``user``.

    ``security_models`` are the host's libvirt security drivers (from its
    capabilities); every one but DAC is switched off for the domain.
    ``files`` are the paths on the host that runs it (default: :func:`planned_files`).
    """
    files = files or planned_files(plan)
    dom = ET.Element("domain", type="kvm" if plan.accel == "kvm" else "qemu")
    _sub(dom, "name", domain_name(plan.lab, plan.guest.name))
    _sub(dom, "title", f"labctl lab {plan.lab}, guest {plan.guest.name}")
    _sub(dom, "description", f"labctl run directory {plan.dir}")
    _sub(dom, "memory", str(plan.guest.memory), unit="MiB")
    _sub(dom, "vcpu", str(plan.guest.cpus), placement="static")
    _sysinfo(dom, files)
    _os(dom, plan, files)
    features = _sub(dom, "features")
    _sub(features, "acpi")  # the power button: 'stop' is an ACPI shutdown
    _cpu(dom, plan)
    _sub(dom, "clock", offset="utc")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "destroy")  # -no-reboot, as the qemu backend
    _sub(dom, "on_crash", "destroy")  # pvpanic: the machine stops (labctl dumps only the qemu backend's guests)
    _devices(dom, files)
    _seclabels(dom, user, security_models)
    _commandline(dom, qemu_extra_args(plan, files))
    return dom


def domain_xml(plan: GuestPlan, user: QemuUser, security_models: Iterable[str] = (),
               files: DomainFiles | None = None) -> str:
    """The domain XML document for ``plan`` (indented, one element a line)."""
    dom = build_domain(plan, user, security_models, files)
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode") + "\n"
