"""Render a run directory into ``report.md`` and ``report.html``.

Both reports are built from one small document model (headings, paragraphs,
tables, ...) so that they always say the same thing. Numbers are printed as
:func:`labctl.report.charts.fmt_num` formats them, straight from
summary.json: the report never recomputes a figure. The HTML page is fully
self-contained: inline CSS and SVG, no scripts, no URLs, and a
Content-Security-Policy that forbids fetching anything.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from labctl import __version__
from labctl.errors import LabctlError, UsageError
from labctl.report.charts import bar_chart_svg, fmt_num, usable

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
MAX_ARTIFACTS = 200

# (summary key, chart title, unit, results-table header)
FIGURES: tuple[tuple[str, str, str, str], ...] = (
    ("throughput_mbit_s", "Throughput", "Mbit/s", "throughput Mbit/s"),
    ("cpu_load_pct", "CPU load", "%", "CPU load %"),
    ("driver_share_pct", "Driver share of CPU samples", "%", "driver share %"),
    ("driver_cpu_pct", "CPU in the NIC driver", "%", "CPU in driver %"),
)


# --------------------------------------------------------------------------- document model

@dataclass(frozen=True)
class Span:
    """A run of inline text; ``style`` is '', 'b', 'code', 'bad', 'good' or 'muted'."""

    text: str
    style: str = ""
    href: str | None = None  # relative to the run directory


Inline = tuple[Span, ...]


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Para:
    spans: Inline
    cls: str = ""  # '', 'alert', 'callout', 'ok', 'muted'


@dataclass(frozen=True)
class Bullets:
    items: tuple[Inline, ...]
    cls: str = ""


@dataclass(frozen=True)
class Meta:
    rows: tuple[tuple[str, Inline], ...]


@dataclass(frozen=True)
class Row:
    cells: tuple[Inline, ...]
    cls: str = ""  # '' or 'failed'


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[Row, ...]
    numeric: frozenset[int] = field(default_factory=frozenset)
    cls: str = ""


@dataclass(frozen=True)
class Charts:
    svgs: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    blocks: tuple[Block, ...]
    cls: str = ""
    anchor: str | None = None


Block = Heading | Para | Bullets | Meta | Table | Charts | Section


def txt(text: object, style: str = "") -> Inline:
    """One span of text."""
    return (Span(str(text), style),)


def num(value: object) -> Inline:
    """A figure, muted when it was not measured."""
    return (Span(fmt_num(value), "muted" if value is None else ""),)


# --------------------------------------------------------------------------- loading

@dataclass(frozen=True)
class Run:
    """A run directory's manifest and summary, plus notes about what was missing."""

    dir: Path
    manifest: dict[str, Any]
    summary: dict[str, Any]
    notes: tuple[str, ...] = ()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LabctlError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise LabctlError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def check_run_dir(run_dir: Path) -> Path:
    """``run_dir`` resolved, or a UsageError if it is not a run directory (no manifest.json)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: not a directory", hint="pass the run directory of a lab run")
    if not (run_dir / MANIFEST).is_file():
        raise UsageError(f"{run_dir} is not a report bundle (no {MANIFEST})",
                         hint="pass the run directory of a lab run: it holds manifest.json and summary.json")
    return run_dir.resolve()


def load_run(run_dir: Path) -> Run:
    """Read a run directory; a missing summary.json is noted, not fatal."""
    root = check_run_dir(run_dir)
    manifest = _read_json(root / MANIFEST)
    if not (root / SUMMARY).is_file():
        note = f"{SUMMARY} is missing: the run ended before it was written, so there are no figures."
        return Run(root, manifest, {}, (note,))
    return Run(root, manifest, _read_json(root / SUMMARY))


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def run_steps(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The summary's steps (malformed entries skipped)."""
    return [s for s in _list(summary.get("steps")) if isinstance(s, dict)]


