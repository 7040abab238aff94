"""Run a lab's steps on a lab that is up, writing the report bundle.

For every step (and matrix row): statistics snapshots before, tracers
started, workload commands run (background ones kept running), tracers
stopped and post-processed in the guest, snapshots after, everything copied
into ``<bundle>/steps/<step>/<variant>/<guest>/``. A failure (a guest dies,
SSH drops, a command fails, Ctrl-C) ends the run with what was collected so
far and the reason; the bundle is always written.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import shlex
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl import paths
from labctl.backends import get_backend
from labctl.backends.base import Backend
from labctl.bundle.layout import CONSOLE, HOST_DIR, OOPS_TXT, guest_dir, step_dir
from labctl.debug.crash import console_end, panicked
from labctl.errors import GuestError, LabctlError, UsageError
from labctl.steps.events import StepEvents
from labctl.lab.model import Lab
from labctl.lab.netopts import LinkSpec
from labctl.lab.kselftest import Kselftest
from labctl.lab.steps import RunSpec, Step, TraceSpec, check_location, render, render_trace
from labctl.ssh import Session
from labctl.steps import copyback
from labctl.steps import kselftest as ks
from labctl.steps import tracers as tr
from labctl.steps.hostcost import HostWatch
from labctl.steps.network import StepNetwork, captured_nics, link_guest
from labctl.steps.result import StepResult
from labctl.trace.hostcost import WINDOW_END, WINDOW_START
from labctl.state.runstate import LabState

log = logging.getLogger(__name__)
q = shlex.quote
GUEST_ROOT = "/tmp/labctl"
COPY_TIMEOUT = 600.0  # copying one guest's step directory back (perf.data can be large)
NO_VARIANT = "_"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclass
class GdbRun:
    stop: threading.Event
    thread: threading.Thread | None = None
    transcript: Any = None
    error: str | None = None


class Runner:
    """Runs the steps of ``lab`` on its running guests into ``bundle_dir``.

    ``connect`` opens a guest's SSH session (default: :class:`~labctl.ssh.Session`
    on the state's endpoint) and ``backend`` answers whether a guest's machine
    still runs (default: the state's backend); tests inject their own.
    ``watch_host``: measure each guest's QEMU on the host during every step
    window (:mod:`labctl.steps.hostcost`); ``host_profile``: and profile it
    with the host's perf.
    """

    def __init__(self, lab: Lab, state: LabState, bundle_dir: Path, events: StepEvents | None = None, *,
                 connect: Callable[[str], Session] | None = None, backend: Backend | None = None,
                 watch_host: bool = True, host_profile: bool = True) -> None:
        self.lab = lab
        self.state = state
        self.dir = bundle_dir
        self.events = events or StepEvents()
        self.connect = connect or (lambda guest: Session(state.endpoint(guest)))
        self.sessions: dict[str, Session] = {}
        self.commands: list[dict[str, Any]] = []
        self.results: list[StepResult] = []
        self.backend = backend or get_backend(state.backend)
        self.addresses = {f"{g.name}.{n.name}.ip": str(n.ip.ip)
                          for g in lab.guests.values() for n in g.nics if n.ip is not None}
        self._tools: dict[str, set[str]] = {}
        self.watch_host, self.host_profile = watch_host, host_profile

    # -- sessions ---------------------------------------------------------
    def ssh(self, guest: str) -> Session:
        s = self.sessions.get(guest)
        if s is None:
            s = self.sessions[guest] = self.connect(guest)
        return s

    def sh(self, guest: str, command: str, timeout: float = 120) -> int:
        """Run a labctl-made command on ``guest``; its status."""
        return self.ssh(guest).run(command, timeout=timeout).status

    def close(self) -> None:
        for s in self.sessions.values():
            s.close()
        self.sessions.clear()

    def _alive(self, guest: str) -> bool:
        return self.backend.alive(self.state.guests[guest])

    def _panicked(self, guest: str) -> bool:
        return panicked(console_end(Path(self.state.guests[guest].console)))

    def dead_guests(self) -> str | None:
        """Why the lab is broken (a guest's machine is gone or its kernel panicked), or None."""
        dead = [g for g in self.state.guests if not self._alive(g) or self._panicked(g)]
        if not dead:
            return None
        from labctl.debug.crash import oops_titles

        try:
            titles = oops_titles(Path(self.state.guests[dead[0]].console).read_text(errors="replace"))
        except OSError:
            titles = []
        if titles:
            return f"guest {dead[0]} crashed: {titles[0]}; see {guest_dir(dead[0])}/{OOPS_TXT}"
        return f"guest {', '.join(dead)} stopped (its QEMU exited); see {guest_dir(dead[0])}/{CONSOLE}"

    def tools(self, guest: str) -> set[str]:
        if guest not in self._tools:
            res = self.ssh(guest).run("for t in perf trace-cmd mpstat ethtool nstat ss netstat timeout; do "
                                      "command -v $t >/dev/null 2>&1 && echo $t; done", timeout=60)
            self._tools[guest] = set(res.stdout.decode().split())
        return self._tools[guest]

    # -- the run ------------------------------------------------------------
    def run(self) -> list[StepResult]:
        """Run every step and variant in order; after a failure the rest are skipped.

        Ctrl-C is re-raised once the interrupted step's files are collected
        (its result is in ``results``, failed).
        """
        failed = False
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
                        # selftests that failed leave the lab as it was: the next variant still runs
                        failed = result.status == "failed" and not (result.kselftest or {}).get("only_tests_failed")
        finally:
            self.close()
        return self.results

    def run_variant(self, step: Step, row: dict[str, str], repeat: int = 1) -> StepResult:
        """One run of one matrix row (run ``repeat`` of the step's ``repeat``)."""
        label = row.get("label")
        res = StepResult(step.name, label, repeat=repeat, repeats=step.repeat)
        try:  # the row's values, checked again where they are used
            step = dataclasses.replace(step, trace={g: render_trace(t, row, self.addresses)
                                                    for g, t in step.trace.items()})
        except ValueError as exc:
            res.fail(str(exc))
            self.events.step_finished(res)
            return res
        rel = step_dir(step.name, label, repeat)
        res.dir = str(rel)
        self.events.step_started(step.name, label if step.repeat == 1 else f"{label or ''} (run {repeat} of "
                                 f"{step.repeat})".lstrip())
        t0 = time.monotonic()
        nic_guest = self._nic(step, row, res)
        gdb_guest = [step.gdb.guest] if step.gdb else []
        ks_guest = [render(step.kselftest.guest, row, {}, quote=False)] if step.kselftest else []
        involved = list(dict.fromkeys([*(link_guest(r, row) if isinstance(r, LinkSpec) else r.guest
                                         for r in step.run), *ks_guest, *step.trace,
                                       *([nic_guest] if nic_guest else []), *gdb_guest,
                                       *(g for g, _ in captured_nics(self.lab, step))]))
        res.guests = involved
        workdir = f"{GUEST_ROOT}/{step.name}-{label or NO_VARIANT}" + (f"-r{repeat}" if repeat > 1 else "")
        bg: list[tuple[str, str]] = []
        gdb = None
        watch: HostWatch | None = None
        net = StepNetwork(self.lab, self.state, self.backend, self.dir, self.ssh)
        ks_build = None
        try:
            try:
                if step.kselftest is not None:
                    ks_build = self._kselftest_build(step.kselftest, ks_guest[0], res)
                net.begin(step, row, rel, res)
                self._prepare(involved, workdir, step, res)
                gdb = self._start_gdb(step, row, rel, res)
                watch = self._window_start(involved, workdir, rel)
                self._run_commands(step, row, workdir, res, bg, net)
                if step.kselftest is not None and ks_build is not None:
                    self._kselftest_run(step.kselftest, ks_guest[0], ks_build, workdir, res)
            finally:
                self._window_end(watch, involved, workdir, res)
                self._join_gdb(gdb, res)
                try:
                    self._finish(step, involved, workdir, res, bg, nic_guest)
                finally:
                    net.end(res)
        except KeyboardInterrupt:
            res.fail("interrupted (Ctrl-C)")
            self._collect(involved, workdir, rel, res)
            res.duration_s = round(time.monotonic() - t0, 2)
            self.results.append(res)
            raise
        except LabctlError as exc:
            res.fail(self._explain(exc, involved))
        broken = self.dead_guests()
        if broken:
            res.fail(broken)
        self._collect(involved, workdir, rel, res)
        if step.kselftest is not None and ks_build is not None:
            self._kselftest_results(step.kselftest, ks_guest[0], rel, res)
        res.duration_s = round(time.monotonic() - t0, 2)
        self.events.step_finished(res)
        return res

    # -- the kernel's selftests (labctl.steps.kselftest) -----------------------------------------------
    def _kselftest_build(self, spec: Kselftest, guest: str, res: StepResult) -> ks.Build:
        """The selftests built (or found in the cache) and copied into ``guest`` (once per build)."""
        from labctl.steps import transfer

        b = ks.build(spec, self.events.step_progress)
        res.kselftest = {"guest": guest, "tree": str(spec.tree), "target": spec.target, "build": b.to_dict(),
                         "tests": [], "counts": {}}
        where = ks.guest_dir(b)
        if self.sh(guest, f"test -f {q(where)}/.complete") != 0:
            self.events.step_progress(f"copying the selftests into {guest}")
            self.sh(guest, f"rm -rf {q(where)} && mkdir -p {q(GUEST_ROOT)}")
            transfer.to_guest(self.ssh(guest), str(b.install), where)
            self.sh(guest, f"touch {q(where)}/.complete")
        return b

    def _kselftest_run(self, spec: Kselftest, guest: str, b: ks.Build, workdir: str, res: StepResult) -> None:
        command = ks.run_command(spec, b, workdir)
        count = len(spec.tests or b.tests)
        self.events.step_progress(f"running {count} {spec.target} selftests on {guest}")
        started, t0 = now(), time.monotonic()
        status = self.ssh(guest).run(command, timeout=ks.run_timeout(spec, b), abort=self.dead_guests).status
        self.commands.append({"guest": guest, "step": res.name, "variant": res.variant, "index": len(self.commands),
                              "command": f"run_kselftest.sh ({count} tests of {spec.target})", "background": False,
                              "status": status, "duration_s": round(time.monotonic() - t0, 3), "started_at": started})
        if status < 0:
            res.fail(self.dead_guests() or f"the SSH connection to {guest} was lost during the selftests")

    def _kselftest_results(self, spec: Kselftest, guest: str, rel: Path, res: StepResult) -> None:
        record = ks.results(self.dir / rel / guest, f"{rel.as_posix()}/{guest}", spec.target)
        lab_ok = res.status != "failed"
        why = ks.verdict(record)
        record["only_tests_failed"] = bool(lab_ok and why and not record.get("error") and not record.get("missing"))
        res.kselftest = {**(res.kselftest or {}), **record}
        if why:
            res.fail(why)

    def _window_start(self, guests: list[str], workdir: str, rel: Path) -> HostWatch:
        """The step's window opens: each guest's /proc/stat, then its QEMU on the host (labctl.steps.hostcost)."""
        for g in guests:
            self.sh(g, f"cat /proc/stat > {q(workdir)}/{WINDOW_START}")
        watch = HostWatch(self.state, self.backend, guests if self.watch_host else [], self.dir / rel / HOST_DIR,
                          profile=self.host_profile)
        watch.start()
        return watch

    def _window_end(self, watch: HostWatch | None, guests: list[str], workdir: str, res: StepResult) -> None:
        """The window closes (best effort: a guest that died keeps what was read at the start)."""
        if watch is None:
            return
        res.window_s = watch.stop()
        for g in guests:
            try:
                if self._alive(g):
                    self.sh(g, f"cat /proc/stat > {q(workdir)}/{WINDOW_END}")
            except GuestError as exc:
                res.warnings.append(f"{g}: /proc/stat not read at the end of the step: {exc.message}")

    def _explain(self, exc: LabctlError, guests: list[str]) -> str:
        return self.dead_guests() or exc.message

    def _nic(self, step: Step, row: dict[str, str], res: StepResult) -> str | None:
        if step.nic is None:
            return None
        guest, _, name = render(step.nic, row, {}, quote=False).partition(".")
        nic = self.lab.guests[guest].nic(name)
        res.nic = {"guest": guest, "name": name, "model": nic.model,
                   "driver": self.state.drivers.get(guest, {}).get(name),
                   "modules": list(nic.nic_model.drivers)}
        return guest

    def _prepare(self, guests: list[str], workdir: str, step: Step, res: StepResult) -> None:
        from labctl.trace.stats import snapshot_commands

        started: list[tuple[str, tr.Tracer]] = []
        for g in guests:
            self.sh(g, f"rm -rf {q(workdir)} && mkdir -p {q(workdir)}")
            spec = step.trace.get(g, TraceSpec())
            if spec.stats:
                nics = [n.name for n in self.lab.guests[g].nics]
                self.sh(g, tr.snapshot(workdir, "before", snapshot_commands(nics)), timeout=120)
            if g not in step.trace:
                continue
            have = self.tools(g)
            if spec.kprobes and "perf" in have:
                cmd = tr.add_kprobes(spec)
                if cmd and self.sh(g, f"cd {q(workdir)} && ({cmd}) > kprobes.log 2>&1") != 0:
                    res.warnings.append(f"{g}: some kprobes could not be added (see kprobes.log)")
            skip = set() if spec.skb_latency is None else self._skb_probes(g, workdir, res)
            for t in tr.tracers(spec):
                if t.tool not in have:
                    res.warnings.append(f"{g}: {t.tool} is not installed in the guest; {t.name} skipped")
                    continue
                if t.name not in skip:
                    self.sh(g, tr.start(workdir, t))
                    started.append((g, t))
        # The workload starts only once every tracer records (they start up in parallel).
        for g, t in started:
            wait = tr.ready(workdir, t)
            if wait and self.sh(g, wait, timeout=tr.READY_TIMEOUT + 30) != 0:
                res.warnings.append(f"{g}: {t.name} did not start recording within {tr.READY_TIMEOUT} s "
                                    f"(see {t.name}.log); the step ran without it")
        time.sleep(1.0)  # mpstat's first interval, and tracers that give no signal

    def _skb_probes(self, guest: str, workdir: str, res: StepResult) -> set[str]:
        """Define the skb_latency kprobes in ``guest``; the tracers to skip when that fails."""
        from labctl.errors import TraceError
        from labctl.steps import skbprobes

        try:
            offsets = skbprobes.kernel_offsets(self.state.kernel(guest), self._cache_dir(guest))
        except (TraceError, LabctlError) as exc:
            res.warnings.append(f"{guest}: skb_latency skipped: {exc.message}")
            return {"skb-latency"}
        cmd = skbprobes.add_command(offsets)
        if self.sh(guest, f"cd {q(workdir)} && ({cmd}) > skb-kprobes.log 2>&1") != 0:
            res.warnings.append(f"{guest}: skb_latency skipped: the kernel refused its kprobes "
                                "(see skb-kprobes.log)")
            return {"skb-latency"}
        return set()

    def _cache_dir(self, guest: str) -> Path | None:
        """Where kernel facts go when the kernel's directory is read-only (one per kernel)."""
        try:
            d = paths.cache_dir() / "struct-offsets" / self.state.kernel(guest).key
            d.mkdir(parents=True, exist_ok=True)
            return d
        except OSError:
            return None

    def _start_gdb(self, step: Step, row: dict[str, str], rel: Path, res: StepResult) -> GdbRun | None:
        """Start the step's scripted gdb session in a thread; it runs while the commands do."""
        if step.gdb is None:
            return None
        from labctl.debug.gdb import GdbSpec, gdb_target, guest_module_commands

        g = step.gdb
        target = gdb_target(self.state, g.guest)
        out = self.dir / rel / g.guest
        out.mkdir(parents=True, exist_ok=True)
        try:
            location = check_location(render(g.location, row, self.addresses, quote=False))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        mods = guest_module_commands(self.state, g.guest, target.debug_modules)
        spec = GdbSpec(location, g.hits, g.step,
                       g.step_mode, g.registers, True, g.backtrace, g.timeout)  # type: ignore[arg-type]
        run = GdbRun(threading.Event())

        def go() -> None:
            from labctl.debug.gdb import run_breakpoint_session

            try:
                run.transcript = run_breakpoint_session(target.stub, target.vmlinux, mods, spec, out, run.stop,
                                                        monitor=target.monitor)
            except LabctlError as exc:
                run.error = exc.message
            except Exception as exc:  # noqa: BLE001 - reported on the step, never lost
                run.error = f"gdb session failed: {exc}"

        run.thread = threading.Thread(target=go, name="gdb", daemon=True)
        run.thread.start()
        return run

    def _join_gdb(self, run: GdbRun | None, res: StepResult) -> None:
        if run is None or run.thread is None:
            return
        if res.status == "failed":
            run.stop.set()
        run.thread.join(timeout=600)
        if run.thread.is_alive():
            run.stop.set()
            run.thread.join(timeout=60)
        t = run.transcript
        if run.error:
            res.fail(run.error)
        elif t is not None:
            if t.timed_out:
                res.warnings.append(t.message or "the gdb breakpoint was never hit")
            res.gdb = {"breakpoint": t.breakpoint, "hits": t.hits, "timed_out": t.timed_out,
                       "message": t.message, "transcript": "gdb-transcript.txt"}

    def _run_commands(self, step: Step, row: dict[str, str], workdir: str, res: StepResult,
                      bg: list[tuple[str, str]], net: StepNetwork) -> None:
        wrapped: set[str] = set()
        for i, spec in enumerate(step.run):
            if isinstance(spec, LinkSpec):
                self._link(i, spec, row, step, res, net)
                continue
            command = render(spec.command, row, self.addresses, quote=True)
            trace = step.trace.get(spec.guest)
            if (not spec.background and trace and trace.perf_record and trace.perf_record.target == "command"
                    and spec.guest not in wrapped and "perf" in self.tools(spec.guest)):
                command = shlex.join(tr.perf_record_argv(trace, system=False)) + " -- sh -c " + q(command)
                wrapped.add(spec.guest)
            if spec.background:
                self._start_background(i, spec, command, workdir, step, res)
                bg.append((spec.guest, f"cmd-{i}"))
                time.sleep(spec.ready_after)
            else:
                self._run_foreground(i, spec, command, workdir, step, res)

    def _record(self, i: int, spec: RunSpec | LinkSpec, command: str, step: Step, res: StepResult,
                status: int | None, started: str, duration: float, guest: str | None = None) -> None:
        entry = {"guest": guest or getattr(spec, "guest", None), "step": step.name, "variant": res.variant,
                 "index": i, "command": command, "background": getattr(spec, "background", False),
                 "status": status, "duration_s": round(duration, 3), "started_at": started}
        self.commands.append(entry)

    def _link(self, i: int, spec: LinkSpec, row: dict[str, str], step: Step, res: StepResult,
              net: StepNetwork) -> None:
        """A step's link entry: QMP set_link on the host, recorded as a command of the run."""
        started, t0 = now(), time.monotonic()
        guest = link_guest(spec, row)
        try:
            command = net.link(spec, row, res)
        except LabctlError:
            self._record(i, spec, f"link {render(spec.nic, row, {}, quote=False)}", step, res, 1, started,
                         time.monotonic() - t0, guest)
            raise
        self._record(i, spec, command, step, res, 0, started, time.monotonic() - t0, guest)

    def _run_foreground(self, i: int, spec: RunSpec, command: str, workdir: str, step: Step,
                        res: StepResult) -> None:
        started, t0 = now(), time.monotonic()
        limit = int(spec.timeout)
        wrapped = f"cd {q(workdir)} && timeout -s INT -k 10 {limit} sh -c {q(command)} > cmd-{i}.out 2> cmd-{i}.err"
        status = self.ssh(spec.guest).run(wrapped, timeout=spec.timeout + 60, abort=self.dead_guests).status
        self._record(i, spec, command, step, res, status, started, time.monotonic() - t0)
        if status < 0:  # no exit status: the connection went away; a crash shows up shortly
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not self.dead_guests():
                time.sleep(0.5)
            res.fail(self.dead_guests() or f"the SSH connection to {spec.guest} was lost during command {i}")
        elif status == 124:
            res.fail(f"command {i} on {spec.guest} timed out after {limit} s: {command}")
        elif status != 0:
            res.fail(f"command {i} on {spec.guest} exited with status {status}: {command}")

    def _start_background(self, i: int, spec: RunSpec, command: str, workdir: str, step: Step,
                          res: StepResult) -> None:
        inner = f"sh -c {q(command)}; echo $? > cmd-{i}.status"
        start = (f"cd {q(workdir)} && (setsid timeout -s INT -k 10 {int(spec.timeout)} sh -c {q(inner)} "
                 f"> cmd-{i}.out 2> cmd-{i}.err < /dev/null & echo $! > cmd-{i}.pid)")
        self.sh(spec.guest, start)
        self._record(i, spec, command, step, res, None, now(), 0.0)

    def _finish(self, step: Step, guests: list[str], workdir: str, res: StepResult,
                bg: list[tuple[str, str]], nic_guest: str | None) -> None:
        """Stop background commands and tracers, post-process, snapshot after; best effort."""
        from labctl.trace.stats import snapshot_commands

        for g in guests:
            if not self._alive(g):
                res.fail(self.dead_guests() or f"guest {g} stopped during the step")
                continue
            try:
                mine = [name for guest, name in bg if guest == g]
                if mine:  # give background workloads a moment to end by themselves
                    self.sh(g, tr.stop(workdir, mine, timeout=10), timeout=60)
                spec = step.trace.get(g)
                if spec is not None:
                    self.sh(g, tr.stop(workdir, [t.name for t in tr.tracers(spec)]), timeout=200)
                    self.sh(g, tr.postprocess(workdir, spec), timeout=600)
                    cmd = tr.remove_kprobes(spec)
                    if cmd:
                        self.sh(g, cmd)
                if (spec or TraceSpec()).stats:
                    nics = [n.name for n in self.lab.guests[g].nics]
                    self.sh(g, tr.snapshot(workdir, "after", snapshot_commands(nics)), timeout=120)
            except GuestError as exc:
                res.fail(self._explain(exc, [g]))
        for entry in self.commands:  # background exit statuses
            if entry["background"] and entry["status"] is None and entry["step"] == step.name \
                    and entry["variant"] == res.variant:
                entry["status"] = self._bg_status(entry["guest"], workdir, entry["index"])

    def _bg_status(self, guest: str, workdir: str, i: int) -> int | None:
        try:
            out = self.ssh(guest).run(f"cat {q(workdir)}/cmd-{i}.status 2>/dev/null", timeout=30).stdout
            return int(out.decode().strip()) if out.strip() else None
        except (GuestError, ValueError):
            return None

    def _collect(self, guests: list[str], workdir: str, rel: Path, res: StepResult) -> None:
        """Copy the step's guest directory of every reachable guest into the bundle.

        The guest sends a tar stream; :mod:`labctl.steps.copyback` keeps every file
        inside the bundle (no links followed, no names outside, a byte budget and a cap on entries).
        """
        for g in guests:
            dest = self.dir / rel / g
            dest.mkdir(parents=True, exist_ok=True)
            if not self._alive(g):
                continue
            try:
                with self.ssh(g).stream(f"cd {q(workdir)} && tar -cf - .", timeout=COPY_TIMEOUT) as f:
                    got = copyback.extract(f, dest, max_entries=copyback.DEFAULT_ENTRIES)
            except (GuestError, OSError, EOFError, tarfile.TarError) as exc:
                message = exc.message if isinstance(exc, GuestError) else str(exc)
                res.warnings.append(f"{g}: could not copy the step's files: {message}")
                res.fail(self._explain(GuestError(message), [g]))
                continue
            for why in got.skipped:
                res.warnings.append(f"{g}: not copied: {why}")
