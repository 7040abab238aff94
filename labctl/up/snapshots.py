"""Post-boot snapshots: a guest right after its first boot (and its ``setup``), kept so that a
later ``up`` restores it instead of booting (warm start) and ``labctl reset`` puts it back.

::

    <cache>/snapshots/<key>/
        state          QEMU's migration stream: device state only (x-ignore-shared; read by every restore)
        memory         the guest's RAM at that instant (0600, sparse): every restored guest maps it
                       privately, copy-on-write (labctl.backends.qemu.clone), so a room of guests
                       restored from it shares one page cache copy of it
        console.log    the guest's console up to that instant (its boot), the start of a restored one's
        disk.qcow2     the guest's disk overlay at that instant (backing: the image's root file
                       system); each restored guest gets its own overlay on top of it
        meta.json      guest, READY-line drivers, when, sizes

The key hashes everything that shapes the guest: its resolved definition
(NICs, MACs, addresses, memory, setup), the QEMU command line with the run's
paths and ports (and what QEMU does on a panic) taken out, the image, the kernel, the QEMU and labctl
versions. Instances of one lab share its snapshots (read-only); a changed
lab has other keys, so its old snapshots are simply not found. When a
guest's snapshot is taken, that lab's guest keeps its two newest and older
ones go (:func:`prune_older`); ``labctl snapshot prune`` removes every one no
lab uses. A snapshot a running QEMU holds (a restored guest's disk sits on
it) is never removed.

Only the qemu backend has snapshots: QEMU saves state to a file descriptor
passed over its QMP socket (its sandbox forbids ``exec:`` migration, and
QEMU 7.2 has no ``file:``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl import __version__
from labctl.backends import GUEST_MEMORY, Backend, GuestPlan, qmp_execute, save_state
from labctl.errors import LabctlError, MachineError
from labctl.paths import InDir, atomic_write, build_into, cache_dir, exclusive
from labctl.proc import run

FORMAT = "4"  # bump when what a snapshot holds changes (2: booted with a throwaway host key; 3: a standby sshd;
#                4: RAM as a file mapped by every restore, and a vmgenid device)
STATE, DISK, META, CONSOLE, MEMORY = "state", "disk.qcow2", "meta.json", "console.log", GUEST_MEMORY
PAGE = 4096


def snapshots_root() -> Path:
    return cache_dir() / "snapshots"


@dataclass(frozen=True)
class Snapshot:
    """A guest's post-boot snapshot (complete once ``meta.json`` exists)."""

    dir: Path

    @property
    def key(self) -> str:
        return self.dir.name

    state = InDir(STATE)
    disk = InDir(DISK)
    console = InDir(CONSOLE)
    memory = InDir(MEMORY)

    @property
    def meta(self) -> dict[str, Any]:
        try:
            data = json.loads((self.dir / META).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def drivers(self) -> dict[str, str]:
        """NIC -> driver, as the guest's READY line said at its boot."""
        d = self.meta.get("drivers")
        return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else {}

    def complete(self) -> bool:
        return (self.dir / META).is_file() and self.state.is_file() and self.disk.is_file() \
            and self.memory.is_file()

    def memory_problem(self) -> str | None:
        """Why the snapshot's memory file must not be mapped (None: it is as it was saved).

        A restored guest maps it privately: a file truncated under it would make QEMU fault on
        the pages gone, and one rewritten would hand the guest other RAM. So before each restore
        it must be the same file (device, inode, modification time) of the size it was saved
        with, a regular file of this user's, readable and writable by nobody else.
        """
        ident = self.meta.get("memory")
        if not isinstance(ident, dict):
            return f"its meta.json records no memory file ({self.dir / META})"
        try:
            st = os.lstat(self.memory)
        except OSError as exc:
            return f"its memory file {self.memory} is gone ({exc.strerror})"
        if not stat.S_ISREG(st.st_mode):
            return f"its memory file {self.memory} is not a regular file"
        if st.st_uid != os.geteuid():
            return f"its memory file {self.memory} belongs to uid {st.st_uid}, not to you"
        if st.st_mode & 0o077:
            return f"its memory file {self.memory} is open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
        if st.st_size != ident.get("bytes"):
            return (f"its memory file {self.memory} is {st.st_size} bytes, but it was saved with "
                    f"{ident.get('bytes')}: it was truncated or replaced")
        if [st.st_dev, st.st_ino, st.st_mtime_ns] != [ident.get("dev"), ident.get("ino"), ident.get("mtime_ns")]:
            return f"its memory file {self.memory} was changed or replaced since it was saved"
        return None


_TAP_FDS = re.compile(r"\b(fds?)=[0-9:?]+")


def _without_actions(argv: list[str]) -> list[str]:
    """``argv`` without its ``-action WHAT=HOW`` pairs."""
    return [a for i, a in enumerate(argv) if a != "-action" and (i == 0 or argv[i - 1] != "-action")]


def key(plan: GuestPlan, backend: Backend) -> str:
    """The snapshot key of a guest on ``backend`` (see the module's docstring)."""
    run_dir = str(plan.dir.parent.parent)
    # The run directory and the lab's NAME@INSTANCE (in QEMU's process name) are taken out:
    # every instance of a lab restores from the same snapshots.
    # A tap's queues are descriptors opened anew for each QEMU: their numbers are no part of it.
    # What QEMU does when the guest panics (-action) is no part of the machine's state.
    argv = [_TAP_FDS.sub(r"\1=@", a) if a.startswith("tap,") else a
            for a in (a.replace(run_dir, "@RUN").replace(f"labctl-{plan.lab}-", "labctl-@LAB-")
                      for a in _without_actions(backend.command(dataclasses.replace(plan, warm=False, ssh_port=0))))]
    data = [FORMAT, __version__, backend.emulator_version(), plan.image.key, plan.kernel.key, plan.accel,
            plan.guest.to_dict(), argv]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:20]


