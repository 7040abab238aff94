"""labctl's side of the guest agent (``guest/init``): a line protocol on the guest's
virtio-serial port, reached through two FIFOs in the guest's 0700 run directory
(``agent.in`` to the guest, ``agent.out`` from it: QEMU's pipe chardev, which the guest
always sees connected, so its agent sleeps in a blocking read while idle).

A guest restored from a snapshot still has the clock and the client key of the
lab that made the snapshot, and the throwaway host key that boot had (no
guest's own key is ever in a snapshot: labctl.up.warm); :func:`adopt` gives it
the host's time, this lab's client key and its own host key. The guest's
replies are only compared with the expected ``ok`` line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from labctl.errors import GuestError

MAX_REPLY = 4096


def call(channel: Path, command: str, timeout: float = 10.0) -> None:
    """Send one command line and wait for its ``ok <command>`` reply (see :func:`exchange`)."""
    exchange(channel, [command], timeout)


def channel_of(guest_dir: Path) -> Path:
    """A guest's agent channel (the FIFOs' common prefix) from its run directory."""
    return guest_dir / "agent"


def _fifo(path: Path, flags: int) -> int:
    """A descriptor of the FIFO ``path`` (never a link, never another kind of file)."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a FIFO")
    return fd


@contextlib.contextmanager
def _opened(channel: Path, deadline: float) -> Iterator[tuple[int, int]]:
    """(read end of CHANNEL.out, write end of CHANNEL.in), the channel held for this exchange
    alone (an exclusive lock on the write end: two exchanges would take each other's replies).
    Opening the write end fails (ENXIO) while no QEMU holds the FIFO."""
    rfd = _fifo(channel.with_name(channel.name + ".out"), os.O_RDONLY)
    try:
        wfd = _fifo(channel.with_name(channel.name + ".in"), os.O_WRONLY)
        try:
            while True:
                try:
                    fcntl.flock(wfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise OSError("another labctl is talking to it") from None
                    time.sleep(0.01)
            yield rfd, wfd
        finally:
            os.close(wfd)
    finally:
        os.close(rfd)


def exchange(channel: Path, commands: Sequence[str], timeout: float = 10.0) -> None:
    """Send command lines at once and wait for each one's ``ok <verb>`` reply in turn (the
    agent answers them in order). Lines left from an earlier, abandoned exchange are read
    away first and skipped.

    :raise GuestError: on ``err``, no reply within ``timeout``, or no agent (no QEMU).
    """
    verbs = [c.split(" ", 1)[0] for c in commands]
    deadline = time.monotonic() + timeout
    try:
        with _opened(channel, deadline) as (rfd, wfd):
            with contextlib.suppress(BlockingIOError):
                while os.read(rfd, 4096):  # stale replies; b"" once drained or with no writer
                    pass
            os.write(wfd, b"".join(c.encode() + b"\n" for c in commands))
            buf = b""
            while verbs and time.monotonic() < deadline:
                ready, _, _ = select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                try:
                    chunk = os.read(rfd, 512)
                except BlockingIOError:
                    continue
                if not chunk:  # QEMU closed its end: it is gone
                    raise OSError("its QEMU went away")
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
        raise GuestError(f"the guest's agent on {channel}.in/.out did not answer '{verbs[0]}': {exc}") from exc
    raise GuestError(f"the guest's agent on {channel}.in/.out did not answer '{verbs[0]}' within {timeout:.0f} s")


def wait_ready(channel: Path, timeout: float) -> bool:
    """True once the agent answers ``ping`` (it starts in the background at boot)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call(channel, "ping", timeout=min(2.0, max(0.2, deadline - time.monotonic())))
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


CLOCK_SLACK = 0.25  # seconds: a clock line answered later than this is sent again
CLOCK_TRIES = 5  # at most: a guest still busy at the second was seen 1.7 s off (test_warm_reset, a loaded host)


def adopt(channel: Path, keys: tuple[bytes, bytes] | None, timeout: float = 20.0) -> None:
    """Set a restored guest's clock to the host's and, with ``keys`` (authorized_keys, host
    key), give it those; sshd has reloaded and listens again when this returns.

    The clock goes first: the host's time is taken as the line is sent, and
    the reload takes a while. A clock line the agent answered more than :data:`CLOCK_SLACK` seconds
    after it was sent (a restored guest on a busy host: 2.4 s was seen) set a time that was stale by
    then: it is sent again, until one is answered at once (at most :data:`CLOCK_TRIES` lines).

    :raise GuestError: when the agent does not do it.
    """
    set_clock(channel, timeout)
    if keys:
        call(channel, keys_command(*keys), timeout)


def clock_command() -> str:
    """The agent's ``clock`` line with the host's time now."""
    now = time.time_ns()
    return f"clock {now // 10**9}.{now % 10**9:09d}"


def set_clock(channel: Path, timeout: float = 20.0) -> None:
    """The guest's wall clock to the host's (a restored guest's clock stopped when it was saved),
    sent again while the agent answers late (see :func:`adopt`)."""
    sent_promptly(lambda: call(channel, clock_command(), timeout), CLOCK_SLACK)


def sent_promptly(send: Callable[[], object], slack: float) -> None:
    """``send`` (a clock set to the host's time as it is sent) again while it took longer than ``slack``
    seconds: the time it set was stale by then (a busy host). At most :data:`CLOCK_TRIES` times."""
    for _ in range(CLOCK_TRIES):
        t0 = time.monotonic()
        send()
        if time.monotonic() - t0 <= slack:  # answered at once: the time it set was the host's
            return
