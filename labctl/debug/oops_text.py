"""A decoded oops as text lines (styled with rich's Text, printed by the CLI, written plain to oops.txt).

Every string that came from the console (titles, symbols, module and task
names) is shown with its control characters escaped (:func:`labctl.textsafe.safe_line`).
"""

from __future__ import annotations

from rich.text import Text

from labctl.debug.oops import Oops, clean_func
from labctl.debug.symbolize import DecodedFrame, DecodedOops
from labctl.textsafe import safe_line as s

INDENT = "  "


def render_oops(d: DecodedOops, number: int) -> list[Text]:
    """The lines showing one decoded oops: title, headline, RIP, then the trace by section."""
    o = d.oops
    lines = [Text(f"#{number} {s(o.title)}", style="bold")]
    where = f"{INDENT}line {o.line_no}"
    lines.append(Text(where if o.headline == o.title else f"{where}: {s(o.headline)}", style="dim"))
    if o.panic:
        lines.append(Text(f"{INDENT}then: {s(o.panic)}", style="dim"))
    if o.pid is not None:
        lines.append(Text(f"{INDENT}CPU {o.cpu}, PID {o.pid} ({s(str(o.comm))})", style="dim"))
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
                lines.append(Text(f"{INDENT}{s(f.frame.stack)}:"))
            if f.frame.context:
                lines.append(Text(f"{INDENT}<{s(f.frame.context.upper())}>", style="cyan"))
            section = here
        lines += render_frame(f, INDENT * 2)
    return lines


def render_frame(f: DecodedFrame, indent: str, label: str = "") -> list[Text]:
    """``func+off/size [mod]  file:line (inlined fn)`` plus one ``(inlined by)`` line per caller."""
    fr = f.frame
    head = Text(indent + label)
    if not fr.reliable:
        head.append("? ", style="yellow")
    head.append(s(fr.symbol), style="bold" if fr.reliable else "dim")
    if fr.module:
        head.append(f" [{s(fr.module)}]", style="magenta")
    if f.file:
        head.append(f"  {s(f.file)}:{f.line if f.line is not None else '?'}", style="green")
        if f.source_func and f.source_func != clean_func(fr.func) and f.source_func != fr.func:
            head.append(f" ({s(f.source_func)})")
    if f.note:
        head.append(f"  [{s(f.note)}]", style="yellow")
    lines = [head]
    for loc in f.inlined:
        where = f"{s(loc.file)}:{loc.line if loc.line is not None else '?'}" if loc.file else "??"
        lines.append(Text(f"{indent}    (inlined by) {s(loc.func or '??')} {where}", style="dim"))
    return lines
