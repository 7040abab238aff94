"""A running guest's physical memory, read from its QEMU process while the guest runs.

QEMU keeps guest RAM in one block of its own address space (``pc.ram``).
Its monitor says where each range of guest physical addresses lives in that
block (``info mtree -f``: below 4 GiB, and above it for guests larger than
the PCI hole allows) and at which host address (``gpa2hva``); the bytes are
then read from ``/proc/<qemu pid>/mem``, which needs no pause and no help
from the guest::

    ranges = ram_ranges(mtree_text)                  # [RamRange(0, 0xc0000, 'pc.ram', 0), ...]
    with GuestMemory.open(pid, is_qemu, mapped) as mem:   # mapped: ranges with their host addresses
        mem.read(0x1ef24000, 4132)

Both monitor commands go through the guest's backend (the qemu backend's
QMP socket, or libvirt's monitor passthrough), one short exchange each; no
monitor connection is held while memory is read. The process is pinned by
a descriptor of its ``/proc/<pid>`` directory: its command line is checked
and ``mem`` opened through it, so a pid reused meanwhile is never read.
Reads are bounded by the ranges (nothing outside guest RAM is touched).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from labctl.errors import DebugError, HostError

# "  0000000000100000-000000001fffffff (prio 0, ram): pc.ram @0000000000100000"
_MTREE_LINE = re.compile(r"\s*([0-9a-f]{16})-([0-9a-f]{16}) \(prio -?\d+, (ram|rom)\): (\S+)(?: @([0-9a-f]{16}))?\s*")
_GPA2HVA = re.compile(r"Host virtual address for 0x[0-9a-f]+ \((\S+)\) is (0x[0-9a-f]+)")
MAX_READ = 64 << 20  # one read of guest memory (drgn asks for pages, at most a few MiB)


@dataclass(frozen=True)
class RamRange:
    """Guest physical addresses ``[gpa, gpa + size)``, at ``offset`` in QEMU's RAM block ``block``."""

    gpa: int
    size: int
    block: str
    offset: int

    @property
    def end(self) -> int:
        return self.gpa + self.size


@dataclass(frozen=True)
class Mapped:
    """A :class:`RamRange` with the host address of its first byte in QEMU's process."""

    range: RamRange
    hva: int


def _memory_view(text: str) -> list[str]:
    """The lines of ``info mtree -f``'s flat view that address space ``memory`` uses."""
    views: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("FlatView #"):
            views.append([])
        elif views:
            views[-1].append(line)
    return next((v for v in views if any(ln.strip() == 'AS "memory", root: system' for ln in v)), [])


def ram_ranges(mtree: str) -> list[RamRange]:
    """Guest RAM as ``info mtree -f`` shows it: the ranges of the RAM block that guest physical
    address 0 is in (``pc.ram``), in address order, neighbours merged. Other blocks (the
    BIOS, option ROMs) and devices are left out.

    :raise DebugError: when the text shows no guest RAM.
    """
    found = []
    for line in _memory_view(mtree):
        m = _MTREE_LINE.fullmatch(line)
        if m is None:
            continue
        start, last = int(m.group(1), 16), int(m.group(2), 16)
        found.append(RamRange(start, last - start + 1, m.group(4), int(m.group(5) or "0", 16)))
    ram = [r for r in found if r.gpa == 0]
    if not ram:
        raise DebugError("QEMU's memory map shows no guest RAM at address 0 (info mtree -f)")
    block = ram[0].block
    merged: list[RamRange] = []
    for r in sorted((r for r in found if r.block == block), key=lambda r: r.gpa):
        prev = merged[-1] if merged else None
        if prev is not None and prev.end == r.gpa and prev.offset + prev.size == r.offset:
            merged[-1] = RamRange(prev.gpa, prev.size + r.size, block, prev.offset)
        else:
            merged.append(r)
    return merged


def parse_gpa2hva(text: str, block: str) -> int:
    """The host address in ``gpa2hva``'s answer, which must name RAM block ``block``.

    :raise DebugError: for any other answer (the address is not RAM).
    """
    m = _GPA2HVA.search(text)
    if m is None or m.group(1) != block:
        raise DebugError(f"QEMU's gpa2hva gave no address in {block}: {text.strip()[:120]!r}")
    return int(m.group(2), 16)


def map_ranges(hmp: Callable[[str], str]) -> list[Mapped]:
    """Guest RAM with host addresses, asked of QEMU's monitor through ``hmp`` (one human monitor
    command line in, its answer out): ``info mtree -f`` once, then ``gpa2hva`` per range.

    :raise DebugError: when the monitor's answers are not understood.
    :raise MachineError: when the monitor cannot be reached (from ``hmp``).
    """
    return [Mapped(r, parse_gpa2hva(hmp(f"gpa2hva {r.gpa:#x}"), r.block)) for r in ram_ranges(hmp("info mtree -f"))]


