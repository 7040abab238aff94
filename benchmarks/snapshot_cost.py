#!/usr/bin/env python3
"""What the post-boot snapshot costs a cold `up`: pairs of cold ups of the same lab, one taking the
snapshot (the lab's snapshots removed before it, so it boots with the throwaway key, is
snapshotted and given its own key) and one with snapshots off (it boots with its own key and
nothing is saved), run alternately so that both see the same host. For one and three guests.

Usage: python benchmarks/snapshot_cost.py [--pairs N] [--accel auto|kvm|tcg] [--json]

Prints the medians and ranges of `up` (QEMU started to every guest answering SSH with its own
key; image and kernel prepared before) and the median of the pairs' ratios.
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

from labctl.lab import load_lab_text
from labctl.pipeline import prepare
from labctl.up import find_snapshot, remove_lab_snapshots
from labctl.up.lifecycle import UpOptions, up
from labctl.up.teardown import down


class _Quiet:
    def __getattr__(self, _name: str) -> object:
        return lambda *a, **k: None


def lab_text(n: int) -> str:
    guests = "".join(f"  g{i}:\n    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.51.0.{i + 1}/24}}]\n"
                     for i in range(n))
    return f"name: bench-snapcost-{n}\nnetworks: {{lan: {{}}}}\nguests:\n{guests}"


def _one(lab: object, prepared: object, accel: str, snap: bool) -> float:
    name = lab.name  # type: ignore[attr-defined]
    remove_lab_snapshots(name)
    t0 = time.monotonic()
    state = up(lab, prepared.image, prepared.kernels,  # type: ignore[attr-defined,arg-type]
               UpOptions(accel=accel, cold=True, snapshots=snap), _Quiet())  # type: ignore[arg-type]
    took = time.monotonic() - t0
    if snap:
        assert all(find_snapshot(k) is not None for k in state.snapshots.values()), "no snapshot was taken"
    down(state.lab)
    remove_lab_snapshots(name)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--accel", default="tcg")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("LABCTL_STATE_DIR", tempfile.mkdtemp(prefix="labctl-bench-"))
    results = []
    for n in (1, 3):
        lab = load_lab_text(lab_text(n), f"bench-snapcost-{n}.yaml")
        prepared = prepare(lab, _Quiet())  # type: ignore[arg-type]
        _one(lab, prepared, args.accel, False)  # warms the host's caches; not counted
        taken, off = [], []
        for _ in range(args.pairs):
            taken.append(_one(lab, prepared, args.accel, True))
            off.append(_one(lab, prepared, args.accel, False))
        ratios = [a / b for a, b in zip(taken, off)]
        results.append({"guests": n, "pairs": args.pairs, "with_snapshot_s": taken, "snapshots_off_s": off,
                        "median_with": round(statistics.median(taken), 2),
                        "median_off": round(statistics.median(off), 2),
                        "median_ratio": round(statistics.median(ratios), 3)})
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for r in results:
        w, o = r["with_snapshot_s"], r["snapshots_off_s"]
        print(f"{r['guests']} guest(s), {r['pairs']} pairs: cold up taking the snapshot {r['median_with']} s "
              f"({min(w):.2f}-{max(w):.2f}), snapshots off {r['median_off']} s ({min(o):.2f}-{max(o):.2f}); "
              f"median ratio {r['median_ratio']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
