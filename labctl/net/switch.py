"""labctl's L2 switch for lab networks with three or more guests.

Run as ``python -m labctl.net.switch SWITCH_SOCKET [--user UID:GID]``. With
``--user`` (labctl runs as root, the guests' QEMUs as libvirt's QEMU user)
it becomes that user before binding, so its socket is that user's (0600)
and the switch holds no root privilege. Every guest NIC is a QEMU
``dgram`` netdev bound to its own unix socket and sending to the switch
socket; the switch learns which socket each source MAC lives behind and
forwards frames there, flooding broadcast, multicast and unknown
destinations to every other known port. Ports are learnt from traffic, so
the switch needs no list of members. It exits on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys

MAX_FRAME = 65536 + 64


class Switch:
    """A learning switch over one unix datagram socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(path)
        finally:
            os.umask(old)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.ports: set[str] = set()
        self.fdb: dict[bytes, str] = {}

    def handle(self, frame: bytes, sender: str) -> list[str]:
        """Learn from one frame and return the ports it goes to."""
        if not sender or len(frame) < 14:
            return []
        self.ports.add(sender)
        dst, src = frame[0:6], frame[6:12]
        if not src[0] & 1:
            self.fdb[src] = sender
        if not dst[0] & 1 and dst in self.fdb:
            out = self.fdb[dst]
            return [] if out == sender else [out]
        return [p for p in self.ports if p != sender]

    def serve(self, wakeup: int | None = None) -> None:
        """Forward frames until a signal handler raises.

        The loop never blocks inside ``recvfrom``: a signal that arrives just
        before a blocking call would not interrupt it, and Python runs its
        handler only between bytecodes, so the switch would sleep through a
        SIGTERM. It drains the socket without waiting, then waits in ``poll``
        on the socket and ``wakeup`` (the fd :func:`signal.set_wakeup_fd`
        writes to), which a signal makes readable whenever it arrives.
        """
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        if wakeup is not None:
            poller.register(wakeup, select.POLLIN)
        while True:
            try:
                frame, sender = self.sock.recvfrom(MAX_FRAME, socket.MSG_DONTWAIT)
            except BlockingIOError:
                poller.poll()
                continue
            for port in self.handle(frame, sender):
                self.send(frame, port)

    def send(self, frame: bytes, port: str) -> None:
        """Forward one frame without ever waiting: a guest that stops reading
        (paused in gdb, stopped) fills its socket's queue, and its frames are
        dropped, as a switch port's would be, while the others flow on."""
        try:
            self.sock.sendto(frame, socket.MSG_DONTWAIT, port)
        except (FileNotFoundError, ConnectionRefusedError):
            self._forget(port)
        except OSError:
            pass  # BlockingIOError (a full queue) and the like: the frame is dropped

    def _forget(self, port: str) -> None:
        self.ports.discard(port)
        for mac in [m for m, p in self.fdb.items() if p == port]:
            del self.fdb[mac]


def become(user: str) -> None:
    """Drop to ``UID:GID`` (no supplementary groups); nothing to do when already that user."""
    uid, gid = (int(x) for x in user.split(":"))
    if (os.geteuid(), os.getegid()) == (uid, gid):
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def main(argv: list[str]) -> int:
    """``SWITCH_SOCKET [--user UID:GID] [--lab RUN_DIR]``: ``--user`` drops root before
    binding; ``--lab`` only names the lab's run directory, so that ``down`` finds
    the switch by it even when its pid was never recorded."""
    parser = argparse.ArgumentParser(prog="python -m labctl.net.switch")
    parser.add_argument("socket")
    parser.add_argument("--user", metavar="UID:GID")
    parser.add_argument("--lab", metavar="RUN_DIR")
    args = parser.parse_args(argv)
    if args.user:
        become(args.user)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    # a SIGTERM between the bind and the try below would leave the socket behind: it waits until then
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    sw = Switch(args.socket)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        sw.serve(wake_r)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            os.unlink(args.socket)
        except FileNotFoundError:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
