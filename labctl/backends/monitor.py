"""QMP, the one client: short synchronous exchanges on ``qemu.qmp``, and a guest's
monitor whatever runs it (:class:`BackendMonitor`: the qemu backend's unix
socket, libvirt's monitor passthrough).

Every qemu.qmp exception is mapped to :class:`MachineError` here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from qemu.qmp import QMPClient, QMPError

from labctl.errors import MachineError

if TYPE_CHECKING:
    from labctl.backends.base import Backend, GuestRecord


def qmp_execute(socket_path: Path | str, command: str, args: dict[str, Any] | None = None,
                timeout: float = 5.0) -> Any:
    """Connect to a QEMU monitor socket, run one command, disconnect.

    :raise MachineError: when the monitor is unreachable, times out, or the
        command fails (the message carries QMP's error class).
    """

    async def go() -> Any:
        client = QMPClient("labctl")
        try:
            await asyncio.wait_for(client.connect(str(socket_path)), timeout)
            return await asyncio.wait_for(client.execute(command, args), timeout)
        finally:
            await client.disconnect()

    try:
        return asyncio.run(go())
    except (QMPError, OSError, asyncio.TimeoutError, EOFError) as exc:
        raise MachineError(f"QMP {command} on {socket_path} failed: {exc or type(exc).__name__}") from exc


class Monitor(Protocol):
    """A guest's QMP monitor, whatever runs the guest (a gdb session pauses and resumes through it).

    :meth:`execute` runs one command and returns its ``return`` value; it
    raises :class:`labctl.errors.MachineError` when the monitor is
    unreachable or the command fails.
    """

    def execute(self, command: str) -> Any: ...


@dataclass(frozen=True)
class BackendMonitor:
    """QMP through the guest's backend (:meth:`Backend.qmp`): the qemu backend's
    unix socket, or libvirt's monitor passthrough. Two are equal when they
    reach the same guest through backends of the same name."""

    backend: Backend = field(compare=False)
    record: GuestRecord
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.backend.name)

    def execute(self, command: str) -> Any:
        return self.backend.qmp(self.record, command)


@dataclass(frozen=True)
class SocketMonitor:
    """QMP on a QEMU monitor unix socket (a qemu-backend guest known only by its socket)."""

    path: Path

    def execute(self, command: str) -> Any:
        return qmp_execute(self.path, command)


def as_monitor(monitor: Monitor | Path | str | None) -> Monitor | None:
    """``monitor`` as a :class:`Monitor`: a path is a QMP unix socket, empty is none."""
    if monitor is None or isinstance(monitor, (Path, str)):
        return SocketMonitor(Path(monitor)) if monitor else None
    return monitor


def qmp_running(monitor: Monitor | Path | None) -> bool | None:
    """Whether QEMU says the guest runs (None when QMP cannot tell)."""
    mon = as_monitor(monitor)
    if mon is None:
        return None
    try:
        return bool(mon.execute("query-status").get("running"))
    except (MachineError, AttributeError):
        return None


def ensure_resumed(monitor: Monitor | Path | None, was_running: bool | None, detached: bool) -> bool:
    """After gdb is gone: resume a guest that ran before we attached and is
    paused now (QEMU pauses the guest on every gdb connection, even a failed
    one, and does not resume it when gdb disconnects without detaching).
    True when the guest is known to run (or gdb detached cleanly)."""
    mon = as_monitor(monitor)
    if mon is None or was_running is False:
        return detached
    if qmp_running(mon):
        return True
    try:
        mon.execute("cont")
    except MachineError:
        return False
    return bool(qmp_running(mon))
