"""The runs that check a bisection rather than advance it: ``--tries auto``'s reading of the failing end,
and the answer confirmed by reverting it on the new end.

:func:`estimate` runs the failing end (the bad end; the good end with ``--fixed``) K times and keeps
:func:`labctl.bisect.tries.estimate`'s reading in the state: the tries every commit then gets.
:func:`confirm` checks the new end out in the worktree, reverts the first new commit on it
(``git revert --no-commit``), builds and prepares that (cached as ``NEW-revert-FIRST``) and runs it
as a commit is run: *confirmed* when that is the old term, else *not confirmed* with why (the revert
does not apply, does not build, gave no verdict, or is still the new term).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import labctl.bisect.oracle as orc
import labctl.bisect.tries as tries  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.bisect.statefile import OLD, SKIP, ConfirmationRecord, FigureRecord, State, Step, TryRecord, save
from labctl.bundle import Summary
from labctl.errors import LabctlError
from labctl.kernel import Kernel

ESTIMATE_DIR = "estimate"  # --tries auto's runs of the failing end
CONFIRM_DIR = "confirm"  # the runs of the new end with the answer reverted
CONFIRMED, NOT_CONFIRMED = "confirmed", "not confirmed"


@dataclasses.dataclass(frozen=True)
class TryEnv:
    """What the oracle's command sees of the try it judges: ``LABCTL_TRY`` (1..N) and ``LABCTL_COMMIT``."""

    n: int = 1
    commit: str = ""

    def prefix(self) -> str:
        return f"LABCTL_TRY={self.n} LABCTL_COMMIT={self.commit}; export LABCTL_TRY LABCTL_COMMIT; "


@dataclasses.dataclass
class Tried:
    """A try's (or a commit's, over its tries) outcome: pass, fail, undecided, or "" when the lab did not run."""

    outcome: str = ""
    reason: str = ""
    figure: FigureRecord | None = None
    run: str = ""  # the run bundle, relative to the bisect bundle
    attempts: int = 0
    warm: bool = False  # a guest of it was restored from its post-boot snapshot
    boot: float = 0.0  # seconds to the lab being up (booted or restored)
    seconds: float = 0.0  # the try's, all told


@dataclasses.dataclass
class Run:
    """One run of the lab on one build."""

    evidence: orc.Evidence
    run_dir: Path | None
    times: dict[str, float]
    error: str = ""  # why the lab did not come up (then there is no verdict)
    warm: bool = False  # a guest was restored from its post-boot snapshot, not booted


class Runner(Protocol):
    """What these runs need of the bisection (:class:`labctl.bisect.engine.Bisector`)."""

    bundle: Path
    state: State
    oracle: orc.Oracle
    say: Callable[[str], None]

    def kernel(self, commit: str, step: Step, revert_of: str = "",
               config: bytes | None = None) -> tuple[Kernel | None, bool, str]: ...

    def end_config(self, new: bool) -> bytes | None: ...

    def run_lab(self, kernel: Kernel, out_root: Path, env: TryEnv | None = None) -> Run: ...

    def reference_summary(self) -> Summary | None: ...

    def verdict(self, outcome: str) -> str: ...




def run_tries(bis: Runner, kernel: Kernel, commit: str, out: Path, n: int, times: dict[str, float],
          log: list[TryRecord]) -> Tried:
    """Up to ``n`` runs of the lab on ``kernel`` (the first fail decides), each in ``log``; the commit's outcome
    ("" when the lab did not run)."""
    outcomes: list[str] = []
    last = Tried()
    for i in range(1, n + 1):
        last = one_try(bis, kernel, commit, out, i, times)
        log.append({"n": i, "outcome": last.outcome or "error", "reason": last.reason, "run": last.run,
                    "warm": last.warm, "attempts": last.attempts, "boot": last.boot, "seconds": last.seconds})
        if n > 1:
            bis.say(f"  try {i}/{n}: {last.outcome or 'error'}: {last.reason}")
        if not last.outcome:
            return last
        outcomes.append(last.outcome)
        if tries.should_stop(outcomes, n):
            break
    outcome = tries.combine(outcomes)
    if n > 1:
        last.reason = (f"try {len(outcomes)} of {n} failed: {last.reason}" if outcome == orc.FAIL else
                       f"all {n} tries passed: {last.reason}" if outcome == orc.PASS else last.reason)
    last.outcome = outcome
    last.attempts = sum(int(t.get("attempts") or 0) for t in log)
    return last

def one_try(bis: Runner, kernel: Kernel, commit: str, out: Path, n: int, times: dict[str, float]) -> Tried:
    """One try: a run of the lab judged by the oracle; an undecided run is run once more."""
    reference = bis.reference_summary()
    tried = Tried()
    t0 = time.monotonic()
    try:
        return _attempts(bis, kernel, commit, out, n, times, reference, tried)
    finally:
        tried.seconds = round(time.monotonic() - t0, 2)

