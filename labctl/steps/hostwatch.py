"""A step's window, and the host side of it: what each guest's QEMU process cost on the host meanwhile.

The window (:class:`Window`) is the step's workload: it opens once every tracer records and closes
when the workloads end. It reads each involved guest's ``/proc/stat`` at both ends
(``window-stat-start.txt``, ``window-stat-end.txt``) and watches their QEMUs on the host.

Under TCG a guest's CPU time *is* its QEMU's vCPU threads' time, and the
emulated NIC's device model runs in QEMU too (register accesses in the vCPU
thread, the packet backend in the main loop), out of the guest profiler's
sight. So for every involved guest whose QEMU runs on this machine,
:class:`HostWatch` records, into ``steps/<step>/<variant>/_host/<guest>/``:

* ``qemu-threads.json``: ``/proc/PID/stat`` and ``/proc/PID/task/*/stat``
  read at the window's start and end (raw lines, with the host's clock
  ticks per second), the vCPU thread ids QEMU reports over QMP
  (``query-cpus-fast``) and the window's length;
* ``perf.data``, ``perf-record.log`` and ``perf-script.txt.gz``: a host-side
  ``perf record -e cpu-clock -p PID`` of the QEMU process during the same
  window, as ``perf script -F tid,ip,sym,dso`` text, when the host's perf
  allows it; otherwise ``profile-unavailable.txt`` says why.

The window is the step's workload: from the moment every tracer records to
the end of the foreground commands. The figures are computed from these
files by :mod:`labctl.trace.hostcost`. A guest on another host (libvirt
over SSH) has no local process: its ``qemu-threads.json`` says so.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import select
import shlex
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl import trace
from labctl.backends import Backend
from labctl.bundle import HOST_DIR
from labctl.errors import GuestError, LabctlError
from labctl.follow import parallel
from labctl.paths import atomic_write
from labctl.proc import Process, interrupt_group, run, spawn_tied
from labctl.state import LabState
from labctl.steps.tracers import with_build_ids
from labctl.steps.variant import Variant

log = logging.getLogger(__name__)

PROFILE_FREQUENCY = 499  # Hz: a sample every 2 ms of QEMU's CPU time, off the guest's 999 Hz
ENABLE_TIMEOUT = 20.0  # s for the host's perf to attach to every thread and acknowledge
SCRIPT_TIMEOUT = 300.0
START_ATTEMPTS = 2
STOP_WAIT = 60.0  # s for perf to write its file out after SIGINT


def read_task_stats(pid: int) -> trace.TaskStats | None:
    """``/proc/PID/stat`` and every ``/proc/PID/task/TID/stat`` line, raw, with the time read; None when gone."""
    try:
        process = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    threads: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            with contextlib.suppress(OSError):
                threads[task.name] = (task / "stat").read_text()
    return {"monotonic": time.monotonic(), "process": process.strip(),
            "threads": {tid: line.strip() for tid, line in threads.items()}}


def vcpu_threads(backend: Backend, rec: Any) -> dict[str, int]:
    """tid -> vCPU index, from QMP ``query-cpus-fast`` ({} when QEMU does not answer)."""
    try:
        cpus = backend.qmp(rec, "query-cpus-fast")
    except LabctlError as exc:
        log.debug("query-cpus-fast on %s: %s", rec.name, exc.message)
        return {}
    out: dict[str, int] = {}
    for cpu in cpus if isinstance(cpus, list) else []:
        if isinstance(cpu, dict) and isinstance(cpu.get("thread-id"), int):
            out[str(cpu["thread-id"])] = int(cpu.get("cpu-index", len(out)))
    return out


@dataclass
class _Profiler:
    """A host ``perf record -p PID`` that starts disabled and is enabled through its control FIFO."""

    dir: Path
    proc: Process[bytes] | None = None
    error: str | None = None
    fifos: list[Path] = field(default_factory=list)

    def start(self, pid: int) -> None:
        perf = shutil.which("perf")
        if perf is None:
            self.error = "perf is not installed on the host (Debian: apt-get install linux-perf)"
            return
        ctl, ack = self.dir / "perf.ctl", self.dir / "perf.ack"
        argv = with_build_ids([perf, "record", "-e", "cpu-clock", "-F", str(PROFILE_FREQUENCY), "-p", str(pid),
                               "-o", str(self.dir / trace.PERF_DATA), "-D", "-1", "--control", f"fifo:{ctl},{ack}"],
                              os.uname().release)
        for attempt in range(START_ATTEMPTS):  # a second perf when the first one exits while attaching
            (self.dir / trace.PERF_DATA).unlink(missing_ok=True)  # else perf keeps it as perf.data.old
            for fifo in (ctl, ack):
                fifo.unlink(missing_ok=True)
                os.mkfifo(fifo, 0o600)
            self.fifos = [ctl, ack]
            self.proc = spawn_tied(argv, self.dir / trace.PERF_LOG)
            try:
                self._enable(ctl, ack)
                return
            except OSError as exc:
                why = str(exc.strerror or exc)
                exited = self.proc.poll() is not None
                self.stop()
                log.debug("host perf for %d, attempt %d: %s", pid, attempt + 1, why)
                if not exited or attempt + 1 == START_ATTEMPTS:
                    self.error = (f"the host's perf did not start recording: {why}"
                                  f"{self._log_tail()}; see {trace.PERF_LOG}")
                    return

    def _log_tail(self) -> str:
        """perf's own last line(s), for the reason a bundle gives."""
        try:
            lines = (self.dir / trace.PERF_LOG).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        tail = " / ".join(ln.strip() for ln in lines[-2:] if ln.strip())
        return f" (perf: {tail[-300:]})" if tail else ""

    def _enable(self, ctl: Path, ack: Path) -> None:
        """Say ``enable`` on the control FIFO and wait for perf's ``ack`` (it records from then on)."""
        assert self.proc is not None
        deadline = time.monotonic() + ENABLE_TIMEOUT
        ack_fd = os.open(ack, os.O_RDWR | os.O_NONBLOCK)  # read-write: perf's write-only open returns
        try:
            while True:  # perf opens ctl for reading once it has attached to every thread
                if self.proc.poll() is not None:
                    raise OSError(f"perf exited with status {self.proc.returncode}")
                try:
                    ctl_fd = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise OSError("timed out waiting for perf to open its control FIFO") from None
                    time.sleep(0.05)
            try:
                os.write(ctl_fd, b"enable\n")
            finally:
                os.close(ctl_fd)
            answer = b""
            while b"ack" not in answer:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise OSError("perf did not acknowledge 'enable'")
                if select.select([ack_fd], [], [], min(left, 0.5))[0]:
                    answer += os.read(ack_fd, 64)
        finally:
            os.close(ack_fd)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            status = interrupt_group(self.proc, STOP_WAIT)
            # perf ends by raising the SIGINT it got once its file is written: -SIGINT is a clean end
            if status not in (0, -signal.SIGINT, 128 + signal.SIGINT) and self.error is None:
                what = f"did not exit within {STOP_WAIT:.0f} s of SIGINT" if status is None else f"exited with status {status}"
                self.error = f"the host's perf {what}{self._log_tail()}; see {trace.PERF_LOG}"
        for fifo in self.fifos:
            fifo.unlink(missing_ok=True)

    def script(self) -> None:
        """``perf script`` of the recording, gzipped (symbols resolve here, on the host that recorded)."""
        data = self.dir / trace.PERF_DATA
        if self.error is not None or not data.is_file() or data.stat().st_size == 0:
            self.error = self.error or (f"the host's perf wrote no {trace.PERF_DATA}{self._log_tail()}; "
                                        f"see {trace.PERF_LOG}")
            return
        try:
            res = run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso"], timeout=SCRIPT_TIMEOUT,
                      check=False)
        except LabctlError as exc:
            self.error = f"perf script failed: {exc.message}"
            return
        with gzip.open(self.dir / trace.PERF_SCRIPT, "wb", compresslevel=6) as f:
            f.write(res.stdout)
        if res.returncode != 0:
            self.error = f"perf script exited with status {res.returncode}: " + res.stderr.decode(
                errors="replace").strip()[-300:]


