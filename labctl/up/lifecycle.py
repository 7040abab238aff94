"""Bring a lab up: the pipeline's middle stages (taking it down is :mod:`.teardown`).

``up``: lab model -> image -> accelerator -> run directory and keys ->
network plan (+ L2 switches, taps: :mod:`.netsetup`) -> each guest's plan
(:mod:`.planner`) -> guests started -> wait for each guest's READY line and
SSH (:mod:`.waiting`) -> state saved. Any failure or Ctrl-C on the way stops
everything that was started and removes the run directory.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, replace
from pathlib import Path

import labctl.up.envcheck as envcheck  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.mounts as mounts  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.taps as taps  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.tunsetup as tunsetup  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
import labctl.up.warm as warm  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import mux
from labctl.backends import GuestPlan, GuestRecord, choose_accels, get_backend, lab_accel, running_version
from labctl.errors import LabctlError, LabFileError, LabStateError, PortTaken, UsageError
from labctl.events import UpEvents
from labctl.image import Image
from labctl.kernel import Kernel
from labctl.lab import Lab, record_refusals
from labctl.live import apply_impairment, lab_impairments
from labctl.net import free_port, plan_networks
from labctl.paths import ensure_private_dir
from labctl.proc import kill_pids, pids_referencing
from labctl.state import STARTING, UP, LabState, lab_lock, remove_run_dir, run_dir
from labctl.up.keys import known_hosts_line, new_keypair
from labctl.up.netsetup import LabNetworks
from labctl.up.options import DEFAULT_BOOT_TIMEOUT, UpOptions
from labctl.up.planner import GuestPlanner
from labctl.up.teardown import release_owned
from labctl.up.waiting import GuestWaiter

__all__ = ["DEFAULT_BOOT_TIMEOUT", "LabUp", "PlannedGuest", "UpOptions", "dry_run", "up"]


@dataclass(frozen=True)
class PlannedGuest:
    """One guest of ``up --dry-run``: the command that would start it."""

    name: str
    command: list[str]
    warm: bool  # restored from its post-boot snapshot (else a boot)


class LabUp:
    """One ``up`` of one lab; owns everything it starts until it succeeds."""

    def __init__(self, lab: Lab, image: Image, kernels: dict[str, Kernel], opts: UpOptions,
                 events: UpEvents) -> None:
        self.lab = lab
        self.image = image
        self.opts = opts
        self.events = events
        # guest -> its prepared kernel (labctl.pipeline.prepare): up never prepares one itself
        missing = sorted(set(lab.guests) - set(kernels))
        if missing:
            raise UsageError(f"lab {lab.ident}: no prepared kernel for guest(s) {', '.join(missing)}",
                             hint="prepare them first (labctl.pipeline.prepare)")
        self.kernels = kernels
        self.backend = get_backend(opts.backend or lab.backend)
        shared = [g.name for g in lab.guests.values() if g.shares]
        if shared and not self.backend.serves_shares:
            raise UsageError(f"lab {lab.ident}: guest {shared[0]} has shares, which only the qemu backend "
                             f"serves (not {self.backend.name})", hint="drop the shares, or use the qemu backend")
        refused = [w for n, g in lab.guests.items() if g.record for w in record_refusals(lab, n, opts.accel, self.backend.name)]
        if refused:  # a guest under record/replay (labctl.replay): what it cannot be, before anything starts
            raise UsageError("; ".join(refused))
        self.hosts = self.backend.place(lab, opts.no_verify_host_keys)
        self.dir = run_dir(lab.ident)
        self.records: dict[str, GuestRecord] = {}
        self.warnings: list[str] = []
        self.networks = LabNetworks(lab, self.dir, self.backend, self.hosts, self._warn)
        self.planner = GuestPlanner(lab, image, kernels, opts, self.backend, self.hosts, self.dir)
        self.waiter = GuestWaiter(lab, opts, self.backend, events, self.planner, self.records, self._warn)

    def run(self) -> LabState:
        """Bring the lab up and return its saved state.

        :raise LabctlError: on any failure (everything started is stopped).
        """
        with lab_lock(self.lab.ident):
            self._refuse_if_up()
            self._check_environment()
            accels = self._accels()
            try:
                state = self._up(accels)
            except BaseException:
                self.teardown()
                raise
            return state

    def _refuse_if_up(self) -> None:
        if not self.dir.exists():
            return
        try:
            state = LabState.load(self.lab.ident)
        except LabStateError:
            state = None
        if state and state.incomplete:
            raise LabStateError(f"lab '{self.lab.ident}' is incomplete: the labctl that brought it up was killed",
                                hint=f"remove what it left: labctl down {self.lab.ident}")
        if state and any(self.backend.alive(r) for r in state.guests.values()):
            raise LabStateError(f"lab '{self.lab.ident}' is already up",
                                hint=f"take it down first: labctl down {self.lab.ident}")
        if pids_referencing(self.dir):
            raise LabStateError(f"lab '{self.lab.ident}' still has processes running from its run directory",
                                hint=f"labctl down {self.lab.ident}")
        failures = release_owned(self.dir)  # stale: its guests are gone
        if failures:
            raise failures[0]
        remove_run_dir(self.dir)

    def _check_environment(self) -> None:
        """What only the environment decides, checked before anything is made or started:
        every unix socket fits in ``sun_path`` (107 bytes), and no link would be
        an unencrypted tunnel unless the user accepted that.

        :raise LabFileError: naming the guest or network at fault, with its line.
        """
        segments = plan_networks(self.lab, self.dir / "net", self.hosts, udp_port=lambda: 0)
        problems = (envcheck.socket_path_problems(self.lab, self.dir, segments)
                    + envcheck.unencrypted_problems(self.lab, segments, self.opts.unencrypted_links))
        if problems:
            raise LabFileError(sorted(problems, key=lambda p: p.line))

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self.events.warn(message)

    def _accels(self, warn: bool = True) -> dict[str, str]:
        """guest -> its accelerator, each from its own kernel (a KVM probe per distinct kernel)."""
        accels, warnings = choose_accels(self.opts.accel, {g: self.kernels[g].boot for g in self.lab.guests})
        for w in warnings if warn else ():
            self._warn(w)
        return accels

    def _new_state(self, accel: str) -> LabState:
        """The state, saved before anything is started (and after every start): a labctl killed at
        any point leaves a lab that status calls incomplete and down removes."""
        ensure_private_dir(self.dir)
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        source = self.lab.source if "://" in self.lab.source else str(Path(self.lab.source).resolve())  # a URL as is
        state = LabState(lab=self.lab.ident, source=source, dir=str(self.dir),
                         backend=self.backend.name, accel=accel,
                         image={"name": self.image.name, "key": self.image.key, "dir": str(self.image.dir)},
                         started_at=started, guests=self.records, switches=self.networks.switches,
                         resolved=self.lab.to_dict(), warnings=self.warnings,
                         hosts={g: h.to_dict() for g, h in (self.hosts or {}).items()},
                         kernels={g: str(k.dir) for g, k in self.kernels.items()},
                         snapshots=self.planner.snaps, phase=STARTING, owner_pid=os.getpid())
        state.save()
        return state

    def _up(self, accels: dict[str, str]) -> LabState:
        state = self._new_state(lab_accel(accels))
        client = new_keypair(self.dir / "id_ed25519", f"labctl-{self.lab.ident}")
        nets = tunsetup.lab_nets(self.lab.guests)
        tunsetup.make_keys(self.dir, nets)  # this instance's own wireguard keys, handed over once it is up
        segments = self.networks.make(state)
        plans = [self.planner.plan(g, accels[g.name], segments, client.public_line) for g in self.lab.guests.values()]
        state.warm = sorted(self.planner.warm)
        state.uploads = self.backend.prepare(plans)
        state.save()
        for p in plans:
            self.events.guest_phase(p.guest.name, "starting")
            self.records[p.guest.name] = self._start_guest(p)
            state.save()
            self.events.guest_phase(p.guest.name, "booting")
        self.networks.handed_over()  # QEMU holds the taps now
        # After the starts: a retried start moves the guest to new ports.
        (self.dir / "known_hosts").write_text(
            "".join(known_hosts_line(self.records[p.guest.name].ssh_port,
                                     (p.host_key.with_name(p.host_key.name + ".pub")).read_text().strip()) + "\n"
                    for p in plans))
        for p in plans:
            if p.guest.name in self.planner.throwaway:
                warm.write_boot_known_hosts(p.dir, self.records[p.guest.name].ssh_port)
        if self.opts.prewarm:
            keyed = {n for n, _ in tunsetup.wireguard(nets)} | {g for g, _ in lab_impairments(state)}
            self.waiter.prewarm_early = {g.name for g in self.lab.guests.values()
                                         if not g.shares and g.name not in keyed}
        self.waiter.wait_all(state)
        for name in sorted({n for n, _ in tunsetup.wireguard(nets)}):  # after the post-boot snapshot: it holds no key
            tunsetup.hand_keys(self.dir, nets, name, state.endpoint(name))
        for g in self.lab.guests.values():  # after the post-boot snapshot: QEMU cannot save a mounted 9p
            mounts.mount(state.endpoint(g.name), g.name, g.shares)
        for (guest, nic), imp in lab_impairments(state).items():  # netem, once SSH answers
            apply_impairment(state, guest, nic, imp)
        if self.opts.prewarm:  # the last of up's own SSH done: each guest's kept connection, in the background
            for name, rec in self.records.items():
                mux.prewarm(state.endpoint(name), Path(rec.dir))
        # what a run's manifest says of the QEMUs: recorded here, never asked by the bundle
        state.emulators = {g: running_version(self.backend, rec) for g, rec in self.records.items()}
        state.emulator = self.backend.emulator_version()
        state.phase = UP
        state.save()
        return state

    def dry_run(self) -> list[PlannedGuest]:
        """Every guest's start command, as :meth:`run` would give it, with nothing made or
        started: the run directory, keys, sockets, taps and overlays stay unmade (their paths
        are where ``up`` would put them; a tap's descriptors show as ``?``, the SSH port is one
        free now). Checks what :meth:`run` checks first (socket paths, tunnels).

        :raise LabFileError: as :meth:`run` would, before starting anything.
        """
        if not self.backend.shows_argv:
            raise UsageError(f"--dry-run shows QEMU command lines: lab {self.lab.ident} uses the "
                             f"{self.backend.name} backend", hint="labctl up --show-command prints what it defined")
        self._check_environment()
        accels = self._accels(warn=False)
        segments = plan_networks(self.lab, self.dir / "net", self.hosts,
                                 taps=taps.unavailable(self.backend) is None)
        out = []
        for g in self.lab.guests.values():
            plan = self.planner.dry_plan(g, accels[g.name], segments)
            out.append(PlannedGuest(g.name, self.backend.command(plan), plan.warm))
        return out

    def _start_guest(self, plan: GuestPlan) -> GuestRecord:
        """Start one guest, retrying with a new SSH port if QEMU lost a port race."""
        for attempt in range(3):
            try:
                return self.backend.start(plan)
            except PortTaken:
                if attempt == 2:
                    raise
                plan = replace(plan, ssh_port=free_port())
        raise AssertionError("unreachable")

    def teardown(self) -> None:
        """Stop everything this ``up`` started and remove the run directory.

        When something on a host could not be removed (the host went away),
        the run directory stays so that ``labctl down`` can finish the job.
        """
        self.waiter.stop.set()
        for rec in self.records.values():
            try:
                self.backend.kill(rec)
            except LabctlError:
                pass
        self.networks.stop_switches()
        kill_pids(pids_referencing(self.dir))  # a QEMU or switch started but not yet recorded
        self.networks.close()
        failures = release_owned(self.dir)
        if failures:
            self._warn(f"{failures[0].message}; run 'labctl down {self.lab.ident}' once it is reachable")
            return
        remove_run_dir(self.dir)


def up(lab: Lab, image: Image, kernels: dict[str, Kernel], opts: UpOptions | None = None,
       events: UpEvents | None = None) -> LabState:
    """Bring ``lab`` up on ``image``, each guest on its prepared kernel in ``kernels``
    (:func:`labctl.pipeline.prepare`); see :class:`LabUp`."""
    events = events or UpEvents()
    events.started()
    try:
        return LabUp(lab, image, kernels, opts or UpOptions(), events).run()
    finally:
        events.finished()


def dry_run(lab: Lab, image: Image, kernels: dict[str, Kernel], opts: UpOptions | None = None) -> list[PlannedGuest]:
    """What :func:`up` would start, with nothing made or started (``labctl up --dry-run``)."""
    return LabUp(lab, image, kernels, opts or UpOptions(), UpEvents()).dry_run()
