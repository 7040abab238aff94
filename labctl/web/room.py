"""What the pages show, gathered from the library: each lab instance's guests (running, crashed
with the panic line, down), the last results of its checks, when its student last typed, and
for a class, every student's row.

Everything here is blocking (state files, consoles, SSH for the checks): the application calls
it from worker threads.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from labctl.debug import CRASH_MARKERS, PANIC, console_end
from labctl.errors import LabctlError
from labctl.grading import CheckResult, CheckRow, Tally, checks_of, run_checks, summary
from labctl.live import active_captures
from labctl.net import runtime_from_state, to_svg, topology
from labctl.state import LabState, load_netstate, run_dir, up_labs
from labctl.textsafe import safe_text
from labctl.training import README, ClassRecord, class_names, reset
from labctl.up import guest_statuses
from labctl.web.progress import Progress, ProgressView

VIEW_TTL = 0.8  # seconds a look at a lab's state serves every page that asks

RUNNING, CRASHED, DOWN, STARTING = "running", "crashed", "down", "starting"
HANDOUT_LIMIT = 64 * 1024


class GuestRow(TypedDict):
    """A guest as the pages show it (``panic``: a crashed one's panic line)."""

    name: str
    state: str  # running, crashed, down, starting
    detail: str
    panic: str
    ssh: str


class PendingCheck(TypedDict):
    """A check of the lab not run yet."""

    name: str
    guest: str
    hint: str
    status: str  # "not run"


class ChecksView(Tally):
    """The lab's checks: the last results (or the checks not run yet), when they ran."""

    checks: list[CheckRow] | list[PendingCheck]
    ran_at: float
    running: bool
    error: str


class LabView(TypedDict):
    """A lab instance's state for its pages."""

    lab: str
    up: bool
    guests: list[GuestRow]
    checks: ChecksView
    last_input: float
    resetting: list[str]
    allow_reset: bool
    allow_follow: bool


class StudentRow(LabView):
    """A student's row on the trainer's page."""

    student: str


ClassView = TypedDict("ClassView", {"class": str, "allow_reset": bool, "allow_follow": bool,
                                    "students": list[StudentRow], "progress": ProgressView})


def check_row(result: CheckResult) -> CheckRow:
    r = result.to_dict()
    return {"name": r["name"], "guest": r["guest"], "status": r["status"], "passed": r["passed"],
            "exit_status": r["exit_status"], "seconds": r["seconds"], "hint": r["hint"]}


def panic_line(console: Path) -> str:
    """The console's last line naming a panic (else an oops, BUG...), controls shown escaped; '' when none."""
    text = console_end(console)
    lines = text.splitlines()
    for marker in (PANIC, *CRASH_MARKERS):
        for line in reversed(lines):
            if marker in line:
                return safe_text(line.decode(errors="replace").strip())[:300]
    return ""


def guests_of(ident: str) -> list[GuestRow]:
    """Every guest of the instance ``ident``: name, state (running, crashed, down, starting) and
    the panic line of a crashed one; [] when it is not up."""
    try:
        state = LabState.load(ident)
    except LabctlError:
        return []
    out: list[GuestRow] = []
    for g in guest_statuses(state):
        st = {"running": RUNNING, "crashed": CRASHED, "starting": STARTING}.get(g.state, DOWN)
        rec = state.guests[g.name]
        out.append({"name": g.name, "state": st, "detail": "" if st != DOWN else g.state,
                    "panic": panic_line(Path(rec.console)) if st == CRASHED else "", "ssh": g.ssh})
    return out


def topology_svg(ident: str) -> str:
    """The instance's topology picture with its live state (SVG: no scripts, no URLs)."""
    state = LabState.load(ident)
    record = load_netstate(state.path)
    runtime = runtime_from_state(state.drivers, state.networks, state.hosts,
                                 {g.name: g.state for g in guest_statuses(state)},
                                 record.impair, record.links, [c.label for c in active_captures(state)],
                                 state.offloads)
    return to_svg(topology(state.resolved, runtime))


def handout_text(record: ClassRecord, student: str) -> tuple[str, str]:
    """The student's handout README as text (the page shows it literally), and why it is not
    shown whole ('' when it is). The handout directory may be the student's own: the directory
    and the file are opened without following a link, without waiting (a FIFO), and only a
    regular file is read, its first ``HANDOUT_LIMIT`` bytes."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        dfd = os.open(record.handout(student), flags | os.O_DIRECTORY)
        try:
            fd = os.open(README, flags, dir_fd=dfd)
        finally:
            os.close(dfd)
    except FileNotFoundError:
        return "", f"no {README} in the handout directory"
    except OSError as exc:
        why = "a symbolic link" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror or str(exc)
        return "", f"the handout is not shown: {why}"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "", f"the handout is not shown: {README} is not a regular file"
        data = f.read(HANDOUT_LIMIT + 1)
    if len(data) > HANDOUT_LIMIT:
        return data[:HANDOUT_LIMIT].decode(errors="replace"), \
            f"the handout is longer than {HANDOUT_LIMIT // 1024} KiB: only its start is shown"
    return data.decode(errors="replace"), ""


@dataclass
class ChecksRun:
    at: float = 0.0
    running: bool = False
    results: list[CheckResult] = field(default_factory=list)
    error: str = ""


class Room:
    """The server's memory of the room: checks last run, last input, whether students may reset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checks: dict[str, ChecksRun] = {}
        self.last_input: dict[str, float] = {}
        self.allow_reset: dict[str, bool] = {}  # class lab -> students may reset their own guests
        self.allow_follow: dict[str, bool] = {}  # class lab -> students may follow packets on their lab
        self.resetting: dict[str, set[str]] = {}
        self.progress = Progress()
        self.views: dict[str, tuple[float, LabView]] = {}  # lab_view's last looks

    def typed(self, ident: str) -> None:
        self.last_input[ident] = time.time()

    def run_checks(self, ident: str, class_lab: str = "") -> ChecksRun:
        """Run the instance's checks now (blocking) and keep the results; for a student's instance
        of the class ``class_lab``, the class's progress notes them."""
        with self.lock:
            run = self.checks.setdefault(ident, ChecksRun())
            if run.running:
                return run
            run.running = True
        try:
            state = LabState.load(ident)
            results = run_checks(state, checks_of(state))
            with self.lock:
                self.checks[ident] = ChecksRun(time.time(), False, results)
            if class_lab:
                self._note_progress(class_lab, ident.partition("@")[2], results)
        except LabctlError as exc:
            with self.lock:
                self.checks[ident] = ChecksRun(time.time(), False, [], exc.message)
        return self.checks[ident]

    def _note_progress(self, lab: str, student: str, results: list[CheckResult]) -> None:
        try:
            record = ClassRecord.load(lab)
        except LabctlError:
            return
        if student in record.students:
            self.progress.note(lab, record.created_at, student, list(record.students),
                               [r.name for r in results], [r.name for r in results if r.passed])

    def reset(self, ident: str, guest: str) -> dict[str, float]:
        """Reset one guest of the instance (blocking)."""
        with self.lock:
            busy = self.resetting.setdefault(ident, set())
            if guest in busy:
                raise LabctlError(f"{ident} {guest} is being reset already")
            busy.add(guest)
        try:
            return reset(ident, [guest])
        finally:
            with self.lock:
                self.resetting[ident].discard(guest)

    def checks_view(self, ident: str) -> ChecksView:
        run = self.checks.get(ident)
        names: list[PendingCheck] = []
        if run is None or not run.results:
            try:
                names = [{"name": c.name, "guest": c.guest, "hint": c.hint, "status": "not run"}
                         for c in checks_of(LabState.load(ident))]
            except LabctlError:
                names = []
        results = [check_row(r) for r in run.results] if run and run.results else names
        passed: Tally = summary(run.results) if run and run.results else {"passed": 0, "total": len(names),
                                                                       "failing": [n["name"] for n in names]}
        return {"checks": results, "ran_at": run.at if run else 0, "running": bool(run and run.running),
                "error": run.error if run else "", **passed}

    def lab_view(self, ident: str, class_lab: str = "") -> LabView:
        """The lab's state for its pages, looked at once in ``VIEW_TTL`` seconds: the student's own
        pages and the trainer's row of the student share one look."""
        key = f"{ident}\0{class_lab}"
        hit = self.views.get(key)
        if hit is not None and time.monotonic() - hit[0] < VIEW_TTL:
            return hit[1]
        view = self._lab_view(ident, class_lab)
        self.views[key] = (time.monotonic(), view)
        return view

    def forget_views(self) -> None:
        """After an action (reset, checks): the next look is a fresh one."""
        self.views.clear()

    def _lab_view(self, ident: str, class_lab: str) -> LabView:
        up = run_dir(ident).is_dir()
        return {"lab": ident, "up": up, "guests": guests_of(ident) if up else [],
                "checks": self.checks_view(ident) if up else {"checks": [], "passed": 0, "total": 0,
                                                              "failing": [], "ran_at": 0, "running": False,
                                                              "error": ""},
                "last_input": self.last_input.get(ident, 0.0),
                "resetting": sorted(self.resetting.get(ident, set())),
                "allow_reset": self.allow_reset.get(class_lab, False) if class_lab else True,
                "allow_follow": self.allow_follow.get(class_lab, False) if class_lab else True}

    def class_view(self, lab: str) -> ClassView:
        record = ClassRecord.load(lab)
        students = list(record.students)
        return {"class": lab, "allow_reset": self.allow_reset.get(lab, False),
                "allow_follow": self.allow_follow.get(lab, False),
                "students": [{"student": s, **self.lab_view(record.ident(s), lab)} for s in students],
                "progress": self.progress.history(lab, record.created_at).view(students)}

    def labs(self) -> list[str]:
        """Every lab of this user's that is up (instances included)."""
        return up_labs()

    def classes(self) -> list[str]:
        return class_names()
