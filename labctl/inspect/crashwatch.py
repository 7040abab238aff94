"""A vmcore of every crash while labctl is watching a lab: the guest's memory dumped when its kernel
panics or oopses, before anything resets or stops it, and drgn's view of it beside.

The qemu backend starts QEMU with ``-action panic=pause``: a kernel that panics tells QEMU through
its pvpanic device and QEMU pauses the machine (QMP status ``guest-panicked``) instead of ending,
so its memory is still there. :class:`CrashWatch` reads the consoles of a lab's guests four times
a second while a run, a check or an ``up`` goes on; when one shows an oops, a BUG or a panic it
waits for the machine to pause (a panic) or for the console to stay quiet for a second (an oops
the kernel survives: the vmcore is taken then, at the oops, and the guest runs on after the ~2 s
pause of the dump), then :func:`capture_crash` writes into the guest's directory of the bundle:

* ``vmcore`` (then ``vmcore-2``...): compressed kdump, 0600, what ``labctl dump`` writes
  (:mod:`.dump`); at most :data:`MAX_PER_GUEST` of one guest in one watch;
* ``vmcore.json``: drgn's summary of it (:mod:`.digest`): the crashing task's stack with each
  frame's local variables, each lab NIC's netdev state, the kernel log.

A panicked guest's QEMU is then stopped (``stop_panicked``), as it ended by itself before: what
runs next (the step's other phases, ``status``, ``reset``) sees a guest that crashed and is gone.
A guest whose QEMU ended at the panic (a kernel without a pvpanic driver reboots, and ``-no-reboot``
ends QEMU) and a backend whose guests labctl cannot dump (:attr:`~labctl.backends.Backend.memory_dumps`)
leave a record saying why there is no vmcore.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from labctl.backends import LabState
from labctl.debug import CRASH_MARKERS, oops_titles
from labctl.errors import LabctlError
from labctl.inspect.dump import take_vmcore
from labctl.inspect.guest_target import guest_target
from labctl.inspect.summary import vmcore_summary
from labctl.paths import atomic_write

log = logging.getLogger(__name__)

POLL = 0.25  # s between two looks at the consoles
SETTLE = 1.0  # s of a quiet console after an oops that did not pause the machine
PANIC_WAIT = 5.0  # s an oops may take to become a panic (the machine pauses) before it counts as survived
MAX_PER_GUEST = 3
PANICKED = "guest-panicked"
KEEP = 4096  # bytes of a console kept between two looks (a marker cut in two is found whole)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def core_names(n: int) -> tuple[str, str]:
    """The file names of a guest's ``n``-th vmcore of a run and of its summary."""
    base = "vmcore" if n == 1 else f"vmcore-{n}"
    return base, f"{base}.json"


class VmcoreRecord(TypedDict, total=False):
    """A guest's crash during the run (:func:`capture_crash`): its vmcore and drgn's summary of it
    (the paths where they were written; the bundle's record has them relative to the bundle,
    :func:`labctl.bundle.write.vmcore_record`); ``error`` says why either is missing."""

    guest: str
    cause: str  # panic, oops
    when: str  # what ran: up, step NAME (VARIANT), check NAME
    title: str  # the oops's title
    seen_at: str
    file: str | None  # guests/<guest>/vmcore: kdump, 0600
    summary_file: str | None  # guests/<guest>/vmcore.json: labctl.inspect.digest's summary
    error: str | None
    format: str
    size: int
    release: str
    build_id: str
    dump_s: float
    paused_s: float
    summary_s: float
    ready_after_s: float  # from the crash seen on the console to the summary written


def capture_crash(state: LabState, guest: str, where: Path, n: int = 1, *, when: str, cause: str | None = None,
                  nics: Sequence[str] | None = None, title: str | None = None, seen: float | None = None
                  ) -> VmcoreRecord:
    """The guest's ``n``-th vmcore and drgn's summary of it, written into ``where`` (made when missing);
    its record (``error`` says what failed: a vmcore without a summary is still a vmcore).

    ``cause``: panic or oops (default: panic when QEMU holds the guest paused on one); ``title``
    (default: the last oops's on its console); ``seen``: when the crash was noticed
    (``time.monotonic()``), for ``ready_after_s``.
    """
    t0 = time.monotonic() if seen is None else seen
    if cause is None:
        cause = "panic" if _run_state(state, guest) == PANICKED else "oops"
    if title is None:
        titles = oops_titles(Path(state.guests[guest].console).read_text(errors="replace")) \
            if Path(state.guests[guest].console).is_file() else []
        title = titles[-1] if titles else ""
    core_name, summary_name = core_names(n)
    rec: VmcoreRecord = {"guest": guest, "cause": cause, "when": when, "title": title, "seen_at": _now(),
                           "file": str(where / core_name), "summary_file": None, "error": None}
    try:
        target = guest_target(state, guest)
        where.mkdir(parents=True, exist_ok=True)
        core = take_vmcore(target, where / core_name)
    except LabctlError as exc:
        rec["file"], rec["error"] = None, f"no vmcore: {exc.message}"
        return rec
    rec["format"], rec["size"], rec["release"], rec["build_id"] = core.format, core.size, core.release, core.build_id
    rec["dump_s"], rec["paused_s"] = round(core.seconds, 3), round(core.paused_seconds, 3)
    t1 = time.monotonic()
    try:
        digest = vmcore_summary(where / core_name, nics)
        # the kernel log and the stack's locals: as private as the vmcore and the console log
        atomic_write(where / summary_name, json.dumps(digest, indent=1, default=str) + "\n", 0o600)
        rec["summary_file"] = str(where / summary_name)
    except LabctlError as exc:
        rec["error"] = f"no summary: {exc.message}"
    rec["summary_s"], rec["ready_after_s"] = round(time.monotonic() - t1, 3), round(time.monotonic() - t0, 3)
    return rec


