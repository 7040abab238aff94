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
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.lab.checker import Checker, describe, join
from labctl.lab.trust import TRUST_ENV, untrusted_reason
from labctl.lab.yamlpos import YamlMap, YamlSeq

SHARE_KEYS = ("host", "mount", "writable")
MAX_SHARES = 8
MOUNT = re.compile(r"/[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*")
MOUNT_RULE = "an absolute guest path of letters, digits and . _ + - (no spaces, no '..')"
# Where a share would hide what the guest (or labctl in it) needs.
RESERVED = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/root", "/run", "/sbin", "/sys", "/usr",
            "/var/lib/labctl")


@dataclass(frozen=True)
class Share:
    """One host directory shared into a guest."""

    host: Path  # absolute, resolved
    mount: str  # absolute guest path
    writable: bool = False
    line: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"host": str(self.host), "mount": self.mount, "writable": self.writable}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Share:
        return cls(Path(str(d["host"])), str(d["mount"]), bool(d.get("writable")))

    def describe(self) -> str:
        return f"{self.mount} ← {self.host} ({'read-write' if self.writable else 'read-only'})"


def tag(index: int) -> str:
    """The 9p mount tag of a guest's ``index``-th share (what the guest mounts by)."""
    return f"labctl{index}"


def mount_problem(mount: str) -> str | None:
    """Why ``mount`` cannot be a share's mount point, or None."""
    if not MOUNT.fullmatch(mount) or any(p in (".", "..") for p in mount.split("/")):
        return f"mount point {mount!r}: use {MOUNT_RULE}"
    for r in RESERVED:
        if mount == r or mount.startswith(r + "/") or r.startswith(mount + "/"):
            return f"mount point {mount} would hide {r}, which the guest needs"
    return None


def host_problem(host: Path, trusted: tuple[Path, ...]) -> str | None:
    """Why ``host`` (absolute, resolved) cannot be shared, or None."""
    if not host.is_dir():
        return f"host directory {host} does not exist" if not host.exists() else f"{host} is not a directory"
    if "," in str(host):
        return f"host directory {host}: QEMU cannot share a path with a comma"
    why = untrusted_reason(host, trusted)
    if why is not None:
        return (f"host directory {host} is not trusted (the guest reads it, and writes it when writable): {why}; "
                f"pass --trust-dir {shlex.quote(str(host))} (or {TRUST_ENV}) if you trust it")
    return None


def resolve_host(text: str, base: Path) -> Path:
    """A share's host path as written: ``~`` expanded, relative to ``base``, resolved."""
    return (base / os.path.expanduser(text)).resolve()


def parse_shares(check: Checker, body: YamlMap, path: str, base: Path,
                 trusted: tuple[Path, ...] = ()) -> tuple[Share, ...]:
    """A guest's ``shares`` (see the module's docstring), each problem at its line."""
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
    for i in range(len(value)):
        at, line = f"{where}[{i}]", value.item_line(i)
        m = check.mapping(value[i], line, at, allow_null=False)
        if m is None:
            continue
        check.keys(m, at, SHARE_KEYS, ("host", "mount"))
        host, mount = check.string(m, "host", at, required=True), check.string(m, "mount", at, required=True)
        writable = m.get("writable", False)
        if not isinstance(writable, bool):
            check.add(m.value_line("writable"), join(at, "writable"), f"expected true or false, got {describe(writable)}")
            continue
        if not host or not mount:
            continue
        resolved = resolve_host(host, base)
        why = host_problem(resolved, trusted)
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
    why = host_problem(resolved, trusted) or mount_problem(mount)
    if why is not None:
        raise ValueError(f"--share {text}: {why}")
    return guest, Share(resolved, mount, mode == "rw")
