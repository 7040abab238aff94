"""Mounting a guest's shares (:mod:`labctl.lab.shares`) once it answers SSH, and the new
directory each writable share exports in one up (:func:`make_directories`).

The virtio-9p devices are on QEMU's command line from the start, but the
guest mounts them only after its post-boot snapshot was taken (or restored):
QEMU refuses to save a guest that has a 9p export mounted. So ``up`` mounts
them over SSH before it says the lab is up, after a cold boot and a warm
restore alike, and so do ``reset`` and checkpoint restores; a checkpoint
save unmounts them around the save.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labctl.endpoint import Endpoint
from labctl.errors import GuestError, HostError
from labctl.lab import Share, export_link, tag
from labctl.paths import checked_dir

MOUNT_TIMEOUT = 60.0
MSIZE = 512 * 1024  # bytes per 9p message: 8 KiB (the default) makes large reads slow


def of(resolved_guest: Mapping[str, Any] | None) -> tuple[Share, ...]:
    """The shares of a guest as a lab's recorded (resolved) state has them (None: no such guest)."""
    return tuple(Share.from_dict(d) for d in (resolved_guest or {}).get("shares") or [])


def make_directories(guest_dir: Path, ident: str, guest: str, shares: Sequence[Share]) -> None:
    """For each writable share: a new empty directory in its host directory,
    ``HOST/IDENT-GUEST-YYYYmmdd-HHMMSS`` (0700), and the link QEMU exports it by
    (``GUEST_DIR/share<i>``). The guest sees only that directory, so what it can change
    on the host is what it created there in this up; reset and checkpoint restores keep it.

    :raise UnsafePath: when a host directory is no longer the user's or root's alone.
    :raise HostError: when no new name is free.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i, share in enumerate(shares):
        if not share.writable:
            continue
        parent = checked_dir(share.host)
        for n in range(1, 100):
            target = parent / (f"{ident}-{guest}-{stamp}" + (f"-{n}" if n > 1 else ""))
            try:
                os.mkdir(target, 0o700)
                break
            except FileExistsError:
                continue
        else:
            raise HostError(f"cannot make a new directory in {parent} for guest {guest}'s share {share.mount}")
        link = guest_dir / export_link(i)
        link.unlink(missing_ok=True)
        os.symlink(target, link)


def directories(guest_dir: Path, shares: Sequence[Share]) -> list[Path]:
    """What each share exports: its host directory, or a writable one's directory of this up."""
    out = []
    for i, share in enumerate(shares):
        try:
            out.append(Path(os.readlink(guest_dir / export_link(i))) if share.writable else share.host)
        except OSError:
            out.append(share.host)
    return out


def mount_script(shares: Sequence[Share]) -> str:
    """Shell commands that mount every share (already mounted ones are left as they are)."""
    lines = ["set -e", "modprobe -q 9pnet_virtio"]
    for i, s in enumerate(shares):
        m = shlex.quote(s.mount)
        opts = f"trans=virtio,version=9p2000.L,msize={MSIZE},{'rw' if s.writable else 'ro'}"
        lines.append(f"mountpoint -q {m} || {{ mkdir -p {m} && mount -t 9p -o {opts} {tag(i)} {m}; }}")
    return "\n".join(lines) + "\n"


def umount_script(shares: Sequence[Share]) -> str:
    return "".join(f"! mountpoint -q {shlex.quote(s.mount)} || umount {shlex.quote(s.mount)}\n"
                   for s in reversed(shares))


def _run(endpoint: Endpoint, guest: str, script: str, what: str) -> None:
    from labctl.ssh import Session  # paramiko: when a lab has shares to mount (reset loads none otherwise)

    with Session(endpoint) as s:
        res = s.run(script, timeout=MOUNT_TIMEOUT)
    if res.status != 0:
        why = (res.stderr or res.stdout).decode(errors="replace").strip().splitlines()
        raise GuestError(f"guest {guest} could not {what} its shares: "
                         f"{why[-1] if why else f'exit status {res.status}'}")


def mount(endpoint: Endpoint, guest: str, shares: Sequence[Share]) -> None:
    """Mount ``shares`` in the guest.

    :raise GuestError: with the guest's reason (no 9p module, mount refused...).
    """
    if shares:
        _run(endpoint, guest, mount_script(shares), "mount")


def umount(endpoint: Endpoint, guest: str, shares: Sequence[Share]) -> None:
    """Unmount ``shares`` (before a checkpoint save).

    :raise GuestError: when one is busy.
    """
    if shares:
        _run(endpoint, guest, umount_script(shares), "unmount")
