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
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict

from labctl.errors import LabStateError
from labctl.grading.drgncheck import DrgnCheck
from labctl.grading.shell import ERROR, FAIL, PASS, TIMEOUT, ShellCheck
from labctl.lab import Check
from labctl.ssh import Endpoint, Session
from labctl.state import LabState

if TYPE_CHECKING:
    from labctl.inspect import KernelView

OUTPUT_TAIL = 2000  # bytes of a check's output kept for --json
CONNECT_TIMEOUT = 10.0


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
            return f"fail (exit {self.exit_status})" if self.exit_status is not None else f"fail ({self.detail})"
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


def _connect(ep: Endpoint) -> Session:
    return Session(ep, timeout=CONNECT_TIMEOUT)


@dataclass
class GuestChecks:
    """What one guest's checks share as they run in order: one SSH session (a new one after an
    error), one drgn session on its kernel (opened for its first drgn check), the clock."""

    state: LabState
    guest: str
    connect: Callable[[Endpoint], Session] = _connect
    clock: Callable[[], float] = time.monotonic
    _session: Session | None = None
    _kernel: KernelView | None = None
    _open: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def session(self) -> Session:
        """The guest's SSH session. :raise GuestError, LabStateError: when it cannot be opened."""
        if self._session is None:
            self._session = self.connect(self.state.endpoint(self.guest))
        return self._session

    def drop_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def kernel(self) -> KernelView:
        """drgn on the guest's running kernel. :raise LabctlError: when it cannot be read."""
        if self._kernel is None:
            from labctl.inspect import open_live

            self._kernel = self._open.enter_context(open_live(self.state, self.guest))
        return self._kernel

    def close(self) -> None:
        self.drop_session()
        self._kernel = None
        self._open.close()


def run_on_guest(state: LabState, guest: str, checks: Sequence[Check], *,
                 connect: Callable[[Endpoint], Session] = _connect,
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
