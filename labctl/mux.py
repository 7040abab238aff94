"""The kept connection of ``labctl exec`` and ``labctl cp``: OpenSSH's ControlMaster, one per guest.

The first ``exec`` or ``cp`` to a guest logs in with OpenSSH (the lab's key, the guest's pinned
host key, ``StrictHostKeyChecking=yes``, no config file read) and leaves that connection behind
as a master in the background (``ControlPersist``); later calls open a session on it instead of a
new handshake. Its socket is ``<run dir>/guests/<guest>/mux-<port>``: made 0600 by ssh, in the
guest's 0700 directory of the user's 0700 run directory; the master checks its client's uid too.

It is forgotten when the guest under it changes or goes: ``reset`` and ``checkpoint restore``
close it first (:func:`close`), ``down`` closes every one of the lab's (:func:`close_lab`); a
master whose guest dropped the connection (its QEMU killed, sshd restarted, a guest restored
under it) exits, and the next call makes a new one, which checks the pinned host key again:
never a master to another machine. It exits by itself after :data:`PERSIST` idle seconds (a
crash of labctl leaves it at most that long), and when the guest stops answering for
:data:`ALIVE_INTERVAL` x :data:`ALIVE_COUNT` seconds (a hung guest: an error, not a hang).

A socket path too long for a unix socket (a very long state directory) means no kept
connection: each call logs in afresh, as before.

paramiko is not imported here (``exec`` loads neither it nor the backends: tests/unit/test_cli_budget.py).

Imports never: paramiko, labctl.backends, labctl.state, labctl.lab, labctl.cli
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import select
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO, Self

from labctl.endpoint import Endpoint, Result, config_quote
from labctl.errors import GuestError, LabctlError
from labctl.muxclient import (
    SOCKET_PREFIX,
    Started,
    await_master,
    control_path,
    start_on_master,
    starting_marker,
    starting_pid,
)

if TYPE_CHECKING:
    from labctl.proc import Process

# labctl.proc (and the logging and subprocess it brings, 6 ms of every command) is imported where a
# process is started: exec and cp over a live master start none (labctl.muxclient speaks to it).

PERSIST = 600  # seconds an idle master stays
ALIVE_INTERVAL, ALIVE_COUNT = 15, 8  # a guest silent for 2 minutes loses its master (and its sessions)
CONNECT_TIMEOUT = 10  # seconds for a new connection's TCP connect (the banner and login: ALIVE_*)
READ_TIMEOUT = 30.0  # one read from (or write to) a guest's stream, as labctl.ssh's
SSH_FAILED = 255  # ssh's own failure, or the remote command's 255: the log says which


def ssh_argv(ep: Endpoint, control: Path | None, log: Path | None, command: str | None,
             extra: Sequence[str] = ()) -> list[str]:
    """The ``ssh`` command line running ``command`` on ``ep``'s guest over its kept connection at
    ``control`` (made when there is none; None: a connection of its own), ssh's own messages to
    ``log``. No config file is read (``-F none``): nothing of the user's or the host's changes
    which key, which host key or which connection is used."""
    mux = (["-o", "ControlMaster=auto", "-o", f"ControlPath={config_quote(str(control))}",
            "-o", f"ControlPersist={PERSIST}"] if control is not None else ["-o", "ControlMaster=no",
                                                                            "-o", "ControlPath=none"])
    return ["ssh", "-F", "none", "-T", *(["-E", str(log)] if log is not None else []),
            *ep.openssh_argv([
                "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
                "-o", f"ServerAliveInterval={ALIVE_INTERVAL}", "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
                *mux, *extra])[1:],
            *(["--", command] if command is not None else [])]


def _control_argv(control: Path, op: str) -> list[str]:
    """``ssh -O OP`` to the master at ``control`` (the host name is ssh's syntax, unused)."""
    return ["ssh", "-F", "none", "-o", "LogLevel=QUIET", "-o", f"ControlPath={config_quote(str(control))}",
            "-O", op, "labctl-guest"]


def master_pid(control: Path, timeout: float = 5.0) -> int | None:
    """The pid of the master listening at ``control`` (None: none answers)."""
    from labctl.proc import run

    try:
        res = run(_control_argv(control, "check"), timeout, check=False)
    except (OSError, LabctlError):
        return None
    m = re.search(r"pid=(\d+)", (res.stdout + res.stderr).decode(errors="replace"))
    return int(m.group(1)) if res.returncode == 0 and m else None


def _is_master(pid: int, control: Path) -> bool:
    """Whether ``pid`` is still ssh's master of ``control`` (its title names the socket), not a reused pid."""
    try:
        return str(control) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _gone(pid: int, control: Path) -> bool:
    """Whether the master ``pid`` of ``control`` has exited: reaped, or a zombie (it holds nothing
    any more; its parent is init, which may take seconds to reap it: 1.9 s was seen where init is
    not systemd). An exiting process's title reads empty while it still exists, so "no longer
    names the socket" is not yet "gone" (``down`` returning while the master lingered was seen);
    a title naming something else is a reused pid."""
    from labctl.proc import pid_alive

    if not pid_alive(pid):
        return True
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return bool(title) and str(control).encode() not in title


def prewarm(ep: Endpoint, guest_dir: Path) -> bool:
    """Start making the kept connection to ``ep``'s guest in the background, and return at once:
    ``up`` does, so that the first ``exec`` or ``cp`` finds its login done (or waits for it,
    :func:`labctl.muxclient.await_master`, instead of making a second one). The ``ssh`` is the
    caller's, in a session of its own; it goes to the background once logged in (``-f``), which is
    when the master answers; its pid is noted beside the socket while it logs in. Whether one was
    started (not: no socket path, a master answers already, or ssh could not start). Never raises."""
    from labctl.proc import start_detached

    control = control_path(guest_dir, ep.port)
    if control is None or _master_answers(control) or starting_pid(control) is not None:
        return False
    try:
        pid = start_detached(ssh_argv(ep, control, None, None, ["-f", "-N", "-n"]))
        marker = starting_marker(control)
        tmp = marker.with_name(f"{marker.name}.{pid}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(pid))
        os.replace(tmp, marker)
    except (OSError, LabctlError):
        return False
    return True


def _master_answers(control: Path) -> bool:
    """Whether a master answers at ``control`` (its socket there and listening)."""
    import _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(os.fspath(control))
        return True
    except OSError:
        return False
    finally:
        s.close()


def close(guest_dir: Path, timeout: float = 5.0) -> None:
    """Close every kept connection to the guest whose directory is ``guest_dir`` and remove its
    sockets: asked to exit (``ssh -O exit``), killed when it does not within ``timeout``; an ``ssh``
    still making one in the background (:func:`prewarm`) is stopped first. Never raises."""
    from labctl.proc import run

    try:
        sockets = [p for p in guest_dir.iterdir() if p.name.startswith(SOCKET_PREFIX)]
        markers = [p for p in guest_dir.iterdir() if p.name.startswith("." + SOCKET_PREFIX) and p.name.endswith(".starting")]
    except OSError:
        return
    for marker in markers:
        control = marker.with_name(marker.name[1:].removesuffix(".starting"))
        pid = starting_pid(control)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            marker.unlink()
        if control not in sockets and control.exists():
            sockets.append(control)
    for sock in sockets:
        pid = master_pid(sock, timeout)
        if pid is not None:
            with contextlib.suppress(OSError, LabctlError):
                run(_control_argv(sock, "exit"), timeout, check=False)
            deadline = time.monotonic() + timeout
            while not _gone(pid, sock) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _is_master(pid, sock):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            sock.unlink()


def close_lab(run_dir: Path) -> None:
    """Close the kept connections to every guest of the lab whose run directory is ``run_dir``."""
    try:
        guests = [p for p in (run_dir / "guests").iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return
    for gdir in guests:
        close(gdir)


_LOGS = itertools.count()


@contextlib.contextmanager
def _ssh_log(guest_dir: Path) -> Iterator[Path]:
    """A new private file (0600, ``O_EXCL``, in the guest's 0700 directory) for ssh's own messages
    of one call (no tempfile module: exec loads as little as it can)."""
    while True:
        name = guest_dir / f".ssh-{os.getpid()}-{next(_LOGS)}-{os.urandom(4).hex()}.log"
        try:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise GuestError(f"cannot write in {guest_dir}: {exc.strerror}") from exc
    try:
        yield name
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _said(log: Path) -> str:
    """What ssh itself said (the last lines of its log), '' when nothing."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 4000))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _failure(ep: Endpoint, said: str) -> GuestError:
    from labctl.textsafe import safe_text

    return GuestError(f"cannot run a command on guest {ep.guest} over SSH (127.0.0.1:{ep.port}): "
                      + safe_text(said.splitlines()[-1] if said else "ssh failed"),
                      hint="'labctl status' shows whether the guest runs")


def _stop(proc: Process[bytes]) -> None:
    """End an ssh client (the master, if any, stays for the next call)."""
    from labctl.proc import TimeoutExpired

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except TimeoutExpired:
            proc.kill()
            proc.wait()


class MuxSession:
    """Commands on one guest over its kept connection: what :class:`labctl.ssh.Session` offers
    ``labctl cp`` (:mod:`labctl.steps.transfer`) and ``exec``, with OpenSSH's client."""

    def __init__(self, ep: Endpoint, guest_dir: Path) -> None:
        self.ep, self.guest_dir = ep, guest_dir
        self.control = control_path(guest_dir, ep.port)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # the connection is kept

    def argv(self, command: str, log: Path | None) -> list[str]:
        if self.control is not None:
            await_master(self.control)  # up's background login: one login, not two at once
        return ssh_argv(self.ep, self.control, log, command)

    def call(self, command: str, timeout: float, abort: Callable[[], str | None] | None = None) -> int:
        """Run ``command`` with this process's standard input, and its output and error copied to
        this process's own (its bytes, literally); its exit status.

        The output goes through pipes that labctl copies, never this process's own descriptors: ssh
        hands a client's descriptors to the master, which keeps the error stream open until the
        guest's command ends, so a command that outlived ``--timeout`` (or a crashed guest) held
        whoever reads labctl's output for as long as the master lived.

        ``abort`` is polled about once a second; when it returns a reason the command is given
        up on with a GuestError carrying it, and the kept connection is closed (its guest is gone);
        a command that outlives ``timeout`` is given up on too.

        :raise GuestError: when ssh itself fails (it cannot connect, the host key does not match...).
        """
        if self.control is not None:
            status = self._call_on_master(command, timeout, abort)
            if status is not None:
                return status
        from labctl.proc import PIPE, TimeoutExpired, start_child

        with _ssh_log(self.guest_dir) as log:
            proc = start_child(self.argv(command, log), stdout=PIPE, stderr=PIPE)
            assert proc.stdout is not None and proc.stderr is not None
            relay = _Relay({proc.stdout.fileno(): 1, proc.stderr.fileno(): 2})
            watch = _Watch(self, timeout, abort)
            try:
                while True:
                    if relay.open:
                        relay.pump(watch.wait())
                    elif proc.poll() is None:
                        with contextlib.suppress(TimeoutExpired):
                            proc.wait(timeout=watch.wait())
                    if not relay.open and proc.poll() is not None:
                        status = proc.returncode
                        break
                    watch.check(lambda: _stop(proc))
            finally:
                _stop(proc)
                proc.stdout.close()
                proc.stderr.close()
            if status == SSH_FAILED and (said := _said(log)):
                raise _failure(self.ep, said)
            return status if status >= 0 else 128 - status  # killed by a signal: as a shell says it

    def _call_on_master(self, command: str, timeout: float, abort: Callable[[], str | None] | None) -> int | None:
        """:meth:`call` over the master that answers at the socket, spoken to directly
        (:mod:`labctl.muxclient`: no ``ssh`` started); None when none answers (then ssh makes one)."""
        assert self.control is not None
        started = start_on_master(self.control, command)
        return None if started is None else self.relay(started, timeout, abort)

    def relay(self, started: Started, timeout: float, abort: Callable[[], str | None] | None) -> int:
        """The output of a command :func:`start_on_master` started on this guest's master, copied to this
        process's own, until it ends; its exit status (see :meth:`call`)."""
        session, out_r, err_r = started
        relay = _Relay({out_r: 1, err_r: 2})
        watch = _Watch(self, timeout, abort)
        try:
            while relay.open or not (session.closed or session.status is not None):
                if session.closed or session.status is not None:
                    relay.pump(watch.wait())
                elif relay.pump(watch.wait(), watch=session.fileno()):
                    session.read()
                watch.check(session.close)
        finally:
            session.close()
            for fd in relay.fds:
                os.close(fd)
        # The master ended the session with no status: the command died of a signal or the
        # connection was lost, which ssh's own client reports as 255 too.
        return session.status if session.status is not None else SSH_FAILED

    def run(self, command: str, timeout: float = 60.0) -> Result:
        """Run ``command`` with no input and collect its output.

        :raise GuestError: when ssh fails or ``timeout`` passes.
        """
        from labctl.proc import run

        t0 = time.monotonic()
        with _ssh_log(self.guest_dir) as log:
            try:
                res = run(self.argv(command, log), timeout, check=False)
            except LabctlError as exc:  # a timeout (ssh is installed: the caller found it)
                raise GuestError(f"command on guest {self.ep.guest} failed: {exc.message}") from exc
            if res.returncode == SSH_FAILED and (said := _said(log)):
                raise _failure(self.ep, said)
        return Result(res.returncode, res.stdout, res.stderr, time.monotonic() - t0)

    @contextlib.contextmanager
    def stream(self, command: str, timeout: float) -> Iterator[BinaryIO]:
        """Run ``command`` and read its standard output as a file, for the block; every read is
        bounded, and so is the whole exchange (``timeout``). Its exit status is checked when the
        block ends.

        :raise GuestError: on a timeout, a lost connection or a non-zero exit status.
        """
        from labctl.proc import DEVNULL, PIPE, start_child

        with _ssh_log(self.guest_dir) as log, _scratch() as err:
            proc = start_child(self.argv(command, log), stdin=DEVNULL, stdout=PIPE, stderr=err)
            assert proc.stdout is not None
            reader = _Reader(proc.stdout, time.monotonic() + timeout, self.ep.guest)
            try:
                yield reader  # type: ignore[misc]
                proc.stdout.close()
                self._check(proc, reader.deadline, log, err)
            finally:
                _stop(proc)

    @contextlib.contextmanager
    def feed(self, command: str, timeout: float) -> Iterator[BinaryIO]:
        """Run ``command`` and write its standard input as a file, for the block; every write is
        bounded, and so is the whole exchange (``timeout``). When the block ends, the input is
        closed and the command's exit status checked.

        :raise GuestError: on a timeout, a lost connection or a non-zero exit status (with its stderr).
        """
        from labctl.proc import DEVNULL, PIPE, start_child

        with _ssh_log(self.guest_dir) as log, _scratch() as err:
            proc = start_child(self.argv(command, log), stdin=PIPE, stdout=DEVNULL, stderr=err)
            assert proc.stdin is not None
            writer = _Writer(proc, time.monotonic() + timeout, self.ep.guest)
            try:
                try:
                    yield writer  # type: ignore[misc]
                except GuestError as exc:
                    tail = _tail(err)
                    raise GuestError(f"{exc.message}: {tail}" if tail else exc.message) from exc
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                self._check(proc, writer.deadline, log, err)
            finally:
                _stop(proc)

    def _check(self, proc: Process[bytes], deadline: float, log: Path, err: IO[bytes]) -> None:
        from labctl.proc import TimeoutExpired

        try:
            status = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutExpired as exc:
            raise GuestError(f"command on guest {self.ep.guest} failed: no exit status in time") from exc
        if status == SSH_FAILED and (said := _said(log)):
            raise _failure(self.ep, said)
        if status != 0:
            raise GuestError(f"command on guest {self.ep.guest} exited with status {status}: {_tail(err)}")


class _Watch:
    """A running command's clock (:meth:`MuxSession.call`): how long to wait for its next output,
    ``abort`` asked about once a second, and its ``timeout``."""

    def __init__(self, session: MuxSession, timeout: float, abort: Callable[[], str | None] | None) -> None:
        self.session, self.timeout, self.abort = session, timeout, abort
        self.deadline = time.monotonic() + timeout
        self.next_poll = time.monotonic() + 1.0

    def wait(self) -> float:
        """Seconds to wait for output before :meth:`check` is due (at least 10 ms, at most 1 s)."""
        return min(1.0, max(0.01, min(self.deadline, self.next_poll) - time.monotonic()))

    def check(self, stop: Callable[[], None]) -> None:
        """:raise GuestError: with ``abort``'s reason (the command stopped by ``stop``, the guest's kept
        connection closed: its guest is gone), or when the command outlived its timeout."""
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + 1.0
            reason = self.abort() if self.abort else None
            if reason:
                stop()
                close(self.session.guest_dir)  # its guest is gone: so are its sessions
                raise GuestError(reason)
        if now >= self.deadline:
            raise GuestError(f"command on guest {self.session.ep.guest} failed: no exit status after "
                             f"{self.timeout:.0f} s")


def _scratch() -> IO[bytes]:
    """An unnamed file for a command's standard error (a pipe could fill and stall the guest)."""
    import tempfile

    return tempfile.TemporaryFile()


def _tail(err: IO[bytes]) -> str:
    err.seek(0)
    return err.read().decode(errors="replace").strip()[-2000:]


class _Relay:
    """Copies what arrives on some pipes to this process's descriptors (``{pipe fd: own fd}``) as it
    comes; an own descriptor whose reader went away (a closed pipe) is drained into nothing."""

    def __init__(self, routes: dict[int, int]) -> None:
        self.routes = dict(routes)
        self.fds = tuple(routes)  # every pipe, open or at its end: the caller closes them
        self.broken: set[int] = set()

    @property
    def open(self) -> bool:
        return bool(self.routes)

    def pump(self, wait: float, watch: int | None = None) -> bool:
        """Copy what is ready within ``wait`` seconds; a pipe at its end is dropped. True when
        ``watch`` (another descriptor waited on with the pipes) is readable."""
        ready, _, _ = select.select([*self.routes, *([] if watch is None else [watch])], [], [], wait)
        for fd in ready:
            if fd == watch:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                del self.routes[fd]
                continue
            out = self.routes[fd]
            if out in self.broken:
                continue
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(out, view):]
            except OSError:  # EPIPE and friends: nobody reads it any more
                self.broken.add(out)
        return watch is not None and watch in ready


class _Reader:
    """An ssh client's standard output as a binary file whose reads are bounded by a deadline."""

    def __init__(self, pipe: IO[bytes], deadline: float, guest: str) -> None:
        self.fd, self.deadline, self.guest = pipe.fileno(), deadline, guest

    def read(self, size: int = -1) -> bytes:
        parts: list[bytes] = []
        want = size if size >= 0 else 1 << 62
        while want > 0:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise GuestError(f"guest {self.guest} sent its files too slowly (time limit reached)")
            ready, _, _ = select.select([self.fd], [], [], min(left, READ_TIMEOUT))
            if not ready:
                if time.monotonic() < self.deadline:
                    raise GuestError(f"guest {self.guest} stopped sending for {READ_TIMEOUT:.0f} s")
                continue
            data = os.read(self.fd, min(want, 1 << 16))
            if not data:
                break
            parts.append(data)
            want -= len(data)
        return b"".join(parts)


class _Writer:
    """An ssh client's standard input as a binary file whose writes are bounded by a deadline."""

    def __init__(self, proc: Process[bytes], deadline: float, guest: str) -> None:
        assert proc.stdin is not None
        self.proc, self.fd, self.deadline, self.guest = proc, proc.stdin.fileno(), deadline, guest

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        moved = time.monotonic()
        while view:
            now = time.monotonic()
            if now > self.deadline:
                raise GuestError(f"guest {self.guest} took in the files too slowly (time limit reached)")
            if now - moved > READ_TIMEOUT:
                raise GuestError(f"guest {self.guest} stopped reading for {READ_TIMEOUT:.0f} s")
            if self.proc.poll() is not None:
                raise GuestError(f"the command on guest {self.guest} stopped reading")
            _, ready, _ = select.select([], [self.fd], [], min(self.deadline - now, 1.0))
            if not ready:
                continue
            moved = time.monotonic()
            try:
                sent = os.write(self.fd, view[:1 << 16])
            except BrokenPipeError as exc:
                raise GuestError(f"the command on guest {self.guest} stopped reading") from exc
            view = view[sent:]
        return len(data)

    def flush(self) -> None:
        pass
