"""A bisection's state file (``state.json`` in its bundle): what was asked, every step so far.

Written atomically after every change, so that a bisection stopped by Ctrl-C, a crash or a
reboot of the host goes on where it stopped (``labctl bisect --continue``). It is read only
from a bundle of the user's (or root's) that nobody else may write (:func:`load`): it names the
lab file, the tree, the worktree directory labctl deletes from; it never widens what the user
trusts (its ``trust_dirs`` are a record of the first command line, never read back).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labctl.errors import UnsafePath, UsageError
from labctl.paths import atomic_write, checked_dir

STATE = "state.json"
VERSION = 1
MAX_STATE = 16 << 20

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
    tries: list[dict[str, Any]] = field(default_factory=list)  # each try's outcome, reason, run, warm
    cached_build: bool = False
    times: dict[str, float] = field(default_factory=dict)  # build, prepare, boot, steps, oracle, down, total, labctl
    # config bisection: the candidate (file, relative to the bundle; options set to the bad values, as
    # [good, bad]; those olddefconfig kept otherwise; options left to each end)
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the progress said of it (e.g. objtool rebuilt)

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
    trust_dirs: list[str] = field(default_factory=list)  # the first command line's; --continue takes its own
    olds: list[str] = field(default_factory=list)  # commits judged old (the good end first)
    news: list[str] = field(default_factory=list)  # commits judged new (the bad end first)
    skips: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    reference: str = ""  # the old end's run bundle, for --worse-than-good
    tries: int = 1  # the oracle's runs a commit (--tries N); 0: auto, read from ``estimate`` once made
    estimate_runs: int = 0  # --tries auto: runs of the failing end (K)
    estimate: dict[str, Any] = field(default_factory=dict)  # --tries auto's (labctl.bisect.tries.Estimate)
    confirm: bool = True  # revert the first new commit on the new end and run it (--no-confirm: not)
    confirmation: dict[str, Any] = field(default_factory=dict)  # status, reason, tries, run, times
    # config bisection (labctl.bisect.cfgloop): the ends' files (relative to the bundle) as they move, what
    # olddefconfig changed of the given ones, the candidates that could not be judged; empty: commits
    configs: dict[str, Any] = field(default_factory=dict)
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

    def tries_wanted(self) -> int:
        """The tries a commit gets: --tries N, or auto's once estimated (1 before)."""
        return self.tries if self.tries > 0 else int(self.estimate.get("tries") or 1)

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
    """The state of the bisection whose bundle is ``bundle``: checked before anything is read
    (the bundle by :func:`labctl.paths.checked_dir`; ``state.json`` a regular file, no link,
    of the user's or root's, that nobody else may write).

    :raise UnsafePath: when the bundle or its state could be another user's.
    :raise UsageError: when there is none, or it cannot be read.
    """
    path = bundle / STATE
    try:
        real = checked_dir(bundle)
        fd = os.open(real / STATE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise UsageError(f"{bundle} is not a bisection (no {STATE})",
                         hint="start one: labctl bisect LAB.yaml --tree DIR --good REV --bad REV ORACLE") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the bisection's state ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
            raise UnsafePath(f"refusing to read {path}: it is not a file of yours or root's that only its owner "
                             f"may write (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})",
                             hint="continue only bisections you started")
        text = f.read(MAX_STATE + 1)
    try:
        if len(text) > MAX_STATE:
            raise ValueError(f"over {MAX_STATE >> 20} MiB")
        return State.from_dict(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path}: cannot read the bisection's state ({exc})") from exc
