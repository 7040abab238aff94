"""summary.json: the figures of a run, computed one way for ``labctl run`` and ``labctl report``.

:func:`summarize` takes the steps as the runner recorded them (name, variant, status, reason,
directory, NIC, guests, kinds, warnings, each kind's record: :mod:`labctl.steps.result`) and
computes from the raw files in the bundle: the statistics deltas (``stats/delta.json``), every
guest's figures (:func:`labctl.trace.analyze.guest_figures`, which warns only about what the step
asked for), then each report section's piece (:mod:`.registry`: the step's headline figures, its
whole cost, its captures, the flame graphs' folded stacks, the Perfetto timelines...), the spread
of repeated runs and the comparison sentence. ``labctl run`` calls it with the runner's results;
``labctl report`` calls it with the steps of the summary already in the bundle, so a re-analysis
never drops anything a run wrote.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from labctl.bundle import SUMMARY, StepSummary, Summary, VariantSpread, as_dict, as_step, is_failed, repeat_key, spread
from labctl.errors import LabctlError
from labctl.lab import recorded_keys
from labctl.paths import atomic_write
from labctl.report.registry import SECTIONS, step_metrics
from labctl.report.sections import StepFiles, expects_transfer
from labctl.report.throughput import comparison_sentence
from labctl.trace import GuestFigures, guest_figures, write_delta

log = logging.getLogger(__name__)

RUNNER_FIELDS = ("name", "variant", "status", "reason", "duration_s", "dir", "nic", "warnings", "repeat", "repeats",
                 "window_s", "kinds")
"""A step entry's fields of the runner's own (:class:`labctl.steps.result.StepResult`)."""
RECORDED = (*RUNNER_FIELDS, *recorded_keys())
"""What a step entry keeps as the runner recorded it: its own fields and every kind's records, at the
keys the kinds declare (:mod:`labctl.lab.stepkinds`); everything else is computed."""


def _guest_names(guests: object) -> list[str]:
    """A step's guests: the runner's list of names, or a summary's mapping of them."""
    if isinstance(guests, Mapping | list):
        return [str(g) for g in guests]
    return []


def summarize_step(bundle: Path, step: Mapping[str, Any]) -> StepSummary:
    """One step entry: the recorded fields, every guest's figures, each section's piece.

    A guest whose analysis fails gets a warning, never a lost bundle.
    """
    entry: StepSummary = {k: step.get(k) for k in RECORDED if k in step or k != "kinds"}  # type: ignore[assignment]
    entry["warnings"] = list(step.get("warnings") or [])
    nic = as_dict(step.get("nic"))
    modules = nic.get("modules") or []
    sdir = bundle / str(step.get("dir") or "")
    window = step.get("window_s") if isinstance(step.get("window_s"), int | float) else None
    transfer = expects_transfer(as_step(step))
    guests: dict[str, GuestFigures] = {}
    for g in _guest_names(step.get("guests")):
        gdir = sdir / g
        if not gdir.is_dir():
            continue
        try:
            if (gdir / "stats" / "before").is_dir() and (gdir / "stats" / "after").is_dir():
                write_delta(gdir)
            guests[g] = guest_figures(gdir, modules, window, expect_transfer=transfer and nic.get("guest") == g)
        except Exception as exc:  # noqa: BLE001 - a figure must never lose the bundle
            log.warning("figures for %s/%s failed: %s", step.get("dir"), g, exc)
            guests[g] = {"warnings": [f"analysis failed: {exc}"]}
    entry["guests"] = guests
    for section in SECTIONS:
        try:
            section.summarize(StepFiles(bundle, entry))
        except Exception as exc:  # noqa: BLE001 - a figure must never lose the bundle
            log.warning("%s of %s failed: %s", section.name, step.get("dir"), exc)
            entry["warnings"].append(f"{section.name}: analysis failed: {exc}")
    return entry


def spreads(entries: Iterable[StepSummary]) -> list[VariantSpread]:
    """For each variant run more than once (``repeat:``): every metric's spread over its runs that did not fail."""
    groups: dict[tuple[str, str | None], list[StepSummary]] = {}
    for e in entries:
        if (e.get("repeats") or 1) > 1 and not is_failed(e.get("status")) and e.get("status") != "skipped":
            groups.setdefault(repeat_key(e), []).append(e)
    out: list[VariantSpread] = []
    for (name, variant), runs in groups.items():
        values: dict[str, list[float]] = {}
        for run in runs:
            for key, (value, *_rest) in step_metrics(run).items():
                values.setdefault(key, []).append(value)
        out.append({"name": name, "variant": variant, "runs": len(runs),
                    "metrics": {k: spread(v) for k, v in values.items() if len(v) == len(runs)}})
    return out


def summarize(bundle: Path, header: Mapping[str, Any], steps: Iterable[Mapping[str, Any]]) -> Summary:
    """The whole summary: ``header`` (lab, status, reason, times, accelerator) and every step."""
    entries = [summarize_step(bundle, s) for s in steps]
    return {**header, "steps": entries, "spreads": spreads(entries),  # type: ignore[typeddict-item]
            "comparison": comparison_sentence(entries, header.get("accel"))}


def write_summary(bundle: Path, summary: Mapping[str, Any]) -> Path:
    """Write summary.json atomically.

    :raise LabctlError: when it cannot be written.
    """
    try:
        return atomic_write(bundle / SUMMARY, json.dumps(summary, indent=2, default=str) + "\n")
    except OSError as exc:
        raise LabctlError(f"cannot write {bundle / SUMMARY}: {exc.strerror or exc}") from exc


def resummarize(bundle: Path) -> Summary:
    """The summary of a bundle recomputed from its raw files (``labctl report``), written back.

    :raise LabctlError: when the bundle has no readable summary to start from.
    """
    try:
        old = json.loads((bundle / SUMMARY).read_text())
    except (OSError, ValueError) as exc:
        raise LabctlError(f"cannot read {bundle / SUMMARY}: {exc}") from exc
    header = {k: v for k, v in old.items() if k not in ("steps", "comparison", "spreads")}
    summary = summarize(bundle, header, old.get("steps") or [])
    write_summary(bundle, summary)
    return summary

