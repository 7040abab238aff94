"""What one step variant gave: its status, why it failed, where its files are, what each of its kinds
recorded (``records``: the keys and types each kind declares, :mod:`labctl.lab.stepkinds`;
summary.json keeps them all, the report adds its figures, :mod:`labctl.report.run_summary`); and
how the runner's caller hears of it as it goes (:class:`StepEvents`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from labctl.bundle import NicRecord


@dataclass
class StepResult:
    """One step variant's result, as summary.json keeps it (``guests``: the guests involved;
    ``kinds``: the names of the step's kinds that ran, :mod:`.kinds`; ``records``: what they recorded,
    under the keys their declarations name, :mod:`labctl.lab.stepkinds`)."""

    name: str
    variant: str | None
    status: str = "ok"  # ok, failed, skipped
    reason: str | None = None
    duration_s: float = 0.0
    dir: str = ""
    nic: NicRecord | None = None
    guests: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    repeat: int = 1  # which run of the variant (1..repeats)
    repeats: int = 1  # the step's repeat
    window_s: float | None = None  # the step's workload window (its commands), seconds
    kinds: list[str] = field(default_factory=list)
    lab_intact: bool = False  # failed, but the lab is as it was (a kind says so): the next variant still runs
    records: dict[str, object] = field(default_factory=dict)  # a kind's record key -> its record

    def fail(self, reason: str) -> None:
        if self.status != "failed":
            self.status, self.reason = "failed", reason

    def entry(self) -> dict[str, object]:
        """The result as summary.json's step entry starts: its fields, each kind's record at its key."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "records"}
        return {**out, **self.records}


class StepEvents:
    """What the steps runner tells its caller as steps start and end (the CLI prints a line each).

    This default does nothing; the CLI passes one that draws with rich.
    """

    def step_started(self, name: str, variant: str | None) -> None:
        """Step ``name`` (matrix row ``variant``) starts."""

    def step_finished(self, result: StepResult) -> None:
        """A step variant ended (ok, failed or skipped), with its result."""

    def step_progress(self, message: str) -> None:
        """What a running step is doing meanwhile (building the selftests, copying them...)."""
