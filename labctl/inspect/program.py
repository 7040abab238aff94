"""drgn programs of a guest kernel: live (its memory read from QEMU as it runs) or from a vmcore,
with the kernel's and its loaded modules' debug info.

drgn is imported here and in :mod:`.drgn_session` and :mod:`.summary` only, inside
functions (:func:`require_drgn`), so the rest of labctl never needs it.
drgn's exceptions are mapped to :class:`DebugError` here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import labctl.inspect.vmcoreinfo as vmci
from labctl.errors import DebugError, HostError, UsageError
from labctl.inspect.debuginfo import DebugFiles, missing_hint
from labctl.inspect.memory import GuestMemory

if TYPE_CHECKING:
    import drgn

INSTALL_HINT = "install it into labctl's Python: pip install 'drgn==0.3.0' (setup.sh does)"


def require_drgn() -> Any:
    """The drgn module.

    :raise HostError: when it is not installed (exit status 3).
    """
    try:
        import drgn
    except ImportError as exc:
        raise HostError(f"drgn is not installed ({exc})", hint=INSTALL_HINT) from exc
    return drgn


class DebugInfoRecord(TypedDict):
    """:meth:`DebugReport.to_dict` (``labctl drgn --json``'s and a vmcore summary's ``debug_info``)."""

    vmlinux: str
    modules: list[str]
    missing: list[str]
    seconds: float


@dataclass
class DebugReport:
    """Whose debug info was loaded: the kernel, the modules that have it, those that have none."""

    vmlinux: str
    modules: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> DebugInfoRecord:
        return {"vmlinux": self.vmlinux, "modules": self.modules, "missing": self.missing,
                "seconds": round(self.seconds, 3)}


def live_program(memory: GuestMemory, note: bytes) -> drgn.Program:
    """A drgn program of the running kernel whose physical memory ``memory`` reads and whose
    VMCOREINFO is ``note`` (marked live: drgn does not cache what it reads).

    :raise DebugError: when drgn refuses the note.
    """
    d = require_drgn()

    def read(address: int, count: int, offset: int, physical: bool) -> bytes:
        try:
            return memory.read(address, count)
        except DebugError as exc:
            raise d.FaultError(exc.message, address) from exc

    prog = d.Program(d.Platform(d.Architecture.X86_64, d.PlatformFlags.IS_64_BIT | d.PlatformFlags.IS_LITTLE_ENDIAN),
                     vmcoreinfo=note)
    _no_downloads(prog)
    for gpa, size in memory.segments():
        prog.add_memory_segment(gpa, size, read, True)
    try:
        prog.set_linux_kernel_custom(note, True)
    except Exception as exc:  # libdrgn raises plain Exception
        raise DebugError(f"drgn cannot read the guest's kernel: {exc}") from exc
    return prog


def core_program(path: Path) -> drgn.Program:
    """A drgn program of the vmcore at ``path`` (kdump or ELF, with its VMCOREINFO).

    :raise UsageError: when it cannot be opened or is not a kernel's vmcore (exit 2).
    """
    d = require_drgn()
    prog = d.Program()
    _no_downloads(prog)
    try:
        prog.set_core_dump(str(path))
    except OSError as exc:
        raise UsageError(f"cannot open {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # libdrgn and libkdumpfile raise plain Exception
        raise UsageError(f"drgn cannot read {path} as a vmcore: {exc}",
                         hint="a vmcore of 'labctl dump' (kdump or ELF with VMCOREINFO)") from exc
    if not prog.flags & d.ProgramFlags.IS_LINUX_KERNEL:
        raise UsageError(f"{path} is not a Linux kernel's vmcore (no VMCOREINFO in it)")
    return prog


def core_vmcoreinfo(prog: drgn.Program) -> bytes:
    """A vmcore's VMCOREINFO text, as drgn found it (b'' when it cannot be read)."""
    try:
        return bytes(prog["VMCOREINFO"].string_())
    except (LookupError, ValueError):
        return b""


def _no_downloads(prog: drgn.Program) -> None:
    """Only the files labctl names: no debuginfod (nothing is downloaded at run time)."""
    try:
        prog.set_enabled_debug_info_finders([n for n in prog.enabled_debug_info_finders() if n != "debuginfod"])
    except (ValueError, LookupError):
        pass


def load_debug_info(prog: drgn.Program, files: DebugFiles) -> DebugReport:
    """Load the kernel's debug info from ``files.vmlinux``, then that of every loaded module
    that has a ``.ko`` in ``files`` (drgn checks each file's build ID against the module's).

    :raise UsageError: when a vmlinux the user named is not the program's kernel (another build ID)
        or has no DWARF. :raise DebugError: when the prepared kernel's is not (the guest runs another).
    """
    d = require_drgn()
    t0 = time.monotonic()
    report = DebugReport(str(files.vmlinux))
    kos: list[str] = []
    try:
        for module, _new in prog.loaded_modules():
            if isinstance(module, d.MainModule):
                _load_main(d, module, files)
            elif module.debug_file_status == d.ModuleFileStatus.WANT:
                ko = files.module_file(module.name)
                if ko is not None:
                    kos.append(str(ko))
        if kos:
            prog.load_debug_info(kos)
    except d.MissingDebugInfoError:
        pass  # the modules without a file are listed below
    except (d.FaultError, ValueError, LookupError) as exc:
        raise DebugError(f"drgn cannot list the kernel's modules: {exc}") from exc
    _module_symbols(d, prog)
    for module in prog.modules():
        if isinstance(module, d.MainModule):
            continue
        have = module.debug_file_status == d.ModuleFileStatus.HAVE
        (report.modules if have else report.missing).append(module.name)
    report.modules.sort()
    report.missing.sort()
    report.seconds = time.monotonic() - t0
    return report


def _module_symbols(d: Any, prog: drgn.Program) -> None:
    """Names for the functions of modules without debug info, from their kallsyms in memory (a
    stack through pvpanic or virtio_blk then names each frame)."""
    try:
        from drgn.helpers.linux.kallsyms import load_module_kallsyms

        prog.register_symbol_finder("labctl_module_kallsyms", load_module_kallsyms(prog), enable_index=-1)
    except (LookupError, ValueError, d.FaultError):
        pass  # the kernel's symbol tables could not be read: frames of such modules show their address


def _load_main(d: Any, module: Any, files: DebugFiles) -> None:
    module.try_file(str(files.vmlinux))
    if module.debug_file_status == d.ModuleFileStatus.HAVE:
        return
    want = module.build_id.hex() if module.build_id else "?"
    message = f"{files.vmlinux} is not the debug file of the kernel being read (build ID {want}), or it has no DWARF"
    if files.named or files.kernel is None:
        raise UsageError(message, hint="name the vmlinux of that build: --vmlinux PATH")
    raise DebugError(message, hint=missing_hint(files.kernel))


def check_build_id(note: bytes, files: DebugFiles) -> None:
    """Refuse a kernel whose VMCOREINFO build ID is not the one labctl prepared (when both are known).

    :raise DebugError: when they differ.
    """
    running = vmci.build_id(note)
    prepared = str((files.kernel.manifest.get("build_id") if files.kernel else "") or "").lower()
    if running and prepared and running != prepared:
        raise DebugError(f"the guest runs kernel {vmci.release(note)} with build ID {running}, "
                         f"not {prepared} that labctl prepared for it",
                         hint="take the lab down and up again")
