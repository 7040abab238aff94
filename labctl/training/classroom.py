"""A class: one instance of a lab per student (``labctl class ...``).

The roster is a text file, one student a line; blank lines and ``#`` comments
are ignored. Each name becomes an instance, ``LAB@STUDENT``, so it follows
the instance-name rule. ``class up`` records the class in
``<state_dir>/classes/<lab>.json`` (one class per lab name), so that the
other class commands work without the roster.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, TypeVar

from labctl.errors import GuestError, LabFileError, LabStateError, Problem, UsageError
from labctl.lab import LAB_NAME, LAB_NAME_RULE
from labctl.paths import atomic_write, ensure_private_dir, state_dir
from labctl.ssh import Session
from labctl.state import LabState, check_lab_name, run_dir
from labctl.up import guest_statuses

MAX_STUDENTS = 64
SSH_PROBE_TIMEOUT = 5.0
UP, CRASHED, DOWN = "up", "crashed", "down"
T = TypeVar("T")
REASONS = {"crashed": "kernel crash on its console", "stopped": "its QEMU is gone",
           "unreachable": "its host does not answer", "incomplete": "the up that started it was killed"}


def parse_roster(text: str, file: str) -> list[str]:
    """Student names from a roster's text, in file order.

    :raise LabFileError: every bad line at once (exit 2): a name that breaks the
        instance-name rule, a duplicate, too many students, or none.
    """
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    students: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        if not LAB_NAME.fullmatch(name):
            problems.append(Problem(file, number, "", f"invalid student name {name!r} ({LAB_NAME_RULE})"))
        elif name in seen:
            problems.append(Problem(file, number, "", f"duplicate student '{name}' (first at line {seen[name]})"))
        else:
            seen[name] = number
            students.append(name)
    if not problems and not students:
        problems.append(Problem(file, 1, "", "no students: give one name a line"))
    if len(students) > MAX_STUDENTS:
        problems.append(Problem(file, seen[students[MAX_STUDENTS]], "",
                                f"{len(students)} students: at most {MAX_STUDENTS}"))
    if problems:
        raise LabFileError(problems)
    return students


def read_roster(path: Path) -> list[str]:
    """:raise UsageError: when the roster cannot be read. :raise LabFileError: for bad lines."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the roster {path}: {exc}") from exc
    return parse_roster(text, str(path))


def classes_root() -> Path:
    return state_dir() / "classes"


class ClassOptions(TypedDict, total=False):
    """How ``class up`` was asked to bring the instances up (it writes every key; an older record may have none)."""

    accel: str
    cold: bool
    kernel: str | None


class ClassCheck(TypedDict):
    """One of the lab's checks as the class record keeps it."""

    name: str
    guest: str
    hint: str


class StudentStatus(TypedDict):
    """:func:`student_status`: a student's instance, each guest's state and why it is not up."""

    student: str
    lab: str
    guests: dict[str, str]  # guest -> up, crashed, starting
    reasons: dict[str, str]  # guest (``*``: the instance) -> why
    state: NotRequired[str]
    host: NotRequired[str | None]  # the libvirt host (class status adds it)


