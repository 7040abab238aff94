"""What one step variant gave: its status, why it failed, where its files are, what it measured on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResult:
    """One step variant's result, as summary.json keeps it (``guests``: the guests involved)."""

    name: str
    variant: str | None
    status: str = "ok"  # ok, failed, skipped
    reason: str | None = None
    duration_s: float = 0.0
    dir: str = ""
    nic: dict[str, Any] | None = None
    guests: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    gdb: dict[str, Any] | None = None
    repeat: int = 1  # which run of the variant (1..repeats)
    repeats: int = 1  # the step's repeat
    window_s: float | None = None  # the step's workload window (its commands), seconds
    captures: list[dict[str, Any]] = field(default_factory=list)  # one per captured NIC (labctl.steps.network)
    network: dict[str, Any] | None = None  # impairments in force and links changed during the step
    kselftest: dict[str, Any] | None = None  # the kernel's selftests: build, guest, one entry per test (labctl.steps.kselftest)

    def fail(self, reason: str) -> None:
        if self.status != "failed":
            self.status, self.reason = "failed", reason
