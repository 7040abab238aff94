"""``labctl run FILE``: up, steps, bundle, down; and the step display."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from labctl.bundle.write import new_bundle_dir
from labctl.cli.images import ensure_image
from labctl.cli.lifecycle_cmds import add_up_arguments, up_options
from labctl.cli.ui import StepLines, UpDisplay, console, report_outcome
from labctl.errors import UsageError
from labctl.lab import load_lab
from labctl.pipeline import run_steps
from labctl.up.lifecycle import down, up
from labctl.up.runstate import lab_lock


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="bring a lab up, run its steps, write the report bundle, take it down")
    p.add_argument("file")
    p.add_argument("--out", default="runs", help="where bundles go (default: ./runs)")
    add_up_arguments(p)
    p.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    lab = load_lab(args.file)
    if not lab.steps:
        raise UsageError(f"{args.file} has no steps to run", hint=f"use: labctl up {args.file}")
    with lab_lock(lab.name):  # held through the steps to down: no other labctl takes the lab meanwhile
        image = ensure_image(lab.image)
        bundle = new_bundle_dir(Path(args.out), lab.name)  # a bad --out fails before anything boots
        display = UpDisplay(lab.name, list(lab.guests))
        with display.running():
            state = up(lab, image, up_options(args), display)
        try:
            outcome = run_steps(lab, state, bundle, StepLines())
        finally:
            if not args.keep:
                with console.status(Text(f"taking {lab.name} down")):
                    down(lab.name)
    return report_outcome(outcome, args.json)