def find(snapshot_key: str | None) -> Snapshot | None:
    """The complete snapshot of that key, or None."""
    if not snapshot_key:
        return None
    snap = Snapshot(snapshots_root() / snapshot_key)
    return snap if snap.complete() else None


def find_restorable(snapshot_key: str | None) -> Snapshot | None:
    """What a restore of that key is to use: the complete snapshot, or one whose memory file alone
    is gone (its ``meta.json``, state and disk there: :meth:`Snapshot.memory_problem` says why it
    cannot be restored); None when there is none (the guest boots instead)."""
    if not snapshot_key:
        return None
    snap = Snapshot(snapshots_root() / snapshot_key)
    return snap if (snap.dir / META).is_file() and snap.state.is_file() and snap.disk.is_file() else None


def _lock(snapshot_key: str) -> contextlib.AbstractContextManager[None]:
    return exclusive(snapshots_root() / f".{snapshot_key}.lock")


def take(qmp: Path, overlay: Path, snapshot_key: str, meta: dict[str, Any], console: Path | None = None,
         memory: Path | None = None) -> Snapshot:
    """Snapshot a running guest (paused for the moment it takes, then resumed): its device state,
    and its RAM copied from ``memory`` (the file it maps shared; default: ``memory`` beside ``overlay``).

    Another labctl taking the same snapshot meanwhile makes this one a no-op.

    :raise MachineError: when QEMU cannot save the state (the guest runs on).
    """
    final = snapshots_root() / snapshot_key
    with _lock(snapshot_key):
        if Snapshot(final).complete() and Snapshot(final).memory_problem() is None:
            return Snapshot(final)
        try:
            with build_into(final) as work:
                info = save_state(qmp, work / STATE, ignore_shared=True)
                # Paused: the RAM file is what the device state expects, the overlay what the
                # saved RAM (its page cache) expects on disk.
                copy_sparse(memory or overlay.with_name(MEMORY), work / MEMORY)
                shutil.copyfile(overlay, work / DISK)
                os.chmod(work / DISK, 0o400)
                if console is not None and console.is_file():
                    shutil.copyfile(console, work / CONSOLE)
                os.chmod(work / STATE, 0o400)
                atomic_write(work / META, json.dumps({
                    **meta, "created_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "labctl_version": __version__,
                    "state_bytes": (work / STATE).stat().st_size, "disk_bytes": (work / DISK).stat().st_size,
                    "memory": _identity(final / MEMORY, work / MEMORY),
                    "save_ms": info.get("total-time"),
                }, indent=2) + "\n")
        except OSError as exc:
            raise MachineError(f"saving the snapshot {snapshot_key} failed: {exc}") from exc
        finally:
            with contextlib.suppress(LabctlError):
                qmp_execute(qmp, "cont")
    return Snapshot(final)


