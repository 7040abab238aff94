"""Checkpoints of a lab that is up: every guest paused at one instant, its RAM, device state and
disk saved, then resumed; a restore brings every guest back to that instant.

::

    <run dir>/checkpoints/<name>/
        <guest>.state      QEMU's migration stream (RAM and device state)
        <guest>.qcow2      the guest's disk overlay at that instant
        meta.json          when, which guests, sizes

Checkpoints live in the lab's run directory: ``down`` removes them. A libvirt
lab's checkpoint is saved by libvirt on each guest's host
(:mod:`labctl.backends.libvirt.saved`, removed with the guest's directory
there at ``down``); only its ``meta.json`` is here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

import labctl.training.sshport as sshport  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl import mux
from labctl.backends import get_backend, save_state
from labctl.errors import LabctlError, LabStateError, MachineError, UsageError
from labctl.lab import LAB_NAME, LAB_NAME_RULE, Share
from labctl.paths import atomic_write, build_into, ensure_private_dir
from labctl.state import LabState, lab_lock
from labctl.training.reset import (
    copy_disk,
    need_restart,
    refuse_incomplete,
    restart,
    set_clocks,
    tell_moves,
    wait_ssh,
)
from labctl.up import load_saved_state, mount_shares, shares_of, umount_shares

META = "meta.json"


class CheckpointMeta(TypedDict, total=False):
    """A checkpoint's ``meta.json`` (both kinds write every key but ``on_hosts``; one unreadable is {})."""

    lab: str
    name: str
    guests: list[str]
    on_hosts: bool  # saved by the backend on the guests' hosts (libvirt)
    created_at: str
    save_seconds: float


class CheckpointView(TypedDict):
    """A checkpoint as ``checkpoint list`` shows it."""

    name: str
    created_at: str | None
    guests: list[str]
    bytes: int
    save_seconds: float | None


@dataclass(frozen=True)
class Checkpoint:
    name: str
    dir: Path
    meta: CheckpointMeta

    def to_dict(self) -> CheckpointView:
        return {"name": self.name, "created_at": self.meta.get("created_at"), "guests": self.meta.get("guests", []),
                "bytes": sum(f.stat().st_size for f in self.dir.iterdir() if f.is_file()),
                "save_seconds": self.meta.get("save_seconds")}


def _check_name(name: str) -> str:
    if not LAB_NAME.fullmatch(name):
        raise UsageError(f"invalid checkpoint name {name!r} ({LAB_NAME_RULE})")
    return name


def _root(state: LabState) -> Path:
    return state.path / "checkpoints"


