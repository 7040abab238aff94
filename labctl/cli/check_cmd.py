"""``labctl check LAB[@INSTANCE]`` (graded checks) and ``labctl ssh-config LAB[@INSTANCE]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table
from rich.text import Text

import labctl.cli.junit_out as junit_out  # noqa: PLR0402 - a sibling module, not the package's face (no import cycle)
from labctl.cli.ui import out, print_json, safe
from labctl.errors import EXIT_CHECKS_FAILED, UsageError
from labctl.grading import PASS, CheckResult, checks_of, summary
from labctl.pipeline import check_lab
from labctl.state import LabState, check_lab_name
from labctl.training import check_alias_prefix, ssh_config


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser("check", help="run a lab's graded checks on its guests; exit 6 unless all pass")
    c.add_argument("lab", metavar="LAB[@INSTANCE]")
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.add_argument("--out", default="runs", metavar="DIR",
                   help="where a bundle goes when a guest crashes during the checks (default: ./runs)")
    junit_out.add_argument(c, "results (one case per check and guest)")
    c.set_defaults(func=cmd_check)
    s = sub.add_parser("ssh-config", help="print an OpenSSH config for a lab's guests (ssh -F FILE GUEST)")
    s.add_argument("lab", metavar="LAB[@INSTANCE]")
    s.add_argument("--alias-prefix", default="", metavar="P", help="name the hosts P<guest> (default: the guest's name)")
    s.set_defaults(func=cmd_ssh_config)


def results_table(title: str, results: Sequence[CheckResult]) -> Table:
    """check / guest / result / hint; the hint only for checks that did not pass. Never markup; controls escaped."""
    t = Table(title=Text(title), title_justify="left")
    for col in ("check", "guest", "result", "hint"):
        t.add_column(col)
    for r in results:
        style = "green" if r.status == PASS else "bold red"
        t.add_row(safe(r.name), safe(r.guest), safe(r.summary(), style=style),
                  safe("" if r.passed else r.hint))
    return t


def results_json(lab: str, results: Sequence[CheckResult]) -> dict[str, object]:
    return {"lab": lab, **summary(results), "checks": [r.to_dict() for r in results]}


def cmd_check(args: argparse.Namespace) -> int:
    junit = junit_out.check_path(args.junit)
    started = junit_out.now()
    state = LabState.load(check_lab_name(args.lab))
    checks = checks_of(state)
    if not checks:
        raise UsageError(f"lab '{state.lab}' declares no checks", hint="add a 'checks:' section to its lab file")
    checked = check_lab(state, checks, Path(args.out))
    results = checked.results
    s = summary(results)
    if junit is not None:
        junit_out.write_checks(junit, state.lab, results, started)
    if args.json:
        print_json({**results_json(state.lab, results), "bundle": str(checked.bundle) if checked.bundle else None})
    else:
        out.print(results_table(f"lab {state.lab}: {s['passed']}/{s['total']} checks pass", results))
        if checked.bundle is not None:
            out.print(Text(f"a guest crashed during the checks: its vmcore and report are in {checked.bundle}"),
                      soft_wrap=True)
    return 0 if s["passed"] == s["total"] else EXIT_CHECKS_FAILED


def cmd_ssh_config(args: argparse.Namespace) -> int:
    check_alias_prefix(args.alias_prefix)
    state = LabState.load(check_lab_name(args.lab))
    sys.stdout.write(ssh_config(state, args.alias_prefix))
    sys.stdout.flush()
    return 0
