"""summary.json: the figures of a run, computed one way for ``labctl run`` and ``labctl report``.

:func:`summarize` takes the steps as the runner recorded them (name,
variant, status, reason, directory, NIC, guests, warnings...) and computes
from the raw files in the bundle: the statistics deltas
(``stats/delta.json``), every guest's figures
(:func:`labctl.trace.analyze.guest_figures`), the files derived from a
guest's raw ones (``flamegraph.folded``, ``trace.json.gz``), each step's
whole cost (:mod:`labctl.trace.hostcost`, from the host's ``_host/`` record),
each step's headline figures, the spread of repeated runs and the
comparison sentence. ``labctl run`` calls it with the runner's
results; ``labctl report`` calls it with the steps of the summary already in
the bundle, so a re-analysis never drops anything a run wrote.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from labctl.bundle.figures import comparison_sentence, is_failed, repeat_key, spread, step_metrics
from labctl.bundle.layout import FLAMEGRAPH_FOLDED, HOST_DIR, SUMMARY
from labctl.errors import LabctlError
from labctl.paths import atomic_write
from labctl.trace.analyze import guest_figures, step_figures
from labctl.trace.flames import guest_flamegraph
from labctl.trace.hostcost import guest_cost, nic_bytes, step_cost
from labctl.trace.netfigures import capture_figures
from labctl.trace.perfetto import TRACE_JSON, guest_trace, trace_summary
from labctl.trace.stats import write_delta
from labctl.trace.tef import write_trace

log = logging.getLogger(__name__)

RECORDED = ("name", "variant", "status", "reason", "duration_s", "dir", "nic", "warnings", "gdb", "repeat", "repeats",
            "window_s", "captures", "network", "kselftest")
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
    entry: dict[str, Any] = {k: step.get(k) for k in RECORDED}
    entry["warnings"] = list(step.get("warnings") or [])
    modules = (step.get("nic") or {}).get("modules") or []
    sdir = bundle / str(step.get("dir") or "")
    window = step.get("window_s") if isinstance(step.get("window_s"), int | float) else None
    guests: dict[str, Any] = {}
    costs: dict[str, Any] = {}
    for g in _guest_names(step.get("guests")):
        gdir = sdir / g
        if not gdir.is_dir():
            continue
        try:
            if (gdir / "stats" / "before").is_dir() and (gdir / "stats" / "after").is_dir():
                write_delta(gdir)
            guests[g] = guest_figures(gdir, modules, window)
            guests[g].update(_derived_files(gdir, modules, guests[g]["warnings"]))
            costs[g] = guest_cost(gdir, sdir / HOST_DIR / g)
        except Exception as exc:  # noqa: BLE001 - a figure must never lose the bundle
            log.warning("figures for %s/%s failed: %s", step.get("dir"), g, exc)
            guests[g] = {"warnings": [f"analysis failed: {exc}"]}
    entry["guests"] = guests
    cost = _cost(sdir, step, guests, costs, window)
    entry["cost"] = cost
    entry["figures"] = {**step_figures(guests, step.get("nic")), **{k: cost.get(k) for k in COST_FIGURES}}
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


def _derived_files(gdir: Path, modules: list[str], warnings: list[str]) -> dict[str, Any]:
    """Files derived from a guest's raw ones, written beside them: ``flamegraph.folded``
    (labctl.trace.flames) and ``trace.json`` (labctl.trace.perfetto); what the summary keeps of each."""
    out: dict[str, Any] = {}
    try:
        fg = guest_flamegraph(gdir, modules)
        if fg is not None:
            info, text = fg
            info["folded"] = FLAMEGRAPH_FOLDED if info.get("event") else None
            if info["folded"]:
                atomic_write(gdir / FLAMEGRAPH_FOLDED, text)
            out["flamegraph"] = info
    except OSError as exc:
        warnings.append(f"flame graph: {exc}")
    try:
        doc = guest_trace(gdir)
        if doc is not None:
            write_trace(doc, gdir / TRACE_JSON)
            out["trace_json"] = trace_summary(doc)
    except (OSError, LabctlError) as exc:
        warnings.append(f"trace.json: {exc}")
    return out


COST_FIGURES = ("host_cpu_s_per_gb", "guest_cpu_s_per_gb", "host_cpu_s", "guest_cpu_s")


def _cost(sdir: Path, step: Mapping[str, Any], guests: Mapping[str, Any], costs: Mapping[str, Any],
          window: float | None) -> dict[str, Any]:
    """The step's whole cost (labctl.trace.hostcost.step_cost) over the bytes its transfer moved:
    the transfer tool's count on the NIC's guest, else the NIC's byte counters."""
    nic = step.get("nic") or {}
    focus = nic.get("guest") if nic.get("guest") in guests else next(iter(guests), None)
    figs = guests.get(focus, {}) if focus else {}
    nbytes, source = figs.get("transfer_bytes"), figs.get("throughput_source")
    if not nbytes and focus and nic.get("name"):
        nbytes, source = nic_bytes(sdir / focus, nic["name"]), f"{focus} {nic['name']} rx+tx bytes (/proc/net/dev)"
    return step_cost(costs, nbytes if nbytes else None, source if nbytes else None, window)


def spreads(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """For each variant run more than once (``repeat:``): every metric's spread over its runs that did not fail."""
    groups: dict[tuple[str, str | None], list[Mapping[str, Any]]] = {}
    for e in entries:
        if (e.get("repeats") or 1) > 1 and not is_failed(e.get("status")) and e.get("status") != "skipped":
            groups.setdefault(repeat_key(e), []).append(e)
    out = []
    for (name, variant), runs in groups.items():
        values: dict[str, list[float]] = {}
        for run in runs:
            for key, (value, *_rest) in step_metrics(run).items():
                values.setdefault(key, []).append(value)
        out.append({"name": name, "variant": variant, "runs": len(runs),
                    "metrics": {k: spread(v) for k, v in values.items() if len(v) == len(runs)}})
    return out


def summarize(bundle: Path, header: Mapping[str, Any], steps: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The whole summary: ``header`` (lab, status, reason, times, accelerator) and every step."""
    entries = [summarize_step(bundle, s) for s in steps]
    return {**header, "steps": entries, "spreads": spreads(entries),
            "comparison": comparison_sentence(entries, header.get("accel"))}


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
    header = {k: v for k, v in old.items() if k not in ("steps", "comparison", "spreads")}
    summary = summarize(bundle, header, old.get("steps") or [])
    write_summary(bundle, summary)
    return summary
