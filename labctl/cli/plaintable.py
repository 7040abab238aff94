"""A table as rich draws it for a pipe or a file, without loading rich (about 60 ms of ``labctl status``).

:func:`render` gives the exact text rich's default :class:`rich.table.Table` (heavy head, a title
on the left) prints on a console that is not a terminal, for the tables the quick commands print:
plain ASCII cells on one line each, the whole no wider than the console. Anything else (a wide or
combining character, a line break, a table rich would have to wrap) is None, and the caller draws
it with rich as before; ``tests/unit/test_plaintable.py`` compares the two on many tables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

WIDTH = 160
"""The width of :data:`labctl.cli.ui.out` when standard output is not a terminal."""


def plain_stdout() -> bool:
    """True when rich would print to standard output without styles or cursor codes (a pipe or a
    file, and nothing in the environment telling rich it is a terminal)."""
    if "FORCE_COLOR" in os.environ or os.environ.get("TTY_COMPATIBLE") == "1":
        return False
    try:
        return not sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _plain(s: str) -> bool:
    return s.isascii() and s.isprintable()


def render(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int = WIDTH) -> str | None:
    """The table's text as rich prints it at ``width`` columns, or None when only rich can draw it."""
    cells = [list(columns), *(list(r) for r in rows)]
    if any(len(r) != len(columns) for r in cells) or not all(_plain(c) for r in cells for c in r):
        return None
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    total = sum(widths) + 3 * len(widths) + 1
    if total > width or not columns or not (_plain(title.replace("·", "")) and len(title) <= total):
        return None

    def line(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + right

    def row(r: Sequence[str], bar: str) -> str:
        return bar + bar.join(f" {c.ljust(w)} " for c, w in zip(r, widths)) + bar

    out = [title.ljust(total)] if title else []
    out += [line("┏", "━", "┳", "┓"), row(columns, "┃"), line("┡", "━", "╇", "┩")]
    out += [row(r, "│") for r in rows]
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out) + "\n"


def line(text: str, width: int = WIDTH) -> str | None:
    """One line of text as rich prints it (with its newline), or None when rich would wrap or escape it."""
    if len(text) > width or not _plain(text.replace("·", "")):
        return None
    return text + "\n"
