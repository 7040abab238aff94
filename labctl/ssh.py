"""SSH into guests with paramiko: per-lab key, pinned host keys, no passwords.

A guest on a remote libvirt host forwards its SSH port to that host's
127.0.0.1 only; it is reached through a ``direct-tcpip`` channel of an SSH
connection to the host itself (the account of its ``qemu+ssh://`` URI).

paramiko's exceptions are mapped to :class:`GuestError` here.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO, Self

import paramiko

from labctl.endpoint import GUEST_KEX as GUEST_KEX  # noqa: PLC0414

# Endpoints and the OpenSSH command lines that reach them: a leaf (exec and status read them without paramiko).
from labctl.endpoint import Endpoint as Endpoint  # noqa: PLC0414
from labctl.endpoint import Result as Result  # noqa: PLC0414
from labctl.endpoint import command_line as command_line  # noqa: PLC0414
from labctl.endpoint import config_quote as config_quote  # noqa: PLC0414
from labctl.endpoint import hop_forward_argv as hop_forward_argv  # noqa: PLC0414
from labctl.endpoint import hop_stdio_argv as hop_stdio_argv  # noqa: PLC0414
from labctl.errors import GuestError
from labctl.lab import SshHop


class Session:
    """One SSH connection to a guest. Use as a context manager."""

    def __init__(self, ep: Endpoint, timeout: float = 10.0) -> None:
        self.ep = ep
        self.jump: paramiko.SSHClient | None = None
        self.client = paramiko.SSHClient()
        self.client.load_host_keys(str(ep.known_hosts))
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            sock = self._tunnel(timeout) if ep.via else None
            self.client.connect(ep.host, port=ep.port, username=ep.user, key_filename=str(ep.key),
                                allow_agent=False, look_for_keys=False, timeout=timeout,
                                banner_timeout=timeout, auth_timeout=timeout, sock=sock)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            where = f" via {ep.via.user}@{ep.via.host}:{ep.via.port}" if ep.via else ""
            raise GuestError(f"cannot SSH to guest {ep.guest} on {ep.host}:{ep.port}{where}: {exc}") from exc

    def _tunnel(self, timeout: float) -> paramiko.Channel:
        """A ``direct-tcpip`` channel to the guest's port, through the libvirt host's sshd."""
        hop = self.ep.via
        assert hop is not None
        self.jump = jump_client(hop, timeout)
        transport = self.jump.get_transport()
        assert transport is not None
        return transport.open_channel("direct-tcpip", (self.ep.host, self.ep.port), ("127.0.0.1", 0),
                                      timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()
        if self.jump is not None:
            self.jump.close()

    def run(self, command: str, timeout: float = 60.0, stream: bool = False,
            stdout: BinaryIO | None = None, stderr: BinaryIO | None = None,
            abort: Callable[[], str | None] | None = None) -> Result:
        """Run ``command`` (a shell command line) and wait for its exit status.

        With ``stream`` the output is copied to ``stdout``/``stderr`` (default:
        this process's) as it arrives, else collected. ``abort`` is polled
        about once a second; when it returns a reason the command is
        abandoned with a GuestError carrying it.

        :raise GuestError: when the connection fails, ``timeout`` passes or ``abort`` says so.
        """
        t0 = time.monotonic()
        try:
            chan = self.client.get_transport().open_session(timeout=timeout)
            chan.settimeout(1.0)
            data = command.encode()
            if len(data) <= LONG_COMMAND:
                chan.exec_command(command)
            else:  # too long for one argument of execve: the guest's shell reads it, then runs it
                chan.settimeout(min(timeout, READ_TIMEOUT))
                chan.exec_command('eval "$(cat)"')
                chan.sendall(data)
                chan.shutdown_write()
                chan.settimeout(1.0)
            deadline = t0 + timeout
            out, err = _pump(chan, stream, stdout or sys.stdout.buffer, stderr or sys.stderr.buffer, timeout,
                             abort)
            status = _exit_status(chan, deadline)
            if status < 0 and time.monotonic() > deadline:
                chan.close()
                raise TimeoutError(f"no exit status after {timeout:.0f} s")
        except Aborted as exc:
            raise GuestError(str(exc)) from exc
        except (TimeoutError, paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            raise GuestError(f"command on guest {self.ep.guest} failed: {exc or type(exc).__name__}") from exc
        return Result(status, out, err, time.monotonic() - t0)


    def _exec(self, command: str, timeout: float) -> Any:
        """A new channel running ``command``, each read and write on it bounded (:data:`READ_TIMEOUT`).

        :raise GuestError: when the channel cannot be opened or the command started.
        """
        try:
            chan = self.client.get_transport().open_session(timeout=timeout)
            chan.settimeout(min(timeout, READ_TIMEOUT))
            chan.exec_command(command)
            return chan
        except (TimeoutError, paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            raise GuestError(f"command on guest {self.ep.guest} failed: {exc or type(exc).__name__}") from exc

    @contextlib.contextmanager
    def stream(self, command: str, timeout: float) -> Iterator[BinaryIO]:
        """Run ``command`` and read its standard output as a file, for the block.

        Every read is bounded, and so is the whole exchange (``timeout``):
        a guest that stops sending fails the read with a GuestError instead
        of hanging. Its exit status is checked when the block ends.

        :raise GuestError: on a timeout, a lost connection or a non-zero exit status.
        """
        chan = self._exec(command, timeout)
        reader = _BoundedReader(chan, time.monotonic() + timeout, self.ep.guest)
        try:
            yield reader  # type: ignore[misc]
            status = _exit_status(chan, reader.deadline)
            if status != 0:
                err = chan.recv_stderr(4096).decode(errors="replace").strip() if chan.recv_stderr_ready() else ""
                raise GuestError(f"command on guest {self.ep.guest} exited with status {status}: {err}")
        finally:
            chan.close()

    @contextlib.contextmanager
    def feed(self, command: str, timeout: float) -> Iterator[BinaryIO]:
        """Run ``command`` and write its standard input as a file, for the block (``labctl cp``
        to a guest: a tar stream into ``tar -x``).

        Every write is bounded, and so is the whole exchange (``timeout``): a guest that
        stops reading fails the write with a GuestError instead of hanging. When the block
        ends, the input is closed and the command's exit status checked.

        :raise GuestError: on a timeout, a lost connection or a non-zero exit status (with
            the command's standard error).
        """
        chan = self._exec(command, timeout)
        writer = _BoundedWriter(chan, time.monotonic() + timeout, self.ep.guest)
        try:
            try:
                yield writer  # type: ignore[misc]
                chan.shutdown_write()
            except GuestError as exc:
                err = _stderr_of(chan, time.monotonic() + 5)
                raise GuestError(f"{exc.message}: {err}" if err else exc.message) from exc
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise GuestError(f"the connection to guest {self.ep.guest} was lost: {exc}") from exc
            status = _exit_status(chan, writer.deadline)
            if status != 0:
                err = _stderr_of(chan, time.monotonic() + 5)
                raise GuestError(f"command on guest {self.ep.guest} exited with status {status}: {err}")
        finally:
            chan.close()

    def pipe(self, command: str, timeout: float = 30.0) -> Pipe:
        """Run a long-lived ``command`` whose standard output is read as it comes and whose standard
        input takes lines (``labctl follow``: a trace's events, clock samples); its stderr is discarded.

        :raise GuestError: when the channel cannot be opened or the command started.
        """
        return Pipe(self._exec(command, timeout), self.ep.guest)


class Pipe:
    """A long-lived command on a guest (:meth:`Session.pipe`): quiet for as long as it likes."""

    def __init__(self, chan: paramiko.Channel, guest: str) -> None:
        self.chan, self.guest = chan, guest

    def send(self, data: bytes) -> None:
        """:raise GuestError: when the connection is lost."""
        try:
            self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise GuestError(f"the connection to guest {self.guest} was lost: {exc}") from exc

    def recv(self, timeout: float) -> bytes | None:
        """What arrived within ``timeout`` s (None: nothing yet; b"": the command ended).

        :raise GuestError: when the connection is lost.
        """
        try:
            self.chan.settimeout(max(timeout, 0.001))
            return bytes(self.chan.recv(1 << 16))
        except TimeoutError:
            return None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise GuestError(f"the connection to guest {self.guest} was lost: {exc}") from exc

    def close(self) -> None:
        self.chan.close()


READ_TIMEOUT = 30.0  # one read from a guest's stream
#: bytes: a longer command goes to the guest's shell on its standard input (sshd hands a command to
#: ``sh -c`` as one argument, and Linux refuses one over 128 KiB, MAX_ARG_STRLEN: the command never
#: ran, and printed nothing; a follow of many tunnels' probes was seen at 130 KB)
LONG_COMMAND = 100_000


class _BoundedReader:
    """A channel's stdout as a binary file whose reads are bounded by a deadline."""

    def __init__(self, chan: paramiko.Channel, deadline: float, guest: str) -> None:
        self.chan, self.deadline, self.guest = chan, deadline, guest

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        want = size if size >= 0 else 1 << 62
        while want > 0:
            if time.monotonic() > self.deadline:
                raise GuestError(f"guest {self.guest} sent its files too slowly (time limit reached)")
            try:
                data = self.chan.recv(min(want, 1 << 16))
            except TimeoutError as exc:
                raise GuestError(f"guest {self.guest} stopped sending for {READ_TIMEOUT:.0f} s") from exc
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise GuestError(f"the connection to guest {self.guest} was lost: {exc}") from exc
            if not data:
                break
            parts.append(data)
            want -= len(data)
            if size < 0:
                continue
        return b"".join(parts)


class _BoundedWriter:
    """A channel's stdin as a binary file whose writes are bounded by a deadline."""

    def __init__(self, chan: paramiko.Channel, deadline: float, guest: str) -> None:
        self.chan, self.deadline, self.guest = chan, deadline, guest

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if time.monotonic() > self.deadline:
                raise GuestError(f"guest {self.guest} took in the files too slowly (time limit reached)")
            if self.chan.exit_status_ready():
                raise GuestError(f"the command on guest {self.guest} stopped reading")
            try:
                sent = self.chan.send(view[:1 << 16])
            except TimeoutError as exc:
                raise GuestError(f"guest {self.guest} stopped reading for {READ_TIMEOUT:.0f} s") from exc
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise GuestError(f"the connection to guest {self.guest} was lost: {exc}") from exc
            if sent <= 0:
                raise GuestError(f"the connection to guest {self.guest} was closed")
            view = view[sent:]
        return len(data)

    def flush(self) -> None:
        pass


def _stderr_of(chan: paramiko.Channel, deadline: float, limit: int = 1 << 16) -> str:
    """What the channel's command wrote on its standard error (at most ``limit`` bytes, waiting
    until ``deadline`` for it to exit)."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        if chan.recv_stderr_ready():
            data = chan.recv_stderr(4096)
            if not data:
                break
            parts.append(data)
            size += len(data)
        elif chan.exit_status_ready() or chan.closed or time.monotonic() > deadline:
            if not chan.recv_stderr_ready():
                break
        else:
            time.sleep(0.02)
    return b"".join(parts).decode(errors="replace").strip()[-2000:]


def _exit_status(chan: paramiko.Channel, deadline: float) -> int:
    """The channel's exit status, waiting at most until ``deadline`` (-1 when it never comes)."""
    while not chan.exit_status_ready():
        if time.monotonic() > deadline or chan.closed:
            return -1 if not chan.exit_status_ready() else chan.recv_exit_status()
        time.sleep(0.02)
    return int(chan.recv_exit_status())


class Aborted(Exception):
    pass


def _pump(chan: paramiko.Channel, stream: bool, out_f: BinaryIO, err_f: BinaryIO,
          timeout: float, abort: Callable[[], str | None] | None = None) -> tuple[bytes, bytes]:
    out: list[bytes] = []
    err: list[bytes] = []
    deadline = time.monotonic() + timeout

    def drain_err() -> None:
        while True:
            try:
                data = chan.recv_stderr(32768)
            except TimeoutError:
                if chan.closed:
                    return
                continue
            except (OSError, EOFError):
                return
            if not data:
                return
            if stream:
                err_f.write(data)
                err_f.flush()
            else:
                err.append(data)

    t = threading.Thread(target=drain_err, daemon=True)
    t.start()
    while True:
        if time.monotonic() > deadline:
            chan.close()
            raise TimeoutError(f"no exit after {timeout:.0f} s")
        try:
            data = chan.recv(32768)
        except TimeoutError:
            reason = abort() if abort else None
            if reason:
                chan.close()
                raise Aborted(reason) from None
            continue
        if not data:
            break
        if stream:
            out_f.write(data)
            out_f.flush()
        else:
            out.append(data)
    t.join(timeout=max(0.1, deadline - time.monotonic()))
    return b"".join(out), b"".join(err)


def jump_client(hop: SshHop, timeout: float = 10.0) -> paramiko.SSHClient:
    """An SSH connection to a libvirt host as its ``qemu+ssh://`` URI logs in.

    The host key is checked against the user's known_hosts unless the URI
    says ``no_verify=1`` (as libvirt's own ssh does).

    :raise paramiko.SSHException, OSError: when it cannot connect.
    """
    client = paramiko.SSHClient()
    if hop.no_verify:
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        client.load_system_host_keys()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(hop.host, port=hop.port, username=hop.user, key_filename=hop.keyfile,
                       allow_agent=hop.keyfile is None, look_for_keys=hop.keyfile is None,
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout)
    except BaseException:
        client.close()
        raise
    return client


def run_on_host(hop: SshHop, argv: Sequence[str], timeout: float = 30.0) -> tuple[int, str]:
    """Run ``argv`` (quoted word by word) on the libvirt host ``hop``; (exit status, stderr).

    Every wait is bounded by ``timeout``; an unreachable host or a timeout is status 255.
    """
    try:
        client = jump_client(hop, timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return 255, f"cannot log in to {hop.user}@{hop.host}:{hop.port}: {exc}"
    try:
        chan = client.get_transport().open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.exec_command(shlex.join(argv))
        deadline = time.monotonic() + timeout
        while not chan.exit_status_ready():
            if time.monotonic() > deadline:
                return 255, f"no answer within {timeout:.0f} s"
            time.sleep(0.05)
        err = chan.recv_stderr(65536).decode(errors="replace").strip() if chan.recv_stderr_ready() else ""
        return chan.recv_exit_status(), err
    except (TimeoutError, paramiko.SSHException, OSError, EOFError) as exc:
        return 255, str(exc)
    finally:
        client.close()


def io_on_host(hop: SshHop, argv: Sequence[str], data: bytes, timeout: float = 60.0) -> tuple[int, bytes, str]:
    """Run ``argv`` on the libvirt host ``hop`` with ``data`` on its standard input; (exit
    status, standard output, standard error). An unreachable host or a timeout is status 255."""
    try:
        client = jump_client(hop, timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        return 255, b"", f"cannot log in to {hop.user}@{hop.host}:{hop.port}: {exc}"
    try:
        chan = client.get_transport().open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.exec_command(shlex.join(argv))
        chan.sendall(data)
        chan.shutdown_write()
        out, err = _pump(chan, False, sys.stdout.buffer, sys.stderr.buffer, timeout)
        return chan.recv_exit_status(), out, err.decode(errors="replace").strip()
    except (TimeoutError, paramiko.SSHException, OSError, EOFError) as exc:
        return 255, b"", str(exc)
    finally:
        client.close()


def read_on_host(hop: SshHop, argv: Sequence[str], timeout: float = 10.0, limit: int = 1 << 22) -> str | None:
    """The standard output of ``argv`` run on the libvirt host ``hop`` (at most
    ``limit`` bytes, every wait bounded); None when that fails."""
    try:
        client = jump_client(hop, timeout)
    except (paramiko.SSHException, OSError, EOFError):
        return None
    try:
        chan = client.get_transport().open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.exec_command(shlex.join(argv))
        out, _err = _pump(chan, False, sys.stdout.buffer, sys.stderr.buffer, timeout)
        return out[:limit].decode(errors="replace")
    except (TimeoutError, paramiko.SSHException, OSError, EOFError):
        return None
    finally:
        client.close()
