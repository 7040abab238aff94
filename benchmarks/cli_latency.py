#!/usr/bin/env python3
"""labctl's own share of a quick command: wall time of each command, side by side with OpenSSH.

Usage: python benchmarks/cli_latency.py [--lab LAB --guest G] [--runs N] [--json]

Each figure is the median (and range) of N runs (default 10), each a new process as a user or a
script starts it (the console script beside this interpreter, `labctl` as setup.sh links it):

- ``labctl --version``, ``labctl --help`` and ``labctl status`` (with the lab up when ``--lab``);
- with ``--lab``: ``labctl exec LAB G -- true`` and ``ssh -F CFG G true`` over a live OpenSSH
  ControlMaster to the same guest (CFG: ``labctl ssh-config LAB`` plus ``ControlMaster auto``,
  a ``ControlPath`` in a private temporary directory and ``ControlPersist``), timed in alternating
  pairs, with the ratio of the medians;
- ``python -c pass`` (the interpreter's own start) as the floor;
- ``-X importtime``'s ten largest cumulative entries of ``--version`` and ``status``.
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# As a user or a script starts it: the console script pip made beside this interpreter (what
# setup.sh links as /usr/local/bin/labctl); ``python -m labctl`` (runpy: about 4 ms more) without one.
_SCRIPT = Path(sys.executable).with_name("labctl")
LABCTL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "labctl"]


def wall(argv: list[str]) -> float:
    """Seconds ``argv`` takes from start to exit (its output discarded; a failure stops the benchmark).

    Waited for in ``waitpid``, not by ``subprocess.run(timeout=...)``: with a timeout CPython polls
    the child with sleeps that double up to 50 ms, which rounded every figure up to 15.5, 31.5,
    63.5, 113.5, 163.5... ms (measured: labctl exec 164.6 ms against 120 in a shell loop). A hang
    is cut by an alarm instead.
    """
    signal.alarm(120)
    try:
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=ROOT)
        return time.perf_counter() - t0
    finally:
        signal.alarm(0)


def summary(times: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3}


def importtime_top(args: list[str], n: int = 10) -> list[tuple[str, float]]:
    """The ``n`` largest cumulative entries of ``-X importtime`` for ``labctl ARGS`` (module, ms)."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "labctl", *args], capture_output=True,
                         text=True, cwd=ROOT, timeout=120, check=False)
    rows = []
    for line in res.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cum, name = (p.strip() for p in line.removeprefix("import time:").split("|"))
            if cum.isdigit():
                rows.append((name, int(cum) / 1e3))
    return sorted(rows, key=lambda r: -r[1])[:n]


def ssh_master(lab: str, tmp: Path) -> Path:
    """A config for plain OpenSSH to the lab's guests with a ControlMaster in ``tmp`` (0700)."""
    cfg = subprocess.run([*LABCTL, "ssh-config", lab], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=60).stdout
    path = tmp / "ssh_config"
    path.write_text(f"Host *\n  ControlMaster auto\n  ControlPath {tmp}/cm-%C\n  ControlPersist 120\n\n{cfg}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lab")
    ap.add_argument("--guest")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    result: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "load": os.getloadavg()[0], "runs": a.runs}
    cmds = {"python -c pass": [sys.executable, "-c", "pass"], "labctl --version": [*LABCTL, "--version"],
            "labctl --help": [*LABCTL, "--help"], "labctl status": [*LABCTL, "status", *([a.lab] if a.lab else [])]}
    for name, argv in cmds.items():
        wall(argv)  # warm the page cache and the .pyc files
        result[name] = summary([wall(argv) for _ in range(a.runs)])
    if a.lab and a.guest:
        with tempfile.TemporaryDirectory(prefix="cli-latency-") as d:
            tmp = Path(d)
            cfg = ssh_master(a.lab, tmp)
            ssh = ["ssh", "-F", str(cfg), "--", a.guest, "true"]
            lab_exec = [*LABCTL, "exec", a.lab, a.guest, "--", "true"]
            wall(ssh), wall(lab_exec)  # the master starts here
            pairs = [(wall(lab_exec), wall(ssh)) for _ in range(a.runs)]
            subprocess.run(["ssh", "-F", str(cfg), "-O", "exit", "--", a.guest], capture_output=True, check=False,
                           timeout=30)
        result["labctl exec -- true"] = summary([p[0] for p in pairs])
        result["ssh ControlMaster true"] = summary([p[1] for p in pairs])
        result["exec / ssh"] = statistics.median(p[0] for p in pairs) / statistics.median(p[1] for p in pairs)
    result["importtime --version"] = importtime_top(["--version"])
    result["importtime status"] = importtime_top(["status"])
    if a.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['date']}, load {result['load']:.2f}, medians of {a.runs}")
    for name, v in result.items():
        if isinstance(v, dict):
            print(f"  {name:26} {v['median_ms']:7.1f} ms  ({v['min_ms']:.1f}-{v['max_ms']:.1f})")
    if "exec / ssh" in result:
        print(f"  exec / ssh with ControlMaster: {result['exec / ssh']:.2f}x")
    for key in ("importtime --version", "importtime status"):
        print(f"{key} (cumulative ms):")
        for mod, ms in result[key]:  # type: ignore[attr-defined]
            print(f"  {ms:8.1f}  {mod}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
