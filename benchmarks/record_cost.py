#!/usr/bin/env python3
"""What QEMU's record/replay costs a labctl run (issue 53's targets: recording at most 3x the same
step unrecorded; a replay at most 2x its recording's time).

Usage: python benchmarks/record_cost.py [--out DIR] [--work CMD] [--json]

Runs a one-guest lab (384 MiB, one vCPU, TCG) whose one step runs ``--work`` in the guest (default:
hash 64 MiB of /dev/zero, CPU-bound) twice: unrecorded, then ``--record --keep-recordings``.
Figures: the step's wall time each way (the step's ``duration_s`` in summary.json) and their
ratio; then ``labctl replay`` of the recording, its wall time against the recording's (from the
guest's boot to the run's end, ``covers.wall_seconds`` of recording.json). Exits 1 when the replay's
console differs from the recording's. Times on a loaded host are what they are: say the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAB = """\
name: rr-bench
drops: false
networks:
  lan: {{}}
guests:
  a:
    memory: 384
    cpus: 1
    nics:
      - {{name: eth1, model: e1000, network: lan, ip: 10.80.0.1/24}}
steps:
  - name: work
    run:
      - {{guest: a, command: "{work}"}}
"""


def labctl(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def run(lab: Path, out: Path, *extra: str) -> dict[str, Any]:
    res = labctl("run", str(lab), "--out", str(out), "--accel", "tcg", "--json", *extra)
    if res.returncode != 0:
        raise SystemExit(f"labctl run {' '.join(extra)} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    outcome = json.loads(res.stdout)
    summary = json.loads((Path(outcome["bundle"]) / "summary.json").read_text())
    (step,) = [s for s in summary["steps"] if s["name"] == "work"]
    return {"bundle": outcome["bundle"], "step_s": step["duration_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", default="dd if=/dev/zero bs=1M count=64 2>/dev/null | sha256sum")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="rr-bench-"))
    lab = out / "rr-bench.yaml"
    lab.write_text(LAB.format(work=args.work))
    load = os.getloadavg()[0]
    plain = run(lab, out)
    recorded = run(lab, out, "--record", "--keep-recordings")
    rec_dir = Path(recorded["bundle"]) / "guests" / "a" / "recording"
    manifest = json.loads((rec_dir / "recording.json").read_text())
    t0 = time.monotonic()
    rep = labctl("replay", recorded["bundle"], "a", "--json")
    replay_s = time.monotonic() - t0
    replayed = json.loads(rep.stdout) if rep.stdout.strip().startswith("{") else {"identical": False}
    figures = {
        "load_average_1min": round(load, 1),
        "step_unrecorded_s": plain["step_s"], "step_recorded_s": recorded["step_s"],
        "record_ratio": round(recorded["step_s"] / plain["step_s"], 2) if plain["step_s"] else None,
        "recording_bytes": manifest["recording"]["bytes"],
        "recording_wall_s": manifest["covers"]["wall_seconds"], "replay_wall_s": round(replay_s, 1),
        "replay_ratio": round(replay_s / manifest["covers"]["wall_seconds"], 2),
        "replay_identical": replayed.get("identical"), "replay_end": replayed.get("end"),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for k, v in figures.items():
            print(f"{k:24} {v}")
    return 0 if figures["replay_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
