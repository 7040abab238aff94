"""Will the host hold the guests? Checked before anything starts, instead of letting the OOM killer decide.

Each guest is counted at what it will hold, plus room to grow (measured:
docs/training.md, "Instances"):

* a guest that boots takes most of its memory while booting: its whole
  memory plus what its QEMU needs itself;
* a guest restored from a post-boot snapshot is a clone: it maps the
  snapshot's memory file privately (labctl.backends.qemu.clone), so what it
  adds is its QEMU's *anonymous* memory (its own copy-on-write pages, QEMU's
  heap, translated code), as measured on a guest restored from that snapshot
  (one running now, else the figure recorded at the last restore:
  :func:`labctl.up.snapshots.record_clone`), plus an eighth of its memory to
  grow into (never more than a boot); the snapshot's memory file is counted
  once for all the guests restored from it (its page cache copy, at most its
  allocated size). A snapshot no clone was measured of counts its clones as
  QEMU's overhead plus its device state plus a quarter of their memory;
* a guest already up holds what it holds now (its QEMU's anonymous memory):
  a quarter of its memory (an eighth for a clone), at most what it has left,
  is kept for it to grow.

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
GROWTH = 0.25  # of a guest's memory, kept for a booted guest (or an unmeasured clone) to grow into
CLONE_GROWTH = 0.125  # of a clone's memory, kept for it to grow into beyond its measured private memory
MIB = 1 << 20


@dataclass(frozen=True)
class CloneCost:
    """What the guests restored from one snapshot cost: each its own private memory, all together
    the snapshot's memory file once."""

    key: str  # the snapshot's
    private_mib: int  # one clone's anonymous memory as measured (or the unmeasured guess, see ``measured``)
    template_mib: int  # the snapshot's memory file (its allocated size): one page cache copy for them all
    measured: bool = True


@dataclass(frozen=True)
class Estimate:
    guests: int
    need_mib: int  # the new guests at what they will hold (see the module), plus QEMU's own
    available_mib: int  # MemAvailable
    reserved_mib: int  # what guests already up are kept to grow into
    running: int  # guests already up
    restored: int = 0  # of the new guests, those restored from snapshots (counted as clones)
    templates_mib: int = 0  # of ``need_mib``: the snapshots' memory files, once each

    @property
    def fits(self) -> bool:
        return self.need_mib <= self.available_mib - self.reserved_mib

    def sentence(self) -> str:
        def gib(mib: float) -> str:
            return f"{mib / 1024:.1f} GiB"

        left = self.available_mib - self.reserved_mib
        how = (f"{self.restored} of them restored from snapshots, counted at a restored guest's measured private "
               f"memory plus {CLONE_GROWTH:.1%} of their memory to grow into, and {gib(self.templates_mib)} for the "
               f"snapshots' memory files, shared; the others at their whole memory plus about "
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


def _private_mib(pid: int) -> int:
    """The process's anonymous memory in MiB (0 when it cannot be read): see :func:`snapshots.private_kib`."""
    return snapshots.private_kib(pid) // 1024


def _running_clones() -> dict[str, int]:
    """Snapshot key -> the largest anonymous memory (MiB) of a guest up now that was restored from it."""
    out: dict[str, int] = {}
    for name in up_labs():
        try:
            state = LabState.load(name)
        except LabStateError:
            continue
        for guest, rec in state.guests.items():
            key = state.snapshots.get(guest)
            if key and guest in state.warm and rec.pid:
                out[key] = max(out.get(key, 0), _private_mib(rec.pid))
    return out


def clone_costs(running: dict[str, int] | None = None) -> dict[tuple[str, str], CloneCost]:
    """(lab, guest) -> what a guest restored from its newest complete snapshot costs (see the module)."""
    newest: dict[tuple[str, str], tuple[str, snapshots.Snapshot]] = {}
    for snap in snapshots.list_all():
        meta = snap.meta
        taken = str(meta.get("created_at", ""))
        if not snap.complete():
            continue
        at = (str(meta.get("lab")), str(meta.get("guest")))
        if at not in newest or taken > newest[at][0]:
            newest[at] = (taken, snap)
    running = _running_clones() if running is None else running
    out = {}
    for at, (_, snap) in newest.items():
        try:
            template = -(-snap.memory.stat().st_blocks * 512 // MIB)
        except OSError:
            template = 0
        measured = max(running.get(snap.key, 0), snapshots.recorded_clone_kib(snap) // 1024)
        if measured:
            out[at] = CloneCost(snap.key, measured, template)
        else:
            state = snap.meta.get("state_bytes")
            guess = QEMU_OVERHEAD_MIB + -(-(state if isinstance(state, int) else 0) // MIB)
            out[at] = CloneCost(snap.key, guess, template, measured=False)
    return out


def guest_need_mib(memory: int, clone: CloneCost | None) -> int:
    """What a new guest of ``memory`` MiB is counted at, the snapshot's memory file apart (see the module)."""
    boot = memory + QEMU_OVERHEAD_MIB
    if clone is None:
        return boot
    growth = CLONE_GROWTH if clone.measured else GROWTH
    return min(boot, clone.private_mib + int(growth * memory))


def estimate(labs: Sequence[Lab], meminfo_kib: dict[str, int] | None = None,
             clones: dict[tuple[str, str], CloneCost] | None = None) -> Estimate:
    """What ``labs`` need next to the labs that are up (the guests of backends whose guests run here)."""
    info = meminfo_kib if meminfo_kib is not None else meminfo()
    clones = clone_costs() if clones is None else clones
    need, count, restored = 0, 0, 0
    templates: dict[str, int] = {}
    for lab in labs:
        if not get_backend(lab.backend).runs_here:
            continue
        for name, g in lab.guests.items():
            clone = clones.get((lab.name, name))
            need += guest_need_mib(g.memory, clone)
            count += 1
            if clone is not None:
                restored += 1
                templates[clone.key] = clone.template_mib
    need += sum(templates.values())
    reserved, running = 0, 0
    for name in up_labs():
        try:
            state = LabState.load(name)
        except LabStateError:
            continue
        if not get_backend(state.backend).runs_here:
            continue
        for guest, rec in state.guests.items():
            spec = state.guest_spec(guest)
            memory = int(spec["memory"]) if spec else 0
            growth = CLONE_GROWTH if guest in state.warm else GROWTH
            reserved += reserve_mib(memory, _private_mib(rec.pid), growth)
            running += 1
    return Estimate(count, need, info.get("MemAvailable", 0) // 1024, reserved, running, restored,
                    sum(templates.values()))


def reserve_mib(memory: int, private_mib: int, growth: float) -> int:
    """What a guest up now is kept to grow into: ``growth`` of its memory, at most what it has left."""
    return max(0, min(int(growth * memory), memory + QEMU_OVERHEAD_MIB - private_mib))


def check_capacity(labs: Sequence[Lab], overcommit: bool = False, meminfo_kib: dict[str, int] | None = None,
                   clones: dict[tuple[str, str], CloneCost] | None = None) -> Estimate:
    """Refuse (exit 3) when the host cannot hold the guests, unless ``overcommit``.

    :raise HostError: with the figures.
    """
    est = estimate(labs, meminfo_kib, clones)
    if not est.fits and not overcommit:
        raise HostError(est.sentence(), hint="take labs down, give the guests less memory, or pass --overcommit")
    return est
