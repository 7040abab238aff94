"""A vmcore of a running guest, on demand: QMP ``dump-guest-memory`` into a private file.

Formats: ``kdump`` (default: zlib-compressed pages, zero pages left out; about
30 MiB for a 512 MiB guest just booted), reassembled from QEMU's flattened
stream and its header completed (:mod:`.kdump`), which drgn and Debian's
``crash`` both open; ``elf``, as large as the guest's RAM. The guest's QEMU
runs with ``-device vmcoreinfo``, so the vmcore carries the kernel's
VMCOREINFO (release, build ID, page tables) and each CPU's registers.

QEMU pauses the guest while it writes (about 2 s for 512 MiB under TCG) and
resumes it after. The guest's memory is as secret as the guest: the file is
created 0600 under an unguessable name in a directory that must be the
user's own and writable by nobody else (a sticky one like ``/tmp`` is fine),
and renamed into place only when complete; QEMU's compressed stream goes to
an anonymous memory file, never to disk. Qemu backend only: a libvirt domain
has no vmcoreinfo device and its QEMU writes as libvirt's user (exit 3).

Given a lab state and a guest (what a run's crash handling calls)::

    core = take_guest_vmcore(state, "a", bundle / "a.vmcore")
    core.size, core.paused_seconds, core.release
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import labctl.inspect.kdump as kdump  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.inspect.vmcoreinfo as vmcoreinfo  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import LabState, dump_guest_memory
from labctl.errors import DebugError, HostError, LabctlError
from labctl.inspect.guest_target import GuestTarget, guest_target
from labctl.paths import atomic_file

FORMATS = {"kdump": "kdump-zlib", "elf": "elf"}
MODE = 0o600


class VmcoreFacts(TypedDict):
    """:meth:`Vmcore.to_dict` (``labctl vmcore --json``)."""

    path: str
    format: str
    size: int
    seconds: float
    paused_seconds: float
    release: str
    build_id: str
    guest: str
    lab: str


@dataclass
class Vmcore:
    """A vmcore written: where, how big, how long it took and how long QEMU paused the guest."""

    path: Path
    format: str
    size: int
    seconds: float
    paused_seconds: float  # the dump-guest-memory call: QEMU pauses the guest throughout
    release: str
    build_id: str
    guest: str = ""
    lab: str = ""

    def to_dict(self) -> VmcoreFacts:
        return {"path": str(self.path), "format": self.format, "size": self.size, "seconds": round(self.seconds, 3),
                "paused_seconds": round(self.paused_seconds, 3), "release": self.release, "build_id": self.build_id,
                "guest": self.guest, "lab": self.lab}


def take_guest_vmcore(state: LabState, guest: str, dest: Path, fmt: str = "kdump",
                      timeout: float = 600.0) -> Vmcore:
    """A vmcore of ``guest`` of a lab that is up, written to ``dest`` (0600, atomically).

    :raise LabStateError: no such guest. :raise HostError: not a qemu-backend guest, or ``dest``'s
        directory is unsafe (:class:`UnsafePath`). :raise MachineError: QEMU could not dump it.
    :raise DebugError: its dump could not be made readable.
    """
    return take_vmcore(guest_target(state, guest), dest, fmt, timeout)


def _ram_bytes(target: GuestTarget) -> int:
    summary = target.qmp("query-memory-size-summary")
    return int(summary.get("base-memory", 0)) if isinstance(summary, dict) else 0


def take_vmcore(target: GuestTarget, dest: Path, fmt: str = "kdump", timeout: float = 600.0) -> Vmcore:
    """A vmcore of the running guest ``target``, written to ``dest`` (see the module's docstring)."""
    if fmt not in FORMATS:
        raise DebugError(f"unknown vmcore format {fmt!r}", hint=f"one of: {', '.join(FORMATS)}")
    if target.domain is not None:
        raise HostError(f"guest {target.guest} runs on libvirt: labctl dump works on the qemu backend only "
                        "(a libvirt domain has no vmcoreinfo device)",
                        hint="read it live with 'labctl drgn' (as root), or run the lab on the qemu backend")
    t0 = time.monotonic()
    limit = 2 * _ram_bytes(target) + (256 << 20)
    try:
        with atomic_file(dest, MODE) as f:
            fd = f.fileno()
            if fmt == "elf":
                paused = _dump(target, fd, "elf", timeout)
                note = _elf_note(fd)
            else:
                paused = _dump_kdump(target, fd, limit, timeout)
                with _reopened(fd) as rfd:  # atomic_file's is write-only
                    note = kdump.note_of(rfd)
                _complete_header(fd, note)
            os.fsync(fd)
            size = os.fstat(fd).st_size
    except OSError as exc:
        raise LabctlError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    release, build_id = vmcoreinfo.release(note), vmcoreinfo.build_id(note)
    return Vmcore(dest, fmt, size, time.monotonic() - t0, paused, release, build_id, target.guest, target.lab)


@contextlib.contextmanager
def _reopened(fd: int) -> Iterator[int]:
    """A read-only descriptor of the file ``fd`` is open on (the same file, through /proc/self/fd)."""
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield rfd
    finally:
        os.close(rfd)


def _dump(target: GuestTarget, fd: int, qemu_format: str, timeout: float) -> float:
    t = time.monotonic()
    dump_guest_memory(target.record.qmp, fd, qemu_format, timeout)
    return time.monotonic() - t


def _dump_kdump(target: GuestTarget, fd: int, limit: int, timeout: float) -> float:
    """QEMU's flattened kdump-zlib stream into an anonymous memory file, reassembled into ``fd``."""
    flat = os.memfd_create("labctl-vmcore", os.MFD_CLOEXEC)
    try:
        paused = _dump(target, flat, FORMATS["kdump"], timeout)
        os.lseek(flat, 0, os.SEEK_SET)
        kdump.reassemble(flat, fd, limit)
    finally:
        os.close(flat)
    return paused


def _elf_note(fd: int) -> bytes:
    """The VMCOREINFO text of the ELF vmcore ``fd``, as drgn reads it (b'' when it cannot)."""
    try:
        import drgn

        prog = drgn.Program()
        prog.set_core_dump(f"/proc/self/fd/{fd}")
        note = bytes(prog["VMCOREINFO"].string_())
        vmcoreinfo.check_text(note)
        return note
    except Exception:  # noqa: BLE001 - no drgn, or no note: the vmcore is written all the same
        return b""


def _complete_header(fd: int, note: bytes) -> None:
    """The kdump header's utsname: a sane one first (libkdumpfile needs it to open the file at all),
    then the kernel's own from its memory when drgn can read it."""
    kdump.set_utsname(fd, kdump.placeholder_utsname(vmcoreinfo.release(note)))
    address = kdump.uts_address(note)
    if address is None:
        return
    try:
        import drgn

        prog = drgn.Program()
        prog.set_core_dump(f"/proc/self/fd/{fd}")
        uts = prog.read(address, kdump.UTS_FIELD * kdump.UTS_FIELDS)
    except Exception:  # noqa: BLE001 - no drgn, or memory it cannot read: the placeholder stays
        return
    kdump.set_utsname(fd, uts)
