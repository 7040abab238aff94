"""Running the graded checks of a lab that is up (``labctl check``, ``labctl class check``, bisect's
check oracle, the web page's check button).

The checks come from the lab's resolved definition saved in its state when it
came up (not from the lab file, which may have changed since). Each check runs
as its kind says (:data:`KINDS`): a shell command on its guest over SSH with the
lab's key (:mod:`.shell`), or an expression on its guest's running kernel read
with drgn (:mod:`.drgncheck`). One guest's checks run in order, over one SSH
connection and one drgn session (:class:`GuestChecks`), the guests side by side.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from labctl.errors import LabStateError
from labctl.grading.check_result import CheckResult, Tally
from labctl.grading.drgncheck import DrgnCheck
from labctl.grading.guest_checks import GuestChecks, connect_session
from labctl.grading.shell import ShellCheck
from labctl.lab import Check
from labctl.ssh import Endpoint, Session
from labctl.state import LabState


class CheckKind(Protocol):
    """How a kind of check runs on its guest and what its outcome means (:class:`~labctl.grading.shell.ShellCheck`,
    :class:`~labctl.grading.drgncheck.DrgnCheck`)."""

    name: str

    def run(self, ctx: GuestChecks, check: Check) -> CheckResult:
        """Run ``check`` on ``ctx``'s guest: its result (pass, fail, timeout or error)."""


KINDS: dict[str, CheckKind] = {"shell": ShellCheck(), "drgn": DrgnCheck()}


def kind_of(check: Check) -> CheckKind:
    """The kind of ``check`` (its ``kind``: shell or drgn)."""
    return KINDS[check.kind]


def checks_of(state: LabState) -> tuple[Check, ...]:
    """The checks of a lab that is up, rebuilt from its saved resolved definition.

    :raise LabStateError: when the saved definition's checks cannot be read.
    """
    try:
        checks = tuple(Check(name=str(c["name"]), guest=str(c["guest"]), command=str(c["command"]),
                             hint=str(c.get("hint") or ""), timeout=float(c.get("timeout") or 30.0),
                             kind=str(c.get("kind") or "shell"))
                       for c in state.resolved.get("checks") or [])
        if any(c.kind not in KINDS for c in checks):
            raise ValueError("a check of an unknown kind")
        return checks
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LabStateError(f"lab '{state.lab}': the checks in its state cannot be read ({exc})",
                            hint=f"take it down and up again: labctl down {state.lab}") from exc


def guest_command(check: Check) -> str:
    """The command line a shell check runs on its guest."""
    return ShellCheck.command(check)


def run_on_guest(state: LabState, guest: str, checks: Sequence[Check], *,
                 connect: Callable[[Endpoint], Session] = connect_session,
                 clock: Callable[[], float] = time.monotonic) -> list[CheckResult]:
    """Run ``checks`` (all on ``guest``) in order, as each one's kind says, sharing one SSH
    connection and one drgn session (:class:`GuestChecks`)."""
    ctx = GuestChecks(state, guest, connect, clock)
    try:
        return [kind_of(check).run(ctx, check) for check in checks]
    finally:
        ctx.close()


def run_checks(state: LabState, checks: Sequence[Check] | None = None) -> list[CheckResult]:
    """Run the lab's checks (or ``checks``): each guest's in order, the guests side by side.

    Results come back in the checks' order.
    """
    checks = list(checks_of(state) if checks is None else checks)
    by_guest: dict[str, list[Check]] = {}
    for check in checks:
        by_guest.setdefault(check.guest, []).append(check)
    if not by_guest:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(by_guest)) as pool:
        done = list(pool.map(lambda item: run_on_guest(state, item[0], item[1]), by_guest.items()))
    got = {(r.guest, r.name): r for part in done for r in part}
    return [got[(c.guest, c.name)] for c in checks]


def summary(results: Sequence[CheckResult]) -> Tally:
    """Passed/total and the failing checks' names."""
    return {"passed": sum(r.passed for r in results), "total": len(results),
            "failing": [r.name for r in results if not r.passed]}
