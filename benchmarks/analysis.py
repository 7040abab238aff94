#!/usr/bin/env python3
"""Time what ``labctl run`` and ``labctl report`` add to a bundle's analysis for each guest and step:
folding a call-graph recording and drawing its flame graphs, and exporting a trace as trace.json.

Usage: python benchmarks/analysis.py [--runs N] [--samples N] [--packets-scale N] [--bundle DIR]
                                     [--max-seconds S] [--json]

Inputs (no guest needed):

* flame graphs: ``tests/fixtures/flame/iperf3-e1000.perf-script.txt`` (41 samples)
  repeated to ``--samples`` samples (default 11,000: about what ``perf record -a
  -g -F 999`` gives in a 10 s step), each copy with its own timestamps and a
  process name of its own every 7 copies, so that the graph has many frames;
  timed: fold, write the folded text, standalone SVG, inline SVG, differential SVG;
* trace.json: the real skb_latency reports ``tests/fixtures/skb/rx-*.txt.gz``
  concatenated ``--packets-scale`` times (default 10, about 30,000 events per
  guest, a 5 s stream at 20 Mbit/s), shifted in time; timed: the export and its
  validation;
* with ``--bundle DIR``, also every guest of that bundle as it is (its
  ``perf-script-g.txt.gz``, ``skb-report.txt`` or ``trace-report.txt``).

Each figure is the median of ``--runs`` (default 3). Exits 1 when one guest's
whole analysis (fold + three SVGs + export) takes longer than ``--max-seconds``
(default 20).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.report.flamegraph import render_diff_svg, render_svg
from labctl.trace.flamefold import fold_perf_script, write_folded
from labctl.trace.perfetto import guest_trace, skb_trace
from labctl.trace.tef import validate_trace

FLAME = ROOT / "tests" / "fixtures" / "flame" / "iperf3-e1000.perf-script.txt"
SKB = sorted((ROOT / "tests" / "fixtures" / "skb").glob("rx-*.txt.gz"))
_TIME = re.compile(r"(\s)(\d+)\.(\d{6,9}):")


def median_time(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def scaled_script(samples: int) -> str:
    """The fixture's samples repeated, each copy shifted by 1 s and every 7th renamed (more distinct stacks)."""
    text = FLAME.read_text()
    per = text.count("cpu-clock")
    copies = []
    for i in range(max(1, samples // per)):
        shifted = _TIME.sub(lambda m, i=i: f"{m[1]}{int(m[2]) + i}.{m[3]}:", text)
        copies.append(shifted.replace("iperf3 ", f"iperf3-{i // 7} ") if i % 7 else shifted)
    return "".join(copies)


def scaled_skb(scale: int) -> str:
    """The rx fixtures one after the other, repeated ``scale`` times, each copy 10 s later."""
    parts = []
    for k in range(scale):
        for path in SKB:
            with gzip.open(path, "rt") as f:
                body = [ln for ln in f.read().splitlines() if not ln.startswith("cpus=")]
            parts.append("\n".join(_TIME.sub(lambda m, k=k: f"{m[1]}{int(m[2]) + 10 * (k + 1)}.{m[3]}:", ln)
                                   for ln in body))
    return "cpus=1\n" + "\n".join(parts) + "\n"


def flame_figures(text: str, runs: int) -> dict[str, float | int]:
    fold_s, folded = median_time(lambda: fold_perf_script(text), runs)
    event = max(folded.events, key=folded.total)
    stacks = folded.events[event]
    out: dict[str, float | int] = {"samples": folded.total(event), "stacks": len(stacks), "fold_s": fold_s}
    out["folded_s"], _ = median_time(lambda: write_folded(stacks), runs)
    out["svg_s"], svg = median_time(lambda: render_svg(stacks), runs)
    out["svg_bytes"] = len(svg)
    out["inline_svg_s"], inline = median_time(
        lambda: render_svg(stacks, inline=True, min_width=0.5, width=1150, with_script=False), runs)
    out["inline_svg_bytes"] = len(inline)
    half = dict(list(stacks.items())[: len(stacks) // 2])
    out["diff_svg_s"], _ = median_time(lambda: render_diff_svg(half, stacks), runs)
    return out


def trace_figures(make: Callable[[], dict[str, Any]], runs: int) -> dict[str, float | int]:
    export_s, doc = median_time(make, runs)
    validate_s, problems = median_time(lambda: validate_trace(doc), runs)
    return {"events": len(doc["traceEvents"]), "export_s": export_s, "validate_s": validate_s,
            "problems": len(problems), "json_bytes": len(json.dumps(doc, separators=(",", ":")))}


def bundle_figures(bundle: Path, runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for gdir in sorted(p for p in bundle.glob("steps/*/*/*") if p.is_dir() and not p.name.startswith("_")):
        key = str(gdir.relative_to(bundle))
        if (gdir / "perf-script-g.txt.gz").is_file():
            with gzip.open(gdir / "perf-script-g.txt.gz", "rt", errors="replace") as f:
                out[f"{key} flame"] = flame_figures(f.read(), runs)
        if (gdir / "skb-report.txt").is_file() or (gdir / "trace-report.txt").is_file():
            out[f"{key} trace.json"] = trace_figures(lambda d=gdir: guest_trace(d), runs)  # type: ignore[misc]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--samples", type=int, default=11000)
    p.add_argument("--packets-scale", type=int, default=10)
    p.add_argument("--bundle", type=Path, default=None)
    p.add_argument("--max-seconds", type=float, default=20.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results: dict[str, Any] = {"flame (scaled fixture)": flame_figures(scaled_script(args.samples), args.runs)}
    skb = scaled_skb(args.packets_scale)
    results["trace.json (scaled skb fixtures)"] = trace_figures(lambda: skb_trace(skb, guest="client"), args.runs)
    if args.bundle is not None:
        results.update(bundle_figures(args.bundle, args.runs))
    flame, trace = results["flame (scaled fixture)"], results["trace.json (scaled skb fixtures)"]
    per_guest = sum(float(flame[k]) for k in ("fold_s", "svg_s", "inline_svg_s", "diff_svg_s")) + float(
        trace["export_s"])
    results["one guest, everything (s)"] = round(per_guest, 3)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, figs in results.items():
            if isinstance(figs, dict):
                print(f"{name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in figs.items()))
            else:
                print(f"{name}: {figs}")
    return 0 if per_guest <= args.max_seconds else 1


if __name__ == "__main__":
    raise SystemExit(main())
