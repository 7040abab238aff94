"""A step's ``gdb:`` kind: a scripted breakpoint session on a guest's gdbstub, alongside the workload.

The session (:func:`labctl.debug.gdb.run_breakpoint_session`) starts in a thread before the window
opens and runs while the commands do; once the window closes it is waited for (told to stop at
once when the step already failed). Its transcript goes into the guest's directory of the step;
a breakpoint never hit is a warning, a session that could not run fails the step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from labctl.bundle import GdbRecord
from labctl.debug import GdbSpec, Transcript, gdb_target, guest_module_commands, run_breakpoint_session
from labctl.errors import LabctlError, UsageError
from labctl.lab import GdbStep, Step, check_location, render
from labctl.steps.variant import StepKind, Variant

JOIN_TIMEOUT = 600.0
STOP_TIMEOUT = 60.0


@dataclass
class _Session:
    stop: threading.Event
    thread: threading.Thread | None = None
    transcript: Transcript | None = None
    error: str | None = None


class GdbKind(StepKind):
    """The step's gdb session (see the module docstring)."""

    name = "gdb"

    def __init__(self, spec: GdbStep, row: dict[str, str]) -> None:
        self.spec, self.row = spec, row
        self.session: _Session | None = None

    @classmethod
    def of(cls, step: Step, row: dict[str, str]) -> GdbKind | None:
        return cls(step.gdb, row) if step.gdb is not None else None

    def guests(self) -> list[str]:
        return [self.spec.guest]

    def begin(self, v: Variant) -> None:
        """Start the session in a thread; it runs while the commands do.

        :raise UsageError: for a breakpoint location the row makes invalid.
        """
        g = self.spec
        target = gdb_target(v.state, g.guest)
        out = v.bundle / v.rel / g.guest
        out.mkdir(parents=True, exist_ok=True)
        try:
            location = check_location(render(g.location, self.row, v.addresses, quote=False))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        mods = guest_module_commands(v.state, g.guest, target.debug_modules)
        spec = GdbSpec(location, g.hits, g.step,
                       g.step_mode, g.registers, True, g.backtrace, g.timeout)  # type: ignore[arg-type]
        run = self.session = _Session(threading.Event())

        def go() -> None:
            try:
                run.transcript = run_breakpoint_session(target.stub, target.vmlinux, mods, spec, out, run.stop,
                                                        monitor=target.monitor)
            except LabctlError as exc:
                run.error = exc.message
            except Exception as exc:  # noqa: BLE001 - reported on the step, never lost
                run.error = f"gdb session failed: {exc}"

        run.thread = threading.Thread(target=go, name="gdb", daemon=True)
        run.thread.start()

    def settle(self, v: Variant) -> None:
        run, res = self.session, v.res
        if run is None or run.thread is None:
            return
        if res.status == "failed":
            run.stop.set()
        run.thread.join(timeout=JOIN_TIMEOUT)
        if run.thread.is_alive():
            run.stop.set()
            run.thread.join(timeout=STOP_TIMEOUT)
        t = run.transcript
        if run.error:
            res.fail(run.error)
        elif t is not None:
            if t.timed_out:
                res.warnings.append(t.message or "the gdb breakpoint was never hit")
            record: GdbRecord = {"breakpoint": dict(t.breakpoint), "hits": t.hits, "timed_out": t.timed_out,
                                 "message": t.message, "transcript": "gdb-transcript.txt"}
            res.records["gdb"] = record
