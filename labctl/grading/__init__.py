"""Graded checks of a lab that is up: running them and what their outcomes mean.

Used by ``labctl check`` and ``labctl class check``, bisect's ``--check`` and ``--command``
oracles, and the web page's check button. :mod:`.checking` runs a lab's checks (each guest's over
one SSH connection, the guests side by side; what they share on one guest: :mod:`.guest_checks`) and
keeps their results (:mod:`.check_result`); each kind of check is an entry
of :data:`~labctl.grading.checking.KINDS`: a shell command on the guest bounded by its timeout
(:mod:`.shell`), or an expression on the guest's running kernel read with drgn (:mod:`.drgncheck`).

Imports never: labctl.training, labctl.bisect, labctl.web, labctl.cli, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.up
"""



from labctl.grading.check_result import ERROR, FAIL, PASS, TIMEOUT, CheckRecord, CheckResult, CheckRow, Tally
from labctl.grading.checking import (
    KINDS,
    CheckKind,
    checks_of,
    guest_command,
    run_checks,
    run_on_guest,
    summary,
)
from labctl.grading.drgncheck import DrgnCheck
from labctl.grading.guest_checks import GuestChecks
from labctl.grading.shell import ShellCheck

__all__ = [
    "ERROR",
    "FAIL",
    "KINDS",
    "PASS",
    "TIMEOUT",
    "CheckKind",
    "CheckRecord",
    "CheckResult",
    "CheckRow",
    "DrgnCheck",
    "GuestChecks",
    "ShellCheck",
    "Tally",
    "checks_of",
    "guest_command",
    "run_checks",
    "run_on_guest",
    "summary",
]
