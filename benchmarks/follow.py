#!/usr/bin/env python3
"""What following packets gives and costs (issue 36's targets), on two guests of one direct link.

Usage: python benchmarks/follow.py [--pings 1000] [--seconds 10] [--runs 5] [--modes plain,both] [--busy 3] [--json]
       (boots guests: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

1. **Every packet's path.** ``labctl follow LAB icmp --json`` while guest a pings b ``--pings`` times
   every 10 ms: how many requests and replies came out with their full path (a: net_dev_queue,
   net_dev_start_xmit; the wire; b: netif_receive_skb, ip_local_deliver, answered;
   and the reply's way back to ping on a), how many are missing, how many hops are out of order
   beyond the clocks' bounds; and how long after a packet's last hop its path was printed (the
   benchmark stamps each line as it reads it: the same host clock labctl maps the guests onto).
2. **The cost.** iperf3 a → b for ``--seconds``, in alternating runs: with nothing (``plain``), with every
   guest's drops recorded (``drops``: labctl.follow.dropwatch, as each step does), with ``labctl follow LAB
   icmp --no-wire`` running (``follow``: its probes filter the TCP stream out in the kernel), with both
   (``both``: the issue's target), and with both and follow's wire captures (``wire``: QEMU writes each
   frame's first 96 bytes on both NICs). Mean, spread and range of ``--runs`` each; each mode's mean
   ratio to the plain run beside it (the host's load moves between rounds); labctl follow's CPU time.
   Beside throughput, the guests' QEMU CPU seconds per GB moved: what the guests' work costs per byte,
   which another user's load on the host does not move (throughput does, by ±30% here).
3. **What following costs an idle guest**: guest a's busy share of 8 s (``/proc/stat``) without and
   with ``labctl follow`` running: what its heartbeats and clock rounds take, without a stream's noise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's labctl (dropwatch), whichever one the venv installed
LAB = "fbench"
LAB_YAML = """name: fbench
networks: {link: {}}
guests:
  a: {nics: [{name: eth1, model: virtio-net-pci, network: link, ip: 10.77.0.1/24}]}
  b: {nics: [{name: eth1, model: virtio-net-pci, network: link, ip: 10.77.0.2/24}]}
