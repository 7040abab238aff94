#!/usr/bin/env python3
"""A room on one host: --students instances of a three-guest lab (256 MiB a guest) brought up
by `labctl class up` without --overcommit, every guest reached over SSH, what the idle room
costs the host, and KSM measured off and on.

Usage: python benchmarks/room.py [--students 24] [--memory 256] [--idle 30] [--ksm-scans 2]
                                 [--accel auto|kvm|tcg] [--json]

In a private state directory (the image, kernel and snapshots are the user's cache):

1. the capacity estimate `labctl up --dry-run --instances N --json` prints, before and after
   the lab's snapshots exist (a restored guest is counted at its snapshot's pages plus a
   quarter of its memory to grow into, a booting one at its whole memory);
2. `labctl class up` of N students from a roster, timed (the first instance boots cold and
   takes the snapshots unless they exist, the others restore);
3. `labctl class status --json`: each guest running and answering SSH;
4. idle for --idle seconds: the QEMUs' CPU time (from /proc/PID/stat) as a share of one host
   core, their proportional set size (PSS), the host's MemAvailable drop;
5. KSM on (/sys/kernel/mm/ksm/run=1, pages_to_scan raised so a full scan takes about a
   minute): after --ksm-scans full scans, the memory it shares (pages_sharing), MemAvailable,
   and ksmd's own CPU over the idle window; then KSM back to how it was (run=2 unmerges);
6. `labctl class down`.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.up.capacity import meminfo

KSM = Path("/sys/kernel/mm/ksm")

LAB = """\
name: room
networks:
  lan: {{}}
guests:
  a:
    memory: {memory}
    nics: [{{name: eth1, model: e1000, network: lan, ip: 10.97.0.1/24}}]
  b:
    memory: {memory}
    nics: [{{name: eth1, model: virtio-net-pci, network: lan, ip: 10.97.0.2/24}}]
  c:
    memory: {memory}
    nics: [{{name: eth1, model: rtl8139, network: lan, ip: 10.97.0.3/24}}]
checks:
  - name: neighbours
    guest: a
    command: ping -c1 -W2 10.97.0.2 && ping -c1 -W2 10.97.0.3
    timeout: 20
"""


def labctl(env: dict[str, str], *args: str, timeout: float = 3600, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=check)


def cpu_ticks(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def pss_kib(pid: int, field: str = "Pss") -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def qemu_pids(state_dir: Path) -> list[int]:
    """QEMUs whose command line names a run directory under ``state_dir``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and any(str(state_dir).encode() in a for a in argv):
            pids.append(int(d.name))
    return pids


def ksmd_pid() -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == "ksmd":
                    return int(d.name)
            except OSError:
                continue
    return None


def idle_window(pids: list[int], seconds: float, extra: int | None = None) -> dict[str, float]:
    hz = os.sysconf("SC_CLK_TCK")
    before = {p: cpu_ticks(p) for p in pids}
    extra0 = cpu_ticks(extra) if extra else 0
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    used = sum(cpu_ticks(p) - before[p] for p in pids) / hz
    out = {"seconds": round(wall, 1), "qemu_cpu_pct_of_a_core": round(100 * used / wall, 1),
           "per_guest_pct": round(100 * used / wall / max(1, len(pids)), 2)}
    if extra:
        out["ksmd_cpu_pct_of_a_core"] = round(100 * (cpu_ticks(extra) - extra0) / hz / wall, 1)
    return out


def estimate(env: dict[str, str], lab: Path, n: int) -> dict[str, object]:
    res = labctl(env, "up", str(lab), "--dry-run", "--json", "--instances", str(n), "--accel", "tcg", check=False)
    try:
        data = json.loads(res.stdout)
    except ValueError:
        return {"error": (res.stdout + res.stderr).strip()[-300:]}
    return {"fits": data.get("fits"), "sentence": data.get("capacity")}


def ksm_write(name: str, value: str) -> None:
    (KSM / name).write_text(value)


def ksm_read(name: str) -> int:
    return int((KSM / name).read_text())


