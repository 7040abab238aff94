"""Where a guest's gdbstub is and who holds it, and QMP to the guest around a gdb session."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import DebugError
from labctl.lab import SshHop

FORWARD_TIMEOUT = 30.0  # a remote gdbstub's SSH forward to come up


# -- QMP to the guest, whatever runs it -------------------------------------------------

@dataclass(frozen=True)
class GdbStub:
    """Where a guest's gdbstub listens: QEMU's unix socket ``path`` (in a 0700
    directory) on the machine that runs the guest, or on the libvirt host ``via``.

    It is never a TCP port: the gdb protocol's ``qRcmd`` reaches QEMU's monitor,
    and with it host commands, so only the lab's owner may connect.
    """

    path: str
    via: SshHop | None = None

    @classmethod
    def of(cls, stub: GdbStub | str | Path) -> GdbStub:
        """``stub`` itself, or a socket path on this machine."""
        return stub if isinstance(stub, GdbStub) else cls(str(stub))

    @property
    def where(self) -> str:
        """The stub's address for messages."""
        return self.path + (f" on host {self.via.host}" if self.via else "")

    @contextlib.contextmanager
    def local(self, scratch: Path) -> Iterator[str]:
        """A unix socket on this machine that reaches the stub, for the block.

        A local stub is its own socket. A remote one is reached through an
        OpenSSH stream-local forward (``ssh -N -L SCRATCH/gdb-fwd.sock:PATH``,
        logged in as the host's URI is), whose socket ssh makes 0600 in
        ``scratch`` (the guest's 0700 directory); the forward ends with the block.

        :raise DebugError: when the forward cannot be set up.
        """
        if self.via is None:
            yield self.path
            return
        from labctl.proc import kill_group, spawn_tied
        from labctl.ssh import hop_forward_argv

        sock = scratch / "gdb-fwd.sock"
        sock.unlink(missing_ok=True)
        log_path = scratch / "gdb-fwd.log"
        proc = spawn_tied(hop_forward_argv(self.via, str(sock), self.path), log_path)
        try:
            deadline = time.monotonic() + FORWARD_TIMEOUT
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    why = log_path.read_text(errors="replace").strip() if log_path.exists() else ""
                    raise DebugError(f"cannot reach the gdbstub on {self.where} through SSH: "
                                     f"{why or 'the forward did not start'}")
                time.sleep(0.05)
            yield str(sock)
        finally:
            kill_group(proc, grace=1.0)
            sock.unlink(missing_ok=True)


def gdbstub_clients(path: str, table: str | None = None) -> int:
    """How many connections to the gdbstub's unix socket ``path`` are established,
    from ``/proc/net/unix`` (or its text in ``table``): an accepted connection
    shows the listener's path with state 03 (connected)."""
    if table is None:
        try:
            table = Path("/proc/net/unix").read_text()
        except OSError:
            return 0
    count = 0
    for line in table.splitlines():
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[5] == "03" and fields[7] == path:
            count += 1
    return count


def _remote_unix_table(hop: SshHop) -> str | None:
    """``/proc/net/unix`` of the libvirt host ``hop``; None when unreadable."""
    from labctl.ssh import read_on_host

    return read_on_host(hop, ["cat", "/proc/net/unix"])


def ensure_gdbstub_free(stub: GdbStub | str | Path) -> None:
    """Refuse to connect while another gdb holds the gdbstub: QEMU serves one
    client at a time, and a second one would hang with the guest paused.
    A remote host's connections are read over SSH (not checked when that fails).

    :raise DebugError: when a client is connected.
    """
    stub = GdbStub.of(stub)
    table = None if stub.via is None else _remote_unix_table(stub.via)
    if stub.via is not None and table is None:
        return
    if gdbstub_clients(stub.path, table=table):
        raise DebugError(f"another debugger is attached to the gdbstub {stub.where}",
                         hint="detach or quit that gdb first")


def target_remote(local: str) -> str:
    """gdb's command connecting to the unix socket ``local`` on this machine.

    gdb recognises a socket by its absolute path (gdb 13 has no ``unix::``
    prefix); a ``:`` would read as ``host:port`` and spaces end the word.

    :raise DebugError: for a path gdb cannot take.
    """
    if not local.startswith("/") or ":" in local or any(c.isspace() for c in local):
        raise DebugError(f"gdb cannot connect to a socket path with spaces or ':' in it: {local}",
                         hint="use a state directory without them ($LABCTL_STATE_DIR)")
    return f"target remote {local}"


