"""What the report says: a bundle's manifest and summary turned into document blocks.

The frame is here: the header, the results table (each step's status, and each section's columns
for the steps it is about), the sections in their order (:mod:`.registry`), one section per step
(its meta, each section's part, its warnings and files), the commands and the run's files.
Numbers come straight from summary.json, formatted by
:func:`labctl.bundle.figures.fmt_num`: the report never recomputes a figure.
"""

from __future__ import annotations

import datetime
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
    fmt_num,
    full_label,
    is_failed,
    run_steps,
    step_guests,
    usable,
    variant_text,
)
from labctl.lab import settings_text
from labctl.report.document import (
    Block,
    Bullets,
    Charts,
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
from labctl.report.registry import SECTIONS, headline
from labctl.report.sections import Column
from labctl.report.throughput import comparison_sentence
from labctl.trace import GuestFigures

MAX_ARTIFACTS = 200

# --------------------------------------------------------------------------- header

def _parse_time(value: object) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(str(value)) if value else None
    except ValueError:
        return None


def fmt_duration(seconds: float | None) -> str:
    """``21.3 s``, ``3 min 05 s`` or ``1 h 02 min``; ``n/a`` when unknown."""
    if seconds is None or seconds < 0:
        return "n/a"
    if seconds < 60:
        return f"{fmt_num(float(seconds))} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def fmt_time(moment: datetime.datetime, date: bool = True) -> str:
    """``2026-11-23 01:00:00 UTC`` (or just the time when ``date`` is False)."""
    text = moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    return f"{text} {moment.tzname()}" if moment.tzinfo else text


def _when(run: Run) -> Inline:
    started = run.summary.get("started_at") or run.manifest.get("started_at")
    finished = run.summary.get("finished_at") or run.manifest.get("finished_at")
    t0, t1 = _parse_time(started), _parse_time(finished)
    if t0 is None:
        return txt(f"{started or 'unknown'} → {finished or 'not finished'}")
    if t1 is None:
        return txt(f"{fmt_time(t0)} → {finished or 'not finished'}")
    try:
        took = fmt_duration((t1 - t0).total_seconds())
    except TypeError:  # one has a time zone, the other not
        return txt(f"{fmt_time(t0)} → {fmt_time(t1)}")
    return txt(f"{fmt_time(t0)} → {fmt_time(t1, t1.date() != t0.date())} ({took})")


def _host(host: object) -> str:
    if isinstance(host, dict):
        return ", ".join(f"{k}: {v}" for k, v in host.items() if not isinstance(v, dict | list)) or "–"
    return str(host) if host else "–"


def _kernel(manifest: Mapping[str, Any]) -> str:
    """The guests' kernels: one release for all, or each guest's (bundles before per-guest kernels
    recorded the image's)."""
    per_guest = {str(g): as_dict(k) for g, k in as_dict(manifest.get("kernels")).items()}
    if per_guest:
        described = {g: _describe_kernel(k) for g, k in per_guest.items()}
        if len(set(described.values())) == 1:
            return next(iter(described.values()))
        return "; ".join(f"{g}: {d}" for g, d in sorted(described.items()))
    kernel = as_dict(as_dict(manifest.get("image")).get("kernel"))
    release, version = kernel.get("release"), kernel.get("version")
    if not release:
        return "unknown"
    return f"{release} ({version})" if version else str(release)


def _describe_kernel(k: Mapping[str, Any]) -> str:
    source = as_dict(k.get("source"))
    where = {"debian": "Debian", "tree": f"tree {source.get('tree')}", "files": f"image {source.get('image')}"}
    origin = where.get(str(source.get("kind")), "")
    build = str(k.get("build_id") or "")[:12]
    return f"{k.get('release') or 'unknown'}" + (f" ({origin}" + (f", build id {build}" if build else "") + ")"
                                                 if origin else "")


def _lab_file(lab: Mapping[str, Any]) -> Inline:
    source, sha = lab.get("source"), lab.get("sha256")
    spans = [Span(str(source or "lab.yaml"), "code")]
    if sha:
        spans.append(Span(f" sha256 {str(sha)[:16]}…", "muted"))
    return tuple(spans)


def lab_name(run: Run) -> str:
    """The lab's name from summary.json, else from the manifest."""
    return str(run.summary.get("lab") or as_dict(run.manifest.get("lab")).get("name") or "unknown lab")


def run_status(run: Run) -> tuple[str, str | None]:
    """The run's status and reason (summary first, then manifest)."""
    status = run.summary.get("status") or run.manifest.get("status") or "unknown"
    reason = run.summary.get("reason") or run.manifest.get("reason")
    return str(status), (str(reason) if reason else None)


def _status_para(run: Run) -> Para:
    status, reason = run_status(run)
    if is_failed(status):
        return Para((Span(f"Run {status.upper()}", "bad"),) + ((Span(f": {reason}"),) if reason else ()), "alert")
    spans = (Span("Run status: "), Span(status, "good" if status == "ok" else "muted"))
    return Para(spans + ((Span(f" ({reason})"),) if reason else ()), "ok")


def header_blocks(run: Run) -> list[Block]:
    """Title, status, when, where and with which versions."""
    image, qemu = as_dict(run.manifest.get("image")), as_dict(run.manifest.get("qemu"))
    rows: tuple[tuple[str, Inline], ...] = (
        ("when", _when(run)),
        ("accelerator", txt(run.summary.get("accel") or run.manifest.get("accel") or "unknown")),
        ("lab file", _lab_file(as_dict(run.manifest.get("lab")))),
        ("labctl", txt(run.manifest.get("labctl_version") or "unknown")),
        ("QEMU", txt(qemu.get("version") or "unknown")),
        ("guest kernel", txt(_kernel(run.manifest))),
        ("image", txt(" ".join(str(image[k]) for k in ("name", "key") if image.get(k)) or "unknown")),
        ("host", txt(_host(run.manifest.get("host")))),
        *_net_settings(run.manifest),
    )
    blocks: list[Block] = [Heading(1, f"labctl report: {lab_name(run)}"), _status_para(run), Meta(rows)]
    blocks += [Para(txt(note), "alert") for note in run.notes]
    return blocks + _failure_blocks(run_steps(run.summary))


def _net_settings(manifest: Mapping[str, Any]) -> list[tuple[str, Inline]]:
    """Each guest's routes and sysctls (from the resolved lab), a row each: what the guests booted with."""
    guests = as_dict(as_dict(as_dict(manifest.get("lab")).get("resolved")).get("guests"))
    rows: list[tuple[str, Inline]] = []
    for name, g in guests.items():
        for line in settings_text(as_dict(g)):
            what, _, text = line.partition(": ")
            rows.append((f"{what} of {name}", txt(text, "code")))
    return rows


def _failure_blocks(steps: Sequence[StepSummary]) -> list[Block]:
    failed = [s for s in steps if is_failed(s.get("status"))]
    if not failed:
        return []
    items = tuple((Span(f"step {full_label(s)} {s.get('status')}", "bad"),
                   Span(f": {s.get('reason') or 'no reason given'}")) for s in failed)
    return [Bullets(items, "alert")]


# --------------------------------------------------------------------------- results

def _status_cell(status: object) -> Inline:
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
    frame.append(Column("status", lambda s: _status_cell(s.get("status")), False))
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


# --------------------------------------------------------------------------- one step

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
    rows: list[tuple[str, Inline]] = [("status", _status_cell(step.get("status")))]
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


# --------------------------------------------------------------------------- commands, artifacts

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


def build_document(run: Run) -> list[Block]:
    """The whole report as blocks (writing the flame graph SVG files into the bundle on the way)."""
    lead = [b for section in SECTIONS if section.placement == "lead" for b in section.blocks(run)]
    body = [b for section in SECTIONS if section.placement != "lead" for b in section.blocks(run)]
    return (header_blocks(run) + lead + results_blocks(run) + body + steps_blocks(run) + commands_blocks(run)
            + run_artifact_blocks(run))


