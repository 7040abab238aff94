#!/usr/bin/env python3
"""Keystroke-to-echo latency through labctl serve's terminal websocket, against plain OpenSSH to
the same guest; the server's memory and CPU while it bridges.

Usage: python benchmarks/web_latency.py [--keys N] [--accel auto|kvm|tcg] [--json]

Brings up a one-guest lab in a private state directory, starts `labctl serve --listen
127.0.0.1:0` with the owner's token, and, in turn: opens the guest's terminal over the
websocket (as the page does: binary frames, the server's SSH channel with a pty behind it)
and an interactive `ssh -tt` with the lab's key (the same sshd, the same shell), and sends one
character at a time, timing each until its echo comes back (the line is cleared every 20
keys). Prints median, 90th and 99th percentile per path and their ratio, then the serve
process's resident memory and CPU time. Takes the lab down at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.state.runstate import LabState

LAB = """\
name: weblat
networks:
  lan: {}
guests:
  a:
    nics:
      - {name: eth1, model: virtio-net-pci, network: lan, ip: 10.92.0.1/24}
"""
KEYS = "abcdefghijklmnopqrst"


def labctl(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=True)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def web_latencies(base: str, token: str, n: int) -> list[float]:
    from websockets.asyncio.client import connect

    out: list[float] = []
    async with connect(base.replace("http", "ws") + "/ws/term/weblat/a?cols=200&rows=50",
                       additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await drain(ws, 2.0)
        for i in range(n):
            key = KEYS[i % len(KEYS)]
            t0 = time.perf_counter()
            await ws.send(key.encode())
            got = b""
            while key.encode() not in got:
                msg = await asyncio.wait_for(ws.recv(), 10)
                got += msg if isinstance(msg, bytes) else b""
            out.append(time.perf_counter() - t0)
            if i % 20 == 19:
                await ws.send(b"\x15")  # Ctrl-U: clear the line
                await drain(ws, 0.2)
    return out


async def drain(ws: object, quiet: float) -> None:
    while True:
        try:
            await asyncio.wait_for(ws.recv(), quiet)  # type: ignore[attr-defined]
        except TimeoutError:
            return


def ssh_latencies(argv: list[str], n: int) -> list[float]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    fd = proc.stdout.fileno()

    def drain_fd(quiet: float) -> None:
        while select.select([fd], [], [], quiet)[0]:
            if not os.read(fd, 65536):
                return

    drain_fd(2.0)
    out: list[float] = []
    try:
        for i in range(n):
            key = KEYS[i % len(KEYS)].encode()
            t0 = time.perf_counter()
            proc.stdin.write(key)
            got = b""
            while key not in got:
                if not select.select([fd], [], [], 10)[0]:
                    raise RuntimeError("ssh: no echo in 10 s")
                got += os.read(fd, 65536)
            out.append(time.perf_counter() - t0)
            if i % 20 == 19:
                proc.stdin.write(b"\x15")
                drain_fd(0.2)
    finally:
        proc.kill()
        proc.wait()
    return out


def proc_figures(pid: int) -> tuple[float, float]:
    """Resident memory (MiB) and CPU seconds (user + system) of ``pid``."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / tick


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="labctl-weblat-") as tmp:
        os.chmod(tmp, 0o700)
        env = {**os.environ, "LABCTL_STATE_DIR": str(Path(tmp) / "state")}
        lab = Path(tmp) / "weblat.yaml"
        lab.write_text(LAB)
        labctl(env, "up", str(lab), "--accel", args.accel)
        serve = None
        try:
            serve = subprocess.Popen([sys.executable, "-m", "labctl", "serve", "--listen", "127.0.0.1:0"], env=env,
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert serve.stdout is not None
            base = token = ""
            while not token:
                line = serve.stdout.readline()
                if not line:
                    raise RuntimeError("serve ended: " + (serve.stderr.read() if serve.stderr else ""))
                if m := re.match(r"serving on (\S+)", line):
                    base = m.group(1)
                if m := re.search(r"your labs: \S+\?t=(\S+)", line):
                    token = m.group(1)
            os.environ["LABCTL_STATE_DIR"] = env["LABCTL_STATE_DIR"]
            ep = LabState.load("weblat").endpoint("a")
            ssh_argv = ep.openssh_argv(["-tt"])
            rss0, cpu0 = proc_figures(serve.pid)
            results = {}
            for round_ in range(2):  # interleaved: web, ssh, web, ssh
                results.setdefault("web", []).extend(asyncio.run(web_latencies(base, token, args.keys // 2)))
                results.setdefault("ssh", []).extend(ssh_latencies(ssh_argv, args.keys // 2))
            rss1, cpu1 = proc_figures(serve.pid)
        finally:
            if serve is not None:
                serve.terminate()
                serve.wait(10)
            labctl(env, "down", "weblat")
    figures = {k: {"median_ms": statistics.median(v) * 1000, "p90_ms": pct(v, 90) * 1000,
                   "p99_ms": pct(v, 99) * 1000, "n": len(v)} for k, v in results.items()}
    figures["ratio_median"] = {"web/ssh": figures["web"]["median_ms"] / figures["ssh"]["median_ms"]}
    figures["serve"] = {"rss_mib_before": round(rss0, 1), "rss_mib_after": round(rss1, 1),
                        "cpu_s_during": round(cpu1 - cpu0, 2)}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    for k in ("web", "ssh"):
        f = figures[k]
        print(f"{k:4} keystroke->echo: median {f['median_ms']:.2f} ms, p90 {f['p90_ms']:.2f} ms, "
              f"p99 {f['p99_ms']:.2f} ms ({f['n']} keys)")
    print(f"web/ssh median ratio: {figures['ratio_median']['web/ssh']:.2f}")
    s = figures["serve"]
    print(f"serve: RSS {s['rss_mib_before']} -> {s['rss_mib_after']} MiB, CPU {s['cpu_s_during']} s during the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
