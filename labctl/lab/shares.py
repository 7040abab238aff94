"""A guest's ``shares``: host directories the guest sees, served by QEMU's virtio-9p.

::

    guests:
      a:
        shares:
          - {host: ./build, mount: /mnt/build}               # read-only (the default)
          - {host: ~/results, mount: /mnt/out, writable: true}

``host`` is a directory on this machine: ``~`` is expanded, a relative path
starts at the lab file's directory. It must be yours (or root's), as every
host path a lab file names (:mod:`labctl.lab.trust`), because the guest reads
it, and writes into it when ``writable``. ``mount`` is where the guest sees it.
On the command line, ``--share GUEST:HOST:MOUNT[:rw]`` adds one for one run.

Where a share may never be (:func:`place_problem`, whoever runs labctl and
whatever ``--trust-dir`` says): the host's root, a system directory (``/etc``,
``/usr``, ``/var``, ``/lib*``... or anything in one), a directory that holds
other users' files (``/home``, ``/tmp``, ``/mnt``, ``/media`` themselves),
another user's home (or anything in it, or above it), the invoking user's
whole home, and labctl's own cache or state directory (in, or above). A lab
file owned by another user (not root) names only directories that user owns
and can read (:func:`labctl.lab.trust.unreadable_reason`): it cannot show
the guest what only the invoking user may see.

A writable share's ``host`` is where its results go, never what the guest
sees: each ``up`` exports a new empty directory made inside it
(:mod:`labctl.up.mounts`), so the guest can change no file it did not create
through that share in that lab.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from labctl.errors import LabctlError
from labctl.lab.checker import Checker, describe, join
from labctl.lab.trust import TRUST_ENV, owner_reason, remote_reason, untrusted_reason
from labctl.lab.yamlpos import YamlMap, YamlSeq

SHARE_KEYS = ("host", "mount", "writable")
MAX_SHARES = 8
MOUNT = re.compile(r"/[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*")
MOUNT_RULE = "an absolute guest path of letters, digits and . _ + - (no spaces, no '..')"
# Where a share would hide what the guest (or labctl in it) needs.
RESERVED = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys", "/usr",
            "/var/lib/labctl")
# The system's own top-level directories (and every /lib*): a share is none of them and in none.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/opt", "/proc", "/run", "/sbin", "/snap", "/srv", "/sys", "/usr",
               "/var")
# Directories that hold other users' files: a share may be inside one, never be (or hold) one.
COMMON_DIRS = ("/", "/home", "/media", "/mnt", "/tmp")


class ShareRecord(TypedDict):
    """:meth:`Share.to_dict`: a share in a lab's recorded state (``host`` absolute)."""

    host: str
    mount: str
    writable: bool


@dataclass(frozen=True)
class Share:
    """One host directory shared into a guest."""

    host: Path  # absolute, resolved
    mount: str  # absolute guest path
    writable: bool = False
    line: int = 0

    def to_dict(self) -> ShareRecord:
        return {"host": str(self.host), "mount": self.mount, "writable": self.writable}

    @classmethod
    def from_dict(cls, d: ShareRecord) -> Share:
        return cls(Path(str(d["host"])), str(d["mount"]), bool(d.get("writable")))

    def describe(self, exported: Path | None = None) -> str:
        """``MOUNT ← HOST (mode)``; ``exported``: the directory it exports, when not ``host``."""
        return f"{self.mount} ← {exported or self.host} ({'read-write' if self.writable else 'read-only'})"


def tag(index: int) -> str:
    """The 9p mount tag of a guest's ``index``-th share (what the guest mounts by)."""
    return f"labctl{index}"


def export_link(index: int) -> str:
    """The name, in the guest's run directory, of the link to the directory a writable
    ``index``-th share exports in this up (made by :func:`labctl.up.mounts.make_directories`)."""
    return f"share{index}"


def mount_problem(mount: str) -> str | None:
    """Why ``mount`` cannot be a share's mount point, or None."""
    if not MOUNT.fullmatch(mount) or any(p in (".", "..") for p in mount.split("/")):
        return f"mount point {mount!r}: use {MOUNT_RULE}"
    for r in RESERVED:
        if mount == r or mount.startswith(r + "/") or r.startswith(mount + "/"):
            return f"mount point {mount} would hide {r}, which the guest needs"
    return None


def _within(path: Path, top: Path) -> bool:
    return path == top or top in path.parents


def place_problem(path: Path, home: Path | None, homes: dict[Path, str], own: dict[Path, str]) -> str | None:
    """Why ``path`` (absolute, resolved) may never be a share's host directory, or None.

    ``home``: the invoking user's home; ``homes``: every other user's home and whose it is;
    ``own``: labctl's own directories and what each is (its cache, its state).
    """
    if path == Path("/"):
        return "it is the host's root directory"
    for top in map(Path, COMMON_DIRS):
        if _within(top, path):
            return f"it {'is' if path == top else 'holds'} {top}, which holds other users' files"
    first = path.parts[1]
    if f"/{first}" in SYSTEM_DIRS or first.startswith("lib"):
        return f"it {'is' if len(path.parts) == 2 else 'is in'} the system directory /{first}"
    for d, name in sorted(homes.items()):
        if _within(path, d) or _within(d, path):
            where = "is" if path == d else "is in" if d in path.parents else "holds"
            return f"it {where} the home directory of {name} ({d})"
    if home is not None and path == home:
        return "it is your whole home directory (your keys are in it): share a directory inside it"
    for d, what in sorted(own.items()):
        if _within(path, d) or _within(d, path):
            where = "is" if path == d else "is in" if d in path.parents else "holds"
            return f"it {where} labctl's {what} ({d})"
    return None


