"""A bisection's state file (``state.json`` in its bundle): what was asked, every step so far.

Written atomically after every change, so that a bisection stopped by Ctrl-C, a crash or a
reboot of the host goes on where it stopped (``labctl bisect --continue``). It is read only
from a bundle of the user's (or root's) that nobody else may write (:func:`load`): it names the
lab file, the tree, the worktree directory labctl deletes from; it never widens what the user
trusts (its ``trust_dirs`` are a record of the first command line, never read back).
"""

from __future__ import annotations

import copy
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, TypedDict

from labctl.errors import UnsafePath, UsageError
from labctl.paths import atomic_write, checked_dir

if TYPE_CHECKING:  # the bundle is not loaded with the state
    from labctl.bundle import Spread

STATE = "state.json"
VERSION = 1
MAX_STATE = 16 << 20

# A step's verdict, in git bisect's words (the old/new terms are the user's).
OLD, NEW, SKIP = "old", "new", "skip"


class OracleRecord(TypedDict):
    """:meth:`labctl.bisect.oracle.Oracle.to_dict`, the state file's ``oracle``: its kind and the fields given (``fixed`` only when
    true)."""

    kind: str
    name: NotRequired[str]
    command: NotRequired[str]
    guest: NotRequired[str]
    timeout: NotRequired[float]
    figure: NotRequired[str]
    below: NotRequired[float]
    above: NotRequired[float]
    worse_than_good: NotRequired[float]
    fixed: NotRequired[bool]


class FigureRecord(TypedDict, total=False):
    """What the figure oracle saw (:attr:`Step.figure`): the values over the step's runs and how they were judged."""

    name: str
    unit: str
    values: list[float]
    spread: Spread
    bound: float
    reference: list[float]
    change_pct: float
    noise: str


class TryRecord(TypedDict):
    """One try of a commit (:attr:`Step.tries`, a confirmation's ``tries``) or one run of the failing end
    (``--tries auto``'s ``log``, without ``attempts``); ``outcome`` is ``error`` when the lab did not run."""

    n: int
    outcome: str
    reason: str
    run: str
    warm: bool
    attempts: NotRequired[int]
    boot: float
    seconds: float


class CandidateRecord(TypedDict, total=False):
    """A config bisection's candidate (:attr:`Step.options`; empty when commits are bisected): its ``file``
    (relative to the bundle), the options ``set`` to the bad values (``[good, bad]``), those olddefconfig kept
    otherwise (``missing``), the options ``left`` to each end (``[good, bad]``), the parts ``not_tried``."""

    file: str
    set: dict[str, list[str]]
    missing: list[str]
    left: list[int]
    not_tried: list[str]
    fingerprint: str


class UpRecord(TypedDict, total=False):
    """How the lab is brought up (:attr:`State.up`), as the first command line asked."""

    accel: str | None
    boot_timeout: float | None
    jobs: int | None


class EstimateRecord(TypedDict, total=False):
    """``--tries auto``'s reading of the failing end (:attr:`State.estimate`, empty before it is made):
    :class:`labctl.bisect.tries.Estimate`'s fields, each run (``log``) and their times."""

    commit: str
    outcomes: list[str]
    runs: int
    fails: int
    rate: float
    tries: int
    confidence: float
    log: list[TryRecord]
    times: dict[str, float]


class ConfirmationRecord(TypedDict, total=False):
    """The answer reverted on the new end and run (:attr:`State.confirmation`, empty before)."""

    reverted: str
    on: str
    tries: list[TryRecord]
    times: dict[str, float]
    status: str  # confirmed, not confirmed
    reason: str
    run: str


class ConfigsRecord(TypedDict, total=False):
    """A config bisection's files (:attr:`State.configs`; empty: commits are bisected): the configs
    ``given`` (copied into the bundle) and where from, the ends (``good``, ``bad``) as they move, what
    olddefconfig changed of the given ones (``{good|bad: {option: [given, got]}}``), how many options
    ``differ`` after it, whether the ends were ``resolved``, the candidates found ``unusable``."""

    given: dict[str, str]
    given_good: str
    given_bad: str
    good: str
    bad: str
    olddefconfig: dict[str, dict[str, list[str]]]
    differ: int
    resolved: bool
    unusable: list[str]


class ResultRecord(TypedDict, total=False):
    """The answer (:attr:`State.result`, empty before): the ``first`` new commit and its ``subject``, or
    the ``candidates`` left (some skipped); a config bisection's ``options`` (``[good, bad]``), its
    ``text`` and ``why`` it stopped early."""

    first: str
    subject: str
    candidates: list[str]
    options: dict[str, list[str]]
    text: str
    why: str


class StepFields(TypedDict):
    """What a step's record in ``state.json`` (:class:`StepRecord`) and in ``summary.json``
    (:class:`labctl.bisect.bundlepages.SummaryStep`) share: all but its verdict and options."""

    n: int
    commit: str
    subject: str
    reason: str
    outcome: str
    figure: FigureRecord | None
    run: str
    attempts: int
    tries: list[TryRecord]
    cached_build: bool
    times: dict[str, float]
    notes: list[str]


class StepRecord(StepFields):
    """:meth:`Step.to_dict`: a step in ``state.json``."""

    verdict: str
    options: CandidateRecord


