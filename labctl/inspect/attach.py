"""drgn on a guest's kernel, ready to use: live on a running guest, or on a vmcore.

Live (the guest keeps running)::

    with open_live(state, "a") as k:       # QMP: the RAM map; /proc/PID/mem; SSH: where VMCOREINFO is
        k.prog["init_net"].loopback_dev.name
        k.timings                          # {"monitor": .., "note": .., "debug_info": .., "total": ..}

The note's location is asked of the guest once per QEMU process (``cat
/sys/kernel/vmcoreinfo`` over SSH, about 0.8 s) and kept in the guest's private
directory; later sessions read the note there, checked as ever, and ask again
when it is not there any more.

A vmcore (``labctl dump``'s, or any kdump/ELF vmcore with VMCOREINFO)::

    with open_core(Path("a.vmcore")) as k: # debug info: the prepared kernel of its build ID, or vmlinux=
        ...
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

import labctl.inspect.debuginfo as debuginfo  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.inspect.vmcoreinfo as vmcoreinfo  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import LabState
from labctl.errors import DebugError, GuestError, HostError, LabctlError
from labctl.inspect.guest_target import GuestTarget, guest_target
from labctl.inspect.memory import GuestMemory, map_ranges
from labctl.inspect.program import (
    DebugInfoRecord,
    DebugReport,
    check_build_id,
    core_program,
    core_vmcoreinfo,
    live_program,
    load_debug_info,
)
from labctl.paths import atomic_write

if TYPE_CHECKING:
    import drgn


class SessionFacts(TypedDict):
    """:meth:`KernelView.facts`: where the session is, its kernel, its debug info, how long each part took."""

    where: str
    live: bool
    release: str
    build_id: str
    debug_info: DebugInfoRecord
    seconds: dict[str, float]
    vmcoreinfo_from: NotRequired[str]  # live: ssh or cache


@dataclass
class KernelView:
    """A drgn program of one guest kernel and how it was made."""

    prog: drgn.Program
    release: str
    build_id: str
    debug: DebugReport
    live: bool
    where: str  # "guest a of lab x" or the vmcore's path
    target: GuestTarget | None = None  # the running guest (live)
    timings: dict[str, float] = field(default_factory=dict)
    note_from: str = ""  # live: where the VMCOREINFO note's location came from (ssh, cache)

    def facts(self) -> SessionFacts:
        """What ``labctl drgn --json`` says about the session."""
        out: SessionFacts = {"where": self.where, "live": self.live, "release": self.release,
                             "build_id": self.build_id, "debug_info": self.debug.to_dict(),
                             "seconds": {k: round(v, 3) for k, v in self.timings.items()}}
        if self.note_from:
            out["vmcoreinfo_from"] = self.note_from
        return out


NOTE_CACHE = "vmcoreinfo.json"  # in the guest's private directory: where its note was, for which QEMU


def read_note_location(target: GuestTarget, timeout: float = 20.0) -> tuple[int, int]:
    """Where the guest's VMCOREINFO note is (``/sys/kernel/vmcoreinfo``, over SSH).

    :raise GuestError: when the guest cannot be reached over SSH.
    :raise HostError: when its kernel has no such file (exit 3). :raise DebugError: when it says something else.
    """
    from labctl.ssh import Session

    try:
        with Session(target.endpoint) as s:
            res = s.run(f"cat {vmcoreinfo.SYSFS}", timeout=timeout)
    except GuestError as exc:
        raise GuestError(exc.message, hint=f"no SSH to guest {target.guest}, so its VMCOREINFO cannot be found: "
                                           "take a vmcore with 'labctl dump' and open it with 'labctl drgn "
                                           "--core'") from exc
    if res.status != 0:
        raise HostError(f"guest {target.guest}'s kernel has no {vmcoreinfo.SYSFS}",
                        hint="its kernel needs CONFIG_KEXEC=y (VMCOREINFO comes with kexec's crash core)")
    return vmcoreinfo.parse_sysfs(res.stdout[:256].decode("ascii", "replace"))


def _cached_location(target: GuestTarget, pid: int) -> tuple[int, int] | None:
    """Where the note was the last time, if that was this same QEMU process (bounds checked again)."""
    try:
        d = json.loads((target.private_dir / NOTE_CACHE).read_text())
        if not isinstance(d, dict) or d.get("pid") != pid:
            return None
        return vmcoreinfo.parse_sysfs(f"{int(d['address']):#x} {int(d['size']):x}")
    except (OSError, ValueError, KeyError, TypeError, LabctlError):
        return None


def find_note(target: GuestTarget, memory: GuestMemory, pid: int) -> tuple[bytes, str]:
    """The guest's VMCOREINFO note and where its location came from: ``cache`` (this QEMU's note
    was found there before, and a note is still there) or ``ssh`` (asked of the guest, then kept
    in its private directory). The note is read from memory and checked either way.

    :raise GuestError: no SSH to the guest. :raise HostError: no VMCOREINFO in its kernel.
    :raise DebugError: no note where the guest says.
    """
    cached = _cached_location(target, pid)
    if cached is not None:
        try:
            return vmcoreinfo.parse_note(memory.read(*cached)), "cache"
        except DebugError:
            pass  # the kernel's memory changed (kexec): ask the guest again
    address, size = read_note_location(target)
    note = vmcoreinfo.parse_note(memory.read(address, size))
    with contextlib.suppress(OSError, LabctlError):
        atomic_write(target.private_dir / NOTE_CACHE,
                     json.dumps({"pid": pid, "address": address, "size": size}) + "\n", 0o600)
    return note, "ssh"


@contextlib.contextmanager
def open_live(state: LabState, guest: str) -> Iterator[KernelView]:
    """drgn on ``guest``'s running kernel, its memory read from its QEMU while it runs.

    :raise LabStateError: no such guest. :raise HostError: it runs where its memory cannot be read,
        its kernel has no debug info or no VMCOREINFO, or drgn is missing (exit 3).
    :raise GuestError: no SSH to the guest (where its note is, the first time).
    :raise DebugError: a kernel that is not the one prepared, or memory drgn cannot make sense of.
    :raise MachineError: its QEMU's monitor failed.
    """
    t0 = time.monotonic()
    target = guest_target(state, guest)
    files = debuginfo.for_kernel(target.kernel)
    mapped = map_ranges(target.hmp)
    t1 = time.monotonic()
    pid = target.qemu_pid()
    with GuestMemory.open(pid, target.is_qemu, mapped) as memory:
        note, source = find_note(target, memory, pid)
        t2 = time.monotonic()
        check_build_id(note, files)
        prog = live_program(memory, note)
        debug = load_debug_info(prog, files)
        view = KernelView(prog, vmcoreinfo.release(note), vmcoreinfo.build_id(note), debug, True,
                          f"guest {guest} of lab {state.lab}", target,
                          {"monitor": t1 - t0, "note": t2 - t1, "debug_info": debug.seconds,
                           "total": time.monotonic() - t0})
        view.note_from = source
        yield view


@contextlib.contextmanager
def open_core(path: Path, vmlinux: Path | None = None, modules: Path | None = None) -> Iterator[KernelView]:
    """drgn on the vmcore at ``path``, with the debug info of its kernel: ``vmlinux`` (and the
    ``.ko`` files under ``modules``) when given, else the kernel labctl prepared with its build ID.

    :raise UsageError: when it cannot be read, or ``vmlinux`` is not its kernel's (exit 2).
    :raise HostError: when its debug info is not found, or drgn is missing (exit 3).
    """
    t0 = time.monotonic()
    prog = core_program(path)
    note = core_vmcoreinfo(prog)
    files = debuginfo.for_vmcore(vmcoreinfo.build_id(note), vmcoreinfo.release(note), vmlinux, modules)
    debug = load_debug_info(prog, files)
    yield KernelView(prog, vmcoreinfo.release(note), vmcoreinfo.build_id(note), debug, False, str(path),
                 timings={"debug_info": debug.seconds, "total": time.monotonic() - t0})
