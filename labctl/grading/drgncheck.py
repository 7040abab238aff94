"""The drgn check, a lab file's ``checks:`` entry with a ``drgn`` expression: true on the guest's
running kernel when that part of the exercise is done, read with drgn from the guest's memory as
it runs (:func:`labctl.inspect.open_live`; the guest is not paused), so that a trainer grades the
kernel's own state ("the student's qdisc drops nothing", "conntrack holds no entry") rather than a
tool's output. The expression is walked by :mod:`labctl.inspect.evaluate` in labctl's process, in
the language of :mod:`labctl.lab.drgnexpr` (no Python is run as such); its ``timeout`` bounds
the walk.

pass: the value is true; fail: false (the detail shows the value); timeout: the walk ran out of
time; error: the kernel could not be read (no debug info, a missing symbol, a fault...).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from labctl.errors import LabctlError
from labctl.grading.check_result import ERROR, FAIL, PASS, TIMEOUT, CheckResult
from labctl.lab import Check

if TYPE_CHECKING:
    from labctl.grading.guest_checks import GuestChecks

MAX_VALUE = 200  # characters of a failing expression's value in the result


class DrgnCheck:
    """A check whose ``command`` is a drgn expression on the guest's kernel."""

    name = "drgn"

    def run(self, ctx: GuestChecks, check: Check) -> CheckResult:
        from labctl.inspect import ExprError, evaluate

        t0 = ctx.clock()
        deadline = time.monotonic() + check.timeout
        try:
            value = evaluate(ctx.kernel().prog, check.command, deadline)
        except ExprError as exc:
            took = ctx.clock() - t0
            status = TIMEOUT if exc.timed_out else ERROR
            return CheckResult(check.name, ctx.guest, status, check.hint, None, took, exc.message)
        except LabctlError as exc:
            return CheckResult(check.name, ctx.guest, ERROR, check.hint, None, ctx.clock() - t0, exc.message)
        took = ctx.clock() - t0
        if value:
            return CheckResult(check.name, ctx.guest, PASS, check.hint, None, took, "")
        return CheckResult(check.name, ctx.guest, FAIL, check.hint, None, took, _why_false(ctx, check, value, deadline))


def _why_false(ctx: GuestChecks, check: Check, value: object, deadline: float) -> str:
    """``dev.mtu is (unsigned int)1500`` for a comparison, else ``the expression is False``."""
    from labctl.inspect import left_side

    try:
        left = left_side(ctx.kernel().prog, check.command, deadline)
    except LabctlError:
        left = None
    return f"{left[0]} is {_short(left[1])}" if left else f"the expression is {_short(value)}"


def _short(value: object) -> str:
    shown = " ".join(str(value).split())
    return shown if len(shown) <= MAX_VALUE else shown[:MAX_VALUE - 1] + "…"
