"""``labctl ssh LAB GUEST``: an interactive shell on a guest, OpenSSH's own ``ssh`` in labctl's place
(:func:`labctl.proc.replace_with`), with the lab's key and the guest's pinned host key."""

from __future__ import annotations

import argparse

from labctl.proc import replace_with
from labctl.state import LabState


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("ssh", help="interactive shell on a guest")
    s.add_argument("lab")
    s.add_argument("guest")
    s.set_defaults(func=cmd_ssh)


def cmd_ssh(args: argparse.Namespace) -> int:
    replace_with(LabState.load(args.lab).endpoint(args.guest).openssh_argv())
