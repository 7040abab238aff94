"""The per-guest parts of a step's section, each a section of its own: the top symbols of its CPU samples
and the loss of its tracers (steps that traced), its softnet counters (steps that took statistics), and
its timeline for Perfetto (steps whose tracers a timeline can be made of; its piece of summary.json is
each guest's ``trace_json``, :mod:`labctl.trace.perfetto`, written beside the recording)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from labctl.bundle import Run, StepSummary, as_dict, as_list, fmt_num, step_guests, usable
from labctl.errors import LabctlError
from labctl.report.document import Block, Bullets, Heading, Inline, Para, Row, Span, Table, num, txt
from labctl.report.sections import Metric, ReportSection, StepFiles, kinds_of
from labctl.report.tracepoints import symbols_note
from labctl.trace import TRACE_JSON, GuestFigures, guest_trace, trace_summary, write_trace

log = logging.getLogger(__name__)
LOSS_FIELDS = (("perf_lost", "perf lost events"), ("ftrace_overruns", "ftrace overruns"),
               ("kprobe_misses", "kprobe misses"))


def symbols_blocks(guests: Sequence[tuple[str, GuestFigures]]) -> list[Block]:
    """Top symbols of every guest (CPU samples only, never tracepoint hits), or a note when there are none."""
    rows = tuple(Row((txt(name), txt(sym.get("symbol") or "?", "code"), txt(sym.get("dso") or "?", "code"),
                      num(sym.get("pct"))))
                 for name, g in guests for sym in as_list(g.get("top_symbols")) if isinstance(sym, dict))
    note = symbols_note(guests)
    blocks: list[Block] = [Heading(4, "Top symbols (CPU samples)")]
    if rows:
        blocks.append(Table(("guest", "symbol", "dso", "% of samples"), rows, frozenset({3})))
    if note:
        blocks.append(Para(txt(note), "muted"))
    elif not rows:
        blocks.append(Para(txt("no samples recorded"), "muted"))
    return blocks


def softnet_blocks(guests: Sequence[tuple[str, GuestFigures]]) -> list[Block]:
    """softnet_stat deltas of every guest."""
    rows = []
    for name, g in guests:
        sn = g.get("softnet")
        if isinstance(sn, dict):
            dropped = sn.get("dropped")
            rows.append(Row((txt(name), num(sn.get("processed")),
                             txt(fmt_num(dropped), "bad") if usable(dropped) else num(dropped),
                             num(sn.get("time_squeeze")))))
    if not rows:
        return [Heading(4, "Softnet"), Para(txt("not measured"), "muted")]
    return [Heading(4, "Softnet"), Table(("guest", "processed", "dropped", "time_squeeze"), tuple(rows),
                                         frozenset({1, 2, 3}))]


def _loss_item(name: str, guest: GuestFigures) -> Inline:
    loss = guest.get("trace_loss")
    lost_samples = usable(guest.get("lost_samples"))
    if not isinstance(loss, dict) and lost_samples is None:
        return (Span(f"{name}: "), Span("not measured", "muted"))
    counts = [(label, as_dict(loss).get(key)) for key, label in LOSS_FIELDS]
    if lost_samples != usable(as_dict(loss).get("perf_lost")):
        counts.append(("lost samples", guest.get("lost_samples")))
    lossy = [(label, v) for label, v in counts if usable(v)]
    if not lossy:
        return (Span(f"{name}: "), Span("none", "good"))
    return (Span(f"{name}: "), Span(", ".join(f"{label} {fmt_num(v)}" for label, v in lossy), "bad"))


def loss_blocks(guests: Sequence[tuple[str, GuestFigures]]) -> list[Block]:
    """Trace loss per guest: always present, 'none' when nothing was lost."""
    if not guests:
        return [Heading(4, "Trace loss"), Para(txt("not measured (no guest data)"), "muted")]
    return [Heading(4, "Trace loss"), Bullets(tuple(_loss_item(n, g) for n, g in guests))]


def timeline_blocks(guests: Sequence[tuple[str, GuestFigures]], step_dir: str) -> list[Block]:
    """Links to each guest's Perfetto trace (its skb_latency or ftrace recording as a timeline)."""
    items = []
    for name, g in guests:
        tj = as_dict(g.get("trace_json"))
        if tj.get("file"):
            slices = sum(v for v in as_dict(tj.get("slices")).values() if isinstance(v, int))
            href = f"{step_dir}/{name}/{tj['file']}"
            items.append((Span(f"{name}: "), Span(href, "code", href),
                          Span(f" ({tj.get('source')}: {fmt_num(slices)} slices, {fmt_num(tj.get('flows'))} packet "
                               f"flows, {tj.get('clock')} clock)", "muted")))
    if not items:
        return []
    return [Heading(4, "Timeline (Perfetto)"),
            Para(txt("One track per CPU: IRQ, softirq and NAPI slices, events, packets as flows. Open the file "
                     "at ui.perfetto.dev or chrome://tracing, as it is."), "muted"),
            Bullets(tuple(items))]


def step_dir_of(step: StepSummary) -> str:
    """The step's directory in the bundle (``steps/<step>/<variant>``)."""
    given = step.get("dir")
    if isinstance(given, str) and given:
        return given.strip("/")
    return f"steps/{step.get('name') or '_'}/{step.get('variant') or '_'}"


class ProfileSection(ReportSection):
    """The top symbols of a traced step's CPU samples."""

    name = "profile"
    kinds = ("trace",)

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return symbols_blocks(step_guests(step)) if "trace" in kinds_of(step) else []


class SoftnetSection(ReportSection):
    """Softnet counters of a step's guests (statistics snapshots); SNMP counters for compare."""

    name = "softnet"
    kinds = ("stats",)
    compare_groups = ((3, "softnet.", "Softnet"), (5, "snmp.", "SNMP counters (nstat)"))

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return softnet_blocks(step_guests(step)) if "stats" in kinds_of(step) else []

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        out: dict[str, Metric] = {}
        for guest, figs in step_guests(step):
            sn = as_dict(figs.get("softnet"))
            for key in ("dropped", "time_squeeze"):
                value = usable(sn.get(key))
                if value is not None:
                    out[f"softnet.{guest}.{key}"] = (value, f"{guest} softnet {key}", "", -1)
            for counter, value in as_dict(figs.get("snmp")).items():
                if usable(value) is not None:
                    out[f"snmp.{guest}.{counter}"] = (float(value), f"{guest} {counter}", "", 0)
        return out


class LossSection(ReportSection):
    """What a traced step's tracers lost."""

    name = "loss"
    kinds = ("trace",)

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return loss_blocks(step_guests(step)) if "trace" in kinds_of(step) else []


class TimelineSection(ReportSection):
    """Each guest's recording as a Perfetto timeline (``trace.json``)."""

    name = "timeline"

    def summarize(self, step: StepFiles) -> None:
        for g, gdir in step.guest_dirs():
            figs = step.entry["guests"][g]
            try:
                doc = guest_trace(gdir)
                if doc is not None:
                    write_trace(doc, gdir / TRACE_JSON)
                    figs["trace_json"] = trace_summary(doc)
            except (OSError, LabctlError) as exc:
                figs.setdefault("warnings", []).append(f"trace.json: {exc}")

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return timeline_blocks(step_guests(step), step_dir_of(step))
