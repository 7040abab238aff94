#!/usr/bin/env python3
"""A room connected to one labctl serve: its resident memory and CPU, idle and while typing.

Usage: python benchmarks/web_room.py [--students 6] [--guests 1] [--memory 256] [--pages 6]
                                     [--terminals 3] [--seconds 60] [--keys-per-second 5]
                                     [--overcommit] [--accel auto|kvm|tcg] [--json]

Brings up a class of --students on a lab of --guests guests (1 to 3, --memory MiB each) in a
private state directory and starts `labctl serve --listen 127.0.0.1:0`. Then connects, as the
pages would, with each student's token: --pages server-sent-event streams per student
(/api/events?lab=LAB@STUDENT, each page a browser tab of that student's lab) plus one trainer
page (/api/events?class=LAB), and --terminals websockets per student to each of their guests'
terminals (/ws/term/LAB@STUDENT/GUEST: the server bridges all of a guest's websockets to one
SSH channel, so every page's terminal gets every byte). The room of the issue, 36 students x 3
guests with every terminal open, is `--students 36 --guests 3 --pages 1 --terminals 1`.
Measures the serve process (RSS from /proc, CPU time user+system):

* connected and idle for --seconds (the events keep looking every second);
* typing for --seconds: one terminal per student sends --keys-per-second characters
  (the line cleared every 20), each echo reaching every terminal of that student; the
  keystroke-to-echo time of the typing terminal is measured too.

Prints the figures (or JSON) and takes the class down. What a browser itself does (xterm.js
rendering, the page's JS) is not measured: the clients here are raw sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

GUEST = """\
  {name}:
    memory: {memory}
    nics:
      - {{name: eth1, model: virtio-net-pci, network: lan, ip: 10.96.0.{n}/24}}
"""
LAB = """\
name: webroom
networks:
  lan: {{}}
guests:
{guests}checks:
  - name: fixed
    guest: a
    command: test -f /root/fixed
    timeout: 10
"""
KEYS = "abcdefghijklmnopqrst"


def labctl(env: dict[str, str], *args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labctl", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=True)


def proc_figures(pid: int) -> tuple[float, float]:
    """Resident memory (MiB) and CPU seconds (user + system) of ``pid``."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] if s else float("nan")


class Room:
    """The simulated pages: SSE readers and terminal websockets, with counters."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.host, port = base.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.events = 0
        self.sse_open = 0
        self.ws_bytes = 0
        self.tasks: list[asyncio.Task[None]] = []
        self.terminals: dict[str, list[object]] = {}

    async def sse(self, query: str, tok: str, ready: asyncio.Event) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write((f"GET /api/events?{query} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                      f"Authorization: Bearer {tok}\r\nAccept: text/event-stream\r\n\r\n").encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"events refused: {head[:80]!r}")
        self.sse_open += 1
        ready.set()
        try:
            while line := await reader.readline():
                if line.startswith(b"data:"):
                    self.events += 1
        finally:
            writer.close()

    async def terminal(self, ident: str, guest: str, tok: str) -> object:
        from websockets.asyncio.client import connect

        ws = await connect(f"ws://{self.host}:{self.port}/ws/term/{ident}/{guest}?cols=120&rows=40",
                           additional_headers={"Authorization": f"Bearer {tok}"}, open_timeout=60,
                           max_size=None)
        self.terminals.setdefault(ident, []).append(ws)
        self.tasks.append(asyncio.create_task(self._drain(ws)))
        return ws

    async def _drain(self, ws: object) -> None:
        with contextlib.suppress(Exception):  # closed at the end
            async for msg in ws:  # type: ignore[attr-defined]
                self.ws_bytes += len(msg)


async def typist(ident: str, tok: str, base: str, rate: float, until: float, lat: list[float]) -> int:
    """One more terminal on ``ident`` that types ``rate`` keys a second and times each echo."""
    from websockets.asyncio.client import connect

    sent = 0
    async with connect(base.replace("http", "ws") + f"/ws/term/{ident}/a?cols=120&rows=40",
                       additional_headers={"Authorization": f"Bearer {tok}"}, open_timeout=60) as ws:
        await drain(ws, 1.0)
        while time.monotonic() < until:
            key = KEYS[sent % len(KEYS)].encode()
            t0 = time.perf_counter()
            await ws.send(key)
            got = b""
            try:
                while key not in got:
                    msg = await asyncio.wait_for(ws.recv(), 10)
                    got += msg if isinstance(msg, bytes) else b""
                lat.append(time.perf_counter() - t0)
            except TimeoutError:
                pass
            sent += 1
            if sent % 20 == 0:
                await ws.send(b"\x15")
            await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - t0)))
    return sent


def ssh_typist(argv: list[str], rate: float, until: float) -> list[float]:
    """The same typing over a plain ``ssh -tt`` to a guest of the room (the tool a student would
    otherwise use), at the same time as the page typists: keystroke-to-echo times."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    fd = proc.stdout.fileno()
    lat: list[float] = []

    def drain_fd(quiet: float) -> None:
        while select.select([fd], [], [], quiet)[0]:
            if not os.read(fd, 65536):
                return

    try:
        drain_fd(2.0)
        sent = 0
        while time.monotonic() < until:
            key = KEYS[sent % len(KEYS)].encode()
            t0 = time.perf_counter()
            proc.stdin.write(key)
            got = b""
            while key not in got and select.select([fd], [], [], 10)[0]:
                got += os.read(fd, 65536)
            if key in got:
                lat.append(time.perf_counter() - t0)
            sent += 1
            if sent % 20 == 0:
                proc.stdin.write(b"\x15")
            time.sleep(max(0.0, 1 / rate - (time.perf_counter() - t0)))
    finally:
        proc.kill()
        proc.wait()
    return lat


