"""One guest of a lab that is up, as drgn and ``dump`` see it: its QEMU, its monitor, its kernel.

Which guests can be read where:

* qemu backend: every guest (QEMU runs here as labctl's user);
* libvirt on this machine (``qemu:///system``): live reads, as root (QEMU runs
  as libvirt's own user; reading its memory takes ``CAP_SYS_PTRACE``); no
  dumps (the domain has no ``vmcoreinfo`` device, so a dump would not name its
  kernel, and QEMU would write it as libvirt's user): exit status 3;
* libvirt on a remote host: refused (QEMU's memory is on that host), exit status 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.backends import BackendMonitor, LabState, get_backend
from labctl.errors import HostError, MachineError
from labctl.kernel import Kernel

if TYPE_CHECKING:
    from labctl.backends import Backend, GuestRecord
    from labctl.ssh import Endpoint


@dataclass(frozen=True)
class GuestTarget:
    """A running guest: its record, backend, kernel and SSH endpoint."""

    lab: str
    guest: str
    record: GuestRecord
    backend: Backend = field(compare=False)
    kernel: Kernel
    endpoint: Endpoint

    @property
    def monitor(self) -> BackendMonitor:
        return BackendMonitor(self.backend, self.record)

    @property
    def domain(self) -> str | None:
        """The libvirt domain's name (None on the qemu backend)."""
        value = self.record.extra.get("domain")
        return str(value) if value else None

    def qmp(self, command: str, args: dict[str, object] | None = None) -> Any:  # args: QMP's JSON, passed on
        """One QMP command. :raise MachineError: when it fails or the monitor is gone."""
        return self.backend.qmp(self.record, command, args)

    def hmp(self, line: str) -> str:
        """One human monitor command line, through QMP; its answer."""
        return str(self.qmp("human-monitor-command", {"command-line": line}))

    def qemu_pid(self) -> int:
        """QEMU's pid now (libvirt's pidfile: a reset restarts the domain's QEMU)."""
        if self.domain is None:
            return self.record.pid
        from labctl.backends import qemu_pid

        return qemu_pid(self.domain) or self.record.pid

    def is_qemu(self, argv: list[str]) -> bool:
        """Whether a process's command line is this guest's QEMU (guards against a reused pid)."""
        if self.domain is None:
            return any(self.record.qmp in a for a in argv)
        return "-name" in argv and any(a == f"guest={self.domain}" or a.startswith(f"guest={self.domain},")
                                       for a in argv)

    @property
    def private_dir(self) -> Path:
        """The guest's 0700 directory on this machine (the lab's run directory)."""
        return Path(self.record.dir)


def guest_target(state: LabState, guest: str) -> GuestTarget:
    """``guest`` of a lab that is up, checked to run where labctl can read it.

    :raise LabStateError: no such guest. :raise HostError: a guest on a remote libvirt host.
    :raise MachineError: its machine is not running.
    """
    endpoint = state.endpoint(guest)  # raises for an unknown guest
    rec = state.guests[guest]
    backend = get_backend(state.backend)
    if rec.extra.get("remote"):
        raise HostError(f"guest {guest} of lab {state.lab} runs on remote libvirt host {rec.extra.get('host')}: "
                        "labctl reads a guest's memory only where its QEMU runs",
                        hint="run labctl drgn/dump on that host, or use 'labctl gdb' (it reaches remote guests)")
    if not backend.alive(rec):
        raise MachineError(f"guest {guest} of lab {state.lab} is not running", hint="see 'labctl status'")
    return GuestTarget(state.lab, guest, rec, backend, state.kernel(guest), endpoint)
