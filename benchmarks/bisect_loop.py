#!/usr/bin/env python3
"""Where a ``labctl bisect`` step's wall time goes, from a bisect bundle's ``state.json``.

Usage: python benchmarks/bisect_loop.py BUNDLE [--json]

  BUNDLE   a bisect bundle (``labctl bisect ... --out BUNDLE``; the integration tests'
           ``tests/integration/test_bisect.py`` leave theirs under pytest's tmp directory)

For each step: build (``make olddefconfig`` + ``make vmlinux modules`` in the worktree), prepare
(labctl preparing the build as ``kernel: {tree:}`` does), boot (``up`` to SSH-ready), the lab's
steps (with the run bundle's writing), the oracle's commands, down, and labctl's own share: the
step's wall time minus the build, the boot, the lab's steps and the oracle's commands (what a
person doing the same by hand -- ``git checkout``, ``make``, ``labctl run``, ``labctl check``,
``git bisect good`` -- would wait for anyway). The issue's target: labctl's own share at most 10 s
per step under TCG.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLS = ("build", "prepare", "boot", "steps", "oracle_run", "down", "labctl", "total")
TARGET_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    state = json.loads((args.bundle / "state.json").read_text())
    rows = []
    for s in state["steps"]:
        t = s.get("times") or {}
        rows.append({"n": s["n"], "commit": s["commit"][:12], "verdict": s.get("verdict") or "-",
                     "cached": bool(s.get("cached_build")), **{c: t.get(c) for c in COLS}})
    booted = [r for r in rows if r["boot"] is not None]
    shares = [float(r["labctl"]) for r in booted if r["labctl"] is not None]
    summary = {"steps": len(rows), "booted": len(booted),
               "labctl_share_median_s": round(statistics.median(shares), 2) if shares else None,
               "labctl_share_max_s": round(max(shares), 2) if shares else None,
               "within_target": bool(shares) and max(shares) <= TARGET_S}
    if args.json:
        json.dump({"rows": rows, "summary": summary}, sys.stdout, indent=2)
        print()
        return 0
    print(f"{'#':>2} {'commit':12} {'verdict':7} " + " ".join(f"{c:>10}" for c in COLS))
    for r in rows:
        cells = " ".join(f"{r[c]:>10.1f}" if isinstance(r[c], (int, float)) else f"{'-':>10}" for c in COLS)
        print(f"{r['n']:>2} {r['commit']:12} {r['verdict']:7} {cells}" + ("  (build cached)" if r["cached"] else ""))
    print(f"labctl's own share per booted step: median {summary['labctl_share_median_s']} s, "
          f"max {summary['labctl_share_max_s']} s (target <= {TARGET_S:g} s: "
          f"{'met' if summary['within_target'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
