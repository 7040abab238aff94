"""SSH into guests with paramiko: per-lab key, pinned host keys, no passwords.

paramiko's exceptions are mapped to :class:`GuestError` here.
"""

from __future__ import annotations

import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import paramiko

from labctl.errors import GuestError


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach one guest's sshd."""

    guest: str
    port: int
    key: Path
    known_hosts: Path
    host: str = "127.0.0.1"
    user: str = "root"

    def openssh_argv(self, extra: Sequence[str] = ()) -> list[str]:
        """An ``ssh`` command line reaching this guest (for interactive use)."""
        return ["ssh", "-i", str(self.key), "-p", str(self.port),
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", *extra, f"{self.user}@{self.host}"]


@dataclass(frozen=True)
class Result:
    status: int
    stdout: bytes
    stderr: bytes
    duration: float


def command_line(argv: Sequence[str]) -> str:
    """A remote command from argv: one argument is taken as a shell command
    line as the user typed it; several are quoted word by word."""
    return argv[0] if len(argv) == 1 else shlex.join(argv)


class Session:
    """One SSH connection to a guest. Use as a context manager."""

    def __init__(self, ep: Endpoint, timeout: float = 10.0) -> None:
        self.ep = ep
        self.client = paramiko.SSHClient()
        self.client.load_host_keys(str(ep.known_hosts))
        self.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            self.client.connect(ep.host, port=ep.port, username=ep.user, key_filename=str(ep.key),
                                allow_agent=False, look_for_keys=False, timeout=timeout,
                                banner_timeout=timeout, auth_timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.client.close()
            raise GuestError(f"cannot SSH to guest {ep.guest} on {ep.host}:{ep.port}: {exc}") from exc

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

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
            chan = self.client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
            chan.settimeout(1.0)
            chan.exec_command(command)
            out, err = _pump(chan, stream, stdout or sys.stdout.buffer, stderr or sys.stderr.buffer, timeout,
                             abort)
            status = chan.recv_exit_status()
        except Aborted as exc:
            raise GuestError(str(exc)) from exc
        except (paramiko.SSHException, OSError, socket.timeout, EOFError, AttributeError) as exc:
            raise GuestError(f"command on guest {self.ep.guest} failed: {exc or type(exc).__name__}") from exc
        return Result(status, out, err, time.monotonic() - t0)


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
            except socket.timeout:
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
            raise socket.timeout(f"no exit after {timeout:.0f} s")
        try:
            data = chan.recv(32768)
        except socket.timeout:
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
