"""labctl's side of the guest agent (``guest/init``): a line protocol on the guest's
virtio-serial port, reached through a unix socket in the guest's 0700 run directory.

A guest restored from a snapshot still has the clock and the client key of the
lab that made the snapshot, and the throwaway host key that boot had (no
guest's own key is ever in a snapshot: labctl.up.warm); :func:`adopt` gives it
the host's time, this lab's client key and its own host key. The guest's
replies are only compared with the expected ``ok`` line.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from pathlib import Path

from labctl.errors import GuestError

MAX_REPLY = 4096


def call(sock_path: Path, command: str, timeout: float = 10.0) -> None:
    """Send one command line and wait for its ``ok <command>`` reply (see :func:`exchange`)."""
    exchange(sock_path, [command], timeout)


def exchange(sock_path: Path, commands: Sequence[str], timeout: float = 10.0) -> None:
    """Send command lines at once, over one connection, and wait for each one's ``ok <verb>``
    reply in turn (the agent answers them in order).

    One connection, because the agent looks for a new one only every 0.1 s.
    Lines left from an earlier, abandoned exchange are skipped.

    :raise GuestError: on ``err``, no reply within ``timeout``, or no agent.
    """
    verbs = [c.split(" ", 1)[0] for c in commands]
    deadline = time.monotonic() + timeout
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            s.connect(str(sock_path))
            s.sendall(b"".join(c.encode() + b"\n" for c in commands))
            buf = b""
            while verbs and time.monotonic() < deadline:
                s.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = s.recv(512)
                if not chunk:
                    break
                buf += chunk
                if len(buf) > MAX_REPLY:
                    break
                while verbs and b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    reply = line.decode(errors="replace").strip()
                    if reply == f"ok {verbs[0]}":
                        verbs.pop(0)
                    elif reply == f"err {verbs[0]}":
                        raise GuestError(f"the guest's agent refused '{verbs[0]}'")
            if not verbs:
                return
    except OSError as exc:
        raise GuestError(f"the guest's agent on {sock_path} did not answer '{verbs[0]}': {exc}") from exc
    raise GuestError(f"the guest's agent on {sock_path} did not answer '{verbs[0]}' within {timeout:.0f} s")


def wait_ready(sock_path: Path, timeout: float) -> bool:
    """True once the agent answers ``ping`` (it starts in the background at boot)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call(sock_path, "ping", timeout=min(2.0, max(0.2, deadline - time.monotonic())))
            return True
        except GuestError:
            time.sleep(0.1)
    return False


PEM_BEGIN, PEM_END = "-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"


def keys_command(authorized_keys: bytes, host_key: bytes) -> str:
    """The agent's ``keys`` line: the client key's type and blob, and the host key's PEM body
    lines joined by commas (the agent writes both files with shell builtins).

    :raise GuestError: when a key is not an ed25519 public key line / OpenSSH private key.
    """
    auth = authorized_keys.decode(errors="replace").split()
    pem = host_key.decode(errors="replace").strip().splitlines()
    if len(auth) < 2 or auth[0] != "ssh-ed25519":
        raise GuestError("the lab's authorized_keys is not an ssh-ed25519 key line")
    if len(pem) < 3 or (pem[0], pem[-1]) != (PEM_BEGIN, PEM_END):
        raise GuestError("the guest's host key is not an OpenSSH private key")
    return f"keys {auth[0]} {auth[1]} {','.join(line.strip() for line in pem[1:-1])}"


def adopt(sock_path: Path, keys: tuple[bytes, bytes] | None, timeout: float = 20.0) -> None:
    """Set a restored guest's clock to the host's and, with ``keys`` (authorized_keys, host
    key), give it those; sshd has reloaded and listens again when this returns.

    The clock goes first: the host's time is taken as the line is sent, and
    the reload takes a while.

    :raise GuestError: when the agent does not do it.
    """
    exchange(sock_path, [clock_command()] + ([keys_command(*keys)] if keys else []), timeout)


def clock_command() -> str:
    """The agent's ``clock`` line with the host's time now."""
    now = time.time_ns()
    return f"clock {now // 10**9}.{now % 10**9:09d}"


def set_clock(sock_path: Path, timeout: float = 20.0) -> None:
    """The guest's wall clock to the host's (a restored guest's clock stopped when it was saved)."""
    call(sock_path, clock_command(), timeout)
