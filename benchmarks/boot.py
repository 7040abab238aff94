#!/usr/bin/env python3
"""Time from `labctl up` to every guest answering SSH, for one and three guests: a cold boot
and a warm start (restored from post-boot snapshots); `labctl reset` of one guest; what an idle
guest costs the host; many instances of a three-guest lab on one host.

Usage: python benchmarks/boot.py [--runs N] [--accel auto|kvm|tcg] [--instances N] [--json]
                                 [--previous FILE]

Each run brings up a fresh lab (guests with an e1000 NIC on one network),
measures the wall time of `up` (start of QEMU to SSH-ready for all guests,
image and kernel already prepared) and the slowest guest's own figure
(QEMU started to SSH answering), reads a booted guest's timeline from
/run/labctl-boot.log, and takes the lab down. Cold runs boot (and the first
one takes the snapshots anew), warm runs restore. With the lab up, `reset` of
one guest is timed (in warm labs, and in the cold lab that took the snapshot;
both install the guest's own keys again), and each QEMU's proportional set size (PSS) and CPU share
while idle for 10 s are read from /proc. Last, `--instances N` copies of the
three-guest lab are brought up warm side by side, each guest is reached over
SSH, and the host's memory is read (0 skips it). Prints medians and ranges;
with ``--previous FILE`` (an earlier run's ``--json``, of the code before a
change: run both on one host, one after the other), each median beside that
run's. labctl against virtme-ng: benchmarks/vs_virtme.py.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labctl.image.recipe import load_recipe
from labctl.image.store import ImageStore
from labctl.lab import load_lab_text
from labctl.pipeline import prepare_kernels
from labctl.ssh import Session
from labctl.state.runstate import LabState
from labctl.training.reset import reset
from labctl.up import find_snapshot, remove_lab_snapshots
from labctl.up.lifecycle import UpOptions, up
from labctl.up.teardown import down

IDLE_WINDOW = 10.0


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


def one_run(n: int, accel: str, cold: bool, idle: bool = False) -> dict[str, object]:
    image = ImageStore().require("debian-12")
    lab = load_lab_text(lab_text(n), f"bench-{n}.yaml")
    t0 = time.monotonic()
    state = up(lab, image, prepare_kernels(lab, image), UpOptions(accel=accel, cold=cold))
    wall = time.monotonic() - t0
    out: dict[str, object] = {"guests": n, "accel": state.accel, "up_seconds": round(wall, 2),
                              "ready_seconds": max(state.ready_seconds.values()),
                              "restored": sorted(state.warm)}
    try:
        if cold:
            timeline = guest_timeline(state, "g0")
            out["guest_uptime_at_ready"], out["guest_timeline"] = timeline.get("ready"), timeline
        if idle:
            out["idle"] = idle_cost(state)
        # Every reset installs the guest's own keys again (sshd reloads): a snapshot holds none.
        # Timed apart in the cold lab that took the snapshot, as before.
        own = cold and find_snapshot(state.snapshots.get("g0")) is not None
        if not cold or own:
            t1 = time.monotonic()
            reset(lab.name, ["g0"])
            out["reset_own_seconds" if own else "reset_seconds"] = round(time.monotonic() - t1, 2)
    finally:
        down(lab.name)
    return out


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def idle_cost(state: LabState) -> dict[str, float]:
    """Per QEMU while the guests idle: PSS (MiB) and CPU share (% of one host CPU)."""
    pids = [r.pid for r in state.guests.values()]
    time.sleep(2.0)  # let the restore or the boot settle
    before = {p: _cpu_ticks(p) for p in pids}
    time.sleep(IDLE_WINDOW)
    hz = os.sysconf("SC_CLK_TCK")
    cpu = [(_cpu_ticks(p) - before[p]) / hz / IDLE_WINDOW * 100 for p in pids]
    pss = [_pss_kib(p) / 1024 for p in pids]
    return {"pss_mib_median": round(statistics.median(pss), 1), "cpu_pct_median": round(statistics.median(cpu), 1),
            "memory_mib": float(next(iter(state.resolved["guests"].values())).get("memory", 512))}


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, val = line.split(":", 1)
        out[key] = int(val.split()[0])
    return out


def _ksm() -> str:
    try:
        run = Path("/sys/kernel/mm/ksm/run").read_text().strip()
        sharing = int(Path("/sys/kernel/mm/ksm/pages_sharing").read_text())
    except OSError:
        return "unavailable"
    return f"run={run}, pages_sharing={sharing} ({sharing * 4 / 1024:.0f} MiB saved)"


def many_instances(count: int, accel: str) -> dict[str, object]:
    """``count`` warm copies of the three-guest lab side by side, each guest reached over SSH."""
    image = ImageStore().require("debian-12")
    base = load_lab_text(lab_text(3), "bench-3.yaml")
    kernels = prepare_kernels(base, image)
    up(base, image, kernels, UpOptions(accel=accel))  # makes sure the snapshots exist
    down(base.name)
    mem0 = _meminfo()
    t0 = time.monotonic()
    labs = []
    try:
        for i in range(count):
            lab = base.with_instance(f"i{i + 1}")
            labs.append(lab)
            up(lab, image, kernels, UpOptions(accel=accel))
        up_s = time.monotonic() - t0
        reached = 0
        for lab in labs:
            state = LabState.load(lab.ident)
            for g in state.guests:
                with Session(state.endpoint(g)) as s:
                    reached += s.run("true", timeout=60).status == 0
        time.sleep(5.0)
        mem1 = _meminfo()
        pids = [r.pid for lab in labs for r in LabState.load(lab.ident).guests.values()]
        pss = sum(_pss_kib(p) for p in pids) / 1024
    finally:
        for lab in labs:
            down(lab.ident)
    used = (mem0["MemAvailable"] - mem1["MemAvailable"]) / 1024
    return {"instances": count, "guests": 3 * count, "reached": reached, "up_all_seconds": round(up_s, 1),
            "host_memory_used_mib": round(used), "qemu_pss_total_mib": round(pss),
            "host_memory_total_mib": round(mem0["MemTotal"] / 1024), "ksm": _ksm()}


def _summary(runs: list[dict[str, object]], key: str) -> dict[str, float]:
    vals = [float(r[key]) for r in runs if r.get(key) is not None]  # type: ignore[arg-type]
    return {"median": round(statistics.median(vals), 2), "min": min(vals), "max": max(vals)} if vals else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--accel", default="auto")
    ap.add_argument("--instances", type=int, default=12, help="copies of the 3-guest lab side by side (0: skip)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--previous", type=Path, help="an earlier run's --json output: its medians printed beside")
    args = ap.parse_args()
    before = {r["guests"]: r for r in json.loads(args.previous.read_text())["results"]} if args.previous else {}
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # refused connections while sshd starts
    load_recipe("debian-12")
    results = []
    crowd = None
    with tempfile.TemporaryDirectory(prefix="lb-") as state_dir:
        os.environ["LABCTL_STATE_DIR"] = state_dir
        for n in (1, 3):
            remove_lab_snapshots(f"bench-boot-{n}")  # its first cold up takes them anew
            cold = [one_run(n, args.accel, cold=True, idle=(i == 0)) for i in range(args.runs)]
            warm = [one_run(n, args.accel, cold=False, idle=(i == 0)) for i in range(args.runs)]
            results.append({"guests": n, "accel": cold[0]["accel"], "runs": args.runs,
                            "cold_up_s": _summary(cold, "up_seconds"), "cold_ready_s": _summary(cold, "ready_seconds"),
                            "warm_up_s": _summary(warm, "up_seconds"), "warm_ready_s": _summary(warm, "ready_seconds"),
                            "warm_restored_all": all(len(r["restored"]) == n for r in warm),  # type: ignore[arg-type]
                            "reset_s": _summary(warm, "reset_seconds"),
                            "reset_own_s": _summary(cold, "reset_own_seconds"),
                            "idle_cold": cold[0]["idle"], "idle_warm": warm[0]["idle"],
                            "guest_uptime_at_ready_s": cold[-1].get("guest_uptime_at_ready"),
                            "guest_timeline": cold[-1].get("guest_timeline")})
        if args.instances:
            crowd = many_instances(args.instances, args.accel)
    if args.json:
        print(json.dumps({"host_cpus": os.cpu_count(), "results": results, "instances": crowd}, indent=2))
        return 0
    print(f"labctl boot benchmark ({os.cpu_count()} host CPUs, image debian-12)")
    for r in results:
        c, w, rs = r["cold_up_s"], r["warm_up_s"], r["reset_s"]
        prev = before.get(r["guests"], {})

        def was(key: str, prev: dict[str, Any] = prev) -> str:  # the previous run's median, when given
            m = (prev.get(key) or {}).get("median")
            return f" [before: {m} s]" if m is not None else ""

        print(f"  {r['guests']} guest(s), {r['accel']}, {r['runs']} runs each (median, min-max):")
        print(f"    cold up to SSH-ready {c['median']} s ({c['min']}-{c['max']}){was('cold_up_s')}; "
              f"guests' own QEMU start to SSH {r['cold_ready_s']['median']} s; kernel+init to READY "
              f"{r['guest_uptime_at_ready_s']} s")
        print(f"    warm up to SSH-ready {w['median']} s ({w['min']}-{w['max']}){was('warm_up_s')}; "
              f"guests' own QEMU start to SSH {r['warm_ready_s']['median']} s; every guest restored: "
              f"{r['warm_restored_all']}")
        print(f"    reset of one guest {rs['median']} s ({rs['min']}-{rs['max']}){was('reset_s')} in a lab started from the "
              "snapshot (its own keys installed again)")
        ro = r["reset_own_s"]
        if ro:
            print(f"    reset of one guest {ro['median']} s ({ro['min']}-{ro['max']}){was('reset_own_s')} in the lab that took the "
                  "snapshot (its own keys installed again)")
        for kind in ("cold", "warm"):
            i = r[f"idle_{kind}"]
            print(f"    idle after a {kind} up: PSS {i['pss_mib_median']} MiB of {i['memory_mib']:.0f} MiB, "
                  f"CPU {i['cpu_pct_median']}% of one host CPU (per guest, median over {IDLE_WINDOW:.0f} s)")
        tl = r["guest_timeline"] or {}
        print("    cold guest timeline (uptime s): " + ", ".join(f"{k} {v}" for k, v in tl.items()))
    if crowd:
        print(f"  {crowd['instances']} instances x 3 guests: {crowd['reached']}/{crowd['guests']} reached over SSH; "
              f"all up (warm) in {crowd['up_all_seconds']} s; host memory used {crowd['host_memory_used_mib']} MiB "
              f"of {crowd['host_memory_total_mib']} MiB (QEMU PSS total {crowd['qemu_pss_total_mib']} MiB); "
              f"KSM {crowd['ksm']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
