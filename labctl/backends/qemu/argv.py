"""QEMU argv for one guest, built by pure functions from its plan.

Nothing here touches the host: tests compare the argv directly and
``labctl up --show-command`` prints it.
"""

from __future__ import annotations

import os
import re

from labctl.backends.base import MGMT_NET, GuestPlan, netdev_id
from labctl.backends.qemu.clone import clone_args
from labctl.backends.qemu.rrargv import RRFILE, recorded_argv
from labctl.lab import Guest, Nic, export_link, tag
from labctl.net import Port, netdev_kind

# qboot, QEMU's minimal firmware, boots ~1.5 s sooner than SeaBIOS under TCG
# (7.1 s vs 8.6 s to SSH-ready), but with acpi=noirq its MP table makes PCI
# interrupts edge-triggered: a guest with several emulated NICs loses the
# interrupts of some (seen: e1000 as the 2nd lab NIC got none). So it is
# opt-in (LABCTL_BIOS=qboot) until the IRQ routing is sorted out.
QBOOT = "/usr/share/qemu/qboot.rom"


# QEMU's seccomp filter with every class labctl's features allow denied:
# obsolete system calls, privilege changes (setuid...), spawning processes
# (fork/exec: no "exec:" migration, no helper scripts; snapshots go through
# a file descriptor) and resource control (scheduler, mlock). A guest that
# escapes into QEMU cannot start a host program from there.
SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


PANIC_ACTION = ("-action", "panic=pause")


def opt(value: object) -> str:
    """Escape a value for a QEMU ``key=value,...`` option (``,`` -> ``,,``)."""
    return str(value).replace(",", ",,")


def machine_args(plan: GuestPlan) -> list[str]:
    cpu = "host" if plan.accel == "kvm" else "max"
    accel = "kvm" if plan.accel == "kvm" else "tcg,thread=multi" if plan.guest.cpus > 1 else "tcg"
    bios = ["-bios", QBOOT] if os.path.exists(QBOOT) and os.environ.get("LABCTL_BIOS") == "qboot" else []
    return [*bios,
        "-name", f"guest={opt(plan.guest.name)},process=labctl-{plan.lab}-{plan.guest.name},debug-threads=on",
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-sandbox", SANDBOX,
        # a panic the guest reports through pvpanic pauses the machine (QMP status guest-panicked)
        # instead of ending QEMU: its memory is there to dump (labctl.inspect.crashwatch)
        *PANIC_ACTION,
        "-machine", "pc", "-accel", accel, "-cpu", cpu,
        "-m", str(plan.guest.memory), "-smp", str(plan.guest.cpus),
    ]


def share_args(plan: GuestPlan) -> list[str]:
    """Each share as a virtio-9p device the guest mounts by its tag (:func:`labctl.lab.shares.tag`).

    Read-only shares are exported read-only, files as they are (``security_model=none``).
    A writable one exports the new directory made for this up (through its link in the
    guest's run directory, :func:`labctl.lab.shares.export_link`: the same path at every up,
    so the snapshot key stays) and stores what the guest sets (owners, modes, links, devices)
    in extended attributes (``mapped-xattr``): the host gets regular files (0600) and
    directories only, owned by QEMU's user, so a guest cannot plant a symbolic link or a device.
    """
    out = []
    for i, share in enumerate(plan.guest.shares):
        model = "mapped-xattr" if share.writable else "none,readonly=on"
        path = plan.dir / export_link(i) if share.writable else share.host
        out += ["-fsdev", f"local,id=share{i},path={opt(path)},security_model={model}",
                "-device", f"virtio-9p-pci,fsdev=share{i},mount_tag={tag(i)}"]
    return out


def boot_args(plan: GuestPlan) -> list[str]:
    """The guest's kernel and initramfs, its overlay as the root disk (vda) and,
    read-only, its kernel's modules disk (vdb; see ``labctl.modules=`` in the kernel args)."""
    mods = plan.kernel.modules_img
    return [
        "-kernel", str(plan.kernel.boot),
        "-initrd", str(plan.initrd),
        "-append", " ".join(plan.kernel_args),
        "-drive", f"file={opt(plan.overlay)},if=virtio,format=qcow2,cache=unsafe,discard=unmap",
        *(["-drive", f"file={opt(mods)},if=virtio,format=raw,readonly=on"] if mods else []),
    ]


def control_args(plan: GuestPlan) -> list[str]:
    return [*gdb_args(str(plan.gdb_socket)), *agent_args(str(plan.agent_channel)),
        # append: a guest restored from a snapshot starts its console with the boot it was saved after
        "-chardev", f"file,id=serial0,path={opt(plan.console)},append=on", "-serial", "chardev:serial0",
        "-qmp", f"unix:{opt(plan.qmp_socket)},server=on,wait=off",
        "-pidfile", str(plan.pidfile),
        "-device", "pvpanic",
        # the guest's fw_cfg driver tells QEMU where its VMCOREINFO note is: a dump-guest-memory
        # vmcore (labctl dump) then carries it, which drgn and crash need to read the kernel
        "-device", "vmcoreinfo",
        "-fw_cfg", f"name=opt/labctl/guest,file={opt(plan.config)}",
        "-fw_cfg", f"name=opt/labctl/authorized_keys,file={opt(plan.authorized_keys)}",
        # not host_key: a boot that becomes the post-boot snapshot gets a throwaway key (labctl.up.warm)
        "-fw_cfg", f"name=opt/labctl/host_key,file={opt(plan.boot_host_key)}",
    ]