async def drain(ws: object, quiet: float) -> None:
    while True:
        try:
            await asyncio.wait_for(ws.recv(), quiet)  # type: ignore[attr-defined]
        except TimeoutError:
            return


async def measure(args: argparse.Namespace, base: str, tokens: dict[str, str], pid: int,
                  ssh_argv: list[str]) -> dict[str, object]:
    room = Room(base)
    students = [s for s in tokens if s != "trainer"]
    out: dict[str, object] = {}
    rss0, _ = proc_figures(pid)
    out["rss_mib_before"] = round(rss0, 1)
    t_connect = time.monotonic()
    readies = []
    for s in students:
        for _ in range(args.pages):
            ev = asyncio.Event()
            readies.append(ev)
            room.tasks.append(asyncio.create_task(room.sse(f"lab=webroom@{s}", tokens[s], ev)))
    ev = asyncio.Event()
    readies.append(ev)
    room.tasks.append(asyncio.create_task(room.sse("class=webroom", tokens["trainer"], ev)))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in readies)), 120)
    for s in students:
        for guest in "abc"[:args.guests]:
            for _ in range(args.terminals):
                await room.terminal(f"webroom@{s}", guest, tokens[s])
    out["connect_s"] = round(time.monotonic() - t_connect, 1)
    out["sse_streams"], out["websockets"] = room.sse_open, sum(len(v) for v in room.terminals.values())
    await asyncio.sleep(3)

    rss_a, cpu_a = proc_figures(pid)
    ev0, t0 = room.events, time.monotonic()
    rss_peak = rss_a
    while time.monotonic() - t0 < args.seconds:
        await asyncio.sleep(1)
        rss_peak = max(rss_peak, proc_figures(pid)[0])
    rss_b, cpu_b = proc_figures(pid)
    wall = time.monotonic() - t0
    out["idle"] = {"seconds": round(wall, 1), "rss_mib": round(rss_b, 1), "rss_mib_peak": round(rss_peak, 1),
                   "cpu_s": round(cpu_b - cpu_a, 2), "cpu_pct": round(100 * (cpu_b - cpu_a) / wall, 1),
                   "events_received": room.events - ev0}

    lat: list[float] = []
    bytes0, t1 = room.ws_bytes, time.monotonic()
    until = t1 + args.seconds
    peak = [rss_b]

    async def sample() -> None:
        while time.monotonic() < until:
            await asyncio.sleep(1)
            peak[0] = max(peak[0], proc_figures(pid)[0])

    _rss_c, cpu_c = proc_figures(pid)
    typed = asyncio.gather(*(typist(f"webroom@{s}", tokens[s], base, args.keys_per_second, until, lat)
                             for s in students))
    by_ssh = asyncio.to_thread(ssh_typist, ssh_argv, args.keys_per_second, until)
    _, results, ssh_lat = await asyncio.gather(sample(), typed, by_ssh)
    rss_d, cpu_d = proc_figures(pid)
    wall = time.monotonic() - t1
    out["typing"] = {"seconds": round(wall, 1), "typists": len(students), "keys_sent": sum(results),
                     "rss_mib": round(rss_d, 1), "rss_mib_peak": round(peak[0], 1),
                     "cpu_s": round(cpu_d - cpu_c, 2), "cpu_pct": round(100 * (cpu_d - cpu_c) / wall, 1),
                     "echo_ms_median": round(statistics.median(lat) * 1000, 2) if lat else None,
                     "echo_ms_p90": round(pct(lat, 90) * 1000, 2), "echo_ms_p99": round(pct(lat, 99) * 1000, 2),
                     "terminal_bytes_fanned_out": room.ws_bytes - bytes0,
                     "ssh_echo_ms_median": round(statistics.median(ssh_lat) * 1000, 2) if ssh_lat else None,
                     "ssh_echo_ms_p90": round(pct(ssh_lat, 90) * 1000, 2), "ssh_keys": len(ssh_lat)}
    for t in room.tasks:
        t.cancel()
    for wss in room.terminals.values():
        for ws in wss:
            await ws.close()  # type: ignore[attr-defined]
    await asyncio.gather(*room.tasks, return_exceptions=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=6)
    ap.add_argument("--guests", type=int, default=1, choices=[1, 2, 3], help="guests in the lab")
    ap.add_argument("--memory", type=int, default=256, help="MiB a guest")
    ap.add_argument("--overcommit", action="store_true", help="pass --overcommit to class up")
    ap.add_argument("--pages", type=int, default=6, help="event streams (pages) per student")
    ap.add_argument("--terminals", type=int, default=3, help="terminal websockets per student")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--keys-per-second", type=float, default=5.0)
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="labctl-webroom-") as tmp:
        os.chmod(tmp, 0o700)
        env = {**os.environ, "LABCTL_STATE_DIR": str(Path(tmp) / "state")}
        lab = Path(tmp) / "webroom.yaml"
        lab.write_text(LAB.format(guests="".join(GUEST.format(name=g, memory=args.memory, n=i + 1)
                                                  for i, g in enumerate("abc"[:args.guests]))))
        roster = Path(tmp) / "roster.txt"
        students = [f"s{i:02d}" for i in range(1, args.students + 1)]
        roster.write_text("\n".join(students) + "\n")
        # One copy first takes the post-boot snapshots (if they are not there yet), so that the
        # capacity check counts the class's guests at what a restored guest holds.
        labctl(env, "up", str(lab), "--accel", args.accel)
        labctl(env, "down", "webroom")
        t_up = time.monotonic()
        labctl(env, "class", "up", str(lab), "--roster", str(roster), "--out", str(Path(tmp) / "handouts"),
               "--accel", args.accel, *(["--overcommit"] if args.overcommit else []))
        up_s = time.monotonic() - t_up
        serve = None
        try:
            serve = subprocess.Popen([sys.executable, "-m", "labctl", "serve", "--listen", "127.0.0.1:0"], env=env,
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert serve.stdout is not None
            base, tokens = "", dict[str, str]()
            while len(tokens) < len(students) + 1:
                line = serve.stdout.readline()
                if not line:
                    raise RuntimeError("serve ended: " + (serve.stderr.read() if serve.stderr else ""))
                if m := re.match(r"serving on (\S+)", line):
                    base = m.group(1)
                if m := re.search(r"trainer \S+\?t=(\S+)", line):
                    tokens["trainer"] = m.group(1)
                if m := re.match(r"\s+(\w+): \S+\?t=(\S+)", line):
                    tokens[m.group(1)] = m.group(2)
            # one more typist on plain ssh -tt, to the first student's last guest (no page types there)
            os.environ["LABCTL_STATE_DIR"] = env["LABCTL_STATE_DIR"]
            from labctl.state.runstate import LabState

            ssh_argv = LabState.load(f"webroom@{students[0]}").endpoint("abc"[args.guests - 1]).openssh_argv(["-tt"])
            figures = asyncio.run(measure(args, base, tokens, serve.pid, ssh_argv))
        finally:
            if serve is not None:
                serve.terminate()
                serve.wait(15)
            labctl(env, "class", "down", timeout=600)
    figures = {"students": args.students, "guests": args.students * args.guests, "pages_per_student": args.pages,
               "terminals_per_guest": args.terminals, "class_up_s": round(up_s, 1), **figures}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    idle, typing = figures["idle"], figures["typing"]
    assert isinstance(idle, dict) and isinstance(typing, dict)
    print(f"room: {args.students} students x {args.guests} guests, {figures['sse_streams']} event streams "
          f"({args.pages} pages per student + the trainer's), {figures['websockets']} terminal websockets")
    print(f"serve before connecting: RSS {figures['rss_mib_before']} MiB")
    print(f"idle {idle['seconds']} s: RSS {idle['rss_mib']} MiB (peak {idle['rss_mib_peak']}), "
          f"CPU {idle['cpu_s']} s = {idle['cpu_pct']}% of one core, {idle['events_received']} events delivered")
    print(f"typing {typing['seconds']} s ({typing['typists']} typists x {args.keys_per_second} keys/s, "
          f"{typing['keys_sent']} keys): RSS {typing['rss_mib']} MiB (peak {typing['rss_mib_peak']}), "
          f"CPU {typing['cpu_s']} s = {typing['cpu_pct']}% of one core; keystroke to echo median "
          f"{typing['echo_ms_median']} ms, p90 {typing['echo_ms_p90']} ms, p99 {typing['echo_ms_p99']} ms; "
          f"{typing['terminal_bytes_fanned_out']} bytes fanned out to the other terminals")
    print(f"plain ssh -tt typed at the same time ({typing['ssh_keys']} keys): keystroke to echo median "
          f"{typing['ssh_echo_ms_median']} ms, p90 {typing['ssh_echo_ms_p90']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
