"""The client side of OpenSSH's multiplexing protocol (OpenSSH's ``PROTOCOL.mux``), for one command
on a live ControlMaster: what ``ssh -S SOCKET HOST CMD`` does when a master answers, without
starting ``ssh`` (a process and its configuration read: about a tenth of an ``exec`` here).

A session is asked for with the command line, no terminal, no forwarding and no escape character;
its standard input, output and error are descriptors handed to the master over the socket
(``SCM_RIGHTS``), and the master says the command's exit status when it ends. When no master
answers at the socket (none was started yet, or it exited) :func:`open_session` returns None and
the caller starts ``ssh`` as before, which makes the master (:mod:`labctl.mux`).

The socket is the one :mod:`labctl.mux` names in the guest's 0700 directory; the master, started by
labctl with the guest's pinned host key, checks that its client is the same user.

It uses CPython's ``_socket`` directly: importing ``socket`` (its enums) costs about 15 ms,
as much as the rest of ``exec``'s imports together. Imports nothing of labctl's but its errors.
"""

from __future__ import annotations

import _socket  # socket.py's own import costs 15 ms (its enums): as much again as the rest of exec's
import contextlib
import os
import shlex
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from labctl.errors import GuestError

HELLO = 0x00000001
NEW_SESSION = 0x10000002
PERMISSION_DENIED = 0x80000002
FAILURE = 0x80000003
EXIT_MESSAGE = 0x80000004
SESSION_OPENED = 0x80000006
TTY_ALLOC_FAIL = 0x80000008
VERSION = 4
NO_ESCAPE = 0xFFFFFFFF
MAX_PACKET = 256 * 1024  # a master's packets are small; a bigger length is not a master speaking
HELLO_TIMEOUT = 5.0  # seconds for the master to greet and open the session
PREWARM_WAIT = 30.0  # seconds a call waits for the master ``up`` is making in the background (a login under TCG: 0.3-2 s)
SOCKET_PREFIX = "mux-"
# sun_path is 108 bytes; ssh binds a temporary name (the path and ".XXXXXXXXXXXXXXXX") first.
MAX_SOCKET_PATH = 107 - 17


def command_line(argv: Sequence[str]) -> str:
    """A remote command from argv: one argument is taken as a shell command
    line as the user typed it; several are quoted word by word."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


def control_path(guest_dir: Path, port: int) -> Path | None:
    """The master's socket for the guest whose directory is ``guest_dir`` on SSH port ``port``; None
    when the path is too long for a unix socket (then no kept connection)."""
    path = guest_dir / f"{SOCKET_PREFIX}{port}"
    return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def new_session_packet(request: int, command: str) -> bytes:
    """The ``MUX_C_NEW_SESSION`` packet (its length first) for ``command``: no terminal, no X11 or
    agent forwarding, not a subsystem, no escape character, no environment."""
    body = (struct.pack(">II", NEW_SESSION, request) + _string(b"")
            + struct.pack(">IIIII", 0, 0, 0, 0, NO_ESCAPE) + _string(b"") + _string(command.encode()))
    return struct.pack(">I", len(body)) + body


def hello_packet() -> bytes:
    body = struct.pack(">II", HELLO, VERSION)
    return struct.pack(">I", len(body)) + body


class Packets:
    """Reads a master's packets from ``sock``, whole, one at a time."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def feed(self) -> bool:
        """Read what the socket has (it must be readable); False at its end."""
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def next(self) -> tuple[int, bytes] | None:
        """``(type, rest)`` of the first whole packet read, None until one is whole.

        :raise GuestError: for a length no master sends.
        """
        if len(self.buf) < 4:
            return None
        (size,) = struct.unpack(">I", self.buf[:4])
        if size < 4 or size > MAX_PACKET:
            raise GuestError(f"the kept SSH connection's socket answered with a packet of {size} bytes")
        if len(self.buf) < 4 + size:
            return None
        body, self.buf = self.buf[4:4 + size], self.buf[4 + size:]
        (kind,) = struct.unpack(">I", body[:4])
        return kind, body[4:]

    def wait(self) -> tuple[int, bytes]:
        """The next packet, reading (blocking, within the socket's timeout) until it is whole.

        :raise GuestError: when the master closes the socket first.
        :raise OSError: on a timeout or a socket error.
        """
        while (packet := self.next()) is None:
            if not self.feed():
                raise GuestError("the kept SSH connection closed the session")
        return packet


def _reason(rest: bytes) -> str:
    """The reason string of a failure packet (after its request id)."""
    if len(rest) < 8:
        return "no reason given"
    (size,) = struct.unpack(">I", rest[4:8])
    return rest[8:8 + size].decode(errors="replace")


