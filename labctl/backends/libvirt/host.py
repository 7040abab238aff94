"""What labctl needs on a libvirt host's file system, and which user QEMU runs as there.

QEMU runs as libvirt's own unprivileged user wherever the host allows it
(``libvirt-qemu`` on Debian), so it can reach nothing of labctl's: not the
run directory (root's, 0700), not the image cache. What a guest's QEMU uses
lives on its host, in places labctl creates for it:

* the image and the per-guest disk and fw_cfg files: volumes in the
  ``labctl`` storage pool (:mod:`labctl.backends.libvirt.storage`);
* the gdbstub's socket: in the guest's directory ``RUN_ROOT/<domain>/``;
* the unix sockets of the lab's links and switches (guests on labctl's own
  machine): in the lab's directory ``RUN_ROOT/<lab>.net/``.

Both directories are owned by QEMU's user with mode 0700, so only that user
and root (the lab's owner) reach the control channels inside; ``RUN_ROOT``
itself is root's, 0711 (QEMU may pass through it, nobody may list or write
it). ``.`` is in no lab or guest name, so the two kinds of names never meet.

QEMU's user is what libvirt says: the DAC security model's base label in the
host's capabilities (``+64055:+107``), never a guessed uid.

The same shell commands make and remove these directories on labctl's
machine (run here) and on a remote host (run through its SSH login), so
both paths are one.
"""

from __future__ import annotations

import pwd
import xml.etree.ElementTree as ET
from dataclasses import dataclass

RUN_ROOT = "/var/lib/libvirt/labctl-run"
RUN_ROOT_MODE = "0711"
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes with its NUL

# Make a directory for QEMU's user: RUN_ROOT-like parent (root's, 0711), then
# the directory itself (0700), chowned only once it exists and is empty, in a
# parent QEMU cannot write. "replace" empties a leftover first; "new" refuses
# one (exit 3): it may belong to a lab of another labctl state directory.
MKDIR_SCRIPT = """set -e
parent=$1 dir=$2 owner=$3 how=$4
mkdir -p -- "$parent"
chmod 0711 -- "$parent"
if [ -e "$dir" ] || [ -L "$dir" ]; then
  [ "$how" = replace ] || { echo "$dir already exists" >&2; exit 3; }
  rm -rf -- "$dir"
fi
mkdir -m 0700 -- "$dir"
chown -- "$owner" "$dir"
"""
EXISTS_STATUS = 3


@dataclass(frozen=True)
class QemuUser:
    """The uid and gid a host's libvirt runs QEMU as."""

    uid: int
    gid: int

    @property
    def label(self) -> str:
        """libvirt's DAC label: ``+uid:+gid``."""
        return f"+{self.uid}:+{self.gid}"

    @property
    def owner(self) -> str:
        """``uid:gid`` for chown."""
        return f"{self.uid}:{self.gid}"

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def describe(self, local: bool) -> str:
        """``libvirt-qemu (uid 64055, gid 107)``; the name only when the user is on this machine."""
        name = ""
        if local:
            try:
                name = pwd.getpwuid(self.uid).pw_name + " "
            except KeyError:
                pass
        return f"{name}(uid {self.uid}, gid {self.gid})" if name else f"uid {self.uid}, gid {self.gid}"

    @classmethod
    def from_label(cls, label: str) -> QemuUser:
        """Parse a DAC label ``+uid:+gid`` (or ``uid:gid``).

        :raise ValueError: for a label that is not two numeric ids.
        """
        user, sep, group = label.strip().partition(":")
        if not sep:
            raise ValueError(f"not a DAC label: {label!r}")
        try:
            return cls(int(user.lstrip("+")), int(group.lstrip("+")))
        except ValueError as exc:
            raise ValueError(f"not a numeric DAC label: {label!r}") from exc


def dac_users(capabilities: str) -> dict[str, QemuUser]:
    """domain type (``kvm``, ``qemu``) -> QEMU's user, from a host's capabilities XML.

    Empty when the host has no DAC security model.

    :raise ValueError: for a base label that is not numeric.
    """
    root = ET.fromstring(capabilities)
    for model in root.findall("host/secmodel"):
        if model.findtext("model") == "dac":
            return {b.get("type", ""): QemuUser.from_label(b.text or "") for b in model.findall("baselabel")}
    return {}


def security_models(capabilities: str) -> list[str]:
    """The host's security drivers (``none``, ``dac``, ``apparmor``, ``selinux``)."""
    root = ET.fromstring(capabilities)
    return [m.findtext("model") or "" for m in root.findall("host/secmodel")]


def guest_run_dir(domain: str) -> str:
    """A guest's directory on its host (its gdbstub's socket)."""
    return f"{RUN_ROOT}/{domain}"


def lab_net_dir(lab: str) -> str:
    """The directory of a lab's unix sockets (links, switches) on labctl's machine."""
    return f"{RUN_ROOT}/{lab}.net"


def is_run_dir(path: str) -> bool:
    """True for a directory labctl may remove: one level below ``RUN_ROOT``, no ``..``."""
    parent, _, name = path.rpartition("/")
    return parent == RUN_ROOT and name not in ("", ".", "..")


def mkdir_argv(path: str, user: QemuUser, replace: bool) -> list[str]:
    """The command that makes ``path`` (below ``RUN_ROOT``) owned by QEMU's user, mode 0700."""
    return ["sh", "-c", MKDIR_SCRIPT, "sh", path.rpartition("/")[0], path, user.owner,
            "replace" if replace else "new"]


def rmdir_argv(path: str) -> list[str]:
    """The command that removes ``path`` and what QEMU left in it (never following a link)."""
    return ["rm", "-rf", "--", path]


def too_long(paths: list[str]) -> list[str]:
    """The unix socket paths among ``paths`` that do not fit in ``sun_path``."""
    return [p for p in paths if len(p.encode()) > SUN_PATH_MAX]
