"""A step's ``run:`` kind: its commands in order, in the window, each recorded for the manifest.

A foreground command runs under ``timeout`` in the step's guest directory, its output in
``cmd-N.out``/``cmd-N.err``; a background one runs detached (its pid in ``cmd-N.pid``, its exit
status in ``cmd-N.status``) until the step settles, when it gets SIGINT and its status is read; a
``{link: ...}`` entry is the step's network's (:mod:`.netstep`). The first command of a guest whose
trace records with ``perf_record: {target: command}`` runs under ``perf record``.
"""

from __future__ import annotations

import shlex
import time

import labctl.steps.tracers as tr
from labctl.bundle import CommandRecord
from labctl.errors import GuestError, LabctlError
from labctl.lab import LinkSpec, RunSpec, Step, render
from labctl.steps.netstep import NetworkKind, link_guest
from labctl.steps.variant import StepKind, Variant, now

q = shlex.quote
SETTLE_TIMEOUT = 10  # s a background command has to end once asked


class CommandsKind(StepKind):
    """The step's ``run`` entries (see the module docstring)."""

    name = "commands"

    def __init__(self, step: Step, row: dict[str, str]) -> None:
        self.specs = step.run
        self.row = row
        self.background: list[tuple[str, int]] = []  # (guest, index) of each background command

    @classmethod
    def of(cls, step: Step, row: dict[str, str]) -> CommandsKind | None:
        return cls(step, row) if step.run else None

    def guests(self) -> list[str]:
        return [link_guest(s, self.row) if isinstance(s, LinkSpec) else s.guest for s in self.specs]

    def run(self, v: Variant) -> None:
        wrapped: set[str] = set()
        for i, spec in enumerate(self.specs):
            if isinstance(spec, LinkSpec):
                self._link(v, i, spec)
                continue
            command = render(spec.command, self.row, v.addresses, quote=True)
            trace = v.step.trace.get(spec.guest)
            if (not spec.background and trace and trace.perf_record and trace.perf_record.target == "command"
                    and spec.guest not in wrapped and "perf" in v.sessions.tools(spec.guest)):
                argv = tr.with_build_ids(tr.perf_record_argv(trace, system=False), v.kernel_release(spec.guest))
                command = shlex.join(argv) + " -- sh -c " + q(command)
                wrapped.add(spec.guest)
            if spec.background:
                self._start_background(v, i, spec, command)
                self.background.append((spec.guest, i))
                time.sleep(spec.ready_after)
            else:
                self._run_foreground(v, i, spec, command)

    def _entry(self, v: Variant, i: int, guest: str | None, command: str, background: bool, status: int | None,
               started: str, duration: float) -> CommandRecord:
        return {"guest": guest, "step": v.step.name, "variant": v.res.variant, "index": i, "command": command,
                "background": background, "status": status, "duration_s": round(duration, 3), "started_at": started}

    def _link(self, v: Variant, i: int, spec: LinkSpec) -> None:
        """A step's link entry: QMP set_link on the host, recorded as a command of the run."""
        started, t0 = now(), time.monotonic()
        guest = link_guest(spec, self.row)
        net = v.kind(NetworkKind)
        assert net is not None  # every step has its network
        try:
            command = net.link(v, spec)
        except LabctlError:
            v.record(self._entry(v, i, guest, f"link {render(spec.nic, self.row, {}, quote=False)}", False, 1,
                                 started, time.monotonic() - t0))
            raise
        v.record(self._entry(v, i, guest, command, False, 0, started, time.monotonic() - t0))

    def _run_foreground(self, v: Variant, i: int, spec: RunSpec, command: str) -> None:
        started, t0 = now(), time.monotonic()
        limit = int(spec.timeout)
        wrapped = (f"cd {q(v.workdir)} && timeout -s INT -k 10 {limit} sh -c {q(command)} "
                   f"> cmd-{i}.out 2> cmd-{i}.err")
        dead = v.sessions.dead_guests
        status = v.sessions.ssh(spec.guest).run(wrapped, timeout=spec.timeout + 60, abort=dead).status
        v.record(self._entry(v, i, spec.guest, command, False, status, started, time.monotonic() - t0))
        if status < 0:  # no exit status: the connection went away; a crash shows up shortly
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not dead():
                time.sleep(0.5)
            v.res.fail(dead() or f"the SSH connection to {spec.guest} was lost during command {i}")
        elif status == 124:
            v.res.fail(f"command {i} on {spec.guest} timed out after {limit} s: {command}")
        elif status != 0:
            v.res.fail(f"command {i} on {spec.guest} exited with status {status}: {command}")

    def _start_background(self, v: Variant, i: int, spec: RunSpec, command: str) -> None:
        inner = f"sh -c {q(command)}; echo $? > cmd-{i}.status"
        start = (f"cd {q(v.workdir)} && (setsid timeout -s INT -k 10 {int(spec.timeout)} sh -c {q(inner)} "
                 f"> cmd-{i}.out 2> cmd-{i}.err < /dev/null & echo $! > cmd-{i}.pid)")
        v.sh(spec.guest, start)
        v.record(self._entry(v, i, spec.guest, command, True, None, now(), 0.0))

    def settle(self, v: Variant) -> None:
        """Background commands get a moment to end by themselves, then SIGINT; their exit statuses."""
        for g in dict.fromkeys(g for g, _ in self.background):
            if not v.sessions.alive(g):
                v.res.fail(v.sessions.dead_guests() or f"guest {g} stopped during the step")
                continue
            try:
                v.sh(g, tr.stop(v.workdir, [f"cmd-{i}" for guest, i in self.background if guest == g],
                                timeout=SETTLE_TIMEOUT), timeout=60)
            except GuestError as exc:
                v.res.fail(v.explain(exc))
        for entry in v.commands:
            if entry["background"] and entry["status"] is None and entry["step"] == v.step.name \
                    and entry["variant"] == v.res.variant:
                entry["status"] = self._status(v, entry["guest"], entry["index"])

    @staticmethod
    def _status(v: Variant, guest: str | None, i: int) -> int | None:
        if guest is None:
            return None
        try:
            out = v.sessions.ssh(guest).run(f"cat {q(v.workdir)}/cmd-{i}.status 2>/dev/null", timeout=30).stdout
            return int(out.decode().strip()) if out.strip() else None
        except (GuestError, ValueError):
            return None
