"""Waiting for the guests of one ``up``, side by side: each one's READY line on its console, then SSH
with the lab's key and its pinned host key; on the way, a booted guest's post-boot snapshot or saved
state, its keys handed over when it booted with throwaway ones (:mod:`.warm`), a restored guest
made this lab's. Ctrl-C, SIGTERM or one guest's failure stop every wait at once."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import labctl.up.agent as agent  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.guestconf as guestconf  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.nftload as nftload  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.snapshots as snapshots  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.tunsetup as tunsetup  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.warm as warm  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.xdpload as xdpload  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import POSTBOOT, Backend, GuestRecord
from labctl.debug import console_end, crashed
from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabctlError, LabFileError, MachineError
from labctl.events import UpEvents
from labctl.lab import Lab
from labctl.state import LabState
from labctl.up.banner import wait_banner
from labctl.up.console import FAILED, READY, console_tail, ready_drivers
from labctl.up.options import UpOptions
from labctl.up.planner import GuestPlanner

if TYPE_CHECKING:
    from labctl.ssh import Session

#: seconds a booted guest's agent has to answer its clock line before the clock goes over SSH (the agent
#: starts beside sshd: it answers at once, unless the kernel has no virtio_console)
AGENT_CLOCK_WAIT = 1.0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def ssh_retry(ep: Endpoint, deadline: float, stop: threading.Event) -> Session:
    """A session to ``ep``, tried until ``deadline`` (or ``stop``).

    :raise GuestError: when the guest does not answer in time.
    """
    from labctl.ssh import Session  # paramiko: a cold boot's wait (a warm guest's answers through its agent)

    while True:
        try:
            return Session(ep, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        except GuestError:
            if time.monotonic() > deadline or stop.is_set():
                raise
            time.sleep(0.2)


class GuestWaiter:
    """Waits for the started guests of one ``up`` (see the module docstring)."""

    def __init__(self, lab: Lab, opts: UpOptions, backend: Backend, events: UpEvents, planner: GuestPlanner,
                 records: dict[str, GuestRecord], warn: Callable[[str], None]) -> None:
        self.lab, self.opts, self.backend, self.events = lab, opts, backend, events
        self.planner, self.records, self.warn = planner, records, warn
        self.stop = threading.Event()
        #: restored guests whose kept connection (labctl.mux) starts as soon as sshd has their key:
        #: ``up`` has nothing more to do in them over SSH (no share, wireguard key or impairment)
        self.prewarm_early: set[str] = set()

    def wait_all(self, state: LabState) -> None:
        """Wait for every guest in parallel; the first failure is raised once the others stopped."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.records))
        try:
            futures = {pool.submit(self._wait_guest, state, name): name for name in self.records}
            errors: list[LabctlError] = []
            for fut in concurrent.futures.as_completed(futures):
                try:
                    fut.result()
                except LabctlError as exc:
                    errors.append(exc)
                    self.stop.set()  # one failure fails the up: no need to wait for the others
            if errors:
                raise errors[0]
        finally:
            self.stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def _ready_line(self, state: LabState, name: str, deadline: float) -> bytes | None:
        """The console's text once the guest's whole READY line is there (None: stopped meanwhile).

        :raise GuestError: when the guest fails to boot or is not ready in time.
        :raise MachineError: when its machine dies.
        """
        rec = self.records[name]
        console = Path(rec.console)
        while True:
            if self.stop.is_set():
                return None
            data = console.read_bytes() if console.exists() else b""
            if FAILED in data:
                self._config_failed(name, console)
            if READY in data and b"\n" in data[data.index(READY):]:
                return data  # the whole READY line is there
            if crashed(data):
                self.events.guest_phase(name, "failed")
                time.sleep(0.5)  # let the rest of the oops reach the log
                raise GuestError(f"guest {name} failed to boot:\n{console_tail(console)}" + self._crash_kept(state, name))
            if not self.backend.alive(rec):
                self.events.guest_phase(name, "failed")
                raise MachineError(f"QEMU of guest {name} died while booting "
                                   f"({self.backend.exit_reason(rec)}); last console lines:\n"
                                   f"{console_tail(console)}")
            if time.monotonic() > deadline:
                self.events.guest_phase(name, "failed")
                raise GuestError(f"guest {name} was not ready after {self.opts.boot_timeout:.0f} s; "
                                 f"last console lines:\n{console_tail(console)}",
                                 hint="raise --boot-timeout, or check the image with 'labctl image list'")
            time.sleep(0.05)

    def _crashed(self, name: str) -> str | None:
        """Why the guest's kernel crashed (its console's first crash line), or None."""
        tail = console_end(Path(self.records[name].console))
        return f"guest {name} crashed while coming up" if crashed(tail) else None

    def _crash_kept(self, state: LabState, name: str) -> str:
        """A crashed guest told to ``on_boot_crash`` (its vmcore taken) before up stops it: the line
        that ends the error, '' when there is nobody to tell or no crash on its console."""
        if self.opts.on_boot_crash is None or self._crashed(name) is None:
            return ""
        told = self.opts.on_boot_crash(state, name)
        return f"\n{told}" if told else ""

    def _setup(self, state: LabState, name: str, ep: Endpoint) -> None:
        """The guest's firewall (checked by nft -c, then loaded), then its setup commands; a crash
        meanwhile ends the wait at once (its vmcore kept)."""
        try:
            tunsetup.configure(ep, tunsetup.GuestNet.of(self.lab.guests[name]), self.lab.source)  # before nft: rules name them
            nftload.load(ep, self.lab.guests[name].firewall, self.lab.source)
            xdpload.attach(ep, self.lab.guests[name].nics, self.lab.source)
            warm.run_setup(ep, self.lab.guests[name].setup, abort=lambda: self._crashed(name))
        except GuestError as exc:
            if self._crashed(name) is None:
                raise
            time.sleep(0.5)  # let the rest of the oops reach the log
            raise GuestError(f"guest {name} crashed during its setup:\n"
                             f"{console_tail(Path(self.records[name].console))}"
                             + self._crash_kept(state, name)) from exc

    def _config_failed(self, name: str, console: Path) -> None:
        """The guest's init said something failed: once it is done saying so (its READY line, or a
        few seconds), the lab file's settings that failed (exit 2), or why the boot failed.

        :raise LabFileError: naming each failed setting's line. :raise GuestError: otherwise.
        """
        self.events.guest_phase(name, "failed")
        for _ in range(50):
            data = console.read_bytes()
            if READY in data or crashed(data) or self.stop.is_set():
                break
            time.sleep(0.1)
        problems = guestconf.config_failures(console.read_bytes(), self.lab.guests[name], self.lab.source)
        if problems:
            raise LabFileError(problems)
        raise GuestError(f"guest {name} failed to boot:\n{console_tail(console)}")

    def _wait_guest(self, state: LabState, name: str) -> None:
        rec = self.records[name]
        t0 = time.monotonic()
        deadline = t0 + self.opts.boot_timeout
        if name in self.planner.warm:
            self._resume(state, name, t0, deadline)
            return
        if rec.extra.get("started_from"):
            self._resume_shared(state, name, t0, deadline)
            return
        data = self._ready_line(state, name, deadline)
        if data is None:
            return
        self.events.guest_phase(name, "ssh")
        state.drivers[name] = ready_drivers(data)
        state.offloads[name] = guestconf.offloads(data)
        gdir = Path(rec.dir)
        throwaway = name in self.planner.throwaway
        agent_here = self.backend.guest_agent
        # A guest booted with the throwaway key answers with it (pinned in boot_known_hosts)
        # until the snapshot is taken and it has its own.
        ep = warm.boot_endpoint(state.endpoint(name), gdir) if throwaway else state.endpoint(name)
        g = self.lab.guests[name]
        setup = g.setup or g.firewall or g.tunnels or g.vrfs or any(n.xdp or n.tc for n in g.nics)
        # A guest whose boot becomes the snapshot and that has no setup commands (or firewall) is snapshotted
        # at once: its one SSH handshake is the one with its own key (this saves one under TCG).
        # A guest without the agent is saved once SSH answers.
        if not throwaway or setup or not agent_here:
            with ssh_retry(ep, deadline, self.stop):
                pass  # the guest answers SSH with the lab's key and pinned host key
            state.ready_seconds[name] = round(time.monotonic() - t0, 2)
            if not throwaway and not g.record and not (self.opts.saved_states and self.backend.states_on_hosts):
                self._set_clock(gdir, ep, agent_here)  # (else it is set once its state is saved, or with its keys)
            self._setup(state, name, ep)
        if self.opts.saved_states and self.backend.states_on_hosts:
            if throwaway:  # a shared state: its restores' sshd takes its key without starting again
                why = warm.start_standby(ep)
                if why:
                    self.warn(why)
            self._save_state(state, name)
        snapped = False
        snaps = self.planner.snaps
        if name in snaps and snapshots.find(snaps[name]) is None:
            got = warm.snapshot_after_boot(Path(rec.qmp), gdir / "disk.qcow2", agent.channel_of(gdir), snaps[name],
                                           name, state.drivers[name], self.lab.name, self.backend.emulator_version())
            if isinstance(got, str):
                self.warn(got)
            snapped = True
        if throwaway:
            # The snapshot (if one was taken) holds the throwaway key only: now the guest's own.
            # The agent answered (or not) a moment ago when a snapshot was tried.
            agent_wait = 0.0 if not agent_here else 2.0 if snapped else warm.AGENT_WAIT
            warm.hand_over_keys(gdir, ep, agent_wait=agent_wait)
            with ssh_retry(state.endpoint(name), deadline, self.stop):
                pass  # now with its own pinned host key
            state.ready_seconds.setdefault(name, round(time.monotonic() - t0, 2))
        self.events.guest_phase(name, "ready")

    @staticmethod
    def _set_clock(gdir: Path, ep: Endpoint, agent_here: bool) -> None:
        """A booted guest's wall clock set to the host's: QEMU starts the RTC at the host's whole
        second and the kernel reads it to the whole second, so a boot's clock was 0 to 2 s behind
        (1.4 s measured). Through the agent if it answers at once, else over SSH."""
        if agent_here:
            try:
                agent.set_clock(agent.channel_of(gdir), timeout=AGENT_CLOCK_WAIT)
                return
            except GuestError:
                pass  # no agent (yet): over SSH
        warm.set_clock_over_ssh(ep)

    def _save_state(self, state: LabState, name: str) -> None:
        """The guest's post-boot state, saved on its host for ``reset`` (a failure only warns)."""
        self.events.guest_phase(name, "saving")
        try:
            self.records[name] = self.backend.save_state(self.records[name], POSTBOOT)
        except LabctlError as exc:
            self.warn(f"guest {name}: its post-boot state was not saved ({exc.message}); reset will need "
                      "the lab brought up again")
            return
        if name in self.planner.throwaway:  # saved with throwaway keys: shared with the next instances
            self.records[name].extra["throwaway_state"] = POSTBOOT  # (its clock is set with its keys)
        else:  # restored at once, with the clock it was saved with
            warm.set_clock_over_ssh(state.endpoint(name))

    def _resume_shared(self, state: LabState, name: str, t0: float, deadline: float) -> None:
        """A guest started from a class's shared post-boot state: its own keys and the clock."""
        rec = self.records[name]
        self.events.guest_phase(name, "ssh")
        template = self.opts.templates[(name, str(rec.extra.get("host") or "local"))]
        state.drivers[name] = dict(template.drivers)
        warm.hand_over_shared(Path(rec.dir), state.endpoint(name), deadline)
        with ssh_retry(state.endpoint(name), deadline, self.stop):
            pass  # now with its own pinned host key
        state.ready_seconds[name] = round(time.monotonic() - t0, 2)
        self.events.guest_phase(name, "ready")

    def _resume(self, state: LabState, name: str, t0: float, deadline: float) -> None:
        """A guest restored from its snapshot: load it, make it this lab's, check SSH."""
        rec, snap = self.records[name], self.planner.warm[name]
        gdir = Path(rec.dir)
        warm.load(Path(rec.qmp), snap.state, snapshot=True)
        self.events.guest_phase(name, "ssh")
        warm.adopt(gdir)
        if name in self.prewarm_early:  # its login overlaps the rest of up (about 0.1 s under TCG)
            from labctl import mux

            mux.prewarm(state.endpoint(name), gdir)
        state.drivers[name] = snap.drivers
        state.offloads[name] = guestconf.offloads(_read(snap.console))
        wait_banner(state.endpoint(name), max(1.0, deadline - time.monotonic()))  # the agent saw sshd listen
        state.ready_seconds[name] = round(time.monotonic() - t0, 2)
        snapshots.record_clone(snap, rec.pid)  # what a clone holds, for the next capacity estimate
        self.events.guest_phase(name, "ready")
