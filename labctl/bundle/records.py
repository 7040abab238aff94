"""The shapes of what a run bundle's summary.json holds, typed where data crosses stages: the runner
writes a step's records (:mod:`labctl.steps.result`), the report adds its figures
(:mod:`labctl.report.run_summary`), ``labctl compare`` and bisect read them back.

A step entry (:class:`StepSummary`) is what the runner recorded (its kinds' records: the NIC
under test, gdb, captures, network, selftests) and the figures of each guest and section; the
whole summary (:class:`Summary`) adds the run's header, the spreads of repeated variants and the
comparison sentence. Figures the report's sections compute are kept as JSON objects
(``dict[str, Any]``): each section owns its piece.
"""

from __future__ import annotations

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


class HardwareRecord(TypedDict):
    """The two ends of a hardware-mode kselftest step's link (:mod:`labctl.steps.drivertests`)."""

    netif: str
    peer: str
    local: str
    remote: str


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
    hardware: HardwareRecord  # drivers/net's hardware mode: the NIC under test and its peer


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


class Spread(TypedDict):
    """A figure's spread over repeated runs (:func:`labctl.bundle.figures.spread`)."""

    n: int
    mean: float
    min: float
    max: float
    sd: float


class VmcoreRecord(TypedDict, total=False):
    """A guest's crash during the run (:mod:`labctl.inspect.crashwatch`): its vmcore and drgn's summary
    of it, paths relative to the bundle; ``error`` says why either is missing."""

    guest: str
    cause: str  # panic, oops
    when: str  # what ran: up, step NAME (VARIANT), check NAME
    title: str  # the oops's title
    seen_at: str
    file: str | None  # guests/<guest>/vmcore: kdump, 0600
    summary_file: str | None  # guests/<guest>/vmcore.json: labctl.inspect.digest's summary
    error: str | None
    format: str
    size: int
    release: str
    build_id: str
    dump_s: float
    paused_s: float
    summary_s: float
    ready_after_s: float  # from the crash seen on the console to the summary written


class VariantSpread(TypedDict):
    name: str
    variant: str | None
    runs: int
    metrics: dict[str, Spread]


class StepSummary(TypedDict, total=False):
    """One step entry of summary.json: as the runner recorded it, then each guest's figures and
    each report section's piece (``cost``, ``figures``...)."""

    name: str
    variant: str | None
    status: str
    reason: str | None
    duration_s: float
    dir: str
    nic: NicRecord | None
    warnings: list[str]
    gdb: GdbRecord | None
    repeat: int
    repeats: int
    window_s: float | None
    captures: list[CaptureRecord]
    network: NetworkRecord | None
    kselftest: SelftestRecord | None
    kinds: list[str]
    guests: dict[str, dict[str, Any]]  # guest -> its figures (labctl.trace.analyze.guest_figures)
    cost: dict[str, Any]  # the whole cost (labctl.report.cost)
    figures: dict[str, Any]  # the step's headline figures (labctl.report.throughput, cost)
    drops: dict[str, Any]  # every skb dropped, per guest (labctl.report.drops_report)
    follow: dict[str, Any]  # the packets the step followed (labctl.report.journeys)
    bpftrace: dict[str, Any]  # each guest's bpftrace maps and histograms (labctl.report.bpftrace_report)


class Summary(TypedDict, total=False):
    """summary.json: the run's header (lab, status, reason, times, accelerator), its steps, the
    spreads of repeated variants and the comparison sentence."""

    lab: str
    status: str
    reason: str | None
    started_at: str
    finished_at: str
    accel: str | None
    steps: list[StepSummary]
    spreads: list[VariantSpread]
    comparison: str | None
    vmcores: list[VmcoreRecord]  # the guests' crashes during the run
