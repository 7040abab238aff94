"""The scripted breakpoint session of a lab step: attach, break, record hits and steps, leave the guest running."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import labctl.debug.gdb.transcript as transcript  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import Monitor, as_monitor, ensure_resumed, qmp_running
from labctl.debug.gdb.mi import CMD_TIMEOUT, MiSession
from labctl.debug.gdb.stub import GdbStub, ensure_gdbstub_free, target_remote
from labctl.errors import DebugError

LOAD_TIMEOUT = 120.0  # reading vmlinux.debug's symbols (~3 s normally)
STEP_TIMEOUT = 30.0  # one -exec-next/-exec-step


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
    mi.command(f"-file-exec-and-symbols {transcript.mi_quote(str(vmlinux))}", timeout=LOAD_TIMEOUT)
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


def insert_breakpoint(mi: MiSession, spec: transcript.GdbSpec) -> transcript.MiBreakpoint:
    """Insert the session's breakpoint (hardware unless ``spec.hardware`` is off).

    :raise DebugError: when gdb cannot resolve the location.
    """
    flags = "-h " if spec.hardware else ""
    try:
        res = mi.command(f"-break-insert {flags}{transcript.mi_quote(spec.location)}")
    except DebugError as exc:
        if spec.hardware and "hardware" in exc.message.lower():
            res = mi.command(f"-break-insert {transcript.mi_quote(spec.location)}")
        else:
            raise DebugError(f"cannot set a breakpoint at {spec.location}: {exc.message}",
                             hint="is the function in vmlinux or in a loaded module with debug info?") from exc
    bkpt = (res.payload.get("bkpt") or transcript.MiBreakpoint()).copy()
    where = transcript.parse_frame(bkpt) if bkpt.get("func") or bkpt.get("file") else None
    if where is not None:
        bkpt["where"] = where.where()
    return bkpt


class _Recorder:
    """Collects the details of one stop (args, registers, backtrace)."""

    def __init__(self, mi: MiSession, spec: transcript.GdbSpec, t0: float) -> None:
        self.mi = mi
        self.spec = spec
        self.t0 = t0
        self._regnums: dict[str, int] | None = None

    def record(self, kind: str, hit: int, step: int, stopped: transcript.MiPayload,
               details: bool) -> transcript.StopRecord:
        rec = transcript.StopRecord(kind=kind, hit=hit, step=step, reason=transcript.stop_reason(stopped),
                                    frame=transcript.parse_frame(stopped.get("frame")),
                                    elapsed=round(time.monotonic() - self.t0, 3), raw=stopped)
        if details:
            rec.args = self.args(stopped) if self.spec.args else []
            rec.registers = self.registers() if self.spec.registers else {}
            rec.backtrace = self.backtrace() if self.spec.backtrace > 0 else []
        return rec

    def args(self, stopped: transcript.MiPayload) -> list[transcript.ArgValue]:
        """The arguments the ``*stopped`` frame carries (scalars with values), else
        asked for. ``-stack-list-arguments --simple-values`` (which adds types)
        costs ~10 s on the first stop under a 600 MB vmlinux, so it is avoided."""
        frame = stopped.get("frame") or {}
        if "args" in frame:
            return [transcript.parse_arg(a) for a in frame.get("args") or [] if isinstance(a, Mapping)]
        try:
            return transcript.parse_stack_args(self.mi.command("-stack-list-arguments 1 0 0").payload)
        except DebugError as exc:
            return [transcript.ArgValue("error", exc.message)]

    def registers(self) -> dict[str, str]:
        if self._regnums is None:
            self._regnums = transcript.parse_register_names(self.mi.command("-data-list-register-names").payload)
        wanted = {r: self._regnums[r] for r in self.spec.registers if r in self._regnums}
        if not wanted:
            return {}
        nums = " ".join(str(n) for n in wanted.values())
        values = self.mi.command(f"-data-list-register-values x {nums}").payload
        return transcript.parse_register_values(values, wanted)

    def backtrace(self) -> list[transcript.FrameInfo]:
        try:
            return transcript.parse_stack(self.mi.command(f"-stack-list-frames 0 {self.spec.backtrace - 1}").payload)
        except DebugError:
            return []


_STEP_COMMANDS = {"line": "-exec-next", "into": "-exec-step", "instruction": "-exec-next-instruction"}


def _interrupt(mi: MiSession) -> transcript.MiPayload | None:
    """Stop a running target; the ``*stopped`` payload or None."""
    if not mi.running:
        return mi.take_stop() or transcript.MiPayload()
    mi.command("-exec-interrupt")
    return mi.wait_stopped(CMD_TIMEOUT)


def _steps(mi: MiSession, spec: transcript.GdbSpec, rec: _Recorder, hit: int, t: transcript.Transcript,
           stop: threading.Event | None) -> None:
    for i in range(1, spec.step + 1):
        if stop is not None and stop.is_set():
            return
        t0 = time.monotonic()
        mi.command(_STEP_COMMANDS[spec.step_mode])
        stopped = mi.wait_stopped(STEP_TIMEOUT)
        if stopped is None:  # stepping over something that never returns
            timed_out: transcript.MiPayload = {**(_interrupt(mi) or transcript.MiPayload()), "reason": "step-timeout"}
            t.stops.append(rec.record("step", hit, i, timed_out, False))
            return
        t.stops.append(rec.record("step", hit, i, stopped, False))
        t.timings.setdefault("step_total", 0.0)
        t.timings["step_total"] = round(t.timings["step_total"] + time.monotonic() - t0, 3)
        if stopped.get("reason") in ("exited", "exited-normally", "exited-signalled"):
            raise DebugError("the target went away while stepping")


def _collect_hits(mi: MiSession, spec: transcript.GdbSpec, bp: str, t: transcript.Transcript,
                  stop: threading.Event | None) -> None:
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
        if not transcript.is_breakpoint_hit(stopped, bp):
            t.stops.append(rec.record("other", t.hits, 0, stopped, False))
            if stopped.get("reason") in ("exited", "exited-normally", "exited-signalled"):
                raise DebugError(f"the target went away ({transcript.stop_reason(stopped)})")
            continue
        t.hits += 1
        t1 = time.monotonic()
        t.stops.append(rec.record("hit", t.hits, 0, stopped, True))
        if t.hits == 1:  # the first one is the slow one (gdb expands symbol tables)
            _timed(t.timings, "first_hit", t0)
            _timed(t.timings, "record_first_hit", t1)
        _steps(mi, spec, rec, t.hits, t, stop)
    t.message = f"breakpoint at {spec.location} hit {t.hits} time{'s' if t.hits != 1 else ''}"


def _give_up(mi: MiSession, spec: transcript.GdbSpec, rec: _Recorder, t: transcript.Transcript,
             stop: threading.Event | None) -> None:
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


def run_breakpoint_session(stub: GdbStub | str | Path, vmlinux: Path, module_cmds: list[str],
                           spec: transcript.GdbSpec, out_dir: Path, stop: threading.Event | None = None, *,
                           monitor: Monitor | Path | None = None, gdb: str = "gdb") -> transcript.Transcript:
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
    t = transcript.Transcript(location=spec.location)
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
            transcript.write_transcript(t, out_dir)
    return t


