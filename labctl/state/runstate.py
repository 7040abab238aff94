"""A lab's run directory and the state that lets later commands find it.

::

    <state_dir>/labs/<lab>/          mode 0700, exists while the lab is up
        state.json                   LabState below
        id_ed25519{,.pub}            the lab's client key
        known_hosts                  every guest's pinned host key
        net/                         unix sockets of the lab networks (qemu backend; the
                                     libvirt backend's are in /var/lib/libvirt/labctl-run/<lab>.net)
        switch-<n>.log               L2 switches (networks of 3+ guests)
        guests/<guest>/              console.log, qemu.log, qmp.sock, gdb.sock, qemu.pid,
                                     disk.qcow2, guest.conf, host key, owned.json (libvirt)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, cast

# Leaves only: status and exec read a lab's state without the backends, the kernels, the lab-file
# package or paramiko (tests/unit/test_cli_budget.py).
from labctl.endpoint import Endpoint
from labctl.errors import LabctlError, LabStateError
from labctl.guestrecord import GuestRecord
from labctl.names import LAB_IDENT
from labctl.paths import atomic_write, checked_dir, ensure_private_dir, remove_tree
from labctl.state.rundir import STATE, check_lab_name, labs_root, run_dir

if TYPE_CHECKING:
    from labctl.kernel import Kernel
    from labctl.lab import GuestRecord as GuestSpec
    from labctl.lab import HostRecord, LabRecord
    from labctl.net import SegmentRecord

STARTING = "starting"
UP = "up"


_HELD: dict[str, int] = {}  # labs whose lock this process holds, and how deep


@contextlib.contextmanager
def lab_lock(lab: str) -> Iterator[None]:
    """Serialise ``up``/``down``/``run`` of one lab across processes.

    Re-entrant within a process: ``labctl run`` holds the lock from ``up``
    through its steps to ``down``, and ``up`` inside it takes it again.

    :raise UsageError: for an invalid lab name. :raise LabStateError: when another labctl holds it.
    """
    check_lab_name(lab)
    if _HELD.get(lab):
        _HELD[lab] += 1
        try:
            yield
        finally:
            _HELD[lab] -= 1
        return
    root = ensure_private_dir(labs_root())
    fd = os.open(root / f".{lab}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise LabStateError(f"lab '{lab}' is busy: another labctl is bringing it up, running it "
                                "or taking it down") from exc
        _HELD[lab] = 1
        try:
            yield
        finally:
            _HELD.pop(lab, None)
    finally:
        os.close(fd)


@dataclass
class SwitchRecord:
    network: str
    pid: int
    socket: str


@dataclass
class LabState:
    """What ``up`` leaves behind for ``status``, ``down``, ``exec``..."""

    lab: str
    source: str
    dir: str
    backend: str
    accel: str
    image: dict[str, str]  # name, key, dir
    started_at: str
    guests: dict[str, GuestRecord] = field(default_factory=dict)
    switches: list[SwitchRecord] = field(default_factory=list)
    resolved: LabRecord = field(default_factory=lambda: cast("LabRecord", {}))  # the lab file, resolved (Lab.to_dict)
    drivers: dict[str, dict[str, str]] = field(default_factory=dict)
    offloads: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # guest -> VLAN NIC -> features
    ready_seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    hosts: dict[str, HostRecord] = field(default_factory=dict)  # guest -> its host (libvirt)
    networks: dict[str, SegmentRecord] = field(default_factory=dict)  # network -> mechanism, endpoints
    uploads: list[str] = field(default_factory=list)  # what up sent to hosts (images)
    kernels: dict[str, str] = field(default_factory=dict)  # guest -> its prepared kernel's directory
    snapshots: dict[str, str] = field(default_factory=dict)  # guest -> its post-boot snapshot's key (qemu)
    warm: list[str] = field(default_factory=list)  # guests restored from their snapshot instead of booted
    emulators: dict[str, str] = field(default_factory=dict)  # guest -> its QEMU's version, asked once it was up
    emulator: str = ""  # this host's QEMU's version (the bundle's when no guest's QEMU answered)
    netns: str | None = None  # the lab's network namespace (tap networks; labctl.up.taps)
    phase: str = UP  # STARTING while ``up`` runs; UP once every guest answered
    owner_pid: int = 0  # the ``labctl up`` that is bringing the lab up (while STARTING)

    @property
    def incomplete(self) -> bool:
        """True when the ``up`` that started this lab died before it finished (SIGKILL, OOM)."""
        from labctl.proc import pid_alive

        return self.phase != UP and not pid_alive(self.owner_pid)

    @property
    def path(self) -> Path:
        return Path(self.dir)

    def guest_specs(self) -> dict[str, GuestSpec]:
        """The lab file's guests as ``up`` resolved them (``resolved['guests']``, typed; none in a state
        written before they were recorded)."""
        return self.resolved.get("guests") or {}

    def guest_spec(self, name: str) -> GuestSpec | None:
        """One guest of :meth:`guest_specs`, or None."""
        return self.guest_specs().get(name)

    def kernel(self, guest: str) -> Kernel:
        """The prepared kernel ``guest`` runs (gdb, oops decoding and struct offsets read it).

        :raise LabStateError: when the lab has no such guest or no record of its kernel.
        """
        if guest not in self.kernels:
            raise LabStateError(f"lab '{self.lab}' has no kernel recorded for guest '{guest}'",
                                hint="it was brought up by an older labctl: take it down and up again")
        from labctl.kernel import Kernel

        return Kernel.at(self.kernels[guest])

    def endpoint(self, guest: str) -> Endpoint:
        """How to reach ``guest`` over SSH.

        :raise LabStateError: when the lab has no such guest.
        """
        rec = self.guests.get(guest)
        if rec is None:
            known = ", ".join(self.guests) or "none"
            raise LabStateError(f"lab '{self.lab}' has no guest '{guest}'", hint=f"guests: {known}")
        via = rec.extra.get("ssh_via")
        if not via:
            return Endpoint(guest, rec.ssh_port, self.path / "id_ed25519", self.path / "known_hosts")
        from labctl.lab import SshHop  # a remote guest's hop (libvirt)

        return Endpoint(guest, rec.ssh_port, self.path / "id_ed25519", self.path / "known_hosts",
                        via=SshHop.from_dict(via))

    def save(self) -> None:
        """Write ``state.json`` atomically (called after every guest or switch ``up`` starts)."""
        data = {k: v for k, v in self.__dict__.items() if k not in ("guests", "switches")}
        data["guests"] = {n: g.to_dict() for n, g in self.guests.items()}
        data["switches"] = [s.__dict__ for s in self.switches]
        atomic_write(self.path / STATE, json.dumps(data, indent=2) + "\n", 0o600)

    @classmethod
    def load(cls, lab: str) -> LabState:
        """The state of a lab that is up (or was being brought up).

        Keys this version does not know are ignored; a file that is not a
        state at all is an error (``down`` then removes the lab by its run directory).

        :raise LabStateError: when the lab is not up or its state cannot be read.
        """
        path = run_dir(lab) / STATE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise LabStateError(f"lab '{lab}' is not up", hint="see 'labctl status'") from exc
        except (OSError, ValueError) as exc:
            raise LabStateError(f"cannot read {path}: {exc}") from exc
        try:
            known = {f.name for f in fields(cls)}
            data = {k: v for k, v in data.items() if k in known}
            data["guests"] = {n: GuestRecord.from_dict(g) for n, g in data.get("guests", {}).items()}
            data["switches"] = [SwitchRecord(**s) for s in data.get("switches", [])]
            return cls(**data)
        except (TypeError, AttributeError, ValueError) as exc:
            raise LabStateError(f"{path} is not a labctl lab state ({exc})",
                                hint=f"'labctl down {lab}' still removes the lab") from exc


def up_labs() -> list[str]:
    """Names of labs with a run directory: real directories (not links) of this user's, named as labs.

    :raise UnsafePath: when the labs root is not safe to trust (another user's, or writable by others).
    """
    try:
        root = checked_dir(labs_root())
    except FileNotFoundError:
        return []
    euid = os.geteuid()
    names = []
    with os.scandir(root) as entries:
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == euid and LAB_IDENT.fullmatch(e.name):
                names.append(e.name)
    return sorted(names)


def recorded_snapshots() -> set[str]:
    """Keys of the post-boot snapshots the labs that are up restored from or took."""
    keys: set[str] = set()
    for name in up_labs():
        with contextlib.suppress(LabctlError, OSError, ValueError):  # an unreadable lab keeps nothing
            keys.update(LabState.load(name).snapshots.values())
    return keys


def remove_run_dir(path: Path) -> None:
    """Remove a lab's run directory, and nothing else: ``path`` must be a real
    directory of this user's directly under the labs root, named as a lab. The
    labs root is checked (:func:`labctl.paths.checked_dir`) and the removal walks
    by directory descriptors (:func:`labctl.paths.remove_tree`): no link is followed.

    :raise LabStateError: for any other path (nothing is removed).
    :raise UnsafePath: when the labs root or the directory is not safe (nothing is removed).
    """
    root = labs_root()
    if Path(os.path.abspath(path)).parent != Path(os.path.abspath(root)) or not LAB_IDENT.fullmatch(path.name):
        raise LabStateError(f"refusing to remove {path}: it is not a lab's run directory under {root}")
    if path.is_symlink():
        raise LabStateError(f"refusing to remove {path}: it is a symbolic link")
    remove_tree(root, path.name)
