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

from typing import TYPE_CHECKING, Any, TypedDict

from labctl.inspect import VmcoreRecord  # declared where a crash is captured
from labctl.lab import (  # each kind's record is declared with the kind (labctl.lab.stepkinds)
    BuildRecord,
    CaptureRecord,
    GdbRecord,
    NetworkRecord,
    SelftestEntry,
    SelftestRecord,
)

if TYPE_CHECKING:  # labctl.trace is not loaded with the bundle
    from labctl.trace import BpftraceSummary, DropSummary, FollowSummary, GuestFigures, StepCost

__all__ = ["BuildRecord", "CaptureRecord", "CommandRecord", "GdbRecord", "NetworkRecord", "NicRecord", "SelftestEntry",
           "SelftestRecord", "Spread", "StepSummary", "Summary", "VariantSpread", "VmcoreRecord"]


class NicRecord(TypedDict):
    """The step's NIC under test (``nic:``): its model, the driver bound to it, the driver's modules."""

    guest: str
    name: str
    model: str
    driver: str | None
    modules: list[str]













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
    guests: dict[str, GuestFigures]  # guest -> its figures (labctl.trace.analyze.guest_figures)
    cost: StepCost  # the whole cost (labctl.trace.hostcost, labctl.report.cost)
    figures: dict[str, Any]  # the step's headline figures (labctl.report.throughput, cost)
    drops: DropSummary  # every skb dropped, per guest (labctl.trace.drops, labctl.report.droptable)
    follow: FollowSummary  # the packets the step followed (labctl.trace.journeyfiles, labctl.report.journeys)
    bpftrace: dict[str, BpftraceSummary]  # each guest's bpftrace maps and histograms (labctl.report.bpftrace)


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
