"""The report's header: the lab's name and the run's status, when and where it ran, with which
labctl, QEMU, kernel and image, each guest's network settings, and the steps that failed."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from labctl.bundle import Run, StepSummary, as_dict, fmt_num, full_label, is_failed, run_steps
from labctl.lab import settings_text
from labctl.report.document import Block, Bullets, Heading, Inline, Meta, Para, Span, txt


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
