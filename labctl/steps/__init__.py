"""A lab's steps on a lab that is up: workloads wrapped in tracers, gdb alongside, files copied into the bundle.

Owns: running the steps (:mod:`.runner`: every step, row and repeat), one run of one row
(:mod:`.variant`: its phases) through the kinds a step is made of (:mod:`.kinds` lists them, each
an object owning its part of the run and its record in the step's result, :mod:`.result`): the
commands (:mod:`.commands`), the kernel's selftests (:mod:`.selftests`; the driver tests' hardware mode, :mod:`.drivertests`), the network's changes
and captures (:mod:`.netstep`), the statistics and tracers (:mod:`.tracing`, their guest commands
in :mod:`.tracers` and :mod:`.skbprobes`), every drop and the packets a step follows
(:mod:`.follow_kind`, through :mod:`labctl.follow`), the scripted gdb session (:mod:`.gdbstep`), and the others :mod:`.kinds` names; the
step's window and its QEMUs on the host (:mod:`.hostwatch`); the guests' SSH sessions
(:mod:`.sessions`); copying a guest's files back without trusting it (:mod:`.copyback`) and
``labctl cp`` (:mod:`.transfer`). The analysis of what the tracers leave is
:mod:`labctl.trace`'s; the bundle's files are :mod:`labctl.bundle`'s; what the report shows of
each kind is its section's (:mod:`labctl.report`). Must not import the CLI, the report or a
backend module (backends are reached through the lab state's registry).

Imports never: labctl.cli, labctl.report, labctl.backends.qemu, labctl.backends.libvirt
"""

from __future__ import annotations

from labctl.steps.result import StepResult
from labctl.steps.runner import Runner, StepEvents, now
from labctl.steps.transfer import DEFAULT_TIMEOUT as TRANSFER_TIMEOUT
from labctl.steps.transfer import Progress as TransferProgress
from labctl.steps.transfer import from_guest as copy_from_guest
from labctl.steps.transfer import human as human_size
from labctl.steps.transfer import local_size, parse_size
from labctl.steps.transfer import plan as plan_transfer
from labctl.steps.transfer import to_guest as copy_to_guest

__all__ = [
    "TRANSFER_TIMEOUT",
    "Runner",
    "StepEvents",
    "StepResult",
    "TransferProgress",
    "copy_from_guest",
    "copy_to_guest",
    "human_size",
    "local_size",
    "now",
    "parse_size",
    "plan_transfer",
]
