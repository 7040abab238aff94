"""Mounting a guest's shares (:mod:`labctl.lab.shares`) once it answers SSH.

The virtio-9p devices are on QEMU's command line from the start, but the
guest mounts them only after its post-boot snapshot was taken (or restored):
QEMU refuses to save a guest that has a 9p export mounted. So ``up`` mounts
them over SSH before it says the lab is up, after a cold boot and a warm
restore alike, and so do ``reset`` and checkpoint restores; a checkpoint
save unmounts them around the save.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from labctl.errors import GuestError
from labctl.lab import Share, tag
from labctl.ssh import Endpoint, Session

MOUNT_TIMEOUT = 60.0
MSIZE = 512 * 1024  # bytes per 9p message: 8 KiB (the default) makes large reads slow


def of(resolved_guest: dict[str, Any]) -> tuple[Share, ...]:
    """The shares of a guest as a lab's recorded (resolved) state has them."""
    return tuple(Share.from_dict(d) for d in resolved_guest.get("shares") or [])


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
