"""A guest's life around its post-boot snapshot: setup and snapshot after a cold boot, restore
instead of a boot (warm start, reset), and resuming a restored guest as this lab's.

A restored guest is made indistinguishable from a booted one: QEMU loads the
state (its NICs reattach to this lab's links, its management NIC to a new
SSH port), the guest agent installs this lab's client and host keys (unless
the snapshot was made with them) and sets the wall clock, and the caller then
checks SSH with the lab's pinned keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path

from labctl.backends.monitor import load_state, qmp_execute
from labctl.errors import LabctlError
from labctl.ssh import Endpoint, Session
from labctl.up import agent, snapshots
from labctl.up.runstate import recorded_snapshots
from labctl.up.snapshots import Snapshot

AGENT_WAIT = 20.0  # the agent starts in the background at boot (it loads virtio_console first)


def run_setup(ep: Endpoint, commands: tuple[str, ...], timeout: float = 300.0) -> None:
    """Run a guest's ``setup`` commands in order, over SSH.

    :raise GuestError: when one fails (its status and the end of its output).
    """
    from labctl.errors import GuestError

    if not commands:
        return
    with Session(ep) as s:
        for i, command in enumerate(commands):
            res = s.run(command, timeout=timeout)
            if res.status != 0:
                tail = (res.stderr or res.stdout).decode(errors="replace").strip()[-500:]
                raise GuestError(f"guest {ep.guest}: setup[{i}] exited with status {res.status}: {command}"
                                 + (f"\n{tail}" if tail else ""))


def snapshot_after_boot(qmp: Path, overlay: Path, agent_socket: Path, snapshot_key: str, guest: str,
                        drivers: dict[str, str], lab: str = "") -> Snapshot | str:
    """Take the guest's post-boot snapshot; the snapshot, or why there is none (a warning)."""
    if not agent.wait_ready(agent_socket, AGENT_WAIT):
        return (f"guest {guest}: no post-boot snapshot (its agent did not answer: the kernel needs "
                "CONFIG_VIRTIO_CONSOLE); later ups boot it cold")
    try:
        snap = snapshots.take(qmp, overlay, snapshot_key, {"lab": lab, "guest": guest, "drivers": drivers,
                                                           "keys": keys_id(overlay.parent)},
                              console=overlay.parent / "console.log")
        with contextlib.suppress(OSError):  # older snapshots that stay are only disk space
            snapshots.prune_older(snap, recorded_snapshots())
        return snap
    except LabctlError as exc:
        return f"guest {guest}: no post-boot snapshot: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a snapshot is an optimisation: never fail the up for it
        return f"guest {guest}: no post-boot snapshot: {exc}"


def load(qmp: Path, state_file: Path, paused: bool = False) -> float:
    """Load a saved state into a QEMU started with ``-incoming defer`` and (unless ``paused``)
    let the guest run; seconds taken."""
    t0 = time.monotonic()
    load_state(qmp, state_file)
    if not paused:
        qmp_execute(qmp, "cont")
    return time.monotonic() - t0


def keys_id(guest_dir: Path) -> str:
    """What identifies the SSH keys a guest was given (its client key line and host public key):
    a snapshot records it, so that a guest restored into the lab that made the snapshot keeps
    its keys without sshd reloading."""
    h = hashlib.sha256()
    for name in ("authorized_keys", "ssh_host_ed25519_key.pub"):
        try:
            h.update((guest_dir / name).read_bytes())
        except OSError:
            return ""
    return h.hexdigest()[:32]


def adopt(guest_dir: Path, snap: Snapshot) -> None:
    """Make a guest restored from ``snap`` this lab's: its keys (unless the snapshot already
    holds them) and the host's time.

    :raise GuestError: when its agent does not answer.
    """
    mine = keys_id(guest_dir)
    keys = None
    if not mine or snap.meta.get("keys") != mine:
        keys = ((guest_dir / "authorized_keys").read_bytes(), (guest_dir / "ssh_host_ed25519_key").read_bytes())
    agent.adopt(guest_dir / "agent.sock", keys)


def restore_disk(snap: Snapshot, overlay: Path, console: Path | None = None) -> None:
    """The guest's disk as it was at the snapshot: a new overlay on the snapshot's; and its
    console starting with the boot the snapshot was taken after (QEMU appends to it)."""
    snapshots.new_overlay(snap.disk, overlay)
    if console is not None:
        try:
            boot = snap.console.read_bytes()
        except OSError:
            boot = b""
        when = snap.meta.get("created_at", "?")
        with open(console, "ab") as f:
            f.write(boot + (b"" if not boot or boot.endswith(b"\n") else b"\n"))
            f.write(f"labctl: restored from the post-boot snapshot {snap.key} (taken {when}); "
                    "the boot above is that one\n".encode())
