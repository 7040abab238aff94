"""``labctl cp LAB[@INSTANCE] SRC DEST``: files and directories between the host and a guest.

Exactly one of SRC and DEST is ``GUEST:PATH``; that says the direction. The rules (what
is refused, where files land) are :mod:`labctl.steps.transfer`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.text import Text

from labctl.cli.ui import console, out, print_json, safe, warn
from labctl.errors import UsageError
from labctl.mux import MuxSession
from labctl.state import LabState, check_lab_name
from labctl.steps import (
    TRANSFER_TIMEOUT,
    TransferProgress,
    copy_from_guest,
    copy_to_guest,
    human_size,
    local_size,
    parse_size,
    plan_transfer,
)

PROGRESS_FROM = 32 << 20  # bytes: smaller copies get no progress bar


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = sub.add_parser(
        "cp", help="copy files and directories between the host and a guest (GUEST:PATH says which side)",
        usage="labctl cp [--max-size SIZE] [--timeout S] [--json] LAB[@INSTANCE] {GUEST:PATH DEST | SRC GUEST:PATH}",
        description="Copies a file or a directory tree. GUEST:PATH DEST copies from the guest: into DEST when "
                    "it is a directory, else as DEST; only regular files and directories arrive (links, "
                    "devices, FIFOs and odd names are skipped and listed), nothing on the host is "
                    "overwritten, and DEST's directory must be yours. SRC GUEST:PATH copies to the guest: into "
                    "PATH when it is a directory, else as PATH; links inside SRC go as links, never followed. "
                    "A host path with a colon in its first part is written ./a:b. Exit 1 when something was "
                    "skipped.")
    c.add_argument("lab", metavar="LAB[@INSTANCE]")
    c.add_argument("src", metavar="SRC")
    c.add_argument("dest", metavar="DEST")
    c.add_argument("--max-size", default="4G", metavar="SIZE",
                   help="the most bytes to copy: file data, and 512 for each entry (default 4G; K, M, G, T)")
    c.add_argument("--timeout", type=float, default=TRANSFER_TIMEOUT, metavar="S",
                   help=f"seconds the whole copy may take (default {TRANSFER_TIMEOUT:.0f})")
    c.add_argument("--json", action="store_true", help="print what was copied and skipped as JSON")
    c.set_defaults(func=cmd_cp)


@contextlib.contextmanager
def _progress(show: bool, label: str, total: int | None) -> Iterator[TransferProgress | None]:
    if not show:
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   console=console, transient=True)
    task = bar.add_task(label, total=total)
    with bar:
        yield lambda n: bar.advance(task, n)


def cmd_cp(args: argparse.Namespace) -> int:
    p = plan_transfer(args.src, args.dest)
    budget = parse_size(args.max_size)
    if not args.timeout > 0:
        raise UsageError(f"--timeout {args.timeout:g}: give a positive number of seconds")
    state = LabState.load(check_lab_name(args.lab))
    ep = state.endpoint(p.guest)
    interactive = not args.json and sys.stderr.isatty()
    with MuxSession(ep, Path(state.guests[p.guest].dir)) as s:  # the guest's kept connection (labctl.mux)
        if p.to_guest:
            total = local_size(p.local) if interactive else 0
            with _progress(interactive and total >= PROGRESS_FROM, f"to {p.guest}", total) as progress:
                got = copy_to_guest(s, p.local, p.remote, budget, args.timeout, progress)
        else:
            with _progress(interactive, f"from {p.guest}", None) as progress:
                got = copy_from_guest(s, p.remote, p.local, budget, args.timeout, progress)
    source = p.local if p.to_guest else f"{p.guest}:{p.remote}"
    if args.json:
        print_json({"lab": state.lab, "guest": p.guest, "direction": "to-guest" if p.to_guest else "from-guest",
                    "source": source, **got.to_dict()})
    else:
        for path, why in got.skipped:
            warn(f"not copied: {path}: {why}")
        where = f"{p.guest}:{got.target}" if p.to_guest else got.target
        out.print(Text.assemble(f"copied {got.files} file(s), {human_size(got.bytes)}", " to ", safe(where))
                  if got.target else Text("nothing copied"))
    return 1 if got.skipped or not got.target else 0
