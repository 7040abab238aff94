"""Which files hold a guest kernel's debug info, as labctl prepared them for gdb (:mod:`labctl.kernel`).

* the kernel: ``vmlinux.debug`` of the prepared kernel (Debian's ``-dbg``
  vmlinux, a tree's own ``vmlinux``, or a loose kernel's ``debug:`` file);
* its modules: the ``.ko`` files under ``debug-modules/`` (Debian's ``-dbg``
  files of the directories the image's recipe keeps, ``kernel/drivers/net``
  and ``kernel/net``; every ``.ko`` of a tree; a loose kernel's modules with DWARF,
  when it has a debug file; the lab's out-of-tree modules under ``extra/``), ``.ko.xz`` unpacked into the cache as for gdb.

A vmcore names its kernel by build ID (VMCOREINFO's ``BUILD-ID``), which is
how :func:`kernel_for_build_id` finds the prepared kernel on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from labctl.debug import ModuleIndex
from labctl.errors import HostError, UsageError
from labctl.kernel import Kernel, KernelStore
from labctl.paths import cache_dir


@dataclass
class DebugFiles:
    """A kernel's debug files: ``vmlinux`` and where its modules' ``.ko`` files are."""

    vmlinux: Path
    module_dirs: tuple[Path, ...] = ()
    kernel: Kernel | None = None  # the prepared kernel they come from (its modules' .ko files at least)
    named: bool = False  # vmlinux is a file the user named (--vmlinux), not the prepared kernel's
    _index: ModuleIndex | None = field(default=None, repr=False, compare=False)

    def module_file(self, name: str) -> Path | None:
        """The ``.ko`` with debug info of module ``name`` (``-`` and ``_`` alike), or None."""
        if self._index is None:
            self._index = ModuleIndex(list(self.module_dirs), cache_dir() / "gdb" / "ko")
        return self._index.find(name)


def missing_hint(kernel: Kernel) -> str:
    """What gives ``kernel`` its debug info, by where it came from."""
    kind = kernel.source.get("kind")
    if kind == "debian":
        return (f"labctl extracts it from Debian's linux-image-{kernel.release}-dbg when it prepares the kernel: "
                "'labctl kernel prune' (with no lab up on it) and 'labctl up' prepare it again")
    if kind == "tree":
        return ("build the tree with DWARF (CONFIG_DEBUG_INFO_DWARF5=y, not _REDUCED; "
                "'labctl kernel config LAB' prints what a lab needs)")
    return "give the lab's kernel its debug file: kernel: {image: ..., debug: VMLINUX}"


def for_kernel(kernel: Kernel) -> DebugFiles:
    """The debug files of a prepared kernel.

    :raise HostError: when it has no vmlinux with debug info (exit 3; the hint says what gives it one).
    """
    if not kernel.vmlinux_debug.is_file():
        raise HostError(f"kernel {kernel.name} has no vmlinux with debug info ({kernel.vmlinux_debug})",
                         hint=missing_hint(kernel))
    return DebugFiles(kernel.vmlinux_debug, (kernel.debug_modules,), kernel)


def kernel_for_build_id(build_id: str, kernels: Sequence[Kernel] | None = None) -> Kernel | None:
    """The prepared kernel on this machine whose build ID is ``build_id`` (None when there is none)."""
    if not build_id:
        return None
    for k in kernels if kernels is not None else KernelStore().list():
        if str(k.manifest.get("build_id") or "").lower() == build_id.lower():
            return k
    return None


def for_vmcore(build_id: str, release: str, vmlinux: Path | None = None,
               modules: Path | None = None) -> DebugFiles:
    """The debug files for a vmcore of kernel ``build_id``: ``vmlinux`` (and ``modules``) when
    given, else the prepared kernel of that build ID.

    :raise UsageError: when ``vmlinux`` is not a file. :raise HostError: when neither is there
        (the hint names ``--vmlinux``).
    """
    kernel = kernel_for_build_id(build_id)
    dirs = tuple(d for d in (modules, kernel.debug_modules if kernel else None) if d is not None)
    if vmlinux is not None:
        if not vmlinux.is_file():
            raise UsageError(f"{vmlinux} is not a file")
        return DebugFiles(vmlinux, dirs, kernel, named=True)
    if kernel is None:
        raise HostError(f"no kernel prepared on this machine has build ID {build_id or '?'} "
                         f"(release {release or '?'})",
                         hint="name its vmlinux with debug info: --vmlinux PATH (and --modules DIR for its .ko files)")
    return for_kernel(kernel)
