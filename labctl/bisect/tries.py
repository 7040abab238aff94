"""How far a verdict can be trusted when the oracle is flaky: tries, ``--tries auto``, confirmation.

A commit is tried up to N times. A *fail* that shows once is real, so the first failing try
decides (the commit is the failing term); the commit passes only when all N tries pass. An
undecided try (after its one retry) makes the commit undecided: skipped, never guessed.

``--tries auto`` runs the failing end (the bad end; the good end with ``--fixed``) K times
first; the failure rate ``p`` is the share of those runs that failed (never read above
``1 - 1/(2K)``: K failures out of K are no proof that the bug always shows), and N is the
smallest number of tries with ``(1 - p)^N`` under :data:`MISS` (5%): the chance that all N
tries of a commit that has the bug pass. ``1 - (1 - p)^N`` is the confidence of each passing
verdict; N is capped at :data:`MAX_TRIES`, and the answer then says its confidence is below 95%.

Pure functions: no I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from labctl.bisect.oracle import FAIL, PASS, UNDECIDED
from labctl.bisect.statefile import EstimateRecord

MISS = 0.05  # the chance of a passing verdict on a commit that has the bug, at most
MAX_TRIES = 20
ESTIMATE_RUNS = 6  # K: runs of the failing end for --tries auto (--estimate-runs)


def combine(outcomes: Sequence[str]) -> str:
    """The commit's outcome from its tries' (in order): the first fail decides; else undecided when
    any try was; else pass. No tries: undecided."""
    if not outcomes:
        return UNDECIDED
    if FAIL in outcomes:
        return FAIL
    if UNDECIDED in outcomes:
        return UNDECIDED
    return PASS


def should_stop(outcomes: Sequence[str], n: int) -> bool:
    """Whether the tries so far decide the commit: a fail, an undecided try, or N passes."""
    return bool(outcomes) and (outcomes[-1] != PASS or len(outcomes) >= n)


def rate(fails: int, runs: int) -> float:
    """The failure rate read from ``fails`` of ``runs`` runs (at most ``1 - 1/(2 runs)``)."""
    if runs <= 0:
        return 0.0
    return min(fails / runs, 1 - 1 / (2 * runs))


def tries_for(p: float, miss: float = MISS, cap: int = MAX_TRIES) -> int:
    """The fewest tries whose all passing on a commit that fails at rate ``p`` has under ``miss`` chance (capped)."""
    if p <= 0:
        return cap
    if p >= 1:
        return 1
    return max(1, min(cap, math.floor(math.log(miss) / math.log(1 - p)) + 1))


def confidence(p: float, n: int) -> float:
    """The chance that a commit failing at rate ``p`` fails at least once in ``n`` tries."""
    return 1 - (1 - p) ** n if p > 0 else 0.0


@dataclass
class Estimate:
    """``--tries auto``'s reading of the failing end."""

    commit: str
    outcomes: list[str]  # each run's
    runs: int = 0
    fails: int = 0
    rate: float = 0.0
    tries: int = 1
    confidence: float = 0.0

    def to_dict(self) -> EstimateRecord:
        return {"commit": self.commit, "outcomes": list(self.outcomes), "runs": self.runs, "fails": self.fails,
                "rate": self.rate, "tries": self.tries, "confidence": self.confidence}


def estimate(commit: str, outcomes: Sequence[str], miss: float = MISS, cap: int = MAX_TRIES) -> Estimate:
    """The failure rate and the tries it asks for, from the failing end's runs (undecided ones not counted)."""
    decided = [o for o in outcomes if o in (PASS, FAIL)]
    fails = decided.count(FAIL)
    p = rate(fails, len(decided))
    n = tries_for(p, miss, cap)
    return Estimate(commit, list(outcomes), len(decided), fails, round(p, 4), n, round(confidence(p, n), 4))


def answer_confidence(est: EstimateRecord | None, passes: int) -> float | None:
    """A lower bound on the chance the answer is right: every one of its ``passes`` passing verdicts
    right (None without an estimate). A failing verdict is always right: a fail that shows once is real."""
    if not est:
        return None
    return round(float(est.get("confidence") or 0) ** passes, 4)


def tries_text(outcomes: Sequence[str]) -> str:
    """A step's tries for the table: ``3: pass pass pass``, ``2: pass FAIL``."""
    if not outcomes:
        return ""
    return f"{len(outcomes)}: " + " ".join(o.upper() if o == FAIL else o for o in outcomes)


def confidence_text(est: EstimateRecord | None) -> str:
    """What the summary and the report say of --tries auto's estimate ("" when there was none)."""
    if not est:
        return ""
    conf = float(est.get("confidence") or 0)
    text = (f"--tries auto: the failing end {str(est.get('commit', ''))[:12]} failed {est.get('fails')} of "
            f"{est.get('runs')} runs (rate {float(est.get('rate') or 0):.2f}); {est.get('tries')} tries a commit; "
            f"each passing verdict {conf:.1%} sure")
    if conf < 1 - MISS:
        capped = int(est.get("tries") or 0) >= MAX_TRIES
        text += f" (BELOW {1 - MISS:.0%}" + (f": the rate is too low for {MAX_TRIES} tries)" if capped else ")")
    return text
