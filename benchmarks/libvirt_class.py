#!/usr/bin/env python3
"""A class spread over libvirt hosts, timed: `class up` of N one-guest students over the lab's
hosts, `class reset` of one student's guest (from the state libvirt saved on its host),
`checkpoint save` and `checkpoint restore` of one instance, and `class down`; each through the
CLI, as a trainer runs them. Beside them, `up` + `down` of the same lab with `--save-state` and
without, which tells what saving the post-boot state adds to a guest's start.

The same class on the first host alone is timed too, warm and with `--cold`: a spread class's
hosts bring their instances up side by side, one host's come up one after another; warm, each
host's first instance boots and the others start from its post-boot state (`--cold`: every
instance boots, as before libvirt classes had warm start). Each instance's own time to ready
(`ready_seconds`) is read from its state, booted or started from a state.

Usage: python benchmarks/libvirt_class.py [--students N] [--resets N] [--uri URI]... [--json]

By default the lab's two hosts are this machine's libvirtd named twice (`qemu:///system` as h1
and h2): placement alternates between them. Give `--uri` twice (e.g. a `qemu+ssh://` URI) to
spread over other hosts. Needs root and libvirtd (scripts/libvirt-setup.sh).
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


def labctl(*args: str, env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    took = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    return took, res


def _instances(state_dir: Path, lab: str, students: list[str]) -> dict[str, str]:
    """student -> how its guest started ("boot" or "from STUDENT") and its seconds to ready."""
    out = {}
    for s in students:
        st = json.loads((state_dir / "labs" / f"{lab}@{s}" / "state.json").read_text())
        origin = st["guests"]["a"]["extra"].get("started_from")
        out[s] = f"{'boot' if not origin else 'from ' + origin.rsplit('@', 1)[1]} {st['ready_seconds']['a']} s"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--resets", type=int, default=3)
    ap.add_argument("--uri", action="append", default=[], help="a host of the lab (twice; default qemu:///system)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    uris = args.uri or ["qemu:///system", "qemu:///system"]
    work = Path(tempfile.mkdtemp(prefix="labctl-bench-vclass-"))
    env = dict(os.environ, LABCTL_STATE_DIR=str(work / "state"))
    name = f"bench-vclass-{os.getpid()}"
    hosts = "".join(f'  h{i + 1}: {{uri: "{u}"}}\n' for i, u in enumerate(uris))
    lab = work / "lab.yaml"
    lab.write_text(f"name: {name}\nhosts:\n{hosts}networks: {{}}\nguests:\n  a: {{memory: 256}}\n")
    roster = work / "roster.txt"
    students = [f"s{i + 1}" for i in range(args.students)]
    roster.write_text("\n".join(students) + "\n")
    extra = ["--no-verify-host-keys"] if any("+ssh" in u for u in uris) else []
    figures: dict[str, object] = {"students": args.students, "hosts": uris}

    # one instance up and down, with and without the saved state (the second of each is timed)
    for flag in ([], ["--save-state"], [], ["--save-state"]):
        took, _ = labctl("up", str(lab), "--instance", "solo", "--accel", "tcg", *flag, *extra, env=env)
        labctl("down", f"{name}@solo", env=env)
        figures["up_saved_s" if flag else "up_plain_s"] = round(took, 2)

    # the same class on the first host alone: its instances come up one after another
    one = work / "one-host.yaml"
    one.write_text(f"name: {name}-one\nhosts:\n  h1: {{uri: \"{uris[0]}\"}}\nnetworks: {{}}\n"
                   "guests:\n  a: {memory: 256}\n")
    for cold in (["--cold"], []):
        took, _ = labctl("class", "up", str(one), "--roster", str(roster), "--out",
                         str(work / f"handouts-one{len(cold)}"), "--accel", "tcg", *cold, *extra, env=env)
        figures["class_up_one_host_cold_s" if cold else "class_up_one_host_s"] = round(took, 2)
        if not cold:
            figures["instances_one_host"] = _instances(work / "state", f"{name}-one", students)
        labctl("class", "down", "--lab", f"{name}-one", env=env)

    try:
        took, res = labctl("class", "up", str(lab), "--roster", str(roster), "--out", str(work / "handouts"),
                           "--accel", "tcg", "--json", *extra, env=env)
    except SystemExit:  # the instances that came up go down
        subprocess.run([sys.executable, "-m", "labctl", "class", "down"], cwd=ROOT, env=env, check=False)
        raise
    figures["class_up_s"] = round(took, 2)
    figures["placement"] = {r["student"]: r["host"] for r in json.loads(res.stdout)["students"]}
    figures["instances"] = _instances(work / "state", name, students)
    try:
        resets = []
        for _ in range(args.resets):
            took, res = labctl("class", "reset", students[-1], env=env)
            resets.append((round(took, 2), res.stdout.strip().rsplit("reset in ", 1)[-1]))
        figures["class_reset_s"] = [r[0] for r in resets]
        figures["class_reset_guest"] = [r[1] for r in resets]
        ident = f"{name}@{students[0]}"
        figures["checkpoint_save_s"] = round(labctl("checkpoint", "save", ident, "c1", env=env)[0], 2)
        figures["checkpoint_restore_s"] = round(labctl("checkpoint", "restore", ident, "c1", env=env)[0], 2)
    finally:
        took, _ = labctl("class", "down", env=env)
        figures["class_down_s"] = round(took, 2)
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"class of {args.students} one-guest students over {', '.join(uris)}")
    print(f"  placement: {figures['placement']}")
    print(f"  class up {figures['class_up_s']} s over the hosts side by side, "
          f"{figures['class_up_one_host_s']} s on {uris[0]} alone "
          f"({figures['class_up_one_host_cold_s']} s with --cold); class down {figures['class_down_s']} s")
    print(f"  each instance, side by side: {figures['instances']}")
    print(f"  each instance, one host: {figures['instances_one_host']}")
    print(f"  up + down of one guest: {figures['up_plain_s']} s plain, {figures['up_saved_s']} s with --save-state")
    rs = figures["class_reset_s"]
    print(f"  class reset (whole command) median {statistics.median(rs)} s of {rs}; "  # type: ignore[arg-type]
          f"the guest back in {figures['class_reset_guest']}")
    print(f"  checkpoint save {figures['checkpoint_save_s']} s, restore {figures['checkpoint_restore_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