CLONES = "clones.json"  # what a guest restored from the snapshot was measured to hold (labctl.up.capacity)


def private_kib(pid: int) -> int:
    """The process's anonymous memory in KiB (``Anonymous`` in /proc/PID/smaps_rollup; 0 when it cannot
    be read): a restored guest's own copy-on-write pages, QEMU's heap and its translated code, without
    the snapshot's memory file it maps (page cache every clone of it shares, even while only one
    maps a page and ``Private_Clean`` or ``Private_Dirty`` count it)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def record_clone(snap: Snapshot, pid: int) -> None:
    """Record what the guest restored from ``snap`` (QEMU ``pid``) holds now, when it is more than
    recorded (the capacity estimate's figure when no clone of it is up)."""
    kib = private_kib(pid)
    if kib <= recorded_clone_kib(snap):
        return
    with contextlib.suppress(OSError):
        atomic_write(snap.dir / CLONES, json.dumps({"private_kib": kib, "measured_at": datetime.datetime.now(
            datetime.UTC).isoformat(timespec="seconds")}) + "\n", 0o600)


def recorded_clone_kib(snap: Snapshot) -> int:
    try:
        data = json.loads((snap.dir / CLONES).read_text())
        return int(data.get("private_kib", 0)) if isinstance(data, dict) else 0
    except (OSError, ValueError, TypeError):
        return 0


def copy_sparse(src: Path, dest: Path) -> None:
    """``dest`` (new, 0600) a copy of ``src`` of the same size in which only the pages that are not
    zero take room (the rest are holes: a guest's untouched or freed RAM costs no disk and no page cache)."""
    zero = bytes(PAGE)
    fd_in = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd_in).st_size
            pos = 0
            while pos < size:
                try:
                    pos = os.lseek(fd_in, pos, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(fd_in, pos, os.SEEK_HOLE)
                while pos < end:
                    chunk = os.pread(fd_in, min(1 << 21, end - pos), pos)
                    if not chunk:
                        break
                    if chunk.count(0) != len(chunk):
                        for off in range(0, len(chunk), PAGE):
                            page = chunk[off:off + PAGE]
                            if page != zero[:len(page)]:
                                os.pwrite(fd_out, page, pos + off)
                    pos += len(chunk)
            os.ftruncate(fd_out, size)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _identity(final: Path, built: Path) -> dict[str, int]:
    """What :meth:`Snapshot.memory_problem` compares: the file's size, device, inode and time (a
    rename into ``final`` keeps them)."""
    st = os.stat(built)
    return {"bytes": st.st_size, "dev": st.st_dev, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}


EMPTY_OVERLAY = "overlay.qcow2"  # an empty overlay on the snapshot's disk: each restore's is a copy of it


def restored_overlay(snap: Snapshot, overlay: Path) -> None:
    """``overlay`` a fresh copy-on-write overlay on the snapshot's disk: a copy of the empty one kept
    beside it (made by ``qemu-img`` at the first restore; a copy spares each later restore that
    process: its header names the same backing file whoever restores it)."""
    empty = snap.dir / EMPTY_OVERLAY
    try:
        st = os.lstat(empty)
        usable = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    except FileNotFoundError:
        usable = False
    if not usable:
        tmp = snap.dir / f".{EMPTY_OVERLAY}.{os.getpid()}"
        new_overlay(snap.disk, tmp)
        os.chmod(tmp, 0o400)
        os.replace(tmp, empty)
    overlay.unlink(missing_ok=True)
    shutil.copyfile(empty, overlay)
    os.chmod(overlay, 0o600)


def new_overlay(backing: Path, overlay: Path, backing_format: str = "qcow2") -> None:
    """A fresh copy-on-write overlay on ``backing`` (a snapshot's disk, or the image's root file system)."""
    overlay.unlink(missing_ok=True)
    run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(backing), "-F", backing_format, str(overlay)],
        timeout=60)