def _attempts(bis: Runner, kernel: Kernel, commit: str, out: Path, n: int, times: dict[str, float],
          reference: Summary | None, tried: Tried) -> Tried:
    for attempt in (1, 2):
        tried.attempts = attempt
        run = bis.run_lab(kernel, out, TryEnv(n, commit))
        for k, v in run.times.items():
            times[k] = round(times.get(k, 0.0) + v, 2)
        tried.warm = tried.warm or run.warm
        tried.boot = round(tried.boot + run.times.get("boot", 0.0), 2)
        if run.run_dir is not None:
            tried.run = str(run.run_dir.relative_to(bis.bundle))
        if run.error:
            if bis.oracle.kind == "panic" and "panic" in run.error.lower():
                tried.outcome, tried.reason = orc.FAIL, run.error
                return tried
            tried.outcome, tried.reason = "", f"the lab did not run: {run.error}"
            return tried
        t1 = time.monotonic()
        j = orc.judge(bis.oracle, run.evidence, reference)
        times["oracle"] = round(times.get("oracle", 0.0) + time.monotonic() - t1, 2)
        tried.outcome, tried.reason = j.outcome, j.reason
        tried.figure = j.figure.copy() if j.figure is not None else None
        if j.outcome != orc.UNDECIDED:
            return tried
        if attempt == 1:
            bis.say(f"  undecided ({j.reason}); running the lab once more")
        else:
            tried.reason = f"undecided twice: {j.reason}"
    return tried


def estimate(bis: Runner) -> None:
    """--tries auto: the failing end run K times; its failure rate picks the tries a commit."""
    st = bis.state
    end = st.good if bis.oracle.fixed else st.bad
    k = st.estimate_runs or tries.ESTIMATE_RUNS
    bis.say(f"--tries auto: running the failing end {end[:12]} {k} times for its failure rate")
    kernel, _, why = bis.kernel(end, Step(n=0, commit=end), config=bis.end_config(not bis.oracle.fixed))
    if kernel is None:
        raise LabctlError(f"--tries auto: the failing end {end[:12]} cannot be built: {why}")
    times: dict[str, float] = {}
    log: list[TryRecord] = []
    for i in range(1, k + 1):
        t = one_try(bis, kernel, end, bis.bundle / ESTIMATE_DIR, i, times)
        log.append({"n": i, "outcome": t.outcome or "error", "reason": t.reason, "run": t.run, "warm": t.warm,
                    "boot": t.boot, "seconds": t.seconds})
        bis.say(f"  run {i}/{k}: {t.outcome or 'error'}: {t.reason}")
        if not t.outcome:
            raise LabctlError(f"--tries auto: the failing end {end[:12]} does not run the lab: {t.reason}")
    est = tries.estimate(end, [t["outcome"] for t in log])
    if est.fails == 0:
        raise LabctlError(f"--tries auto: the failing end {end[:12]} did not fail in {k} runs: no rate to read",
                          hint="give more runs (--estimate-runs K), or check the oracle and the ends")
    st.estimate = {**est.to_dict(), "log": log, "times": times}
    save(bis.bundle, st)
    bis.say(tries.confidence_text(st.estimate))

def confirm(bis: Runner) -> None:
    """The first new commit reverted on the new end, built and run as a commit is: confirmed when that is old."""
    st = bis.state
    first, on, n = str(st.result["first"]), st.bad, st.tries_wanted()
    bis.say(f"confirming: {first[:12]} reverted on the {st.term_new} end {on[:12]}, {n} tries")
    t0 = time.monotonic()
    conf: ConfirmationRecord = {"reverted": first, "on": on, "tries": [], "times": {}}
    step = Step(n=0, commit=on)
    kernel, _, why = bis.kernel(on, step, revert_of=first)
    conf["times"].update(step.times)
    if kernel is None:
        conf["status"], conf["reason"] = NOT_CONFIRMED, f"with {first[:12]} reverted, {on[:12]} {why}"
    else:
        j = run_tries(bis, kernel, on, bis.bundle / CONFIRM_DIR, n, conf["times"], conf["tries"])
        conf["run"] = j.run
        verdict = bis.verdict(j.outcome) if j.outcome in (orc.PASS, orc.FAIL) else SKIP
        if verdict == OLD:
            conf["status"], conf["reason"] = CONFIRMED, f"with {first[:12]} reverted, {on[:12]} is {st.term_old}: {j.reason}"
        elif verdict == SKIP:
            conf["status"] = NOT_CONFIRMED
            conf["reason"] = f"with {first[:12]} reverted, {on[:12]} gave no verdict: {j.reason}"
        else:
            conf["status"] = NOT_CONFIRMED
            conf["reason"] = f"with {first[:12]} reverted, {on[:12]} is still {st.term_new}: {j.reason}"
    own_share(conf["times"], t0)
    st.confirmation = conf
    bis.say(f"{conf['status']}: {conf['reason']}")


def own_share(times: dict[str, float], t0: float) -> None:
    """The step's total, and labctl's own share of it (what the build, boots, steps and oracle did not take)."""
    total = time.monotonic() - t0
    times["total"] = round(total, 2)
    own = total - sum(times.get(k, 0.0) for k in ("build", "boot", "steps", "oracle_run"))
    times["labctl"] = round(max(own, 0.0), 2)
