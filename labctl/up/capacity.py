"""Will the host hold the guests? Checked before anything starts, instead of letting the OOM killer decide.

Each guest is counted at what it will hold, plus room to grow (measured:
README, "Instances"):

* a guest that boots takes most of its memory while booting: its whole
  memory plus what its QEMU needs itself;
* a guest restored from a post-boot snapshot holds only the pages the
  snapshot carries: the newest snapshot of that lab's guest tells how many,
  plus QEMU's own, plus a quarter of its memory to grow into (never more
  than its whole memory);
* a guest already up holds what it holds now (its QEMU's resident memory):
  a quarter of its memory, at most what it has left, is kept for it to grow.

The guests asked for must fit in what the host has available
(``MemAvailable``) less what the guests already up are kept to grow into.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import labctl.up.snapshots as snapshots  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import get_backend
from labctl.errors import HostError, LabStateError
from labctl.lab import Lab
from labctl.state import LabState, up_labs

# What one idle TCG guest's QEMU uses beyond the guest's own memory: translated code,
# device models, slirp (measured by benchmarks/training.py: PSS minus the guest RAM touched).
QEMU_OVERHEAD_MIB = 64
GROWTH = 0.25  # of a guest's memory, kept for a restored or running guest to grow into
MIB = 1 << 20


@dataclass(frozen=True)
class Estimate:
    guests: int
    need_mib: int  # the new guests at what they will hold (see the module), plus QEMU's own
    available_mib: int  # MemAvailable
    reserved_mib: int  # what guests already up are kept to grow into
    running: int  # guests already up
    restored: int = 0  # of the new guests, those counted at their snapshot's pages

    @property
    def fits(self) -> bool:
        return self.need_mib <= self.available_mib - self.reserved_mib

    def sentence(self) -> str:
        def gib(mib: float) -> str:
            return f"{mib / 1024:.1f} GiB"

        left = self.available_mib - self.reserved_mib
        how = (f"{self.restored} of them restored from snapshots, counted at the snapshot's pages plus "
               f"{GROWTH:.0%} of their memory to grow into; the others at their whole memory; all plus about "
               f"{QEMU_OVERHEAD_MIB} MiB of QEMU each" if self.restored else
               f"their memory plus about {QEMU_OVERHEAD_MIB} MiB of QEMU each")
        return (f"{self.guests} guests need up to {gib(self.need_mib)} ({how}), "
                f"but this host has {gib(max(0, left))} to give: "
                f"{gib(self.available_mib)} available, of which {gib(self.reserved_mib)} is kept for the "
                f"{self.running} guests already up to grow into")


def meminfo(path: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """/proc/meminfo in KiB."""
    out = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0])
    return out


def _rss_mib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError):
        pass
    return 0


def snapshot_pages_mib() -> dict[tuple[str, str], int]:
    """(lab, guest) -> MiB of guest pages its newest complete snapshot carries."""
    newest: dict[tuple[str, str], tuple[str, int]] = {}
    for snap in snapshots.list_all():
        meta = snap.meta
        size, taken = meta.get("state_bytes"), str(meta.get("created_at", ""))
        if not isinstance(size, int) or not snap.complete():
            continue
        at = (str(meta.get("lab")), str(meta.get("guest")))
        if at not in newest or taken > newest[at][0]:
            newest[at] = (taken, size)
    return {at: -(-size // MIB) for at, (_, size) in newest.items()}


def guest_need_mib(memory: int, snapshot_mib: int | None) -> int:
    """What a new guest of ``memory`` MiB is counted at (see the module)."""
    if snapshot_mib is None:
        return memory + QEMU_OVERHEAD_MIB
    return min(memory, snapshot_mib + int(GROWTH * memory)) + QEMU_OVERHEAD_MIB


def estimate(labs: Sequence[Lab], meminfo_kib: dict[str, int] | None = None,
             pages: dict[tuple[str, str], int] | None = None) -> Estimate:
    """What ``labs`` need next to the labs that are up (the guests of backends whose guests run here)."""
    info = meminfo_kib if meminfo_kib is not None else meminfo()
    pages = snapshot_pages_mib() if pages is None else pages
    need, count, restored = 0, 0, 0
    for lab in labs:
        if not get_backend(lab.backend).runs_here:
            continue
        for name, g in lab.guests.items():
            snap = pages.get((lab.name, name))
            need += guest_need_mib(g.memory, snap)
            count += 1
            restored += snap is not None
    reserved, running = 0, 0
    for name in up_labs():
        try:
            state = LabState.load(name)
        except LabStateError:
            continue
        if not get_backend(state.backend).runs_here:
            continue
        for guest, rec in state.guests.items():
            memory = int(state.resolved.get("guests", {}).get(guest, {}).get("memory", 0))
            reserved += max(0, min(int(GROWTH * memory), memory + QEMU_OVERHEAD_MIB - _rss_mib(rec.pid)))
            running += 1
    return Estimate(count, need, info.get("MemAvailable", 0) // 1024, reserved, running, restored)


def check_capacity(labs: Sequence[Lab], overcommit: bool = False, meminfo_kib: dict[str, int] | None = None,
                   pages: dict[tuple[str, str], int] | None = None) -> Estimate:
    """Refuse (exit 3) when the host cannot hold the guests, unless ``overcommit``.

    :raise HostError: with the figures.
    """
    est = estimate(labs, meminfo_kib, pages)
    if not est.fits and not overcommit:
        raise HostError(est.sentence(), hint="take labs down, give the guests less memory, or pass --overcommit")
    return est
