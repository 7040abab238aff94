#!/usr/bin/env python3
"""Issue 48's XDP target: a 10,000-packet flood into an XDP drop program, labctl's count against the
program's own.

Usage: python benchmarks/xdp_drop_count.py [--packets 10000] [--json]
       (boots two guests: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

Boots labs/xdp-drop.yaml (b: labs/xdp-drop.c native on a virtio-net NIC and generic on an e1000,
xdp-filter on a third NIC) with one step that sends ``--packets`` UDP datagrams to port 9 on each of
b's NICs from a, and reads the step's drop table: per NIC, labctl's count of XDP_DROP (xdpdump's
verdicts), the program's own (its xdp_stats map, xdp-filter's status), what xdpdump's ring lost, and
the datagrams a sent. Exits 1 when a count differs from the program's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from follow import labctl  # the benchmark beside this one

LAB = "xdp-drop"
ADDRESSES = {"eth1": "10.9.1.2", "eth2": "10.9.2.2", "eth3": "10.9.3.2"}


def lab_yaml(packets: int) -> str:
    targets = ", ".join(f'"{a}"' for a in ADDRESSES.values())  # in double quotes: the shell's are single
    flood = ("python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
             f"for a in ({targets}):\n"
             f"    [s.sendto(b\"x\", (a, 9)) for _ in range({packets})]'")
    return ((ROOT / "labs" / "xdp-drop.yaml").read_text()
            + "steps:\n  - name: flood\n    run:\n      - guest: a\n        command: |\n"
            + "".join(f"          {ln}\n" for ln in flood.splitlines()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=10000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xdpbench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        (Path(tmp) / "lab.yaml").write_text(lab_yaml(args.packets))
        for c in ("xdp-drop.c", "tc-drop.c"):
            shutil.copy(ROOT / "labs" / c, Path(tmp) / c)
        t0 = time.monotonic()
        try:
            up = labctl("up", str(Path(tmp) / "lab.yaml"), "--accel", "tcg", "--out", f"{tmp}/runs", "--json",
                        env=env, timeout=3600)
            bundle = Path(json.loads(up.stdout)["bundle"])
            summary = json.loads((bundle / "summary.json").read_text())
        finally:
            labctl("down", LAB, env=env, check=False)
    step = next(s for s in summary["steps"] if s["name"] == "flood")
    rows = {r["dev"]: r for r in step["drops"]["rows"] if r.get("xdp")}
    result: dict[str, Any] = {"packets_per_nic": args.packets, "took_s": round(time.monotonic() - t0, 1),
                              "step_s": step.get("duration_s"), "nics": {}}
    ok = True
    for nic in ADDRESSES:
        r = rows.get(nic)
        got = {"where": r["where"], "labctl": r["count"], "program": r["xdp"]["own_count"],
               "xdpdump_missed": r["xdp"]["missed"]} if r else {"labctl": 0, "program": None}
        result["nics"][nic] = got
        ok = ok and r is not None and r["count"] == r["xdp"]["own_count"]
    result["equal"] = ok
    print(json.dumps(result, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
