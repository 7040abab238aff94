"""The transfer section: a step that moves bytes over the NIC under test, and what it cost the guest.

Throughput (iperf3 or wget, :mod:`labctl.trace.parsers`), the guest's CPU load (mpstat), the
driver's share of its busy samples and the CPU that makes (perf; :mod:`labctl.trace.analyze`
says how). This section is about the steps that measured a transfer or were meant to (they run
commands and name the NIC under test, ``nic:``): only those fill its columns of the results
table and its charts, and get its guests table; a step that runs selftests, or commands that move
nothing, gets none of them. The run's headline sentence (:func:`comparison_sentence`) weighs the
NIC variants' driver CPU, and their whole cost (:mod:`.cost`) when it was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from labctl.bundle import (
    Run,
    StepSummary,
    as_dict,
    figure,
    fmt_num,
    is_failed,
    nic_model,
    primary_guest,
    step_guests,
    step_labels,
    usable,
)
from labctl.report.charts import bar_chart_svg
from labctl.report.cost import cost_sentence
from labctl.report.document import Block, Heading, Row, Table, num, txt
from labctl.report.sections import Column, HeadlineFigure, ReportSection, StepFiles, expects_transfer
from labctl.trace import GuestFigures, step_figures

# (summary key, chart title, unit, results-table header)
FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("throughput_mbit_s", "Throughput", "Mbit/s", "throughput Mbit/s"),
    ("cpu_load_pct", "CPU load", "%", "CPU load %"),
    ("driver_share_pct", "Driver share of CPU samples", "%", "driver share %"),
    ("driver_cpu_pct", "CPU in the NIC driver", "%", "CPU in driver %"),
)
TCG_NOTE = ("Under TCG the emulated NICs' device models run inside QEMU on the host, out of the guest "
            "profiler's sight: the guest driver's share is not the NIC's cost.")


def is_transfer(step: StepSummary) -> bool:
    """Whether the step is about a transfer: it measured one, or was meant to."""
    return expects_transfer(step) or usable(figure(step, "throughput_mbit_s")) is not None


def about(step: StepSummary) -> bool:
    """Whether the section is about the step: a transfer, or a step that measured one of its figures
    (a baseline's CPU load)."""
    return is_transfer(step) or any(usable(figure(step, key)) is not None for key, *_ in FIGURES)


def _mbyte_s(mbit_s: float | None) -> str:
    mb = (mbit_s or 0.0) / 8
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}"


def driver_sentence(steps: Sequence[StepSummary]) -> str | None:
    """The seed's sentence: which NIC variant spent the least and the most guest CPU in its driver.

    Only steps that did not fail and have a ``driver_cpu_pct`` figure count;
    None when fewer than two distinct variants are left.
    """
    points: dict[str, tuple[float, float | None]] = {}
    for s in steps:
        label, cpu = nic_model(s), usable(figure(s, "driver_cpu_pct"))
        if label and cpu is not None and cpu >= 0 and not is_failed(s.get("status")) and label not in points:
            points[label] = (cpu, usable(figure(s, "throughput_mbit_s")))
    if len(points) < 2:
        return None
    ranked = sorted(points.items(), key=lambda kv: kv[1][0])  # stable: ties keep summary order
    (best, (b_cpu, b_tp)), (worst, (w_cpu, w_tp)) = ranked[0], ranked[-1]
    speed = f", at {_mbyte_s(b_tp)} vs {_mbyte_s(w_tp)} MB/s" if b_tp is not None and w_tp is not None else ""
    cpus = f"{fmt_num(b_cpu)}% vs {fmt_num(w_cpu)}% of the CPU"
    if b_cpu == 0:
        return (f"{best} used no measurable CPU in its driver, {worst} used {fmt_num(w_cpu)}% "
                f"of the CPU in its driver{speed}.")
    ratio = f"{w_cpu / b_cpu:.1f}"
    if ratio == "1.0":
        return f"{best} used about as much CPU in its driver as {worst} ({cpus}){speed}."
    return f"{best} used {ratio} times less CPU in its driver than {worst} ({cpus}){speed}."


def comparison_sentence(steps: Sequence[StepSummary], accel: object = None) -> str | None:
    """The run's headline: what the data shows about the NIC variants' cost, no more.

    Under TCG it is based on the whole cost (the QEMUs' host CPU per GB, see
    :func:`labctl.report.cost.cost_sentence`) and says that the device models' work is in QEMU;
    without host figures it says the run cannot rank the NICs. Otherwise
    (KVM) it is the seed's driver sentence (:func:`driver_sentence`),
    followed by the whole cost when it was measured. None when fewer than
    two variants have figures.
    """
    cost, driver = cost_sentence(steps), driver_sentence(steps)
    if accel == "tcg":
        if cost:
            return f"{cost} {TCG_NOTE}"
        if driver:
            return f"{TCG_NOTE} The host side was not measured, so this run cannot rank the NICs by cost."
        return None
    if driver and cost:
        return f"{driver} {cost}"
    return driver or cost


def _primary(step: StepSummary, key: str) -> Any:
    primary = primary_guest(step)
    return primary[1].get(key) if primary else None


def guests_table(guests: Sequence[tuple[str, GuestFigures]]) -> Table:
    """Per-guest figures of one step."""
    rows = tuple(Row((txt(name),) + tuple(num(g.get(f[0])) for f in FIGURES)
                     + (num(g.get("samples")), num(g.get("lost_samples")))) for name, g in guests)
    headers = ("guest", *(f[3] for f in FIGURES), "samples", "lost samples")
    return Table(headers, rows, frozenset(range(1, 7)))


class TransferSection(ReportSection):
    """Throughput, CPU load and the driver's share (see the module docstring)."""

    name = "transfer"
    kinds = ("commands",)
    compare_groups = ((0, "", "Headline figures"),)
    headline: ClassVar[tuple[HeadlineFigure, ...]] = (
        ("throughput_mbit_s", "throughput", "Mbit/s", +1),
        ("cpu_load_pct", "guest CPU load", "%", -1),
        ("driver_share_pct", "driver share of the guest's busy samples", "%", -1),
        ("driver_cpu_pct", "guest CPU in the NIC driver", "%", -1),
    )

    def summarize(self, step: StepFiles) -> None:
        e = step.entry
        e["figures"] = {**as_dict(e.get("figures")), **step_figures(as_dict(e.get("guests")),
                                                                       as_dict(e.get("nic")).get("guest"))}

    def columns(self, steps: Sequence[StepSummary]) -> list[Column]:
        if not any(about(s) for s in steps):
            return []

        def cell(key: str, header: str) -> Column:
            return Column(header, lambda s: num(figure(s, key)))

        return [*(cell(key, header) for key, _, _, header in FIGURES),
                Column("samples", lambda s: num(_primary(s, "samples"))),
                Column("lost", lambda s: num(_primary(s, "lost_samples")))]

    def charts(self, steps: Sequence[StepSummary]) -> list[str]:
        """One bar chart per figure, one bar per step the section is about."""
        steps = [s for s in steps if about(s)]
        if not steps:
            return []
        labels = step_labels(steps)
        failed = [is_failed(s.get("status")) for s in steps]
        return [bar_chart_svg(title, labels, [usable(figure(s, key)) for s in steps], unit,
                              axis_label=f"{title} ({unit})", failed=failed) for key, title, unit, _ in FIGURES]

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        guests = step_guests(step)
        measured = any(g.get(f[0]) is not None for _, g in guests for f in FIGURES) or any(
            g.get("samples") is not None for _, g in guests)
        if not guests or not (about(step) or measured):
            return []
        return [Heading(4, "Guests"), guests_table(guests)]

