"""``labctl reset`` and checkpoint restores: guests of a lab that is up started again from a saved
instant, while the lab's other guests keep running.

A guest is put back by stopping its QEMU, giving it a new disk overlay (on
the post-boot snapshot's disk, or a copy of a checkpoint's), and starting
QEMU again with the command line it had, waiting for the saved state
(``-incoming defer``). Its sockets and files keep their paths, so its
neighbours' links and its pinned host key are unchanged; so is its SSH port,
unless another process took it while QEMU restarted: then the guest comes
back on a new port and its files are updated (:mod:`labctl.training.sshport`).
A guest without a snapshot (taken at its first cold boot; a kernel without
virtio-console has none) is booted again instead.

That is how a backend with post-boot snapshots puts a guest back
(:attr:`labctl.backends.Backend.post_boot_snapshots`: the qemu backend). A backend that saves
its guests' states on their hosts (:attr:`~labctl.backends.Backend.states_on_hosts`: libvirt)
restores the state saved once the guest was up (``class up`` saves one per guest).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import labctl.training.sshport as sshport  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import mux
from labctl.backends import POSTBOOT, Backend, GuestRecord, get_backend
from labctl.endpoint import Endpoint
from labctl.errors import GuestError, LabStateError, UsageError
from labctl.image import Image
from labctl.lab import Firewall, FirewallRecord
from labctl.state import LabState, lab_lock
from labctl.up import (
    adopt_restored,
    agent_channel,
    attach_xdp,
    check_snapshot_memory,
    clock_command,
    configure_tunnels,
    find_restorable,
    hand_over_shared,
    hand_tunnel_keys,
    lab_nets,
    load_firewall,
    load_saved_state,
    mount_shares,
    new_overlay,
    record_clone,
    restore_disk,
    set_guest_clock,
    shares_of,
    wait_banner,
)

BOOT_TIMEOUT = 180.0


def reset(lab: str, guests: Sequence[str] | None = None,
          on_guest: Callable[[str, float, str], None] | None = None,
          on_moved: Callable[[str], None] | None = None) -> dict[str, float]:
    """Reset ``guests`` (all when None or empty) of the lab ``lab`` (NAME or NAME@INSTANCE) to their
    post-boot state; seconds each took. ``on_guest(guest, seconds, how)`` is told as each is back
    (how: ``snapshot`` or ``boot``); ``on_moved(message)`` about a guest whose SSH port was taken
    while its QEMU restarted (it is back on a new one, its files updated).

    :raise LabStateError: when the lab is not up. :raise UsageError: for an unknown guest or a
        backend that cannot do it. :raise GuestError: when a guest does not come back.
    """
    with lab_lock(lab):
        state = LabState.load(lab)
        names = _guests(state, guests)
        if get_backend(state.backend).states_on_hosts:
            return _reset_saved(state, names, on_guest)
        backend = need_restart(state, "reset")
        took: dict[str, float] = {}
        hows: dict[str, str] = {}
        errors: list[BaseException] = []
        moves: list[sshport.Moved] = []

        def one(name: str) -> None:
            t0 = time.monotonic()
            try:
                snap = find_restorable(state.snapshots.get(name))
                rec = state.guests[name]
                port = rec.ssh_port
                disk = Path(rec.dir) / "disk.qcow2"
                if snap is not None:
                    check_snapshot_memory(snap)  # before its QEMU is stopped: a broken snapshot changes nothing
                    rec = restart(backend, rec, lambda: restore_disk(snap, disk, Path(rec.console)))
                    load_saved_state(Path(rec.qmp), snap.state, snapshot=True)
                    adopt_restored(Path(rec.dir))  # its own keys: the snapshot holds none
                    how = "snapshot"
                else:
                    image = Image.at(Path(str(state.image["dir"])))
                    rec = restart(backend, rec, lambda: new_overlay(image.rootfs, disk, "raw"),
                                  incoming=False)
                    how = "boot"
                state.guests[name] = rec
                if rec.ssh_port != port:
                    moves.append(sshport.repin(state.path, name, port, rec.ssh_port))
                hows[name] = how
                if how == "boot":
                    wait_ssh(state.endpoint(name), BOOT_TIMEOUT)
                else:  # the agent saw sshd listen with the guest's own keys: its banner is proof enough
                    wait_banner(state.endpoint(name), 30.0)
                nets = lab_nets(state.resolved.get("guests") or {})
                if how == "boot":  # a snapshot holds the firewall (and tunnels); a boot loads it again
                    configure_tunnels(state.endpoint(name), nets[name], state.source)
                    load_firewall(state.endpoint(name), firewall_of(state, name), state.source)
                    spec = state.guest_spec(name)
                    attach_xdp(state.endpoint(name), spec["nics"] if spec else [], state.source)
                hand_tunnel_keys(Path(state.dir), nets, name, state.endpoint(name))  # no snapshot holds keys
                mount_shares(state.endpoint(name), name, shares_of(state.guest_spec(name)))
                took[name] = round(time.monotonic() - t0, 2)
                if snap is not None:
                    record_clone(snap, rec.pid)  # what a clone holds (labctl.up.capacity)
                if on_guest:
                    on_guest(name, took[name], how)
            except BaseException as exc:  # noqa: BLE001 - reported after the others are back
                errors.append(exc)

        _each(names, one)
        state.warm = sorted((set(state.warm) | {n for n, h in hows.items() if h == "snapshot"})
                            - {n for n, h in hows.items() if h == "boot"})
        state.save()
        tell_moves(state, moves, on_moved)
        if errors:
            raise errors[0]
        return took


def firewall_of(state: LabState, name: str) -> Firewall | None:
    """The firewall of guest ``name`` as the lab's recorded state has it (None: it has none)."""
    spec = state.guest_spec(name)
    fw: FirewallRecord | None = spec.get("firewall") if spec else None
    return Firewall.from_dict(fw) if isinstance(fw, dict) else None


