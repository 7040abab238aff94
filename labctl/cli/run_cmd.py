"""``labctl run FILE``: up, steps, bundle, down; and the step display."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from labctl.bundle.write import new_bundle_dir
from labctl.cli.images import ensure_image
from labctl.cli.lifecycle_cmds import add_up_arguments, up_options
from labctl.cli.ui import UpDisplay, console, out, print_json
from labctl.errors import UsageError
from labctl.lab import load_lab
from labctl.lifecycle import down, up
from labctl.pipeline import RunOutcome, run_steps
from labctl.runner import StepEvents, StepResult
from labctl.runstate import lab_lock

EXIT_STEP_FAILED = 6


class StepLines(StepEvents):
    """One line per step as it starts and ends."""

    def step_started(self, name: str, variant: str | None) -> None:
        console.print(Text.assemble(("step", "bold"), f" {name}", (f" {variant}" if variant else "", "cyan"), " ..."))

    def step_finished(self, r: StepResult) -> None:
        style = "green" if r.status == "ok" else "bold red"
        console.print(Text.assemble("  ", (r.status, style), f" in {r.duration_s:.1f} s",
                                    f": {r.reason}" if r.reason else ""))
        for w in r.warnings:  # guest and user text: printed literally, never as markup
            console.print(Text.assemble("  ", ("warning:", "yellow"), f" {w}"))


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="bring a lab up, run its steps, write the report bundle, take it down")
    p.add_argument("file")
    p.add_argument("--out", default="runs", help="where bundles go (default: ./runs)")
    add_up_arguments(p)
    p.add_argument("--keep", action="store_true", help="leave the lab up afterwards")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=cmd_run)


def report_outcome(o: RunOutcome, as_json: bool) -> int:
    if as_json:
        print_json({"bundle": str(o.bundle), "status": o.status, "reason": o.reason,
                    "reports": [str(p) for p in o.reports],
                    "steps": [{"name": r.name, "variant": r.variant, "status": r.status, "reason": r.reason}
                              for r in o.results]})
    else:
        style = "green" if o.status == "ok" else "bold red"
        out.print(Text.assemble("run ", (o.status, style), f": {o.reason}" if o.reason else ""))
        out.print(Text(f"bundle: {o.bundle}"), soft_wrap=True)
        for p in o.reports:
            out.print(Text(f"report: {p}"), soft_wrap=True)
    return 0 if o.status == "ok" else EXIT_STEP_FAILED


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