class GuestMemory:
    """Reads guest physical memory from QEMU's ``/proc/PID/mem`` (see the module's docstring)."""

    def __init__(self, mem_fd: int, proc_fd: int, mapped: list[Mapped]) -> None:
        self._fd = mem_fd
        self._proc = proc_fd  # the process's /proc directory: tells whether it is still there
        self.mapped = sorted(mapped, key=lambda m: m.range.gpa)

    @classmethod
    def open(cls, pid: int, is_qemu: Callable[[list[str]], bool], mapped: list[Mapped]) -> GuestMemory:
        """The memory of process ``pid``, once ``is_qemu(its argv)`` says it is the guest's QEMU.

        :raise DebugError: when the process is gone or is not that QEMU.
        :raise HostError: when this user may not read its memory.
        """
        try:
            dir_fd = os.open(f"/proc/{int(pid)}", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise DebugError(f"the guest's QEMU (pid {pid}) is not running") from exc
        ok = False
        try:
            if not is_qemu(_argv(dir_fd)):
                raise DebugError(f"process {pid} is not the guest's QEMU any more",
                                 hint="the guest was stopped or restarted: see 'labctl status'")
            try:
                fd = os.open("mem", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
            except PermissionError as exc:
                raise HostError(f"this user may not read the memory of the guest's QEMU (pid {pid}): {exc.strerror}",
                                hint=_permission_hint()) from exc
            except OSError as exc:
                raise DebugError(f"cannot open /proc/{pid}/mem: {exc.strerror}") from exc
            ok = True
            return cls(fd, dir_fd, mapped)
        finally:
            if not ok:
                os.close(dir_fd)

    def close(self) -> None:
        for fd in (self._fd, self._proc):
            if fd >= 0:
                os.close(fd)
        self._fd = self._proc = -1

    def alive(self) -> bool:
        """Whether the QEMU process is still there."""
        try:
            os.close(os.open("stat", os.O_RDONLY, dir_fd=self._proc))
            return True
        except OSError:
            return False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def size(self) -> int:
        """Bytes of guest RAM."""
        return sum(m.range.size for m in self.mapped)

    def _host_address(self, gpa: int, size: int) -> int:
        for m in self.mapped:
            if m.range.gpa <= gpa and gpa + size <= m.range.end:
                return m.hva + (gpa - m.range.gpa)
        raise DebugError(f"guest physical {gpa:#x}+{size:#x} is not guest RAM")

    def read(self, gpa: int, size: int) -> bytes:
        """``size`` bytes of guest physical memory at ``gpa``, inside one RAM range.

        :raise DebugError: outside guest RAM, beyond :data:`MAX_READ`, or when QEMU's memory cannot be read.
        """
        if not 0 <= size <= MAX_READ:
            raise DebugError(f"refusing to read {size} bytes of guest memory at once")
        hva = self._host_address(gpa, size)
        try:
            data = os.pread(self._fd, size, hva)
        except OSError as exc:
            raise DebugError("the guest's QEMU has exited" if not self.alive()
                             else f"cannot read guest memory at {gpa:#x}: {exc.strerror}") from exc
        if len(data) != size:
            raise DebugError("the guest's QEMU has exited" if not self.alive()
                             else f"short read of guest memory at {gpa:#x} ({len(data)} of {size} bytes)")
        return data

    def segments(self) -> Iterator[tuple[int, int]]:
        """Each RAM range as (guest physical address, size)."""
        for m in self.mapped:
            yield m.range.gpa, m.range.size


YAMA = "/proc/sys/kernel/yama/ptrace_scope"


def _permission_hint() -> str:
    """Why reading another process's memory is refused here, and what to do instead."""
    try:
        scope = int(Path(YAMA).read_text().strip())
    except (OSError, ValueError):
        scope = 0
    why = (f"this host's kernel.yama.ptrace_scope is {scope}: only root may read another process's memory"
           if scope >= 1 else "QEMU runs as another user (libvirt's)")
    return (f"{why}; run labctl as root, or take a vmcore with 'labctl dump' (qemu backend) and open it "
            "with 'labctl drgn --core'")


def _argv(dir_fd: int) -> list[str]:
    """The command line of the process whose ``/proc`` directory ``dir_fd`` is ([] when unreadable)."""
    with contextlib.suppress(OSError):
        fd = os.open("cmdline", os.O_RDONLY, dir_fd=dir_fd)
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        return [a.decode(errors="replace") for a in data.split(b"\0") if a]
    return []

