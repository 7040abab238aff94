"""gdb against a guest's QEMU gdbstub: an init script for interactive use, and
scripted breakpoint sessions over gdb/MI for lab steps.

Every guest's QEMU listens for gdb on a unix socket in the guest's 0700
directory (``gdb`` in the lab state) of the machine that runs it
(:class:`GdbStub`), never on a TCP port. Connecting
*pauses the whole guest*; it runs again only when gdb resumes or detaches. A gdb that dies without detaching leaves the guest
paused (QEMU does not resume on disconnect), which is why
:func:`run_breakpoint_session` always detaches and, as a last resort, resumes
the guest through QMP. QMP goes through the guest's backend
(:class:`BackendMonitor`: the qemu backend's monitor socket, libvirt's
monitor passthrough), so libvirt guests are handled the same way. A guest on
a remote libvirt host has its gdbstub's socket on that host: gdb reaches it
through an OpenSSH stream-local forward to a 0600 socket in the guest's
directory here, logged in as the host's ``qemu+ssh://`` URI is, so nothing
listens on any TCP port for it.

Interactive (``labctl gdb``)::

    target = gdb_target(state, "a")             # socket, vmlinux, module commands...
    with target.stub.local(scratch) as sock:    # the socket here (an SSH forward if remote)
        text = init_script(sock, module_cmds)   # written 0600 by write_init_script

Scripted (lab steps, tests)::

    spec = GdbSpec("e1000_xmit_frame", hits=2, step=3)
    t = run_breakpoint_session(target.stub, vmlinux, module_cmds, spec, out_dir, monitor=target.monitor)
    t.hits, t.timed_out, t.message, t.stops        # + gdb-transcript.{json,txt}

Under TCG both software (``Z0``) and hardware (``Z1``) breakpoints are
QEMU-side breakpoints: nothing is written into guest memory, so module text
works like any other. Breakpoints are hardware ones by default (they also
behave under KVM, up to four at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pygdbmi import gdbmiparser

from labctl.debug.modsyms import add_symbol_file_commands, module_sections
from labctl.debug.symbolize import normalize_path
from labctl.errors import LabctlError, UsageError
from labctl.lab.uri import SshHop

if TYPE_CHECKING:
    from labctl.backends.base import GuestRecord
    from labctl.runstate import LabState

CMD_TIMEOUT = 30.0  # one MI command; TCG makes gdbstub round trips slow
FORWARD_TIMEOUT = 30.0  # a remote gdbstub's SSH forward to come up
LOAD_TIMEOUT = 120.0  # reading vmlinux.debug's symbols (~3 s normally)
STEP_TIMEOUT = 30.0  # one -exec-next/-exec-step
EXIT_TIMEOUT = 5.0
TRANSCRIPT_JSON = "gdb-transcript.json"
TRANSCRIPT_TXT = "gdb-transcript.txt"


class DebugError(LabctlError):
    """gdb could not attach, load symbols or drive the guest."""

    exit_code = 4


class MiTimeout(DebugError):
    """gdb did not answer an MI command in time (its state is unknown)."""


# -- what to do and what happened ----------------------------------------------------

@dataclass(frozen=True)
class GdbSpec:
    """One scripted breakpoint session.

    :param location: a gdb location: function name (in vmlinux or a loaded
        module), ``file.c:LINE`` or ``*0xADDR``.
    :param hits: stop after this many hits.
    :param step: single-steps recorded after each hit.
    :param step_mode: ``line`` (``next``), ``into`` (``step``) or
        ``instruction`` (``nexti``).
    :param timeout: seconds to wait for all the hits after the first continue.
    """

    location: str
    hits: int = 1
    step: int = 0
    step_mode: Literal["line", "into", "instruction"] = "line"
    registers: tuple[str, ...] = ("rip", "rsp", "rdi", "rsi")
    args: bool = True
    backtrace: int = 10
    timeout: float = 60.0
    hardware: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not self.location.strip():
            problems.append("an empty location")
        if self.hits < 1:
            problems.append(f"hits={self.hits} (at least 1)")
        if self.step < 0:
            problems.append(f"step={self.step} (0 or more)")
        if self.step_mode not in ("line", "into", "instruction"):
            problems.append(f"step_mode={self.step_mode!r} (line, into or instruction)")
        if self.timeout <= 0:
            problems.append(f"timeout={self.timeout} (more than 0)")
        if self.backtrace < 0:
            problems.append(f"backtrace={self.backtrace} (0 or more)")
        if problems:
            raise UsageError("bad gdb breakpoint spec: " + ", ".join(problems))


@dataclass(frozen=True)
class FrameInfo:
    """Where a stop or a backtrace frame is: function, source file and line, address."""

    func: str | None
    file: str | None
    line: int | None
    addr: str | None
    level: int | None = None

    def where(self) -> str:
        """``func (file:line)`` or what is known of it."""
        name = self.func or self.addr or "??"
        if self.file:
            return f"{name} ({self.file}:{self.line})" if self.line else f"{name} ({self.file})"
        return name


@dataclass(frozen=True)
class ArgValue:
    """A function argument at a stop: ``value`` is None when it is not a simple value."""

    name: str
    value: str | None
    type: str | None = None


@dataclass
class StopRecord:
    """One stop of the target, parsed from gdb/MI.

    ``kind`` is ``hit`` (our breakpoint), ``step`` (after a single-step),
    ``interrupt`` (we stopped the target) or ``other``.
    """

    kind: str
    hit: int
    step: int
    reason: str
    frame: FrameInfo
    elapsed: float
    args: list[ArgValue] = field(default_factory=list)
    registers: dict[str, str] = field(default_factory=dict)
    backtrace: list[FrameInfo] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Transcript:
    """The outcome of :func:`run_breakpoint_session`."""

    location: str
    hits: int = 0
    stops: list[StopRecord] = field(default_factory=list)
    timed_out: bool = False
    interrupted: bool = False
    message: str = ""
    error: str | None = None
    breakpoint: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    guest_resumed: bool = False

    @property
    def hit_stops(self) -> list[StopRecord]:
        return [s for s in self.stops if s.kind == "hit"]

    def to_json(self) -> dict[str, Any]:
        return {"location": self.location, "hits": self.hits, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "message": self.message, "error": self.error,
                "breakpoint": self.breakpoint, "timings": self.timings, "guest_resumed": self.guest_resumed,
                "stops": [s.to_json() for s in self.stops]}

    def to_text(self) -> str:
        return format_transcript(self)


# -- parsing MI records --------------------------------------------------------------

def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_frame(frame: Mapping[str, Any] | None) -> FrameInfo:
    """A :class:`FrameInfo` from an MI ``frame={...}`` tuple (stop or stack frame)."""
    frame = frame or {}
    file = frame.get("file") or frame.get("fullname")
    return FrameInfo(func=frame.get("func"), file=normalize_path(file) if file else None,
                     line=_int(frame.get("line")), addr=frame.get("addr"), level=_int(frame.get("level")))


def parse_stack(payload: Mapping[str, Any]) -> list[FrameInfo]:
    """Frames from ``-stack-list-frames``' ``stack=[frame={...},...]``."""
    frames = []
    for item in payload.get("stack") or []:
        frame = item.get("frame", item) if isinstance(item, Mapping) else {}
        frames.append(parse_frame(frame))
    return frames


