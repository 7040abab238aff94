"""libvirt URIs as lab files name them: parsed, checked, and what they imply.

Only the forms labctl can drive are accepted:

* local: ``qemu:///system`` (also ``qemu+unix:///system``) - guests on this
  machine, with their files in labctl's run directory;
* remote: ``qemu+ssh://[user@]host[:port]/system[?keyfile=...&no_verify=1]`` -
  guests on another machine, reached over the same SSH account.

Pure functions: nothing here connects anywhere.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field

__all__ = ["PARAMS", "LibvirtUri", "SshHop", "parse_uri", "valid_address", "with_no_verify"]

LOCAL_SCHEMES = ("qemu", "qemu+unix")
REMOTE_SCHEMES = ("qemu+ssh",)
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_TRUE = ("1", "yes", "true")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
PARAMS = ("keyfile", "no_verify")
"""The only URI parameters labctl accepts; a lab file may use ``keyfile`` alone
(``no_verify`` comes from ``--no-verify-host-keys`` or the user's own $LABCTL_LIBVIRT_URI)."""


@dataclass(frozen=True)
class SshHop:
    """The SSH account of a ``qemu+ssh://`` URI: labctl reaches remote guests through it."""

    host: str
    port: int
    user: str
    keyfile: str | None
    no_verify: bool

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "port": self.port, "user": self.user, "keyfile": self.keyfile,
                "no_verify": self.no_verify}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> SshHop:
        return cls(str(d["host"]), int(str(d["port"])), str(d["user"]),
                   None if d.get("keyfile") is None else str(d["keyfile"]), bool(d.get("no_verify")))


@dataclass(frozen=True)
class LibvirtUri:
    """A parsed libvirt URI that labctl accepts."""

    text: str
    scheme: str
    host: str | None
    port: int | None
    user: str | None
    path: str
    params: dict[str, str] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        """True for ``qemu+ssh://``: the guests' files live on another machine."""
        return self.scheme in REMOTE_SCHEMES

    @property
    def default_address(self) -> str:
        """Where UDP tunnels reach this host: its URI's host name, or 127.0.0.1 when local."""
        return self.host if self.remote and self.host else "127.0.0.1"

    def ssh_hop(self) -> SshHop | None:
        """The SSH account (user, host, port, key) of a remote URI; None for a local one."""
        if not self.remote or not self.host:
            return None
        return SshHop(host=self.host, port=self.port or 22, user=self.user or getpass.getuser(),
                      keyfile=self.params.get("keyfile"),
                      no_verify=self.params.get("no_verify", "0").lower() in _TRUE)


def parse_uri(text: str) -> LibvirtUri:
    """Parse and check a libvirt URI.

    :raise ValueError: with a user-facing message when labctl cannot use it.
    """
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid libvirt URI '{text}' ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in LOCAL_SCHEMES + REMOTE_SCHEMES:
        raise ValueError(f"unsupported libvirt URI '{text}' (use qemu:///system or qemu+ssh://[user@]host/system)")
    if scheme in LOCAL_SCHEMES and parts.netloc:
        raise ValueError(f"libvirt URI '{text}' names a host without SSH "
                         "(use qemu+ssh://[user@]host/system for a remote host)")
    if scheme in REMOTE_SCHEMES and not parts.hostname:
        raise ValueError(f"libvirt URI '{text}' needs a host name (qemu+ssh://[user@]host/system)")
    if parts.hostname and not (_HOSTNAME.fullmatch(parts.hostname) or _is_ip(parts.hostname)):
        raise ValueError(f"libvirt URI '{text}' has an invalid host name '{parts.hostname}'")
    if parts.path not in ("/system", "/session"):
        raise ValueError(f"libvirt URI '{text}' must end in /system or /session")
    params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    unsafe = sorted(set(params) - set(PARAMS))
    if unsafe:
        # libvirt obeys command=, socket=, netcat=... (a local program run as its ssh): never from a lab.
        raise ValueError(f"libvirt URI '{text}' has parameters labctl does not pass on: {', '.join(unsafe)} "
                         f"(allowed: {', '.join(PARAMS)})")
    if parts.username is not None and not _USER.fullmatch(parts.username):
        raise ValueError(f"libvirt URI '{text}' has an invalid user name '{parts.username}'")
    if any(ord(c) < 0x20 for c in params.get("keyfile", "")):
        raise ValueError(f"libvirt URI '{text}' has control characters in its keyfile")
    return LibvirtUri(text, scheme, parts.hostname, port, parts.username, parts.path, params)


def with_no_verify(text: str) -> str:
    """``text`` (a checked ``qemu+ssh://`` URI) with ``no_verify=1``: the user's
    command-line choice not to check the host's key, never a lab file's."""
    parsed = parse_uri(text)
    if not parsed.remote or parsed.params.get("no_verify", "").lower() in _TRUE:
        return text
    return text + ("&" if "?" in text else "?") + "no_verify=1"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def valid_address(text: str) -> bool:
    """True for a unicast IPv4 address or a DNS host name (a UDP tunnel endpoint);
    never a wildcard (0.0.0.0 would listen on every address), broadcast or multicast."""
    try:
        ip = ipaddress.IPv4Address(text)
        return not (ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255")
                    or ip in ipaddress.IPv4Network("0.0.0.0/8"))
    except ValueError:
        return bool(_HOSTNAME.fullmatch(text)) and not text.replace(".", "").isdigit()
