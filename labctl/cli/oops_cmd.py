"""``labctl oops decode FILE``: every oops in a console log, symbolized to file:line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labctl.cli.ui import out, print_json
from labctl.debug.oops import parse_oopses
from labctl.debug.oops_text import render_oops
from labctl.debug.symbolize import Symbolizer
from labctl.errors import ImageError, UsageError
from labctl.image.store import ImageStore
from labctl.lab.model import DEFAULT_IMAGE

INDENT = "  "


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("oops", help="decode kernel oopses found in console logs")
    osub = p.add_subparsers(dest="oops_command", required=True, metavar="ACTION")
    d = osub.add_parser("decode", help="show every oops in a console log with file:line for each frame")
    d.add_argument("file", help="console text, e.g. a guest's console.log ('-' reads stdin)")
    d.add_argument("--image", default=DEFAULT_IMAGE, help=f"image whose kernel produced the log (default {DEFAULT_IMAGE})")
    d.add_argument("--vmlinux", type=Path, help="vmlinux with DWARF to use instead of the image's vmlinux.debug")
    d.add_argument("--modules", type=Path, metavar="DIR",
                   help="tree of module .ko files with debug info, searched before the image's debug-modules")
    d.add_argument("--json", action="store_true", help="print a JSON list of oopses")
    d.set_defaults(func=decode)


def read_console(path: str) -> str:
    """The text of ``path`` ('-' for stdin); undecodable bytes are replaced.

    :raise UsageError: when the file cannot be read.
    """
    if path == "-":
        return sys.stdin.buffer.read().decode(errors="replace")
    try:
        return Path(path).read_bytes().decode(errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def make_symbolizer(args: argparse.Namespace) -> Symbolizer:
    """A symbolizer for ``--vmlinux``/``--modules``, else for the image's debug files.

    :raise ImageError: when the image is not built or lacks its vmlinux.debug.
    """
    if args.vmlinux is not None:
        return Symbolizer(args.vmlinux, args.modules)
    img = ImageStore().require(args.image)
    if not img.vmlinux_debug.is_file():
        raise ImageError(f"image {args.image} has no vmlinux.debug ({img.vmlinux_debug})",
                         hint=f"rebuild it: labctl image build {args.image} --force")
    # --modules DIR first, then the image's own debug modules (in-tree drivers such as 8139cp).
    modules = [args.modules, img.debug_modules] if args.modules else [img.debug_modules]
    return Symbolizer(img.vmlinux_debug, modules, system_map=img.system_map)


def decode(args: argparse.Namespace) -> int:
    oopses = parse_oopses(read_console(args.file))
    decoded = make_symbolizer(args).decode(oopses) if oopses else []
    if args.json:
        print_json([d.to_json() for d in decoded])
        return 0
    if not decoded:
        out.print(f"no oops found in {args.file}", markup=False)
        return 0
    for i, d in enumerate(decoded, 1):
        if i > 1:
            out.print()
        for line in render_oops(d, i):
            out.print(line, soft_wrap=True)
    return 0