def parse_stack_args(payload: Mapping[str, Any]) -> list[ArgValue]:
    """Frame 0's arguments from ``-stack-list-arguments --simple-values 0 0``."""
    frames = payload.get("stack-args") or []
    if not frames:
        return []
    frame = frames[0].get("frame", frames[0]) if isinstance(frames[0], Mapping) else {}
    return [parse_arg(a) for a in frame.get("args") or [] if isinstance(a, Mapping)]


def parse_arg(arg: Mapping[str, Any]) -> ArgValue:
    return ArgValue(name=str(arg.get("name", "?")), value=arg.get("value"), type=arg.get("type"))


def parse_register_names(payload: Mapping[str, Any]) -> dict[str, int]:
    """``{name: number}`` from ``-data-list-register-names`` (empty names are gaps)."""
    return {name: i for i, name in enumerate(payload.get("register-names") or []) if name}


def parse_register_values(payload: Mapping[str, Any], numbers: Mapping[str, int]) -> dict[str, str]:
    """``{name: value}`` from ``-data-list-register-values``, named through ``numbers``."""
    by_number = {n: name for name, n in numbers.items()}
    values = {}
    for item in payload.get("register-values") or []:
        name = by_number.get(_int(item.get("number")) or -1)
        if name is not None:
            values[name] = str(item.get("value"))
    return values


def stop_reason(stopped: Mapping[str, Any]) -> str:
    """The reason of a ``*stopped`` record (``signal-received SIGINT`` for signals)."""
    reason = str(stopped.get("reason") or "unknown")
    if reason == "signal-received" and stopped.get("signal-name"):
        reason = f"{reason} {stopped['signal-name']}"
    return reason


def is_breakpoint_hit(stopped: Mapping[str, Any], number: str) -> bool:
    """True when a ``*stopped`` record is a hit of breakpoint ``number``."""
    return stopped.get("reason") == "breakpoint-hit" and str(stopped.get("bkptno")) == str(number)