class StateRecord(TypedDict):
    """:meth:`State.to_dict`: ``state.json``."""

    lab_file: str
    tree: str
    good: str
    bad: str
    oracle: OracleRecord
    term_old: str
    term_new: str
    work: str
    up: UpRecord
    trust_dirs: list[str]
    olds: list[str]
    news: list[str]
    skips: list[str]
    steps: list[StepRecord]
    reference: str
    tries: int
    estimate_runs: int
    estimate: EstimateRecord
    confirm: bool
    confirmation: ConfirmationRecord
    configs: ConfigsRecord
    lab_up: bool
    done: bool
    result: ResultRecord
    version: int


@dataclass
class Step:
    """One commit tried: its verdict and what led to it."""

    n: int
    commit: str
    subject: str = ""
    verdict: str = ""  # OLD, NEW, SKIP; "" while it runs (or when it was interrupted)
    reason: str = ""  # why: the oracle's words, or why the commit was skipped
    outcome: str = ""  # the oracle's: pass, fail, undecided ("" when it never ran)
    figure: FigureRecord | None = None  # the figure oracle's values and spread
    run: str = ""  # the run bundle, relative to the bisect bundle
    attempts: int = 0
    tries: list[TryRecord] = field(default_factory=list)  # each try's outcome, reason, run, warm
    cached_build: bool = False
    times: dict[str, float] = field(default_factory=dict)  # build, prepare, boot, steps, oracle, down, total, labctl
    options: CandidateRecord = field(default_factory=CandidateRecord)  # config bisection: the candidate
    notes: list[str] = field(default_factory=list)  # what the progress said of it (e.g. objtool rebuilt)

    def to_dict(self) -> StepRecord:
        return {"n": self.n, "commit": self.commit, "subject": self.subject, "verdict": self.verdict,
                "reason": self.reason, "outcome": self.outcome, "figure": copy.deepcopy(self.figure), "run": self.run,
                "attempts": self.attempts, "tries": copy.deepcopy(self.tries), "cached_build": self.cached_build,
                "times": dict(self.times), "options": copy.deepcopy(self.options), "notes": list(self.notes)}

    @classmethod
    def from_dict(cls, d: object) -> Step:
        """From ``state.json``'s form (what it lacks left to the defaults, unknown keys ignored).

        :raise TypeError: when it is not an object, or lacks ``n`` or ``commit``."""
        if not isinstance(d, dict):
            raise TypeError(f"a step is a {type(d).__name__}, not an object")
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


@dataclass
class State:
    """What a bisection was asked (enough to run it again without its command line) and its steps."""

    lab_file: str
    tree: str
    good: str  # full sha of the old end
    bad: str  # full sha of the new end
    oracle: OracleRecord
    term_old: str = "good"
    term_new: str = "bad"
    work: str = ""  # the worktree's directory and build cache
    up: UpRecord = field(default_factory=UpRecord)  # accel, boot_timeout, jobs
    trust_dirs: list[str] = field(default_factory=list)  # the first command line's; --continue takes its own
    olds: list[str] = field(default_factory=list)  # commits judged old (the good end first)
    news: list[str] = field(default_factory=list)  # commits judged new (the bad end first)
    skips: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    reference: str = ""  # the old end's run bundle, for --worse-than-good
    tries: int = 1  # the oracle's runs a commit (--tries N); 0: auto, read from ``estimate`` once made
    estimate_runs: int = 0  # --tries auto: runs of the failing end (K)
    estimate: EstimateRecord = field(default_factory=EstimateRecord)  # --tries auto's (labctl.bisect.tries.Estimate)
    confirm: bool = True  # revert the first new commit on the new end and run it (--no-confirm: not)
    confirmation: ConfirmationRecord = field(default_factory=ConfirmationRecord)  # status, reason, tries, run, times
    # config bisection (labctl.bisect.cfgloop): the ends' files (relative to the bundle) as they move, what
    # olddefconfig changed of the given ones, the candidates that could not be judged; empty: commits
    configs: ConfigsRecord = field(default_factory=ConfigsRecord)
    lab_up: bool = False  # the lab was brought up by a step that has not taken it down yet
    done: bool = False
    result: ResultRecord = field(default_factory=ResultRecord)  # first new commit, or the candidates left
    version: int = VERSION

    def to_dict(self) -> StateRecord:
        return {"lab_file": self.lab_file, "tree": self.tree, "good": self.good, "bad": self.bad,
                "oracle": copy.deepcopy(self.oracle), "term_old": self.term_old, "term_new": self.term_new,
                "work": self.work, "up": copy.deepcopy(self.up), "trust_dirs": list(self.trust_dirs),
                "olds": list(self.olds), "news": list(self.news), "skips": list(self.skips),
                "steps": [s.to_dict() for s in self.steps], "reference": self.reference, "tries": self.tries,
                "estimate_runs": self.estimate_runs, "estimate": copy.deepcopy(self.estimate), "confirm": self.confirm,
                "confirmation": copy.deepcopy(self.confirmation), "configs": copy.deepcopy(self.configs),
                "lab_up": self.lab_up, "done": self.done, "result": copy.deepcopy(self.result), "version": self.version}

    @classmethod
    def from_dict(cls, d: object) -> State:
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
