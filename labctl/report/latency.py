"""The per-packet latency section, from the ``skb_latency`` figures in summary.json (:mod:`labctl.trace.skblatency`).

For each direction, one table puts the step variants (NIC models) side by
side, stage by stage, then a coverage table says how complete the picture
is (data segments, share followed end to end, why the rest was not, lost
events), and charts show the median per stage and the end-to-end
histogram. Figures are taken from the NIC under test (``by_nic``) when the
step names one, else from the guest's totals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from labctl.bundle import Run, StepSummary, as_dict, fmt_num, full_label, run_steps, step_guests, usable
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Charts, Heading, Para, Row, Span, Table, num, txt
from labctl.report.sections import Metric, ReportSection

if TYPE_CHECKING:
    from labctl.trace import DirectionFigures, GroupFigures, Latency, Lost, SkbLatency

DIRECTIONS = (("rx", "Receive: driver → app"), ("tx", "Transmit: app → driver"))
LATENCY_PCTS = ("p50", "p90", "p99")


@dataclass(frozen=True)
class Column:
    """A variant's column: its label, the guest, its figures (of the NIC under test when it has any,
    else the direction's) and the direction's."""

    label: str
    guest: str
    figs: GroupFigures
    totals: DirectionFigures


def _skb(value: object) -> SkbLatency:
    """A guest's ``skb_latency`` as summary.json has it (read back from JSON: each key read with ``get``)."""
    return cast("SkbLatency", as_dict(value))


def _direction(skb: SkbLatency, direction: str) -> DirectionFigures:
    return cast("DirectionFigures", as_dict(as_dict(skb).get(direction)))


def _latency(value: object) -> Latency:
    return cast("Latency", as_dict(value))


def _focus(step: StepSummary, direction: str) -> list[Column]:
    """The column of the step's guest with the most data segments in ``direction``
    (the receiver for rx, the sender for tx); figures of the NIC under test when it has any."""
    nic = as_dict(step.get("nic")).get("name")
    best: tuple[int, Column] | None = None
    for guest, figs in step_guests(step):
        skb = _direction(_skb(figs.get("skb_latency")), direction)
        part = cast("GroupFigures", as_dict(as_dict(skb.get("by_nic")).get(nic)) if nic else {})
        chosen: GroupFigures = part if part.get("data_segments") else skb
        count = chosen.get("data_segments") or 0
        if count and (best is None or count > best[0]):
            label = f"{full_label(step)} · {guest}" + (f" {nic}" if part.get("data_segments") else "")
            best = (count, Column(label, guest, chosen, skb))
    return [] if best is None else [best[1]]


def _columns(steps: Sequence[StepSummary], direction: str) -> list[Column]:
    return [c for s in steps for c in _focus(s, direction)]


def _stages(figs: GroupFigures) -> dict[str, Latency]:
    return {str(k): _latency(v) for k, v in as_dict(figs.get("stages")).items()}


def _cell(stats: Latency) -> tuple[Span, ...]:
    if not stats or not stats.get("count"):
        return (Span("n/a", "muted"),)
    return (Span(f"{fmt_num(stats.get('p50_us'))} / {fmt_num(stats.get('p90_us'))} / "
                 f"{fmt_num(stats.get('p99_us'))} / {fmt_num(stats.get('max_us'))}"),)


def stage_table(columns: list[Column], titles: Mapping[str, str]) -> Table:
    """Rows: stages and end to end; columns: variants; cells p50 / p90 / p99 / max in µs."""
    stages = list(_stages(columns[0].figs))
    rows = []
    for stage in [*stages, "end_to_end"]:
        title = "end to end" if stage == "end_to_end" else titles.get(stage, stage)
        cells = [txt(title, "b" if stage == "end_to_end" else "")]
        for c in columns:
            stats = c.figs.get("end_to_end") if stage == "end_to_end" else _stages(c.figs).get(stage)
            cells.append(_cell(_latency(stats)))
        rows.append(Row(tuple(cells)))
    headers = ("stage (µs: p50 / p90 / p99 / max)", *(c.label for c in columns))
    return Table(headers, tuple(rows), frozenset(range(1, len(columns) + 1)), "skb-stages")


def _reasons(figs: GroupFigures) -> str:
    reasons = as_dict(figs.get("not_followed"))
    return "; ".join(f"{n} {why}" for why, n in list(reasons.items())[:3]) or "–"


