"""Where a guest's sshd is and the OpenSSH command lines that reach it (an interactive ``labctl ssh``,
the kept connection of ``exec`` and ``cp``: :mod:`labctl.mux`, a remote guest's hop). A leaf of
the standard library: paramiko's sessions are :mod:`labctl.ssh`'s, which re-exports these.

Imports never: paramiko, labctl.lab (its SshHop only for the type checker), the backends
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from labctl.errors import GuestError
from labctl.muxclient import command_line as command_line  # noqa: PLC0414 - labctl.ssh's and exec's name

if TYPE_CHECKING:
    from labctl.lab import SshHop


#: The key exchanges OpenSSH is offered for a guest. Its default since 9.0, sntrup761x25519, costs
#: about 0.14 s of each login under TCG (0.46 s against 0.32 s, measured): this X25519 one, the
#: default before it, is as strong but for the post-quantum half, which a loopback connection to a
#: lab guest has no use for (a remote guest's hop to its libvirt host keeps the user's defaults).
GUEST_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"


@dataclass(frozen=True)
class Endpoint:
    """Where and how to reach one guest's sshd."""

    guest: str
    port: int
    key: Path
    known_hosts: Path
    host: str = "127.0.0.1"
    user: str = "root"
    via: SshHop | None = None  # the libvirt host whose loopback the guest's port is on

    def openssh_argv(self, extra: Sequence[str] = ()) -> list[str]:
        """An ``ssh`` command line reaching this guest (for interactive use)."""
        return ["ssh", "-i", str(self.key), "-p", str(self.port),
                "-o", f"UserKnownHostsFile={config_quote(str(self.known_hosts))}", "-o", "StrictHostKeyChecking=yes",
                "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "-o", f"KexAlgorithms={GUEST_KEX}",
                *self._proxy_options(), *extra,
                f"{self.user}@{self.host}"]

    def _proxy_options(self) -> list[str]:
        """``-o ProxyCommand=ssh ... -W`` through the libvirt host, for a remote guest."""
        if self.via is None:
            return []
        return ["-o", f"ProxyCommand={shlex.join(hop_stdio_argv(self.via, self.host, self.port))}"]


def config_quote(value: str) -> str:
    """A value for an OpenSSH ``-o KEY=VALUE`` option: double-quoted, so a path with spaces stays one word.

    :raise GuestError: for a value OpenSSH cannot quote (a double quote or a newline in it).
    """
    if '"' in value or "\n" in value:
        raise GuestError(f"OpenSSH cannot be given the path {value!r}")
    return f'"{value}"'


def _hop_login(hop: SshHop) -> list[str]:
    """``ssh`` options that log in to the libvirt host ``hop`` as its URI does."""
    return ["ssh", "-p", str(hop.port), "-l", hop.user, "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            *(["-i", hop.keyfile] if hop.keyfile else []),
            *(["-o", "StrictHostKeyChecking=no"] if hop.no_verify else [])]


def hop_stdio_argv(hop: SshHop, host: str, port: int) -> list[str]:
    """An OpenSSH command line that logs in to the libvirt host ``hop`` (as its
    URI does) and connects its stdin/stdout to ``host:port`` as seen from there."""
    return [*_hop_login(hop), "-W", f"{host}:{port}", "--", hop.host]


def hop_forward_argv(hop: SshHop, local_socket: str, remote_socket: str) -> list[str]:
    """An OpenSSH command line forwarding the unix socket ``local_socket`` here
    (made 0600 by ssh) to ``remote_socket`` on the libvirt host ``hop``, until killed."""
    return [*_hop_login(hop), "-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
            "-L", f"{local_socket}:{remote_socket}", "--", hop.host]


@dataclass(frozen=True)
class Result:
    status: int
    stdout: bytes
    stderr: bytes
    duration: float


class Remote(Protocol):
    """Commands on one guest, as ``labctl cp`` (:mod:`labctl.steps.transfer`) uses them: a paramiko
    :class:`labctl.ssh.Session`, or the kept connection's :class:`labctl.mux.MuxSession`."""

    ep: Endpoint

    def run(self, command: str, timeout: float = ...) -> Result: ...

    def stream(self, command: str, timeout: float) -> AbstractContextManager[BinaryIO]: ...

    def feed(self, command: str, timeout: float) -> AbstractContextManager[BinaryIO]: ...
