"""The report's sections, in the order the report shows them (:mod:`.sections` says what a section is).

A new section is a :class:`~labctl.report.sections.ReportSection` added here: the summary, the
report, ``labctl compare``, the run-to-run spread and bisect's figure oracle all ask every section.
A step kind's section (:mod:`labctl.lab.stepkinds`) is named here, not in the package's docstring:
the step's sysctls (:mod:`.sysctls`).
"""

from __future__ import annotations

from labctl.bundle import StepSummary
from labctl.report.bpftrace import BpftraceSection
from labctl.report.cost import CostSection
from labctl.report.crashes import CrashSection
from labctl.report.droptable import DropsSection
from labctl.report.flames import FlamesSection
from labctl.report.gdbsession import GdbSection
from labctl.report.guest_parts import LossSection, ProfileSection, SoftnetSection, TimelineSection
from labctl.report.journeys import FollowSection
from labctl.report.latency import LatencySection
from labctl.report.network import NetworkSection, TopologySection
from labctl.report.sections import HeadlineFigure, Metric, ReportSection
from labctl.report.selftestresults import SelftestSection
from labctl.report.sysctls import SysctlSection
from labctl.report.throughput import TransferSection
from labctl.report.tracepoints import TracepointSection

SECTIONS: tuple[ReportSection, ...] = (
    TopologySection(),  # before the results
    CrashSection(),  # a guest's crash and drgn's view of its vmcore, before the results
    TransferSection(),  # the results' figures and charts; each step's guests table
    CostSection(),
    TracepointSection(),
    NetworkSection(),  # reassembly, receive work per CPU; each step's network and captures
    SysctlSection(),  # each step's sysctls
    FlamesSection(),
    LatencySection(),
    SelftestSection(),  # each step's selftests; their counts in the results
    GdbSection(),  # each step's gdb session
    FollowSection(),  # each step's followed packets
    DropsSection(),  # each step's drops
    BpftraceSection(),  # each step's bpftrace maps and histograms
    ProfileSection(),
    SoftnetSection(),
    LossSection(),
    TimelineSection(),
)


def headline() -> tuple[HeadlineFigure, ...]:
    """The figures every run's spread shows (each section's ``headline``, in order)."""
    return tuple(h for s in SECTIONS for h in s.headline)


def compare_groups() -> tuple[tuple[str, str], ...]:
    """(key prefix, title) of each table of ``labctl compare``, in order: what every section says."""
    return tuple((prefix, title) for _, prefix, title in sorted(g for s in SECTIONS for g in s.compare_groups))


def zero_when_absent() -> tuple[str, ...]:
    """Key prefixes of counts that are 0 in a run that measured them but has no key (each section's)."""
    return tuple(p for s in SECTIONS for p in s.zero_when_absent)


def step_metrics(step: StepSummary) -> dict[str, Metric]:
    """Every number of a step entry worth comparing, flat: key -> (value, label, unit, better).

    Each section's: the headline figures; each guest's host CPU per GB; per-packet latency
    percentiles per stage; softnet drops and squeezes; every SNMP counter that moved; tracepoint
    totals. Values that were not measured are left out.
    """
    out: dict[str, Metric] = {}
    for s in SECTIONS:
        out.update(s.metrics(step))
    return out
