"""A recorded guest's replay, alone: its QEMU on the recording, in a private directory.

The replay runs until its recording ends: QEMU exits on the recorded ``quit``, or the machine
stops where the recorded one did (paused on its panic) at the recording's last instruction.
Nothing of the recorded lab is reached: its netdevs are unconnected sockets in the replay's
directory (the frames the guest receives come from the recording), its console a new file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from labctl.backends import ReplayFiles, agent_fifos, qmp_execute, replay_argv
from labctl.errors import LabctlError, MachineError
from labctl.net import free_port
from labctl.proc import Process, TimeoutExpired, kill_group, spawn_tied
from labctl.replay.keep import Recording
from labctl.up import new_overlay

POLL = 0.2
# A replay whose instruction count has not moved for this long while running waits for an event
# that its recording holds for another execution (seen on QEMU 7.2: see docs/record-replay.md).
STALL = 300.0


@dataclass
class Ended:
    """How a replay ended: ``end`` is ``exit`` (QEMU ended with the recording), ``stopped`` (the
    machine stopped where the recording ends: a panic), ``died`` (QEMU ended otherwise), ``stalled``
    (the replay stopped advancing: it diverged from its recording) or ``timeout``."""

    end: str
    icount: int
    seconds: float
    console: bytes


class Replay:
    """One replay of ``recording`` (a context manager: its QEMU and directory go at the end)."""

    def __init__(self, recording: Recording, paused: bool = False, work: Path | None = None) -> None:
        self.recording = recording
        self.dir = Path(tempfile.mkdtemp(prefix="labctl-replay-", dir=work))  # 0700
        self.files = ReplayFiles(self.dir, recording.rrfile, self.dir / "disk.qcow2", recording.fw_cfg())
        self.argv = replay_argv(recording.argv, self.files, free_port(), paused=paused)
        self.proc: Process[bytes] | None = None
        self.t0 = 0.0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def start(self) -> None:
        """Start the replay's QEMU; its monitor answers when this returns.

        :raise MachineError: when QEMU exits at start.
        """
        new_overlay(self.recording.image, self.files.disk, "raw")
        agent_fifos(self.dir / "agent")
        old = os.umask(0o077)
        try:
            self.proc = proc = spawn_tied(self.argv, self.dir / "qemu.log")
        finally:
            os.umask(old)
        self.t0 = time.monotonic()
        deadline = self.t0 + 30.0
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise MachineError(f"the replay's QEMU exited at start: {self.qemu_log()}")
            if self.files.qmp.exists():
                with contextlib.suppress(MachineError):
                    qmp_execute(self.files.qmp, "query-status", timeout=2.0)
                    return
            time.sleep(0.05)
        raise MachineError("the replay's QEMU did not answer on its monitor within 30 s")

    def qemu_log(self, whole: bool = False) -> str:
        """QEMU's last message (``whole``: all it wrote)."""
        try:
            text = (self.dir / "qemu.log").read_text(errors="replace")
        except OSError:
            return "no message"
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return text if whole else lines[-1] if lines else "no message"

    def icount(self) -> int:
        with contextlib.suppress(LabctlError):
            return int(qmp_execute(self.files.qmp, "query-replay", timeout=5.0).get("icount", 0))
        return 0

    def wait(self, timeout: float, stall: float = STALL) -> Ended:
        """Run until the recording's end (or ``timeout`` seconds; ``stalled`` after ``stall``
        seconds without progress)."""
        proc = self.proc
        assert proc is not None, "start() first"
        last = int(self.recording.manifest.get("covers", {}).get("instructions") or 0)
        deadline = time.monotonic() + timeout
        end, icount = "timeout", 0
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            if proc.poll() is not None:  # status 0 and no signal: it replayed the recorded quit
                killed = "terminating on signal" in self.qemu_log(whole=True)
                end, icount = ("exit", last) if proc.returncode == 0 and not killed else ("died", icount)
                break
            try:
                status = qmp_execute(self.files.qmp, "query-status", timeout=5.0).get("status")
                icount = int(qmp_execute(self.files.qmp, "query-replay", timeout=5.0).get("icount", 0))
            except LabctlError:
                time.sleep(POLL)
                continue
            if status != "running" and (not last or icount >= last):
                end = "stopped"
                break
            if icount != seen:
                seen, since = icount, time.monotonic()
            elif status == "running" and time.monotonic() - since > stall:
                end = "stalled"  # the replay waits for an input its recording does not give: it diverged
                break
            time.sleep(POLL)
        seconds = round(time.monotonic() - self.t0, 1)
        return Ended(end, icount, seconds, self.console())

    def console(self) -> bytes:
        try:
            return self.files.console.read_bytes()
        except OSError:
            return b""

    def close(self) -> None:
        """Stop QEMU (if it runs) and remove the replay's directory."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(LabctlError):
                qmp_execute(self.files.qmp, "quit", timeout=3.0)
            try:
                proc.wait(timeout=5.0)
            except TimeoutExpired:
                kill_group(proc)
        shutil.rmtree(self.dir, ignore_errors=True)