@dataclass
class ClassRecord:
    """What ``class up`` leaves for the other class commands."""

    lab: str  # the lab's name; each student's instance is LAB@STUDENT
    source: str  # the lab file, absolute
    students: list[str]
    out: str  # the handouts' directory, absolute
    created_at: str = ""
    options: ClassOptions = field(default_factory=lambda: ClassOptions())  # as given to class up
    checks: list[ClassCheck] = field(default_factory=list)  # the lab's checks
    placement: dict[str, str] = field(default_factory=dict)  # student -> libvirt host (a class spread over hosts)

    def ident(self, student: str) -> str:
        return f"{self.lab}@{student}"

    def handout(self, student: str) -> Path:
        return Path(self.out) / student

    @staticmethod
    def path_of(lab: str) -> Path:
        return classes_root() / f"{check_lab_name(lab)}.json"

    def create(self) -> None:
        """Write the record, refusing when the lab already has a class.

        :raise LabStateError: when it has one (exit 5).
        """
        ensure_private_dir(classes_root())
        self.created_at = self.created_at or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        try:
            fd = os.open(self.path_of(self.lab), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as exc:
            raise self._taken(self.lab) from exc
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def refuse_if_exists(cls, lab: str) -> None:
        """:raise LabStateError: when ``lab`` already has a class (before anything starts)."""
        if cls.path_of(lab).exists():
            raise cls._taken(lab)

    @staticmethod
    def _taken(lab: str) -> LabStateError:
        return LabStateError(f"lab '{lab}' already has a class up (one class per lab)",
                             hint=f"see 'labctl class status --lab {lab}'; 'labctl class down --lab {lab}' ends it")

    def save(self) -> None:
        atomic_write(self.path_of(self.lab), json.dumps(asdict(self), indent=2) + "\n", 0o600)

    def remove(self) -> None:
        self.path_of(self.lab).unlink(missing_ok=True)

    @classmethod
    def load(cls, lab: str) -> ClassRecord:
        """:raise LabStateError: when the lab has no class or its record is unreadable."""
        path = cls.path_of(lab)
        try:
            data = json.loads(path.read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except FileNotFoundError as exc:
            raise LabStateError(f"lab '{lab}' has no class up", hint="see 'labctl class status'") from exc
        except (OSError, ValueError, TypeError) as exc:
            raise LabStateError(f"cannot read the class record {path}: {exc}",
                                hint=f"remove it once its labs are down ('labctl down {lab}@STUDENT')") from exc


def class_names() -> list[str]:
    """Labs that have a class recorded."""
    root = classes_root()
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob("*.json") if LAB_NAME.fullmatch(p.stem))


def find_class(lab: str | None) -> ClassRecord:
    """The class of ``lab``, or the only class when ``lab`` is None.

    :raise LabStateError: when there is none. :raise UsageError: when several need telling apart.
    """
    if lab is not None:
        return ClassRecord.load(lab)
    names = class_names()
    if not names:
        raise LabStateError("no class is up", hint="start one with 'labctl class up LAB_FILE --roster FILE --out DIR'")
    if len(names) > 1:
        raise UsageError(f"{len(names)} classes are up ({', '.join(names)}): say which with --lab NAME")
    return ClassRecord.load(names[0])


def is_up(ident: str) -> bool:
    """True when the instance has a run directory (it is up, or being brought up or down)."""
    return run_dir(ident).is_dir()


def _probe_ssh(state: LabState, guest: str) -> str | None:
    """None when the guest answers a command over SSH, else why not."""
    try:
        with Session(state.endpoint(guest), timeout=SSH_PROBE_TIMEOUT) as s:
            res = s.run("true", timeout=SSH_PROBE_TIMEOUT)
        return None if res.status == 0 else f"'true' exited with {res.status}"
    except (GuestError, LabStateError) as exc:
        return exc.message


def student_status(record: ClassRecord, student: str) -> StudentStatus:
    """Per guest: up (QEMU runs and the guest answers SSH), crashed (QEMU gone, a panic on its
    console, or no SSH answer) or down (the instance is not up)."""
    ident = record.ident(student)
    row: StudentStatus = {"student": student, "lab": ident, "guests": {}, "reasons": {}}
    try:
        state = LabState.load(ident)
    except LabStateError as exc:
        row["state"] = DOWN
        if is_up(ident):  # a run directory without a readable state: a killed up
            row["state"] = CRASHED
            row["reasons"]["*"] = exc.message
        return row
    for g in guest_statuses(state):
        if g.state != "running":
            row["guests"][g.name] = CRASHED if g.state != "starting" else "starting"
            row["reasons"][g.name] = REASONS.get(g.state, g.state)
            continue
        why = _probe_ssh(state, g.name)
        row["guests"][g.name] = UP if why is None else CRASHED
        if why:
            row["reasons"][g.name] = why
    states = set(row["guests"].values())
    row["state"] = UP if states == {UP} else CRASHED if CRASHED in states else next(iter(states), DOWN)
    return row


def for_students(record: ClassRecord, fn: Callable[[str], T], workers: int = 4) -> list[T]:
    """``fn(student)`` for every student, a few at a time, in roster order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(workers, len(record.students)))) as pool:
        return list(pool.map(fn, record.students))


def check_student(record: ClassRecord, student: str) -> str:
    """``student`` when the class has them. :raise UsageError: otherwise."""
    if student not in record.students:
        raise UsageError(f"class of lab '{record.lab}' has no student '{student}'",
                         hint=f"students: {', '.join(record.students)}")
    return student


def refuse_up_instances(lab: str, students: Sequence[str]) -> None:
    """:raise LabStateError: when an instance of a student is already up (nothing is started)."""
    taken = [s for s in students if is_up(f"{lab}@{s}")]
    if taken:
        raise LabStateError(f"{len(taken)} of the students' instances are already up: "
                            + ", ".join(f"{lab}@{s}" for s in taken),
                            hint="take them down first ('labctl down LAB@STUDENT')")
