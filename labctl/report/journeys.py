"""The followed packets of a step (its ``follow:``): paths grouped, dropped and lost ones first.

Its piece of the step's summary entry is ``follow`` (:func:`labctl.trace.analyze_follow`: totals by
end, the clocks' bounds, the paths with each hop's latency percentiles), computed from the raw files
in ``<step>/follow/`` by ``labctl run`` and again by ``labctl report``; every packet's path is in
``journey.json`` and the Perfetto timeline in ``journey-trace.json.gz`` beside it.
"""

from __future__ import annotations

from typing import cast

from labctl.bundle import Run, StepSummary, as_dict, as_list, fmt_num
from labctl.report.document import Block, Heading, Para, Row, Span, Table, num, txt
from labctl.report.sections import Metric, ReportSection, StepFiles
from labctl.trace import FollowSummary, PathHop, analyze_follow

PATHS_SHOWN = 8


def _hop_name(h: PathHop) -> str:
    if h.get("point") == "wire":
        return f"wire {h.get('where')}"
    return (f"{h.get('guest')} {h.get('where')}" + (f" {h.get('dev')}" if h.get("dev") else "")
            + (f" · {h.get('note')}" if h.get("note") else ""))


def _hops(value: object) -> list[PathHop]:
    """A path's hops as summary.json has them (read back from JSON: each read with ``get``)."""
    return [cast("PathHop", as_dict(h)) for h in as_list(value)]


def _clocks(f: FollowSummary) -> str:
    parts = []
    for g, c in (f.get("clocks") or {}).items():
        bound = c.get("bound_us") if isinstance(c, dict) else None
        parts.append(f"{g} ±{fmt_num(bound)} µs" if bound is not None else f"{g} unknown")
    return ", ".join(parts)


def follow_blocks(step: StepSummary, step_dir: str) -> list[Block]:
    f = step.get("follow")
    if not isinstance(f, dict) or not f:
        return []
    t = as_dict(f.get("totals"))
    by_end = ", ".join(f"{n} {k}" for k, n in as_dict(t.get("by_end")).items())
    blocks: list[Block] = [Heading(4, "Followed packets"),
                           Para((Span(f"filter '{f.get('filter') or ''}' on {', '.join(as_list(f.get('guests')))}: "),
                                 Span(f"{t.get('packets', 0)} packets", "b"), Span(f" ({by_end or 'none'}); "),
                                 Span(f"hops out of order beyond the clocks' bounds: {t.get('out_of_order_hops', 0)}",
                                      "bad" if t.get("out_of_order_hops") else ""),
                                 Span(f"; clocks: {_clocks(f)}", "muted")))]
    for p in as_list(f.get("paths"))[:PATHS_SHOWN]:
        p = as_dict(p)
        end = as_dict(p.get("end"))
        bad = end.get("kind") in ("dropped", "lost")
        blocks.append(Para((Span(f"{p.get('count')} × ", "b"), Span(str(p.get("example")), "code"),
                            Span(f": {end.get('text')}", "bad" if bad else ""))))
        rows = [Row((txt(_hop_name(h), "code"), num(h.get("p50_us")), num(h.get("p90_us")), num(h.get("p99_us")),
                     num(h.get("max_us")))) for h in _hops(p.get("hops"))]
        total = as_dict(p.get("total"))
        rows.append(Row((txt("first hop → last", "b"), num(total.get("p50_us")), num(total.get("p90_us")),
                         num(total.get("p99_us")), num(total.get("max_us")))))
        blocks.append(Table(("hop (µs since the previous)", "p50", "p90", "p99", "max"), tuple(rows),
                            frozenset({1, 2, 3, 4}), "journey"))
    more = len(as_list(f.get("paths"))) - PATHS_SHOWN
    notes = [f"{more} more paths in journey.json"] if more > 0 else []
    notes += [f"{g}: {n} events lost" for g, n in as_dict(f.get("lost_events")).items() if n]
    notes += [str(w) for w in as_list(f.get("warnings"))]
    notes.append(f"every packet's path: {step_dir}/{f.get('journey')}; a timeline for ui.perfetto.dev (one track "
                 f"per guest, an arrow per packet): {step_dir}/{f.get('timeline')}")
    blocks.append(Para(txt("; ".join(notes)), "muted"))
    return blocks


def follow_metrics(step: StepSummary) -> dict[str, Metric]:
    f = as_dict(step.get("follow"))
    t = as_dict(f.get("totals"))
    if not t:
        return {}
    out: dict[str, Metric] = {"follow.packets": (float(t.get("packets") or 0), "followed packets", "packets", 0),
                              "follow.out_of_order": (float(t.get("out_of_order_hops") or 0),
                                                      "hops out of order", "hops", -1),
                              "follow.nat": (float(t.get("nat_rewritten") or 0), "packets rewritten by NAT", "packets", 0)}
    for rule, n in as_dict(t.get("dropped_by_rule")).items():
        out[f"follow.rule.{rule}"] = (float(n), f"packets dropped by {rule}", "packets", -1)
    for kind, n in as_dict(t.get("by_end")).items():
        out[f"follow.end.{kind}"] = (float(n), f"packets {kind}", "packets", -1 if kind in ("dropped", "lost") else 0)
    return out


class FollowSection(ReportSection):
    """A step's followed packets (see the module docstring)."""

    name = "follow"
    kinds = ("follow",)
    compare_groups = ((9, "follow.", "Followed packets"),)

    def summarize(self, step: StepFiles) -> None:
        got = analyze_follow(step.dir)
        if got is not None:
            step.entry["follow"] = got

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return follow_blocks(step, str(step.get("dir") or ""))

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        return follow_metrics(step)
