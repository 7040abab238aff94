"""``labctl ssh LAB GUEST`` and ``labctl exec LAB GUEST -- CMD``."""

from __future__ import annotations

import argparse
import os

from labctl.errors import UsageError
from labctl.ssh import Session, command_line
from labctl.up.runstate import LabState


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("ssh", help="interactive shell on a guest")
    s.add_argument("lab")
    s.add_argument("guest")
    s.set_defaults(func=cmd_ssh)
    e = sub.add_parser("exec", help="run a command on a guest; exits with its status")
    e.add_argument("lab")
    e.add_argument("guest")
    e.add_argument("--timeout", type=float, default=3600.0)
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    e.set_defaults(func=cmd_exec)


def cmd_ssh(args: argparse.Namespace) -> int:
    ep = LabState.load(args.lab).endpoint(args.guest)
    argv = ep.openssh_argv()
    os.execvp(argv[0], argv)
    return 0  # not reached


def cmd_exec(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given", hint="labctl exec LAB GUEST -- COMMAND [ARG...]")
    ep = LabState.load(args.lab).endpoint(args.guest)
    with Session(ep) as s:
        return s.run(command_line(cmd), timeout=args.timeout, stream=True).status
