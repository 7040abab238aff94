#!/usr/bin/env python3
"""What following packets gives and costs (issue 36's targets), on two guests of one direct link.

Usage: python benchmarks/follow.py [--pings 1000] [--seconds 10] [--runs 5] [--json]
       (boots guests: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

1. **Every packet's path.** ``labctl follow LAB icmp --json`` while guest a pings b ``--pings`` times
   every 10 ms: how many requests and replies came out with their full path (a: net_dev_queue,
   net_dev_start_xmit; the wire; b: netif_receive_skb, ip_local_deliver, answered;
   and the reply's way back to ping on a), how many are missing, how many hops are out of order
   beyond the clocks' bounds; and how long after a packet's last hop its path was printed (the
   benchmark stamps each line as it reads it: the same host clock labctl maps the guests onto).
2. **The cost.** iperf3 a → b for ``--seconds``, alternately with nothing, with what a step and ``labctl
   follow`` add (every guest's drops recorded, labctl.follow.dropwatch, as each step does, and
   ``labctl follow LAB icmp --no-wire`` running: its probes filter the TCP stream out in the kernel),
   and with follow's wire captures too (QEMU writes each frame's first 96 bytes on both NICs).
   Medians of ``--runs`` each, and labctl follow's CPU time.
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

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "labctl", "follow", LAB, *args], cwd=ROOT, env=env,
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


def stream(env: dict[str, str], seconds: int) -> float:
    labctl("exec", LAB, "b", "--", "iperf3 -s -1 -D", env=env)
    time.sleep(1)
    out = labctl("exec", LAB, "a", "--", f"iperf3 -c 10.77.0.2 -t {seconds} -J", env=env, timeout=300).stdout
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6


def watched_stream(env: dict[str, str], seconds: int, wire: bool) -> tuple[float, float, dict[str, int]]:
    """(Mbit/s, labctl follow's CPU s, drops recorded) with drops recorded in both guests and follow running
    (``wire``: with its captures of both NICs)."""
    from labctl.follow import dropwatch
    from labctl.ssh import Session
    from labctl.state import LabState

    state = LabState.load(LAB)
    sessions = {g: Session(state.endpoint(g)) for g in ("a", "b")}
    watches = {g: dropwatch.start(state, g, s) for g, s in sessions.items()}
    f = Follow(env, "icmp", "--json", *(() if wire else ("--no-wire",)))
    try:
        mbit = stream(env, seconds)
    finally:
        cpu = f.stop()
        drops: dict[str, int] = {}
        for g, w in watches.items():
            if w is not None:
                text, _, _ = dropwatch.finish(w, sessions[g])
                for line in text.splitlines():
                    if " drop: " in line:
                        where = line.split(" loc=", 1)[-1].split("+")[0] + " reason " + (
                            line.split(" reason=", 1)[-1].split()[0] if " reason=" in line else "?")
                        drops[f"{g} {where}"] = drops.get(f"{g} {where}", 0) + 1
            sessions[g].close()
    return mbit, cpu, drops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fbench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        os.environ["LABCTL_STATE_DIR"] = env["LABCTL_STATE_DIR"]
        (Path(tmp) / "lab.yaml").write_text(LAB_YAML)
        labctl("up", str(Path(tmp) / "lab.yaml"), "--accel", "tcg", env=env)
        try:
            paths = ping_paths(env, args.pings) if args.pings else None
            plain, probed, watched, cpu = [], [], [], []
            drops: list[dict[str, int]] = []
            for _ in range(args.runs):
                plain.append(stream(env, args.seconds))
                probed.append(watched_stream(env, args.seconds, wire=False)[0])
                mbit, secs, n = watched_stream(env, args.seconds, wire=True)
                watched.append(mbit)
                cpu.append(secs)
                drops.append(n)
        finally:
            labctl("down", LAB, env=env, check=False)
    cost = None
    if plain:
        p, q, w = statistics.median(plain), statistics.median(probed), statistics.median(watched)
        cost = {"seconds": args.seconds, "runs": args.runs, "plain_mbit_s": round(p, 1),
                "probes_mbit_s": round(q, 1), "probes_lower_pct": round(100 * (p - q) / p, 1),
                "watched_mbit_s": round(w, 1), "lower_pct": round(100 * (p - w) / p, 1),
                "follow_cpu_s": round(statistics.median(cpu), 2),
                "drops_recorded": drops, "all": {"plain": plain, "probes": probed, "watched": watched}}
    result = {"paths": paths, "cost": cost}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        if paths:
            print(f"{args.pings} pings every 10 ms: {paths['requests_full']} requests and {paths['replies_full']} "
                  f"replies with their full path, {paths['missing']} missing, {paths['hops_out_of_order']} hops out "
                  f"of order; printed {paths['print_after_end_ms']} ms after their last hop; {paths['clocks']}")
        if cost:
            print(f"iperf3 {args.seconds} s, median of {args.runs}: {cost['plain_mbit_s']} Mbit/s plain, "
                  f"{cost['probes_mbit_s']} Mbit/s with drops recorded and labctl follow --no-wire running "
                  f"({cost['probes_lower_pct']}% lower), {cost['watched_mbit_s']} Mbit/s with its wire captures too "
                  f"({cost['lower_pct']}% lower; follow used {cost['follow_cpu_s']} s of CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
