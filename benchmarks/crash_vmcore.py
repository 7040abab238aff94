#!/usr/bin/env python3
"""How soon a crash's vmcore and drgn's view of it are in the bundle: ``labctl run`` of
labs/oops-buggy-driver.yaml (the victim panics on the receive path of one UDP packet), in a
private state directory, ``--runs`` times.

Usage: python benchmarks/crash_vmcore.py [--runs N] [--json] [--max-seconds S]

Each run's ``summary.json`` record of the vmcore says when labctl saw the crash on the console
(``seen_at``, within a quarter second of the panic's line reaching it: the console is read four
times a second), how long the dump took and paused the guest, and how long drgn's summary took
(``ready_after_s``: seen to summary written). The report is written at the run's end: its
``report.md``'s time, less ``seen_at``, is how soon the report showed it. Medians of ``--runs``; exits 1 when the
median from the crash seen to the report written is over ``--max-seconds`` (default 20).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "labs" / "oops-buggy-driver.yaml"


def one_run(env: dict[str, str], out: Path) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-m", "labctl", "run", str(LAB), "--out", str(out), "--accel", "tcg",
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if res.returncode != 6:
        raise SystemExit(f"labctl run: exit {res.returncode}: {res.stderr}")
    bundle = Path(json.loads(res.stdout)["bundle"])
    (rec,) = json.loads((bundle / "summary.json").read_text())["vmcores"]
    if rec.get("error"):
        raise SystemExit(f"no vmcore: {rec['error']}")
    seen = datetime.datetime.fromisoformat(rec["seen_at"]).timestamp()
    report = (bundle / "report.md").stat().st_mtime
    return {"dump_s": rec["dump_s"], "paused_s": rec["paused_s"], "summary_s": rec["summary_s"],
            "vmcore_after_s": round(rec["ready_after_s"] - rec["summary_s"], 3),
            "ready_after_s": rec["ready_after_s"], "report_after_s": round(report - seen, 3),
            "size_mib": round(rec["size"] / (1 << 20), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=20.0)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="crashbench-") as d:
        tmp = Path(d)
        (tmp / "state").mkdir(mode=0o700)
        env = {**os.environ, "LABCTL_STATE_DIR": str(tmp / "state")}
        env.pop("XDG_RUNTIME_DIR", None)
        for _ in range(args.runs):
            runs.append(one_run(env, tmp / "runs"))
    figures = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    figures["runs"] = runs  # type: ignore[assignment]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"crash seen -> vmcore in the bundle {figures['vmcore_after_s']} s (dump {figures['dump_s']} s, "
              f"guest paused {figures['paused_s']} s, {figures['size_mib']} MiB) -> drgn's summary "
              f"{figures['ready_after_s']} s (summary {figures['summary_s']} s) -> report written "
              f"{figures['report_after_s']} s; medians of {args.runs}")
    return 0 if figures["report_after_s"] <= args.max_seconds else 1


if __name__ == "__main__":
    sys.exit(main())
