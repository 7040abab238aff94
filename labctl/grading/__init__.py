"""Graded checks of a lab that is up: running them and what their outcomes mean.

Used by ``labctl check`` and ``labctl class check``, bisect's ``--check`` and ``--command``
oracles, and the web page's check button. :mod:`.checking` runs a lab's checks (each guest's over
one SSH connection, the guests side by side) and keeps their results; :mod:`.shell` is the kind
of check a lab file has today, a shell command bounded by its timeout; another kind (a drgn
expression on the guest's kernel) is another entry in :data:`~labctl.grading.checking.KINDS`.

Imports never: labctl.training, labctl.bisect, labctl.web, labctl.cli, labctl.pipeline, labctl.steps, labctl.bundle, labctl.report, labctl.up
"""



from labctl.grading.checking import (
    KINDS,
    CheckKind,
    CheckRecord,
    CheckResult,
    Tally,
    checks_of,
    guest_command,
    run_checks,
    run_on_guest,
    summary,
)
from labctl.grading.shell import ERROR, FAIL, PASS, TIMEOUT, ShellCheck

__all__ = [
    "ERROR",
    "FAIL",
    "KINDS",
    "PASS",
    "TIMEOUT",
    "CheckKind",
    "CheckRecord",
    "CheckResult",
    "ShellCheck",
    "Tally",
    "checks_of",
    "guest_command",
    "run_checks",
    "run_on_guest",
    "summary",
]
