"""libvirt URIs as lab files name them: parsed, checked, and what they imply.

Only the forms labctl can drive are accepted:

* local: ``qemu:///system`` (also ``qemu+unix:///system``) - guests on this
  machine, with their files in labctl's run directory;
* remote: ``qemu+ssh://[user@]host[:port]/system[?keyfile=...&no_verify=1]`` -
  guests on another machine, reached over the same SSH account.

The query is read exactly as libvirt reads it (``virURIParseParams`` in its
``src/util/viruri.c``): parameters are separated by ``&`` or, where no ``&``
follows, by ``;``; names and values are percent-decoded, ``+`` stays a
``+``. Every parameter must be on :data:`PARAMS`, once: libvirt's remote
driver runs a local program for ``command=``, ``netcat=`` (and the ``ext``
transport), connects where ``socket=`` says and reads certificates where
``pkipath=`` says, so a URI that names any of them is refused, however it
is spelt. A ``;`` anywhere in the query is refused too, so labctl's reading
and libvirt's can never differ. The whole URI must be plain RFC 3986
characters (no spaces, control characters or fragment), which Python's and
libxml2's parsers read alike.

Pure functions: nothing here connects anywhere.
"""

from __future__ import annotations

import getpass
import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field

__all__ = ["LAB_PARAMS", "PARAMS", "LibvirtUri", "SshHop", "libvirt_params", "parse_uri",
           "valid_address", "with_no_verify"]

LOCAL_SCHEMES = ("qemu", "qemu+unix")
REMOTE_SCHEMES = ("qemu+ssh",)
_HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
_TRUE = ("1", "yes", "true")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
PARAMS = ("keyfile", "no_verify")
"""The only URI parameters labctl accepts; a lab file may use ``keyfile`` alone
(``no_verify`` comes from ``--no-verify-host-keys`` or the user's own $LABCTL_LIBVIRT_URI)."""
LAB_PARAMS = ("keyfile",)
"""The URI parameters a lab file may use (``parse_uri(text, lab=True)``)."""
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*(?=:)")
_NETLOC = re.compile(r"(?:(?P<user>[^@/]*)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^@:/\[\]]*)(?::(?P<port>[0-9]{1,5}))?")


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


def libvirt_params(query: str) -> list[tuple[str, str]]:
    """The parameters of a raw URI query, as libvirt's ``virURIParseParams`` reads them.

    The next separator is the next ``&``, else (none left) the next ``;``; an empty
    section is skipped; a section without ``=`` is a name with an empty value; one
    starting with ``=`` is ignored (``=`` alone is an empty name); names and values are
    percent-decoded (``+`` stays ``+``). Decoding is to bytes read as Latin-1, so every
    byte libvirt would see (a NUL, a control character) is there to be refused.
    """
    out: list[tuple[str, str]] = []
    rest = query
    while rest:
        amp = rest.find("&")
        end = amp if amp >= 0 else rest.find(";")
        end = len(rest) if end < 0 else end
        section, rest = rest[:end], rest[end + 1:]
        if not section:
            continue
        name, eq, value = section.partition("=")
        if eq and not name and value:
            continue  # "=value": libvirt ignores it
        out.append((_unescape(name), _unescape(value)))
    return out


def _unescape(text: str) -> str:
    return urllib.parse.unquote_to_bytes(text).decode("latin-1")


def parse_uri(text: str, *, lab: bool = False) -> LibvirtUri:
    """Parse and check a libvirt URI; with ``lab``, as a lab file may give it
    (parameters: :data:`LAB_PARAMS` only).

    :raise ValueError: with a user-facing message when labctl cannot use it.
    """
    if not isinstance(text, str) or not _URI_CHARS.fullmatch(text):
        raise ValueError(f"invalid libvirt URI {text!r} (only RFC 3986 characters: no spaces, control "
                         "characters or bare '%')")
    if "#" in text:
        raise ValueError(f"libvirt URI '{text}' has a fragment ('#'), which labctl does not pass on")
    scheme_m = _SCHEME.match(text)
    scheme = scheme_m.group(0) if scheme_m else ""
    if scheme not in LOCAL_SCHEMES + REMOTE_SCHEMES:
        # qemu+ext runs a local program (command=); tls, tcp, libssh... are not labctl's either.
        raise ValueError(f"unsupported libvirt URI '{text}' (use qemu:///system or qemu+ssh://[user@]host/system)")
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"invalid libvirt URI '{text}' ({exc})") from None
    if scheme in LOCAL_SCHEMES and parts.netloc:
        raise ValueError(f"libvirt URI '{text}' names a host without SSH "
                         "(use qemu+ssh://[user@]host/system for a remote host)")
    if scheme in REMOTE_SCHEMES and not parts.hostname:
        raise ValueError(f"libvirt URI '{text}' needs a host name (qemu+ssh://[user@]host/system)")
    netloc = _NETLOC.fullmatch(parts.netloc)
    if parts.netloc and netloc is None:
        raise ValueError(f"invalid libvirt URI '{text}' (expected [user@]host[:port])")
    if parts.hostname and not (_HOSTNAME.fullmatch(parts.hostname) or _is_ip(parts.hostname)):
        raise ValueError(f"libvirt URI '{text}' has an invalid host name '{parts.hostname}'")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"libvirt URI '{text}' has an invalid port {port}")
    if parts.path not in ("/system", "/session"):
        raise ValueError(f"libvirt URI '{text}' must end in /system or /session")
    if parts.username is not None and (parts.password is not None or not _USER.fullmatch(parts.username)):
        user = parts.netloc.rpartition("@")[0]
        raise ValueError(f"libvirt URI '{text}' has an invalid user name '{user}'")
    pairs = libvirt_params(parts.query)
    names = [name for name, _ in pairs]
    if lab and "no_verify" in names:
        raise ValueError("a lab file cannot switch off host key checks (no_verify); "
                         "pass --no-verify-host-keys to labctl up/run if you mean it")
    allowed = LAB_PARAMS if lab else PARAMS
    unsafe = sorted(set(names) - set(allowed))
    if unsafe:
        # libvirt obeys command=, socket=, netcat=... (a local program run as its ssh): never from a lab.
        shown = ", ".join(repr(n) if not n.isprintable() or not n else n for n in unsafe)
        raise ValueError(f"libvirt URI '{text}' has parameters labctl does not pass on: {shown} "
                         f"(allowed{' in a lab file' if lab else ''}: {', '.join(allowed)})")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"libvirt URI '{text}' names {', '.join(repeated)} more than once")
    if ";" in parts.query:
        raise ValueError(f"libvirt URI '{text}' has a ';' in its query (libvirt reads it as a separator "
                         "too): use '&' between parameters")
    params = dict(pairs)
    if any(not c.isprintable() for value in params.values() for c in value):
        raise ValueError(f"libvirt URI '{text}' has control characters in a parameter")
    if "keyfile" in params and not params["keyfile"].startswith("/"):
        raise ValueError(f"libvirt URI '{text}': keyfile must be an absolute path")
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
