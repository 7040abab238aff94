"""The report's results: one row per step (its status, and each section's columns for the steps it
is about), the comparison sentence, each section's charts and the run-to-run spread of the
headline figures."""

from __future__ import annotations

from collections.abc import Sequence

from labctl.bundle import (
    Run,
    StepSummary,
    as_dict,
    as_list,
    fmt_num,
    is_failed,
    run_steps,
    variant_text,
)
from labctl.report.document import (
    Block,
    Charts,
    Heading,
    Inline,
    Para,
    Row,
    Table,
    num,
    txt,
)
from labctl.report.registry import SECTIONS, headline
from labctl.report.sections import Column
from labctl.report.throughput import comparison_sentence


def status_cell(status: object) -> Inline:
    """A step's status as its cell: upper case and marked bad when it failed."""
    text = str(status or "unknown")
    return txt(text.upper() if is_failed(status) else text, "bad" if is_failed(status) else "")


def results_table(steps: Sequence[StepSummary]) -> Table:
    """One row per step: its status, and each section's columns (the driver when a step names a NIC)."""
    driver = any(as_dict(s.get("nic")) for s in steps)
    frame = [Column("step", lambda s: txt(s.get("name") or "?"), False),
             Column("variant / NIC model", lambda s: txt(variant_text(s)), False)]
    if driver:
        frame.append(Column("driver", lambda s: txt(as_dict(s.get("nic")).get("driver") or "–",
                                                   "code" if as_dict(s.get("nic")).get("driver") else ""), False))
    frame.append(Column("status", lambda s: status_cell(s.get("status")), False))
    columns = frame + [c for section in SECTIONS for c in section.columns(steps)]
    rows = tuple(Row(tuple(c.cell(s) for c in columns), "failed" if is_failed(s.get("status")) else "") for s in steps)
    return Table(tuple(c.header for c in columns), rows,
                 frozenset(i for i, c in enumerate(columns) if c.numeric), "results")


def results_blocks(run: Run) -> list[Block]:
    """The results table, the comparison sentence, each section's charts and the spread."""
    steps = run_steps(run.summary)
    if not steps:
        return [Heading(2, "Results"), Para(txt("No step produced results."), "muted")]
    accel = run.summary.get("accel") or run.manifest.get("accel")
    sentence = run.summary.get("comparison") or comparison_sentence(steps, accel)
    blocks: list[Block] = [Heading(2, "Results"), results_table(steps)]
    if sentence:
        blocks.append(Para(txt(sentence, "b"), "callout"))
    svgs = tuple(svg for section in SECTIONS for svg in section.charts(steps))
    return blocks + ([Charts(svgs)] if svgs else []) + spread_blocks(run)


def spread_blocks(run: Run) -> list[Block]:
    """Run-to-run spread of the headline figures for variants run several times (``repeat:``)."""
    rows = []
    for sp in as_list(run.summary.get("spreads")):
        if not isinstance(sp, dict):
            continue
        metrics = as_dict(sp.get("metrics"))
        for key, label, unit, _ in headline():
            m = as_dict(metrics.get(key))
            if m:
                rows.append(Row((txt(f"{sp.get('name')} / {sp.get('variant') or '–'}"), txt(f"{label} ({unit})"),
                                 num(m.get("n")), num(m.get("mean")), num(m.get("sd")),
                                 txt(f"{fmt_num(m.get('min'))} – {fmt_num(m.get('max'))}"))))
    if not rows:
        return []
    return [Heading(3, "Run-to-run spread"),
            Para(txt("Variants run several times (repeat:): the mean, standard deviation and range of each figure "
                     "over the runs that did not fail. labctl compare uses this spread as the noise."), "muted"),
            Table(("variant", "figure", "runs", "mean", "sd", "min – max"), tuple(rows), frozenset({2, 3, 4}),
                  "spread")]
