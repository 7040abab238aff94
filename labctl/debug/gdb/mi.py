"""One gdb process driven over gdb/MI: commands with timeouts, stops, and a clean exit."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

from pygdbmi import gdbmiparser

from labctl import proc
from labctl.debug.gdb.transcript import MiPayload, MiRecord, mi_quote
from labctl.errors import DebugError, LabctlError, MiTimeout

CMD_TIMEOUT = 30.0  # one MI command; TCG makes gdbstub round trips slow
EXIT_TIMEOUT = 5.0


# -- the MI connection ---------------------------------------------------------------

@dataclass
class MiResult:
    """A command's result record with the console output that came before it."""

    message: str
    payload: MiPayload
    console: str


class MiSession:
    """A gdb process speaking MI3: numbered commands, and waits that all end.

    gdb runs in its own session so that a Ctrl-C meant for labctl does not
    reach it (gdb would interrupt the target behind our back).
    """

    def __init__(self, gdb: str = "gdb", log: list[MiRecord] | None = None) -> None:
        try:
            self.proc = proc.start_piped([gdb, "--nx", "-q", "--interpreter=mi3"])
        except (OSError, LabctlError) as exc:
            raise DebugError(f"cannot start {gdb}: {getattr(exc, 'message', exc)}",
                             hint="install gdb (setup.sh does)") from exc
        self.log = log if log is not None else []
        self.t0 = time.monotonic()
        self.running = False
        self._token = 0
        self._records: queue.Queue[MiRecord | None] = queue.Queue()
        self._stops: deque[MiPayload] = deque()
        self._stderr: deque[str] = deque(maxlen=20)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    # reader threads
    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line or gdbmiparser.response_is_finished(line):
                continue
            self._records.put(cast(MiRecord, gdbmiparser.parse_response(line)))  # pygdbmi's is an untyped dict
        self._records.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _died(self) -> DebugError:
        tail = "; ".join(self._stderr) or f"exit status {self.proc.poll()}"
        return DebugError(f"gdb exited unexpectedly: {tail}")

    def _next(self, deadline: float) -> MiRecord | None:
        """The next record before ``deadline`` (None when none came)."""
        try:
            rec = self._records.get(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
        except queue.Empty:
            return None
        if rec is None:
            self._records.put(None)  # stay at EOF
            raise self._died()
        rec["t"] = round(time.monotonic() - self.t0, 3)
        self.log.append(rec)
        if rec.get("type") == "notify" and rec.get("message") == "running":
            self.running = True
        elif rec.get("type") == "notify" and rec.get("message") == "stopped":
            self.running = False
            payload = rec.get("payload")
            self._stops.append(payload if isinstance(payload, dict) else MiPayload())
        return rec

    def send(self, command: str) -> int:
        """Write one MI command with a fresh token; return the token."""
        self._token += 1
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{self._token}{command}\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._died() from exc
        return self._token

    def command(self, command: str, timeout: float = CMD_TIMEOUT) -> MiResult:
        """Run an MI command and wait for its result record.

        :raise DebugError: on ``^error``, when ``timeout`` passes, or when gdb exits.
        """
        token = self.send(command)
        deadline = time.monotonic() + timeout
        console: list[str] = []
        while time.monotonic() < deadline:
            rec = self._next(deadline)
            if rec is None:
                continue
            if rec.get("type") == "console" and rec.get("payload"):
                console.append(str(rec["payload"]))
            if rec.get("type") == "result" and rec.get("token") == token:
                payload = rec["payload"] if isinstance(rec["payload"], dict) else MiPayload()
                if rec.get("message") == "error":
                    raise DebugError(f"gdb: {payload.get('msg', 'error')} (in {command.split(' ', 1)[0]})")
                if rec.get("message") == "running":
                    self.running = True
                return MiResult(str(rec.get("message")), payload, "".join(console))
        raise MiTimeout(f"gdb did not answer {command.split(' ', 1)[0]} within {timeout:.0f} s")

    def console(self, command: str, timeout: float = CMD_TIMEOUT) -> str:
        """Run a CLI command through MI; return its console output."""
        return self.command(f"-interpreter-exec console {mi_quote(command)}", timeout).console

    def take_stop(self) -> MiPayload | None:
        """A ``*stopped`` payload already received and not yet handled."""
        return self._stops.popleft() if self._stops else None

    def wait_stopped(self, timeout: float, stop: threading.Event | None = None) -> MiPayload | None:
        """The next ``*stopped`` payload, or None when ``timeout`` passes or ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            if self._stops:
                return self._stops.popleft()
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return None
            self._next(deadline)

    def close(self) -> None:
        """End gdb: ``-gdb-exit``, then SIGTERM, then SIGKILL (:func:`labctl.proc.kill_group`)."""
        if self.alive:
            try:
                self.send("-gdb-exit")
            except DebugError:
                pass
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT)
        except proc.TimeoutExpired:
            proc.kill_group(self.proc)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


