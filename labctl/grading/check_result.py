"""One check's outcome (:class:`CheckResult`: pass, fail, timeout or error) and the record
``--json``, bisect's oracle and the web page keep of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

PASS, FAIL, TIMEOUT, ERROR = "pass", "fail", "timeout", "error"


class CheckRow(TypedDict):
    """A check's last result as the web pages show it: its :class:`CheckRecord` without the detail
    (it may show the check's command; hints are what students get)."""

    name: str
    guest: str
    status: str
    passed: bool
    exit_status: int | None
    seconds: float
    hint: str


class CheckRecord(CheckRow):
    """A check's result as ``--json``, bisect's oracle and the web page keep it."""

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