def mi_quote(text: str) -> str:
    """``text`` as an MI c-string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# -- formatting ----------------------------------------------------------------------

def format_args(args: Sequence[ArgValue]) -> str:
    return ", ".join(f"{a.name}={a.value if a.value is not None else '…'}" for a in args)


def format_stop(stop: StopRecord) -> list[str]:
    """The readable lines of one stop."""
    if stop.kind == "hit":
        head = f"hit {stop.hit} at {stop.frame.where()}"
        if stop.args:
            head += f" args: {format_args(stop.args)}"
        lines = [head]
        if stop.registers:
            lines.append("  registers: " + " ".join(f"{k}={v}" for k, v in stop.registers.items()))
        for i, f in enumerate(stop.backtrace):
            lines.append(f"  #{f.level if f.level is not None else i:<2} {f.where()}")
        return lines
    if stop.kind == "step":
        return [f"  step {stop.step}: {stop.frame.where()}" + ("" if stop.reason == "end-stepping-range"
                                                               else f" [{stop.reason}]")]
    return [f"{stop.kind} stop ({stop.reason}) at {stop.frame.where()}"]


def format_transcript(t: Transcript) -> str:
    """The whole session as text (``gdb-transcript.txt``)."""
    bp = t.breakpoint
    if bp:
        lines = [f"breakpoint {bp.get('number', '?')} ({bp.get('type', 'breakpoint')}) at {t.location}"
                 + (f" = {bp['where']}" if bp.get("where") else "")]
    else:
        lines = [f"no breakpoint set at {t.location}"]
    for stop in t.stops:
        lines.extend(format_stop(stop))
    if t.message:
        lines.append(t.message)
    if t.timings:
        lines.append("timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.timings.items()))
    return "\n".join(lines) + "\n"


def write_transcript(t: Transcript, out_dir: Path) -> None:
    """Write ``gdb-transcript.json`` and ``gdb-transcript.txt`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / TRANSCRIPT_JSON).write_text(json.dumps(t.to_json(), indent=2) + "\n")
    (out_dir / TRANSCRIPT_TXT).write_text(t.to_text())


# -- the MI connection ---------------------------------------------------------------

@dataclass
class MiResult:
    """A command's result record with the console output that came before it."""

    message: str
    payload: dict[str, Any]
    console: str


class MiSession:
    """A gdb process speaking MI3: numbered commands, and waits that all end.

    gdb runs in its own session so that a Ctrl-C meant for labctl does not
    reach it (gdb would interrupt the target behind our back).
    """

    def __init__(self, gdb: str = "gdb", log: list[dict[str, Any]] | None = None) -> None:
        try:
            self.proc = subprocess.Popen([gdb, "--nx", "-q", "--interpreter=mi3"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise DebugError(f"cannot start {gdb}: {exc}", hint="install gdb (setup.sh does)") from exc
        self.log = log if log is not None else []
        self.t0 = time.monotonic()
        self.running = False
        self._token = 0
        self._records: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stops: deque[dict[str, Any]] = deque()
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
            self._records.put(gdbmiparser.parse_response(line))
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

    def _next(self, deadline: float) -> dict[str, Any] | None:
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
            self._stops.append(rec.get("payload") or {})
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
                payload = rec.get("payload") or {}
                if rec.get("message") == "error":
                    raise DebugError(f"gdb: {payload.get('msg', 'error')} (in {command.split(' ', 1)[0]})")
                if rec.get("message") == "running":
                    self.running = True
                return MiResult(str(rec.get("message")), payload, "".join(console))
        raise MiTimeout(f"gdb did not answer {command.split(' ', 1)[0]} within {timeout:.0f} s")

    def console(self, command: str, timeout: float = CMD_TIMEOUT) -> str:
        """Run a CLI command through MI; return its console output."""
        return self.command(f"-interpreter-exec console {mi_quote(command)}", timeout).console

    def take_stop(self) -> dict[str, Any] | None:
        """A ``*stopped`` payload already received and not yet handled."""
        return self._stops.popleft() if self._stops else None

    def wait_stopped(self, timeout: float, stop: threading.Event | None = None) -> dict[str, Any] | None:
        """The next ``*stopped`` payload, or None when ``timeout`` passes or ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while True:
            if self._stops:
                return self._stops.popleft()
            if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
                return None
            self._next(deadline)

    def close(self) -> None:
        """End gdb: ``-gdb-exit``, then SIGTERM, then SIGKILL."""
        if self.alive:
            try:
                self.send("-gdb-exit")
            except DebugError:
                pass
        for sig in (None, self.proc.terminate, self.proc.kill):
            if sig is not None and self.alive:
                sig()
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT)
                break
            except subprocess.TimeoutExpired:
                continue
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass


# -- the scripted session ------------------------------------------------------------

def _timed(timings: dict[str, float], name: str, t0: float) -> None:
    timings[name] = round(time.monotonic() - t0, 3)


def load_symbols(mi: MiSession, vmlinux: Path, module_cmds: Iterable[str]) -> None:
    """Quiet gdb settings, vmlinux's symbols and the modules' symbol files."""
    for setting in ("pagination off", "confirm off", "mi-async on", "print pretty off",
                    "max-completions 0"):
        mi.command(f"-gdb-set {setting}")
    if not vmlinux.is_file():
        raise DebugError(f"no kernel with debug info at {vmlinux}",
                         hint="rebuild the image: labctl image build --force")
    mi.command(f"-file-exec-and-symbols {mi_quote(str(vmlinux))}", timeout=LOAD_TIMEOUT)
    for cmd in module_cmds:
        mi.console(cmd, timeout=LOAD_TIMEOUT)


def attach(mi: MiSession, stub: GdbStub, local: str, timeout: float = CMD_TIMEOUT) -> None:
    """Connect to the gdbstub through its local socket ``local``; the guest is paused from here on."""
    try:
        mi.console(target_remote(local), timeout=timeout)
    except DebugError as exc:
        raise DebugError(f"cannot attach to the gdbstub on {stub.where}: {exc.message}",
                         hint="is the guest up, and no other gdb attached to it?") from exc
    mi.take_stop()  # the stop that attaching reports


def insert_breakpoint(mi: MiSession, spec: GdbSpec) -> dict[str, Any]:
    """Insert the session's breakpoint (hardware unless ``spec.hardware`` is off).

    :raise DebugError: when gdb cannot resolve the location.
    """
    flags = "-h " if spec.hardware else ""
    try:
        res = mi.command(f"-break-insert {flags}{mi_quote(spec.location)}")
    except DebugError as exc:
        if spec.hardware and "hardware" in exc.message.lower():
            res = mi.command(f"-break-insert {mi_quote(spec.location)}")
        else:
            raise DebugError(f"cannot set a breakpoint at {spec.location}: {exc.message}",
                             hint="is the function in vmlinux or in a loaded module with debug info?") from exc
    bkpt = dict(res.payload.get("bkpt") or {})
    where = parse_frame(bkpt) if bkpt.get("func") or bkpt.get("file") else None
    if where is not None:
        bkpt["where"] = where.where()
    return bkpt


class _Recorder:
    """Collects the details of one stop (args, registers, backtrace)."""

    def __init__(self, mi: MiSession, spec: GdbSpec, t0: float) -> None:
        self.mi = mi
        self.spec = spec
        self.t0 = t0
        self._regnums: dict[str, int] | None = None

    def record(self, kind: str, hit: int, step: int, stopped: dict[str, Any], details: bool) -> StopRecord:
        rec = StopRecord(kind=kind, hit=hit, step=step, reason=stop_reason(stopped),
                         frame=parse_frame(stopped.get("frame")), elapsed=round(time.monotonic() - self.t0, 3),
                         raw=stopped)
        if details:
            rec.args = self.args(stopped) if self.spec.args else []
            rec.registers = self.registers() if self.spec.registers else {}
            rec.backtrace = self.backtrace() if self.spec.backtrace > 0 else []
        return rec

    def args(self, stopped: Mapping[str, Any]) -> list[ArgValue]:
        """The arguments the ``*stopped`` frame carries (scalars with values), else
        asked for. ``-stack-list-arguments --simple-values`` (which adds types)
        costs ~10 s on the first stop under a 600 MB vmlinux, so it is avoided."""
        frame = stopped.get("frame") or {}
        if "args" in frame:
            return [parse_arg(a) for a in frame.get("args") or [] if isinstance(a, Mapping)]
        try:
            return parse_stack_args(self.mi.command("-stack-list-arguments 1 0 0").payload)
        except DebugError as exc:
            return [ArgValue("error", exc.message)]

    def registers(self) -> dict[str, str]:
        if self._regnums is None:
            self._regnums = parse_register_names(self.mi.command("-data-list-register-names").payload)
        wanted = {r: self._regnums[r] for r in self.spec.registers if r in self._regnums}
        if not wanted:
            return {}
        nums = " ".join(str(n) for n in wanted.values())
        return parse_register_values(self.mi.command(f"-data-list-register-values x {nums}").payload, wanted)

    def backtrace(self) -> list[FrameInfo]:
        try:
            return parse_stack(self.mi.command(f"-stack-list-frames 0 {self.spec.backtrace - 1}").payload)
        except DebugError:
            return []


_STEP_COMMANDS = {"line": "-exec-next", "into": "-exec-step", "instruction": "-exec-next-instruction"}


def _interrupt(mi: MiSession) -> dict[str, Any] | None:
    """Stop a running target; the ``*stopped`` payload or None."""
    if not mi.running:
        return mi.take_stop() or {}
    mi.command("-exec-interrupt")
    return mi.wait_stopped(CMD_TIMEOUT)


def _steps(mi: MiSession, spec: GdbSpec, rec: _Recorder, hit: int, t: Transcript,
           stop: threading.Event | None) -> None:
    for i in range(1, spec.step + 1):
        if stop is not None and stop.is_set():
            return
        t0 = time.monotonic()
        mi.command(_STEP_COMMANDS[spec.step_mode])
        stopped = mi.wait_stopped(STEP_TIMEOUT)
        if stopped is None:  # stepping over something that never returns
            stopped = _interrupt(mi) or {}
            t.stops.append(rec.record("step", hit, i, {**stopped, "reason": "step-timeout"}, False))
            return
        t.stops.append(rec.record("step", hit, i, stopped, False))
        t.timings.setdefault("step_total", 0.0)
        t.timings["step_total"] = round(t.timings["step_total"] + time.monotonic() - t0, 3)
        if stopped.get("reason") in ("exited", "exited-normally", "exited-signalled"):
            raise DebugError("the target went away while stepping")


def _collect_hits(mi: MiSession, spec: GdbSpec, bp: str, t: Transcript, stop: threading.Event | None) -> None:
    rec = _Recorder(mi, spec, time.monotonic())
    t0 = time.monotonic()
    deadline = t0 + spec.timeout
    while t.hits < spec.hits:
        if not mi.running:
            mi.command("-exec-continue")
        stopped = mi.wait_stopped(deadline - time.monotonic(), stop)
        if stopped is None:
            _give_up(mi, spec, rec, t, stop)
            return
        if not is_breakpoint_hit(stopped, bp):
            t.stops.append(rec.record("other", t.hits, 0, stopped, False))
            if stopped.get("reason") in ("exited", "exited-normally", "exited-signalled"):
                raise DebugError(f"the target went away ({stop_reason(stopped)})")
            continue
        t.hits += 1
        t1 = time.monotonic()
        t.stops.append(rec.record("hit", t.hits, 0, stopped, True))
        if t.hits == 1:  # the first one is the slow one (gdb expands symbol tables)
            _timed(t.timings, "first_hit", t0)
            _timed(t.timings, "record_first_hit", t1)
        _steps(mi, spec, rec, t.hits, t, stop)
    t.message = f"breakpoint at {spec.location} hit {t.hits} time{'s' if t.hits != 1 else ''}"


def _give_up(mi: MiSession, spec: GdbSpec, rec: _Recorder, t: Transcript, stop: threading.Event | None) -> None:
    """Waiting ended without the hits: interrupt the target and say why."""
    stopped = _interrupt(mi)
    if stopped is not None:
        t.stops.append(rec.record("interrupt", t.hits, 0, stopped, False))
    if stop is not None and stop.is_set():
        t.interrupted = True
        t.message = f"interrupted after {t.hits} of {spec.hits} hits of breakpoint {spec.location}"
        return
    t.timed_out = True
    if t.hits == 0:
        t.message = f"breakpoint {spec.location} was never hit within {spec.timeout:g} s"
    else:
        t.message = (f"breakpoint {spec.location} was hit only {t.hits} of {spec.hits} times "
                     f"within {spec.timeout:g} s")


def leave_running(mi: MiSession, connected: bool) -> bool:
    """Leave the guest running: stop it if needed, delete breakpoints, detach
    (QEMU resumes the guest on detach), exit gdb. Returns True when the
    detach went through; every step is tried even if an earlier one failed."""
    detached = False
    if connected and mi.alive:
        for action in (lambda: _interrupt(mi), lambda: mi.command("-break-delete")):
            try:
                action()
            except DebugError:
                pass
        try:
            mi.command("-target-detach")
            detached = True
        except DebugError:
            pass
    mi.close()
    return detached


# -- QMP to the guest, whatever runs it -------------------------------------------------

class Monitor(Protocol):
    """A guest's QMP monitor, as far as gdb sessions need it.

    :meth:`execute` runs one command and returns its ``return`` value; it
    raises :class:`labctl.errors.MachineError` when the monitor is
    unreachable or the command fails.
    """

    def execute(self, command: str) -> Any: ...


@dataclass(frozen=True)
class BackendMonitor:
    """QMP through the guest's backend (:meth:`Backend.qmp`): the qemu backend's
    unix socket, or libvirt's monitor passthrough."""

    backend: str
    record: GuestRecord

    def execute(self, command: str) -> Any:
        from labctl.backends.base import get_backend

        return get_backend(self.backend).qmp(self.record, command)


@dataclass(frozen=True)
class SocketMonitor:
    """QMP on a QEMU monitor unix socket (a qemu-backend guest known only by its socket)."""

    path: Path

    def execute(self, command: str) -> Any:
        from labctl.backends.qmp import qmp_execute

        return qmp_execute(self.path, command)


def as_monitor(monitor: Monitor | Path | str | None) -> Monitor | None:
    """``monitor`` as a :class:`Monitor`: a path is a QMP unix socket, empty is none."""
    if monitor is None or isinstance(monitor, (Path, str)):
        return SocketMonitor(Path(monitor)) if monitor else None
    return monitor


def qmp_running(monitor: Monitor | Path | None) -> bool | None:
    """Whether QEMU says the guest runs (None when QMP cannot tell)."""
    from labctl.errors import MachineError

    mon = as_monitor(monitor)
    if mon is None:
        return None
    try:
        return bool(mon.execute("query-status").get("running"))
    except (MachineError, AttributeError):
        return None


def ensure_resumed(monitor: Monitor | Path | None, was_running: bool | None, detached: bool) -> bool:
    """After gdb is gone: resume a guest that ran before we attached and is
    paused now (QEMU pauses the guest on every gdb connection, even a failed
    one, and does not resume it when gdb disconnects without detaching).
    True when the guest is known to run (or gdb detached cleanly)."""
    from labctl.errors import MachineError

    mon = as_monitor(monitor)
    if mon is None or was_running is False:
        return detached
    if qmp_running(mon):
        return True
    try:
        mon.execute("cont")
    except MachineError:
        return False
    return bool(qmp_running(mon))


@dataclass(frozen=True)
class GdbStub:
    """Where a guest's gdbstub listens: QEMU's unix socket ``path`` (in a 0700
    directory) on the machine that runs the guest, or on the libvirt host ``via``.

    It is never a TCP port: the gdb protocol's ``qRcmd`` reaches QEMU's monitor,
    and with it host commands, so only the lab's owner may connect.
    """

    path: str
    via: SshHop | None = None

    @classmethod
    def of(cls, stub: GdbStub | str | Path) -> GdbStub:
        """``stub`` itself, or a socket path on this machine."""
        return stub if isinstance(stub, GdbStub) else cls(str(stub))

    @property
    def where(self) -> str:
        """The stub's address for messages."""
        return self.path + (f" on host {self.via.host}" if self.via else "")

    @contextlib.contextmanager
    def local(self, scratch: Path) -> Iterator[str]:
        """A unix socket on this machine that reaches the stub, for the block.

        A local stub is its own socket. A remote one is reached through an
        OpenSSH stream-local forward (``ssh -N -L SCRATCH/gdb-fwd.sock:PATH``,
        logged in as the host's URI is), whose socket ssh makes 0600 in
        ``scratch`` (the guest's 0700 directory); the forward ends with the block.

        :raise DebugError: when the forward cannot be set up.
        """
        if self.via is None:
            yield self.path
            return
        from labctl.proc import kill_group, spawn_tied
        from labctl.ssh import hop_forward_argv

        sock = scratch / "gdb-fwd.sock"
        sock.unlink(missing_ok=True)
        log_path = scratch / "gdb-fwd.log"
        proc = spawn_tied(hop_forward_argv(self.via, str(sock), self.path), log_path)
        try:
            deadline = time.monotonic() + FORWARD_TIMEOUT
            while not sock.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    why = log_path.read_text(errors="replace").strip() if log_path.exists() else ""
                    raise DebugError(f"cannot reach the gdbstub on {self.where} through SSH: "
                                     f"{why or 'the forward did not start'}")
                time.sleep(0.05)
            yield str(sock)
        finally:
            kill_group(proc, grace=1.0)
            sock.unlink(missing_ok=True)


def gdbstub_clients(path: str, table: str | None = None) -> int:
    """How many connections to the gdbstub's unix socket ``path`` are established,
    from ``/proc/net/unix`` (or its text in ``table``): an accepted connection
    shows the listener's path with state 03 (connected)."""
    if table is None:
        try:
            table = Path("/proc/net/unix").read_text()
        except OSError:
            return 0
    count = 0
    for line in table.splitlines():
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[5] == "03" and fields[7] == path:
            count += 1
    return count


def _remote_unix_table(hop: SshHop) -> str | None:
    """``/proc/net/unix`` of the libvirt host ``hop``; None when unreadable."""
    from labctl.ssh import read_on_host

    return read_on_host(hop, ["cat", "/proc/net/unix"])


def ensure_gdbstub_free(stub: GdbStub | str | Path) -> None:
    """Refuse to connect while another gdb holds the gdbstub: QEMU serves one
    client at a time, and a second one would hang with the guest paused.
    A remote host's connections are read over SSH (not checked when that fails).

    :raise DebugError: when a client is connected.
    """
    stub = GdbStub.of(stub)
    table = None if stub.via is None else _remote_unix_table(stub.via)
    if stub.via is not None and table is None:
        return
    if gdbstub_clients(stub.path, table=table):
        raise DebugError(f"another debugger is attached to the gdbstub {stub.where}",
                         hint="detach or quit that gdb first")


def target_remote(local: str) -> str:
    """gdb's command connecting to the unix socket ``local`` on this machine.

    gdb recognises a socket by its absolute path (gdb 13 has no ``unix::``
    prefix); a ``:`` would read as ``host:port`` and spaces end the word.

    :raise DebugError: for a path gdb cannot take.
    """
    if not local.startswith("/") or ":" in local or any(c.isspace() for c in local):
        raise DebugError(f"gdb cannot connect to a socket path with spaces or ':' in it: {local}",
                         hint="use a state directory without them ($LABCTL_STATE_DIR)")
    return f"target remote {local}"


def run_breakpoint_session(stub: GdbStub | str | Path, vmlinux: Path, module_cmds: list[str], spec: GdbSpec, out_dir: Path,
                           stop: threading.Event | None = None, *, monitor: Monitor | Path | None = None,
                           gdb: str = "gdb") -> Transcript:
    """Attach to the gdbstub ``stub`` (a :class:`GdbStub`, or a socket path on
    this machine), break at ``spec.location``,
    record ``spec.hits`` hits with ``spec.step`` single-steps each, and leave
    the guest running.

    The transcript is written to ``out_dir`` (``gdb-transcript.json`` and
    ``.txt``) in every case. A breakpoint not hit within ``spec.timeout``
    returns with ``timed_out`` set; ``stop`` being set ends the session the
    same way with ``interrupted``.

    :param module_cmds: ``add-symbol-file`` commands (:func:`labctl.debug.modsyms.add_symbol_file_commands`).
    :param monitor: the guest's QMP (:attr:`GdbTarget.monitor`, or a QEMU
        monitor socket path): if gdb cannot detach, the guest is resumed
        through it (when it was running before).
    :raise DebugError: when gdb cannot load symbols, attach, or resolve the
        location (after leaving the guest running and writing the transcript).
    """
    t = Transcript(location=spec.location)
    stub = GdbStub.of(stub)
    mon = as_monitor(monitor)
    was_running = qmp_running(mon)
    mi = MiSession(gdb)
    connected = False
    with contextlib.ExitStack() as forward:  # a remote stub's SSH forward outlives the detach below
        try:
            ensure_gdbstub_free(stub)  # before the slow symbol loading; again just before connecting
            t0 = time.monotonic()
            load_symbols(mi, vmlinux, module_cmds)
            _timed(t.timings, "load_symbols", t0)
            ensure_gdbstub_free(stub)
            local = forward.enter_context(stub.local(out_dir))
            t1 = time.monotonic()
            connected = True  # from the first connection attempt on, the guest may be paused
            attach(mi, stub, local)
            _timed(t.timings, "attach", t1)
            t1 = time.monotonic()
            t.breakpoint = insert_breakpoint(mi, spec)
            _timed(t.timings, "break_insert", t1)
            _collect_hits(mi, spec, str(t.breakpoint.get("number", "1")), t, stop)
        except DebugError as exc:
            t.error = exc.message
            t.message = t.message or exc.message
            raise
        except KeyboardInterrupt:
            t.interrupted = True
            t.message = f"interrupted (Ctrl-C) after {t.hits} of {spec.hits} hits of breakpoint {spec.location}"
            raise
        finally:
            t1 = time.monotonic()
            detached = leave_running(mi, connected)
            t.guest_resumed = ensure_resumed(mon, was_running, detached) if connected else True
            _timed(t.timings, "detach", t1)
            write_transcript(t, out_dir)
    return t


# -- labs: finding a guest's gdbstub and symbols, the interactive init script --------

@dataclass(frozen=True)
class GdbTarget:
    """Everything gdb needs about one guest of a running lab."""

    lab: str
    guest: str
    socket: str  # the gdbstub's unix socket, on the machine that runs the guest
    vmlinux: Path
    image_dir: Path
    manifest: dict[str, Any]
    monitor: Monitor
    run_dir: Path
    via: SshHop | None = None  # the libvirt host the gdbstub's socket is on

    @property
    def stub(self) -> GdbStub:
        return GdbStub(self.socket, self.via)

    @property
    def debug_modules(self) -> Path:
        return self.image_dir / "debug-modules"

    @property
    def source_dir(self) -> Path | None:
        return find_source_dir(self.image_dir)


def gdb_target(state: LabState, guest: str) -> GdbTarget:
    """The gdb view of ``guest`` in a :class:`labctl.runstate.LabState`.

    :raise LabStateError: no such guest. :raise DebugError: no gdbstub or no debug kernel.
    """
    hop = state.endpoint(guest).via  # raises for an unknown guest
    rec = state.guests[guest]
    if not rec.gdb:
        raise DebugError(f"guest {guest} of lab {state.lab} has no gdbstub",
                         hint="it was started by an older labctl: labctl down, then up again")
    image_dir = Path(state.image["dir"])
    manifest = _read_manifest(image_dir)
    vmlinux = image_dir / "vmlinux.debug"
    if not vmlinux.is_file():
        raise DebugError(f"the image has no kernel with debug info ({vmlinux})",
                         hint="rebuild the image: labctl image build --force")
    return GdbTarget(state.lab, guest, rec.gdb, vmlinux, image_dir, manifest,
                     BackendMonitor(state.backend, rec), Path(rec.dir), hop)


def _read_manifest(image_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((image_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def guest_module_commands(state: LabState, guest: str, debug_modules: Path) -> list[str]:
    """``add-symbol-file`` commands for the modules loaded in ``guest`` (one SSH command)."""
    from labctl.ssh import Session

    with Session(state.endpoint(guest)) as s:
        return add_symbol_file_commands(module_sections(s), debug_modules)


def find_source_dir(image_dir: Path) -> Path | None:
    """The kernel source tree under ``image_dir/source`` (the folder itself, or its
    only subfolder holding a ``Makefile``), or None."""
    src = image_dir / "source"
    if not src.is_dir():
        return None
    if (src / "Makefile").is_file():
        return src
    subs = [d for d in src.iterdir() if d.is_dir() and (d / "Makefile").is_file()]
    return subs[0] if len(subs) == 1 else src


_UPSTREAM = re.compile(r"^(\d+\.\d+(?:\.\d+)?)")


def build_paths(manifest: Mapping[str, Any]) -> list[str]:
    """The directories the Debian kernel's DWARF names files relative to.

    C files are ``drivers/...`` relative to the build directory
    (``debian/build/build_amd64_none_amd64``, absolute for some units);
    assembly files are absolute under ``/build/reproducible-path/linux-X.Y.Z``.
    Longest first, as gdb's substitute-path takes the first matching rule.
    """
    kernel = manifest.get("kernel") or {}
    release = str(kernel.get("release", ""))
    flavour = release.rsplit("-", 1)[-1] if "-" in release else "amd64"
    build = f"debian/build/build_{flavour}_none_{flavour}"
    m = _UPSTREAM.match(str(kernel.get("version", "")))
    paths = []
    if m:
        root = f"/build/reproducible-path/linux-{m.group(1)}"
        paths += [f"{root}/{build}", root]
    paths.append(build)
    return paths


def source_commands(source: Path | None, manifest: Mapping[str, Any]) -> list[str]:
    """``set substitute-path`` and ``directory`` commands mapping DWARF file names to ``source``."""
    if source is None:
        return []
    cmds = [f"set substitute-path {p} {source}" for p in build_paths(manifest)]
    cmds.append(f"directory {source}")
    return cmds


# gdb's 'kill' sends QEMU the 'k' packet, which ends the QEMU process (the
# guest dies). A hook that fails cancels the command; an error raised from a
# gdb.Command prints just its message.
NO_KILL_HOOK = [
    "python",
    "class LabctlRefuseKill(gdb.Command):",
    "    def __init__(self):",
    "        super().__init__('labctl-refuse-kill', gdb.COMMAND_RUNNING)",
    "    def invoke(self, arg, from_tty):",
    "        raise gdb.GdbError(\"labctl: 'kill' would terminate the guest's QEMU; \"",
    "                           \"'detach' or 'quit' leave the guest running\")",
    "LabctlRefuseKill()",
    "end",
    "define hook-kill",
    "labctl-refuse-kill",
    "end",
]


def init_script(local: str, module_cmds: Sequence[str], source_cmds: Sequence[str] = (),
                interactive: bool = True) -> str:
    """The gdb commands run before the prompt: settings, module symbols, source
    paths, then ``target remote`` to the stub's socket ``local`` on this machine
    (which pauses the guest)."""
    quiet = ["set logging file /dev/null", "set logging redirect on", "set logging enabled on",
             *module_cmds, "set logging enabled off", "set logging redirect off"] if module_cmds else []
    lines = ["# written by labctl gdb", "set pagination off", "set confirm off", "set print pretty on",
             *NO_KILL_HOOK, *source_cmds, *quiet, target_remote(local)]
    if interactive:
        lines += ["set pagination on", "set confirm on",
                  ("echo labctl: the guest is paused while gdb holds it; 'continue' resumes it, "
                   "'detach' or 'quit' leave it running.\\n")]
    return "\n".join(lines) + "\n"


def write_init_script(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path
