"""How each step kind runs, by its name: the kinds themselves are declared (their lab-file keys,
their records, their order) in :mod:`labctl.lab.stepkinds`; here each one's part of a step for a
matrix row, a :class:`~labctl.steps.variant.StepKind` (:mod:`.variant` says the phases). A new
kind is its module and one line of :data:`RUNS`: nothing else in the runner changes, and the
report shows its section from the kind's name that the step's result records.

=========== =============================================================== ======================
kind        what                                                            module
=========== =============================================================== ======================
drops       every skb each guest's kernel drops (unless ``drops: false``)    :mod:`.follow_kind`
network     impairments, captures, link changes, all put back after         :mod:`.netstep`
sysctls     sysctls set for the step's duration, put back after             :mod:`.sysctl_kind`
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

from labctl.lab import STEP_KINDS, Lab, Step
from labctl.steps.commands import CommandsKind
from labctl.steps.follow_kind import DropsKind, FollowKind
from labctl.steps.gdbstep import GdbKind
from labctl.steps.netstep import NetworkKind
from labctl.steps.selftests import SelftestsKind
from labctl.steps.sysctl_kind import SysctlsKind
from labctl.steps.tracing import StatsKind, TracingKind
from labctl.steps.variant import StepKind

FromStep = Callable[[Lab, Step, dict[str, str]], StepKind | None]

RUNS: dict[str, FromStep] = {
    "drops": lambda lab, step, row: DropsKind.of(lab),
    "network": lambda lab, step, row: NetworkKind.of(lab, step, row),
    "sysctls": lambda lab, step, row: SysctlsKind.of(step),
    "stats": lambda lab, step, row: StatsKind.of(lab, step),
    "trace": lambda lab, step, row: TracingKind.of(step),
    "follow": lambda lab, step, row: FollowKind.of(lab, step, row),
    "gdb": lambda lab, step, row: GdbKind.of(step, row),
    "commands": lambda lab, step, row: CommandsKind.of(step, row),
    "kselftest": lambda lab, step, row: SelftestsKind.of(step, row),
}
"""A kind's name -> its part of a step for a matrix row, or None when the step has none."""

GUEST_ORDER = ("commands", "kselftest", "trace", "nic", "gdb", "network")
"""The order of a step's guests (its result's ``guests``, the report's): its commands' first; the
guests of a kind not named here come after, in phase order."""


def kinds_of(lab: Lab, step: Step, row: dict[str, str]) -> list[StepKind]:
    """The kinds of ``step`` for ``row``, in phase order (the declarations')."""
    return [k for d in STEP_KINDS if (k := RUNS[d.name](lab, step, row)) is not None]


def guest_order(by_kind: dict[str, list[str]]) -> list[str]:
    """The step's guests, once each: :data:`GUEST_ORDER`'s kinds first, then every other kind's."""
    names = [*GUEST_ORDER, *(k for k in by_kind if k not in GUEST_ORDER)]
    return list(dict.fromkeys(g for name in names for g in by_kind.get(name, [])))