"""
REQUEST = [("a", "dev_queue"), ("a", "xmit"), ("a", "wire"), ("b", "netif_rx"), ("b", "ip_local")]
REPLY = [("b", "dev_queue"), ("b", "xmit"), ("b", "wire"), ("a", "netif_rx"), ("a", "ip_local"),
         ("a", "raw_read")]


def labctl(*args: str, env: dict[str, str], timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed:\n{res.stdout}{res.stderr}")
    return res


class Follow:
    """``labctl follow`` in the background: its JSON lines, each stamped when read."""

    def __init__(self, env: dict[str, str], *args: str, lab: str = LAB) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "labctl", "follow", lab, *args], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[int, dict[str, Any]]] = []
        self.err: list[str] = []
        threading.Thread(target=self._out, daemon=True).start()
        threading.Thread(target=self._errs, daemon=True).start()
        deadline = time.monotonic() + 300
        while not any("following" in e for e in self.err):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("labctl follow did not start:\n" + "".join(self.err))
            time.sleep(0.05)

    def _out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic_ns(), json.loads(line)))

    def _errs(self) -> None:
        assert self.proc.stderr is not None
        self.err.extend(self.proc.stderr)

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> float:
        cpu = self.cpu()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=120)
        time.sleep(0.2)
        return cpu


def _shape(p: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["guest"], h["point"]) for h in p["hops"]]


def ping_paths(env: dict[str, str], pings: int) -> dict[str, Any]:
    f = Follow(env, "icmp", "--json")
    labctl("exec", LAB, "a", "--", f"ping -q -c {pings} -i 0.01 10.77.0.2", env=env, timeout=600)
    time.sleep(3)
    f.stop()
    packets = [p for _, p in f.lines]
    full: dict[str, set[str]] = {"request": set(), "reply": set()}
    partial = []
    for p in packets:
        seq = p["packet"].rsplit(" seq ", 1)[-1]
        if _shape(p) == REQUEST and p["end"]["kind"] == "answered":
            full["request"].add(seq)
        elif _shape(p) == REPLY and p["end"]["kind"] == "delivered":
            full["reply"].add(seq)
        else:
            partial.append({"packet": p["packet"], "end": p["end"]["text"], "hops": _shape(p)})
        if p["out_of_order"]:
            partial.append({"packet": p["packet"], "disordered": [(h["guest"], h["point"], h["t_us"]) for h in p["hops"]]})
    lat = [(t - (p["start_ns"] + round(p["duration_us"] * 1000))) / 1e6 for t, p in f.lines]
    bounds = [e for e in f.err if "clock bounds" in e]
    return {"pings": pings, "packets_printed": len(packets), "requests_full": len(full["request"]),
            "replies_full": len(full["reply"]),
            "missing": 2 * pings - len(full["request"]) - len(full["reply"]),
            "hops_out_of_order": sum(p["out_of_order"] for p in packets),
            "print_after_end_ms": {"p50": round(statistics.median(lat), 1),
                                   "p99": round(sorted(lat)[int(0.99 * len(lat))], 1), "max": round(max(lat), 1),
                                   "over_1s": sum(1 for x in lat if x > 1000)} if lat else None,
            "clocks": bounds[-1].strip() if bounds else None,
            "other_ends": sorted({p["end"]["kind"] for p in packets} - {"answered", "delivered"}),
            "partial": partial[:10]}


def qemu_cpu(env: dict[str, str]) -> float:
    """CPU seconds both guests' QEMU processes used so far (TCG: the vCPU's emulation, mostly)."""
    total = 0.0
    for g in ("a", "b"):
        pid = (Path(env["LABCTL_STATE_DIR"]) / "labs" / LAB / "guests" / g / "qemu.pid").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def stream(env: dict[str, str], seconds: int) -> tuple[float, float]:
    """(Mbit/s, the guests' host CPU seconds per GB moved): the second does not move with the host's load."""
    labctl("exec", LAB, "b", "--", "iperf3 -s -1 -D", env=env)
    time.sleep(1)
    cpu = qemu_cpu(env)
    out = labctl("exec", LAB, "a", "--", f"iperf3 -c 10.77.0.2 -t {seconds} -J", env=env, timeout=300).stdout
    cpu = qemu_cpu(env) - cpu
    got = json.loads(out)["end"]["sum_received"]
    return float(got["bits_per_second"]) / 1e6, cpu / (float(got["bytes"]) / 1e9)


MODES = ("plain", "drops", "follow", "both", "wire")


def watched_stream(env: dict[str, str], seconds: int, mode: str) -> tuple[tuple[float, float], float, dict[str, int]]:
    """((Mbit/s, CPU s per GB), labctl follow's CPU s, drops recorded) in one of :data:`MODES`."""
    from labctl.follow import finish_dropwatch, start_dropwatch
    from labctl.ssh import Session
    from labctl.state import LabState

    if mode == "plain":
        return stream(env, seconds), 0.0, {}
    state = LabState.load(LAB)
    sessions = {g: Session(state.endpoint(g)) for g in ("a", "b")}
    watches = {g: start_dropwatch(state, g, s) for g, s in sessions.items()} if mode != "follow" else {}
    f = Follow(env, "icmp", "--json", *(() if mode == "wire" else ("--no-wire",))) if mode != "drops" else None
    try:
        mbit = stream(env, seconds)
    finally:
        cpu = f.stop() if f is not None else 0.0
        drops: dict[str, int] = {}
        for g, w in watches.items():
            if w is not None:
                text, _, _ = finish_dropwatch(w, sessions[g])
                for line in text.splitlines():
                    if " drop: " in line:
                        where = line.split(" loc=", 1)[-1].split("+")[0] + " reason " + (
                            line.split(" reason=", 1)[-1].split()[0] if " reason=" in line else "?")
                        drops[f"{g} {where}"] = drops.get(f"{g} {where}", 0) + 1
        for session in sessions.values():
            session.close()
    return mbit, cpu, drops


def guest_busy(env: dict[str, str], follow: bool) -> float:
    """Guest a's busy share (%) of 8 idle seconds, with ``labctl follow`` running or not."""
    f = Follow(env, "icmp", "--json", "--no-wire") if follow else None
    try:
        time.sleep(2)
        out = labctl("exec", LAB, "a", "--", "head -1 /proc/stat; sleep 8; head -1 /proc/stat", env=env).stdout
    finally:
        if f is not None:
            f.stop()
    a, b = ([int(x) for x in line.split()[1:]] for line in out.splitlines()[:2])
    d = [y - x for x, y in zip(a, b, strict=True)]
    return 100 * (sum(d) - d[3] - d[4]) / sum(d)


def spread(values: list[float]) -> dict[str, Any]:
    return {"mean": round(statistics.mean(values), 1), "sd": round(statistics.pstdev(values), 1),
            "min": round(min(values), 1), "max": round(max(values), 1), "all": [round(v, 1) for v in values]}


def compared(runs: dict[str, list[float]]) -> dict[str, Any]:
    """Each mode's spread, how much lower its mean is than plain's, and the mean of each run's ratio to the
    plain run of its round."""
    plain = runs["plain"]
    return {mode: {**spread(values), "lower_pct": round(100 * (1 - statistics.mean(values) / statistics.mean(plain)), 1),
                   "paired_lower_pct": round(100 * (1 - statistics.mean(v / p for v, p in zip(values, plain, strict=True))), 1)}
            for mode, values in runs.items()}


def cost_of(runs: dict[str, list[tuple[float, float]]], cpu: list[float], drops: list[dict[str, int]],
            seconds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seconds": seconds, "runs": len(runs["plain"]),
                           "modes": compared({m: [v[0] for v in values] for m, values in runs.items()}),
                           "cpu_s_per_gb": compared({m: [v[1] for v in values] for m, values in runs.items()})}
    out["follow_cpu_s"] = round(statistics.median(cpu), 2) if cpu else None
    out["drops_recorded"] = drops
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help=f"the cost's modes, of {', '.join(MODES)}")
    parser.add_argument("--busy", type=int, default=3, help="rounds of the idle guest's busy share")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fbench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        os.environ["LABCTL_STATE_DIR"] = env["LABCTL_STATE_DIR"]
        (Path(tmp) / "lab.yaml").write_text(LAB_YAML)
        labctl("up", str(Path(tmp) / "lab.yaml"), "--accel", "tcg", env=env)
        try:
            paths = ping_paths(env, args.pings) if args.pings else None
            busy: dict[str, list[float]] = {"off": [], "on": []}
            for _ in range(args.busy):
                busy["off"].append(guest_busy(env, False))
                busy["on"].append(guest_busy(env, True))
            runs: dict[str, list[tuple[float, float]]] = {m: [] for m in args.modes.split(",")}
            cpu: list[float] = []
            drops: list[dict[str, int]] = []
            for _ in range(args.runs):
                for mode, values in runs.items():
                    mbit, secs, n = watched_stream(env, args.seconds, mode)
                    values.append(mbit)
                    if mode == "both":
                        cpu.append(secs)
                        drops.append(n)
        finally:
            labctl("down", LAB, env=env, check=False)
    cost = cost_of(runs, cpu, drops, args.seconds) if args.runs and "plain" in runs else None
    result = {"paths": paths, "cost": cost,
              "idle_guest_busy_pct": {k: spread(v) for k, v in busy.items()} if args.busy else None}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if paths:
            print(f"{args.pings} pings every 10 ms: {paths['requests_full']} requests and {paths['replies_full']} "
                  f"replies with their full path, {paths['missing']} missing, {paths['hops_out_of_order']} hops out "
                  f"of order; printed {paths['print_after_end_ms']} ms after their last hop; {paths['clocks']}")
        if cost:
            print(f"iperf3 {args.seconds} s, {cost['runs']} alternating runs (Mbit/s mean ± sd, range; lower than plain: "
                  "of the means, and the mean of each run's ratio to its plain run):")
            for mode, m in cost["modes"].items():
                c = cost["cpu_s_per_gb"][mode]
                print(f"  {mode:<7} {m['mean']:6.1f} ± {m['sd']:<5} ({m['min']}-{m['max']})  {m['lower_pct']:5.1f}%  "
                      f"paired {m['paired_lower_pct']:5.1f}%;  guests' host CPU {c['mean']} ± {c['sd']} s/GB "
                      f"({-c['lower_pct']:+.1f}%, paired {-c['paired_lower_pct']:+.1f}%)")
            print(f"  labctl follow used {cost['follow_cpu_s']} s of CPU a run")
        if args.busy:
            print("idle guest busy: " + ", ".join(f"follow {k} {spread(v)['mean']}% ({spread(v)['min']}-{spread(v)['max']})"
                                                  for k, v in busy.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
