"""``labctl impair LAB GUEST NIC [--delay T --loss P ...] [--clear]``: netem on a NIC's egress, at run time.

The options given are what is in force afterwards (they replace the NIC's
impairment, they do not add to it); ``--clear`` removes it; without options
the command shows what is in force. Values are checked before anything is
changed (exit 2), in the lab file's units (:mod:`labctl.lab.impair`).
"""

from __future__ import annotations

import argparse

from rich.text import Text

from labctl.cli.link_cmd import add_nic_arguments, nic_lab
from labctl.cli.ui import out, print_json
from labctl.errors import UsageError
from labctl.lab import IMPAIR_KEYS, Impairment, parse_impairment
from labctl.live import apply_impairment
from labctl.state import load_netstate

HELP = {"delay": "added delay, e.g. 50ms", "jitter": "delay variation (needs --delay), e.g. 5ms",
        "loss": "share of frames dropped, e.g. 2%%", "duplicate": "share of frames sent twice, e.g. 0.1%%",
        "corrupt": "share of frames with a flipped bit, e.g. 0.1%%",
        "reorder": "share of frames sent at once past delayed ones (needs --delay), e.g. 5%%",
        "rate": "egress rate, e.g. 10mbit", "limit": "netem's queue in packets (default 1000)"}


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("impair", help="impair a lab NIC's egress (netem in the guest), or show or clear it",
                       description="Set what netem does to the frames a lab NIC sends. The options given "
                                   "replace the NIC's impairment; --clear removes it; none shows it.")
    add_nic_arguments(p)
    for key in IMPAIR_KEYS:
        p.add_argument(f"--{key}", metavar="N" if key == "limit" else "VALUE", help=HELP[key],
                       type=int if key == "limit" else str)
    p.add_argument("--clear", action="store_true", help="no impairment (the NIC's default qdisc)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_impair)


def _requested(args: argparse.Namespace) -> Impairment | None:
    """The impairment the options ask for (None: they ask for nothing, show it).

    :raise UsageError: for a bad value or --clear with values (exit 2, nothing changed).
    """
    given = {k: getattr(args, k) for k in IMPAIR_KEYS if getattr(args, k) is not None}
    if args.clear and given:
        raise UsageError("--clear takes no other option")
    if args.clear:
        return Impairment()
    if not given:
        return None
    imp, problems = parse_impairment(given)
    if problems:
        key, message = problems[0]
        raise UsageError(f"--{key}: {message}")
    return imp


def cmd_impair(args: argparse.Namespace) -> int:
    wanted = _requested(args)
    state = nic_lab(args)
    if wanted is not None:
        apply_impairment(state, args.guest, args.nic, wanted)
    now = load_netstate(state.path).impairment(args.guest, args.nic)
    if args.json:
        print_json({"lab": state.lab, "guest": args.guest, "nic": args.nic, "impair": now.to_dict() if now else {}})
    else:
        out.print(Text(f"{args.guest}.{args.nic}: " + (now.describe() if now else "no impairment")))
    return 0