def coverage_table(columns: list[Column], lost: Mapping[str, Lost]) -> Table:
    rows = []
    for c in columns:
        label, figs, totals = c.label, c.figs, c.totals
        g_lost = cast("Lost", as_dict(lost.get(label)))
        misses = sum(v for v in as_dict(g_lost.get("kprobe_misses")).values() if isinstance(v, int))
        pct = figs.get("followed_pct")
        rows.append(Row((txt(label), num(figs.get("data_segments")), num(figs.get("followed")),
                         txt(f"{fmt_num(pct)}%" if pct is not None else "n/a", "" if (pct or 0) >= 90 else "bad"),
                         num(totals.get("fragments")), txt(_reasons(figs)),
                         num(g_lost.get("dropped_events")), num(misses))))
    return Table(("variant · guest", "data segments", "followed", "followed %", "cut by the trace window",
                  "not followed (top reasons)", "events lost", "kprobe misses"), tuple(rows),
                 frozenset({1, 2, 3, 4, 6, 7}), "skb-coverage")


def _charts(columns: list[Column], titles: Mapping[str, str], direction: str) -> Charts:
    labels = [c.label for c in columns]
    stages = list(_stages(columns[0].figs))
    svgs = [bar_chart_svg(f"{direction.upper()} median: {titles.get(s, s)}", labels,
                          [_latency(_stages(c.figs).get(s)).get("p50_us") for c in columns], "µs")
            for s in stages]
    for c in columns:
        label = c.label
        hist = as_dict(c.totals.get("histograms")).get("end_to_end") or []
        bins = [h for h in hist if isinstance(h, dict)]
        if bins:
            names = [f"{fmt_num(h.get('from_us'))}–{fmt_num(h.get('to_us'))} µs" if h.get("to_us") is not None
                     else f"≥ {fmt_num(h.get('from_us'))} µs" for h in bins]
            svgs.append(bar_chart_svg(f"{direction.upper()} end to end, {label}", names,
                                      [h.get("count") for h in bins], "packets"))
    return Charts(tuple(svgs))


def latency_blocks(run: Run) -> list[Block]:
    """The per-packet latency section; empty when no step traced skb latency."""
    steps = run_steps(run.summary)
    titles: dict[str, str] = {}
    lost: dict[str, Lost] = {}
    for s in steps:
        for guest, figs in step_guests(s):
            skb = _skb(figs.get("skb_latency"))
            titles.update({k: str(v) for k, v in as_dict(skb.get("stage_titles")).items()})
            for direction, _ in DIRECTIONS:
                for c in _focus(s, direction):
                    if c.guest == guest:
                        lost[c.label] = cast("Lost", as_dict(skb.get("lost")))
    blocks: list[Block] = []
    for direction, heading in DIRECTIONS:
        columns = _columns(steps, direction)
        if not columns:
            continue
        blocks += [Heading(3, heading), stage_table(columns, titles), coverage_table(columns, lost),
                   _charts(columns, titles, direction)]
    if not blocks:
        return []
    intro = Para(txt("Each packet is followed by its skb address; only packets followed end to end enter the "
                     "figures, so every stage is ≥ 0 and the stages add up to the end-to-end time. Per packet: "
                     "skb-latency-rx.csv and skb-latency-tx.csv; a netdev-times style timeline: "
                     "skb-timeline.txt, in each guest's step directory. The whole recording as a timeline, one "
                     "track per CPU with its IRQ, softirq and NAPI slices and every packet followed end to end "
                     "as a flow from driver to application: trace.json.gz, which ui.perfetto.dev (or "
                     "chrome://tracing) opens as it is, in the browser, without uploading it."), "muted")
    return [Heading(2, "Per-packet latency"), intro, *blocks]


def latency_metrics(step: StepSummary) -> dict[str, Metric]:
    """Every stage's percentiles, per guest and direction: of the NIC under test when it has them."""
    out: dict[str, Metric] = {}
    nic = as_dict(step.get("nic")).get("name")
    for guest, figs in step_guests(step):
        skb = as_dict(figs.get("skb_latency"))
        for direction in ("rx", "tx"):
            d = as_dict(skb.get(direction))
            part = as_dict(as_dict(d.get("by_nic")).get(nic)) if nic else {}
            src = part if part.get("followed") else d
            if not src.get("followed"):
                continue
            titles = as_dict(skb.get("stage_titles"))
            stages = [*as_dict(src.get("stages")).items(), ("end_to_end", src.get("end_to_end"))]
            for stage, stats in stages:
                for pct in LATENCY_PCTS:
                    value = usable(as_dict(stats).get(f"{pct}_us"))
                    if value is not None:
                        title = "end to end" if stage == "end_to_end" else str(titles.get(stage, stage))
                        out[f"latency.{guest}.{direction}.{stage}.{pct}"] = (
                            value, f"{guest} {direction.upper()} {title} {pct}", "µs", -1)
    return out


class LatencySection(ReportSection):
    """Per-packet latency, stage by stage (see the module docstring)."""

    name = "latency"
    kinds = ("trace",)
    compare_groups = ((2, "latency.", "Per-packet latency"),)

    def blocks(self, run: Run) -> list[Block]:
        return latency_blocks(run)

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        return latency_metrics(step)
