"""A guest's flame graph stacks for one step: ``perf-script-g.txt.gz`` folded (the bundle names the file).

A recording with call graphs (``perf_record: {call_graph: true}``) leaves
``perf script``'s text of every sample, gzipped, in the guest's step
directory. :func:`guest_flamegraph` folds the sampling event's stacks (a
tracepoint's stacks say where it fired, not where the CPU went), gives
kernel-core frames back their module from ``kallsyms-modules.txt``, and
returns the folded text (Brendan Gregg's format, :mod:`labctl.trace.flamefold`,
which the summary writes to ``flamegraph.folded``) and what the summary keeps: the event, the samples, each module's
samples (stacks that pass through it) and the driver's hottest functions.
The SVG is drawn from the folded file by :mod:`labctl.report.flamegraph`.
"""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labctl.trace.flamefold import Stack, fold_perf_script, kallsyms_modules, write_folded
from labctl.trace.parsers import is_tracepoint

SCRIPT = "perf-script-g.txt.gz"
KALLSYMS_MODULES = "kallsyms-modules.txt"
TOP_FUNCTIONS = 10


def _module(name: str) -> str:
    return name.strip("[]").replace("-", "_")


def _inclusive(stacks: Mapping[Stack, int]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Samples of stacks passing through each module, and through each (module, function), each stack once."""
    modules: Counter[str] = Counter()
    functions: Counter[tuple[str, str]] = Counter()
    for stack, n in stacks.items():
        mods = {f.module for f in stack if f.kind == "module"}
        funcs = {(f.module, f.function) for f in stack if f.kind == "module"}
        for m in mods:
            modules[m] += n
        for key in funcs:
            functions[key] += n
    return modules, functions


def summarize_stacks(stacks: Mapping[Stack, int], driver_modules: list[str]) -> dict[str, Any]:
    """Samples, per-module samples and the driver's functions (inclusive: a stack counts once per frame kind)."""
    total = sum(stacks.values())
    modules, functions = _inclusive(stacks)
    drivers = {_module(m) for m in driver_modules}
    in_driver = sum(n for stack, n in stacks.items() if any(f.kind == "module" and f.module in drivers
                                                             for f in stack))
    top = sorted(((fn, mod, n) for (mod, fn), n in functions.items() if mod in drivers),
                 key=lambda item: (-item[2], item[0]))[:TOP_FUNCTIONS]
    return {
        "samples": total,
        "modules": dict(sorted(modules.items(), key=lambda kv: (-kv[1], kv[0]))),
        "driver": {"modules": sorted(drivers), "samples": in_driver,
                   "pct": round(100 * in_driver / total, 2) if total else None,
                   "functions": [{"function": fn, "module": mod, "samples": n,
                                  "pct": round(100 * n / total, 2) if total else None} for fn, mod, n in top]},
    }


def guest_flamegraph(guest_dir: Path, driver_modules: list[str]) -> tuple[dict[str, Any], str] | None:
    """Fold the guest's call-graph recording: (what the summary keeps, the folded text); None without one.

    The summary keeps ``event`` (None when the recording has no sampling
    event; the folded text is then empty), ``samples``, ``skipped_samples``, ``modules``, ``driver`` (see
    :func:`summarize_stacks`) and ``other_events`` (the recording's other
    events with their sample counts, tracepoints included).

    :raise OSError: when the recording cannot be read.
    """
    path = guest_dir / SCRIPT
    if not path.is_file():
        return None
    with gzip.open(path, "rt", errors="replace") as f:
        text = f.read()
    try:
        mods = kallsyms_modules((guest_dir / KALLSYMS_MODULES).read_text(errors="replace"))
    except OSError:
        mods = {}
    folded = fold_perf_script(text, module_symbols=mods)
    sampling = [e for e in folded.events if not is_tracepoint(e.rstrip(":"))]
    if not sampling:
        return {"event": None, "samples": 0,
                "other_events": {e: folded.total(e) for e in folded.events}}, ""
    event = max(sampling, key=folded.total)
    stacks = folded.events[event]
    info = {"event": event, "skipped_samples": folded.skipped_samples,
            **summarize_stacks(stacks, driver_modules),
            "other_events": {e: folded.total(e) for e in folded.events if e != event}}
    return info, write_folded(stacks)
