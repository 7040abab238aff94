"""Running the graded checks of a lab that is up (``labctl check``, ``labctl class check``, bisect's
check oracle, the web page's check button).

The checks come from the lab's resolved definition saved in its state when it
came up (not from the lab file, which may have changed since). Each check runs
on its guest over SSH with the lab's key, as its kind says (:data:`KINDS`; the
lab file's checks are shell commands, :mod:`.shell`), one guest's checks in
order over one connection, the guests side by side.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

from labctl.errors import GuestError, LabStateError
from labctl.grading.shell import ERROR, FAIL, PASS, TIMEOUT, ShellCheck
from labctl.lab import Check
from labctl.ssh import Endpoint, Session
from labctl.state import LabState

OUTPUT_TAIL = 2000  # bytes of a check's output kept for --json
CONNECT_TIMEOUT = 10.0


class CheckKind(Protocol):
    """How a kind of check runs on its guest and what its outcome means (:class:`~labctl.grading.shell.ShellCheck`)."""

    name: str

    def command(self, check: Check) -> str:
        """The command line run on the guest."""

    def judge(self, check: Check, status: int, seconds: float) -> str:
        """pass, fail or timeout, from its exit status after ``seconds``."""


KINDS: dict[str, CheckKind] = {"shell": ShellCheck()}


def kind_of(check: Check) -> CheckKind:
    """The kind of ``check`` (every check of a lab file is a shell command today)."""
    return KINDS["shell"]


class CheckRecord(TypedDict):
    """A check's result as ``--json``, bisect's oracle and the web page keep it."""

    name: str
    guest: str
    status: str
    passed: bool
    exit_status: int | None
    seconds: float
    hint: str
    detail: str


class Tally(TypedDict):
    passed: int
    total: int
    failing: list[str]


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``status`` is pass, fail (non-zero exit), timeout or error (no SSH...)."""

    name: str
    guest: str
    status: str
    hint: str = ""
    exit_status: int | None = None
    seconds: float = 0.0
    detail: str = ""  # why it failed to run (error), or the tail of its output

    @property
    def passed(self) -> bool:
        return self.status == PASS

    def summary(self) -> str:
        """The result column: ``pass``, ``fail (exit 1)``, ``timeout (20 s)``, ``error: ...``."""
        if self.status == FAIL:
            return f"fail (exit {self.exit_status})"
        if self.status == TIMEOUT:
            return f"timeout ({self.seconds:.0f} s)"
        if self.status == ERROR:
            return f"error: {self.detail}"
        return self.status

    def to_dict(self) -> CheckRecord:
        return {"name": self.name, "guest": self.guest, "status": self.status, "passed": self.passed,
                "exit_status": self.exit_status, "seconds": round(self.seconds, 2), "hint": self.hint,
                "detail": self.detail}


def checks_of(state: LabState) -> tuple[Check, ...]:
    """The checks of a lab that is up, rebuilt from its saved resolved definition.

    :raise LabStateError: when the saved definition's checks cannot be read.
    """
    try:
        return tuple(Check(name=str(c["name"]), guest=str(c["guest"]), command=str(c["command"]),
                           hint=str(c.get("hint") or ""), timeout=float(c.get("timeout") or 30.0))
                     for c in state.resolved.get("checks") or [])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise LabStateError(f"lab '{state.lab}': the checks in its state cannot be read ({exc})",
                            hint=f"take it down and up again: labctl down {state.lab}") from exc


def guest_command(check: Check) -> str:
    """The command line run on the guest, as the check's kind says."""
    return kind_of(check).command(check)


def _tail(res_out: bytes, res_err: bytes) -> str:
    text = (res_out + res_err).decode(errors="replace").strip()
    return text[-OUTPUT_TAIL:]


def _connect(ep: Endpoint) -> Session:
    return Session(ep, timeout=CONNECT_TIMEOUT)


def run_on_guest(state: LabState, guest: str, checks: Sequence[Check], *,
                 connect: Callable[[Endpoint], Session] = _connect,
                 clock: Callable[[], float] = time.monotonic) -> list[CheckResult]:
    """Run ``checks`` (all on ``guest``) in order over one SSH connection (a new one after an error).

    A check whose connection failed after its time was up timed out; before, it could not run (error).
    """
    results: list[CheckResult] = []
    session: Session | None = None
    try:
        for check in checks:
            t0 = clock()
            try:
                if session is None:
                    session = connect(state.endpoint(guest))
                res = session.run(guest_command(check), timeout=check.timeout + 10.0)
            except (GuestError, LabStateError) as exc:
                took = clock() - t0
                if session is not None:
                    session.close()
                    session = None
                status = TIMEOUT if took >= check.timeout else ERROR
                results.append(CheckResult(check.name, guest, status, check.hint, None, took, exc.message))
                continue
            took = clock() - t0
            results.append(CheckResult(check.name, guest, kind_of(check).judge(check, res.status, took), check.hint,
                                       res.status, took, _tail(res.stdout, res.stderr)))
    finally:
        if session is not None:
            session.close()
    return results


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
