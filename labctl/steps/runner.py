"""Run a lab's steps on a lab that is up, writing the report bundle.

For every step, matrix row and repeat, one :class:`~labctl.steps.variant.Variant` runs the step's
kinds through their phases (:mod:`.variant`, :mod:`.kinds`) and everything is copied into
``<bundle>/steps/<step>/<variant>/<guest>/``. A failure (a guest dies, SSH drops, a command fails,
Ctrl-C) ends the run with what was collected so far and the reason; the bundle is always written.
A guest that panics or oopses meanwhile leaves its vmcore and drgn's summary of it in
``<bundle>/guests/<guest>/`` (:mod:`labctl.inspect.crashwatch` watches the consoles throughout),
recorded in :attr:`Runner.vmcores`.
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from labctl.backends import Backend, get_backend
from labctl.bundle import CommandRecord, NicRecord, VmcoreRecord, guest_dir, step_dir, vmcore_record
from labctl.errors import LabctlError
from labctl.follow import parallel
from labctl.inspect import CrashWatch
from labctl.lab import Lab, Step, render, render_trace
from labctl.ssh import Session
from labctl.state import LabState
from labctl.steps.hostwatch import Window
from labctl.steps.kinds import guest_order, kinds_of
from labctl.steps.result import StepEvents, StepResult
from labctl.steps.sessions import Sessions
from labctl.steps.variant import GUEST_ROOT, NO_VARIANT, Variant, now

log = logging.getLogger(__name__)
q = shlex.quote

__all__ = ["Runner", "StepEvents", "now"]


class Runner:
    """Runs the steps of ``lab`` on its running guests into ``bundle_dir``.

    ``connect`` opens a guest's SSH session (default: :class:`~labctl.ssh.Session`
    on the state's endpoint) and ``backend`` answers whether a guest's machine
    still runs (default: the state's backend); tests inject their own.
    ``watch_host``: measure each guest's QEMU on the host during every step
    window (:mod:`labctl.steps.hostwatch`); ``host_profile``: and profile it
    with the host's perf. ``crash_watch``: take a vmcore of a guest that crashes (:attr:`vmcores`).
    """

    def __init__(self, lab: Lab, state: LabState, bundle_dir: Path, events: StepEvents | None = None, *,
                 connect: Callable[[str], Session] | None = None, backend: Backend | None = None,
                 watch_host: bool = True, host_profile: bool = True, crash_watch: bool = True) -> None:
        self.lab = lab
        self.state = state
        self.dir = bundle_dir
        self.events = events or StepEvents()
        self.backend = backend or get_backend(state.backend)
        self.sessions = Sessions(state, self.backend, connect)
        self.commands: list[CommandRecord] = []
        self.results: list[StepResult] = []
        self.addresses = {k: v for g in lab.guests.values() for k, v in g.address_keys().items()}
        self.watch_host, self.host_profile = watch_host, host_profile
        self.crashes = CrashWatch(state, lambda g: bundle_dir / guest_dir(g),
                                  {g.name: [n.name for n in g.nics] for g in lab.guests.values()}) \
            if crash_watch else None
        self.vmcores: list[VmcoreRecord] = []

    def run(self) -> list[StepResult]:
        """Run every step and variant in order; after a failure the rest are skipped.

        Ctrl-C is re-raised once the interrupted step's files are collected
        (its result is in ``results``, failed).
        """
        failed = False
        if self.crashes is not None:
            self.crashes.start()
        try:
            for step in self.lab.steps:
                for row in step.variants():
                    for repeat in range(1, step.repeat + 1):
                        label = row.get("label")
                        if failed:
                            self.results.append(StepResult(step.name, label, "skipped", "an earlier step failed",
                                                           repeat=repeat, repeats=step.repeat))
                            continue
                        result = self.run_variant(step, row, repeat)
                        self.results.append(result)
                        # a kind may say its failure left the lab as it was (only selftests failed):
                        # the next variant still runs
                        failed = result.status == "failed" and not result.lab_intact
        finally:
            self.sessions.close()
            self._crashes_end()
        return self.results

    def _crashes_end(self) -> None:
        """The watch's last look; its records, paths relative to the bundle."""
        if self.crashes is None:
            return
        self.vmcores += [vmcore_record(self.dir, rec) for rec in self.crashes.stop()]

    def _variant(self, step: Step, row: dict[str, str], repeat: int) -> Variant | StepResult:
        """The variant to run, or its result when the row's values do not fit the step."""
        label = row.get("label")
        res = StepResult(step.name, label, repeat=repeat, repeats=step.repeat)
        try:  # the row's values, checked again where they are used
            step = dataclasses.replace(step, trace={g: render_trace(t, row, self.addresses)
                                                    for g, t in step.trace.items()})
        except ValueError as exc:
            res.fail(str(exc))
            return res
        rel = step_dir(step.name, label, repeat)
        res.dir = str(rel)
        workdir = f"{GUEST_ROOT}/{step.name}-{label or NO_VARIANT}" + (f"-r{repeat}" if repeat > 1 else "")
        kinds = kinds_of(self.lab, step, row)
        res.nic = self._nic(step, row)
        by_name = {k.name: k.guests() for k in kinds} | {"nic": [res.nic["guest"]] if res.nic else []}
        res.guests = guest_order(by_name)
        res.kinds = [k.name for k in kinds]
        return Variant(lab=self.lab, state=self.state, backend=self.backend, bundle=self.dir, sessions=self.sessions,
                       events=self.events, commands=self.commands, addresses=self.addresses, step=step, row=row,
                       res=res, rel=rel, workdir=workdir, kinds=kinds, involved=res.guests)

    def _nic(self, step: Step, row: dict[str, str]) -> NicRecord | None:
        if step.nic is None:
            return None
        guest, _, name = render(step.nic, row, {}, quote=False).partition(".")
        nic = self.lab.guests[guest].nic(name)
        return {"guest": guest, "name": name, "model": nic.model,
                "driver": self.state.drivers.get(guest, {}).get(name), "modules": list(nic.nic_model.drivers)}

    def run_variant(self, step: Step, row: dict[str, str], repeat: int = 1) -> StepResult:
        """One run of one matrix row (run ``repeat`` of the step's ``repeat``)."""
        v = self._variant(step, row, repeat)
        if isinstance(v, StepResult):
            self.events.step_finished(v)
            return v
        res, label = v.res, row.get("label")
        self.events.step_started(step.name, label if step.repeat == 1 else f"{label or ''} (run {repeat} of "
                                 f"{step.repeat})".lstrip())
        if self.crashes is not None:
            self.crashes.when = f"step {step.name}" + (f" ({label})" if label else "") \
                + (f" run {repeat}" if step.repeat > 1 else "")
            seen = len(self.crashes.records)
        t0 = time.monotonic()
        try:
            self._phases(v)
        except KeyboardInterrupt:
            res.fail("interrupted (Ctrl-C)")
            v.collect()
            res.duration_s = round(time.monotonic() - t0, 2)
            self.results.append(res)
            raise
        except LabctlError as exc:
            res.fail(v.explain(exc))
        broken = self.sessions.dead_guests()
        if broken:
            res.fail(broken)
        if self.crashes is not None:
            self._crashed_meanwhile(res, seen)
        v.collect()
        for k in v.kinds:
            k.collected(v)
        res.duration_s = round(time.monotonic() - t0, 2)
        self.events.step_finished(res)
        return res

    def _crashed_meanwhile(self, res: StepResult, seen: int) -> None:
        """The crashes seen during the variant, captured (the watch may be writing a vmcore), in its warnings."""
        assert self.crashes is not None
        self.crashes.settle()
        for rec in self.crashes.records[seen:]:
            what = "panicked" if rec.get("cause") == "panic" else "oopsed"
            core = f"vmcore {Path(file).relative_to(self.dir).as_posix()}" if (file := rec.get("file")) else rec.get("error")
            res.warnings.append(f"guest {rec['guest']} {what}: {rec.get('title') or 'see its console'}; {core}")

    def _phases(self, v: Variant) -> None:
        """prepare, the guests' directories, begin, the window around run, settle and end (always)."""
        window = Window(self.watch_host, self.host_profile)
        began: list[object] = []
        try:
            try:
                for k in v.kinds:
                    k.prepare(v)
                parallel(v.involved, lambda g: v.sh(g, f"rm -rf {q(v.workdir)} && mkdir -p {q(v.workdir)}"))
                for k in v.kinds:
                    began.append(k)
                    k.begin(v)
                window.open(v)
                for k in v.kinds:
                    k.run(v)
            finally:
                window.close(v)
                for k in v.kinds:
                    if k in began:
                        k.settle(v)
        finally:
            for k in reversed(v.kinds):
                if k in began:
                    k.end(v)