@dataclass
class _Watched:
    guest: str
    pid: int
    dir: Path
    vcpus: dict[str, int]
    start: trace.TaskStats | None
    profiler: _Profiler | None
    note: str | None = None


class HostWatch:
    """Host-side measurements of the involved guests' QEMUs over one step window (see the module docstring).

    ``start()`` at the window's start, ``stop()`` at its end; ``stop()`` is
    safe to call more than once and never raises for a guest that died.
    """

    def __init__(self, state: LabState, backend: Backend, guests: list[str], out: Path, *,
                 profile: bool = True) -> None:
        self.state, self.backend, self.guests, self.out = state, backend, guests, out
        self.profile = profile
        self.watched: list[_Watched] = []
        self.t0: float | None = None
        self.seconds: float | None = None

    def start(self) -> None:
        self.t0 = time.monotonic()
        for g in self.guests:
            rec = self.state.guests.get(g)
            d = self.out / g
            d.mkdir(parents=True, exist_ok=True)
            if rec is None or not rec.pid or rec.extra.get("remote"):
                self.watched.append(_Watched(g, 0, d, {}, None, None,
                                             "its QEMU runs on another host: not measured here"))
                continue
            w = _Watched(g, rec.pid, d, vcpu_threads(self.backend, rec), read_task_stats(rec.pid), None)
            if w.start is None:
                w.note = f"cannot read /proc/{rec.pid} (its QEMU runs as another user or is gone)"
            elif self.profile:
                w.profiler = _Profiler(d)
                w.profiler.start(rec.pid)
            self.watched.append(w)

    def stop(self) -> float | None:
        """End the window: read the threads again, stop and post-process the profiles; the window's seconds."""
        if self.t0 is None:
            return None
        if self.seconds is None:
            self.seconds = round(time.monotonic() - self.t0, 3)
            ends = {w.guest: read_task_stats(w.pid) if w.start is not None else None for w in self.watched}
            # The profilers at once: a host perf takes up to a second to exit after SIGINT (measured,
            # whatever it recorded), so one after the other that second came once per guest.
            profiled = {w.guest: w.profiler for w in self.watched if w.profiler is not None}

            def finish(g: str) -> None:
                profiled[g].stop()
                profiled[g].script()

            parallel(list(profiled), finish)
            for w in self.watched:
                self._write(w, ends.get(w.guest))
        return self.seconds

    def _write(self, w: _Watched, end: trace.TaskStats | None = None) -> None:
        rec = self.state.guests.get(w.guest)
        doc: trace.ThreadsDoc = {"guest": w.guest, "pid": w.pid or None,
                                 "accel": rec.accel if rec is not None else self.state.accel,
                                 "clock_ticks_per_s": os.sysconf("SC_CLK_TCK"), "window_s": self.seconds,
                                 "vcpu_threads": w.vcpus, "start": w.start, "end": end, "note": w.note}
        atomic_write(w.dir / trace.THREADS_FILE, json.dumps(doc, indent=1) + "\n")
        if w.profiler is not None and w.profiler.error:
            atomic_write(w.dir / trace.PROFILE_UNAVAILABLE, w.profiler.error + "\n")
        elif w.profiler is None and w.start is not None and not self.profile:
            atomic_write(w.dir / trace.PROFILE_UNAVAILABLE, "the host profile was turned off for this run\n")


class Window:
    """The step's window for one variant: opened after every kind began, closed after the workloads
    (best effort at the end: a guest that died keeps what was read at the start)."""

    def __init__(self, watch_host: bool = True, host_profile: bool = True) -> None:
        self.watch_host, self.host_profile = watch_host, host_profile
        self.watch: HostWatch | None = None

    def open(self, v: Variant) -> None:
        parallel(v.involved, lambda g: v.sh(g, f"cat /proc/stat > {shlex.quote(v.workdir)}/{trace.WINDOW_START}"))
        self.watch = HostWatch(v.state, v.backend, v.involved if self.watch_host else [], v.bundle / v.rel / HOST_DIR,
                               profile=self.host_profile)
        self.watch.start()

    def close(self, v: Variant) -> None:
        if self.watch is None:
            return
        v.res.window_s = self.watch.stop()

        def one(g: str) -> None:
            try:
                if v.sessions.alive(g):
                    v.sh(g, f"cat /proc/stat > {shlex.quote(v.workdir)}/{trace.WINDOW_END}")
            except GuestError as exc:
                v.res.warnings.append(f"{g}: /proc/stat not read at the end of the step: {exc.message}")

        parallel(v.involved, one)
