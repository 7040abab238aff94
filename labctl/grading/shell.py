"""The shell check, the lab file's ``checks:`` as they are today: a command on the guest that exits 0
when that part of the exercise is done, bounded on the guest too (``timeout``), so that a check
that hangs leaves nothing running behind it.

A check kind says how its check runs on the guest (:meth:`ShellCheck.command`) and what the outcome
means (:meth:`ShellCheck.judge`); :mod:`.checking` runs them. Another kind (a drgn expression on
the guest's kernel, say) is another class with these two methods, in :data:`labctl.grading.checking.KINDS`.
"""

from __future__ import annotations

import shlex

from labctl.lab import Check

PASS, FAIL, TIMEOUT, ERROR = "pass", "fail", "timeout", "error"
GUEST_TIMEOUT_STATUS = 124  # coreutils timeout(1): the command ran out of time
TIMEOUT_SLACK = 0.5  # s: a status 124 sooner than the timeout is the command's own


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
