"""``labctl reset``, ``labctl checkpoint save|restore|list|delete`` and ``labctl snapshot list|prune``:
putting guests of a lab that is up back to a saved instant."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table
from rich.text import Text

from labctl.cli.jsonout import json_subcommand
from labctl.cli.ui import console, out, print_json, warn
from labctl.state import LabState, check_lab_name, recorded_snapshots
from labctl.training import delete_checkpoint, list_checkpoints, reset, restore_checkpoint, save_checkpoint
from labctl.up import list_snapshots, prune_snapshots, snapshots_in_use, snapshots_root


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("reset", help="put guests of a lab that is up back to their post-boot state")
    r.add_argument("lab", help="LAB or LAB@INSTANCE")
    r.add_argument("guests", nargs="*", metavar="GUEST", help="the guests to reset (default: all)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_reset)

    c = sub.add_parser("checkpoint", help="save or restore the whole lab at one instant")
    csub = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, helptext in (("save", "pause every guest, save them, resume"),
                             ("restore", "bring every guest back to a checkpoint"),
                             ("delete", "remove a checkpoint")):
        p = csub.add_parser(action, help=helptext)
        p.add_argument("lab", help="LAB or LAB@INSTANCE")
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_checkpoint)
    ls = csub.add_parser("list", help="a lab's checkpoints")
    ls.add_argument("lab", help="LAB or LAB@INSTANCE")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_checkpoint, name=None)

    s = sub.add_parser("snapshot", help="post-boot snapshots (warm start, reset)")
    ssub = s.add_subparsers(dest="action", required=True, metavar="ACTION")
    json_subcommand(ssub, "list", "the post-boot snapshots kept", cmd_snapshot)
    json_subcommand(ssub, "prune", "remove the snapshots no lab that is up uses", cmd_snapshot)


def cmd_reset(args: argparse.Namespace) -> int:
    lab = check_lab_name(args.lab)
    results: list[dict[str, Any]] = []

    def told(guest: str, seconds: float, how: str) -> None:
        results.append({"guest": guest, "seconds": seconds, "from": how})
        if not args.json:
            source = {"snapshot": "post-boot snapshot", "saved state": "post-boot state saved by libvirt"}
            out.print(Text(f"{guest}: back in {seconds:.2f} s (from its {source.get(how, 'boot')})"))

    moved: list[str] = []

    def told_moved(message: str) -> None:  # a guest's SSH port was taken: it is back on a new one
        moved.append(message)
        warn(message)

    with console.status(Text(f"resetting {', '.join(args.guests) or 'every guest'} of {lab}")):
        reset(lab, args.guests, told, told_moved)
    if args.json:
        print_json({"lab": lab, "guests": results, "warnings": moved})
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    lab = check_lab_name(args.lab)
    if args.action == "save":
        with console.status(Text(f"saving checkpoint {args.name} of {lab}")):
            ckpt = save_checkpoint(lab, args.name)
        data = ckpt.to_dict()
        if args.json:
            print_json({"lab": lab, **data})
        else:
            out.print(Text(f"checkpoint {args.name} of {lab}: {len(data['guests'])} guests saved in "
                           f"{data['save_seconds']} s ({data['bytes'] / 2**20:.0f} MiB)"))
    elif args.action == "restore":
        with console.status(Text(f"restoring checkpoint {args.name} of {lab}")):
            seconds = restore_checkpoint(lab, args.name, warn)
        if args.json:
            print_json({"lab": lab, "name": args.name, "seconds": seconds})
        else:
            out.print(Text(f"lab {lab} is back at checkpoint {args.name} ({seconds:.2f} s)"))
    elif args.action == "delete":
        delete_checkpoint(lab, args.name)
        if not args.json:
            out.print(Text(f"checkpoint {args.name} of {lab} removed"))
    else:
        items = [c.to_dict() for c in list_checkpoints(LabState.load(lab))]
        if args.json:
            print_json({"lab": lab, "checkpoints": items})
        elif not items:
            out.print(Text(f"lab {lab} has no checkpoints"))
        else:
            t = Table(title=Text(f"checkpoints of {lab}"), title_justify="left")
            for col in ("name", "created", "guests", "size"):
                t.add_column(col)
            for c in items:
                t.add_row(Text(c["name"]), Text(str(c["created_at"])), Text(", ".join(c["guests"])),
                          Text(f"{c['bytes'] / 2**20:.0f} MiB"))
            out.print(t)
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    if args.action == "prune":
        gone = prune_snapshots(recorded_snapshots())
        if args.json:
            print_json({"removed": [s.key for s in gone]})
        else:
            out.print(Text(f"removed {len(gone)} snapshot{'s' if len(gone) != 1 else ''}" if gone
                           else "nothing to prune"))
        return 0
    used = snapshots_in_use(recorded_snapshots())
    rows = [{"key": s.key, "lab": s.meta.get("lab"), "guest": s.meta.get("guest"), "created_at": s.meta.get("created_at"),
             # allocated bytes: the memory file is sparse (its holes take no room)
             "bytes": sum(f.stat().st_blocks * 512 for f in s.dir.iterdir() if f.is_file()), "in_use": s.key in used}
            for s in list_snapshots() if s.complete()]
    if args.json:
        print_json({"snapshots": rows})
        return 0
    if not rows:
        out.print("no post-boot snapshots")
        return 0
    t = Table(title=Text(f"post-boot snapshots in {snapshots_root()}"), title_justify="left")
    for col in ("key", "lab", "guest", "created", "size", "in use"):
        t.add_column(col)
    for r in rows:
        t.add_row(Text(str(r["key"])), Text(str(r["lab"] or "")), Text(str(r["guest"])), Text(str(r["created_at"])),
                  Text(f"{int(r['bytes'] or 0) / 2**20:.0f} MiB"), Text("yes" if r["in_use"] else ""))
    out.print(t)
    return 0