def list_all() -> list[Snapshot]:
    root = snapshots_root()
    return sorted((Snapshot(d) for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")),
                  key=lambda s: s.dir.name) if root.is_dir() else []


F_OFD_GETLK = 36  # <linux/fcntl.h>; Python's fcntl module has no name for it
_FLOCK = "hhqqi"  # struct flock: l_type, l_whence, l_start, l_len, l_pid


def held_open(snap: Snapshot) -> bool:
    """Whether some process holds the snapshot's disk as a backing file.

    QEMU locks the images it opens (OFD locks on bytes 100+), backing files
    included, so a guest restored from the snapshot, whoever's and whichever
    state directory it belongs to, shows up here. A test lock, not a taken one.
    """
    try:
        fd = os.open(snap.disk, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        probe = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(32, b"\0")
        got = fcntl.fcntl(fd, F_OFD_GETLK, probe)
        return bool(struct.unpack_from(_FLOCK, got)[0] != fcntl.F_UNLCK)
    except OSError:
        return False
    finally:
        os.close(fd)


def in_use(recorded: set[str]) -> set[str]:
    """Keys of the snapshots that must stay: those ``recorded`` (the labs that are up restored
    or took them; their checkpoints' disks sit on them) and those a running QEMU holds."""
    return set(recorded) | {s.key for s in list_all() if s.key not in recorded and held_open(s)}


def prune(keep: set[str]) -> list[Snapshot]:
    """Remove every snapshot whose key is not in ``keep`` (and unfinished ones) and that no
    process holds open; the removed ones."""
    gone = [s for s in list_all() if s.key not in keep and not held_open(s)]
    for s in gone:
        shutil.rmtree(s.dir, ignore_errors=True)
    return gone


def remove_lab(lab: str) -> list[Snapshot]:
    """Remove every snapshot of the lab named ``lab`` that no process holds open; the removed ones."""
    gone = [s for s in list_all() if s.meta.get("lab") == lab and not held_open(s)]
    for s in gone:
        shutil.rmtree(s.dir, ignore_errors=True)
    return gone


KEEP_PER_GUEST = 2  # a lab's guest keeps its newest snapshots: two kernels (A/B) stay warm


def prune_older(taken: Snapshot, keep_keys: set[str], keep: int = KEEP_PER_GUEST) -> list[Snapshot]:
    """After ``taken``: remove the older snapshots of the same lab and guest beyond the newest
    ``keep`` (``taken`` among them), except those in ``keep_keys`` or held open; the removed ones.

    Each changed lab file or rebuilt kernel makes new keys, and each snapshot is
    ~100 MB; without this a kernel developer's loop fills the disk.
    """
    lab, guest = taken.meta.get("lab"), taken.meta.get("guest")
    if not lab or not guest:
        return []
    same = [s for s in list_all() if s.complete() and s.meta.get("lab") == lab and s.meta.get("guest") == guest]
    same.sort(key=lambda s: (s.key == taken.key, str(s.meta.get("created_at") or "")), reverse=True)
    gone = [s for s in same[keep:] if s.key not in keep_keys and not held_open(s)]
    for s in gone:
        shutil.rmtree(s.dir, ignore_errors=True)
    return gone
