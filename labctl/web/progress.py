"""A class's progress over time: how many students pass each check, and all of them, as checks run.

Each time a student's checks run (the page's "check now", the trainer's button), the server
notes which checks that student now passes and appends a sample to the class's history when
the counts changed::

    <state dir>/web/progress-<lab>.json      0600, tied to the class record's created_at
        {"lab": ..., "created_at": ..., "checks": [names],
         "latest": {student: [checks passed]},          who passes what, as last seen
         "samples": [[epoch, all, n_check1, n_check2, ...], ...]}

A sample is written only when a count changes (the chart draws steps), and at most
:data:`MAX_SAMPLES` are kept (the oldest go), so the file stays a few kilobytes. The history
of an earlier class of the same lab (another ``created_at``) is never shown for the next one.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from labctl.errors import LabctlError
from labctl.paths import atomic_write, ensure_private_dir
from labctl.web.access import web_dir

MAX_SAMPLES = 500


class ProgressFile(TypedDict):
    """``progress-<lab>.json``."""

    lab: str
    created_at: str
    checks: list[str]
    latest: dict[str, list[str]]
    samples: list[list[float]]


class ProgressView(TypedDict):
    """What the trainer's page draws: [all, each check] counts now and in each sample."""

    checks: list[str]
    students: int
    samples: list[list[float]]
    now: list[int]


@dataclass
class History:
    """One class's progress: the check names, who passes what, the samples."""

    lab: str
    created_at: str
    checks: list[str] = field(default_factory=list)
    latest: dict[str, list[str]] = field(default_factory=dict)
    samples: list[list[float]] = field(default_factory=list)

    @staticmethod
    def path_of(lab: str) -> Path:
        return web_dir() / f"progress-{lab}.json"

    def counts(self, students: list[str]) -> list[int]:
        """[all checks, each check in order]: how many of ``students`` pass them now."""
        passing = [set(self.latest.get(s, ())) for s in students]
        every = sum(1 for p in passing if self.checks and all(c in p for c in self.checks))
        return [every, *(sum(1 for p in passing if c in p) for c in self.checks)]

    def note(self, student: str, checks: list[str], passed: list[str], students: list[str],
             at: float | None = None) -> bool:
        """``student`` passes ``passed`` out of ``checks`` now; True when a sample was added
        (the counts changed, or this is the first)."""
        for c in checks:
            if c not in self.checks:
                self.checks.append(c)
                for s in self.samples:  # older samples: nobody passed a check not known then
                    s.append(0)
        before = self.counts(students)
        self.latest[student] = sorted(set(passed) & set(self.checks))
        now = self.counts(students)
        if self.samples and now == before:
            return False
        self.samples.append([round(at if at is not None else time.time(), 1), *now])
        del self.samples[:-MAX_SAMPLES]
        return True

    def view(self, students: list[str]) -> ProgressView:
        """What the trainer's page draws."""
        return {"checks": list(self.checks), "students": len(students),
                "samples": [list(s) for s in self.samples], "now": self.counts(students)}

    def to_dict(self) -> ProgressFile:
        return {"lab": self.lab, "created_at": self.created_at, "checks": self.checks,
                "latest": self.latest, "samples": self.samples}

    def save(self) -> None:
        ensure_private_dir(web_dir())
        atomic_write(self.path_of(self.lab), json.dumps(self.to_dict(), separators=(",", ":")) + "\n", 0o600)

    @classmethod
    def read(cls, lab: str, created_at: str) -> History:
        """The class's saved history; an empty one when there is none, it is damaged or it
        belongs to an earlier class of the same lab."""
        fresh = cls(lab, created_at)
        try:
            data = json.loads(cls.path_of(lab).read_text())
            if not isinstance(data, dict) or data.get("lab") != lab or data.get("created_at") != created_at:
                return fresh
            checks = [str(c) for c in data.get("checks", [])]
            latest = {str(k): [str(c) for c in v] for k, v in dict(data.get("latest", {})).items()}
            samples = [[float(x) for x in s] for s in data.get("samples", [])
                       if isinstance(s, list) and len(s) == len(checks) + 2]
        except (OSError, ValueError, TypeError, AttributeError):
            return fresh
        return cls(lab, created_at, checks, latest, samples[-MAX_SAMPLES:])


class Progress:
    """Every served class's history, in memory and in its file."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.histories: dict[str, History] = {}

    def history(self, lab: str, created_at: str) -> History:
        with self.lock:
            h = self.histories.get(lab)
            if h is None or h.created_at != created_at:
                h = self.histories[lab] = History.read(lab, created_at)
            return h

    def note(self, lab: str, created_at: str, student: str, students: list[str], checks: list[str],
             passed: list[str]) -> None:
        """Record a student's check results; the file is rewritten when a sample was added."""
        h = self.history(lab, created_at)
        with self.lock:
            seen = list(h.latest.get(student, ()))
            if h.note(student, checks, passed, students) or h.latest.get(student) != seen:
                try:
                    h.save()
                except (OSError, LabctlError):
                    pass  # the chart still has it in memory
