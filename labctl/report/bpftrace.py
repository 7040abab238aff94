"""A step's bpftrace programs: each guest's maps as tables and its histograms as charts (:mod:`labctl.trace.bpfmaps`).

Its piece of the step's summary entry is ``bpftrace``: per guest the program's maps (keyed ones: the
biggest entries), histograms and stats, from ``bpftrace.json`` in the guest's step directory;
``labctl compare`` gets each scalar map and each keyed map's biggest entries.
"""

from __future__ import annotations

from pathlib import Path

from labctl.bundle import Run, StepSummary, as_dict, as_list, fmt_num
from labctl.report.charts import bar_chart_svg
from labctl.report.document import Block, Charts, Heading, Para, Row, Table, num, txt
from labctl.report.sections import Metric, ReportSection, StepFiles
from labctl.trace import BPFTRACE_JSON, BpftraceSummary, bpftrace_summary, bucket_label

ENTRIES_SHOWN = 10


def summarize_bpftrace(step_dir: Path, guests: list[str]) -> dict[str, BpftraceSummary] | None:
    out: dict[str, BpftraceSummary] = {}
    for g in guests:
        try:
            text = (step_dir / g / BPFTRACE_JSON).read_text(errors="replace")
        except OSError:
            continue
        out[g] = bpftrace_summary(text)
    return out or None


def bpftrace_blocks(step: StepSummary) -> list[Block]:
    per_guest = as_dict(step.get("bpftrace"))
    if not per_guest:
        return []
    blocks: list[Block] = [Heading(4, "bpftrace")]
    for g, s in per_guest.items():
        s = as_dict(s)
        rows = []
        for name, m in as_dict(s.get("maps")).items():
            m = as_dict(m)
            if "value" in m:
                rows.append(Row((txt(name, "code"), txt("–"), num(m.get("value")))))
            for k, v in as_list(m.get("entries"))[:ENTRIES_SHOWN]:
                rows.append(Row((txt(name, "code"), txt(k, "code"), num(v))))
            more = int(m.get("count") or 0) - min(ENTRIES_SHOWN, len(as_list(m.get("entries"))))
            if more > 0:
                rows.append(Row((txt(name, "code"), txt(f"{more} more keys", "muted"), txt(""))))
        for name, st in as_dict(s.get("stats")).items():
            st = as_dict(st)
            rows.append(Row((txt(name, "code"), txt("count / average / total"),
                             txt(f"{fmt_num(st.get('count'))} / {fmt_num(st.get('average'))} / {fmt_num(st.get('total'))}"))))
        head = f"{g}: {s.get('probes', 0)} probes attached" + (f", {s['lost']} events lost" if s.get("lost") else "")
        blocks.append(Para(txt(head), "muted"))
        if rows:
            blocks.append(Table(("map", "key", "value"), tuple(rows), frozenset({2}), "bpftrace"))
        svgs = []
        for name, keyed in as_dict(s.get("hists")).items():
            for key, bins in as_dict(keyed).items():
                bins = [as_dict(b) for b in as_list(bins)]
                if bins:
                    title = f"{g} {name}" + (f"[{key}]" if key else "")
                    svgs.append(bar_chart_svg(title, [bucket_label(b) for b in bins],
                                              [b.get("count") for b in bins], "count"))
        if svgs:
            blocks.append(Charts(tuple(svgs)))
    return blocks


def bpftrace_metrics(step: StepSummary) -> dict[str, Metric]:
    out: dict[str, Metric] = {}
    for g, s in as_dict(step.get("bpftrace")).items():
        for name, m in as_dict(as_dict(s).get("maps")).items():
            m = as_dict(m)
            if isinstance(m.get("value"), (int, float)):
                out[f"bpftrace.{g}.{name}"] = (float(m["value"]), f"{g} {name}", "", 0)
            for k, v in as_list(m.get("entries"))[:ENTRIES_SHOWN]:
                out[f"bpftrace.{g}.{name}[{k}]"] = (float(v), f"{g} {name}[{k}]", "", 0)
    return out


class BpftraceSection(ReportSection):
    """Each step's bpftrace maps and histograms (see the module docstring)."""

    name = "bpftrace"
    kinds = ("trace",)
    compare_groups = ((10, "bpftrace.", "bpftrace maps"),)

    def summarize(self, step: StepFiles) -> None:
        got = summarize_bpftrace(step.dir, [g for g, _ in step.guest_dirs()])
        if got is not None:
            step.entry["bpftrace"] = got

    def step_blocks(self, run: Run, step: StepSummary) -> list[Block]:
        return bpftrace_blocks(step)

    def metrics(self, step: StepSummary) -> dict[str, Metric]:
        return bpftrace_metrics(step)
