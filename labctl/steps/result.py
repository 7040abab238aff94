"""What one step variant gave: its status, why it failed, where its files are, what each of its kinds
recorded; and how the runner's caller hears of it as it goes (:class:`StepEvents`). These records are summary.json's step entries as the runner writes them (the report adds
its figures to them, :mod:`labctl.report.summary`): typed here, JSON there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict


class NicRecord(TypedDict):
    """The step's NIC under test (``nic:``): its model, the driver bound to it, the driver's modules."""

    guest: str
    name: str
    model: str
    driver: str | None
    modules: list[str]


class GdbRecord(TypedDict):
    """The step's scripted gdb session (:mod:`.gdbstep`): the breakpoint as gdb described it, its hits."""

    breakpoint: dict[str, Any]
    hits: int
    timed_out: bool
    message: str
    transcript: str


class CaptureRecord(TypedDict, total=False):
    """One NIC captured during the step (:mod:`.netstep`): its pcapng file and what it holds."""

    guest: str
    nic: str
    file: str | None
    calibrated: bool
    frames: int
    bytes: int
    first_us: int | None
    last_us: int | None
    warnings: list[str]


class NetworkRecord(TypedDict):
    """Impairments in force during the step, and links it changed (``GUEST.NIC`` -> up/down)."""

    impair: dict[str, Any]
    links: dict[str, str]


class BuildRecord(TypedDict):
    """How the selftests were built (:class:`labctl.steps.selftests.Build`)."""

    key: str
    seconds: float
    cached: bool
    make_status: int
    not_built: list[str]
    tests: int


class SelftestEntry(TypedDict):
    """One selftest's outcome, from the guest's KTAP output."""

    name: str
    collection: str
    number: int | None
    result: str  # pass, fail, skip, xfail (labctl.trace.ktap)
    directive: str | None
    reason: str | None
    time_s: float | None
    log: str  # its log file, relative to the bundle
    subtests: dict[str, int] | None
    failed_subtests: list[str]


class SelftestRecord(TypedDict, total=False):
    """A ``kselftest:`` step's record (:mod:`.selftests`): the build, then the results."""

    guest: str
    tree: str
    target: str
    build: BuildRecord
    tests: list[SelftestEntry]
    counts: dict[str, int]
    missing: int  # selftests the plan announced that never reported
    plan: int | None
    bailed: str | None  # the 'Bail out!' line's text
    error: str  # the runner did not run (no KTAP output)
    only_tests_failed: bool  # the lab was fine: only selftests failed (the next variant still runs)


class CommandRecord(TypedDict):
    """One command a step ran (the manifest's ``commands``)."""

    guest: str | None
    step: str
    variant: str | None
    index: int
    command: str
    background: bool
    status: int | None
    duration_s: float
    started_at: str


@dataclass
class StepResult:
    """One step variant's result, as summary.json keeps it (``guests``: the guests involved;
    ``kinds``: the names of the step's kinds that ran, :mod:`.kinds`)."""

    name: str
    variant: str | None
    status: str = "ok"  # ok, failed, skipped
    reason: str | None = None
    duration_s: float = 0.0
    dir: str = ""
    nic: NicRecord | None = None
    guests: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    gdb: GdbRecord | None = None
    repeat: int = 1  # which run of the variant (1..repeats)
    repeats: int = 1  # the step's repeat
    window_s: float | None = None  # the step's workload window (its commands), seconds
    captures: list[CaptureRecord] = field(default_factory=list)  # one per captured NIC (labctl.steps.netstep)
    network: NetworkRecord | None = None  # impairments in force and links changed during the step
    kselftest: SelftestRecord | None = None  # the kernel's selftests: build, guest, one entry per test
    kinds: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        if self.status != "failed":
            self.status, self.reason = "failed", reason


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
