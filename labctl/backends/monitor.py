"""QMP, the one client: short synchronous exchanges on ``qemu.qmp``, and a guest's
monitor whatever runs it (:class:`BackendMonitor`: the qemu backend's unix
socket, libvirt's monitor passthrough).

Every qemu.qmp exception is mapped to :class:`MachineError` here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar, cast

from qemu.qmp import QMPClient, QMPError

from labctl.errors import LabctlError, MachineError

if TYPE_CHECKING:
    from labctl.backends.base import Backend, GuestRecord

T = TypeVar("T")

# QEMU's ``query-migrate`` answer: the keys labctl reads (QEMU's others pass through).
MigrationInfo = TypedDict("MigrationInfo", {"status": str, "error-desc": str, "total-time": int}, total=False)


def qmp_execute(socket_path: Path | str, command: str, args: Mapping[str, object] | None = None,
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
    except (TimeoutError, QMPError, OSError, EOFError) as exc:
        raise MachineError(f"QMP {command} on {socket_path} failed: {exc or type(exc).__name__}") from exc


MIGRATION_FD = "labctl-state"
_DONE = "completed"
_FAILED = ("failed", "cancelled")


def _ignore_shared(client: QMPClient, on: bool) -> Awaitable[object]:
    """Migration capability ``x-ignore-shared``: RAM mapped shared from a file is left out of the
    stream (saved), and expected to be in its place already (loaded: the restored guest maps the
    same file)."""
    return client.execute("migrate-set-capabilities",
                          {"capabilities": [{"capability": "x-ignore-shared", "state": on}]})


def save_state(socket_path: Path | str, dest: Path, timeout: float = 300.0,
               ignore_shared: bool = False) -> MigrationInfo:
    """Write the guest's RAM and device state to ``dest`` (a QMP ``migrate`` to a file
    descriptor passed over the monitor socket: QEMU's sandbox forbids ``exec:``, and
    QEMU 7.2 has no ``file:``). The guest is paused first and stays paused; the
    caller resumes it (``cont``) once it has copied the disk. Returns QEMU's
    final ``query-migrate``. With ``ignore_shared``, RAM the guest maps shared from a file
    is not written (the caller copies that file).

    :raise MachineError: when QEMU cannot save it, or not within ``timeout``.
    """

    async def go(client: QMPClient) -> MigrationInfo:
        await client.execute("stop")
        await client.execute("migrate-set-parameters", {"max-bandwidth": 1 << 40})
        await _ignore_shared(client, ignore_shared)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            client.send_fd_scm(fd)
            await client.execute("getfd", {"fdname": MIGRATION_FD})
        finally:
            os.close(fd)  # QEMU holds its own copy
        await client.execute("migrate", {"uri": f"fd:{MIGRATION_FD}"})
        return await _migration_done(client, timeout, "saving")

    return _session(socket_path, go, timeout + 10, "migrate")


def load_state(socket_path: Path | str, src: Path, timeout: float = 300.0,
               ignore_shared: bool = False) -> MigrationInfo:
    """Load RAM and device state saved by :func:`save_state` into a QEMU started with
    ``-incoming defer`` (``migrate-incoming`` from a descriptor of ``src``). The guest
    runs afterwards unless QEMU was started with ``-S``. With ``ignore_shared``, ``src`` was
    saved without the RAM shared from a file: the guest's RAM is already mapped from its copy.

    :raise MachineError: when QEMU cannot load it, or not within ``timeout``.
    """

    async def go(client: QMPClient) -> MigrationInfo:
        fd = os.open(src, os.O_RDONLY)
        try:
            client.send_fd_scm(fd)
            await client.execute("getfd", {"fdname": MIGRATION_FD})
        finally:
            os.close(fd)
        await _ignore_shared(client, ignore_shared)
        await client.execute("migrate-incoming", {"uri": f"fd:{MIGRATION_FD}"})
        return await _migration_done(client, timeout, "loading")

    return _session(socket_path, go, timeout + 10, "migrate-incoming")


DUMP_FD = "labctl-dump"


def dump_guest_memory(socket_path: Path | str, fd: int, fmt: str, timeout: float = 600.0) -> None:
    """Write the guest's memory to the file descriptor ``fd`` (passed over the monitor socket) in
    ``fmt`` (``elf``, ``kdump-zlib``...): QMP ``dump-guest-memory``. QEMU pauses the guest while
    it writes and resumes it after (one that was paused stays paused); the call returns when
    the dump is complete.

    :raise MachineError: when QEMU cannot dump it, or not within ``timeout``.
    """

    async def go(client: QMPClient) -> None:
        client.send_fd_scm(fd)
        await client.execute("getfd", {"fdname": DUMP_FD})
        try:
            await client.execute("dump-guest-memory", {"paging": False, "protocol": f"fd:{DUMP_FD}", "format": fmt})
        except QMPError:
            with contextlib.suppress(QMPError):  # QEMU still holds it when the dump failed before taking it
                await client.execute("closefd", {"fdname": DUMP_FD})
            raise

    _session(socket_path, go, timeout, "dump-guest-memory")


CONNECT_TIMEOUT = 30.0  # seconds for a monitor's greeting and capabilities


async def _migration_done(client: QMPClient, timeout: float, doing: str) -> MigrationInfo:
    deadline = time.monotonic() + timeout
    while True:
        reply = await client.execute("query-migrate")
        info = cast(MigrationInfo, reply) if isinstance(reply, dict) else MigrationInfo()  # QEMU's JSON object
        status = info.get("status")
        if status == _DONE:
            return info
        if status in _FAILED:
            raise MachineError(f"QEMU failed {doing} the guest's state: {info.get('error-desc') or status}")
        if time.monotonic() > deadline:
            raise MachineError(f"QEMU was still {doing} the guest's state after {timeout:.0f} s ({status})")
        await asyncio.sleep(0.01)


def _session(socket_path: Path | str, work: Callable[[QMPClient], Awaitable[T]], timeout: float, what: str) -> T:
    """Run ``await work(client)`` on one monitor connection, mapping every failure to MachineError."""

    async def go() -> T:
        client = QMPClient("labctl")
        try:
            # A QEMU just started (reset restarts several at once) can take seconds to greet under TCG on a
            # busy host: 5 s ran out in CI with three guests reset together, and the error said nothing.
            await asyncio.wait_for(client.connect(str(socket_path)), CONNECT_TIMEOUT)
            return await asyncio.wait_for(work(client), timeout)
        finally:
            await client.disconnect()

    try:
        return asyncio.run(go())
    except (TimeoutError, QMPError, OSError, EOFError) as exc:
        why = str(exc) or ("no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__)
        raise MachineError(f"QMP {what} on {socket_path} failed: {why}") from exc


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


def running_version(backend: Backend, rec: GuestRecord) -> str:
    """The version of the QEMU that runs the guest, asked over its QMP (``query-version``, so a guest
    on a remote libvirt host says that host's QEMU), as ``--version`` says it; ``unknown`` when it
    does not answer."""
    try:
        v = backend.qmp(rec, "query-version")
        q = v["qemu"]
        package = str(v.get("package") or "").strip()
        return f"QEMU emulator version {q['major']}.{q['minor']}.{q['micro']}" + (f" ({package})" if package else "")
    except (LabctlError, KeyError, TypeError):
        return "unknown"


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
