"""Whether a guest restored from its snapshot answers: its sshd's identification line on its SSH port.

The agent installed the lab's key and the guest's own host key and waited for sshd to listen with
them (:func:`labctl.up.warm.adopt`), so a whole handshake (key exchange and login, 0.1-0.3 s of a TCG
guest's time just after a restore, and paramiko's import in labctl) would prove nothing more than that
the port reaches sshd: warm ``up``, ``reset`` and ``checkpoint restore`` wait for the banner. The first
``exec`` logs in (and keeps that connection, :mod:`labctl.mux`).
"""

from __future__ import annotations

import socket
import time

from labctl.endpoint import Endpoint
from labctl.errors import GuestError


def wait_banner(ep: Endpoint, timeout: float) -> None:
    """Until the guest's sshd sends its identification line (``SSH-2.0-...``) on ``ep``'s port; a
    guest reached through another host (``via``) gets the whole handshake instead.

    :raise GuestError: when no banner (or, through ``via``, no login) comes within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    if ep.via is not None:
        _login(ep, deadline)
        return
    last = ""
    while True:
        try:
            with socket.create_connection((ep.host, ep.port), timeout=max(0.5, min(5.0, deadline - time.monotonic()))) as s:
                got = b""
                while b"\n" not in got and len(got) < 256:
                    chunk = s.recv(256)
                    if not chunk:
                        break
                    got += chunk
            if got.startswith(b"SSH-2.0-"):
                return
            last = f"no SSH banner ({len(got)} bytes)"
        except OSError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise GuestError(f"guest {ep.guest}: sshd did not answer on {ep.host}:{ep.port} after its restore: {last}")
        time.sleep(0.02)


def _login(ep: Endpoint, deadline: float) -> None:
    from labctl.ssh import Session  # paramiko: a guest through another host

    while True:
        try:
            with Session(ep, timeout=min(10.0, max(1.0, deadline - time.monotonic()))):
                return
        except GuestError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