def measure_ksm(pids: list[int], scans: int, idle: float) -> dict[str, object]:
    if not (KSM / "run").exists():
        return {"error": "no /sys/kernel/mm/ksm on this host"}
    saved = {k: (KSM / k).read_text().strip() for k in ("run", "pages_to_scan", "sleep_millisecs")}
    avail0 = meminfo()["MemAvailable"]
    pid = ksmd_pid()
    try:
        ksm_write("pages_to_scan", "5000")
        ksm_write("sleep_millisecs", "20")
        ksm_write("run", "1")
        start = ksm_read("full_scans")
        t0 = time.monotonic()
        while ksm_read("full_scans") < start + scans and time.monotonic() - t0 < 1800:
            time.sleep(2)
        settle_s = time.monotonic() - t0
        win = idle_window(pids, idle, pid)
        sharing, shared = ksm_read("pages_sharing"), ksm_read("pages_shared")
        avail1 = meminfo()["MemAvailable"]
        pss = sum(pss_kib(p) for p in pids) / 1024
        # the same scan rate as the kernel's default (100 pages every 20 ms) once the room is merged
        ksm_write("pages_to_scan", saved["pages_to_scan"])
        default_win = idle_window(pids, idle, pid)
    finally:
        ksm_write("run", "2")  # unmerge every page
        ksm_write("pages_to_scan", saved["pages_to_scan"])
        ksm_write("sleep_millisecs", saved["sleep_millisecs"])
        time.sleep(3)
        ksm_write("run", saved["run"] if saved["run"] != "2" else "0")
    return {"full_scans": scans, "seconds_to_merge": round(settle_s, 1),
            "saved_mib": round(sharing * 4 / 1024), "pages_shared": shared, "pages_sharing": sharing,
            "mem_available_gain_mib": round((avail1 - avail0) / 1024), "qemu_pss_total_mib": round(pss),
            "idle_fast_scan": win, "idle_default_scan": default_win}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=24)
    ap.add_argument("--memory", type=int, default=256)
    ap.add_argument("--idle", type=float, default=30.0)
    ap.add_argument("--ksm-scans", type=int, default=2, help="full KSM scans before measuring (0: skip KSM)")
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, object] = {"students": args.students, "guests": 3 * args.students, "memory_mib": args.memory,
                              "host_cpus": os.cpu_count(), "host_memory_mib": meminfo()["MemTotal"] // 1024}
    with tempfile.TemporaryDirectory(prefix="labctl-room-") as tmp:
        os.chmod(tmp, 0o700)
        state_dir = Path(tmp) / "state"
        env = {**os.environ, "LABCTL_STATE_DIR": str(state_dir)}
        lab = Path(tmp) / "room.yaml"
        lab.write_text(LAB.format(memory=args.memory))
        roster = Path(tmp) / "roster.txt"
        roster.write_text("\n".join(f"s{i:02d}" for i in range(1, args.students + 1)) + "\n")
        out["estimate_before"] = estimate(env, lab, args.students)
        mem0 = meminfo()
        t0 = time.monotonic()
        up = labctl(env, "class", "up", str(lab), "--roster", str(roster), "--out", str(Path(tmp) / "handouts"),
                    "--accel", args.accel, check=False)
        out["class_up_s"] = round(time.monotonic() - t0, 1)
        out["class_up_exit"] = up.returncode
        try:
            if up.returncode != 0:
                out["class_up_error"] = (up.stdout + up.stderr).strip()[-600:]
                return _print(out, args)
            out["estimate_after"] = estimate(env, lab, args.students)
            status = json.loads(labctl(env, "class", "status", "--json").stdout)
            rows = status["students"] if isinstance(status, dict) else status
            out["guests_up_answering_ssh"] = sum(1 for r in rows for s in r["guests"].values() if s == "up")
            check = labctl(env, "class", "check", "--json", check=False)
            out["class_check_exit"] = check.returncode
            pids = qemu_pids(state_dir)
            out["qemus"] = len(pids)
            time.sleep(5)
            out["idle"] = idle_window(pids, args.idle)
            mem1 = meminfo()
            each = sorted(pss_kib(p) / 1024 for p in pids)
            anon = sorted(pss_kib(p, "Anonymous") / 1024 for p in pids)  # a guest's own (a clone's: issue 52)
            out["memory"] = {"qemu_anonymous_per_guest_mib": {"median": round(anon[len(anon) // 2]),
                                                              "min": round(anon[0]), "max": round(anon[-1])}
                             if anon else None,"mem_available_drop_mib": round((mem0["MemAvailable"] - mem1["MemAvailable"]) / 1024),
                             "qemu_pss_total_mib": round(sum(each)),
                             "qemu_pss_per_guest_mib": {"median": round(each[len(each) // 2]), "min": round(each[0]),
                                                        "max": round(each[-1])} if each else None}
            if args.ksm_scans:
                out["ksm"] = measure_ksm(pids, args.ksm_scans, args.idle)
        finally:
            t1 = time.monotonic()
            labctl(env, "class", "down", timeout=1800, check=False)
            out["class_down_s"] = round(time.monotonic() - t1, 1)
    return _print(out, args)


def _print(out: dict[str, object], args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if out.get("class_up_exit") == 0 else 1
    for k, v in out.items():
        print(f"{k}: {json.dumps(v)}")
    return 0 if out.get("class_up_exit") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
