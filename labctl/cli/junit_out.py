"""``--junit FILE`` of ``labctl run`` and ``labctl check``: the results as JUnit XML (:mod:`labctl.bundle.junit`)."""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Sequence
from pathlib import Path

from labctl import paths
from labctl.bundle import (
    JUNIT_ERROR,
    JUNIT_FAILED,
    JUNIT_PASSED,
    JunitCase,
    JunitSuite,
    selftest_cases,
    step_cases,
    write_junit,
)
from labctl.errors import LabctlError, UsageError
from labctl.grading import ERROR, FAIL, PASS, TIMEOUT, CheckResult
from labctl.pipeline import RunOutcome


def add_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--junit", metavar="FILE", help=f"also write the {what} as JUnit XML to FILE (for CI)")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def check_path(path: str | None) -> Path | None:
    """``--junit``'s file, its directory checked before anything runs (a long run must not end
    unable to write it).

    :raise UsageError: when the directory does not exist. :raise UnsafePath: when it is not safe to write into.
    """
    if path is None:
        return None
    p = Path(path)
    if p.name in ("", ".", "..") or os.path.isdir(p):
        raise UsageError(f"--junit {path}: give a file name")
    parent = p.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"--junit {path}: no such directory {parent}")
    paths.checked_dir(parent, shared_ok=True)
    return p


def write_run(path: Path, lab: str, outcome: RunOutcome, started: str) -> None:

    cases = step_cases(lab, (r.entry() for r in outcome.results), outcome.bundle)
    cases += selftest_cases(lab, (r.entry() for r in outcome.results), outcome.bundle)
    if not cases and outcome.status != "ok":  # failed before any step ran (Ctrl-C...)
        cases = [JunitCase("run", f"{lab}.steps", JUNIT_ERROR, message=outcome.reason or "failed",
                           details=f"{outcome.reason}\nbundle: {outcome.bundle}")]
    props = {"bundle": str(outcome.bundle), "status": outcome.status}
    write_junit(path, [JunitSuite(lab, cases, started, props)])


def write_error(path: Path, lab: str, stage: str, exc: LabctlError, started: str) -> None:
    """A suite with one ``error`` case: the lab never got as far as its steps or checks (it did not come up...)."""
    text = exc.message + (f"\nhint: {exc.hint}" if exc.hint else "")
    write_junit(path, [JunitSuite(lab, [JunitCase(stage, f"{lab}.{stage}", JUNIT_ERROR, message=exc.message,
                                                  details=text)], started)])


def check_case(lab: str, r: CheckResult) -> JunitCase:
    status = {PASS: JUNIT_PASSED, FAIL: JUNIT_FAILED, TIMEOUT: JUNIT_FAILED}.get(r.status, JUNIT_ERROR)
    details = "\n".join(x for x in (r.summary(), f"hint: {r.hint}" if r.hint and not r.passed else "",
                                    r.detail if r.status == ERROR else "") if x)
    return JunitCase(name=r.name, classname=f"{lab}.{r.guest}", status=status, time=r.seconds,
                     message="" if r.passed else r.summary(), details=details,
                     output=r.detail if r.status != ERROR else "")


def write_checks(path: Path, lab: str, results: Sequence[CheckResult], started: str) -> None:
    write_junit(path, [JunitSuite(lab, [check_case(lab, r) for r in results], started)])