def _homes(me: int) -> tuple[Path | None, dict[Path, str]]:
    """The invoking user's home, and every other user's home (not ``/``) and name."""
    try:
        mine: Path | None = Path(os.path.realpath(pwd.getpwuid(me).pw_dir))
    except KeyError:
        mine = None
    others: dict[Path, str] = {}
    for e in pwd.getpwall():
        if e.pw_uid == me or not e.pw_dir.startswith("/"):
            continue
        d = Path(os.path.realpath(e.pw_dir))
        if d != Path("/") and d != mine:
            others.setdefault(d, e.pw_name)
    return mine, others


def _labctl_dirs() -> dict[Path, str]:
    from labctl.paths import cache_dir, state_dir

    out: dict[Path, str] = {}
    for what, where in (("cache", cache_dir), ("state directory", state_dir)):
        try:
            out[Path(os.path.realpath(where()))] = what
        except (LabctlError, OSError):
            continue
    return out


def host_problem(host: Path, trusted: tuple[Path, ...], owner: int | None = None,
                 writable: bool = False) -> str | None:
    """Why ``host`` (absolute, resolved) cannot be shared, or None.

    ``owner``: the uid that owns the lab file naming it (None: the invoking user's own choice).
    A ``writable`` share's directory is trusted only as the user's or root's (no ``trusted``):
    labctl makes a directory in it for each up, which no other user may then replace.
    """
    if not host.is_dir():
        return f"host directory {host} does not exist" if not host.exists() else f"{host} is not a directory"
    if "," in str(host):
        return f"host directory {host}: QEMU cannot share a path with a comma"
    me = os.geteuid()
    why = place_problem(host, *_homes(me), _labctl_dirs())
    if why is None and owner is not None and owner not in (me, 0):
        why = owner_reason(host, owner)  # the one rule of labctl.lab.trust, as every path a lab file names
    if why is not None:
        return f"host directory {host} cannot be shared: {why}"
    why = untrusted_reason(host, () if writable else trusted)
    if why is not None and writable:
        return (f"host directory {host} of a writable share is not yours: {why} (labctl makes a new "
                "directory in it for each up, which must stay yours alone)")
    if why is not None:
        return (f"host directory {host} is not trusted (the guest reads it): {why}; "
                f"pass --trust-dir {shlex.quote(str(host))} (or {TRUST_ENV}) if you trust it")
    return None


def resolve_host(text: str, base: Path) -> Path:
    """A share's host path as written: ``~`` expanded, relative to ``base``, resolved."""
    return (base / os.path.expanduser(text)).resolve()


def parse_shares(check: Checker, body: YamlMap, path: str, base: Path,
                 trusted: tuple[Path, ...] = ()) -> tuple[Share, ...]:
    """A guest's ``shares`` (see the module's docstring), each problem at its line (the lab
    file's owner, for the rule of another user's lab file, is ``check.owner``)."""
    value, where = body.get("shares"), join(path, "shares")
    if value is None:
        return ()
    if not isinstance(value, YamlSeq):
        check.add(body.value_line("shares"), where, f"expected a list of shares, got {describe(value)}")
        return ()
    if len(value) > MAX_SHARES:
        check.add(body.value_line("shares"), where, f"{len(value)} shares: at most {MAX_SHARES}")
        return ()
    out: list[Share] = []
    for m, at, line in check.mappings(value, where):
        check.keys(m, at, SHARE_KEYS, ("host", "mount"))
        host, mount = check.string(m, "host", at, required=True), check.string(m, "mount", at, required=True)
        writable = check.boolean(m, "writable", at)
        if writable is None and m.get("writable") is not None:  # reported
            continue
        writable = bool(writable)
        if not host or not mount:
            continue
        resolved = resolve_host(host, base)
        why = remote_reason(resolved, check.remote)
        why = f"host directory {resolved} cannot be shared: {why}" if why else \
            host_problem(resolved, trusted, check.owner, writable)
        if why is not None:
            check.add(m.value_line("host"), join(at, "host"), why)
            continue
        bad = mount_problem(mount)
        if bad is None and any(s.mount == mount for s in out):
            bad = f"mount point {mount} is already another share's"
        if bad is not None:
            check.add(m.value_line("mount"), join(at, "mount"), bad)
            continue
        out.append(Share(resolved, mount, writable, line))
    return tuple(out)


def parse_option(text: str, base: Path, trusted: tuple[Path, ...] = ()) -> tuple[str, Share]:
    """``--share GUEST:HOST:MOUNT[:rw|:ro]`` as (guest, share).

    :raise ValueError: with what is wrong.
    """
    parts = text.split(":")
    mode = "ro"
    if len(parts) == 4 and parts[3] in ("rw", "ro"):
        mode = parts.pop()
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"--share {text}: expected GUEST:HOST:MOUNT, optionally :rw")
    guest, host, mount = parts
    resolved = resolve_host(host, base)
    why = host_problem(resolved, trusted, writable=mode == "rw") or mount_problem(mount)
    if why is not None:
        raise ValueError(f"--share {text}: {why}")
    return guest, Share(resolved, mount, mode == "rw")
