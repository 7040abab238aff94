"""A guest's SSH port across a restart of its QEMU (``reset``, checkpoint restore).

QEMU 7.2 cannot keep the port: its slirp ``hostfwd`` binds an address (it
takes no descriptor), and a saved state can only be loaded by a new QEMU
process (``-incoming``), so the old one's listening socket closes before the
new one binds. Another local user may bind 127.0.0.1:PORT in between. Then
the new QEMU exits at start (:class:`PortTaken`), and labctl starts it on a
new free port instead of leaving the guest stopped: the lab's state, its
``known_hosts`` (which pins ``[127.0.0.1]:PORT``) and the student's handout
(``ssh_config`` and ``known_hosts``, for an instance of a class) are updated,
and the caller says so (:func:`message`). ``labctl ssh-config`` reads the
state, so it names the new port too.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labctl.backends import Backend, GuestRecord
from labctl.errors import LabctlError, PortTaken
from labctl.net import free_port
from labctl.paths import atomic_write
from labctl.up import close_taps, reopen_taps

ATTEMPTS = 3
_LOCK = threading.Lock()  # guests of one lab restart in parallel; they share its known_hosts


@dataclass(frozen=True)
class Moved:
    """A guest that came back on a new SSH port: which files now name it."""

    guest: str
    old: int
    new: int
    updated: tuple[str, ...]  # files rewritten (the lab's known_hosts, a handout's ssh_config...)
    failed: str = ""  # why a file could not be updated ("" when all were)


def hostfwd(port: int) -> str:
    """The ``hostfwd`` rule of a guest's management NIC (see labctl.backends.qemu.argv)."""
    return f"hostfwd=tcp:127.0.0.1:{port}-:22"


def with_port(rec: GuestRecord, port: int) -> GuestRecord:
    """``rec`` with its SSH port (in its QEMU command line too) changed to ``port``."""
    old = hostfwd(rec.ssh_port)
    if not any(old in a for a in rec.argv):
        raise LabctlError(f"guest {rec.name}: its QEMU command line has no {old}")
    argv = [a.replace(old, hostfwd(port)) for a in rec.argv]
    return dataclasses.replace(rec, ssh_port=port, argv=argv)


def restart(backend: Backend, rec: GuestRecord, incoming: bool,
            pick: Callable[[], int] = free_port) -> tuple[GuestRecord, int | None]:
    """Start the guest's stopped QEMU again (:meth:`labctl.backends.Backend.restart`); when its SSH port was
    taken meanwhile, on a new one (``pick``). The new record, and the old port when it moved.

    :raise PortTaken: when every new port was taken too. :raise MachineError: QEMU failed otherwise.
    """
    first = rec.ssh_port
    # a guest on tap networks gets its taps again (QEMU took its queues with it when it stopped)
    opened = reopen_taps(rec.extra, Path(rec.dir).parent.parent)
    try:
        for attempt in range(ATTEMPTS):
            try:
                started = backend.restart(rec, incoming, opened)
                return started, (first if started.ssh_port != first else None)
            except PortTaken:
                if attempt == ATTEMPTS - 1:
                    raise
                rec = with_port(rec, pick())
    finally:
        for fds in opened.values():
            close_taps(fds)  # QEMU holds them now (or failed)
    raise AssertionError("unreachable")


def repin(lab_dir: Path, guest: str, old: int, new: int) -> Moved:
    """After ``guest`` moved from port ``old`` to ``new``: the lab's ``known_hosts`` and, for a
    class's instance (``LAB@STUDENT``), the student's handout name the new port."""
    updated: list[str] = []
    failed = ""
    with _LOCK:
        known = lab_dir / "known_hosts"
        try:
            lines = known.read_text().splitlines(keepends=True)
            before, after = f"[127.0.0.1]:{old} ", f"[127.0.0.1]:{new} "
            atomic_write(known, "".join(after + ln[len(before):] if ln.startswith(before) else ln
                                        for ln in lines), 0o600)
            updated.append(str(known))
        except OSError as exc:
            failed = f"{known}: {exc}"
    return Moved(guest, old, new, tuple(updated), failed)


def update_handout(moved: Moved, lab: str) -> Moved:
    """For an instance of a class (``LAB@STUDENT``, recorded by ``class up``): its handout's
    ``ssh_config`` and ``known_hosts`` written again from the lab's state (which must name the
    new port: call after the state is saved)."""
    if "@" not in lab:
        return moved
    name, student = lab.split("@", 1)
    import labctl.training.handout as handout  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
    from labctl.state import LabState
    from labctl.training.classroom import ClassRecord

    try:
        record = ClassRecord.load(name)
    except LabctlError:
        return moved  # not a class's instance
    if student not in record.students:
        return moved
    directory = record.handout(student)
    config = directory / handout.SSH_CONFIG
    if not config.is_file():
        return moved
    try:
        with _LOCK:
            state = LabState.load(lab)
            atomic_write(directory / handout.KNOWN_HOSTS, (state.path / "known_hosts").read_bytes(), 0o644)
            text = handout.render(handout.lab_entries(state), f"lab {state.lab} ({student})",
                                  key=directory / handout.KEY, known_hosts=directory / handout.KNOWN_HOSTS)
            atomic_write(config, text, 0o644)
        return dataclasses.replace(moved, updated=(*moved.updated, str(config)))
    except (OSError, LabctlError) as exc:
        return dataclasses.replace(moved, failed=moved.failed or f"{config}: {exc}")


def message(lab: str, moved: Moved) -> str:
    """What the user is told about a guest that moved."""
    files = ", ".join(moved.updated) or "no file"
    text = (f"guest {moved.guest} of lab {lab}: its SSH port 127.0.0.1:{moved.old} was taken by another "
            f"process while its QEMU restarted; it now listens on 127.0.0.1:{moved.new} "
            f"(updated: {files}; 'labctl ssh-config {lab}' names the new port)")
    if moved.failed:
        text += f"; could not update {moved.failed}: give the student the new port"
    return text
