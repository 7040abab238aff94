"""``labctl down``: a lab's guests powered off and its state removed. Apart from ``up``
(:mod:`.lifecycle_cmds`), whose parser needs the pipeline, the packs and the steps' displays:
``down`` loads none of them (``tests/unit/test_cli_budget.py``)."""

from __future__ import annotations

import argparse

from labctl.cli.ui import console, out
from labctl.errors import LabStateError
from labctl.state import check_lab_name, up_labs


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    d = sub.add_parser("down", help="power a lab's guests off and remove its state")
    d.add_argument("lab", nargs="?")
    d.add_argument("--all", action="store_true", help="take every lab down")
    d.add_argument("--timeout", type=float, default=10.0, help="seconds before a hard stop")
    d.set_defaults(func=cmd_down)


def cmd_down(args: argparse.Namespace) -> int:
    from rich.text import Text

    from labctl.up import down

    if args.all:
        names = up_labs()
    elif args.lab:
        names = [args.lab]
    else:
        raise LabStateError("say which lab to take down, or --all", hint=f"labs up: {', '.join(up_labs()) or 'none'}")
    for name in names:
        check_lab_name(name)
        with console.status(Text(f"taking {name} down")):
            down(name, timeout=args.timeout)
        out.print(Text(f"lab {name} is down"))
    return 0
