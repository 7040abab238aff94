"""A step's ``trace:`` kinds, guest by guest: statistics snapshots around the step (:class:`StatsKind`)
and the tracers that record during it (:class:`TracingKind`).

The tracers' commands are :mod:`.tracers`' (each tracer kind a registered object); here they are
started in every traced guest, the workload waits until each records, and once the step settled
they are stopped and their binary output turned into text in the guest (symbols resolve there).
A tracer whose tool the guest lacks is skipped with a warning, never a failure.
"""

from __future__ import annotations

import dataclasses
import shlex
import time

import labctl.steps.skbprobes as skbprobes  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.steps.tracers as tr
from labctl.errors import GuestError, LabctlError, TraceError
from labctl.follow import parallel
from labctl.lab import Lab, Step, TraceSpec
from labctl.steps.variant import StepKind, Variant
from labctl.textsafe import safe_line
from labctl.trace import snapshot_commands

q = shlex.quote
SETTLE = 1.0  # s after the tracers record when one gives no signal that it does (mpstat's first interval)


class StatsKind(StepKind):
    """Statistics snapshots (``stats/before``, ``stats/after``) of every guest the step involves, unless
    its trace says ``stats: false``."""

    name = "stats"

    def __init__(self, lab: Lab, step: Step) -> None:
        self.lab, self.step = lab, step
        self.taken: list[str] = []

    @classmethod
    def of(cls, lab: Lab, step: Step) -> StatsKind:
        return cls(lab, step)

    def _snapshot(self, v: Variant, guest: str, phase: str) -> None:
        nics = [n.name for n in self.lab.guests[guest].nics]
        v.sh(guest, tr.snapshot(v.workdir, phase, snapshot_commands(nics, phase)), timeout=120)

    def begin(self, v: Variant) -> None:
        """The guests' snapshots at once (each guest is its own machine: their round trips overlap)."""
        self.taken = [g for g in v.involved if self.step.trace.get(g, TraceSpec()).stats]
        parallel(self.taken, lambda g: self._snapshot(v, g, "before"))

    def end(self, v: Variant) -> None:
        def one(g: str) -> None:
            if not v.sessions.alive(g):
                v.res.fail(v.sessions.dead_guests() or f"guest {g} stopped during the step")
                return
            try:
                self._snapshot(v, g, "after")
            except GuestError as exc:
                v.res.fail(v.explain(exc))

        parallel(self.taken, one)


def _not_recording(v: Variant, guest: str, t: tr.Tracer) -> str:
    """The warning for a tracer that never said it records: it exited (its own first error line, as
    the guest wrote it, made safe to print: a bpftrace program the guest's kernel types otherwise
    fails to compile) or it took longer than :data:`~labctl.steps.tracers.READY_TIMEOUT`."""
    pid, log = q(t.name + ".pid"), q(t.name + ".log")
    probe = (f"cd {q(v.workdir)} && if kill -0 \"$(cat {pid})\" 2>/dev/null; then echo running; "
             f"else grep -m1 -i 'error' {log} || tail -n1 {log}; fi")
    try:
        said = v.sessions.ssh(guest).run(probe, timeout=30).stdout.decode(errors="replace").strip()
    except LabctlError:
        said = ""
    if said == "running" or not said:
        return (f"{guest}: {t.name} did not start recording within {tr.READY_TIMEOUT} s "
                f"(see {t.name}.log); the step ran without it")
    return f"{guest}: {t.name} exited before it recorded: {safe_line(said[:400])} (see {t.name}.log); the step ran without it"


class TracingKind(StepKind):
    """The tracers of every guest the step traces (see the module docstring)."""

    name = "trace"

    def __init__(self, step: Step) -> None:
        self.specs = step.trace
        self.started: list[tuple[str, tr.Tracer]] = []

    @classmethod
    def of(cls, step: Step) -> TracingKind | None:
        return cls(step) if step.trace else None

    def guests(self) -> list[str]:
        return list(self.specs)

    def begin(self, v: Variant) -> None:
        for g, spec in self.specs.items():
            self._start(v, g, spec)
        # The workload starts only once every tracer records (they start up in parallel).
        for g, t in self.started:
            wait = tr.ready(v.workdir, t)
            if wait and v.sh(g, wait, timeout=tr.READY_TIMEOUT + 30) != 0:
                v.res.warnings.append(_not_recording(v, g, t))
        if any(not t.signal for _, t in self.started):  # the others said they record: no wait for them
            time.sleep(SETTLE)

    def _start(self, v: Variant, g: str, spec: TraceSpec) -> None:
        have = v.sessions.tools(g)
        if spec.kprobes and "perf" in have:
            cmd = tr.add_kprobes(spec)
            if cmd and v.sh(g, f"cd {q(v.workdir)} && ({cmd}) > kprobes.log 2>&1") != 0:
                v.res.warnings.append(f"{g}: some kprobes could not be added (see kprobes.log)")
        skip = set() if spec.skb_latency is None else self._skb_probes(v, g)
        release = v.kernel_release(g)
        for t in tr.tracers(spec):
            if t.tool not in have:
                v.res.warnings.append(f"{g}: {t.tool} is not installed in the guest; {t.name} skipped")
                continue
            if t.name not in skip:
                v.sh(g, tr.start(v.workdir, dataclasses.replace(t, argv=tr.with_build_ids(t.argv, release))))
                self.started.append((g, t))

    @staticmethod
    def _skb_probes(v: Variant, guest: str) -> set[str]:
        """Define the skb_latency kprobes in ``guest``; the tracers to skip when that fails."""
        try:
            offsets = skbprobes.kernel_offsets(v.state.kernel(guest), v.sessions.cache_dir(guest))
        except (TraceError, LabctlError) as exc:
            v.res.warnings.append(f"{guest}: skb_latency skipped: {exc.message}")
            return {"skb-latency"}
        cmd = skbprobes.add_command(offsets)
        if v.sh(guest, f"cd {q(v.workdir)} && ({cmd}) > skb-kprobes.log 2>&1") != 0:
            v.res.warnings.append(f"{guest}: skb_latency skipped: the kernel refused its kprobes "
                                  "(see skb-kprobes.log)")
            return {"skb-latency"}
        return set()

    def end(self, v: Variant) -> None:
        """Stop the tracers, post-process their files, remove the probes: one command per guest, the
        guests at once; best effort per guest."""
        def one(g: str) -> None:
            spec = self.specs[g]
            if not v.sessions.alive(g):
                v.res.fail(v.sessions.dead_guests() or f"guest {g} stopped during the step")
                return
            tracers = tr.tracers(spec)
            flush = tuple(t.name for t in tracers if t.tool == "trace-cmd")
            cmds = [tr.stop(v.workdir, [t.name for t in tracers], flush=flush), tr.postprocess(v.workdir, spec),
                    tr.remove_kprobes(spec)]
            try:
                v.sh(g, "; ".join(f"{{ {c}; }}" for c in cmds if c), timeout=800)
            except GuestError as exc:
                v.res.fail(v.explain(exc))

        parallel(list(self.specs), one)
