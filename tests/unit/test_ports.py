"""Ports labctl picks on 127.0.0.1 for QEMU."""

from __future__ import annotations

import socket

from labctl.net.ports import free_port


def test_ports_handed_out_never_repeat_and_are_free() -> None:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        ports = [free_port(kind) for _ in range(300)]
        assert len(set(ports)) == len(ports)
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", ports[-1]))  # still free
