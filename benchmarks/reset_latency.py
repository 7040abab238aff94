#!/usr/bin/env python3
"""``labctl reset LAB g`` of one warm guest, wall time from the CLI (issue 52's target: 0.3 s,
median of 5), the guest answering afterwards; and what the restored guest holds.

Usage: python benchmarks/reset_latency.py [--runs 5] [--memory 256] [--checkout DIR] [--json]

In a private state directory (the image, kernel and snapshots are the user's cache): a one-guest
lab up (cold the first time: it saves the post-boot snapshot), reset once so that the guest is
restored from the snapshot (a warm guest), then ``--runs`` resets, each a new ``python -m labctl``
process started in ``--checkout`` (default: this one; give another worktree to time its code on
the same host in the same run), each followed by ``labctl exec LAB g -- true`` (not timed: the
guest answers). Printed: the median and range of the wall times, labctl's own figure (``reset
--json``), the host's load average (the figures mean little on a busy host), and the restored
QEMU's PSS and anonymous memory (/proc/PID/smaps_rollup) after the last reset.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAB = """\
name: resetbench
networks:
  lan: {{}}
guests:
  g:
    memory: {memory}
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.98.0.1/24}}]
"""


def rollup(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.split():
            out[key] = int(rest.split()[0])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--memory", type=int, default=256)
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the labctl checkout whose reset is timed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="resetbench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": str(Path(tmp) / "state")}
        env.pop("XDG_RUNTIME_DIR", None)
        lab = Path(tmp) / "resetbench.yaml"
        lab.write_text(LAB.format(memory=args.memory))

        def labctl(*a: str, cwd: Path = args.checkout, check: bool = True) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "labctl", *a], cwd=cwd, env=env, text=True,
                                  capture_output=True, check=check, timeout=600)

        try:
            labctl("up", str(lab), "--accel", "tcg")
            labctl("reset", "resetbench", "g")  # now restored from the snapshot: a warm guest
            walls, own = [], []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                res = labctl("reset", "resetbench", "g", "--json")
                walls.append(time.perf_counter() - t0)
                own.append(float(json.loads(res.stdout)["guests"][0]["seconds"]))
                labctl("exec", "resetbench", "g", "--", "true")  # it answers
            state = json.loads((Path(tmp) / "state" / "labs" / "resetbench" / "state.json").read_text())
            mem = rollup(int(state["guests"]["g"]["pid"]))
        finally:
            labctl("down", "resetbench", check=False)
    result = {
        "checkout": str(args.checkout), "runs": args.runs, "memory_mib": args.memory,
        "wall_s": {"median": round(statistics.median(walls), 3), "min": round(min(walls), 3),
                   "max": round(max(walls), 3), "all": [round(w, 3) for w in walls]},
        "labctl_s": {"median": round(statistics.median(own), 3), "all": own},
        "loadavg": os.getloadavg(),
        "restored_qemu_kib": {k: mem.get(k, 0) for k in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Anonymous")},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        w = result["wall_s"]
        print(f"labctl reset of one warm guest ({args.memory} MiB, {args.checkout}): median {w['median']} s wall "
              f"({w['min']}-{w['max']}), labctl's own {result['labctl_s']['median']} s; load average "
              f"{' '.join(f'{x:.1f}' for x in result['loadavg'])}")
        m = result["restored_qemu_kib"]
        print(f"restored QEMU: PSS {m['Pss'] // 1024} MiB (anonymous {m['Anonymous'] // 1024} MiB, "
              f"file {m['Pss_File'] // 1024} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
