"""The shell check, a lab file's ``checks:`` entry with a ``command``: a command on the guest that exits
0 when that part of the exercise is done, bounded on the guest too (``timeout``), so that a check
that hangs leaves nothing running behind it.

A check kind runs its check on the guest's shared context (:class:`~labctl.grading.checking.GuestChecks`)
and says what the outcome means; :mod:`.checking` runs them (the other kind: :mod:`.drgncheck`).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from labctl.errors import GuestError, LabStateError
from labctl.grading.check_result import ERROR, FAIL, PASS, TIMEOUT, CheckResult
from labctl.lab import Check

if TYPE_CHECKING:
    from labctl.grading.guest_checks import GuestChecks

GUEST_TIMEOUT_STATUS = 124  # coreutils timeout(1): the command ran out of time
TIMEOUT_SLACK = 0.5  # s: a status 124 sooner than the timeout is the command's own
OUTPUT_TAIL = 2000  # characters of a check's output kept for --json


class ShellCheck:
    """A check whose ``command`` is a shell command line."""

    name = "shell"

    @staticmethod
    def command(check: Check) -> str:
        """The command line run on the guest: the check's, bounded by its timeout (then killed)."""
        return f"timeout -k 2 {check.timeout:g} sh -c {shlex.quote(check.command)}"

    @staticmethod
    def judge(check: Check, status: int, seconds: float) -> str:
        """pass (exit 0), timeout (timeout(1)'s 124 once the time was up), else fail."""
        if status == 0:
            return PASS
        if status == GUEST_TIMEOUT_STATUS and seconds >= check.timeout - TIMEOUT_SLACK:
            return TIMEOUT
        return FAIL

    def run(self, ctx: GuestChecks, check: Check) -> CheckResult:
        """Over the guest's one SSH connection (a new one after an error). A check whose connection
        failed after its time was up timed out; before, it could not run (error)."""
        t0 = ctx.clock()
        try:
            res = ctx.session().run(self.command(check), timeout=check.timeout + 10.0)
        except (GuestError, LabStateError) as exc:
            took = ctx.clock() - t0
            ctx.drop_session()
            status = TIMEOUT if took >= check.timeout else ERROR
            return CheckResult(check.name, ctx.guest, status, check.hint, None, took, exc.message)
        took = ctx.clock() - t0
        output = (res.stdout + res.stderr).decode(errors="replace").strip()[-OUTPUT_TAIL:]
        return CheckResult(check.name, ctx.guest, self.judge(check, res.status, took), check.hint, res.status, took,
                           output)
