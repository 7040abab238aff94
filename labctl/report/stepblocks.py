"""The report's parts after the sections: one section per step (its meta, each report section's
part of it, its warnings and its files), the commands the run executed and the run's own files."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from labctl.bundle import (
    MANIFEST,
    SUMMARY,
    Run,
    StepSummary,
    as_dict,
    as_list,
    full_label,
    is_failed,
    run_steps,
    step_guests,
    usable,
)
from labctl.report.document import (
    Block,
    Bullets,
    Heading,
    Inline,
    Meta,
    Para,
    Row,
    Section,
    Span,
    Table,
    num,
    txt,
)
from labctl.report.guest_parts import step_dir_of
from labctl.report.header import fmt_duration
from labctl.report.registry import SECTIONS
from labctl.report.results import status_cell
from labctl.trace import GuestFigures

MAX_ARTIFACTS = 200


def _nic_line(nic: Mapping[str, Any]) -> Inline:
    if not nic:
        return txt("none recorded", "muted")
    where = f"{nic.get('guest') or '?'} {nic.get('name') or '?'}"
    mods = ", ".join(str(m) for m in as_list(nic.get("modules")))
    spans = [Span(where, "code"), Span(f": {nic.get('model') or '?'}, driver "),
             Span(str(nic.get("driver") or "unknown"), "code")]
    if mods:
        spans.append(Span(f" (modules: {mods})"))
    return tuple(spans)


def _step_meta(step: StepSummary, step_dir: str) -> Meta:
    rows: list[tuple[str, Inline]] = [("status", status_cell(step.get("status")))]
    if step.get("reason"):
        rows.append(("reason", txt(step["reason"], "bad" if is_failed(step.get("status")) else "")))
    rows += [("duration", txt(fmt_duration(usable(step.get("duration_s"))))),
             ("NIC", _nic_line(as_dict(step.get("nic")))), ("directory", txt(step_dir, "code"))]
    return Meta(tuple(rows))


def warning_blocks(step: StepSummary, guests: Sequence[tuple[str, GuestFigures]]) -> list[Block]:
    """Warnings of the step and of its guests."""
    items = [txt(str(w)) for w in as_list(step.get("warnings"))]
    items += [(Span(f"{name}: ", "b"), Span(str(w))) for name, g in guests for w in as_list(g.get("warnings"))]
    if not items:
        return [Heading(4, "Warnings"), Para(txt("none"), "muted")]
    return [Heading(4, "Warnings"), Bullets(tuple(items), "warnings")]


def _human_size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            break
    return f"{value:.1f} {unit}"


def artifact_links(root: Path, rel_dir: str) -> list[Block]:
    """Links (relative to the run directory) to every file under ``rel_dir``."""
    base = (root / rel_dir).resolve()
    if not base.is_relative_to(root) or not base.is_dir():
        return [Para(txt(f"no artifacts in {rel_dir}/"), "muted")]
    files = sorted(p for p in base.rglob("*") if p.is_file() and p.resolve().is_relative_to(root))
    items = tuple((Span(p.relative_to(base).as_posix(), "code", p.relative_to(root).as_posix()),
                   Span(f" {_human_size(p.stat().st_size)}", "muted")) for p in files[:MAX_ARTIFACTS])
    blocks: list[Block] = [Bullets(items, "artifacts")] if items else [Para(txt(f"no files in {rel_dir}/"), "muted")]
    if len(files) > MAX_ARTIFACTS:
        blocks.append(Para(txt(f"… and {len(files) - MAX_ARTIFACTS} more files in {rel_dir}/"), "muted"))
    return blocks


def step_section(run: Run, step: StepSummary, index: int) -> Section:
    """Everything about one step: its meta, each section's part, its warnings and its files."""
    failed = is_failed(step.get("status"))
    guests = step_guests(step)
    step_dir = step_dir_of(step)
    blocks: list[Block] = [Heading(3, f"{full_label(step)}{' — ' + str(step.get('status')).upper() if failed else ''}"),
                           _step_meta(step, step_dir)]
    for section in SECTIONS:
        blocks += section.step_blocks(run, step)
    blocks += warning_blocks(step, guests) + [Heading(4, "Raw artifacts")] + artifact_links(run.dir, step_dir)
    return Section(tuple(blocks), "step failed" if failed else "step", f"step-{index}")


def steps_blocks(run: Run) -> list[Block]:
    """One section per step."""
    steps = run_steps(run.summary)
    if not steps:
        return []
    sections = [step_section(run, s, i + 1) for i, s in enumerate(steps)]
    return [Heading(2, "Steps"), *sections]



def _command_text(command: object) -> str:
    if isinstance(command, list):
        return shlex.join(str(c) for c in command)
    return str(command) if command is not None else "?"


def _exit_cell(status: object) -> Inline:
    if status is None:
        return txt("n/a", "muted")
    return txt(status, "" if status == 0 or status == "ok" else "bad")


def commands_blocks(run: Run) -> list[Block]:
    """The commands the run executed, from the manifest."""
    commands = [c for c in as_list(run.manifest.get("commands")) if isinstance(c, dict)]
    if not commands:
        return [Heading(2, "Commands"), Para(txt("no commands recorded"), "muted")]
    rows = []
    for c in commands:
        step = str(c.get("step") or "–") + (f" / {c['variant']}" if c.get("variant") else "")
        status = c.get("status")
        rows.append(Row((txt(c.get("guest") or "–"), txt(step), txt(_command_text(c.get("command")), "code"),
                         _exit_cell(status), num(c.get("duration_s"))),
                        "" if status in (0, "ok", None) else "failed"))
    return [Heading(2, "Commands"),
            Table(("guest", "step", "command", "exit status", "duration s"), tuple(rows), frozenset({3, 4}),
                  "commands")]


def run_artifact_blocks(run: Run) -> list[Block]:
    """Links to the run's own files: manifest, summary, lab file, console logs."""
    items: list[Inline] = [(Span(name, "code", name),) for name in (MANIFEST, SUMMARY, "lab.yaml") if (run.dir / name).is_file()]
    guests = run.dir / "guests"
    if guests.is_dir():
        for p in sorted(q for q in guests.rglob("*") if q.is_file()):
            rel = p.relative_to(run.dir).as_posix()
            items.append((Span(rel, "code", rel), Span(f" {_human_size(p.stat().st_size)}", "muted")))
    return [Heading(2, "Run files"), Bullets(tuple(items), "artifacts")]
