"""``labctl report RUN_DIR`` and ``labctl bundle RUN_DIR [-o FILE]``."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.text import Text

from labctl.bundle import SUMMARY, check_bundle_dir, pack, vmcores_of
from labctl.cli.ui import console, out
from labctl.report import render_run, resummarize


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = sub.add_parser("report", help="recompute summary.json and (re)write report.md and report.html of a bundle")
    r.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds manifest.json)")
    r.set_defaults(func=report)
    b = sub.add_parser("bundle", help="pack a run directory into one .tar.gz")
    b.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run directory (holds manifest.json)")
    b.add_argument("-o", "--output", metavar="FILE", type=Path, default=None,
                   help="archive to write (default: RUN_DIR.tar.gz next to RUN_DIR)")
    b.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    b.add_argument("--with-vmcores", action="store_true",
                   help="pack the guests' vmcores too (their whole memory at a crash: left out by default)")
    b.set_defaults(func=bundle)


def report(args: argparse.Namespace) -> int:
    run_dir = check_bundle_dir(args.run_dir)
    if (run_dir / SUMMARY).is_file():
        resummarize(run_dir)
        console.print(Text(f"refreshed {SUMMARY} from the raw artifacts"))
    for path in render_run(run_dir):
        out.print(Text(str(path)), soft_wrap=True)
    return 0


def bundle(args: argparse.Namespace) -> int:
    archive = pack(args.run_dir, args.output, args.force, vmcores=args.with_vmcores)
    if not args.with_vmcores:
        for core in vmcores_of(check_bundle_dir(args.run_dir)):
            console.print(Text(f"left out {core} (the guest's memory at its crash; --with-vmcores packs it)",
                               style="yellow"), soft_wrap=True)
    out.print(Text(str(archive)), soft_wrap=True)
    return 0
