"""``labctl link LAB GUEST NIC down|up``: a lab NIC's link state, through QMP ``set_link``.

The guest sees its carrier go (``NO-CARRIER``; the driver's link-down path
runs) and no frame passes that NIC's end of the link either way; the other
end keeps its carrier, as behind a switch port. Without ``down``/``up`` the
command shows the link's state.
"""

from __future__ import annotations

import argparse

from rich.text import Text

from labctl.cli.ui import out, print_json
from labctl.live import lab_nic, set_link
from labctl.state import LabState, load_netstate


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("link", help="take a lab NIC's link down or up (the guest sees carrier loss)")
    p.add_argument("lab")
    p.add_argument("guest")
    p.add_argument("nic")
    p.add_argument("state", nargs="?", choices=("down", "up"), help="omit to show the link's state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_link)


def cmd_link(args: argparse.Namespace) -> int:
    state = LabState.load(args.lab)
    lab_nic(state, args.guest, args.nic)
    if args.state is not None:
        set_link(state, args.guest, args.nic, args.state == "up")
    up = load_netstate(state.path).link_up(args.guest, args.nic)
    if args.json:
        print_json({"lab": state.lab, "guest": args.guest, "nic": args.nic, "link": "up" if up else "down"})
    else:
        out.print(Text(f"{args.guest}.{args.nic}: link {'up' if up else 'down'}"))
    return 0
