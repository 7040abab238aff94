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
    add_nic_arguments(p)
    p.add_argument("state", nargs="?", choices=("down", "up"), help="omit to show the link's state")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_link)


def add_nic_arguments(p: argparse.ArgumentParser) -> None:
    """``LAB GUEST NIC``: the lab NIC that link, capture and impair act on."""
    p.add_argument("lab")
    p.add_argument("guest")
    p.add_argument("nic")


def nic_lab(args: argparse.Namespace) -> LabState:
    """The lab of ``LAB GUEST NIC`` (:func:`add_nic_arguments`), once its guest is known to have that lab NIC.

    :raise LabStateError: when the lab is not up. :raise UsageError: for an unknown guest or NIC.
    """
    state = LabState.load(args.lab)
    lab_nic(state, args.guest, args.nic)
    return state


def cmd_link(args: argparse.Namespace) -> int:
    state = nic_lab(args)
    if args.state is not None:
        set_link(state, args.guest, args.nic, args.state == "up")
    up = load_netstate(state.path).link_up(args.guest, args.nic)
    if args.json:
        print_json({"lab": state.lab, "guest": args.guest, "nic": args.nic, "link": "up" if up else "down"})
    else:
        out.print(Text(f"{args.guest}.{args.nic}: link {'up' if up else 'down'}"))
    return 0