class Session:
    """One command running on the master: its socket (readable when the master speaks) and the
    exit status once :meth:`read` has seen it."""

    def __init__(self, sock: _socket.socket, packets: Packets, session_id: int) -> None:
        self.sock, self.packets, self.id = sock, packets, session_id
        self.status: int | None = None
        self.closed = False
        self._take()  # the exit message may have come with the session's opening

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> None:
        """Take what the master sent (call when the socket is readable): the exit status, or the
        master's end (then :attr:`closed`; with no status, the command died of a signal or the
        connection to the guest was lost)."""
        more = self.packets.feed()
        self._take()
        if not more:
            self.closed = True

    def _take(self) -> None:
        while (packet := self.packets.next()) is not None:
            kind, rest = packet
            if kind == EXIT_MESSAGE and len(rest) >= 8:
                self.status = struct.unpack(">I", rest[4:8])[0]

    def close(self) -> None:
        """Leave the session: the master ends the command's channel as when an ssh client dies."""
        with contextlib.suppress(OSError):
            self.sock.close()


def open_session(control: Path, command: str, stdin: int, stdout: int, stderr: int) -> Session | None:
    """``command`` started on the master listening at ``control``, with the descriptors ``stdin``,
    ``stdout`` and ``stderr`` as its streams (the master keeps copies; the caller closes its own).
    None when no master answers there.

    :raise GuestError: when the master refuses the session.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(HELLO_TIMEOUT)
        try:
            sock.connect(os.fspath(control))
        except OSError:  # no master (ENOENT, ECONNREFUSED): ssh makes one
            sock.close()
            return None
        packets = Packets(sock)
        sock.sendall(hello_packet())
        kind, _ = packets.wait()
        if kind != HELLO:
            raise GuestError(f"the kept SSH connection's socket did not greet (packet {kind:#x})")
        sock.sendall(new_session_packet(1, command))
        for fd in (stdin, stdout, stderr):  # one a message, as ssh's client sends them
            sock.sendmsg([b"\0"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("i", fd))])
        kind, rest = packets.wait()
        if kind in (PERMISSION_DENIED, FAILURE):
            raise GuestError(f"the kept SSH connection refused a session: {_reason(rest)}")
        if kind != SESSION_OPENED or len(rest) < 8:
            raise GuestError(f"the kept SSH connection answered a session with packet {kind:#x}")
        sock.settimeout(None)
        return Session(sock, packets, struct.unpack(">I", rest[4:8])[0])
    except OSError as exc:
        sock.close()
        raise GuestError(f"the kept SSH connection did not answer: {exc.strerror or exc}") from exc
    except BaseException:
        sock.close()
        raise


class Started(NamedTuple):
    """A command started on a master: its session and the read ends of its output and error pipes."""

    session: Session
    stdout: int
    stderr: int


def starting_marker(control: Path) -> Path:
    """Where ``labctl up`` notes the pid of the ``ssh`` that is making the master at ``control`` in
    the background (:func:`labctl.mux.prewarm`): ``.mux-PORT.starting`` beside the socket."""
    return control.with_name(f".{control.name}.starting")


def starting_pid(control: Path) -> int | None:
    """The pid of the ``ssh`` still making the master at ``control`` (its title names the socket: not
    a reused pid), or None: none was started, or it is done (the master answers, or it failed)."""
    try:
        pid = int(starting_marker(control).read_text())
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if os.fsencode(control) in title else None


def await_master(control: Path, timeout: float = PREWARM_WAIT) -> bool:
    """Wait (at most ``timeout`` seconds) while the master at ``control`` is being made in the
    background; whether one was (then the caller asks it again)."""
    import time

    if starting_pid(control) is None:
        return False
    deadline = time.monotonic() + timeout
    while starting_pid(control) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    return True


def start_on_master(control: Path, command: str) -> Started | None:
    """``command`` started on the master at ``control`` with this process's standard input and two new
    pipes for its output and error (the master writes into them; their read ends are the caller's to
    close); None when no master answers there, once a master being made there is done
    (:func:`await_master`).

    :raise GuestError: when the master refuses the session.
    """
    got = _start_on_master(control, command)
    if got is None and await_master(control):
        got = _start_on_master(control, command)
    return got


def _start_on_master(control: Path, command: str) -> Started | None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        session = open_session(control, command, 0, out_w, err_w)
    except BaseException:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        raise
    os.close(out_w)
    os.close(err_w)
    if session is None:
        os.close(out_r)
        os.close(err_r)
        return None
    return Started(session, out_r, err_r)
