"""A bisection's state file (``state.json`` in its bundle): what was asked, every step so far.

Written atomically after every change, so that a bisection stopped by Ctrl-C, a crash or a
reboot of the host goes on where it stopped (``labctl bisect --continue``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labctl.errors import UsageError
from labctl.paths import atomic_write

STATE = "state.json"
VERSION = 1

# A step's verdict, in git bisect's words (the old/new terms are the user's).
OLD, NEW, SKIP = "old", "new", "skip"


@dataclass
class Step:
    """One commit tried: its verdict and what led to it."""

    n: int
    commit: str
    subject: str = ""
    verdict: str = ""  # OLD, NEW, SKIP; "" while it runs (or when it was interrupted)
    reason: str = ""  # why: the oracle's words, or why the commit was skipped
    outcome: str = ""  # the oracle's: pass, fail, undecided ("" when it never ran)
    figure: dict[str, Any] | None = None  # the figure oracle's values and spread
    run: str = ""  # the run bundle, relative to the bisect bundle
    attempts: int = 0
    cached_build: bool = False
    times: dict[str, float] = field(default_factory=dict)  # build, prepare, boot, steps, oracle, down, total, labctl

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass
class State:
    """What a bisection was asked (enough to run it again without its command line) and its steps."""

    lab_file: str
    tree: str
    good: str  # full sha of the old end
    bad: str  # full sha of the new end
    oracle: dict[str, Any]
    term_old: str = "good"
    term_new: str = "bad"
    work: str = ""  # the worktree's directory and build cache
    up: dict[str, Any] = field(default_factory=dict)  # accel, boot_timeout, ...
    trust_dirs: list[str] = field(default_factory=list)
    olds: list[str] = field(default_factory=list)  # commits judged old (the good end first)
    news: list[str] = field(default_factory=list)  # commits judged new (the bad end first)
    skips: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    reference: str = ""  # the old end's run bundle, for --worse-than-good
    lab_up: bool = False  # the lab was brought up by a step that has not taken it down yet
    done: bool = False
    result: dict[str, Any] = field(default_factory=dict)  # first new commit, or the candidates left
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> State:
        if not isinstance(d, dict) or d.get("version") != VERSION:
            raise ValueError(f"not a labctl bisect state (version {d.get('version') if isinstance(d, dict) else '?'})")
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "steps"}
        for key in ("lab_file", "tree", "good", "bad", "oracle"):
            if key not in fields:
                raise ValueError(f"'{key}' is missing")
        steps = [Step.from_dict(s) for s in d.get("steps") or []]
        return cls(**fields, steps=steps)

    def term(self, verdict: str) -> str:
        """A verdict in the user's words: good/bad (or the --term-old/--term-new pair), or skip."""
        return {OLD: self.term_old, NEW: self.term_new}.get(verdict, verdict)

    def record(self, step: Step) -> None:
        """Count a step's verdict in the search."""
        target = {OLD: self.olds, NEW: self.news, SKIP: self.skips}.get(step.verdict)
        if target is not None and step.commit not in target:
            target.append(step.commit)


def save(bundle: Path, state: State) -> None:
    atomic_write(bundle / STATE, json.dumps(state.to_dict(), indent=2) + "\n")


def load(bundle: Path) -> State:
    """The state of the bisection whose bundle is ``bundle``.

    :raise UsageError: when there is none, or it cannot be read.
    """
    path = bundle / STATE
    try:
        data = json.loads(path.read_text())
        return State.from_dict(data)
    except FileNotFoundError as exc:
        raise UsageError(f"{bundle} is not a bisection (no {STATE})",
                         hint="start one: labctl bisect LAB.yaml --tree DIR --good REV --bad REV ORACLE") from exc
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"{path}: cannot read the bisection's state ({exc})") from exc
