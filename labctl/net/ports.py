"""Ports on 127.0.0.1 that labctl picks for QEMU to bind moments later."""

from __future__ import annotations

import socket

_HANDED_OUT: set[tuple[int, int]] = set()


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    """A TCP (or with ``SOCK_DGRAM`` UDP) port free on 127.0.0.1 right now.

    Never one this process handed out before: the ports picked for one lab
    must differ although none of them is bound yet. Another program can
    still take one before QEMU binds it; ``up`` retries a guest then.
    """
    while True:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if (kind, port) not in _HANDED_OUT:
            _HANDED_OUT.add((kind, port))
            return port
