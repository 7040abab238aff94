"""Will the host hold the guests? Checked before anything starts, instead of letting the OOM killer decide.

A guest may come to use all the memory it was given, plus what its QEMU
needs itself (measured: see README, "Capacity"). The guests asked for must
fit in what the host has available (``MemAvailable``) less what the guests
already up may still grow into (their memory less what they use now).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labctl.errors import HostError, LabStateError
from labctl.lab.model import Lab
from labctl.state.runstate import LabState, up_labs

# What one idle TCG guest's QEMU uses beyond the guest's own memory: translated code,
# device models, slirp (measured by benchmarks/training.py: PSS minus the guest RAM touched).
QEMU_OVERHEAD_MIB = 64
MIB = 1 << 20


@dataclass(frozen=True)
class Estimate:
    guests: int
    need_mib: int  # the new guests at their full memory, plus QEMU's own
    available_mib: int  # MemAvailable
    reserved_mib: int  # what guests already up may still grow into
    running: int  # guests already up

    @property
    def fits(self) -> bool:
        return self.need_mib <= self.available_mib - self.reserved_mib

    def sentence(self) -> str:
        def gib(mib: float) -> str:
            return f"{mib / 1024:.1f} GiB"

        left = self.available_mib - self.reserved_mib
        return (f"{self.guests} guests need up to {gib(self.need_mib)} (their memory plus about "
                f"{QEMU_OVERHEAD_MIB} MiB of QEMU each), but this host has {gib(max(0, left))} to give: "
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


def estimate(labs: Sequence[Lab], meminfo_kib: dict[str, int] | None = None) -> Estimate:
    """What ``labs`` need next to the labs that are up (qemu backend guests: they run here)."""
    info = meminfo_kib if meminfo_kib is not None else meminfo()
    need = sum(g.memory + QEMU_OVERHEAD_MIB for lab in labs if lab.backend == "qemu" for g in lab.guests.values())
    count = sum(len(lab.guests) for lab in labs if lab.backend == "qemu")
    reserved, running = 0, 0
    for name in up_labs():
        try:
            state = LabState.load(name)
        except LabStateError:
            continue
        if state.backend != "qemu":
            continue
        for guest, rec in state.guests.items():
            memory = int(state.resolved.get("guests", {}).get(guest, {}).get("memory", 0))
            reserved += max(0, memory + QEMU_OVERHEAD_MIB - _rss_mib(rec.pid))
            running += 1
    return Estimate(count, need, info.get("MemAvailable", 0) // 1024, reserved, running)


def check_capacity(labs: Sequence[Lab], overcommit: bool = False, meminfo_kib: dict[str, int] | None = None) -> Estimate:
    """Refuse (exit 3) when the host cannot hold the guests, unless ``overcommit``.

    :raise HostError: with the figures.
    """
    est = estimate(labs, meminfo_kib)
    if not est.fits and not overcommit:
        raise HostError(est.sentence(), hint="take labs down, give the guests less memory, or pass --overcommit")
    return est