def _reset_saved(state: LabState, names: list[str], on_guest: Callable[[str, float, str], None] | None
                 ) -> dict[str, float]:
    """Reset guests from the states their backend saved on their hosts once they were up."""
    backend = get_backend(state.backend)
    refuse_incomplete(state)
    missing = [n for n in names if not backend.has_state(state.guests[n], POSTBOOT)]
    if missing:
        raise UsageError(f"guest {missing[0]} of lab {state.lab} has no saved post-boot state (libvirt guests "
                         "have one when 'labctl class up', or 'labctl up --save-state', brought them up)",
                         hint=f"labctl down {state.lab}, then labctl up with --save-state")
    took: dict[str, float] = {}
    errors: list[BaseException] = []

    def one(name: str) -> None:
        t0 = time.monotonic()
        try:
            mux.close(Path(state.guests[name].dir))  # its kept connection goes with the machine under it
            rec = state.guests[name] = backend.restore_state(state.guests[name], POSTBOOT)
            shared = rec.extra.get("throwaway_state") == POSTBOOT
            if shared:  # a class's shared state holds throwaway keys: the guest's own again, and the clock
                hand_over_shared(Path(rec.dir), state.endpoint(name), time.monotonic() + 30.0)
            wait_ssh(state.endpoint(name), 30.0, set_clock=not shared)
            hand_tunnel_keys(Path(state.dir), lab_nets(state.resolved.get("guests") or {}), name,
                             state.endpoint(name))
            took[name] = round(time.monotonic() - t0, 2)
            if on_guest:
                on_guest(name, took[name], "saved state")
        except BaseException as exc:  # noqa: BLE001 - reported after the others are back
            errors.append(exc)

    _each(names, one)
    state.save()
    if errors:
        raise errors[0]
    return took


