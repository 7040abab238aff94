"""``labctl run --record``, ``--keep-recordings``, ``--until-fail N``: a run with its guests under
QEMU's record/replay (:mod:`labctl.replay`), the failing guests' recordings kept in the bundle."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
from pathlib import Path
from typing import Any

import labctl.cli.junit_out as junit_out  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.backends import qemu_version
from labctl.cli.displays import StepLines, report_outcome
from labctl.cli.lifecycle_cmds import up_options
from labctl.cli.ui import PrepareDisplay, UpDisplay, console
from labctl.errors import LabctlError, UsageError
from labctl.lab import Lab
from labctl.pipeline import RunOutcome, prepare, run_lab
from labctl.replay import Recorder, check, failed_guests, recorded_lab
from labctl.state import LabState
from labctl.up import down

MAX_UNTIL_FAIL = 100


def recording_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--record", action="store_true",
                   help="run every guest under QEMU's record/replay (TCG, one vCPU); a guest that fails "
                        "keeps its recording in the bundle (labctl replay, labctl gdb --replay)")
    p.add_argument("--keep-recordings", action="store_true", help="keep the recordings of passing guests too")
    p.add_argument("--until-fail", type=int, metavar="N",
                   help="with --record: repeat the run up to N times, stop at the first that fails, keep that one")


def record_run(args: argparse.Namespace, lab: Lab, pinned: Any, junit: Path | None, started: str) -> int:
    """The run (or ``--until-fail N`` runs) with the recorded guests; the exit status."""
    if args.until_fail is not None and not 1 <= args.until_fail <= MAX_UNTIL_FAIL:
        raise UsageError(f"--until-fail {args.until_fail}: give 1 to {MAX_UNTIL_FAIL}")
    if args.until_fail and not (args.record or any(g.record for g in lab.guests.values())):
        raise UsageError("--until-fail repeats a recorded run: add --record (or record: true to a guest)")
    lab = recorded_lab(lab, args.record)
    opts = up_options(args)
    opts = dataclasses.replace(opts, accel=check(lab, opts.accel, opts.backend))  # exit 2 before anything starts
    prepared = prepare(lab, PrepareDisplay(), overcommit=args.overcommit, pinned=pinned)
    tries = args.until_fail or 1
    passed: list[Path] = []
    outcome: RunOutcome | None = None
    for n in range(1, tries + 1):
        if tries > 1:
            console.print(f"run {n} of at most {tries}")
        outcome = _one_run(args, lab, prepared, opts)
        if outcome.status != "ok" or n == tries:
            break
        passed.append(outcome.bundle)
    assert outcome is not None
    if tries > 1:  # keep only the failing run's bundle (or the last passing one)
        for b in passed:
            shutil.rmtree(b, ignore_errors=True)
    if junit is not None:
        junit_out.write_run(junit, lab.ident, outcome, started)
    return report_outcome(outcome, args.json)


def _one_run(args: argparse.Namespace, lab: Lab, prepared: Any, opts: Any) -> RunOutcome:
    recorder = Recorder(lab, qemu_version())
    outcome = None
    try:
        # kept up after the steps: the recordings end (QEMU quits) before the lab goes down
        outcome = run_lab(lab, prepared, opts, Path(args.out), UpDisplay(lab.ident, list(lab.guests)),
                          StepLines(), keep=True)
        state = LabState.load(lab.ident)
        failed = failed_guests(lab, outcome.status, outcome.reason, outcome.results)
        for k in recorder.finish(state.guests, outcome.bundle, failed, args.keep_recordings):
            console.print(f"recording of {k.guest} kept: {k.dir} ({k.bytes / 1e6:.1f} MB, {k.icount} "
                          f"instructions, {k.seconds:g} s from its boot); labctl replay {outcome.bundle} {k.guest}")
    finally:
        if not args.keep or outcome is None:
            with contextlib.suppress(LabctlError):
                down(lab.ident)
    return outcome
