"""``labctl oops decode FILE``: every oops in a console log, symbolized to file:line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.text import Text

from labctl.cli.ui import out, print_json
from labctl.debug.oops import Oops, clean_func, parse_oopses
from labctl.debug.symbolize import DecodedFrame, DecodedOops, Symbolizer
from labctl.errors import ImageError, UsageError
from labctl.image.store import ImageStore

INDENT = "  "


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("oops", help="decode kernel oopses found in console logs")
    osub = p.add_subparsers(dest="oops_command", required=True, metavar="ACTION")
    d = osub.add_parser("decode", help="show every oops in a console log with file:line for each frame")
    d.add_argument("file", help="console text, e.g. a guest's console.log ('-' reads stdin)")
    d.add_argument("--image", default="debian-12", help="image whose kernel produced the log (default debian-12)")
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
    return Symbolizer(img.vmlinux_debug, modules, system_map=img.dir / "System.map")


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


# -- text rendering ------------------------------------------------------------------

def render_oops(d: DecodedOops, number: int) -> list[Text]:
    """The lines showing one decoded oops: title, headline, RIP, then the trace by section."""
    o = d.oops
    lines = [Text(f"#{number} {o.title}", style="bold")]
    where = f"{INDENT}line {o.line_no}"
    lines.append(Text(where if o.headline == o.title else f"{where}: {o.headline}", style="dim"))
    if o.panic:
        lines.append(Text(f"{INDENT}then: {o.panic}", style="dim"))
    if o.pid is not None:
        lines.append(Text(f"{INDENT}CPU {o.cpu}, PID {o.pid} ({o.comm})", style="dim"))
    if d.rip:
        lines += render_frame(d.rip, INDENT, label="RIP: ")
    lines += _render_trace(d, o)
    return lines


def _render_trace(d: DecodedOops, o: Oops) -> list[Text]:
    lines: list[Text] = []
    if d.frames:
        lines.append(Text(f"{INDENT}Call Trace:"))
    section: tuple[str, str] | None = None
    for f in d.frames:
        here = (f.frame.stack, f.frame.context)
        if here != section:
            if f.frame.stack and (section is None or section[0] != f.frame.stack):
                lines.append(Text(f"{INDENT}{f.frame.stack}:"))
            if f.frame.context:
                lines.append(Text(f"{INDENT}<{f.frame.context.upper()}>", style="cyan"))
            section = here
        lines += render_frame(f, INDENT * 2)
    return lines


def render_frame(f: DecodedFrame, indent: str, label: str = "") -> list[Text]:
    """``func+off/size [mod]  file:line (inlined fn)`` plus one ``(inlined by)`` line per caller."""
    fr = f.frame
    head = Text(indent + label)
    if not fr.reliable:
        head.append("? ", style="yellow")
    head.append(fr.symbol, style="bold" if fr.reliable else "dim")
    if fr.module:
        head.append(f" [{fr.module}]", style="magenta")
    if f.file:
        head.append(f"  {f.file}:{f.line if f.line is not None else '?'}", style="green")
        if f.source_func and f.source_func != clean_func(fr.func) and f.source_func != fr.func:
            head.append(f" ({f.source_func})")
    if f.note:
        head.append(f"  [{f.note}]", style="yellow")
    lines = [head]
    for loc in f.inlined:
        where = f"{loc.file}:{loc.line if loc.line is not None else '?'}" if loc.file else "??"
        lines.append(Text(f"{indent}    (inlined by) {loc.func or '??'} {where}", style="dim"))
    return lines
