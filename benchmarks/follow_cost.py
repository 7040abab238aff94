#!/usr/bin/env python3
"""What drops and following cost a TCP stream, measured side by side so that the host's load cancels out.

Usage: python benchmarks/follow_cost.py [--seconds 8] [--rounds 3] [--modes drops,follow,both]
                                       [--path direct|vxlan-nat] [--json]
       (boots four guests, six with vxlan-nat: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

On a shared 2-core host a plain iperf3 run alone ranges over ±30% from one minute to the next (other
people's guests and tests), so that runs one after the other cannot tell a 10% cost. Here two pairs of
guests on two links (a1 → b1, a2 → b2) run iperf3 at the same moment, one pair watched and the other
not: both see the same host, and the host's scheduler gives their vCPU threads the same share, so the
watched pair's throughput over the other's is what the watching costs it per byte. The watched pair
alternates (a pair's own bias k cancels: watched 1 gives (1 - cost)·k, watched 2 (1 - cost)/k; the
cost is 1 - their geometric mean). Modes: ``drops`` (every guest's drops recorded, as each step
does, labctl.follow.dropwatch), ``follow`` (``labctl follow LAB icmp --no-wire --guests aN,bN``
running: its probes filter the TCP stream out in the kernel), ``both`` (the issue's target).

``--path vxlan-nat`` (issue 48's target: at most 10% lower): each pair's stream goes over a VXLAN
tunnel (aN's ``vx0`` to bN's) through a router rN that masquerades the outer packets, and the watched
pair is aN, rN and bN: follow's outer-packet probes on every guest (the lab has a VXLAN tunnel) read
the inner header of each of the stream's packets and filter it out in the kernel.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import follow as fb  # benchmarks/follow.py: labctl(), Follow

LAB = "fpair"
LAB_YAML = """name: fpair
networks: {l1: {}, l2: {}}
guests:
  a1: {nics: [{name: eth1, model: virtio-net-pci, network: l1, ip: 10.78.1.1/24}]}
  b1: {nics: [{name: eth1, model: virtio-net-pci, network: l1, ip: 10.78.1.2/24}]}
  a2: {nics: [{name: eth1, model: virtio-net-pci, network: l2, ip: 10.78.2.1/24}]}
  b2: {nics: [{name: eth1, model: virtio-net-pci, network: l2, ip: 10.78.2.2/24}]}
"""
VXLAN_YAML = """name: fvx
networks: {l1: {}, r1: {}, l2: {}, r2: {}}
guests:
""" + "".join(f"""  a{n}:
    nics: [{{name: eth1, model: virtio-net-pci, network: l{n}, ip: 10.1.{n}.2/24}}]
    routes: [{{to: 10.2.{n}.0/24, via: 10.1.{n}.1}}]
    tunnels: {{vx0: {{type: vxlan, vni: {40 + n}, remote: 10.2.{n}.2, dev: eth1, ip: 192.168.{n}.1/24}}}}
  r{n}:
    nics:
      - {{name: eth1, model: virtio-net-pci, network: l{n}, ip: 10.1.{n}.1/24}}
      - {{name: eth2, model: virtio-net-pci, network: r{n}, ip: 10.2.{n}.1/24}}
    sysctls: {{net.ipv4.ip_forward: 1}}
    firewall: {{nat: {{masquerade: [{{out: eth2}}]}}}}
  b{n}:
    nics: [{{name: eth1, model: virtio-net-pci, network: r{n}, ip: 10.2.{n}.2/24}}]
    routes: [{{to: 10.1.{n}.0/24, via: 10.2.{n}.1}}]
    tunnels: {{vx0: {{type: vxlan, vni: {40 + n}, remote: 10.1.{n}.2, dev: eth1, learning: false, ip: 192.168.{n}.2/24}}}}