def _map(fn: Callable[[str], Any], names: list[str]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        return list(pool.map(fn, names))


def save(lab: str, name: str) -> Checkpoint:
    """Pause every guest, save each, resume them all; the checkpoint (an older one of that name
    is replaced).

    :raise LabStateError: lab not up. :raise UsageError: bad name or backend.
    :raise MachineError: when a guest's state cannot be saved (every guest runs on).
    """
    _check_name(name)
    with lab_lock(lab):
        state = LabState.load(lab)
        if get_backend(state.backend).states_on_hosts:
            return _save_on_hosts(state, name)
        backend = need_restart(state, "a checkpoint")
        root = ensure_private_dir(_root(state))
        final = root / name
        names = list(state.guests)
        t0 = time.monotonic()
        # QEMU cannot save a guest with a 9p share mounted: unmounted around the save
        _map(lambda g: umount_shares(state.endpoint(g), g, _shares(state, g)), names)
        try:
            with build_into(final) as work:
                _map(lambda g: backend.suspend(state.guests[g]), names)  # one instant for all

                def one(g: str) -> None:
                    rec = state.guests[g]
                    save_state(rec.qmp, work / f"{g}.state")
                    shutil.copyfile(Path(rec.dir) / "disk.qcow2", work / f"{g}.qcow2")

                _map(one, names)
                atomic_write(work / META, json.dumps({
                    "lab": state.lab, "name": name, "guests": names,
                    "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "save_seconds": round(time.monotonic() - t0, 2)}, indent=2) + "\n")
        except OSError as exc:
            raise MachineError(f"saving checkpoint {name} of lab {state.lab} failed: {exc}") from exc
        finally:
            for g in names:
                with contextlib.suppress(LabctlError):
                    backend.resume(state.guests[g])
            _map(lambda g: mount_shares(state.endpoint(g), g, _shares(state, g)), names)
        return _load(final)


def _shares(state: LabState, guest: str) -> tuple[Share, ...]:
    return shares_of(state.guest_spec(guest))


def restore(lab: str, name: str, on_moved: Callable[[str], None] | None = None) -> float:
    """Every guest back to the checkpoint's instant (restarted, loaded paused, then resumed
    together and their clocks set); seconds taken. ``on_moved(message)`` is told about a guest
    whose SSH port was taken while its QEMU restarted (it is back on a new one, its files updated).

    :raise LabStateError: lab not up, or no such checkpoint. :raise GuestError: a guest not back.
    """
    _check_name(name)
    with lab_lock(lab):
        state = LabState.load(lab)
        if get_backend(state.backend).states_on_hosts:
            return _restore_on_hosts(state, find(state, name))
        backend = need_restart(state, "a checkpoint")
        ckpt = find(state, name)
        missing = [g for g in state.guests if not (ckpt.dir / f"{g}.state").is_file()]
        if missing:
            raise LabStateError(f"checkpoint {name} of lab {state.lab} has no guest {missing[0]}")
        names = list(state.guests)
        t0 = time.monotonic()
        moves: list[sshport.Moved] = []

        def one(g: str) -> None:
            rec = state.guests[g]
            port = rec.ssh_port
            disk = Path(rec.dir) / "disk.qcow2"
            rec = state.guests[g] = restart(backend, rec, lambda: copy_disk(ckpt.dir / f"{g}.qcow2", disk),
                                            new_console=False)
            if rec.ssh_port != port:
                moves.append(sshport.repin(state.path, g, port, rec.ssh_port))
            with open(rec.console, "a") as f:
                f.write(f"labctl: restored checkpoint {name}\n")
            load_saved_state(Path(rec.qmp), ckpt.dir / f"{g}.state", paused=True)

        try:
            _map(one, names)
        finally:
            state.save()
            tell_moves(state, moves, on_moved)
        _map(lambda g: backend.resume(state.guests[g]), names)  # together, as they were saved
        set_clocks(state, names)
        _map(lambda g: wait_ssh(state.endpoint(g), 30.0), names)
        _map(lambda g: mount_shares(state.endpoint(g), g, _shares(state, g)), names)
        return round(time.monotonic() - t0, 2)


def _label(name: str) -> str:
    return f"ckpt-{name}"


def _save_on_hosts(state: LabState, name: str) -> Checkpoint:
    """Guests of a backend that saves states on their hosts (libvirt): every guest paused at one
    instant, each saved on its own host by the backend (machine and disk), then all resumed
    together; only ``meta.json`` is here."""
    backend = get_backend(state.backend)
    refuse_incomplete(state)
    names = list(state.guests)
    final = ensure_private_dir(_root(state)) / name
    t0 = time.monotonic()
    _map(lambda g: backend.suspend(state.guests[g]), names)  # one instant for all
    try:
        with build_into(final) as work:
            def one(g: str) -> None:
                state.guests[g] = backend.save_state(state.guests[g], _label(name), resume=False)

            _map(one, names)
            atomic_write(work / META, json.dumps({
                "lab": state.lab, "name": name, "guests": names, "on_hosts": True,
                "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "save_seconds": round(time.monotonic() - t0, 2)}, indent=2) + "\n")
    finally:
        state.save()
        for g in names:
            with contextlib.suppress(LabctlError):
                backend.resume(state.guests[g])
    return _load(final)


def _restore_on_hosts(state: LabState, ckpt: Checkpoint) -> float:
    """Guests back to a checkpoint their backend saved on their hosts: each restored paused on its
    host, then all resumed (their clocks over SSH: no agent)."""
    backend = get_backend(state.backend)
    label = _label(ckpt.name)
    missing = [g for g in state.guests if not backend.has_state(state.guests[g], label)]
    if missing:
        raise LabStateError(f"checkpoint {ckpt.name} of lab {state.lab} has no guest {missing[0]}")
    names = list(state.guests)
    t0 = time.monotonic()

    def one(g: str) -> None:
        mux.close(Path(state.guests[g].dir))  # its kept connection goes with the machine under it
        state.guests[g] = backend.restore_state(state.guests[g], label, fresh_console=False, resume=False)
        with open(state.guests[g].console, "a") as f:
            f.write(f"labctl: restored checkpoint {ckpt.name}\n")

    try:
        _map(one, names)
    finally:
        state.save()
    _map(lambda g: backend.resume(state.guests[g]), names)  # together, as they were saved
    _map(lambda g: wait_ssh(state.endpoint(g), 30.0, set_clock=True), names)  # the clock: no agent
    return round(time.monotonic() - t0, 2)


def _load(d: Path) -> Checkpoint:
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, ValueError):
        meta = {}
    return Checkpoint(d.name, d, cast(CheckpointMeta, meta) if isinstance(meta, dict) else {})  # as written above


def find(state: LabState, name: str) -> Checkpoint:
    d = _root(state) / name
    if not (d / META).is_file():
        have = ", ".join(c.name for c in list_all(state)) or "none"
        raise LabStateError(f"lab {state.lab} has no checkpoint {name!r}", hint=f"its checkpoints: {have}")
    return _load(d)


def list_all(state: LabState) -> list[Checkpoint]:
    root = _root(state)
    if not root.is_dir():
        return []
    return sorted((_load(d) for d in root.iterdir() if (d / META).is_file()),
                  key=lambda c: str(c.meta.get("created_at", "")))


def delete(lab: str, name: str) -> None:
    _check_name(name)
    with lab_lock(lab):
        state = LabState.load(lab)
        ckpt = find(state, name)
        backend = get_backend(state.backend)
        if backend.states_on_hosts:  # its files are on the guests' hosts
            for g, rec in state.guests.items():
                if backend.has_state(rec, _label(name)):
                    state.guests[g] = backend.forget_state(rec, _label(name))
            state.save()
        shutil.rmtree(ckpt.dir)