def _each(names: Sequence[str], one: Callable[[str], None]) -> None:
    """``one(name)`` for every name, each in its own thread, until all are done."""
    threads = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def tell_moves(state: LabState, moves: Sequence[sshport.Moved], on_moved: Callable[[str], None] | None) -> None:
    """Once the state names the guests' new ports: their handouts updated, the user told."""
    for moved in moves:
        moved = sshport.update_handout(moved, state.lab)
        if on_moved:
            on_moved(sshport.message(state.lab, moved))


def _guests(state: LabState, guests: Sequence[str] | None) -> list[str]:
    names = list(guests or state.guests)
    unknown = [g for g in names if g not in state.guests]
    if unknown:
        raise UsageError(f"lab {state.lab} has no guest {unknown[0]!r}", hint=f"its guests: {', '.join(state.guests)}")
    return names


def need_restart(state: LabState, what: str) -> Backend:
    """The lab's backend, when it restarts guests from files labctl keeps (post-boot snapshots).

    :raise UsageError: for another backend. :raise LabStateError: for an incomplete lab.
    """
    backend = get_backend(state.backend)
    if not backend.post_boot_snapshots:
        raise UsageError(f"{what} needs the qemu backend; lab {state.lab} runs on {state.backend}",
                         hint=f"labctl down {state.lab} and up it again")
    refuse_incomplete(state)
    return backend


def refuse_incomplete(state: LabState) -> None:
    """:raise LabStateError: when the labctl that brought the lab up was killed."""
    if state.incomplete:
        raise LabStateError(f"lab '{state.lab}' is incomplete: the labctl that brought it up was killed",
                            hint=f"labctl down {state.lab}")


def restart(backend: Backend, rec: GuestRecord, new_disk: Callable[[], None],
            incoming: bool = True, new_console: bool = True) -> GuestRecord:
    """Stop the guest's QEMU, keep its console as ``console.prev.log`` (when ``new_console``;
    else it goes on), give it a new disk (``new_disk``) and start it again (waiting for a saved
    state when ``incoming``); its new record. When its SSH port was taken meanwhile, it is started
    on a new one (the record's ``ssh_port``; the caller updates its files: :mod:`labctl.training.sshport`)."""
    gdir = Path(rec.dir)
    mux.close(gdir)  # its kept connection goes with the machine under it (labctl.mux)
    backend.kill(rec)
    console = Path(rec.console)
    if new_console and console.exists():
        console.replace(gdir / "console.prev.log")
    for sock in (rec.qmp, rec.gdb):
        if sock:
            Path(sock).unlink(missing_ok=True)
    new_disk()
    return sshport.restart(backend, rec, incoming)[0]


def copy_disk(src: Path, dest: Path) -> None:
    """``dest`` a copy of the overlay ``src`` (its backing file stays the same)."""
    dest.unlink(missing_ok=True)
    shutil.copyfile(src, dest)
    dest.chmod(0o600)


def wait_ssh(ep: Endpoint, timeout: float, set_clock: bool = False) -> None:
    """Until the guest answers SSH with the lab's key and pinned host key; with ``set_clock``, its
    wall clock is then set to the host's through that session (a libvirt guest has no agent, and
    libvirt's restore gives it back the clock it was saved with).

    :raise GuestError: when it does not answer within ``timeout``, or its clock cannot be set.
    """
    from labctl.ssh import Session  # paramiko: a reset from the snapshot waits for sshd's banner only

    deadline = time.monotonic() + timeout
    while True:
        try:
            session = Session(ep, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
            break
        except GuestError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with session:
        if set_clock:
            res = session.run(clock_command(), timeout=20.0)
            if res.status != 0:
                raise GuestError(f"guest {ep.guest}: its clock could not be set (date exited {res.status})")


def set_clocks(state: LabState, names: Sequence[str]) -> None:
    """Every named guest's wall clock to the host's (after a restore)."""
    for name in names:
        set_guest_clock(agent_channel(Path(state.guests[name].dir)))
