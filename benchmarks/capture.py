#!/usr/bin/env python3
"""What capturing a lab NIC costs: the same TCP stream with and without a capture of the receiving NIC.

Usage: python benchmarks/capture.py [--seconds S] [--runs N] [--json]
       (boots guests: run it under ``flock /tmp/labctl-e2e.lock`` on a shared machine)

One lab of two guests (virtio-net-pci on a direct link), kept up for all
runs. Each run is an iperf3 stream of ``--seconds`` from sender to receiver,
alternately with nothing captured and with ``labctl capture`` of the
receiver's NIC writing pcapng to a file (QEMU's ``filter-dump`` writes every
frame to disk, labctl follows the file and writes the real-time pcapng).
Reported, as medians: throughput without and with the capture, the capture's
frames and bytes, and the host CPU labctl's capture process used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAB = """name: capbench
networks: {link: {}}
guests:
  sender: {nics: [{name: eth1, model: virtio-net-pci, network: link, ip: 10.79.0.1/24}]}
  receiver: {nics: [{name: eth1, model: virtio-net-pci, network: link, ip: 10.79.0.2/24}]}
"""


def labctl(*args: str, env: dict[str, str], timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "labctl", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=False,
                         timeout=timeout)
    if check and res.returncode != 0:
        raise SystemExit(f"labctl {' '.join(args)} failed:\n{res.stdout}{res.stderr}")
    return res


def stream(env: dict[str, str], seconds: int) -> float:
    """Mbit/s of one iperf3 stream sender -> receiver."""
    labctl("exec", "capbench", "receiver", "--", "iperf3 -s -1 -D", env=env)
    time.sleep(1)
    out = labctl("exec", "capbench", "sender", "--", f"iperf3 -c 10.79.0.2 -t {seconds} -J", env=env).stdout
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 1e6


def captured_stream(env: dict[str, str], seconds: int, target: Path) -> tuple[float, int, float]:
    """(Mbit/s, bytes written, CPU seconds of labctl's capture process) of one stream while capturing."""
    proc = subprocess.Popen([sys.executable, "-m", "labctl", "capture", "capbench", "receiver", "eth1", "-w",
                             str(target)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    state = Path(env["LABCTL_STATE_DIR"]) / "labs" / "capbench" / "captures"
    while not list(state.glob("*.json")):
        time.sleep(0.05)
    try:
        mbit = stream(env, seconds)
        time.sleep(1)  # the capture catches up with the file
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    m = re.search(r"(\d+) frames", err)
    assert m, err
    return mbit, target.stat().st_size, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="capbench-") as tmp:
        env = {**os.environ, "LABCTL_STATE_DIR": f"{tmp}/st", "PYTHONPATH": str(ROOT)}
        lab = Path(tmp) / "capbench.yaml"
        lab.write_text(LAB)
        labctl("up", str(lab), "--accel", "tcg", env=env)
        plain, captured, sizes, cpu = [], [], [], []
        try:
            for i in range(args.runs):
                plain.append(stream(env, args.seconds))
                mbit, size, secs = captured_stream(env, args.seconds, Path(tmp) / f"run{i}.pcapng")
                captured.append(mbit)
                sizes.append(size)
                cpu.append(secs)
        finally:
            labctl("down", "capbench", env=env, check=False)
    result = {"seconds": args.seconds, "runs": args.runs,
              "plain_mbit_s": round(statistics.median(plain), 1), "captured_mbit_s": round(statistics.median(captured), 1),
              "capture_mbyte": round(statistics.median(sizes) / 1e6, 1),
              "capture_cpu_s": round(statistics.median(cpu), 2),
              "all": {"plain": plain, "captured": captured, "bytes": sizes, "cpu_s": cpu}}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"iperf3 {args.seconds} s, median of {args.runs}: {result['plain_mbit_s']} Mbit/s without capture, "
              f"{result['captured_mbit_s']} Mbit/s with the receiver's NIC captured "
              f"({result['capture_mbyte']} MB of pcapng; labctl capture used {result['capture_cpu_s']} s of CPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
