"""labctl's exception tree.

::

    LabctlError                 root: short message + optional hint (exit 1)
     +-- LabFileError           problems in a lab file, collected (exit 2)
     +-- UsageError             bad command-line use (exit 2)
     +-- HostError              the host lacks something (binary, KVM, disk)
 |    +-- UnsafePath        a directory labctl would use is another user's or writable by others
     +-- ImageError             building or finding a guest image failed
     +-- ProcessError           a host process failed or timed out
     +-- MachineError           a guest's QEMU failed (start, QMP, died)
     |    +-- PortTaken         a port labctl picked was taken before QEMU bound it
     |    +-- SnapshotBroken    a snapshot's memory file is not as it was saved
     +-- GuestError             a guest misbehaved (never ready, SSH failed)
     +-- LabStateError          lab already up / not up / state unreadable
     +-- TraceError             a tracer could not be set up (kernel facts, probes)
     +-- DebugError             gdb could not attach, load symbols or drive the guest
          +-- MiTimeout         gdb did not answer an MI command in time

Exit status 6 is not an error: a run whose steps failed, or graded checks
that did not all pass (``EXIT_CHECKS_FAILED``); the table says which.

Dependencies' exceptions (paramiko, qemu.qmp, libvirt, pygdbmi) are mapped
into this tree where labctl calls them; only the CLI prints errors and picks
exit codes.
"""

from __future__ import annotations

from typing import NamedTuple

EXIT_CHECKS_FAILED = 6
"""``labctl check`` / ``labctl class check``: some check did not pass (the same status as a failed step)."""


class LabctlError(Exception):
    """Root of labctl's errors: short message + optional hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class Problem(NamedTuple):
    """One problem found in a lab file, pointing at its line (a named tuple: every command imports
    this module, and dataclasses costs 9 ms of a command's start)."""

    file: str  # path as the user gave it
    line: int  # 1-based
    path: str  # data path e.g. "guests.b.nics[0].model" ('' for file-level)
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{self.file}:{self.line}: {where}{self.message}"


class LabFileError(LabctlError):
    """One or more problems in a lab file (exit status 2)."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


class UsageError(LabctlError):
    """The command line asked for something impossible (exit status 2)."""

    exit_code = 2


class HostError(LabctlError):
    """The host is missing a prerequisite (binary, KVM, permissions)."""

    exit_code = 3


class UnsafePath(HostError):
    """A directory labctl would delete from, write into or trust (its state, cache, a handout or
    output directory) is not owned by the invoking user (or root), is writable by others, or
    is reached through another user's symbolic link: nothing is done there (exit status 3)."""


class ImageError(LabctlError):
    """A guest image could not be built or found."""

    exit_code = 3


class ProcessError(LabctlError):
    """A host process failed or timed out."""

    def __init__(self, message: str, hint: str | None = None, output: str = "") -> None:
        super().__init__(message, hint)
        self.output = output


class MachineError(LabctlError):
    """A guest's virtual machine failed (start, monitor, died)."""

    exit_code = 4


class SnapshotBroken(MachineError):
    """A post-boot snapshot's memory file is not as it was saved (truncated, replaced, another's):
    no guest is restored from it (exit status 4)."""


class PortTaken(MachineError):
    """A guest's QEMU could not bind a port labctl picked: another program took it first (``up`` retries)."""


class GuestError(LabctlError):
    """A guest misbehaved (never became ready, SSH failed, command failed)."""

    exit_code = 4


class LabStateError(LabctlError):
    """A lab is already up, not up, or its state cannot be read."""

    exit_code = 5


class TraceError(LabctlError):
    """A tracer could not be set up (missing kernel facts, probes refused)."""


class DebugError(LabctlError):
    """gdb could not attach, load symbols or drive the guest."""

    exit_code = 4


class MiTimeout(DebugError):
    """gdb did not answer an MI command in time (its state is unknown)."""
