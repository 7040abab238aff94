"""``labctl cache list|prune``: what labctl keeps of packs and URLs (:mod:`labctl.pack.cache`):
unpacked packs, their images, files fetched over http(s), git repositories' commits; ``prune``
removes what nothing uses (no lab that is up, no running labctl, no open file)."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from labctl.cli.jsonout import json_subcommand
from labctl.cli.ui import out, print_json
from labctl.pack import CacheEntry, cache_entries, prune_cache
from labctl.state import run_dir, up_labs

STATE_FILE = "state.json"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("cache", help="list or prune the unpacked packs and fetched lab files in labctl's cache")
    csub = p.add_subparsers(dest="action", required=True, metavar="list|prune")
    json_subcommand(csub, "list", "unpacked packs, their images, fetched files and git commits, largest first", cmd_list)
    pr = csub.add_parser("prune", help="remove those that no lab that is up and no running labctl uses")
    pr.add_argument("--json", action="store_true", help="print what was removed and kept as JSON")
    pr.set_defaults(func=cmd_prune)


def states_of_labs_up() -> list[str]:
    """The state of every lab that is up, as text (an entry named in one is in use)."""
    texts = []
    for lab in up_labs():
        try:
            texts.append((run_dir(lab) / STATE_FILE).read_text())
        except OSError:
            texts.append(str(run_dir(lab)))
    return texts


def _row(e: CacheEntry) -> dict[str, object]:
    return {"kind": e.kind, "path": str(e.path), "bytes": e.size, **({"url": e.what} if e.what else {})}


def cmd_list(args: argparse.Namespace) -> int:
    rows = [_row(e) for e in cache_entries()]
    if args.json:
        print_json({"entries": rows})
        return 0
    if not rows:
        out.print("nothing cached")
        return 0
    t = Table("kind", "on disk", "path")
    for r in rows:
        t.add_row(str(r["kind"]), _mib(int(str(r["bytes"]))), Text(str(r["path"]) + (f" ({r['url']})" if "url" in r else "")))
    out.print(t)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    removed, kept = prune_cache(states_of_labs_up())
    freed = sum(e.size for e in removed)
    if args.json:
        print_json({"removed": [_row(e) for e in removed], "kept": [_row(e) for e in kept], "bytes_freed": freed})
        return 0
    for e in removed:
        out.print(Text(f"removed {e.kind} {e.path} ({_mib(e.size)})"))
    for e in kept:
        out.print(Text(f"kept {e.kind} {e.path}: in use"))
    out.print(Text(f"{_mib(freed)} freed" if removed else "nothing to prune"))
    return 0


def _mib(size: int) -> str:
    return f"{size / 1048576:.1f} MiB"
