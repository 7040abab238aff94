"""The kinds a step can be made of, in the order each phase visits them (:mod:`.variant` says the
phases). A new kind is a :class:`~labctl.steps.variant.StepKind` with a ``from_step`` entry here:
nothing else in the runner changes, and the report shows its section from the kind's name that the
step's result records.

=========== =============================================================== ======================
kind        what                                                            module
=========== =============================================================== ======================
drops       every skb each guest's kernel drops (unless ``drops: false``)    :mod:`.follow_kind`
network     impairments, captures, link changes, all put back after         :mod:`.netstep`
stats       statistics snapshots before and after                           :mod:`.tracing`
trace       the tracers of each traced guest                                :mod:`.tracing`
follow      packets followed through the lab's kernels and wires            :mod:`.follow_kind`
gdb         a scripted breakpoint session alongside the workload            :mod:`.gdbstep`
commands    the ``run:`` entries, in order                                  :mod:`.commands`
kselftest   the kernel's selftests, after the commands                      :mod:`.selftests`
=========== =============================================================== ======================
"""

from __future__ import annotations

from collections.abc import Callable

from labctl.lab import Lab, Step
from labctl.steps.commands import CommandsKind
from labctl.steps.follow_kind import DropsKind, FollowKind
from labctl.steps.gdbstep import GdbKind
from labctl.steps.netstep import NetworkKind
from labctl.steps.selftests import SelftestsKind
from labctl.steps.tracing import StatsKind, TracingKind
from labctl.steps.variant import StepKind

FromStep = Callable[[Lab, Step, dict[str, str]], StepKind | None]

KINDS: tuple[tuple[str, FromStep], ...] = (
    ("drops", lambda lab, step, row: DropsKind.of(lab)),
    ("network", lambda lab, step, row: NetworkKind.of(lab, step, row)),
    ("stats", lambda lab, step, row: StatsKind.of(lab, step)),
    ("trace", lambda lab, step, row: TracingKind.of(step)),
    ("follow", lambda lab, step, row: FollowKind.of(lab, step, row)),
    ("gdb", lambda lab, step, row: GdbKind.of(step, row)),
    ("commands", lambda lab, step, row: CommandsKind.of(step, row)),
    ("kselftest", lambda lab, step, row: SelftestsKind.of(step, row)),
)
"""(name, the kind's part of a step for a matrix row, or None when the step has none)."""

GUEST_ORDER = ("commands", "kselftest", "trace", "nic", "gdb", "network")
"""The order of a step's guests (its result's ``guests``, the report's): its commands' first."""


def kinds_of(lab: Lab, step: Step, row: dict[str, str]) -> list[StepKind]:
    """The kinds of ``step`` for ``row``, in phase order."""
    return [k for _, make in KINDS if (k := make(lab, step, row)) is not None]

