"""The "Tracepoint counts" section: events × commands, with totals and rates, per step variant.

From the ``tracepoints`` figures of each guest (:mod:`labctl.trace.tpcounts`):
perf records every hit of a tracepoint, so these are counts of events (how
many packets were queued, by whom), never CPU samples; the "Top symbols"
tables of the steps hold only sampling events. For each recording: one table
with a row per event and a column per command (the busiest ones), the total
and the rate per second of the step's window; a per-CPU table when the guest
has more than one CPU; a chart of the totals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from labctl.bundle import Run, StepSummary, as_dict, as_list, fmt_num, full_label, run_steps, step_guests, usable
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Charts, Heading, Para, Row, Table, num, txt
from labctl.report.sections import Metric, ReportSection
from labctl.trace import GuestFigures

if TYPE_CHECKING:
    from labctl.trace import CountSource, EventCount

MAX_COLUMNS = 6  # commands shown as columns; the rest are summed in "other"


def _counts(value: object) -> dict[str, EventCount]:
    """A recording's ``events`` as summary.json has them (read back from JSON: each count read with ``get``,
    one that is not an object as an empty one)."""
    return {str(k): cast("EventCount", as_dict(v)) for k, v in as_dict(value).items()}


def _columns(events: Mapping[str, EventCount]) -> list[str]:
    """The commands with the most events over all the recording's events."""
    totals: dict[str, int] = {}
    for e in events.values():
        for comm, n in as_dict(e.get("by_comm")).items():
            if isinstance(n, int):
                totals[comm] = totals.get(comm, 0) + n
    return [c for c, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_COLUMNS]]


def events_table(events: Mapping[str, EventCount]) -> Table:
    """Rows: events; columns: the busiest commands, the rest, the total and the rate per second."""
    comms = _columns(events)

    def rest(e: EventCount) -> int:
        return sum(n for c, n in as_dict(e.get("by_comm")).items() if c not in comms and isinstance(n, int))

    others = any(rest(e) for e in events.values())
    rows = []
    for event, e in events.items():
        by_comm = as_dict(e.get("by_comm"))
        cells = [txt(event, "code"), *(num(by_comm.get(c, 0)) for c in comms)]
        if others:
            cells.append(num(rest(e)))
        rows.append(Row((*cells, txt(fmt_num(e.get("total")), "b"), num(e.get("rate_per_s")))))
    headers = ("event", *comms, *(("other commands",) if others else ()), "total", "per second")
    return Table(headers, tuple(rows), frozenset(range(1, len(headers))), "tracepoints")


def cpu_table(events: Mapping[str, EventCount]) -> Table | None:
    """Rows: events; columns: CPUs; None when every event was seen on one CPU only."""
    cpus = sorted({cpu for e in events.values() for cpu in as_dict(e.get("by_cpu"))}, key=int)
    if len(cpus) < 2:
        return None
    rows = tuple(Row((txt(event, "code"), *(num(as_dict(e.get("by_cpu")).get(c, 0)) for c in cpus)))
                 for event, e in events.items())
    return Table(("event", *(f"CPU {c}" for c in cpus)), rows, frozenset(range(1, len(cpus) + 1)), "tracepoints-cpu")


def _recording_blocks(title: str, source: CountSource) -> list[Block]:
    events = _counts(source.get("events"))
    if not events:
        return []
    blocks: list[Block] = [Heading(4, f"{title} · {source.get('source')} ({source.get('file')})"),
                           events_table(events)]
    lost = source.get("lost")
    if isinstance(lost, int) and lost > 0:
        blocks.append(Para(txt(f"{source.get('source')} lost {lost} events: its ring buffer filled faster than "
                               "they were read (trace-stat.txt), so these counts are lower bounds; a larger "
                               "buffer_kb keeps them"), "callout"))
    per_cpu = cpu_table(events)
    if per_cpu is not None:
        blocks.append(per_cpu)
    names = list(events)
    blocks.append(Charts((bar_chart_svg(f"{title}: {source.get('source')}", names,
                                        [events[n].get("total") for n in names], "events",
                                        axis_label="events counted"),)))
    return blocks


def tracepoint_blocks(run: Run) -> list[Block]:
    """The tracepoint counts of every step variant and guest; empty when nothing recorded tracepoints."""
    blocks: list[Block] = []
    for step in run_steps(run.summary):
        for guest, figs in step_guests(step):
            for source in as_list(figs.get("tracepoints")):
                if isinstance(source, dict):
                    blocks += _recording_blocks(f"{full_label(step)} · {guest}", cast("CountSource", source))
    if not blocks:
        return []
    intro = Para(txt("perf records every hit of a tracepoint (and of a probe): these are counts of events, by the "
                     "command that was running and by CPU, not samples of CPU time. Rates are per second of the "
                     "step's commands."), "muted")
    return [Heading(2, "Tracepoint counts"), intro, *blocks]


def is_tracepoint_recording(guest: GuestFigures) -> bool:
    """Whether the guest's perf recording held tracepoints only (no CPU samples to show symbols of)."""
    events = as_dict(guest.get("perf_events"))
    return bool(events.get("tracepoints")) and not events.get("sampling")


def symbols_note(guests: Sequence[tuple[str, GuestFigures]]) -> str | None:
    """Why a step has no top symbols although perf ran: it recorded tracepoints only."""
    names = [name for name, g in guests if is_tracepoint_recording(g)]
    if not names:
        return None
    return (f"{', '.join(names)}: perf recorded tracepoints only; their hits are counts, not CPU samples "
            "(see Tracepoint counts).")


class TracepointSection(ReportSection):
    """Tracepoint counts (see the module docstring)."""

    name = "tracepoints"
    kinds = ("trace",)
    compare_groups = ((4, "tracepoints.", "Tracepoint counts"),)

    def blocks(self, run: Run) -> list[Block]:
        return tracepoint_blocks(run)

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        out: dict[str, Metric] = {}
        for guest, figs in step_guests(step):
            for source in as_list(figs.get("tracepoints")):
                for event, e in as_dict(as_dict(source).get("events")).items():
                    value = usable(as_dict(e).get("total"))
                    if value is not None:
                        key = f"tracepoints.{guest}.{as_dict(source).get('source')}.{event}"
                        out[key] = (value, f"{guest} {event} ({as_dict(source).get('source')})", "events", 0)
        return out
