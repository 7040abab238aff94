#!/usr/bin/env python3
"""Time from `labctl up` to every guest answering SSH, for one and three guests.

Usage: python benchmarks/boot.py [--runs N] [--accel auto|kvm|tcg] [--json]

Each run brings up a fresh lab (guests with an e1000 NIC on one network),
measures the wall time of `up` (start of QEMU to SSH-ready for all guests,
image already built), reads each guest's own boot timeline from
/run/labctl-boot.log, and takes the lab down. Prints the median and the
range per lab size, with the accelerator used.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labctl.image.recipe import load_recipe  # noqa: E402
from labctl.image.store import ImageStore  # noqa: E402
from labctl.lab import load_lab_text  # noqa: E402
from labctl.ssh import Session  # noqa: E402
from labctl.up.lifecycle import UpOptions, down, up  # noqa: E402
from labctl.up.runstate import LabState  # noqa: E402


def lab_text(n: int) -> str:
    guests = "".join(f"  g{i}:\n    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.50.0.{i + 1}/24}}]\n"
                     for i in range(n))
    return f"name: bench-boot-{n}\nnetworks: {{lan: {{}}}}\nguests:\n{guests}"


def guest_timeline(state: LabState, guest: str) -> dict[str, float]:
    with Session(state.endpoint(guest)) as s:
        out = s.run("cat /run/labctl-boot.log", timeout=30).stdout.decode()
    marks = {}
    for line in out.splitlines():
        t, what = line.split(" ", 1)
        marks[what] = float(t)
    return marks


def one_run(n: int, accel: str) -> dict[str, object]:
    image = ImageStore().require("debian-12")
    lab = load_lab_text(lab_text(n), f"bench-{n}.yaml")
    t0 = time.monotonic()
    state = up(lab, image, UpOptions(accel=accel))
    wall = time.monotonic() - t0
    try:
        timeline = guest_timeline(state, "g0")
    finally:
        down(lab.name)
    return {"guests": n, "accel": state.accel, "up_seconds": round(wall, 2),
            "guest_uptime_at_ready": timeline.get("ready"), "guest_timeline": timeline}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--accel", default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # refused connections while sshd starts
    load_recipe("debian-12")
    results = []
    with tempfile.TemporaryDirectory(prefix="lb-") as state_dir:
        os.environ["LABCTL_STATE_DIR"] = state_dir
        for n in (1, 3):
            runs = [one_run(n, args.accel) for _ in range(args.runs)]
            ups = [float(r["up_seconds"]) for r in runs]  # type: ignore[arg-type]
            results.append({"guests": n, "accel": runs[0]["accel"], "runs": len(runs),
                            "median_s": round(statistics.median(ups), 2), "min_s": min(ups), "max_s": max(ups),
                            "guest_uptime_at_ready_s": runs[-1]["guest_uptime_at_ready"],
                            "guest_timeline": runs[-1]["guest_timeline"]})
    if args.json:
        print(json.dumps({"host_cpus": os.cpu_count(), "results": results}, indent=2))
        return 0
    print(f"labctl boot benchmark ({os.cpu_count()} host CPUs, image debian-12)")
    for r in results:
        print(f"  {r['guests']} guest(s), {r['accel']}: up to SSH-ready median {r['median_s']} s "
              f"(min {r['min_s']}, max {r['max_s']}, {r['runs']} runs); "
              f"guest kernel+init to READY {r['guest_uptime_at_ready_s']} s")
        tl = r["guest_timeline"]
        print("    guest timeline (uptime s): " + ", ".join(f"{k} {v}" for k, v in tl.items()))  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
