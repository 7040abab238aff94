"""drgn on a guest's kernel, ready to use: live on a running guest, or on a vmcore.

Live (the guest keeps running)::

    with open_live(state, "a") as k:       # SSH: where VMCOREINFO is; QMP: the RAM map; /proc/PID/mem
        k.prog["init_net"].loopback_dev.name
        k.timings                          # {"ssh": .., "monitor": .., "debug_info": ..}

A vmcore (``labctl dump``'s, or any kdump/ELF vmcore with VMCOREINFO)::

    with open_core(Path("a.vmcore")) as k: # debug info: the prepared kernel of its build ID, or vmlinux=
        ...
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import labctl.inspect.debuginfo as debuginfo
import labctl.inspect.vmcoreinfo as vmcoreinfo
from labctl.errors import GuestError, HostError
from labctl.inspect.memory import GuestMemory, map_ranges
from labctl.inspect.program import (
    DebugReport,
    check_build_id,
    core_program,
    core_vmcoreinfo,
    live_program,
    load_debug_info,
)
from labctl.inspect.target import GuestTarget, LabState, guest_target

if TYPE_CHECKING:
    import drgn


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

    def facts(self) -> dict[str, Any]:
        """What ``labctl drgn --json`` says about the session."""
        return {"where": self.where, "live": self.live, "release": self.release, "build_id": self.build_id,
                "debug_info": self.debug.to_dict(), "seconds": {k: round(v, 3) for k, v in self.timings.items()}}


def read_note_location(target: GuestTarget, timeout: float = 20.0) -> tuple[int, int]:
    """Where the guest's VMCOREINFO note is (``/sys/kernel/vmcoreinfo``, over SSH).

    :raise GuestError: when the guest cannot be reached over SSH.
    :raise HostError: when its kernel has no such file (exit 3). :raise DebugError: when it says something else.
    """
    from labctl.ssh import Session

    with Session(target.endpoint) as s:
        res = s.run(f"cat {vmcoreinfo.SYSFS}", timeout=timeout)
    if res.status != 0:
        raise HostError(f"guest {target.guest}'s kernel has no {vmcoreinfo.SYSFS}",
                         hint="its kernel needs CONFIG_KEXEC=y (VMCOREINFO comes with kexec's crash core)")
    return vmcoreinfo.parse_sysfs(res.stdout[:256].decode("ascii", "replace"))


@contextlib.contextmanager
def open_live(state: LabState, guest: str) -> Iterator[KernelView]:
    """drgn on ``guest``'s running kernel, its memory read from its QEMU while it runs.

    :raise LabStateError: no such guest. :raise HostError: it runs where its memory cannot be read,
        its kernel has no debug info or no VMCOREINFO, or drgn is missing (exit 3).
    :raise GuestError: no SSH to the guest (where its note is).
    :raise DebugError: a kernel that is not the one prepared, or memory drgn cannot make sense of.
    :raise MachineError: its QEMU's monitor failed.
    """
    t0 = time.monotonic()
    target = guest_target(state, guest)
    files = debuginfo.for_kernel(target.kernel)
    try:
        address, size = read_note_location(target)
    except GuestError as exc:
        raise GuestError(exc.message, hint=f"no SSH to guest {guest}, so its VMCOREINFO cannot be found: take a "
                                           "vmcore with 'labctl dump' and open it with 'labctl drgn --core'") from exc
    t1 = time.monotonic()
    mapped = map_ranges(target.hmp)
    t2 = time.monotonic()
    with GuestMemory.open(target.qemu_pid(), target.is_qemu, mapped) as memory:
        note = vmcoreinfo.parse_note(memory.read(address, size))
        check_build_id(note, files)
        prog = live_program(memory, note)
        debug = load_debug_info(prog, files)
        yield KernelView(prog, vmcoreinfo.release(note), vmcoreinfo.build_id(note), debug, True,
                     f"guest {guest} of lab {state.lab}", target,
                     {"ssh": t1 - t0, "monitor": t2 - t1, "debug_info": debug.seconds,
                      "total": time.monotonic() - t0})


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
