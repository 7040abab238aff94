#!/usr/bin/env python3
"""Issue 48's first target: a 1,000-packet IPv6 ping through a router guest, followed.

Usage: python benchmarks/follow_ipv6.py [--pings 1000] [--interval 0.01] [--json]
       (boots three guests: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

Boots labs/dual-stack-router.yaml (a in a bridge, r forwarding, b behind a bond; its steps left out),
runs ``labctl follow LAB 'icmp6 and host fd00:1::2 and host fd00:2::2' --json`` while a pings b's bond
``--pings`` times, and counts: requests with their full path (a's bridge and NIC, the wire, r's
ip6_forward and eth2, the wire, b's eth1 and ip6_input) answered by b's kernel, replies with theirs
(b's bond and eth1, the wire, r, the wire, a's NIC and bridge, ip6_input) delivered to ping on a, the
missing ones, the hops out of order beyond the clocks' bounds, and how long after a packet's last hop
its path was printed (stamped as read, on the host clock labctl maps the guests onto).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from follow import Follow, labctl  # the benchmark beside this one

LAB = "f6bench"
FILTER = "icmp6 and host fd00:1::2 and host fd00:2::2"
A_OUT = [("a", "dev_queue", "br0"), ("a", "xmit", "br0"), ("a", "dev_queue", "eth1"), ("a", "xmit", "eth1"),
         ("a", "wire", None), ("r", "netif_rx", "eth1"), ("r", "ip6_fwd", None), ("r", "dev_queue", "eth2"),
         ("r", "xmit", "eth2"), ("r", "wire", None), ("b", "netif_rx", "eth1"), ("b", "ip6_local", None)]
B_OUT = [("b", "dev_queue", "bond0"), ("b", "xmit", "bond0"), ("b", "dev_queue", "eth1"), ("b", "xmit", "eth1"),
         ("b", "wire", None), ("r", "netif_rx", "eth2"), ("r", "ip6_fwd", None), ("r", "dev_queue", "eth1"),
         ("r", "xmit", "eth1"), ("r", "wire", None), ("a", "netif_rx", "eth1"), ("a", "netif_rx", "br0"),
         ("a", "ip6_local", None), ("a", "sock_read", None)]


def lab_yaml() -> str:
    text = (ROOT / "labs" / "dual-stack-router.yaml").read_text()
    return text.split("\nsteps:", 1)[0].replace("name: dual-stack-router", f"name: {LAB}") + "\n"


def _shape(p: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(h["guest"], h["point"], h.get("dev") if h["point"] != "wire" else None) for h in p["hops"]]


def ping_paths(env: dict[str, str], pings: int, interval: float) -> dict[str, Any]:
    f = Follow(env, FILTER, "--json", lab=LAB)
    labctl("exec", LAB, "a", "--", f"ping -6 -q -c {pings} -i {interval} fd00:2::2", env=env, timeout=1200)
    time.sleep(3)
    f.stop()
    packets = [p for _, p in f.lines]
    full: dict[str, set[str]] = {"request": set(), "reply": set()}
    partial: list[dict[str, Any]] = []
    disordered: list[dict[str, Any]] = []
    for p in packets:
        seq = p["packet"].rsplit(" seq ", 1)[-1]
        if _shape(p) == A_OUT and p["end"]["kind"] == "answered":
            full["request"].add(seq)
        elif _shape(p) == B_OUT and p["end"]["kind"] == "delivered":
            full["reply"].add(seq)
        else:
            partial.append({"packet": p["packet"], "end": p["end"]["text"], "hops": _shape(p)})
        if p["out_of_order"]:
            disordered.append({"packet": p["packet"], "hops": [(h["guest"], h["point"], h["t_us"], h.get("note", ""))
                                                               for h in p["hops"]]})
    lat = [(t - (p["start_ns"] + round(p["duration_us"] * 1000))) / 1e6 for t, p in f.lines]
    bounds = [e for e in f.err if "clock bounds" in e]
    return {"pings": pings, "interval_s": interval, "packets_printed": len(packets),
            "requests_full": len(full["request"]), "replies_full": len(full["reply"]),
            "missing": 2 * pings - len(full["request"]) - len(full["reply"]),
            "hops_out_of_order": sum(p["out_of_order"] for p in packets),
            "print_after_end_ms": {"p50": round(statistics.median(lat), 1),
                                   "p99": round(sorted(lat)[int(0.99 * len(lat))], 1), "max": round(max(lat), 1),
                                   "over_1s": sum(1 for x in lat if x > 1000)} if lat else None,
            "clocks": bounds[-1].strip() if bounds else None, "partial": partial[:10],
            "packets_out_of_order": len(disordered), "disordered": disordered[:5]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pings", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=0.01)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="f6bench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        (Path(tmp) / "lab.yaml").write_text(lab_yaml())
        labctl("up", str(Path(tmp) / "lab.yaml"), "--accel", "tcg", env=env, timeout=1800)
        try:
            result = ping_paths(env, args.pings, args.interval)
        finally:
            labctl("down", LAB, env=env, check=False)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    return 0 if result["missing"] == 0 and result["hops_out_of_order"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
