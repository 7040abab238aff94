"""summary.json: the figures of a run, computed one way for ``labctl run`` and ``labctl report``.

:func:`summarize` takes the steps as the runner recorded them (name,
variant, status, reason, directory, NIC, guests, warnings...) and computes
from the raw files in the bundle: the statistics deltas
(``stats/delta.json``), every guest's figures
(:func:`labctl.trace.analyze.guest_figures`), each step's headline figures
and the comparison sentence. ``labctl run`` calls it with the runner's
results; ``labctl report`` calls it with the steps of the summary already in
the bundle, so a re-analysis never drops anything a run wrote.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from labctl.bundle.figures import comparison_sentence
from labctl.bundle.layout import SUMMARY
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.trace.analyze import guest_figures, step_figures
from labctl.trace.netfigures import capture_figures
from labctl.trace.stats import write_delta

log = logging.getLogger(__name__)

RECORDED = ("name", "variant", "status", "reason", "duration_s", "dir", "nic", "warnings", "gdb", "captures",
            "network")
"""What a step entry keeps as the runner recorded it; everything else is computed."""


def _guest_names(guests: object) -> list[str]:
    """A step's guests: the runner's list of names, or a summary's mapping of them."""
    if isinstance(guests, Mapping):
        return [str(g) for g in guests]
    if isinstance(guests, list):
        return [str(g) for g in guests]
    return []


def summarize_step(bundle: Path, step: Mapping[str, Any]) -> dict[str, Any]:
    """One step entry: the recorded fields, every guest's figures and the headline figures.

    A guest whose analysis fails gets a warning, never a lost bundle.
    """
    entry = {k: step.get(k) for k in RECORDED}
    entry["warnings"] = list(step.get("warnings") or [])
    modules = (step.get("nic") or {}).get("modules") or []
    guests: dict[str, Any] = {}
    for g in _guest_names(step.get("guests")):
        gdir = bundle / str(step.get("dir") or "") / g
        if not gdir.is_dir():
            continue
        try:
            if (gdir / "stats" / "before").is_dir() and (gdir / "stats" / "after").is_dir():
                write_delta(gdir)
            guests[g] = guest_figures(gdir, modules)
        except Exception as exc:  # noqa: BLE001 - a figure must never lose the bundle
            log.warning("figures for %s/%s failed: %s", step.get("dir"), g, exc)
            guests[g] = {"warnings": [f"analysis failed: {exc}"]}
    entry["guests"] = guests
    entry["figures"] = step_figures(guests, step.get("nic"))
    links = (step.get("network") or {}).get("links") or {}
    entry["captures"] = capture_figures(bundle, list(step.get("captures") or []), guests, frozenset(links))
    for cap in entry["captures"]:
        if cap.get("missing"):
            label = f"{cap.get('guest')}.{cap.get('nic')}"
            warning = (f"{label}: the capture holds {cap.get('frames')} frames but the NIC sent and received "
                       f"{cap.get('nic_frames')}: {cap['missing']} are missing from it")
            if cap.get("link_down"):
                warning += " (the step took its link down: QEMU drops what the NIC sends meanwhile, before any capture)"
            if warning not in entry["warnings"]:
                entry["warnings"].append(warning)
    return entry


def summarize(bundle: Path, header: Mapping[str, Any], steps: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The whole summary: ``header`` (lab, status, reason, times, accelerator) and every step."""
    entries = [summarize_step(bundle, s) for s in steps]
    return {**header, "steps": entries, "comparison": comparison_sentence(entries)}


def write_summary(bundle: Path, summary: Mapping[str, Any]) -> Path:
    """Write summary.json atomically.

    :raise LabctlError: when it cannot be written.
    """
    try:
        return atomic_write(bundle / SUMMARY, json.dumps(summary, indent=2, default=str) + "\n")
    except OSError as exc:
        raise LabctlError(f"cannot write {bundle / SUMMARY}: {exc.strerror or exc}") from exc


def resummarize(bundle: Path) -> dict[str, Any]:
    """The summary of a bundle recomputed from its raw files (``labctl report``), written back.

    :raise LabctlError: when the bundle has no readable summary to start from.
    """
    try:
        old = json.loads((bundle / SUMMARY).read_text())
    except (OSError, ValueError) as exc:
        raise LabctlError(f"cannot read {bundle / SUMMARY}: {exc}") from exc
    header = {k: v for k, v in old.items() if k not in ("steps", "comparison")}
    summary = summarize(bundle, header, old.get("steps") or [])
    write_summary(bundle, summary)
    return summary