@dataclass
class _Console:
    """What the watch knows of one guest's console: how far it read, what it saw."""

    path: Path
    offset: int
    tail: bytes = b""
    marker_at: float | None = None  # when a crash marker was first seen, not yet captured
    grew_at: float = 0.0
    text: bytes = b""  # the console from the marker on, for the crash's title
    taken: int = 0
    done: bool = False  # the guest is gone: nothing more to watch


@dataclass
class CrashWatch:
    """Watches the consoles of ``state``'s guests from now on (see the module docstring).

    ``where(guest)``: the directory of the guest's vmcores; ``nics``: guest -> the lab NICs its
    summary shows; ``on_taken(record)`` is told of each crash (a vmcore or why there is none), from
    the watch's thread; ``when`` names what runs (a step...), set by the caller as it goes on.
    """

    state: LabState
    where: Callable[[str], Path]
    nics: Mapping[str, Sequence[str]] = field(default_factory=dict)
    on_taken: Callable[[VmcoreRecord], None] | None = None
    stop_panicked: bool = True
    when: str = ""
    records: list[VmcoreRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._consoles = {g: _Console(Path(rec.console), _size(Path(rec.console)))
                          for g, rec in self.state.guests.items()}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="labctl-crashwatch", daemon=True)

    def start(self) -> CrashWatch:
        self._thread.start()
        return self

    def stop(self) -> list[VmcoreRecord]:
        """One last look (a crash seen now is still captured), then the watch ends; every record."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return list(self.records)

    def busy(self) -> bool:
        """Whether a crash was seen and is not captured yet."""
        return any(c.marker_at is not None for c in self._consoles.values())

    def settle(self, timeout: float = 300.0) -> None:
        """Wait while a crash seen is being captured (at most ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        while self.busy() and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _run(self) -> None:
        while True:
            last = self._stop.is_set()
            for guest, con in self._consoles.items():
                try:
                    self._look(guest, con, final=last)
                except Exception as exc:  # noqa: BLE001 - the watch must outlive one guest's trouble
                    log.warning("crash watch of guest %s: %s", guest, exc)
            if last and not self.busy():
                return
            self._stop.wait(POLL)

    def _look(self, guest: str, con: _Console, final: bool) -> None:
        if con.done:
            return
        now = time.monotonic()
        new = _read_from(con.path, con.offset)
        if new:
            con.offset += len(new)
            con.grew_at = now
            window = con.tail + new
            con.tail = window[-KEEP:]
            if con.marker_at is None and any(m in window for m in CRASH_MARKERS):
                con.marker_at, con.text = now, window
            elif con.marker_at is not None:
                con.text = (con.text + new)[-(1 << 20):]
        if con.marker_at is None:
            return
        cause = self._cause(guest, con, now, final)
        if cause is not None:
            self._take(guest, con, cause)

    def _cause(self, guest: str, con: _Console, now: float, final: bool) -> str | None:
        """``panic`` once the machine paused on it, ``oops`` once the guest survived it, ``gone`` when
        its QEMU ended, None while it is too early to say."""
        run_state = _run_state(self.state, guest)
        if run_state == PANICKED:
            return "panic"
        if run_state is None:
            return "gone"
        seen = con.marker_at if con.marker_at is not None else now
        ended = b"---[ end trace" in con.text or now - seen >= PANIC_WAIT
        return "oops" if final or (now - con.grew_at >= SETTLE and ended) else None

    def _take(self, guest: str, con: _Console, cause: str) -> None:
        seen = con.marker_at
        titles = oops_titles(con.text.decode(errors="replace"))
        title = titles[-1] if titles else ""
        rec: VmcoreRecord
        if cause == "gone":
            con.done = True
            rec = {"guest": guest, "cause": "panic", "when": self.when, "title": title, "seen_at": _now(),
                   "file": None, "summary_file": None, "error": f"no vmcore: {self._gone_reason()}"}
        elif con.taken >= MAX_PER_GUEST:
            rec = {"guest": guest, "cause": cause, "when": self.when, "title": title, "seen_at": _now(),
                   "file": None, "summary_file": None,
                   "error": f"no vmcore: {MAX_PER_GUEST} of this guest were taken already"}
        else:
            con.taken += 1
            rec = capture_crash(self.state, guest, self.where(guest), con.taken, cause=cause, when=self.when,
                          nics=self.nics.get(guest), title=title, seen=seen)
            if cause == "panic":
                con.done = True
                if self.stop_panicked:
                    _stop_guest(self.state, guest)
        con.text = con.tail = b""
        with self._lock:
            self.records.append(rec)
        con.marker_at = None
        if self.on_taken is not None:
            self.on_taken(rec)


    def _gone_reason(self) -> str:
        from labctl.backends import get_backend

        backend = get_backend(self.state.backend)
        if not backend.memory_dumps:
            return (f"the {backend.name} backend ends a panicked guest's machine, and labctl dumps only "
                    "the qemu backend's guests")
        return ("its QEMU ended at the crash (a kernel without a pvpanic driver reboots on a panic, "
                "and -no-reboot ends QEMU)")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int, limit: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit)
    except OSError:
        return b""


def _run_state(state: LabState, guest: str) -> str | None:
    """The guest's QMP run state (``running``, ``guest-panicked``...), None when its machine is gone."""
    try:
        target = guest_target(state, guest)
        return str(target.qmp("query-status").get("status"))
    except LabctlError:
        return None


def _stop_guest(state: LabState, guest: str) -> None:
    try:
        target = guest_target(state, guest)
        target.backend.kill(target.record)
    except LabctlError as exc:
        log.warning("stopping panicked guest %s: %s", guest, exc)
