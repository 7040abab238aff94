"""The flame graph section: one per guest and variant, and differential ones between the variants of a step.

Its piece of summary.json: each guest's ``flamegraph`` (:func:`labctl.trace.flamefold.guest_flamegraph`),
its stacks written beside the recording as ``flamegraph.folded``. From those files
:func:`flame_blocks` writes each graph as a standalone SVG into the bundle
(``flamegraph.svg`` beside its folded file; differential graphs as
:func:`labctl.bundle.layout.diff_flamegraph` names them) and returns the
same graphs inline for report.html, searchable by function name (the page's
one script, :data:`labctl.report.flamegraph.SCRIPT`), kernel modules each in their
own colour. A differential graph is drawn for every variant against the
step's first (say rtl8139 against virtio-net-pci is "after" virtio, "before"
rtl8139): frames sized by the later variant, red where their share grew.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from labctl.bundle import (
    FLAMEGRAPH_FOLDED,
    FLAMEGRAPH_SVG,
    Run,
    StepSummary,
    as_dict,
    diff_flamegraph,
    fmt_num,
    is_failed,
    nic_model,
    run_steps,
    step_guests,
)
from labctl.paths import atomic_write
from labctl.report.document import Block, Graphic, Heading, Para, Span, txt
from labctl.report.flamegraph import render_diff_svg, render_svg
from labctl.report.sections import ReportSection, StepFiles
from labctl.trace import FlameFigures, Stack, guest_flamegraph, read_folded

log = logging.getLogger(__name__)

INLINE_WIDTH = 1150
INLINE_MIN_WIDTH = 0.5  # px: thinner frames are left out of the inline graphs (the files keep 0.1 px)


def _id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", text)


def _graphs(run: Run) -> list[tuple[StepSummary, str, FlameFigures, Path]]:
    """(step, guest, flame figures, guest directory) of every guest with folded stacks."""
    out: list[tuple[StepSummary, str, FlameFigures, Path]] = []
    for step in run_steps(run.summary):
        for guest, figs in step_guests(step):
            fg = figs.get("flamegraph")
            if isinstance(fg, dict) and fg.get("folded") and step.get("dir"):
                gdir = run.dir / str(step["dir"]) / guest
                if (gdir / str(fg["folded"])).is_file():
                    out.append((step, guest, fg, gdir))
    return out


def _subtitle(step: StepSummary, guest: str, fg: FlameFigures) -> str:
    driver = fg.get("driver")
    if not isinstance(driver, dict):
        return f"{guest}, {fg.get('event')}"
    mods = ", ".join(driver.get("modules") or [])
    share = f"; driver {mods}: {fmt_num(driver.get('pct'))}% of samples" if mods and driver.get("pct") else ""
    return f"{guest}, {fg.get('event')}{share}"


def _write(path: Path, text: str) -> bool:
    try:
        atomic_write(path, text)
        return True
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)
        return False


def _variant_graph(run: Run, step: StepSummary, guest: str, fg: FlameFigures, gdir: Path,
                   stacks: dict[Stack, int], n: int) -> Graphic:
    label = f"{step.get('name')} / {nic_model(step) or '–'}" + (f" (run {step['repeat']})"
                                                                if (step.get("repeat") or 1) > 1 else "")
    title = f"Flame graph: {label}"
    sub = _subtitle(step, guest, fg)
    path = gdir / FLAMEGRAPH_SVG
    href = path.relative_to(run.dir).as_posix() if _write(path, render_svg(stacks, title=title, subtitle=sub)) else None
    svg = render_svg(stacks, title=title, subtitle=sub, inline=True, id_prefix=f"fg{n}-", width=INLINE_WIDTH,
                     min_width=INLINE_MIN_WIDTH, with_script=False)
    return Graphic(svg, (Span(f"{label} · {guest}: ", "b"),
                         Span("click a frame to zoom, Search to highlight functions by name (text or /regex/)")),
                   href, script=True)


def _diff_graph(run: Run, step: StepSummary, base: StepSummary, guest: str,
                before: dict[Stack, int], after: dict[Stack, int], n: int) -> Graphic:
    a, b = nic_model(base) or "first", nic_model(step) or "second"
    title = f"Differential flame graph: {b} against {a}"
    sub = f"{step.get('name')}, {guest}; red: larger share of the samples in {b}, blue: smaller"
    rel = diff_flamegraph(str(step.get("name")), guest, a, b)
    ok = _write(run.dir / rel, render_diff_svg(before, after, title=title, subtitle=sub))
    svg = render_diff_svg(before, after, title=title, subtitle=sub, inline=True, id_prefix=f"fg{n}-",
                          width=INLINE_WIDTH, min_width=INLINE_MIN_WIDTH, with_script=False)
    return Graphic(svg, (Span(f"{b} against {a} · {guest}: ", "b"),
                         Span(f"frames sized by {b}'s samples, coloured by how their share changed from {a}")),
                   rel.as_posix() if ok else None, script=True)


def flame_blocks(run: Run) -> list[Block]:
    """Write every flame graph SVG into the bundle and return the report's flame graph section."""
    graphs = _graphs(run)
    if not graphs:
        return []
    blocks: list[Block] = [Heading(2, "Flame graphs"), Para(txt(
        "Every sample of the guest's perf recording with its call stack, the widest frames the most sampled. "
        "Colours: kernel core orange, each kernel module its own hue, user space green, the process sand."),
        "muted")]
    first: dict[tuple[str, str], tuple[StepSummary, dict[Stack, int]]] = {}
    n = 0
    for step, guest, fg, gdir in graphs:
        try:
            stacks = read_folded((gdir / str(fg["folded"])).read_text(errors="replace"))
        except OSError as exc:
            blocks.append(Para(txt(f"{gdir.name}: cannot read {fg['folded']}: {exc}"), "alert"))
            continue
        n += 1
        blocks.append(_variant_graph(run, step, guest, fg, gdir, stacks, n))
        if is_failed(step.get("status")) or (step.get("repeat") or 1) > 1:
            continue
        key = (str(step.get("name")), guest)
        if key not in first:
            first[key] = (step, stacks)
        elif nic_model(step) != nic_model(first[key][0]):
            n += 1
            base, before = first[key]
            blocks.append(_diff_graph(run, step, base, guest, before, stacks, n))
    return blocks


class FlamesSection(ReportSection):
    """Flame graphs (see the module docstring)."""

    name = "flames"
    kinds = ("trace",)

    def summarize(self, step: StepFiles) -> None:
        modules = as_dict(step.entry.get("nic")).get("modules") or []
        for g, gdir in step.guest_dirs():
            figs = step.entry["guests"][g]
            try:
                fg = guest_flamegraph(gdir, modules)
                if fg is None:
                    continue
                info, text = fg
                info["folded"] = FLAMEGRAPH_FOLDED if info.get("event") else None
                if info["folded"]:
                    atomic_write(gdir / FLAMEGRAPH_FOLDED, text)
                figs["flamegraph"] = info
            except OSError as exc:
                figs.setdefault("warnings", []).append(f"flame graph: {exc}")

    def blocks(self, run: Run) -> list[Block]:
        return flame_blocks(run)
