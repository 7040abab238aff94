"""A guest's RAM as a file, and what makes each restored guest its own (pure argv functions).

Every qemu-backend guest's RAM is ``memory-backend-file`` on ``memory`` in its run directory
(:data:`MEMORY`). A guest that boots maps a fresh file of its own there, ``share=on``: its RAM
*is* that file, so its post-boot snapshot copies it (``labctl.up.snapshots``) and saves only
the device state (migration capability ``x-ignore-shared``: shared RAM is left out of the stream).
A guest restored from a snapshot finds ``memory`` a link to the snapshot's memory file and maps it
``share=off``: a private copy-on-write mapping, so every guest restored from one snapshot reads
the same page cache copy and its own writes stay its own (never the file's, never a sibling's).

Each QEMU start gets a new VM generation ID (``-device vmgenid``): the guest kernel's vmgenid
driver reseeds its random number generator when the ID changes under it, as it does on a restore.
"""

from __future__ import annotations

import re
import uuid

from labctl.backends.base import GUEST_MEMORY as MEMORY
from labctl.backends.base import GuestPlan

RAM_ID = "ram0"  # the memory backend's id: QEMU's name of the RAM block, the same in every guest
_SHARE = re.compile(r"^(memory-backend-file,id=" + RAM_ID + r",.*\bshare=)(on|off)\b")
_VMGENID = re.compile(r"^vmgenid,guid=[^,]*")


def memory_args(plan: GuestPlan) -> list[str]:
    """The guest's RAM on its ``memory`` file: shared (its own) when it boots, private
    copy-on-write when it is restored (``plan.warm``)."""
    path = str(plan.dir / MEMORY).replace(",", ",,")
    share = "off" if plan.warm else "on"
    return ["-object", f"memory-backend-file,id={RAM_ID},size={plan.guest.memory}M,mem-path={path},share={share}",
            "-machine", f"memory-backend={RAM_ID}"]


def vmgenid_args() -> list[str]:
    """The VM generation ID device; its ``guid`` is replaced with a new one at each start (:func:`new_generation`)."""
    return ["-device", "vmgenid,guid=auto"]


def clone_args(plan: GuestPlan) -> list[str]:
    return [*memory_args(plan), *vmgenid_args()]


def shares_memory(argv: list[str]) -> bool | None:
    """Whether ``argv`` maps the guest's memory file shared (None: it has no memory file)."""
    for a in argv:
        m = _SHARE.match(a)
        if m:
            return m[2] == "on"
    return None


def with_share(argv: list[str], share: bool) -> list[str]:
    """``argv`` with its memory file mapped shared (a boot) or private (a restore)."""
    return [_SHARE.sub(lambda m: m[1] + ("on" if share else "off"), a) for a in argv]


def new_generation(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` with a new random VM generation ID, and that ID (None: no vmgenid device)."""
    guid = str(uuid.uuid4())
    out, found = [], False
    for a in argv:
        if _VMGENID.match(a):
            a, found = _VMGENID.sub(f"vmgenid,guid={guid}", a), True
        out.append(a)
    return out, guid if found else None
