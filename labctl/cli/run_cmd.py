"""``labctl run FILE``: up, steps, bundle, down; and the step display."""

from __future__ import annotations

import argparse
from pathlib import Path

import labctl.cli.junit_out as junit_out  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.cli.displays import StepLines, report_outcome
from labctl.cli.lifecycle_cmds import FILE_HELP, add_up_arguments, load_source, up_options
from labctl.cli.recording import record_run, recording_arguments
from labctl.cli.ui import PrepareDisplay, UpDisplay
from labctl.errors import LabctlError, UsageError
from labctl.pipeline import prepare, run_lab


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="bring a lab up, run its steps, write the report bundle, take it down")
    p.add_argument("file", help=FILE_HELP)
    p.add_argument("--out", default="runs", help="where bundles go (default: ./runs)")
    add_up_arguments(p)
    p.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    junit_out.add_argument(p, "steps' results (one case per step variant)")
    recording_arguments(p)
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    junit = junit_out.check_path(args.junit)
    started = junit_out.now()
    lab, pinned = load_source(args)
    if not lab.steps:
        raise UsageError(f"{args.file} has no steps to run", hint=f"use: labctl up {args.file}")
    if args.record or args.until_fail or any(g.record for g in lab.guests.values()):
        return record_run(args, lab, pinned, junit, started)  # labctl run --record (labctl.replay)
    try:
        prepared = prepare(lab, PrepareDisplay(), overcommit=args.overcommit, pinned=pinned)
        outcome = run_lab(lab, prepared, up_options(args), Path(args.out), UpDisplay(lab.ident, list(lab.guests)),
                          StepLines(), keep=args.keep)
    except LabctlError as exc:  # the lab never reached its steps (image, kernel, boot): one error case
        if junit is not None:
            junit_out.write_error(junit, lab.ident, "up", exc, started)
        raise
    if junit is not None:
        junit_out.write_run(junit, lab.ident, outcome, started)
    return report_outcome(outcome, args.json)
