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
from typing import Any

from labctl.bundle import Run, StepSummary, as_dict, fmt_num, full_label, run_steps, step_guests, usable
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Charts, Heading, Para, Row, Span, Table, num, txt
from labctl.report.sections import Metric, ReportSection

DIRECTIONS = (("rx", "Receive: driver → app"), ("tx", "Transmit: app → driver"))
LATENCY_PCTS = ("p50", "p90", "p99")


def _focus(step: StepSummary, direction: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(column label, guest, figures) of the step's guest with the most data segments in ``direction``
    (the receiver for rx, the sender for tx); figures of the NIC under test when it has any."""
    nic = as_dict(step.get("nic")).get("name")
    best: tuple[int, str, str, dict[str, Any]] | None = None
    for guest, figs in step_guests(step):
        skb = as_dict(as_dict(figs.get("skb_latency")).get(direction))
        part = as_dict(as_dict(skb.get("by_nic")).get(nic)) if nic else {}
        chosen = part if part.get("data_segments") else skb
        count = chosen.get("data_segments") or 0
        if count and (best is None or count > best[0]):
            label = f"{full_label(step)} · {guest}" + (f" {nic}" if part.get("data_segments") else "")
            best = (count, label, guest, {**chosen, "totals": skb})
    return [] if best is None else [best[1:]]


def _columns(steps: Sequence[StepSummary], direction: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [c for s in steps for c in _focus(s, direction)]


def _cell(stats: Mapping[str, Any]) -> tuple[Span, ...]:
    if not stats or not stats.get("count"):
        return (Span("n/a", "muted"),)
    return (Span(f"{fmt_num(stats.get('p50_us'))} / {fmt_num(stats.get('p90_us'))} / "
                 f"{fmt_num(stats.get('p99_us'))} / {fmt_num(stats.get('max_us'))}"),)


def stage_table(columns: list[tuple[str, str, dict[str, Any]]], titles: Mapping[str, str]) -> Table:
    """Rows: stages and end to end; columns: variants; cells p50 / p90 / p99 / max in µs."""
    stages = list(as_dict(columns[0][2].get("stages")))
    rows = []
    for stage in [*stages, "end_to_end"]:
        title = "end to end" if stage == "end_to_end" else titles.get(stage, stage)
        cells = [txt(title, "b" if stage == "end_to_end" else "")]
        for _, _, figs in columns:
            stats = figs.get("end_to_end") if stage == "end_to_end" else as_dict(figs.get("stages")).get(stage)
            cells.append(_cell(as_dict(stats)))
        rows.append(Row(tuple(cells)))
    headers = ("stage (µs: p50 / p90 / p99 / max)", *(label for label, _, _ in columns))
    return Table(headers, tuple(rows), frozenset(range(1, len(columns) + 1)), "skb-stages")


def _reasons(figs: Mapping[str, Any]) -> str:
    reasons = as_dict(figs.get("not_followed"))
    return "; ".join(f"{n} {why}" for why, n in list(reasons.items())[:3]) or "–"


def coverage_table(columns: list[tuple[str, str, dict[str, Any]]], lost: Mapping[str, dict[str, Any]]) -> Table:
    rows = []
    for label, guest, figs in columns:
        totals = as_dict(figs.get("totals"))
        g_lost = as_dict(lost.get(label))
        misses = sum(v for v in as_dict(g_lost.get("kprobe_misses")).values() if isinstance(v, int))
        pct = figs.get("followed_pct")
        rows.append(Row((txt(label), num(figs.get("data_segments")), num(figs.get("followed")),
                         txt(f"{fmt_num(pct)}%" if pct is not None else "n/a", "" if (pct or 0) >= 90 else "bad"),
                         num(totals.get("fragments")), txt(_reasons(figs)),
                         num(g_lost.get("dropped_events")), num(misses))))
    return Table(("variant · guest", "data segments", "followed", "followed %", "cut by the trace window",
                  "not followed (top reasons)", "events lost", "kprobe misses"), tuple(rows),
                 frozenset({1, 2, 3, 4, 6, 7}), "skb-coverage")


def _charts(columns: list[tuple[str, str, dict[str, Any]]], titles: Mapping[str, str], direction: str) -> Charts:
    labels = [label for label, _, _ in columns]
    stages = list(as_dict(columns[0][2].get("stages")))
    svgs = [bar_chart_svg(f"{direction.upper()} median: {titles.get(s, s)}", labels,
                          [as_dict(as_dict(f.get("stages")).get(s)).get("p50_us") for _, _, f in columns], "µs")
            for s in stages]
    for label, _, figs in columns:
        hist = as_dict(as_dict(figs.get("totals")).get("histograms")).get("end_to_end") or []
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
    lost: dict[str, dict[str, Any]] = {}
    for s in steps:
        for guest, figs in step_guests(s):
            skb = as_dict(figs.get("skb_latency"))
            titles.update({k: str(v) for k, v in as_dict(skb.get("stage_titles")).items()})
            for direction, _ in DIRECTIONS:
                for label, g, _ in _focus(s, direction):
                    if g == guest:
                        lost[label] = as_dict(skb.get("lost"))
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
