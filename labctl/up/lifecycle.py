"""Bring a lab up: the pipeline's middle stages (taking it down is :mod:`.teardown`).

``up``: lab model -> image -> accelerator -> run directory and keys ->
network plan (+ L2 switches) -> guests started in parallel -> wait for each
guest's READY line and SSH -> state saved. Any failure or Ctrl-C on the way
stops everything that was started and removes the run directory.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.backends import get_backend
from labctl.backends.base import Backend, GuestPlan, GuestRecord
from labctl.debug.crash import crashed
from labctl.errors import (
    GuestError,
    LabctlError,
    LabFileError,
    LabStateError,
    MachineError,
    PortTaken,
    UsageError,
)
from labctl.events import UpEvents
from labctl.image.store import Image
from labctl.kernel import prepare as kernel_prep
from labctl.kernel.store import Kernel
from labctl.lab.addresses import mgmt_mac
from labctl.lab.hosts import HostPlace, place_guests
from labctl.lab.model import Guest, Lab
from labctl.net.plan import SWITCH, TAP, Port, Segment, TapDev, plan_networks
from labctl.net.ports import free_port
from labctl.paths import ensure_private_dir
from labctl.proc import kill_pids, pids_referencing, spawn
from labctl.ssh import Endpoint, Session
from labctl.live import netctl
from labctl.up import agent, guestconf, preflight, shares, snapshots, taps, warm
from labctl.up.accel import choose_accel
from labctl.up.bootargs import kernel_args
from labctl.up.console import FAILED, READY, console_tail, ready_drivers
from labctl.up.keys import known_hosts_line, new_keypair
from labctl.state.runstate import STARTING, UP, LabState, SwitchRecord, lab_lock, remove_run_dir, run_dir
from labctl.up.teardown import release_owned, stop_switches
from labctl.up.tsc import host_tsc_khz

DEFAULT_BOOT_TIMEOUT = 180.0


@dataclass
class UpOptions:
    accel: str = "auto"
    backend: str | None = None
    boot_timeout: float = DEFAULT_BOOT_TIMEOUT
    extra_kernel_args: tuple[str, ...] = ()
    no_verify_host_keys: bool = False  # --no-verify-host-keys: remote hosts' SSH keys are not checked
    unencrypted_links: bool = False  # --unencrypted-links: UDP tunnels across hosts are accepted
    cold: bool = False  # --cold: boot every guest, even where a post-boot snapshot exists
    snapshots: bool = True  # take post-boot snapshots of cold-booted guests (qemu backend)
    saved_states: bool = False  # libvirt: save each guest once up, for reset (class up; labctl.backends.libvirt.saved)
    # libvirt, class up: one post-boot state per host and guest, saved with throwaway keys, that the
    # next instances start from (``templates``: (guest, host name) -> saved.Template)
    shared_states: bool = False
    templates: dict[tuple[str, str], Any] = field(default_factory=dict)


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
        backend = opts.backend or lab.backend
        shared = [g.name for g in lab.guests.values() if g.shares]
        if shared and backend != "qemu":
            raise UsageError(f"lab {lab.ident}: guest {shared[0]} has shares, which only the qemu backend "
                             f"serves (not {backend})", hint="drop the shares, or use the qemu backend")
        if lab.uses_hosts and backend != "libvirt":
            raise UsageError(f"lab {lab.ident} places guests on hosts, which needs the libvirt backend "
                             f"(not {backend})", hint="use --backend libvirt, or drop the lab's hosts")
        self.backend: Backend = get_backend(backend)
        self.hosts = self._place(backend)
        self.dir = run_dir(lab.ident)
        self.records: dict[str, GuestRecord] = {}
        self.switches: list[SwitchRecord] = []
        self.snaps: dict[str, str] = {}  # guest -> its snapshot key (qemu backend)
        self.warm: dict[str, snapshots.Snapshot] = {}  # guests restored instead of booted
        self.throwaway: set[str] = set()  # guests booting with a throwaway host key (to be snapshotted)
        self.netns: str | None = None  # the lab's network namespace, for tap networks
        self.tap_fds: list[int] = []  # labctl's copies of the taps' queues, closed once QEMU has them
        self.warnings: list[str] = []
        self._stop_waits = threading.Event()

    def run(self) -> LabState:
        """Bring the lab up and return its saved state.

        :raise LabctlError: on any failure (everything started is stopped).
        """
        with lab_lock(self.lab.ident):
            self._refuse_if_up()
            self._preflight()
            accel = choose_accel(self.opts.accel, next(iter(self.kernels.values())).boot)
            if accel.warning:
                self._warn(accel.warning)
            try:
                state = self._up(accel.accel)
            except BaseException:
                self.teardown()
                raise
            return state

    def _place(self, backend: str) -> dict[str, HostPlace] | None:
        """guest -> libvirt host (None for the qemu backend: everything runs here).

        :raise UsageError: when the backend's default URI cannot be used.
        """
        if backend != "libvirt":
            return None
        from labctl.backends.libvirt.api import libvirt_uri

        try:
            return place_guests(self.lab, libvirt_uri(), self.opts.no_verify_host_keys)
        except ValueError as exc:
            raise UsageError(str(exc), hint="fix $LABCTL_LIBVIRT_URI or the lab's hosts") from exc

    def _refuse_if_up(self) -> None:
        if not self.dir.exists():
            return
        try:
            state = LabState.load(self.lab.ident)
        except LabStateError:
            state = None
        backend = self.backend
        if state and state.incomplete:
            raise LabStateError(f"lab '{self.lab.ident}' is incomplete: the labctl that brought it up was killed",
                                hint=f"remove what it left: labctl down {self.lab.ident}")
        if state and any(backend.alive(r) for r in state.guests.values()):
            raise LabStateError(f"lab '{self.lab.ident}' is already up",
                                hint=f"take it down first: labctl down {self.lab.ident}")
        if pids_referencing(self.dir):
            raise LabStateError(f"lab '{self.lab.ident}' still has processes running from its run directory",
                                hint=f"labctl down {self.lab.ident}")
        failures = release_owned(self.dir)  # stale: its guests are gone
        if failures:
            raise failures[0]
        remove_run_dir(self.dir)

    def _preflight(self) -> None:
        """What only the environment decides, checked before anything is made or started:
        every unix socket fits in ``sun_path`` (107 bytes), and no link would be
        an unencrypted tunnel unless the user accepted that.

        :raise LabFileError: naming the guest or network at fault, with its line.
        """
        segments = plan_networks(self.lab, self.dir / "net", self.hosts, udp_port=lambda: 0)
        problems = (preflight.socket_path_problems(self.lab, self.dir, segments)
                    + preflight.unencrypted_problems(self.lab, segments, self.opts.unencrypted_links))
        if problems:
            raise LabFileError(sorted(problems, key=lambda p: p.line))

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        self.events.warn(message)

    def _up(self, accel: str) -> LabState:
        ensure_private_dir(self.dir)
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        # The state exists before anything is started, and is saved again after
        # every start: a labctl killed at any point leaves a lab that status
        # calls incomplete and down removes.
        state = LabState(lab=self.lab.ident, source=str(Path(self.lab.source).resolve()), dir=str(self.dir),
                         backend=self.backend.name, accel=accel,
                         image={"name": self.image.name, "key": self.image.key, "dir": str(self.image.dir)},
                         started_at=started, guests=self.records, switches=self.switches,
                         resolved=self.lab.to_dict(), warnings=self.warnings,
                         hosts={g: h.to_dict() for g, h in (self.hosts or {}).items()},
                         kernels={g: str(k.dir) for g, k in self.kernels.items()},
                         snapshots=self.snaps, phase=STARTING, owner_pid=os.getpid())
        state.save()
        client = new_keypair(self.dir / "id_ed25519", f"labctl-{self.lab.ident}")
        net = self.backend.network_dir(self.dir, self.lab.ident, self.hosts)
        no_taps = taps.unavailable(self.backend.name)
        segments = plan_networks(self.lab, net.path, self.hosts, taps=no_taps is None)
        state.networks = {n: seg.to_dict(self.hosts) for n, seg in segments.items()}
        for seg in segments.values():
            if seg.mechanism == SWITCH:
                self._start_switch(seg, state, net.owner)
        segments = self._make_taps(segments, state)
        for g in self.lab.guests.values():
            for nic in g.nics:
                if nic.queues > 1 and segments[nic.network].mechanism != TAP:
                    self._warn(f"{g.name}.{nic.name}: queues={nic.queues} needs a multi-queue link (tap), "
                               f"which is not possible here ({no_taps or 'a UDP tunnel'}); the dgram link "
                               "gives the guest one queue pair")
        plans = [self._plan(g, accel, segments, client.public_line) for g in self.lab.guests.values()]
        state.warm = sorted(self.warm)
        state.uploads = self.backend.prepare(plans)
        state.save()
        for p in plans:
            self.events.guest_phase(p.guest.name, "starting")
            self.records[p.guest.name] = self._start_guest(p)
            state.save()
            self.events.guest_phase(p.guest.name, "booting")
        taps.close(tuple(self.tap_fds))  # QEMU holds the taps now
        self.tap_fds = []
        # After the starts: a retried start moves the guest to new ports.
        (self.dir / "known_hosts").write_text(
            "".join(known_hosts_line(self.records[p.guest.name].ssh_port,
                                     (p.host_key.with_name(p.host_key.name + ".pub")).read_text().strip()) + "\n"
                    for p in plans))
        for p in plans:
            if p.guest.name in self.throwaway:
                warm.write_boot_known_hosts(p.dir, self.records[p.guest.name].ssh_port)
        self._wait_all(state)
        for g in self.lab.guests.values():  # after the post-boot snapshot: QEMU cannot save a mounted 9p
            shares.mount(state.endpoint(g.name), g.name, g.shares)
        self._impair(state)
        state.phase = UP
        state.save()
        return state

    def _make_taps(self, segments: dict[str, Segment], state: LabState) -> dict[str, Segment]:
        """The lab's namespace (recorded first), its bridges and taps; segments whose taps have descriptors."""
        tapped = {n: seg for n, seg in segments.items() if seg.mechanism == TAP}
        if not tapped:
            return segments
        self.netns = state.netns = taps.netns_name(self.dir)
        state.save()
        bridges = sorted({p.local.bridge for seg in tapped.values() for p in seg.ports if isinstance(p.local, TapDev)})
        taps.create_netns(self.netns, bridges)
        out = dict(segments)
        for name, seg in tapped.items():
            ports = []
            for p in seg.ports:
                assert isinstance(p.local, TapDev)
                dev = taps.open_tap(self.netns, p.local)
                self.tap_fds += dev.fds
                ports.append(Port(p.guest, p.nic, p.network, dev, None))
            out[name] = Segment(seg.network, seg.mechanism, tuple(ports), None)
        return out

    def _impair(self, state: LabState) -> None:
        """Put the lab file's impairments in force (netem in each guest, once it answers SSH)."""
        for (guest, nic), imp in netctl.lab_impairments(state).items():
            netctl.apply_impairment(state, guest, nic, imp)

    def _start_switch(self, seg: Segment, state: LabState, owner: tuple[int, int] | None = None) -> None:
        """Start the network's switch; with ``owner`` it runs as that user (the guests' QEMUs')."""
        assert seg.switch_socket is not None
        idx = seg.switch_socket.name.split("-")[0]
        log = self.dir / f"switch-{idx}.log"
        user = ["--user", f"{owner[0]}:{owner[1]}"] if owner else []
        # --lab names the run directory: a switch whose pid was never recorded (up killed) is still found by it
        proc = spawn([sys.executable, "-m", "labctl.net.switch", str(seg.switch_socket), *user, "--lab", str(self.dir)], log)
        self.switches.append(SwitchRecord(seg.network, proc.pid, str(seg.switch_socket)))
        state.save()
        deadline = time.monotonic() + 10
        while not seg.switch_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise MachineError(f"the L2 switch for network {seg.network} did not start: "
                                   f"{console_tail(log, 3)}")
            time.sleep(0.02)

    def dry_run(self) -> list[PlannedGuest]:
        """Every guest's start command, as :meth:`run` would give it, with nothing made or
        started: the run directory, keys, sockets, taps and overlays stay unmade (their paths
        are where ``up`` would put them; a tap's descriptors show as ``?``, the SSH port is one
        free now). Checks what :meth:`run` checks first (socket paths, tunnels).

        :raise LabFileError: as :meth:`run` would, before starting anything.
        """
        if self.backend.name != "qemu":
            raise UsageError(f"--dry-run shows QEMU command lines: lab {self.lab.ident} uses the "
                             f"{self.backend.name} backend", hint="labctl up --show-command prints what it defined")
        self._preflight()
        accel = choose_accel(self.opts.accel, next(iter(self.kernels.values())).boot).accel
        segments = plan_networks(self.lab, self.dir / "net", self.hosts,
                                 taps=taps.unavailable(self.backend.name) is None)
        out = []
        for g in self.lab.guests.values():
            plan = self._guest_plan(g, accel, segments, self.dir / "guests" / g.name)
            snap = None
            if self.opts.snapshots and not self.opts.cold:
                snap = snapshots.find(snapshots.key(plan))
            if snap is not None:
                plan = dataclasses.replace(plan, warm=True)
            out.append(PlannedGuest(g.name, self.backend.command(plan), snap is not None))
        return out

    def _guest_plan(self, g: Guest, accel: str, segments: dict[str, Segment], gdir: Path) -> GuestPlan:
        """The guest's plan, as data (nothing made but the kernel's cached initrd)."""
        ports = {nic.name: next(p for p in segments[nic.network].ports
                                if p.guest == g.name and p.nic == nic.name) for nic in g.nics}
        kernel = self.kernels[g.name]
        host = self.hosts[g.name] if self.hosts else None
        tsc_khz = host_tsc_khz() if accel == "tcg" and self.backend.name == "qemu" else None
        args = kernel_args(self.image, g, kernel, self.opts.extra_kernel_args, tsc_khz)
        initrd = kernel_prep.initrd(kernel, self.image.initramfs_cpio, self.image.key)
        return GuestPlan(lab=self.lab.ident, guest=g, dir=gdir, image=self.image, accel=accel,
                         ssh_port=free_port(), mgmt_mac=mgmt_mac(self.lab.name, g.name),
                         ports=ports, kernel_args=args, kernel=kernel, initrd=initrd, host=host)

    def _plan(self, g: Guest, accel: str, segments: dict[str, Segment], client_pub: str) -> GuestPlan:
        gdir = ensure_private_dir(self.dir / "guests" / g.name)
        shares.make_directories(gdir, self.lab.ident, g.name, g.shares)
        plan = self._guest_plan(g, accel, segments, gdir)
        host = plan.host
        new_keypair(plan.host_key, f"{g.name}.{self.lab.ident}")
        plan.authorized_keys.write_text(client_pub + "\n")
        if host is not None:
            plan = self._shared_state(plan)
        if host is None:  # the qemu backend; a libvirt host gets an overlay volume in its pool
            snap = self._snapshot_of(plan)
            if snap is not None:
                plan = dataclasses.replace(plan, warm=True)
                warm.restore_disk(snap, plan.overlay, plan.console)
            else:
                snapshots.new_overlay(self.image.rootfs, plan.overlay, "raw")
            if snap is None and g.name in self.snaps and snapshots.find(self.snaps[g.name]) is None:
                # This boot becomes the post-boot snapshot: no guest's own key may be in it.
                warm.boot_with_throwaway(gdir, f"labctl-boot-{secrets.token_hex(4)}")
                self.throwaway.add(g.name)
            else:
                warm.boot_with_own_key(gdir)
        # A boot that becomes the snapshot with no setup commands is not logged into before the
        # snapshot: its sshd waits for the guest's own key (one sshd start fewer under TCG).
        # (a libvirt guest has no agent: its sshd starts with the throwaway key)
        plan.config.write_text(guestconf.render(g, plan.mgmt_mac, standby_sshd=g.name in self.throwaway
                                                and not g.setup and host is None))
        return plan

    def _shared_state(self, plan: GuestPlan) -> GuestPlan:
        """A libvirt guest of a class: started from its host's shared post-boot state when there
        is one (the backend boots it instead if the state's domain has another shape), else booted
        with throwaway keys so that its post-boot state becomes that state (labctl.up.warm)."""
        if not (self.opts.saved_states and self.opts.shared_states) or self.opts.cold or plan.host is None:
            return plan
        name = plan.guest.name
        template = self.opts.templates.get((name, plan.host.name))
        if template is not None:
            warm.take_shared_keys(Path(template.dir), plan.dir)
            return dataclasses.replace(plan, template=template)
        warm.boot_shared(plan.dir, plan.boot_authorized_keys, f"labctl-boot-{secrets.token_hex(4)}")
        self.throwaway.add(name)
        return dataclasses.replace(plan, boot_keys=True)

    def _snapshot_of(self, plan: GuestPlan) -> snapshots.Snapshot | None:
        """The guest's post-boot snapshot to restore (None: it boots), noting its key."""
        if self.backend.name != "qemu" or not self.opts.snapshots:
            return None
        key = self.snaps[plan.guest.name] = snapshots.key(plan)
        snap = None if self.opts.cold else snapshots.find(key)
        if snap is not None:
            self.warm[plan.guest.name] = snap
        return snap

    def _start_guest(self, plan: GuestPlan) -> GuestRecord:
        """Start one guest, retrying with a new SSH port if QEMU lost a port race."""
        for attempt in range(3):
            try:
                return self.backend.start(plan)
            except PortTaken:
                if attempt == 2:
                    raise
                plan = GuestPlan(**{**plan.__dict__, "ssh_port": free_port()})
        raise AssertionError("unreachable")

    def _wait_all(self, state: LabState) -> None:
        """Wait for every guest in parallel; Ctrl-C or SIGTERM stops the waits at once."""
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(self.records))
        try:
            futures = {pool.submit(self._wait_guest, state, name): name for name in self.records}
            errors: list[LabctlError] = []
            for fut in concurrent.futures.as_completed(futures):
                try:
                    fut.result()
                except LabctlError as exc:
                    errors.append(exc)
                    self._stop_waits.set()  # one failure fails the up: no need to wait for the others
            if errors:
                raise errors[0]
        finally:
            self._stop_waits.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def _wait_guest(self, state: LabState, name: str) -> None:
        rec = self.records[name]
        t0 = time.monotonic()
        deadline = t0 + self.opts.boot_timeout
        if name in self.warm:
            self._resume(state, name, t0, deadline)
            return
        if rec.extra.get("started_from"):
            self._resume_shared(state, name, t0, deadline)
            return
        console = Path(rec.console)
        while True:
            if self._stop_waits.is_set():
                return
            data = console.read_bytes() if console.exists() else b""
            if READY in data and b"\n" in data[data.index(READY):]:
                break  # the whole READY line is there
            if FAILED in data or crashed(data):
                self.events.guest_phase(name, "failed")
                time.sleep(0.5)  # let the rest of the oops reach the log
                raise GuestError(f"guest {name} failed to boot:\n{console_tail(console)}")
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
        self.events.guest_phase(name, "ssh")
        state.drivers[name] = ready_drivers(data)
        gdir = Path(rec.dir)
        throwaway = name in self.throwaway
        # A guest booted with the throwaway key answers with it (pinned in boot_known_hosts)
        # until the snapshot is taken and it has its own.
        ep = warm.boot_endpoint(state.endpoint(name), gdir) if throwaway else state.endpoint(name)
        setup = self.lab.guests[name].setup
        # A guest whose boot becomes the snapshot and that has no setup commands is snapshotted
        # at once: its one SSH handshake is the one with its own key (this saves one under TCG).
        if not throwaway or setup or self.backend.name == "libvirt":  # a libvirt state is saved once SSH answers
            with _ssh_retry(ep, deadline, self._stop_waits):
                pass  # the guest answers SSH with the lab's key and pinned host key
            state.ready_seconds[name] = round(time.monotonic() - t0, 2)
            warm.run_setup(ep, setup)
        if self.opts.saved_states and self.backend.name == "libvirt":
            if throwaway:  # a shared state: its restores' sshd takes its key without starting again
                why = warm.start_standby(ep)
                if why:
                    self._warn(why)
            self._save_state(state, name)
        snapped = False
        if name in self.snaps and snapshots.find(self.snaps[name]) is None:
            got = warm.snapshot_after_boot(Path(rec.qmp), gdir / "disk.qcow2", agent.channel_of(gdir),
                                           self.snaps[name], name, state.drivers[name], self.lab.name)
            if isinstance(got, str):
                self._warn(got)
            snapped = True
        if throwaway:
            # The snapshot (if one was taken) holds the throwaway key only: now the guest's own.
            # The agent answered (or not) a moment ago when a snapshot was tried.
            agent_wait = 0.0 if self.backend.name == "libvirt" else 2.0 if snapped else warm.AGENT_WAIT
            warm.hand_over_keys(gdir, ep, agent_wait=agent_wait, clock=self.backend.name == "libvirt")
            with _ssh_retry(state.endpoint(name), deadline, self._stop_waits):
                pass  # now with its own pinned host key
            state.ready_seconds.setdefault(name, round(time.monotonic() - t0, 2))
        self.events.guest_phase(name, "ready")

    def _save_state(self, state: LabState, name: str) -> None:
        """A libvirt guest's post-boot state, saved on its host for ``reset`` (a failure only warns)."""
        from labctl.backends.libvirt import saved

        self.events.guest_phase(name, "saving")
        try:
            self.records[name] = saved.save(self.records[name], saved.POSTBOOT)
        except LabctlError as exc:
            self._warn(f"guest {name}: its post-boot state was not saved ({exc.message}); reset will need "
                       "the lab brought up again")
            return
        if name in self.throwaway:  # saved with throwaway keys: shared with the next instances
            self.records[name].extra["throwaway_state"] = saved.POSTBOOT  # (its clock is set with its keys)
        else:  # restored at once, with the clock it was saved with
            warm.set_clock_over_ssh(state.endpoint(name))

    def _resume_shared(self, state: LabState, name: str, t0: float, deadline: float) -> None:
        """A libvirt guest started from a shared post-boot state: its own keys and the clock."""
        rec = self.records[name]
        self.events.guest_phase(name, "ssh")
        template = self.opts.templates[(name, str(rec.extra.get("host") or "local"))]
        state.drivers[name] = dict(template.drivers)
        warm.hand_over_shared(Path(rec.dir), state.endpoint(name), deadline)
        with _ssh_retry(state.endpoint(name), deadline, self._stop_waits):
            pass  # now with its own pinned host key
        state.ready_seconds[name] = round(time.monotonic() - t0, 2)
        self.events.guest_phase(name, "ready")

    def _resume(self, state: LabState, name: str, t0: float, deadline: float) -> None:
        """A guest restored from its snapshot: load it, make it this lab's, check SSH."""
        rec, snap = self.records[name], self.warm[name]
        gdir = Path(rec.dir)
        warm.load(Path(rec.qmp), snap.state)
        self.events.guest_phase(name, "ssh")
        warm.adopt(gdir)
        state.drivers[name] = snap.drivers
        with _ssh_retry(state.endpoint(name), deadline, self._stop_waits):
            pass
        state.ready_seconds[name] = round(time.monotonic() - t0, 2)
        self.events.guest_phase(name, "ready")

    def teardown(self) -> None:
        """Stop everything this ``up`` started and remove the run directory.

        When something on a host could not be removed (the host went away),
        the run directory stays so that ``labctl down`` can finish the job.
        """
        self._stop_waits.set()
        for rec in self.records.values():
            try:
                self.backend.kill(rec)
            except LabctlError:
                pass
        stop_switches(self.switches)
        kill_pids(pids_referencing(self.dir))  # a QEMU or switch started but not yet recorded
        taps.close(tuple(self.tap_fds))
        if self.netns:
            taps.delete_netns(self.netns)
        failures = release_owned(self.dir)
        if failures:
            self._warn(f"{failures[0].message}; run 'labctl down {self.lab.ident}' once it is reachable")
            return
        remove_run_dir(self.dir)


def _ssh_retry(ep: Endpoint, deadline: float, stop: threading.Event) -> Session:
    while True:
        try:
            return Session(ep, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        except GuestError:
            if time.monotonic() > deadline or stop.is_set():
                raise
            time.sleep(0.2)


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
