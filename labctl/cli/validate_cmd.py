"""``labctl validate FILE``: check a lab file, start nothing."""

from __future__ import annotations

import argparse

from labctl.cli.ui import out, print_json
from labctl.lab import load_lab


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("validate", help="check a lab file without starting anything")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the resolved lab as JSON")
    add_trust_dir(p)
    p.set_defaults(func=run)


def add_trust_dir(p: argparse.ArgumentParser) -> None:
    """``--trust-dir``, of every command that loads a lab file and may use its kernel paths."""
    p.add_argument("--trust-dir", action="append", default=[], metavar="DIR",
                   help="use kernel paths the lab file names under DIR even if another user could change them "
                        "(repeatable)")


def run(args: argparse.Namespace) -> int:
    lab = load_lab(args.file, args.trust_dir)
    if args.json:
        print_json(lab.to_dict())
    else:
        nics = sum(len(g.nics) for g in lab.guests.values())
        out.print(f"{args.file}: lab '{lab.name}' is valid "
                  f"({len(lab.guests)} guests, {nics} lab NICs, {len(lab.networks)} networks)")
    return 0