""" for n in (1, 2))
PATHS = {"direct": (LAB, LAB_YAML, "10.78.{n}.2", ("a", "b")),
         "vxlan-nat": ("fvx", VXLAN_YAML, "192.168.{n}.2", ("a", "r", "b"))}
MODES = ("drops", "follow", "both")


def streams(env: dict[str, str], seconds: int, path: str = "direct") -> dict[int, float]:
    """Both pairs' iperf3 at once: Mbit/s of pair 1 and pair 2."""
    lab, _, server, _ = PATHS[path]
    for n in (1, 2):
        fb.labctl("exec", lab, f"b{n}", "--", "iperf3 -s -1 -D", env=env)
    got: dict[int, float] = {}

    def client(n: int) -> None:
        out = fb.labctl("exec", lab, f"a{n}", "--", f"iperf3 -c {server.format(n=n)} -t {seconds} -J", env=env,
                        timeout=300).stdout
        got[n] = float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6

    threads = [threading.Thread(target=client, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(got) != 2:
        raise SystemExit("an iperf3 client failed")
    return got


def watched(env: dict[str, str], seconds: int, mode: str, pair: int, path: str = "direct") -> dict[int, float]:
    """Both pairs' Mbit/s with ``pair`` watched in ``mode``."""
    from labctl.follow import finish_dropwatch, start_dropwatch
    from labctl.ssh import Session
    from labctl.state import LabState

    lab, _, _, roles = PATHS[path]
    state = LabState.load(lab)
    guests = [f"{r}{pair}" for r in roles]
    sessions = {g: Session(state.endpoint(g)) for g in guests}
    watches = {g: start_dropwatch(state, g, s) for g, s in sessions.items()} if mode != "follow" else {}
    f = None
    if mode != "drops":
        f = fb.Follow(env, "icmp", "--json", "--no-wire", "--guests", ",".join(guests), lab=lab)
    try:
        return streams(env, seconds, path)
    finally:
        if f is not None:
            f.stop()
        for g, w in watches.items():
            if w is not None:
                finish_dropwatch(w, sessions[g])
        for s in sessions.values():
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--path", choices=sorted(PATHS), default="direct",
                        help="each pair's stream: on one link, or over VXLAN through a masquerading router")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lab, lab_yaml, _, _ = PATHS[args.path]
    modes = args.modes.split(",")
    raw: dict[str, list[dict[str, Any]]] = {m: [] for m in ["plain", *modes]}
    with tempfile.TemporaryDirectory(prefix="fpair-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        os.environ["LABCTL_STATE_DIR"] = env["LABCTL_STATE_DIR"]
        (Path(tmp) / "lab.yaml").write_text(lab_yaml)
        fb.labctl("up", str(Path(tmp) / "lab.yaml"), "--accel", "tcg", env=env)
        try:
            for _ in range(args.rounds):
                raw["plain"].append({"pairs": streams(env, args.seconds, args.path)})
                for mode in modes:
                    for pair in (1, 2):
                        raw[mode].append({"watched": pair,
                                          "pairs": watched(env, args.seconds, mode, pair, args.path)})
        finally:
            fb.labctl("down", lab, env=env, check=False)
    result: dict[str, Any] = {"path": args.path, "seconds": args.seconds, "rounds": args.rounds, "runs": raw,
                              "cost_pct": {}}
    plain = [r["pairs"][1] / r["pairs"][2] for r in raw["plain"]]
    result["plain_pair1_over_pair2"] = {"mean": round(statistics.mean(plain), 3), "all": [round(x, 3) for x in plain]}
    for mode in modes:
        runs = raw[mode]
        costs = []
        for w1, w2 in zip(runs[0::2], runs[1::2], strict=True):
            r1 = w1["pairs"][1] / w1["pairs"][2]  # (1 - cost) * k
            r2 = w2["pairs"][2] / w2["pairs"][1]  # (1 - cost) / k
            costs.append(100 * (1 - math.sqrt(r1 * r2)))
        result["cost_pct"][mode] = {"mean": round(statistics.mean(costs), 1), "sd": round(statistics.pstdev(costs), 1),
                                    "all": [round(c, 1) for c in costs]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"two pairs side by side ({args.path}), iperf3 {args.seconds} s, {args.rounds} rounds; plain pair 1 / pair 2: "
              f"{result['plain_pair1_over_pair2']['all']}")
        for mode, c in result["cost_pct"].items():
            print(f"  {mode:<7} the watched pair {c['mean']}% lower (± {c['sd']}; rounds {c['all']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