def agent_args(channel: str) -> list[str]:
    """The guest agent's virtio-serial port, on the FIFOs ``CHANNEL.in`` and ``CHANNEL.out`` in the
    guest's 0700 directory: after a snapshot is restored, labctl gives the guest its keys and the
    time through it. A pipe chardev is always open, so the guest sees its host connected and the
    agent's read blocks while idle (a unix socket with nobody connected reads as end of file at
    once, and the agent polled it ten times a second: 2.6% of a host core an idle guest)."""
    return ["-chardev", f"pipe,id=agent0,path={opt(channel)}",
            "-device", "virtio-serial-pci,id=vser0",
            "-device", "virtserialport,bus=vser0.0,chardev=agent0,name=org.labctl.agent.0"]


def incoming_args(plan: GuestPlan) -> list[str]:
    """A guest restored from a snapshot waits for its state (loaded through QMP, paused)."""
    return ["-incoming", "defer"] if plan.warm else []


def gdb_args(socket: str) -> list[str]:
    """QEMU's gdbstub on a unix socket (in a 0700 directory): the gdb protocol's
    ``qRcmd`` reaches QEMU's monitor, so it must never be a TCP port another
    local user can connect to."""
    return ["-chardev", f"socket,id=gdb0,path={opt(socket)},server=on,wait=off", "-gdb", "chardev:gdb0"]


def mgmt_nic_args(plan: GuestPlan) -> list[str]:
    fwd = f"tcp:127.0.0.1:{plan.ssh_port}-:22"
    return [
        "-netdev", f"user,id=mgmt,restrict=on,net={MGMT_NET},hostfwd={fwd}",
        "-device", f"virtio-net-pci,netdev=mgmt,mac={plan.mgmt_mac}",
    ]


def restores_vlan_filter(version: str) -> bool:
    """Whether QEMU of this ``--version`` line keeps a virtio-net NIC's VLAN filter when it loads a
    saved state. Before 8.1 it cleared the filter after loading it (``virtio_net_set_features``;
    QEMU's "virtio-net: do not reset vlan filtering at set_features"), and a guest restored from
    its post-boot snapshot dropped every tagged frame on such a NIC."""
    m = re.search(r"version (\d+)\.(\d+)", version)
    return m is not None and (int(m[1]), int(m[2])) >= (8, 1)


def vlan_carriers(guest: Guest) -> set[str]:
    """The guest's NICs whose device filters VLANs: those with VLANs, and members of a bond with VLANs
    (the bond adds its VLAN ids to them). A bridge's members need no filter: the bridge makes them
    promiscuous."""
    carriers = {n.name for n in guest.nics if n.vlans}
    return carriers | {m for b in guest.bonds if b.vlans for m in b.members}


def lab_nic_args(nic: Nic, port: Port, vlan_filter: bool = True) -> list[str]:
    """A lab NIC's netdev and device; with ``vlan_filter`` False, a virtio-net NIC without VLAN
    filtering (``ctrl_vlan=off``: it passes every tag, see :func:`restores_vlan_filter`)."""
    model = nic.nic_model
    device = f"{model.qemu_device},netdev={netdev_id(nic)},mac={nic.mac}"
    if not vlan_filter and model.qemu_device == "virtio-net-pci":
        device += ",ctrl_vlan=off"
    kind = netdev_kind(port)  # its host side: labctl.net.netdevs
    return ["-netdev", kind.netdev(netdev_id(nic), port), "-device", device + kind.device_options(port, model.multiqueue)]


def build_argv(plan: GuestPlan, binary: str = "qemu-system-x86_64", vlan_filter: bool = True) -> list[str]:
    """The complete QEMU command line for ``plan``; ``vlan_filter`` False: this QEMU loses a virtio-net
    NIC's VLAN filter when it restores a state, so a NIC that carries VLANs gets none
    (:func:`restores_vlan_filter`)."""
    argv = [binary, *machine_args(plan), *boot_args(plan), *control_args(plan), *mgmt_nic_args(plan)]
    carriers = set() if vlan_filter else vlan_carriers(plan.guest)
    for nic in plan.guest.nics:
        argv += lab_nic_args(nic, plan.ports[nic.name], nic.name not in carriers)
    if plan.guest.record:  # labctl run --record: the same machine under QEMU's record/replay (issue 53), its RAM
        # its own and no new generation ID (a replay must see the same)
        return recorded_argv(argv + share_args(plan) + incoming_args(plan), plan.dir / RRFILE)
    # clone_args: RAM as a file, mapped privately by restored guests; a new VM generation ID (issue 52)
    return argv + share_args(plan) + clone_args(plan) + incoming_args(plan)