def step_guests(step: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A step's guests with their measurements, in summary order."""
    return [(str(name), g) for name, g in _dict(step.get("guests")).items() if isinstance(g, dict)]


def is_failed(status: object) -> bool:
    """True for any status but ok, skipped or unknown."""
    return status not in (None, "ok", "skipped")


# --------------------------------------------------------------------------- step helpers

def nic_model(step: Mapping[str, Any]) -> str | None:
    """The step's variant, else its NIC model: what a comparison calls it."""
    variant = step.get("variant") or _dict(step.get("nic")).get("model")
    return str(variant) if variant else None


def variant_text(step: Mapping[str, Any]) -> str:
    """Variant and NIC model for the results table."""
    variant, model = step.get("variant"), _dict(step.get("nic")).get("model")
    if variant and model and variant != model:
        return f"{variant} ({model})"
    return str(variant or model or "–")


def primary_guest(step: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The guest the step's figures are about: the NIC's guest, else the first one."""
    guests = step_guests(step)
    nic_guest = _dict(step.get("nic")).get("guest")
    for name, data in guests:
        if name == nic_guest:
            return name, data
    return guests[0] if guests else None


def figure(step: Mapping[str, Any], key: str) -> Any:
    """A step figure from ``figures``, else from its primary guest; None if not measured."""
    figures = _dict(step.get("figures"))
    if key in figures:
        return figures[key]
    primary = primary_guest(step)
    return primary[1].get(key) if primary else None


def full_label(step: Mapping[str, Any]) -> str:
    """``name / variant`` (or just the name)."""
    model, name = nic_model(step), str(step.get("name") or "?")
    return f"{name} / {model}" if model else name


def step_labels(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """Short unique labels, one per step: the variant alone when all steps share a name."""
    one_name = len({s.get("name") for s in steps}) == 1
    labels: list[str] = []
    for s in steps:
        model = nic_model(s)
        label = model if (one_name and model) else full_label(s)
        n = 2
        base = label
        while label in labels:
            label, n = f"{base} #{n}", n + 1
        labels.append(label)
    return labels


def comparison_sentence(steps: Sequence[Mapping[str, Any]]) -> str | None:
    """One sentence comparing the NIC variants that spent the least and the most CPU in their driver.

    Only steps that did not fail and have a ``driver_cpu_pct`` figure count;
    None when fewer than two distinct variants are left.
    """
    points: dict[str, tuple[float, float | None]] = {}
    for s in steps:
        label, cpu = nic_model(s), usable(figure(s, "driver_cpu_pct"))
        if label and cpu is not None and cpu >= 0 and not is_failed(s.get("status")) and label not in points:
            points[label] = (cpu, usable(figure(s, "throughput_mbit_s")))
    if len(points) < 2:
        return None
    ranked = sorted(points.items(), key=lambda kv: kv[1][0])  # stable: ties keep summary order
    (best, (b_cpu, b_tp)), (worst, (w_cpu, w_tp)) = ranked[0], ranked[-1]
    speed = f", at {_mbyte_s(b_tp)} vs {_mbyte_s(w_tp)} MB/s" if b_tp is not None and w_tp is not None else ""
    cpus = f"{fmt_num(b_cpu)}% vs {fmt_num(w_cpu)}% of the CPU"
    if b_cpu == 0:
        return (f"{best} used no measurable CPU in its driver, {worst} used {fmt_num(w_cpu)}% "
                f"of the CPU in its driver{speed}.")
    ratio = f"{w_cpu / b_cpu:.1f}"
    if ratio == "1.0":
        return f"{best} used about as much CPU in its driver as {worst} ({cpus}){speed}."
    return f"{best} used {ratio} times less CPU in its driver than {worst} ({cpus}){speed}."


def _mbyte_s(mbit_s: float | None) -> str:
    mb = (mbit_s or 0.0) / 8
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.1f}"


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


def _kernel(image: Mapping[str, Any]) -> str:
    kernel = _dict(image.get("kernel"))
    release, version = kernel.get("release"), kernel.get("version")
    if not release:
        return "unknown"
    return f"{release} ({version})" if version else str(release)


def _lab_file(lab: Mapping[str, Any]) -> Inline:
    source, sha = lab.get("source"), lab.get("sha256")
    spans = [Span(str(source or "lab.yaml"), "code")]
    if sha:
        spans.append(Span(f" sha256 {str(sha)[:16]}…", "muted"))
    return tuple(spans)


def lab_name(run: Run) -> str:
    """The lab's name from summary.json, else from the manifest."""
    return str(run.summary.get("lab") or _dict(run.manifest.get("lab")).get("name") or "unknown lab")


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
    image, qemu = _dict(run.manifest.get("image")), _dict(run.manifest.get("qemu"))
    rows: tuple[tuple[str, Inline], ...] = (
        ("when", _when(run)),
        ("accelerator", txt(run.summary.get("accel") or run.manifest.get("accel") or "unknown")),
        ("lab file", _lab_file(_dict(run.manifest.get("lab")))),
        ("labctl", txt(run.manifest.get("labctl_version") or "unknown")),
        ("QEMU", txt(qemu.get("version") or "unknown")),
        ("guest kernel", txt(_kernel(image))),
        ("image", txt(" ".join(str(image[k]) for k in ("name", "key") if image.get(k)) or "unknown")),
        ("host", txt(_host(run.manifest.get("host")))),
    )
    blocks: list[Block] = [Heading(1, f"labctl report: {lab_name(run)}"), _status_para(run), Meta(rows)]
    blocks += [Para(txt(note), "alert") for note in run.notes]
    return blocks + _failure_blocks(run_steps(run.summary))


def _failure_blocks(steps: Sequence[Mapping[str, Any]]) -> list[Block]:
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


def results_table(steps: Sequence[Mapping[str, Any]]) -> Table:
    """One row per step: the figures summary.json holds for it."""
    headers = ("step", "variant / NIC model", "driver", "status", *(f[3] for f in FIGURES), "samples", "lost")
    rows = []
    for s in steps:
        primary = primary_guest(s)
        guest = primary[1] if primary else {}
        cells = (txt(s.get("name") or "?"), txt(variant_text(s)),
                 txt(_dict(s.get("nic")).get("driver") or "–", "code" if _dict(s.get("nic")).get("driver") else ""),
                 _status_cell(s.get("status")), *(num(figure(s, f[0])) for f in FIGURES),
                 num(guest.get("samples")), num(guest.get("lost_samples")))
        rows.append(Row(cells, "failed" if is_failed(s.get("status")) else ""))
    return Table(headers, tuple(rows), frozenset(range(4, 10)), "results")


def charts(steps: Sequence[Mapping[str, Any]]) -> Charts:
    """One bar chart per figure, one bar per step."""
    labels = step_labels(steps)
    failed = [is_failed(s.get("status")) for s in steps]
    return Charts(tuple(bar_chart_svg(title, labels, [usable(figure(s, key)) for s in steps], unit,
                                      axis_label=f"{title} ({unit})", failed=failed)
                        for key, title, unit, _ in FIGURES))


def results_blocks(run: Run) -> list[Block]:
    """The results table, the comparison sentence and the charts."""
    steps = run_steps(run.summary)
    if not steps:
        return [Heading(2, "Results"), Para(txt("No step produced results."), "muted")]
    sentence = run.summary.get("comparison") or comparison_sentence(steps)
    blocks: list[Block] = [Heading(2, "Results"), results_table(steps)]
    if sentence:
        blocks.append(Para(txt(sentence, "b"), "callout"))
    return blocks + [charts(steps)]


# --------------------------------------------------------------------------- one step

def _nic_line(nic: Mapping[str, Any]) -> Inline:
    if not nic:
        return txt("none recorded", "muted")
    where = f"{nic.get('guest') or '?'} {nic.get('name') or '?'}"
    mods = ", ".join(str(m) for m in _list(nic.get("modules")))
    spans = [Span(where, "code"), Span(f": {nic.get('model') or '?'}, driver "),
             Span(str(nic.get("driver") or "unknown"), "code")]
    if mods:
        spans.append(Span(f" (modules: {mods})"))
    return tuple(spans)


def _step_meta(step: Mapping[str, Any], step_dir: str) -> Meta:
    rows: list[tuple[str, Inline]] = [("status", _status_cell(step.get("status")))]
    if step.get("reason"):
        rows.append(("reason", txt(step["reason"], "bad" if is_failed(step.get("status")) else "")))
    rows += [("duration", txt(fmt_duration(usable(step.get("duration_s"))))),
             ("NIC", _nic_line(_dict(step.get("nic")))), ("directory", txt(step_dir, "code"))]
    return Meta(tuple(rows))


def guests_table(guests: Sequence[tuple[str, Mapping[str, Any]]]) -> Table:
    """Per-guest figures of one step."""
    rows = tuple(Row((txt(name),) + tuple(num(g.get(f[0])) for f in FIGURES)
                     + (num(g.get("samples")), num(g.get("lost_samples")))) for name, g in guests)
    headers = ("guest", *(f[3] for f in FIGURES), "samples", "lost samples")
    return Table(headers, rows, frozenset(range(1, 7)))


def symbols_blocks(guests: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Block]:
    """Top symbols of every guest, or a note when there are none."""
    rows = tuple(Row((txt(name), txt(sym.get("symbol") or "?", "code"), txt(sym.get("dso") or "?", "code"),
                      num(sym.get("pct"))))
                 for name, g in guests for sym in _list(g.get("top_symbols")) if isinstance(sym, dict))
    if not rows:
        return [Heading(4, "Top symbols"), Para(txt("no samples recorded"), "muted")]
    return [Heading(4, "Top symbols"), Table(("guest", "symbol", "dso", "% of samples"), rows, frozenset({3}))]


def softnet_blocks(guests: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Block]:
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


LOSS_FIELDS = (("perf_lost", "perf lost events"), ("ftrace_overruns", "ftrace overruns"),
               ("kprobe_misses", "kprobe misses"))


def _loss_item(name: str, guest: Mapping[str, Any]) -> Inline:
    loss = guest.get("trace_loss")
    lost_samples = usable(guest.get("lost_samples"))
    if not isinstance(loss, dict) and lost_samples is None:
        return (Span(f"{name}: "), Span("not measured", "muted"))
    counts = [(label, _dict(loss).get(key)) for key, label in LOSS_FIELDS]
    if lost_samples != usable(_dict(loss).get("perf_lost")):
        counts.append(("lost samples", guest.get("lost_samples")))
    lossy = [(label, v) for label, v in counts if usable(v)]
    if not lossy:
        return (Span(f"{name}: "), Span("none", "good"))
    return (Span(f"{name}: "), Span(", ".join(f"{label} {fmt_num(v)}" for label, v in lossy), "bad"))


def loss_blocks(guests: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Block]:
    """Trace loss per guest: always present, 'none' when nothing was lost."""
    if not guests:
        return [Heading(4, "Trace loss"), Para(txt("not measured (no guest data)"), "muted")]
    return [Heading(4, "Trace loss"), Bullets(tuple(_loss_item(n, g) for n, g in guests))]


def warning_blocks(step: Mapping[str, Any], guests: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Block]:
    """Warnings of the step and of its guests."""
    items = [txt(str(w)) for w in _list(step.get("warnings"))]
    items += [(Span(f"{name}: ", "b"), Span(str(w))) for name, g in guests for w in _list(g.get("warnings"))]
    if not items:
        return [Heading(4, "Warnings"), Para(txt("none"), "muted")]
    return [Heading(4, "Warnings"), Bullets(tuple(items), "warnings")]


def _step_dir(step: Mapping[str, Any]) -> str:
    given = step.get("dir")
    if isinstance(given, str) and given:
        return given.strip("/")
    return f"steps/{step.get('name') or '_'}/{step.get('variant') or '_'}"


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


def step_section(root: Path, step: Mapping[str, Any], index: int) -> Section:
    """Everything about one step."""
    failed = is_failed(step.get("status"))
    guests = step_guests(step)
    step_dir = _step_dir(step)
    blocks: list[Block] = [Heading(3, f"{full_label(step)}{' — ' + str(step.get('status')).upper() if failed else ''}"),
                           _step_meta(step, step_dir)]
    if guests:
        blocks += [Heading(4, "Guests"), guests_table(guests)]
    blocks += symbols_blocks(guests) + softnet_blocks(guests) + loss_blocks(guests)
    blocks += warning_blocks(step, guests) + [Heading(4, "Raw artifacts")] + artifact_links(root, step_dir)
    return Section(tuple(blocks), "step failed" if failed else "step", f"step-{index}")


def steps_blocks(run: Run) -> list[Block]:
    """One section per step."""
    steps = run_steps(run.summary)
    if not steps:
        return []
    sections = [step_section(run.dir, s, i + 1) for i, s in enumerate(steps)]
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
    commands = [c for c in _list(run.manifest.get("commands")) if isinstance(c, dict)]
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
    """The whole report as blocks."""
    from labctl.report.skb import latency_blocks

    return (header_blocks(run) + results_blocks(run) + latency_blocks(run) + steps_blocks(run)
            + commands_blocks(run) + run_artifact_blocks(run))


# --------------------------------------------------------------------------- Markdown

MD_SPECIAL = re.compile(r"([\\`*_\[\]<>&#~])")


def md_escape(text: str) -> str:
    """Backslash-escape Markdown's inline punctuation (not '|': tables handle it)."""
    return MD_SPECIAL.sub(r"\\\1", text)


def md_code(text: str) -> str:
    """A code span that survives backticks in ``text``."""
    text = text.replace("\n", " ")
    if not text:
        return ""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_span(span: Span) -> str:
    if span.style == "code":
        inner = md_code(span.text)
    elif span.style in ("b", "bad") and span.text.strip():
        core = span.text.strip()
        lead, trail = span.text[: span.text.index(core)], span.text[span.text.index(core) + len(core):]
        inner = f"{lead}**{md_escape(core)}**{trail}"
    else:
        inner = md_escape(span.text)
    return f"[{inner}]({quote(span.href)})" if span.href else inner


def md_inline(spans: Inline) -> str:
    return "".join(md_span(s) for s in spans).replace("\n", "  \n")


def md_cell(spans: Inline) -> str:
    return "".join(md_span(s) for s in spans).replace("\n", " ").replace("|", "\\|")


def md_table(table: Table) -> list[str]:
    lines = ["| " + " | ".join(md_escape(h) for h in table.headers) + " |",
             "|" + "|".join("---:" if i in table.numeric else "---" for i in range(len(table.headers))) + "|"]
    return lines + ["| " + " | ".join(md_cell(c) for c in row.cells) + " |" for row in table.rows]


def md_block(block: Block) -> list[str]:
    """One block as Markdown lines."""
    if isinstance(block, Heading):
        return ["#" * block.level + " " + md_escape(block.text)]
    if isinstance(block, Para):
        prefix = "> " if block.cls in ("alert", "callout") else ""
        return [prefix + md_inline(block.spans).replace("\n", "\n" + prefix)]
    if isinstance(block, Bullets):
        return ["- " + md_inline(item).replace("\n", "\n  ") for item in block.items]
    if isinstance(block, Meta):
        return [f"- **{md_escape(key)}:** {md_inline(value)}" for key, value in block.rows]
    if isinstance(block, Table):
        return md_table(block)
    if isinstance(block, Charts):
        return ["_Bar charts of these figures are in report.html._"]
    return [line for i, b in enumerate(block.blocks) for line in ([""] if i else []) + md_block(b)]


def to_markdown(blocks: Sequence[Block]) -> str:
    """The report as Markdown."""
    body = "\n\n".join("\n".join(md_block(b)) for b in blocks)
    return body + f"\n\n---\n\n_Generated by labctl {__version__}._\n"


# --------------------------------------------------------------------------- HTML

CSS = """
:root { --ink: #1f2933; --muted: #6b7785; --line: #d9dee6; --bg: #f4f6f9; --card: #ffffff;
        --accent: #3b6ea8; --bad: #b42318; --bad-bg: #fdecea; --good: #17803d; --head: #eef2f7; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 28px 32px 48px; }
h1 { font-size: 28px; margin: 0 0 10px; letter-spacing: -0.01em; }
h2 { font-size: 21px; margin: 36px 0 14px; padding-bottom: 6px; border-bottom: 2px solid var(--line); }
h3 { font-size: 18px; margin: 0 0 12px; }
h4 { font-size: 12.5px; margin: 20px 0 6px; text-transform: uppercase; letter-spacing: .06em; color: var(--muted); }
p { margin: 10px 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px;
       background: var(--head); padding: 1px 5px; border-radius: 4px; overflow-wrap: anywhere; }
.table-wrap { overflow-x: auto; border: 1px solid var(--line); border-radius: 8px; background: var(--card); }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { padding: 7px 12px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
tbody tr:last-child td { border-bottom: none; }
th { background: var(--head); font-weight: 600; font-size: 13px; white-space: nowrap; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfd; }
tr.failed td, tbody tr.failed:nth-child(even) td { background: var(--bad-bg); }
table.commands td:nth-child(3) { width: 55%; }
.alert { background: var(--bad-bg); border-left: 5px solid var(--bad); padding: 10px 16px; border-radius: 6px;
         white-space: pre-line; }
ul.alert { list-style: none; white-space: normal; }
ul.alert li { margin: 3px 0; }
p.ok { display: inline-block; background: #e7f5ec; border-left: 5px solid var(--good); padding: 6px 16px;
       border-radius: 6px; margin: 4px 0; }
.callout { background: #e9f1fb; border-left: 5px solid var(--accent); padding: 12px 16px; border-radius: 6px;
           font-size: 16px; margin: 16px 0; }
.bad { color: var(--bad); font-weight: 600; }
.good { color: var(--good); font-weight: 600; }
.muted { color: var(--muted); }
dl.meta { display: grid; grid-template-columns: repeat(auto-fill, minmax(250px, 1fr)); gap: 10px 28px;
          margin: 16px 0; padding: 14px 18px; background: var(--card); border: 1px solid var(--line);
          border-radius: 8px; }
dl.meta div { min-width: 0; }
dt { font-size: 11.5px; color: var(--muted); text-transform: uppercase; letter-spacing: .06em; }
dd { margin: 0; overflow-wrap: anywhere; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; margin-top: 18px; }
.charts figure { margin: 0; background: var(--card); border: 1px solid var(--line); border-radius: 8px;
                 padding: 14px 16px 8px; }
svg.chart { display: block; max-width: 100%; height: auto; }
section.step { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 18px 22px;
               margin: 18px 0; }
section.step.failed { border: 2px solid var(--bad); box-shadow: 0 0 0 3px var(--bad-bg); }
section.step dl.meta { background: var(--bg); border: none; }
section.step .table-wrap { border-radius: 6px; }
ul.artifacts { columns: 2 320px; column-gap: 32px; padding-left: 20px; font-size: 13.5px; margin: 6px 0; }
ul.artifacts li { break-inside: avoid; }
ul.warnings li { color: #8a5a00; }
footer { margin-top: 40px; color: var(--muted); font-size: 13px; }
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; base-uri 'none'"


def html_span(span: Span) -> str:
    text = escape(span.text)
    inner = {"b": "<strong>{}</strong>", "code": "<code>{}</code>", "bad": '<span class="bad">{}</span>',
             "good": '<span class="good">{}</span>', "muted": '<span class="muted">{}</span>'}.get(
                 span.style, "{}").format(text)
    return f'<a href="{escape(quote(span.href))}">{inner}</a>' if span.href else inner


def html_inline(spans: Inline) -> str:
    return "".join(html_span(s) for s in spans)


def _cls(cls: str) -> str:
    return f' class="{escape(cls)}"' if cls else ""


def html_table(table: Table) -> str:
    def cell(tag: str, i: int, content: str) -> str:
        return f"<{tag}{_cls('num' if i in table.numeric else '')}>{content}</{tag}>"

    head = "".join(cell("th", i, escape(h)) for i, h in enumerate(table.headers))
    body = "\n".join(f"<tr{_cls(row.cls)}>" + "".join(cell("td", i, html_inline(c)) for i, c in enumerate(row.cells))
                     + "</tr>" for row in table.rows)
    return (f'<div class="table-wrap"><table{_cls(table.cls)}>\n<thead><tr>{head}</tr></thead>\n'
            f"<tbody>\n{body}\n</tbody></table></div>")


def html_block(block: Block) -> str:
    """One block as HTML."""
    if isinstance(block, Heading):
        return f"<h{block.level}>{escape(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p{_cls(block.cls)}>{html_inline(block.spans)}</p>"
    if isinstance(block, Bullets):
        return f"<ul{_cls(block.cls)}>\n" + "\n".join(f"<li>{html_inline(i)}</li>" for i in block.items) + "\n</ul>"
    if isinstance(block, Meta):
        rows = "\n".join(f"<div><dt>{escape(k)}</dt><dd>{html_inline(v)}</dd></div>" for k, v in block.rows)
        return f'<dl class="meta">\n{rows}\n</dl>'
    if isinstance(block, Table):
        return html_table(block)
    if isinstance(block, Charts):
        return '<div class="charts">\n' + "\n".join(f"<figure>\n{svg}\n</figure>" for svg in block.svgs) + "\n</div>"
    anchor = f' id="{escape(block.anchor)}"' if block.anchor else ""
    return f"<section{_cls(block.cls)}{anchor}>\n" + "\n".join(html_block(b) for b in block.blocks) + "\n</section>"


def to_html(blocks: Sequence[Block], title: str) -> str:
    """The report as one self-contained HTML page."""
    body = "\n".join(html_block(b) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<meta name="generator" content="labctl {escape(__version__)}">\n'
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n{body}\n"
            f"<footer>Generated by labctl {escape(__version__)}.</footer>\n</main>\n</body>\n</html>\n")


# --------------------------------------------------------------------------- entry point

def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise LabctlError(f"cannot write {path}: {exc.strerror or exc}") from exc


def render_run(run_dir: Path) -> tuple[Path, Path]:
    """Write ``report.md`` and ``report.html`` into ``run_dir``; return their paths."""
    run = load_run(run_dir)
    blocks = build_document(run)
    md_path, html_path = run.dir / REPORT_MD, run.dir / REPORT_HTML
    _write(md_path, to_markdown(blocks))
    _write(html_path, to_html(blocks, f"labctl report: {lab_name(run)}"))
    return md_path, html_path
