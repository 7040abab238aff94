"""Backends turn a guest plan into a running machine, behind one interface
(:class:`~labctl.backends.base.Backend`): ``qemu`` (labctl starts QEMU itself,
:mod:`.qemu`) and ``libvirt`` (transient domains on any libvirt URI, several
hosts, :mod:`.libvirt`). What differs between them is a method of the interface,
or one of the class attributes that say what their guests can do: no other
stage asks a backend's name or imports a concrete backend.

Owns: the guest plan and record and the interface (:mod:`.base`), the QEMU
command line and domain XML (pure functions), QMP (:mod:`.monitor`, the one
client), the ownership journal of what backends create on hosts
(:mod:`.owned`), and the accelerator (:mod:`.accel`: KVM when a probe boot
works). Must not import the ``up`` stage, steps, bundles, reports or the CLI.

Imports never: labctl.up, labctl.steps, labctl.bundle, labctl.report, labctl.cli, labctl.state, labctl.live, labctl.training
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from labctl.errors import UsageError

if TYPE_CHECKING:
    from labctl.backends.accel import AccelChoice, choose_accel, choose_accels, kvm_usable, lab_accel, probe_kvm
    from labctl.backends.base import (
        GUEST_MEMORY,
        MGMT_ADDR,
        MGMT_NET,
        POSTBOOT,
        Backend,
        GuestPlan,
        GuestRecord,
        HostCheck,
        LabState,
        NetDir,
        netdev_id,
    )
    from labctl.backends.libvirt.api import qemu_pid
    from labctl.backends.monitor import (
        BackendMonitor,
        Monitor,
        SocketMonitor,
        as_monitor,
        dump_guest_memory,
        ensure_resumed,
        load_state,
        qmp_execute,
        qmp_running,
        running_version,
        save_state,
    )
    from labctl.backends.owned import backends as owned_backends
    from labctl.backends.qemu.rrargv import (
        RRFILE,
        ReplayFiles,
        fw_cfg_files,
        read_only_files,
        recorded_argv,
        replay_argv,
    )
    from labctl.lab import BACKENDS  # what a lab file's backend: may say, each mapped in get_backend
else:  # each name loaded at its first use (labctl.lazyface)
    from labctl.lazyface import attach

    __getattr__, __dir__ = attach(__name__, __file__, globals())

__all__ = [
    "BACKENDS", "GUEST_MEMORY", "MGMT_ADDR", "MGMT_NET", "POSTBOOT", "RRFILE", "AccelChoice", "Backend",
    "BackendMonitor", "GuestPlan", "GuestRecord", "HostCheck", "LabState", "Monitor", "NetDir", "ReplayFiles",
    "SocketMonitor", "agent_fifos", "as_monitor", "choose_accel", "choose_accels", "dump_guest_memory",
    "ensure_resumed", "fw_cfg_files", "get_backend", "guest_alive", "kvm_usable", "lab_accel", "load_state",
    "netdev_id", "owned_backends", "probe_kvm", "qemu_pid", "qemu_version", "qmp_execute", "qmp_running",
    "read_only_files", "recorded_argv", "replay_argv", "running_version", "save_state",
]


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (the one place that maps a name to a backend).

    :raise UsageError: for an unknown or unavailable backend.
    """
    if name == "qemu":
        from labctl.backends.qemu.machines import QemuBackend

        return QemuBackend()
    if name == "libvirt":
        from labctl.backends.libvirt.domains import LibvirtBackend

        return LibvirtBackend()
    raise UsageError(f"backend '{name}' is not available in this version",
                     hint="use --backend qemu or --backend libvirt")


def guest_alive(backend: str, rec: GuestRecord) -> bool:
    """Whether the machine of ``rec`` (a guest of backend ``backend``) exists: a QEMU labctl started
    is checked from ``/proc`` without loading its backend (``status`` is a quick command).

    :raise LabctlError: when its host cannot be asked (libvirt).
    """
    if backend == "qemu":
        from labctl.backends.qemu.liveness import alive

        return alive(rec)
    return get_backend(backend).alive(rec)


def qemu_version() -> str:
    """The first line of ``qemu-system-x86_64 --version`` (the QEMU backend's; loaded when asked)."""
    from labctl.backends.qemu.machines import qemu_version as version

    return version()


def agent_fifos(channel: Path) -> None:
    """The guest agent's FIFOs beside ``channel``, new, empty, 0600 (the QEMU backend's; loaded when asked)."""
    from labctl.backends.qemu.machines import agent_fifos as make

    make(channel)
